"""Every command-line entry point names a bad flag value and exits non-zero before doing work."""

import pytest

from tests.conftest import free_port, refuses


def fails(main, argv, capsys, message):
    import re

    refuses(main, argv, capsys, re.escape(message))


def test_retrieval_build(capsys, tmp_path, corpus_path):
    from retrieval.build import main

    fails(main, ["--corpus", str(tmp_path / "none.jsonl"), "--out", str(tmp_path)], capsys, "file not found")
    fails(main, ["--corpus", str(corpus_path), "--out", str(tmp_path), "--batch-size", "0"], capsys, "--batch-size")
    fails(main, ["--corpus", str(corpus_path), "--out", str(tmp_path), "--kind", "sparse"], capsys, "invalid choice")
    for flag, value in (("--recall-sample", "-1"), ("--nprobe", "0"), ("--train-size", "0")):
        fails(main, ["--corpus", str(corpus_path), "--out", str(tmp_path), flag, value], capsys,
              "--train-size and --nprobe must be >= 1, --recall-sample >= 0")


def test_multinode_retriever_role_needs_its_node_address():
    import os
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    env = {k: v for k, v in os.environ.items() if k != "NODE_IP"}
    r = subprocess.run(["bash", "scripts/multinode.sh"], cwd=root, env={**env, "ROLE": "retriever"},
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "set NODE_IP=<the address of this node>" in r.stderr, r.stderr


def test_multinode_worker_without_the_heads_token(tmp_path):
    """A worker node without the head's Ray token stops before `ray start` and says what to copy (Ray's own
    error is a traceback that names neither the head nor the file)."""
    import os
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH_TOKEN")}
    r = subprocess.run(["bash", "scripts/multinode.sh"], cwd=root, capture_output=True, text=True, timeout=60,
                       env={**env, "ROLE": "worker", "HEAD": "198.18.0.9", "HOME": str(tmp_path)})
    assert r.returncode == 1 and "no Ray authentication token on this node: copy the head's ~/.ray/auth_token" \
        in r.stderr, r.stderr
    assert not (tmp_path / ".ray").exists()


def test_retrieval_server(capsys, tmp_path):
    from retrieval.server import main

    fails(main, ["--index", str(tmp_path), "--max-batch", "0"], capsys, "--max-batch")
    fails(main, ["--index", str(tmp_path), "--topk", "0"], capsys, "--topk")


def test_retrieval_client_health(capsys):
    from retrieval.client import main

    fails(main, ["127.0.0.1:1", "--wait", "-1"], capsys, "--wait")
    assert main([f"127.0.0.1:{free_port()}"]) == 3  # the retriever does not answer


def test_data_prep_and_tiny(capsys, tmp_path, qa_path):
    from train.data_prep import main as prep
    from train.tiny import main as tiny

    fails(prep, ["--out", str(tmp_path), "--local", str(qa_path), "--holdout", "-1"], capsys, "--holdout")
    fails(tiny, [str(tmp_path / "m"), "--hidden-size", "65", "--heads", "2"], capsys, "multiple of --heads")
    fails(tiny, [str(tmp_path / "m"), "--corpus", str(tmp_path / "none.jsonl")], capsys, "--corpus not found")
    fails(tiny, [str(tmp_path / "m"), "--sft-steps", "-3"], capsys, "--sft-steps")


def test_evaluate_limit(capsys):
    from train.evaluate import main

    fails(main, ["--model", "m", "--data", "x", "--limit", "0"], capsys, "--limit")


def test_new_flags_and_config_keys(capsys, tmp_path, qa_path):
    """Flags and config keys added for the GPU first run, the released-run settings and robustness."""
    from train.data_prep import main as prep
    from train.evaluate import main as evaluate
    from train.geometry import main as geometry
    from train.llds.loss import LLDSConfig
    from train.search_r1.config import SearchConfig

    fails(prep, ["--out", str(tmp_path), "--local", str(qa_path), "--val-per-source", "-1"], capsys,
          "--val-per-source")
    fails(evaluate, ["--model", "m", "--data", "x", "--concurrency", "0"], capsys, "--concurrency")
    assert geometry(["--ranks", "0"]) == 2 and "ranks, n and updates must be >= 1" in capsys.readouterr().err
    with pytest.raises(ValueError, match="search_r1.max_query_chars"):
        SearchConfig.from_config({"max_query_chars": 0})
    with pytest.raises(ValueError, match="llds.valid_search_count"):
        LLDSConfig.from_dict({"valid_search_count": "all"})


def test_evaluate_refuses_to_resume_onto_other_data(tmp_path, qa_path, capsys, tiny_tokenizer, bm25_server):
    import json

    from train.data_prep import main as prep
    from train.evaluate import main
    from train.evaluation.results import load_rows

    class NeverCalled:
        tokenizer = tiny_tokenizer

        async def generate(self, *a, **k):
            raise AssertionError("no row may be evaluated onto another data set's results")

    prep(["--out", str(tmp_path / "d"), "--local", str(qa_path), "--holdout", "2"])
    row = load_rows(str(tmp_path / "d" / "test.parquet"), None, None)[0]
    out = tmp_path / "eval.jsonl"
    out.write_text(json.dumps({**row, "question": "a different question?", "answer": "x", "em": 0.0}) + "\n")
    assert main(["--model", "m", "--data", str(tmp_path / "d" / "test.parquet"), "--out", str(out),
                 "--retriever-url", bm25_server.url], generator=NeverCalled()) == 2
    assert "holds results for other data: 1 rows" in capsys.readouterr().err

    # every row done, with no record of what made them: taken as this run's (nothing asked), the record written
    rows = load_rows(str(tmp_path / "d" / "test.parquet"), None, None)
    out.write_text("".join(json.dumps({**r, "answer": "x", "em": 0.0, "f1": 0.0}) + "\n" for r in rows))
    assert main(["--model", "m", "--data", str(tmp_path / "d" / "test.parquet"), "--out", str(out),
                 "--retriever-url", bm25_server.url], generator=NeverCalled()) == 0
    side = tmp_path / "eval.jsonl.settings.json"
    assert json.loads(side.read_text())["max_turns"] == 4
    # the same questions, asked before with a smaller search budget: refused, naming the setting
    side.write_text(json.dumps({**json.loads(side.read_text()), "max_turns": 1}))
    assert main(["--model", "m", "--data", str(tmp_path / "d" / "test.parquet"), "--out", str(out),
                 "--retriever-url", bm25_server.url], generator=NeverCalled()) == 2
    err = capsys.readouterr().err
    assert f"eval.jsonl holds {len(rows)} rows made with other settings" in err, err
    assert "max_turns 1 there, 4 now" in err, err


def test_fault_handling_flags_and_keys(capsys, tmp_path):
    """The values added for issues 20 and 21 are checked, each with its name in the message."""
    import subprocess
    import sys
    from pathlib import Path

    from train.evaluate import main as evaluate
    from train.geometry import main as geometry
    from train.search_r1.config import SearchConfig

    fails(evaluate, ["--model", "m", "--data", "x", "--max-failure-rate", "1.5"], capsys, "--max-failure-rate")
    with pytest.raises(ValueError, match="search_r1.outage_wait_s must be >= 0"):
        SearchConfig.from_config({"outage_wait_s": -1})
    with pytest.raises(ValueError, match="search_r1.outage_redos must be >= 0"):
        SearchConfig.from_config({"outage_redos": -1})
    assert geometry(["--ranks", "2", "--agent-workers", "0"]) == 2 and "agent workers" in capsys.readouterr().err
    root = Path(__file__).resolve().parent.parent
    r = subprocess.run([sys.executable, "-m", "train.checkpoints"], cwd=root, capture_output=True, text=True)
    assert r.returncode == 2 and "usage: python -m train.checkpoints" in r.stderr
    r = subprocess.run([sys.executable, "-m", "train.checkpoints", str(tmp_path / "global_step_3")], cwd=root,
                       capture_output=True, text=True)
    assert r.returncode == 1 and "does not exist" in r.stdout


def test_a_checkpoint_sweep_refuses_steps_evaluated_with_other_settings(tmp_path, qa_path, capsys):
    """The sweep's steps.jsonl counts a step as done; a rerun with another search budget would have mixed its
    per-step EMs into one best step. It is refused before any merge, naming the setting."""
    import json

    from train.data_prep import main as prep
    from train.evaluate import main

    class NeverCalled:
        async def generate(self, *a, **k):
            raise AssertionError("nothing may be asked")

    prep(["--out", str(tmp_path / "d"), "--local", str(qa_path), "--holdout", "2"])
    root, out = tmp_path / "ckpt", tmp_path / "sweep"
    (root / "global_step_5").mkdir(parents=True)
    out.mkdir()
    args = ["--checkpoints", str(root), "--data", str(tmp_path / "d" / "test.parquet"), "--out", str(out),
            "--retriever-url", "http://127.0.0.1:9"]
    from train.evaluation.options import EvalOptions

    settings = {k: v for k, v in EvalOptions.parse(args).ask.answer_settings().items()
                if k not in ("weights", "model_path")}
    (out / "steps.jsonl").write_text(json.dumps({"step": 5, "n": 2, "em": 0.5, "sources": {}, "asked": 2,
                                                 "data": "x", "settings": {**settings, "max_turns": 1}}) + "\n")
    assert main(args, generator=NeverCalled()) == 2
    err = capsys.readouterr().err
    assert "steps.jsonl: step 5 was evaluated with other settings (max_turns 1 there, 4 now); pass another --out" in err
