"""Issue 22 on CPU: evaluation on several engines (split, merge, an engine killed, the run killed and
resumed, the same table as one engine), the baseline methods, every checkpoint of a run with its best
step, and the batched hf engine that keeps the KV cache across turns (same answers as
``model.generate``). The policy is the learnable task's warm start (it searches, then answers)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from train import evaluate
from train.evaluation import results as eval_results
from train.search_r1 import prompts

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def rows_of(path: Path) -> dict[str, dict]:
    out = {}
    for line in path.read_text().splitlines():
        d = json.loads(line)
        assert d["uid"] not in out, f"uid {d['uid']} written twice in {path}"
        out[d["uid"]] = d
    return out


def answers(path: Path) -> dict[str, tuple]:
    return {u: (d["trajectory"], d["em"]) for u, d in rows_of(path).items()}


def eval_cmd(learn_task, learn_server, out: Path, *extra) -> list[str]:
    return [sys.executable, "-m", "train.evaluate", "--model", str(learn_task / "model"),
            "--data", str(learn_task / "data" / "train.parquet"), "--limit", "60",
            "--retriever-url", learn_server.url, "--out", str(out), *extra]


def wait_rows(path: Path, n: int, proc: subprocess.Popen, timeout: float = 300) -> None:
    t0 = time.time()
    while time.time() - t0 < timeout:
        if path.is_file() and len(path.read_text().splitlines()) >= n:
            return
        assert proc.poll() is None, f"the evaluation ended (rc {proc.returncode}) before {n} rows"
        time.sleep(0.05)
    raise AssertionError(f"{path}: fewer than {n} rows after {timeout} s")


def engine_pids(parent: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(parent), "-f", "train.evaluation.engine_worker"],
                         capture_output=True, text=True).stdout
    return sorted(int(p) for p in out.split())


@pytest.fixture(scope="module")
def one_engine(learn_task, learn_server, tmp_path_factory):
    """The reference: the same 60 questions on one engine, in this process's way (no pool)."""
    out = tmp_path_factory.mktemp("one") / "one.jsonl"
    r = subprocess.run(eval_cmd(learn_task, learn_server, out, "--engines", "1"), cwd=ROOT, env=ENV,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "on 1 engine:" in r.stdout and "questions/s" in r.stdout and "generated tokens/s" in r.stdout
    table = r.stdout[r.stdout.index("source"):r.stdout.index("average (macro)")]
    return out, table


def test_two_engines_an_engine_killed_midway_same_table(learn_task, learn_server, one_engine, tmp_path):
    ref, ref_table = one_engine
    out = tmp_path / "two.jsonl"
    proc = subprocess.Popen(eval_cmd(learn_task, learn_server, out, "--engines", "2", "--concurrency", "2"), cwd=ROOT,
                            env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_rows(out, 12, proc)
    pids = engine_pids(proc.pid)
    assert len(pids) == 2, pids
    os.kill(pids[1], signal.SIGKILL)  # one engine dies with questions in flight
    stdout, stderr = proc.communicate(timeout=900)
    assert proc.returncode == 0, stderr[-3000:]
    assert "2 engines ready" in stderr and "engine 1 died" in stderr and "asking them on the 1 other engines" in stderr
    assert "asked again after their engine died" in stdout
    assert answers(out) == answers(ref)  # every row once, the same trajectories (greedy)
    assert stdout[stdout.index("source"):stdout.index("average (macro)")] == ref_table


def test_an_engine_whose_core_died_hands_its_questions_over(learn_task, learn_server, one_engine, tmp_path):
    """The worker process lives on but its engine answers every request with EngineDeadError (vLLM's
    front-end after its EngineCore died): the worker is treated as dead, its questions go to the other."""
    ref, ref_table = one_engine
    out = tmp_path / "dead_core.jsonl"
    env = {**ENV, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests" / "engine_dead"), str(ROOT)]),
           "ENGINE_DEAD_LOCK": str(tmp_path / "saboteur"), "ENGINE_DEAD_AFTER": "3"}
    r = subprocess.run(eval_cmd(learn_task, learn_server, out, "--engines", "2", "--concurrency", "2"), cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=900)
    assert (tmp_path / "saboteur").is_file()  # one worker did get the failing engine
    assert r.returncode == 0, r.stderr[-3000:]
    assert "EngineDeadError" in r.stderr and "asking them on the 1 other engines" in r.stderr
    assert "asked again after their engine died" in r.stdout
    assert answers(out) == answers(ref)
    assert r.stdout[r.stdout.index("source"):r.stdout.index("average (macro)")] == ref_table


def test_two_engines_run_killed_and_resumed_same_table(learn_task, learn_server, one_engine, tmp_path):
    ref, ref_table = one_engine
    out = tmp_path / "resumed.jsonl"
    cmd = eval_cmd(learn_task, learn_server, out, "--engines", "2", "--concurrency", "2")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    wait_rows(out, 20, proc)
    os.killpg(proc.pid, signal.SIGKILL)  # the whole run: the evaluator and both engines
    proc.wait(timeout=60)
    written = len(out.read_text().splitlines())
    assert 20 <= written < 60
    r = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"resuming: {written} of 60 rows already in" in r.stdout or f"resuming: {written - 1} of 60" in r.stdout
    assert answers(out) == answers(ref)
    assert r.stdout[r.stdout.index("source"):r.stdout.index("average (macro)")] == ref_table


def test_engine_plan_and_flags():
    from train.errors import InferenceError
    from train.evaluation.pool import plan

    assert plan(None, 1, []) == [None]
    assert plan(2, 1, []) == [None, None]
    assert plan(None, 1, ["0", "1", "2", "3"]) == ["0", "1", "2", "3"]
    assert plan(None, 2, ["4", "5", "6", "7"]) == ["4,5", "6,7"]
    assert plan(1, 2, ["0", "1", "2"]) == ["0,1"]
    with pytest.raises(InferenceError, match="needs 6 GPUs; 4 visible"):
        plan(3, 2, ["0", "1", "2", "3"])
    with pytest.raises(InferenceError, match="needs GPUs; none is visible"):
        plan(None, 2, [])
    for bad, msg in ((["--engines", "0"], "--engines must be >= 1"),
                     (["--tensor-parallel-size", "2"], "needs --backend vllm"),
                     (["--method", "nope"], "invalid choice")):
        with pytest.raises(SystemExit):
            evaluate.main(["--model", "m", "--data", "x", *bad])
    with pytest.raises(SystemExit):
        evaluate.main(["--data", "x"])  # neither --model nor --checkpoints


def test_checkpoints_flag_bad_folders(learn_task, tmp_path, capsys):
    data = str(learn_task / "data" / "test.parquet")
    assert evaluate.main(["--checkpoints", str(tmp_path / "none"), "--data", data]) == 2
    assert "no such folder" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert evaluate.main(["--checkpoints", str(tmp_path / "empty"), "--data", data]) == 2
    assert "no global_step_N folder in it" in capsys.readouterr().err


def test_baseline_prompts_are_search_r1s():
    rag = prompts.make_method_messages("rag", "who wrote hamlet", ['"Hamlet"\nA play by Shakespeare.', '"X"\nY'])
    text = rag[0]["content"]
    assert text.startswith("Answer the given question with some potentially useful context. ")
    assert text.endswith("Question: who wrote hamlet? Context: Doc 1(Title: \"Hamlet\") A play by Shakespeare.\n"
                         "Doc 2(Title: \"X\") Y\n \n")
    cot = prompts.make_method_messages("cot", "q")[0]["content"]
    assert "You should first have a reasoning process in mind and then provides the answer." in cot
    assert "<think>" not in prompts.make_method_messages("direct", "q")[0]["content"]
    assert prompts.make_method_messages("search_r1", "q") == prompts.make_messages("q")
    with pytest.raises(ValueError, match="needs the retrieved passages"):
        prompts.make_method_messages("rag", "q")


def test_rag_and_direct_end_to_end(learn_task, learn_server, tmp_path, capsys):
    data = str(learn_task / "data" / "test.parquet")
    model = str(learn_task / "model")
    out = tmp_path / "rag.jsonl"
    assert evaluate.main(["--model", model, "--data", data, "--method", "rag", "--retriever-url", learn_server.url,
                          "--out", str(out), "--paper-row", "3B-Ins RAG", "--expect-corpus", "any"]) == 0
    printed = capsys.readouterr().out
    assert "paper row '3B-Ins RAG': Search-R1 paper (arXiv 2503.09516 v5), Table 2" in printed
    rows = rows_of(out)
    assert len(rows) == 20 and all(d["searches"] == 0 and d["generated_tokens"] > 0 for d in rows.values())
    assert all(d["stop_reason"] in ("answer", "eos", "length") for d in rows.values())
    # direct and cot need no retriever: nothing answers at this address
    from tests.conftest import free_port

    out = tmp_path / "direct.jsonl"
    assert evaluate.main(["--model", model, "--data", data, "--method", "direct", "--max-new-tokens", "16",
                          "--retriever-url", f"http://127.0.0.1:{free_port()}", "--out", str(out)]) == 0
    assert len(rows_of(out)) == 20


def test_rag_prompt_reaches_the_model(learn_task, learn_server):
    """The passages of the question are in the prompt the engine gets (a recording generator)."""
    from transformers import AutoTokenizer
    from verl.workers.rollout.replica import TokenOutput

    from retrieval.client import RetrievalClient
    from train.inference.asker import Asker
    from train.inference.settings import AskSettings

    tok = AutoTokenizer.from_pretrained(learn_task / "model")
    seen = []

    class Recorder:
        async def generate(self, request_id=None, *, prompt_ids, sampling_params, **kw):
            seen.append((tok.decode(prompt_ids), sampling_params))
            return TokenOutput(token_ids=tok.encode("<think>x</think><answer> Paris </answer> tail",
                                                    add_special_tokens=False))

    async def go():
        client = RetrievalClient(learn_server.url, topk=3)
        asker = Asker(Recorder(), tok, client, AskSettings(model=None, method="rag"))
        res = await asker.ask("What is the capital of France")
        await client.aclose()
        return res

    res = asyncio.run(go())
    prompt, params = seen[0]
    assert "Context: Doc 1(Title: " in prompt and "Doc 3(Title: " in prompt and "Doc 4(" not in prompt
    assert params["stop"] == ["</answer>"] and params["temperature"] == 0.0
    assert res.answer == "Paris" and res.response.endswith("</answer>") and res.searches == 0


def test_hf_engine_same_answers_as_generate_and_reuses_the_cache(learn_task, learn_server):
    """Greedy: the batched engine with the KV cache kept across turns gives the very trajectories of
    ``model.generate`` one question at a time (HFServerManager), on multi-turn search trajectories."""
    from retrieval.client import RetrievalClient
    from train.inference.asker import Asker
    from train.inference.hf_engine import HFBatchedServerManager
    from train.inference.hf_generate import HFServerManager
    from train.inference.settings import AskSettings

    old = HFServerManager.from_pretrained(str(learn_task / "model"), device="cpu", seed=0)
    new = HFBatchedServerManager(old.model, old.tokenizer, "cpu", 0)
    questions = [r["question"] for r in eval_results.load_rows(str(learn_task / "data" / "test.parquet"), None, None)]

    async def run(gen):
        client = RetrievalClient(learn_server.url, topk=3)
        asker = Asker(gen, old.tokenizer, client, AskSettings(model=str(learn_task / "model"), max_turns=4,
                                                              temperature=0.0, max_new_tokens=64))
        out = await asyncio.gather(*(asker.ask(q) for q in questions))
        await client.aclose()
        return [(r.response, r.answer, r.searches) for r in out]

    a, b = asyncio.run(run(old)), asyncio.run(run(new))
    assert sum(s for _, _, s in a) >= len(questions)  # multi-turn: at least a search per question
    assert a == b
    st = new.describe()
    assert st["reused_tokens"] > st["prefill_tokens"]  # later turns fed only their new tokens
    assert st["decode_rows"] > 2 * st["decode_steps"]  # several questions per decoding step


def test_hf_engine_sampling_stops_and_errors(learn_task):
    from train.inference.hf_engine import HFBatchedServerManager

    eng = HFBatchedServerManager.from_pretrained(str(learn_task / "model"), device="cpu", seed=0)
    tok = eng.tokenizer
    prompt = tok.encode(prompts.render_prompt(tok, "What is the capital of France?"), add_special_tokens=False)

    async def go():
        sp = {"temperature": 1.0, "top_p": 0.9, "max_tokens": 40, "logprobs": True, "stop": ["</search>"]}
        outs = await asyncio.gather(*(eng.generate(f"s{i}", prompt_ids=prompt, sampling_params=sp) for i in range(4)))
        bad = None
        try:
            await eng.generate("x", prompt_ids=[], sampling_params=sp)
        except ValueError as e:
            bad = str(e)
        good = await eng.generate("y", prompt_ids=prompt, sampling_params={"temperature": 0.0, "max_tokens": 3})
        return outs, bad, good

    outs, bad, good = asyncio.run(go())
    for o in outs:
        assert 0 < len(o.token_ids) <= 40 and len(o.log_probs) == len(o.token_ids)
        assert all(lp <= 0 for lp in o.log_probs)
        text = tok.decode(o.token_ids)
        assert "</search>" not in text[:-len("</search>")] or text.endswith("</search>") or len(o.token_ids) == 40
    assert bad == "generate: empty prompt" and len(good.token_ids) <= 3  # the engine goes on after a bad request
    eng.close()


def test_every_checkpoint_evaluated_best_step_resumable(learn_task, learn_server, learn_run, tmp_path, capsys):
    """``--checkpoints``: each complete global_step_N merged on the fly and evaluated on the fixed
    sample, one row per step, the best step named and plotted; an incomplete step is skipped with the
    reason; a second call evaluates nothing, a step whose summary row is gone is redone from its jsonl."""
    import shutil

    run, _ = learn_run
    ckpts = tmp_path / "checkpoints"
    shutil.copytree(run / "checkpoints", ckpts)
    shutil.copy(run / "metrics.jsonl", ckpts / "metrics.jsonl")
    (ckpts / "global_step_7" / "actor").mkdir(parents=True)  # a save cut short
    out = tmp_path / "steps"
    args = ["--checkpoints", str(ckpts), "--data", str(learn_task / "data" / "test.parquet"),
            "--retriever-url", learn_server.url, "--out", str(out)]
    assert evaluate.main(args) == 0
    captured = capsys.readouterr()
    assert "step 7: skipped, the checkpoint is incomplete" in captured.err
    rows = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [5, 10] and all(r["n"] == 20 for r in rows)
    best = json.loads((out / "best.json").read_text())
    assert best == max(rows, key=lambda r: (r["em"], -r["step"]))
    assert f"best step: {best['step']} (EM {best['em']:.3f})" in captured.out
    assert (out / "em_vs_step.png").stat().st_size > 10_000
    assert sorted(p.name for p in out.iterdir()) == [
        "best.json", "em_vs_step.png", "global_step_10.jsonl", "global_step_10.jsonl.settings.json",
        "global_step_5.jsonl", "global_step_5.jsonl.settings.json", "steps.jsonl"]  # merges deleted
    made_by = {s: json.loads((out / f"global_step_{s}.jsonl.settings.json").read_text()) for s in (5, 10)}
    assert made_by[5]["weights"] != made_by[10]["weights"]  # each step's own weights, merged in a temporary folder
    for r in rows:  # a step's EM is its jsonl's
        per = rows_of(out / f"global_step_{r['step']}.jsonl")
        assert abs(r["em"] - sum(d["em"] for d in per.values()) / 20) < 1e-9
    assert evaluate.main(args) == 0
    assert "2 already evaluated" in capsys.readouterr().out
    (out / "steps.jsonl").write_text(json.dumps(rows[0]) + "\n")
    assert evaluate.main(args) == 0
    again = capsys.readouterr().out
    assert "resuming: 20 of 20 rows" in again and len((out / "steps.jsonl").read_text().splitlines()) == 2
