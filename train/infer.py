"""python -m train.infer: ask a Search-R1 model a question and watch it search.

The same command is ``python infer.py`` in a checkout and ``search-r1-infer`` once installed:

    python infer.py "Who illustrated American Splendor?"
    python infer.py --model smollm2-135m-instruct --index runs/index/minilm "Who wrote Hamlet?"
    python infer.py --model runs/demo/hf --index runs/demo/task/bm25 --device cpu \
        "$(python -m train.demo question runs/demo/eval_after.jsonl)"    # the model `make demo` trained
    python infer.py --file questions.jsonl --out answers.jsonl        # FlashRAG jsonl in, jsonl out

With --file, each answer is appended to --out as it finishes; the same command run again after an
interruption asks only the questions not answered yet.

The model needs a retriever: a running server (``bash retrieval_launch.sh``; ``--retriever-url``)
or an index loaded in-process (``--index DIR``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import Optional

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from train.errors import DataError, EngineDead, RetrieverDown, UserError, exit_on_error  # noqa: E402

COLOURS = {"think": "\033[2m", "search": "\033[1;36m", "answer": "\033[1;32m", "obs": "\033[33m", "reset": "\033[0m"}


def render(result, colour: bool) -> str:
    from train.search_r1 import prompts, protocol

    c = COLOURS if colour else {k: "" for k in COLOURS}
    lines = [f"{c['search']}Question:{c['reset']} {prompts.normalize_question(result.question)}"]
    turn = 0
    for kind, text in result.segments:
        if kind == "model":
            turn += 1
            lines.append(f"--- turn {turn} " + "-" * 50)
            text = "".join(c[kind] + piece + c["reset"] if kind in c else piece
                           for kind, piece in protocol.tagged_spans(text))
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
    from train.inference.settings import DEFAULT_MODEL, add_flags
    from train.search_r1 import prompts

    ap = argparse.ArgumentParser(prog="infer.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("question", nargs="?", help="the question (or use --file)")
    ap.add_argument("--file", help="FlashRAG-format jsonl of questions (id, question, golden_answers)")
    ap.add_argument("--out", help="with --file: output jsonl (default: <file>.answers.jsonl)")
    ap.add_argument("--model", default=DEFAULT_MODEL,
                    help=f"a model folder, a hub id or a name of `python -m train.get_model --list` "
                         f"(default {DEFAULT_MODEL})")
    ap.add_argument("--method", choices=list(prompts.METHODS), default="search_r1",
                    help="search_r1 (the agent; default) or a baseline of the paper's table: direct, cot, rag")
    add_flags(ap, concurrency_help="with --file: questions in flight (default %(default)s)")
    return ap


async def _run(args, asker, made_by: Optional[dict] = None) -> int:
    from tqdm import tqdm

    from train.inference.results_file import ResultsFile
    from train.search_r1.reward import em, f1

    if not args.file:
        result = await asker.ask(args.question)
        print(render(result, colour=sys.stdout.isatty()))
        return 0
    rows = args.rows
    out_path = args.out or args.file + ".answers.jsonl"
    answers = ResultsFile(out_path, rows, key="id", same=("question",), made_by=made_by,
                          log=lambda m: print(m, file=sys.stderr)).open()
    todo = answers.todo()
    bar = tqdm(total=len(todo), desc="questions", file=sys.stderr)
    failed: list[str] = []

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
        answers.append(d)  # as each finishes: a crash loses no answer

    try:
        await asyncio.gather(*(one(r) for r in todo))
    finally:
        ours = answers.finish()  # in the input's order
    bar.close()
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


@exit_on_error
def main(argv=None, generator=None) -> int:
    """``generator`` (a server manager) replaces the model backend; tests pass a scripted one. Exit
    status: 0 done, 2 bad input, 3 a question saw a failed search (not written), 4 the engine died."""
    from train.inference.asker import build_asker
    from train.inference.settings import from_parsed

    ap = build_parser()
    args = ap.parse_args(argv)
    settings = from_parsed(ap, args)
    if bool(args.question) == bool(args.file):
        raise UserError("give a question or --file (not both)")
    if args.question is not None and not args.question.strip():
        raise UserError("the question is empty")
    args.rows = read_questions(args.file) if args.file else None  # bad lines fail before any loading
    try:
        asker = build_asker(settings, generator)
        return asyncio.run(_run(args, asker, settings.answer_settings()))
    except EngineDead as e:
        raise EngineDead(f"{e}; the answers written so far are kept: rerun the same command for the others") from None


if __name__ == "__main__":
    sys.exit(main())
