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

from train.errors import DataError, EngineDead, RetrieverDown, UserError, exit_on_error  # noqa: E402
from train.inference.asker import check_asker_flags  # noqa: E402

COLOURS = {"think": "\033[2m", "search": "\033[1;36m", "answer": "\033[1;32m", "obs": "\033[33m", "reset": "\033[0m"}


def render(result, colour: bool) -> str:
    import re

    from train.search_r1 import protocol

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
    from train.search_r1.dataset import check_record, read_jsonl

    if not os.path.isfile(path):
        raise DataError(f"--file not found: {path}")
    rows = []
    for n, rec in read_jsonl(path):
        q = rec.get("question")
        if not isinstance(q, str) or not q.strip():
            raise DataError(f"{path}:{n}: row has no question")
        golds = check_record(rec, f"{path}:{n}")[1] if rec.get("golden_answers") else None
        rows.append({"id": str(rec.get("id", n)), "question": q, "golden_answers": golds})
    return rows


def build_parser() -> argparse.ArgumentParser:
    from train.inference.asker import add_asker_flags
    from train.inference.backends import DEFAULT_MODEL

    ap = argparse.ArgumentParser(prog="python infer.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("question", nargs="?", help="the question (or use --file)")
    ap.add_argument("--file", help="FlashRAG-format jsonl of questions (id, question, golden_answers)")
    ap.add_argument("--out", help="with --file: output jsonl (default: <file>.answers.jsonl)")
    ap.add_argument("--model", default=DEFAULT_MODEL, help=f"local path or hub id (default {DEFAULT_MODEL})")
    ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    ap.add_argument("--seed", type=int, default=0)
    add_asker_flags(ap, concurrency_help="with --file: questions in flight (default %(default)s)")
    return ap


async def _run(args, asker) -> int:
    from tqdm import tqdm

    from train.search_r1.reward import em, f1

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
        raise RetrieverDown(f"{len(failed)} questions saw a failed search and were not written (e.g. id "
                            f"{failed[0]!r}); rerun the same command once the retriever answers: the answers above "
                            f"are kept")
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
                raise DataError(f"{path} holds answers to other questions (id {d['id']!r}: "
                                 f"{str(d.get('question'))[:80]!r}); pass another --out, or delete the file")
            done[str(d["id"])] = d
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(d, ensure_ascii=False) + "\n" for d in done.values())
    os.replace(tmp, path)
    return done


@exit_on_error
def main(argv=None, generator=None) -> int:
    """``generator`` (a server manager) replaces the model backend; tests pass a scripted one. Exit
    status: 0 done, 2 bad input, 3 a question saw a failed search (not written), 4 the engine died."""
    from train.inference.asker import build_asker

    ap = build_parser()
    args = ap.parse_args(argv)
    check_asker_flags(ap, args)
    if bool(args.question) == bool(args.file):
        raise UserError("give a question or --file (not both)")
    if args.question is not None and not args.question.strip():
        raise UserError("the question is empty")
    args.rows = read_questions(args.file) if args.file else None  # bad lines fail before any loading
    try:
        asker = build_asker(args, generator, temperature=args.temperature, seed=args.seed)
        return asyncio.run(_run(args, asker))
    except EngineDead as e:
        raise EngineDead(f"{e}; the answers written so far are kept: rerun the same command for the others") from None


if __name__ == "__main__":
    sys.exit(main())
