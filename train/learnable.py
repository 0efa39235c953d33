"""python -m train.learnable: the learnable task: a check that the pipeline improves a policy, on 2 CPU cores in
minutes.

A learnability check of the pipeline (verl's trainer, the ``search_r1`` agent loop, the live retriever,
the reward, LLDS), not the paper's task. Generated here with a fixed seed; nothing is downloaded.

* **Corpus**: ``--facts`` invented countries, one passage each, in the wiki-18 format::

      "Zovobi"
      The capital of Zovobi is Gemol. The largest city of Zovobi is Tarnek.

* **Questions**: "What is the capital of Zovobi?", gold "Gemol"; the last ``--holdout`` facts are the
  test rows. The names are invented and unique, so the only way to answer is to search and copy the
  right name from the retrieved passage (BM25 ranks it first for every question; ``TOPK`` = 1).
* **Policy**: a tiny Qwen2 (hidden 128, 2 layers, 4 heads, 0.8M parameters) with a byte-level BPE
  (3,044 tokens) trained on the task's text, so that each invented name is a single token.
* **A deliberately imperfect warm start**: supervised steps on scripted trajectories over *fresh
  random facts* (names recombined at random, so nothing can be memorised and copying must be learnt):
  search with the question, read the observation as the rollout shows it, then
  ``<think> The capital of X is Y. </think><answer> Y </answer>``, except that a share
  ``--wrong-rate`` (0.8) of them reads the *largest city* instead. The warm-started policy searches
  and copies, but mostly answers the wrong field; only the reward tells it which field is asked,
  so RL has room to improve and held-out EM shows by how much.

    python -m train.learnable OUT_DIR   # OUT_DIR/{corpus.jsonl, qa.jsonl, data/{train,test}.parquet, model/}

``configs/cpu_learn.yaml`` is the RL run on it; ``make demo`` runs both, ``tests/toy/test_learning_on_cpu.py``
asserts the rise, ``bench/bench_learning.py`` measures it over seeds.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from train.errors import UserError, exit_on_error
from train.toy.learnable_task import build


@exit_on_error
def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m train.learnable", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir")
    ap.add_argument("--facts", type=int, default=300)
    ap.add_argument("--holdout", type=int, default=20, help="the last N facts are the test rows (never trained on)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sft-steps", type=int, default=1000)
    ap.add_argument("--wrong-rate", type=float, default=0.8,
                    help="share of warm-start answers that copy the largest city instead of the capital")
    args = ap.parse_args(argv)
    try:
        stats = build(Path(args.out_dir), facts=args.facts, seed=args.seed, sft_steps=args.sft_steps,
                      wrong_rate=args.wrong_rate, holdout=args.holdout)
    except (ValueError, FileExistsError) as e:
        raise UserError(str(e)) from None
    if stats.get("reused"):
        print(f"reusing the warm start in {stats['model']} (same settings; delete {args.out_dir} to rebuild)")
        return
    print(f"task: {stats['train']} train + {stats['test']} test questions over {args.facts} passages")
    print(f"warm start: {stats['examples']} scripted trajectories, loss {stats['first_loss']:.2f} -> "
          f"{stats['last_loss']:.3f} over {args.sft_steps} steps; model: {stats['model']}")


if __name__ == "__main__":
    sys.exit(main())
