"""infer.py and the evaluator: scripted generator (exact output), tiny model end to end, errors."""

import json
import sys
from pathlib import Path

from verl.workers.rollout.replica import TokenOutput

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from train import evaluate, infer  # noqa: E402
from train.evaluation import report as eval_report  # noqa: E402
from train.evaluation import results as eval_results  # noqa: E402


class ScriptedByQuestion:
    """Searches twice, then answers with ``answers[question]`` (or "wrong")."""

    def __init__(self, tokenizer, answers=None):
        self.tokenizer, self.answers = tokenizer, answers or {}

    async def generate(self, request_id=None, *, prompt_ids, sampling_params, **kw):
        text = self.tokenizer.decode(prompt_ids)
        question = text.split("Question: ", 1)[1].split("\n", 1)[0]
        turn = text.count("<information>") - 1  # the prompt itself names the tag once
        if turn < 2:
            out = f"<think>need facts</think><search> {question[:20]} {turn} </search>"
        else:
            out = f"<think>done</think><answer> {self.answers.get(question, 'wrong')} </answer>"
        return TokenOutput(token_ids=self.tokenizer.encode(out, add_special_tokens=False))


def test_infer_prints_exact_trajectory(tiny_tokenizer, bm25_server, capsys):
    gen = ScriptedByQuestion(tiny_tokenizer, {"Who illustrated American Splendor?": "Gerry Shamray"})
    rc = infer.main(["Who illustrated American Splendor", "--retriever-url", bm25_server.url], generator=gen)
    out = capsys.readouterr().out
    assert rc == 0
    lines = out.splitlines()
    assert lines[0] == "Question: Who illustrated American Splendor?"
    assert lines[1].startswith("--- turn 1 ")
    assert lines[2] == "<think>need facts</think><search> Who illustrated Amer 0 </search>"
    assert lines[3].startswith("<information>Doc 1(Title: ")
    assert out.count("--- turn") == 3 and out.count("<information>") == 2
    assert lines[-1] == "Answer: Gerry Shamray   [2 searches, stopped: answer]"


def test_infer_file_mode_with_em(tiny_tokenizer, bm25_server, tmp_path):
    rows = [{"id": "a", "question": "Q one", "golden_answers": ["Paris"]},
            {"id": "b", "question": "Q two", "golden_answers": ["Rome"]}]
    f = tmp_path / "q.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    gen = ScriptedByQuestion(tiny_tokenizer, {"Q one?": "paris"})
    assert infer.main(["--file", str(f), "--retriever-url", bm25_server.url], generator=gen) == 0
    out = [json.loads(line) for line in open(str(f) + ".answers.jsonl")]
    assert [(d["id"], d["answer"], d["em"], d["searches"]) for d in out] == [
        ("a", "paris", 1.0, 2), ("b", "wrong", 0.0, 2)]


def test_infer_errors(tiny_tokenizer, tmp_path, capsys):
    from tests.conftest import free_port

    gen = ScriptedByQuestion(tiny_tokenizer)
    assert infer.main(["   "], generator=gen) == 2
    assert "question is empty" in capsys.readouterr().err
    assert infer.main(["q", "--retriever-url", f"127.0.0.1:{free_port()}"], generator=gen) == 2
    assert "retrieval_launch.sh" in capsys.readouterr().err
    assert infer.main(["q", "--model", str(tmp_path / "no_model")]) == 2
    assert "model path not found" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "1", "question": "ok"}\n{"id": "2"}\n')
    assert infer.main(["--file", str(bad), "--index", "x"], generator=gen) == 2
    assert "bad.jsonl:2: row has no question" in capsys.readouterr().err
    assert infer.main([], generator=gen) == 2


def test_infer_tiny_model_in_process_index(tiny_model_dir, bm25_index_dir, capsys):
    rc = infer.main(["Who illustrated American Splendor", "--model", str(tiny_model_dir), "--index",
                     str(bm25_index_dir), "--max-new-tokens", "8", "--max-turns", "1", "--device", "cpu"])
    out = capsys.readouterr().out
    assert rc == 0 and out.startswith("Question: Who illustrated American Splendor?") and "Answer:" in out


def _test_parquet(tmp_path, qa_path):
    from train.data_prep import main as prep

    prep(["--out", str(tmp_path), "--local", str(qa_path), "--holdout", "10"])
    return tmp_path / "test.parquet"


def test_evaluator_known_em_resume_and_table(tiny_tokenizer, bm25_server, tmp_path, qa_path, capsys):
    data = _test_parquet(tmp_path / "data", qa_path)
    rows = eval_results.load_rows(str(data), None, None)
    assert len(rows) == 20
    # right on the first 3 nq and 7 hotpotqa rows, wrong elsewhere
    nq = [r for r in rows if r["data_source"] == "nq"][:3]
    hq = [r for r in rows if r["data_source"] == "hotpotqa"][:7]
    answers = {r["question"] if r["question"].endswith("?") else r["question"] + "?": r["golds"][0] for r in nq + hq}
    gen = ScriptedByQuestion(tiny_tokenizer, answers)
    out = tmp_path / "eval.jsonl"
    args = ["--model", "scripted", "--data", str(data), "--out", str(out), "--retriever-url", bm25_server.url,
            "--paper-row", "3B-Ins GRPO+LLDS", "--expect-corpus", "sample"]  # the bundled sample, not wiki-18
    assert evaluate.main(args, generator=gen) == 0
    printed = capsys.readouterr().out
    assert "nq                     10   0.300" in printed
    assert "hotpotqa               10   0.700" in printed
    # two of the paper's 7 sources: beside our average, the paper's mean over the same two (not its .441)
    paper = eval_report.paper_row("3B-Ins GRPO+LLDS")
    mean2 = (paper["nq"] + paper["hotpotqa"]) / 2
    assert f"{'average (macro)':<18}{20:>7}{0.5:>8.3f}{'':>8}{mean2:>10.3f}" in printed and "0.441" not in printed
    assert "over 2 of the paper's 7 sources" in printed
    # resume: drop half the lines (and cut one in the middle), re-run, same table, only missing rows redone
    lines = out.read_text().splitlines()
    out.write_text("\n".join(lines[:10]) + "\n" + lines[10][:15])
    assert evaluate.main(args, generator=gen) == 0
    printed2 = capsys.readouterr().out
    assert "resuming: 10 of 20" in printed2 and "average (macro)        20   0.500" in printed2
    assert len({json.loads(line)["uid"] for line in out.read_text().splitlines() if line.endswith("}")}) == 20


def test_evaluator_errors(tmp_path, capsys):
    assert evaluate.main(["--model", "m", "--data", str(tmp_path / "none.parquet")]) == 2
    assert "not found" in capsys.readouterr().err
    assert evaluate.main(["--model", "m", "--data", "x", "--paper-row", "nope"]) == 2
    assert "unknown" in capsys.readouterr().err
