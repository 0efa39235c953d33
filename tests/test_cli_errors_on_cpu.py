"""Every command-line entry point names a bad flag value and exits non-zero before doing work."""

import pytest

from tests.conftest import free_port


def fails(main, argv, capsys, message):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code not in (0, None)
    captured = capsys.readouterr()
    assert message in captured.err + captured.out + str(e.value.code)


def test_retrieval_build(capsys, tmp_path, corpus_path):
    from retrieval.build import main

    fails(main, ["--corpus", str(tmp_path / "none.jsonl"), "--out", str(tmp_path)], capsys, "file not found")
    fails(main, ["--corpus", str(corpus_path), "--out", str(tmp_path), "--batch-size", "0"], capsys, "--batch-size")
    fails(main, ["--corpus", str(corpus_path), "--out", str(tmp_path), "--kind", "sparse"], capsys, "invalid choice")


def test_retrieval_server(capsys, tmp_path):
    from retrieval.server import main

    fails(main, ["--index", str(tmp_path), "--max-batch", "0"], capsys, "--max-batch")
    fails(main, ["--index", str(tmp_path), "--topk", "0"], capsys, "--topk")


def test_retrieval_client_health(capsys):
    from retrieval.client import main

    fails(main, ["127.0.0.1:1", "--wait", "-1"], capsys, "--wait")
    assert main([f"127.0.0.1:{free_port()}"]) == 1


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
