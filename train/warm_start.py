"""python -m train.warm_start: teach a pretrained model the Search-R1 format on a training split (SFT).

    python -m train.warm_start --model smollm2-135m-instruct --data runs/smollm2/data/train.parquet \\
        --index runs/index/bm25 --out runs/smollm2/sft

A pretrained chat model that never writes ``<search>``/``<answer>`` gets an EM reward of 0 on every
rollout, so every GRPO advantage is 0 and RL has nothing to learn from. This warm start gives it the
format: for each training question, one search with the question through the real retriever
(``--index``), the passages it returns as the observation, and the gold answer, kept only when a gold
answer appears in those passages. Loss on the model's turns only. ``--data`` must be a training split
(every row's ``extra_info.split`` is ``train``): no test question is ever trained on.
Writes the model folder plus ``warm_start.json`` (the settings, counts and losses).

Runs on the GPU when torch sees one (fp32 weights and optimizer, bf16 autocast; a 3B model's fp32 weights,
gradients and AdamW state take about 48 GB), else on the CPU in fp32, which suits models of a few hundred
million parameters (SmolLM2-135M); ``--device`` chooses.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from train.errors import DataError, UserError, exit_on_error


def read_train_rows(path: str) -> list[tuple[str, list[str]]]:
    """(question, gold answers) of a training parquet of ``python -m train.data_prep``; a row of any other
    split is an error naming it."""
    import pandas as pd

    if not Path(path).is_file():
        raise DataError(f"--data {path}: no such file (make it with python -m train.data_prep)")
    rows = []
    for i, r in pd.read_parquet(path).iterrows():
        info = r.get("extra_info") or {}
        if info.get("split") != "train":
            raise DataError(f"--data {path}: row {i} is from split {info.get('split')!r}; a warm start reads a "
                            f"training split only (train.parquet)")
        rows.append((str(info["question"]), [str(t) for t in r["reward_model"]["ground_truth"]["target"]]))
    return rows


@exit_on_error
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m train.warm_start", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="model folder or a name of `python -m train.get_model --list`")
    ap.add_argument("--data", required=True, help="train.parquet of python -m train.data_prep")
    ap.add_argument("--index", required=True, help="index folder of python -m retrieval.build")
    ap.add_argument("--corpus", default=None, help="corpus jsonl for an --index without a manifest")
    ap.add_argument("--out", required=True, help="folder for the warm-started model")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--topk", type=int, default=3, help="passages per search (default %(default)s)")
    ap.add_argument("--obs-tokens", type=int, default=256, help="observation cut, in tokens (default %(default)s)")
    ap.add_argument("--max-tokens", type=int, default=768, help="trajectory cut, in tokens (default %(default)s)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="auto",
                    help="cpu, cuda or cuda:N (default auto: the GPU when torch sees one, else the CPU)")
    args = ap.parse_args(argv)
    for name in ("steps", "batch", "topk", "obs_tokens", "max_tokens"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    if not args.lr > 0:
        ap.error("--lr must be > 0")
    from train.models.registry import resolve

    model = resolve(args.model)
    if not Path(model).is_dir():
        raise UserError(f"--model {args.model}: no such folder")
    rows = read_train_rows(args.data)
    from retrieval.index import load_retriever
    from train.sft.supervised import pick_device, sft_protocol
    from train.sft.trajectories import retrieved_trajectories

    device = pick_device(args.device)

    try:
        retriever = load_retriever(args.index, args.corpus)
    except (FileNotFoundError, ValueError) as e:
        raise UserError(f"--index {args.index}: {e}") from None

    def search(queries):
        return [[doc["contents"] for doc, _ in hits] for hits in retriever.search(queries, args.topk)]

    counts = {}

    def trajectories(count_tokens):
        out, c = retrieved_trajectories(rows, search, count_tokens, obs_tokens=args.obs_tokens)
        counts.update(c)
        print(f"{c['kept']} of {c['questions']} training questions have a gold answer in their top-{args.topk} "
              f"passages: those are the warm start's trajectories", flush=True)
        return out

    stats = sft_protocol(model, trajectories, steps=args.steps, batch=args.batch, lr=args.lr, seed=args.seed,
                         max_tokens=args.max_tokens, out_dir=args.out, log=lambda m: print(m, flush=True),
                         device=device)
    record = {"model": args.model, "data": args.data, "index": args.index, "topk": args.topk,
              "obs_tokens": args.obs_tokens, "seed": args.seed, "device": device, **counts, **stats}
    (Path(args.out) / "warm_start.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"warm start: loss {stats['first_loss']:.3f} -> {stats['last_loss']:.3f} over {args.steps} steps "
          f"({stats['epochs']} epochs, {stats['seconds']:.0f} s on {device}); model in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
