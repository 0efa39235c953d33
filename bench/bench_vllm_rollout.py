"""The search_r1 agent loop on real vLLM (its CPU build) against the hf generator: stop tags,
token-in/token-out, and time. Runs in .venv-vllm (`make test-vllm` builds it).

    .venv-vllm/bin/python bench/bench_vllm_rollout.py [--model DIR] [--questions 64]

Both generators run the same agent loop (train/search_r1/agent_loop.py, max_turns 2, 96 tokens per turn,
temperature 1, top_p 1) on the same bundled questions against a BM25 server on 127.0.0.1, one after
the other in this process. Without ``--model`` a tiny Qwen2 is built and warm-started on the
Search-R1 format (train.tiny, 600 steps) so that it writes search and answer tags. Printed per
generator: generation calls, calls that ended on a stop tag, tokens kept past a stop tag (must be 0),
tokens the engine decoded past it (what the loop cut), token-in/token-out mismatches (every call's
prompt must be the trajectory so far, token for token, and every kept turn exactly the engine's own
ids: must be 0), and seconds for all questions with ``--concurrency`` in flight; then the ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


class Recorder:
    """Wraps a generator; keeps (prompt ids, returned ids) of every call."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []

    async def generate(self, request_id=None, *, prompt_ids, sampling_params, **kw):
        out = await self.inner.generate(request_id, prompt_ids=prompt_ids, sampling_params=sampling_params, **kw)
        self.calls.append((list(prompt_ids), list(out.token_ids)))
        return out


def check(tokenizer, rec: Recorder, outputs) -> dict:
    from train.search_r1 import protocol
    from train.search_r1.agent_loop import cut_after_stop, end_of_turn_ids

    eos = end_of_turn_ids(tokenizer)
    stats = {"calls": len(rec.calls), "ended_on_tag": 0, "kept_past_tag": 0, "decoded_past_tag": 0, "mismatch": 0,
             "eos_dropped": 0}
    trajectories = [list(o.prompt_ids) + list(o.response_ids) for o in outputs]
    for prompt, raw in rec.calls:
        cut = cut_after_stop(tokenizer, raw)
        text = tokenizer.decode(cut)
        stop = protocol.find_stop(text)
        if stop is not None:
            stats["ended_on_tag"] += 1
            stats["decoded_past_tag"] += len(raw) - len(cut)
        # the trajectory this call belongs to: its prompt is a prefix, followed by the kept ids
        match = [t for t in trajectories if t[: len(prompt)] == prompt]
        if not match:
            stats["mismatch"] += 1
            continue
        t = match[0]
        kept = t[len(prompt): len(prompt) + len(cut)]
        # the loop keeps the engine's ids as they are; two documented exceptions: an invalid turn's
        # final EOS is dropped when the trajectory goes on, and a turn is cut at the length budget
        eos_dropped = bool(cut) and cut[-1] in eos and kept[: len(cut) - 1] == cut[:-1]
        at_budget = len(t) == len(prompt) + len(kept) and kept == cut[: len(kept)]
        if kept != cut and not eos_dropped and not at_budget:
            stats["mismatch"] += 1
        stats["eos_dropped"] += int(eos_dropped and kept != cut)
        hit = protocol.find_stop(tokenizer.decode(kept))
        if hit is not None:  # text the trajectory kept after the first stop tag of this turn
            tail = tokenizer.decode(kept)[hit[0]:]
            stats["kept_past_tag"] += len(tokenizer.encode(tail, add_special_tokens=False)) if tail else 0
    return stats


async def run_all(gen, tokenizer, questions, search_client, concurrency: int):
    from train.search_r1 import prompts
    from train.search_r1.agent_loop import standalone_loop

    sem = asyncio.Semaphore(concurrency)

    async def one(q):
        async with sem:
            loop = standalone_loop(tokenizer, gen, search={"max_turns": 2, "max_turn_tokens": 96, "max_obs_tokens": 96},
                                   search_client=search_client, response_length=1024)
            return await loop.run({"temperature": 1.0, "top_p": 1.0}, raw_prompt=prompts.make_messages(q))

    return await asyncio.gather(*(one(q) for q in questions))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--questions", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=64)
    args = ap.parse_args()
    from transformers import AutoTokenizer

    from retrieval.app import create_app
    from retrieval.bm25 import build_bm25
    from retrieval.client import RetrievalClient
    from retrieval.index import load_retriever
    from retrieval.serving import Server
    from retrieval.settings import ServeConfig, ServerConfig
    from train.inference.backends import VLLMServerManager
    from train.inference.hf_generate import HFServerManager

    tmp = Path(tempfile.mkdtemp())
    model = args.model
    if model is None:
        from train.tiny import main as tiny

        model = str(tmp / "tiny")
        tiny([model, "--sft-steps", "600", "--hidden-size", "64", "--heads", "2"])
    build_bm25(str(ROOT / "data" / "corpus.jsonl"), str(tmp / "bm25"), progress=False)
    app = create_app(load_retriever(tmp / "bm25"), ServerConfig())
    server = Server(app, ServeConfig(port=0, threads=64)).start()
    client = RetrievalClient(server.url, timeout=60)
    tok = AutoTokenizer.from_pretrained(model)
    qs = [json.loads(line)["question"] for line in open(ROOT / "data" / "qa.jsonl")][: args.questions]
    rows = {}
    for name, make in (("vllm", lambda: VLLMServerManager(model, dtype="float32")),
                       ("hf", lambda: HFServerManager.from_pretrained(model, device="cpu", dtype="float32"))):
        rec = Recorder(make())

        async def timed():  # one event loop: vLLM's async engine is bound to the loop it first ran on
            await run_all(rec, tok, qs[:2], client, args.concurrency)  # warm-up (first request)
            rec.calls.clear()
            t0 = time.perf_counter()
            outputs = await run_all(rec, tok, qs, client, args.concurrency)
            return outputs, time.perf_counter() - t0

        outputs, seconds = asyncio.run(timed())
        rows[name] = {**check(tok, rec, outputs), "seconds": seconds,
                      "searches": sum(o.extra_fields["num_searches"] for o in outputs)}
    print(f"{len(qs)} questions, max_turns 2, 96 tokens per turn, {args.concurrency} in flight; model {model}")
    print("| generator | calls | ended on a tag | tokens kept past a tag | tokens decoded past a tag "
          "| token-in/out mismatches | invalid-turn EOS dropped | searches | seconds |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, r in rows.items():
        print(f"| {name} | {r['calls']} | {r['ended_on_tag']} | {r['kept_past_tag']} | {r['decoded_past_tag']} | "
              f"{r['mismatch']} | {r['eos_dropped']} | {r['searches']} | {r['seconds']:.1f} |")
    print(f"time ratio vllm / hf: {rows['vllm']['seconds'] / rows['hf']['seconds']:.2f}")
    server.stop()


if __name__ == "__main__":
    main()
