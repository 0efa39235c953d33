"""Ask a Search-R1 model a question and watch it search.

    python infer.py "Who illustrated American Splendor?"
    python infer.py --model runs/demo/ckpt --index runs/index/minilm "Who wrote Hamlet?"
    python infer.py --file questions.jsonl --out answers.jsonl        # FlashRAG jsonl in, jsonl out

With --file, each answer is appended to --out as it finishes; the same command run again after an
interruption asks only the questions not answered yet.

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
    ap.add_argument("--concurrency", type=int, default=256, help="with --file: questions in flight (default 256)")
    from train.inference import add_engine_flags

    add_engine_flags(ap)
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
    done = read_answers(out_path, rows)
    todo = [r for r in rows if r["id"] not in done]
    if done:
        print(f"resuming: {len(rows) - len(todo)} of {len(rows)} questions already answered in {out_path}",
              file=sys.stderr)
    bar = tqdm(total=len(todo), desc="questions", file=sys.stderr)
    failed: list[str] = []

    with open(out_path, "a", encoding="utf-8") as f:
        async def one(row):
            res = await asker.ask(row["question"])
            bar.update(1)
            if res.failed_searches:  # an answer given without the passages it asked for: not kept
                failed.append(row["id"])
                return
            d = {"id": row["id"], **res.to_dict()}
            if row["golden_answers"]:
                d["golden_answers"] = row["golden_answers"]
                d["em"] = em(res.answer, row["golden_answers"]) if res.answer is not None else 0.0
                d["f1"] = f1(res.answer, row["golden_answers"]) if res.answer is not None else 0.0
            f.write(json.dumps(d, ensure_ascii=False) + "\n")  # as each finishes: a crash loses no answer
            f.flush()
            done[row["id"]] = d

        await asyncio.gather(*(one(r) for r in todo))
    bar.close()
    order = {r["id"]: i for i, r in enumerate(rows)}  # appended as they finished; now in the file's order
    tmp = out_path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(d, ensure_ascii=False) + "\n"
                     for d in sorted(done.values(), key=lambda d: order.get(d["id"], len(order))))
    os.replace(tmp, out_path)
    ours = [done[r["id"]] for r in rows if r["id"] in done]
    scored = [d["em"] for d in ours if "em" in d]
    summary = f"{len(ours)} of {len(rows)} answers in {out_path}"
    if scored:
        summary += f"; EM {sum(scored) / len(scored):.3f} over {len(scored)} questions with gold answers"
    print(summary)
    if failed:
        print(f"error: {len(failed)} questions saw a failed search and were not written (e.g. id {failed[0]!r}); "
              f"rerun the same command once the retriever answers: the answers above are kept", file=sys.stderr)
        return 3
    return 0


def read_answers(path: str, rows: list[dict]) -> dict[str, dict]:
    """The answers already in ``path`` (an earlier, maybe interrupted, run), by id; the file is rewritten
    without a line an interruption cut short. An id of ``rows`` answered for another question is an error."""
    if not os.path.isfile(path):
        return {}
    questions = {r["id"]: r["question"] for r in rows}
    done: dict[str, dict] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                d = json.loads(line)
            except json.JSONDecodeError:
                continue  # the last line of a run that was killed while writing it
            if not isinstance(d, dict) or "id" not in d:
                continue
            if d["id"] in questions and d.get("question") != questions[d["id"]]:
                raise SystemExit(f"error: {path} holds answers to other questions (id {d['id']!r}: "
                                 f"{str(d.get('question'))[:80]!r}); pass another --out, or delete the file")
            done[str(d["id"])] = d
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(d, ensure_ascii=False) + "\n" for d in done.values())
    os.replace(tmp, path)
    return done


def main(argv=None, generator=None) -> int:
    """``generator`` (a server manager) replaces the model backend; tests pass a scripted one."""
    ap = build_parser()
    args = ap.parse_args(argv)
    from train.inference import (Asker, EngineDead, InferenceError, check_engine_flags, engine_settings,
                                 load_tokenizer_and_check, make_generator, make_search_client)

    check_engine_flags(ap, args)
    if args.concurrency < 1:
        ap.error("--concurrency must be >= 1")

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
        gen = generator or make_generator(args.model, args.backend, args.device, args.seed, vllm=engine_settings(args))
        asker = Asker(gen, tokenizer, client, max_turns=args.max_turns, topk=args.topk,
                      temperature=args.temperature, max_new_tokens=args.max_new_tokens, model_path=args.model,
                      concurrency=args.concurrency)
        return asyncio.run(_run(args, asker))
    except EngineDead as e:
        print(f"error: {e}; the answers written so far are kept: rerun the same command for the others",
              file=sys.stderr)
        return 4
    except InferenceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
