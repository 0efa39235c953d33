"""Per-token log-probs from packed logits (not a test): verl 0.9.1's fallback without flash-attn
(``logprobs_from_logits_v2``, a Python loop over tokens) against ``train.workers.logprobs.chunked_logprobs``
(what every preset's path uses), same process, same inputs; forward + backward, as in the actor update.

    python bench/bench_logprobs.py                                   # CPU: 1k, 2k, 4k tokens, fp32 and bf16
    python bench/bench_logprobs.py --device cuda --tokens 2048 4096 8192 16384

Prints per (dtype, tokens): median seconds of each, the ratio verl / ours, the aten operators each
dispatches (every one is a kernel launch on a GPU, where the loop's cost is launches, not arithmetic),
the largest difference of the log-probs and of their gradients, and the peak memory of each. Peak memory: on CUDA
``max_memory_allocated`` around each call; on CPU the peak RSS of a fresh process running only that
call (``--peak-child``, VmHWM), minus that of a process that only builds the inputs. Vocabulary: Qwen2.5's 151,936.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from train.workers.logprobs import MAX_ELEMS, chunked_logprobs  # noqa: E402

VOCAB = 151936
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def verl_fallback(logits, labels):
    from verl.utils.torch_functional import logprobs_from_logits_v2

    return logprobs_from_logits_v2(logits, labels)


IMPLS = {"verl": verl_fallback, "chunked": chunked_logprobs}


def inputs(tokens: int, dtype, device, vocab=VOCAB, seed=0):
    """Built in place (no temporaries), so that a child's peak RSS is the inputs plus the step."""
    g = torch.Generator(device=device).manual_seed(seed)
    logits = torch.empty(tokens, vocab, dtype=dtype, device=device).normal_(0, 2, generator=g).requires_grad_()
    labels = torch.randint(0, vocab, (tokens,), generator=g, device=device)
    grad = torch.randn(tokens, generator=g, device=device)
    return logits, labels, grad


def count_ops(impl, logits, labels, grad) -> int:
    """aten operators dispatched by one forward + backward (each is at least one kernel launch on a GPU)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.n += 1
            return func(*args, **(kwargs or {}))

    with Count():
        step(impl, logits, labels, grad)
    logits.grad = None
    return Count.n


def step(impl, logits, labels, grad):
    logits.grad = None
    out = impl(logits, labels)
    out.float().backward(grad)
    return out.detach().float(), logits.grad


def sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def peak_child(impl: str, dtype: str, tokens: int) -> float:
    """GiB: peak RSS of a process that builds the inputs and runs one step, minus the same without the step."""
    def run(do_step):
        code = (f"import sys; sys.argv=['x', '--peak-child', '{impl}', '{dtype}', '{tokens}', '{int(do_step)}']; "
                f"import runpy; runpy.run_path({str(Path(__file__))!r}, run_name='__main__')")
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        return json.loads(r.stdout.strip().splitlines()[-1])["maxrss_kib"]
    return (run(True) - run(False)) / 2 ** 20


def child(impl: str, dtype: str, tokens: int, do_step: bool) -> None:
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    logits, labels, grad = inputs(tokens, DTYPES[dtype], "cpu")
    if do_step:
        step(IMPLS[impl], logits, labels, grad)
    # VmHWM, not getrusage's ru_maxrss: Linux carries ru_maxrss across fork + exec (the parent's peak)
    hwm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
    print(json.dumps({"maxrss_kib": hwm}))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    # CPU default up to 4096: verl's loop peaks at about 4x the logits (8,192 x 151,936 fp32 logits: 4.6 GiB)
    ap.add_argument("--tokens", type=int, nargs="+", default=[1024, 2048, 4096])
    ap.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"], choices=list(DTYPES))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--no-memory", action="store_true", help="skip the peak-memory measurement")
    ap.add_argument("--peak-child", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.peak_child:
        impl, dtype, tokens, do_step = args.peak_child
        child(impl, dtype, int(tokens), bool(int(do_step)))
        return 0
    cuda = args.device.startswith("cuda")
    print(f"device {args.device}, vocab {VOCAB}, forward + backward, median of {args.reps}")
    print("| dtype | tokens | verl loop s | chunked s | ratio verl/chunked | aten ops verl | aten ops chunked "
          "| same, GPU chunking "
          "| max abs diff logp | max abs diff grad | peak verl GiB | peak chunked GiB |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for dtype in args.dtypes:
        for tokens in args.tokens:
            logits, labels, grad = inputs(tokens, DTYPES[dtype], args.device)
            times, peaks = {}, {}
            ops = {name: count_ops(impl, logits, labels, grad) for name, impl in IMPLS.items()}
            # the chunking used on GPUs (MAX_ELEMS logits per chunk), counted here: operator counts do not
            # depend on the device
            ops["gpu"] = count_ops(lambda x, y: chunked_logprobs(x, y, MAX_ELEMS), logits, labels, grad)
            for name, impl in IMPLS.items():
                out, g = step(impl, logits, labels, grad)  # warm-up, and the values
                if name == "verl":
                    ref_out, ref_grad = out.clone(), g.clone()
                else:
                    dlogp = (ref_out - out).abs().max().item()
                    dgrad = (ref_grad.float() - g.float()).abs().max().item()
                    del ref_grad
                logits.grad = None
                ts = []
                for _ in range(args.reps):
                    if cuda:
                        torch.cuda.reset_peak_memory_stats()
                        base = torch.cuda.memory_allocated()
                    sync(args.device)
                    t = time.perf_counter()
                    step(impl, logits, labels, grad)
                    sync(args.device)
                    ts.append(time.perf_counter() - t)
                    if cuda:
                        peaks[name] = (torch.cuda.max_memory_allocated() - base) / 2 ** 30
                times[name] = statistics.median(ts)
            if not cuda and not args.no_memory:
                peaks = {name: peak_child(name, dtype, tokens) for name in IMPLS}
            fmt = lambda name: f"{peaks[name]:.2f}" if name in peaks else "-"
            print(f"| {dtype} | {tokens} | {times['verl']:.3f} | {times['chunked']:.3f} | "
                  f"{times['verl'] / times['chunked']:.2f} | {ops['verl']} | {ops['chunked']} | {ops['gpu']} | "
                  f"{dlogp:.1e} | {dgrad:.1e} | {fmt('verl')} | "
                  f"{fmt('chunked')} |", flush=True)
            del logits, labels, grad
    return 0


if __name__ == "__main__":
    sys.exit(main())
