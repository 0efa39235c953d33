"""The GPU check's run: the parts in order, each timed, a crashing part reported as a mismatch while the
others still run, the parts that need transformers 5.x skipped (with the reason) under another major version."""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

PARTS = ("fork", "hf_kv", "flat", "logprobs", "attention", "critic", "threads")
#: parts that run transformers' models or masks (fork only for its evaluator row)
NEEDS_TRANSFORMERS = ("hf_kv", "attention", "critic")


def run(parts: list[str], cpu: bool, flat_n: int | None = None) -> int:
    """Run ``parts`` (of :data:`PARTS`) on the GPU, or on CPU at small sizes with ``cpu``; print each row and
    then the table. Returns 0 when every check passed, 1 on a mismatch, 2 without a CUDA device (and no ``cpu``)."""
    import torch

    from train.gpucheck.environment import stand_in_verl, transformers_status
    from train.gpucheck.fork import part_fork
    from train.gpucheck.hf_kv import part_hf_kv
    from train.gpucheck.kernels import part_attention, part_critic, part_logprobs
    from train.gpucheck.report import Report
    from train.gpucheck.search import part_flat, part_threads

    if cpu:
        device = "cpu"
    else:
        if not torch.cuda.is_available():  # this process builds no vLLM engine: the fork rule does not apply
            print("error: no CUDA device visible to torch; run with --cpu for the dry mode", file=sys.stderr)
            return 2
        device = "cuda"
    verl_stub = stand_in_verl()
    name = torch.cuda.get_device_name(0) if device == "cuda" else "CPU"
    print(f"gpu_check on {name}: torch {torch.__version__}, parts {', '.join(parts)}"
          + (" (verl stand-ins: verl is not installed)" if verl_stub else ""), flush=True)
    tf_line, tf_ok = transformers_status()
    needing = [p for p in parts if p in NEEDS_TRANSFORMERS] + (["fork's evaluator row"] if "fork" in parts else [])
    skip = None if tf_ok is not False else tf_line
    if skip and needing:
        print(f"{tf_line}: skipping {', '.join(needing)}", flush=True)
    else:
        print(tf_line, flush=True)
    rep = Report()
    if needing:
        rep.add("setup", "transformers vs pyproject.toml's pin", tf_line, None)
    skipped: list[str] = []
    t_all = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as tmp:
        work = Path(tmp)
        for part in parts:
            t0 = time.perf_counter()
            print(f"== {part}", flush=True)
            if skip and part in NEEDS_TRANSFORMERS:
                rep.add(part, "skipped", skip, None)
                skipped.append(part)
                continue
            try:
                if part == "fork":
                    part_fork(rep, device, work, evaluator=skip)
                elif part == "hf_kv":
                    part_hf_kv(rep, device, work)
                elif part == "flat":
                    part_flat(rep, device, work, n=flat_n or (1_000_000 if device == "cuda" else 20_000),
                              d=768 if device == "cuda" else 64)
                elif part == "logprobs":
                    if device == "cuda":
                        part_logprobs(rep, device, (8192, 16384), 151_936)
                    else:
                        part_logprobs(rep, device, (256,), 4096)
                elif part == "attention":
                    if device == "cuda":
                        part_attention(rep, device, 16_384, 16, 2, 128)
                    else:
                        part_attention(rep, device, 1024, 4, 2, 32)
                elif part == "critic":
                    part_critic(rep, device, work)
                elif part == "threads":
                    part_threads(rep, device)
            except Exception as e:  # noqa: BLE001  (a part that crashes is a mismatch; the others still run)
                rep.add(part, "ran", f"{type(e).__name__}: {str(e).splitlines()[0][:150] if str(e) else ''}", False)
            rep.add(part, "time", f"{time.perf_counter() - t0:.1f} s", None)
    print()
    print(rep.table())
    bad = [r for r in rep.rows if r.ok is False]
    if skip and "fork" in parts:
        skipped.append("fork's evaluator row")
    print(f"\n{len(rep.rows) - len(bad)} rows fine, {len(bad)} mismatches, {time.perf_counter() - t_all:.0f} s in all"
          + (f"; skipped: {', '.join(skipped)} ({skip})" if skipped else ""))
    return 1 if bad else 0

