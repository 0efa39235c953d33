"""python -m train.gpu_check: the GPU paths that need no vLLM, verl or Ray, checked on one GPU in a few minutes.

    search-r1-gpu-check              # on a CUDA machine (torch with CUDA, transformers); < 8 min on one H200
    search-r1-gpu-check --cpu        # the same parts on CPU at small sizes: checks the check itself
    python -m train.gpu_check        # the same, from the checkout's top folder without installing the project

Parts (``--parts`` picks some):
  fork       torch.cuda.is_available() then fork: the child's CUDA fails (the mechanism that killed vLLM's
             EngineCore); train.inference.cuda_probe then fork: it works; and the evaluator's own path up to the
             engine's construction (``--engines 1``: one in-process engine however many GPUs are visible) leaves
             CUDA untouched (a stand-in vllm records it, as tests do)
  hf_kv      the hf engine on a tiny Qwen2: every kept cache owns exactly its rows' storage, the kept bytes
             stay under the bound, and GPU memory returns to the model's once the trajectories are released
             (the baseline is taken after a warm-up request, so the engine thread's cuBLAS workspace, 32 MiB
             on sm_90, which torch keeps per thread, is in it)
  flat       retrieval/flat.py with fp16 shards against exact fp32 search (ids, order, scores; q/s)
  logprobs   train/workers/logprobs.py's chunked log-probs against verl's formula at 8k/16k tokens (time, peak memory)
  attention  packed attention at 16,384 tokens: SDPA with the dense block-diagonal mask vs the document-aware
             path (bench/bench_attention.py, in the source checkout), agreement and time per pass
  critic     the PPO critic's model build (train/workers/value_model.load_value_model, SDPA) on a packed batch:
             values equal separate forwards
  threads    the retrieval server's batching engine (retrieval/batching.py's MicroBatcher) under 128 requests
             from 80 client threads (64 short-lived, 16 pooled), with a stand-in retriever that runs a matmul
             on the device: every search runs on the batcher's one thread, and device memory grows by less
             than one thread's cuBLAS workspace; the same load searching on each client thread (the old
             behaviour) is printed beside it, one workspace per thread (on CPU only the thread check applies)
It prints one table and exits 1 on any mismatch (2: no CUDA device without --cpu, or bad arguments). verl is
not needed: where it is missing, the one class the hf engine returns (verl's TokenOutput) and the two base
classes train/workers/value_model.py subclasses are replaced by stand-ins (the critic check exercises the model
build, not verl's engine around it). The parts that run transformers (hf_kv, attention, critic and fork's
evaluator row) need the major version pyproject.toml pins (5.x); with another installed (a lent image with 4.x)
they are skipped with the reason, in one line and one table row each, and the others still run. ``--timeout``
(default ``$GPU_CHECK_TIMEOUT`` or 480 s) stops a hung run, printing where each thread was, with exit code 1.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import sys
from typing import Optional

from train.gpucheck import runner  # light: the parts import torch and transformers when they run
from train.gpucheck.runner import PARTS


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m train.gpu_check", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpu", action="store_true", help="dry mode: every part on CPU at small sizes")
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    ap.add_argument("--flat-n", type=int, default=None, help="vectors in the flat check (default 1M on GPU)")
    ap.add_argument("--timeout", type=float, default=float(os.environ.get("GPU_CHECK_TIMEOUT") or 480),
                    help="seconds before a hung run is stopped (0: never; default $GPU_CHECK_TIMEOUT or 480)")
    args = ap.parse_args(argv)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        ap.error(f"--parts: unknown {', '.join(unknown)} (choose from {', '.join(PARTS)})")
    # offline, and no tokenizers thread pool to fork (the fork part forks)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    watch = args.timeout > 0 and sys.__stderr__ is not None
    if watch:  # a C thread: it fires even while a CUDA call holds the interpreter
        faulthandler.dump_traceback_later(args.timeout, exit=True, file=sys.__stderr__)
    try:
        return runner.run(parts, args.cpu, args.flat_n)
    finally:
        if watch:
            faulthandler.cancel_dump_traceback_later()


if __name__ == "__main__":
    sys.exit(main())
