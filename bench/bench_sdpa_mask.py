"""Memory and time of SDPA on verl's packed micro-batches (not a test): the attention mask transformers
builds from the restarting position ids, and what torch's SDPA makes of it, per packed micro-batch size.

    python bench/bench_sdpa_mask.py [--tokens 2048 4096 8192 16384] [--dtype bf16]

The time column (the wall time per token of a second forward, after one that warms up) is why the
CPU configs pack 2,048 tokens (configs/_cpu.yaml): on CPU the masked math kernel's work grows with the
square of the micro-batch's tokens.

A one-layer Qwen2 with a small hidden size, so that the mask dominates: each size runs a forward
(use_cache=False, as verl's engine) of ``tokens`` packed tokens (sequences of 512) in a fresh process and
reports its peak RSS above a process that only built the model and inputs (VmHWM), next to the
bool mask (tokens^2 bytes) and a bias of the compute dtype (2 x tokens^2 bytes in bf16). On CUDA
the memory-efficient SDPA kernel (the one that takes a mask) turns the bool mask into such a bias,
its last dimension padded to a multiple of 16, in every attention call; the bool mask lives for the
whole forward.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def hwm_kib() -> int:
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))


def child(model_dir: str, tokens: int, dtype: str, forward: bool) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    dt = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="sdpa", dtype=dt).eval()
    seq = 512
    ids = torch.randint(3, model.config.vocab_size, (1, tokens))
    pos = (torch.arange(tokens) % seq).unsqueeze(0)  # packed: position ids restart every 512 tokens
    seconds = 0.0
    if forward:
        import time

        with torch.no_grad():
            model(input_ids=ids, position_ids=pos, use_cache=False)  # the peak; also warms up
            start = time.perf_counter()
            model(input_ids=ids, position_ids=pos, use_cache=False)
            seconds = time.perf_counter() - start
    print(json.dumps({"hwm_kib": hwm_kib(), "seconds": seconds}))


def measure(model_dir: str, tokens: int, dtype: str) -> tuple[float, float]:
    """(forward peak above the inputs in GiB, forward ms per token)"""
    def run(forward: bool) -> dict:
        r = subprocess.run([sys.executable, __file__, "--child", model_dir, str(tokens), dtype, str(int(forward))],
                           capture_output=True, text=True, check=True)
        return json.loads(r.stdout.strip().splitlines()[-1])
    with_forward, without = run(True), run(False)
    return (with_forward["hwm_kib"] - without["hwm_kib"]) / 2 ** 20, with_forward["seconds"] / tokens * 1e3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, nargs="+", default=[2048, 4096, 8192, 16384])
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        model_dir, tokens, dtype, forward = args.child
        child(model_dir, int(tokens), dtype, bool(int(forward)))
        return 0
    from train.toy.tiny_model import build_tiny_model

    model_dir = build_tiny_model(Path(tempfile.gettempdir()) / "bench_sdpa_h64_l1", ROOT / "data" / "corpus.jsonl",
                                 hidden_size=64, layers=1, heads=2)
    print(f"one-layer Qwen2 (hidden 64), SDPA, {args.dtype}, packed sequences of 512, CPU")
    print("| tokens | bool mask GiB (T^2 B) | bias GiB (2 T^2 B) | measured forward peak above inputs GiB "
          "| forward ms/token |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    for t in args.tokens:
        peak, ms = measure(str(model_dir), t, args.dtype)
        print(f"| {t} | {t * t / 2 ** 30:.3f} | {2 * t * t / 2 ** 30:.3f} | {peak:.3f} | {ms:.3f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
