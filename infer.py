"""Ask a Search-R1 model a question and watch it search.

    python infer.py "Who illustrated American Splendor?"
    python infer.py --model runs/demo/ckpt --index runs/index/minilm "Who wrote Hamlet?"
    python infer.py --file questions.jsonl --out answers.jsonl        # FlashRAG jsonl in, jsonl out

The model needs a retriever: a running server (``bash retrieval_launch.sh``; ``--retriever-url``)
or an index loaded in-process (``--index DIR``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

COLOURS = {"think": "\033[2m", "search": "\033[1;36m", "answer": "\033[1;32m", "obs": "\033[33m", "reset": "\033[0m"}


def render(result, colour: bool) -> str:
    import re

    from train import protocol

    c = COLOURS if colour else {k: "" for k in COLOURS}
    lines = [f"{c['search']}Question:{c['reset']} {protocol.normalize_question(result.question)}"]
    turn = 0
    for kind, text in result.segments:
        if kind == "model":
            turn += 1
            lines.append(f"--- turn {turn} " + "-" * 50)
            text = re.sub(r"(<think>.*?</think>)", lambda m: c["think"] + m.group(1) + c["reset"], text, flags=re.S)
            text = re.sub(r"(<search>.*?</search>)", lambda m: c["search"] + m.group(1) + c["reset"], text, flags=re.S)
            text = re.sub(r"(<answer>.*?</answer>)", lambda m: c["answer"] + m.group(1) + c["reset"], text, flags=re.S)
            lines.append(text.strip())
        else:
            lines.append(f"{c['obs']}{text.strip()}{c['reset']}")
    lines.append("=" * 64)
    lines.append(f"{c['answer']}Answer:{c['reset']} {result.answer if result.answer is not None else '(no answer)'}"
                 f"   [{result.searches} searches, stopped: {result.stop_reason}]")
    return "\n".join(lines)


def read_questions(path: str) -> list[dict]:
    from train.data_prep import DataError, check_record, read_jsonl

    if not os.path.isfile(path):
        raise SystemExit(f"error: --file not found: {path}")
    rows = []
    try:
        for n, rec in read_jsonl(path):
            q = rec.get("question")
            if not isinstance(q, str) or not q.strip():
                raise DataError(f"{path}:{n}: row has no question")
            golds = check_record(rec, f"{path}:{n}")[1] if rec.get("golden_answers") else None
            rows.append({"id": str(rec.get("id", n)), "question": q, "golden_answers": golds})
    except DataError as e:
        raise SystemExit(f"error: {e}")
    return rows


def build_parser() -> argparse.ArgumentParser:
    from train.inference import DEFAULT_MODEL

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("question", nargs="?", help="the question (or use --file)")
    ap.add_argument("--file", help="FlashRAG-format jsonl of questions (id, question, golden_answers)")
    ap.add_argument("--out", help="with --file: output jsonl (default: <file>.answers.jsonl)")
    ap.add_argument("--model", default=DEFAULT_MODEL, help=f"local path or hub id (default {DEFAULT_MODEL})")
    ap.add_argument("--backend", choices=["hf", "vllm"], default="hf")
    ap.add_argument("--retriever-url", default="http://127.0.0.1:8000")
    ap.add_argument("--index", help="index directory (or .index file) for an in-process retriever")
    ap.add_argument("--corpus", help="corpus jsonl for --index without a manifest")
    ap.add_argument("--max-turns", type=int, default=4)
    ap.add_argument("--topk", type=int, default=3)
    ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    ap.add_argument("--max-new-tokens", type=int, default=500, help="per turn")
    ap.add_argument("--device", default=None)
    ap.add_argument("--seed", type=int, default=0)
    return ap


async def _run(args, asker) -> int:
    from tqdm import tqdm

    from train.reward import em, f1

    if not args.file:
        result = await asker.ask(args.question)
        print(render(result, colour=sys.stdout.isatty()))
        return 0
    rows = args.rows
    out_path = args.out or args.file + ".answers.jsonl"
    bar = tqdm(total=len(rows), desc="questions", file=sys.stderr)

    async def one(row):
        res = await asker.ask(row["question"])
        bar.update(1)
        d = {"id": row["id"], **res.to_dict()}
        if row["golden_answers"]:
            d["golden_answers"] = row["golden_answers"]
            d["em"] = em(res.answer, row["golden_answers"]) if res.answer is not None else 0.0
            d["f1"] = f1(res.answer, row["golden_answers"]) if res.answer is not None else 0.0
        return d

    results = await asyncio.gather(*(one(r) for r in rows))
    bar.close()
    with open(out_path, "w", encoding="utf-8") as f:
        for d in results:
            f.write(json.dumps(d, ensure_ascii=False) + "\n")
    scored = [d["em"] for d in results if "em" in d]
    summary = f"wrote {len(results)} answers to {out_path}"
    if scored:
        summary += f"; EM {sum(scored) / len(scored):.3f} over {len(scored)} questions with gold answers"
    print(summary)
    return 0


def main(argv=None, generator=None) -> int:
    """``generator`` (a server manager) replaces the model backend; tests pass a scripted one."""
    args = build_parser().parse_args(argv)
    from train.inference import Asker, InferenceError, load_tokenizer_and_check, make_generator, make_search_client

    if bool(args.question) == bool(args.file):
        print("error: give a question or --file (not both)", file=sys.stderr)
        return 2
    if args.question is not None and not args.question.strip():
        print("error: the question is empty", file=sys.stderr)
        return 2
    if args.topk < 1:
        print("error: --topk must be >= 1", file=sys.stderr)
        return 2
    args.rows = read_questions(args.file) if args.file else None  # bad lines fail before any loading
    try:
        tokenizer = getattr(generator, "tokenizer", None) or load_tokenizer_and_check(args.model)
        client = make_search_client(args.retriever_url, args.corpus, args.index, topk=args.topk)
        gen = generator or make_generator(args.model, args.backend, args.device, args.seed)
        asker = Asker(gen, tokenizer, client, max_turns=args.max_turns, topk=args.topk,
                      temperature=args.temperature, max_new_tokens=args.max_new_tokens, model_path=args.model)
        return asyncio.run(_run(args, asker))
    except InferenceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
