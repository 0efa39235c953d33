"""python -m train.tiny: a tiny, real, offline policy: a 2-layer Qwen2 with a byte-level BPE trained on a corpus.

Used by the tests, the benchmarks and the learnable task (:mod:`train.learnable`, whose warm start
is :func:`sft_protocol` on its own trajectories); no hub download anywhere. ``python -m train.tiny
OUT_DIR`` writes a ``save_pretrained`` directory (model + tokenizer with a Qwen-style chat template);
``--sft-steps N`` then warm-starts it on scripted Search-R1 trajectories built from the bundled QA
(search with the question, read the gold passage, answer), so that the policy writes the tags and
sometimes searches. On the bundled Wikipedia QA it stays a toy that rarely answers right.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from train import DATA_DIR
from train.errors import DataError, exit_on_error
from train.sft.supervised import sft_protocol
from train.toy.tiny_model import build_tiny_model, protocol_trajectories


@exit_on_error
def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m train.tiny", description=__doc__)
    ap.add_argument("out_dir")
    ap.add_argument("--corpus", default=str(DATA_DIR / "corpus.jsonl"),
                    help="corpus jsonl (default: the bundled data/corpus.jsonl of a source checkout)")
    ap.add_argument("--qa", default=str(DATA_DIR / "qa.jsonl"),
                    help="QA jsonl for --sft-steps (default: the bundled data/qa.jsonl)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--hidden-size", type=int, default=64)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--sft-steps", type=int, default=0,
                    help="supervised steps teaching the Search-R1 format (0: keep the random model)")
    args = ap.parse_args(argv)
    for name in ("corpus", "qa"):
        if not Path(getattr(args, name)).is_file():
            raise DataError(f"--{name} not found: {getattr(args, name)}")
    if args.sft_steps < 0:
        ap.error("--sft-steps must be >= 0")
    if args.hidden_size < 1 or args.heads < 1 or args.hidden_size % args.heads:
        ap.error("--hidden-size must be a positive multiple of --heads")
    out = Path(args.out_dir)
    fresh = not (out / "config.json").exists()
    build_tiny_model(out, args.corpus, seed=args.seed, hidden_size=args.hidden_size, heads=args.heads)
    if args.sft_steps and fresh:
        def trajectories(count):
            return protocol_trajectories(Path(args.qa), Path(args.corpus), count_tokens=count)

        stats = sft_protocol(out, trajectories, steps=args.sft_steps, seed=args.seed, sampling="replacement")
        print(f"format warm-start: {stats['examples']} trajectories, loss {stats['first_loss']:.2f} -> "
              f"{stats['last_loss']:.2f} over {args.sft_steps} steps")
    print(out)


if __name__ == "__main__":
    sys.exit(main())
