"""vLLM's CPU build: greedy decoding in bf16 against fp32 (and float16 if asked), the same prompts, one
engine per type in its own process, in one run; prints tokens/s and the ratio to the first type.

    .venv-vllm/bin/python bench/bench_vllm_dtype.py [--model smollm2-135m-instruct] [--prompts 32] [--tokens 128]

Why: ``--dtype auto`` takes the model's config (bf16 for SmolLM2 and Qwen2.5). vLLM's CPU build computes a
bf16 linear layer with a oneDNN kernel only where the processor has bf16 instructions; elsewhere its log
says ``Failed to create oneDNN linear, fallback to torch linear``. The evaluation's ``--dtype`` flag
(docs/evaluation.md) is the way out on such a CPU; this says how much it buys on the one at hand, and
whether that CPU falls back (the ``fallback`` column).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def one(model: str, dtype: str, prompts: int, tokens: int) -> dict:
    """Runs in the child: one engine, a warm-up of 2 prompts, then ``prompts`` greedy prompts of ``tokens``."""
    from vllm import LLM, SamplingParams

    llm = LLM(model=model, dtype=dtype, enforce_eager=True, seed=0)
    tok = llm.get_tokenizer()
    texts = [tok.apply_chat_template([{"role": "user", "content": f"Who wrote the novel number {i}?"}],
                                     tokenize=False, add_generation_prompt=True) for i in range(prompts)]
    sp = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    llm.generate(texts[:2], sp, use_tqdm=False)
    t = time.perf_counter()
    out = llm.generate(texts, sp, use_tqdm=False)
    seconds = time.perf_counter() - t
    return {"dtype": dtype, "tokens": sum(len(o.outputs[0].token_ids) for o in out), "seconds": round(seconds, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct", help="a folder or a name of train/models/registry.py")
    ap.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"], choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print("RESULT " + json.dumps(one(a.model, a.child, a.prompts, a.tokens)), flush=True)
        return
    from train.models import registry

    model = registry.resolve(a.model)
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2")}
    rows = []
    for dtype in a.dtypes:  # in turn: each engine has the machine to itself
        r = subprocess.run([sys.executable, __file__, "--model", model, "--prompts", str(a.prompts),
                            "--tokens", str(a.tokens), "--child", dtype], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=1800)
        found = [line for line in r.stdout.splitlines() if line.startswith("RESULT ")]
        if r.returncode or not found:
            sys.exit(f"error: the {dtype} engine failed (exit {r.returncode}):\n{(r.stdout + r.stderr)[-3000:]}")
        row = json.loads(found[-1][len("RESULT "):])
        row["fallback"] = "Failed to create oneDNN linear" in r.stdout + r.stderr
        rows.append(row)
    base = rows[0]["tokens"] / rows[0]["seconds"]
    print(f"{'dtype':9s} {'tokens':>6s} {'seconds':>8s} {'tokens/s':>9s} {'x ' + rows[0]['dtype']:>11s}  fallback")
    for row in rows:
        rate = row["tokens"] / row["seconds"]
        print(f"{row['dtype']:9s} {row['tokens']:6d} {row['seconds']:8.1f} {rate:9.1f} {rate / base:11.2f}  "
              f"{'yes' if row['fallback'] else 'no'}")


if __name__ == "__main__":
    main()
