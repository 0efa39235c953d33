"""Bundled FlashRAG jsonl -> verl parquet -> verl's RLHFDataset with the fixture tokenizer."""

import json

import pandas as pd
import pytest

from train.data_prep import main
from train.errors import DataError
from train.search_r1 import prompts, protocol
from train.search_r1.dataset import load_local


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, qa_path):
    out = tmp_path_factory.mktemp("prep")
    main(["--out", str(out), "--local", str(qa_path), "--holdout", "10"])
    return out


def test_rows_and_uids(prepared):
    train = pd.read_parquet(prepared / "train.parquet")
    test = pd.read_parquet(prepared / "test.parquet")
    assert len(test) == 20 and set(test.data_source) == {"hotpotqa", "nq"}
    assert len(train) + len(test) == 700
    uids = [e["uid"] for e in train.extra_info] + [e["uid"] for e in test.extra_info]
    assert len(set(uids)) == len(uids)  # unique across sources and splits
    # the same per-source index appears in both sources, the uid differs
    assert {(e["index"]) for e in train.extra_info if e["uid"].startswith("train-nq")} & \
           {(e["index"]) for e in train.extra_info if e["uid"].startswith("train-hotpotqa")}
    row = train.iloc[0]
    assert row.agent_name == "search_r1" and row.ability == "fact-reasoning"
    assert list(row.prompt) == prompts.make_messages(row.extra_info["question"])
    assert row.reward_model["style"] == "rule" and len(row.reward_model["ground_truth"]["target"]) >= 1
    assert {e["split"] for e in test.extra_info} == {"test"}


def test_loads_through_verl_rlhf_dataset(prepared, tiny_tokenizer):
    from hydra import compose, initialize_config_module
    from verl.utils.dataset.rl_dataset import RLHFDataset

    with initialize_config_module("verl.trainer.config", version_base=None):
        cfg = compose("ppo_trainer", overrides=["data.max_prompt_length=4096"])
    ds = RLHFDataset(str(prepared / "test.parquet"), tiny_tokenizer, cfg.data)
    item = ds[0]
    assert item["raw_prompt"][0]["role"] == "user" and "Question:" in item["raw_prompt"][0]["content"]
    assert item["agent_name"] == "search_r1" and item["data_source"] in ("nq", "hotpotqa")
    assert item["reward_model"]["ground_truth"]["target"]


def test_bad_rows_named_with_file_and_line(tmp_path, capsys):
    from tests.conftest import refuses

    good = {"id": "1", "question": "q?", "golden_answers": ["a"], "dataset": "nq"}
    for bad, msg in [({"id": "2", "golden_answers": ["a"]}, "no question"),
                     ({"id": "2", "question": "q2", "golden_answers": []}, "no gold answer"),
                     ({"id": "2", "question": "  ", "golden_answers": ["a"]}, "no question")]:
        f = tmp_path / "bad.jsonl"
        f.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
        with pytest.raises(DataError, match=rf"bad.jsonl:2: .*{msg}"):
            load_local([str(f)])
    f.write_text(json.dumps(good) + "\n{oops\n")
    with pytest.raises(DataError, match=r"bad.jsonl:2: not valid JSON"):
        load_local([str(f)])
    refuses(main, ["--out", str(tmp_path / "o"), "--local", str(tmp_path / "nope.jsonl")], capsys, "file not found",
            code=2)


def test_dedupe_is_counted(tmp_path, capsys):
    f = tmp_path / "dup.jsonl"
    rows = [{"id": str(i), "question": "Same question?" if i < 3 else f"q{i}", "golden_answers": ["a"],
             "dataset": "nq"} for i in range(6)]
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    main(["--out", str(tmp_path / "o"), "--local", str(f)])
    out = capsys.readouterr().out
    assert "2 duplicate questions removed" in out and "train.parquet: 4 rows" in out


def test_the_recorded_split_of_the_bundled_questions_is_what_data_prep_makes(tmp_path, qa_path):
    """data/split.json records which bundled question is a test question (the SmolLM2 runs train on the
    rest, and report EM on these): the command it names makes exactly that split, and no question (by id
    or by its normalized text) is on both sides."""
    recorded = json.loads((qa_path.parent / "split.json").read_text())
    argv = recorded["command"].split()[3:]
    argv[argv.index("--out") + 1] = str(tmp_path)
    main(argv)
    made = json.loads((tmp_path / "split.json").read_text())
    assert (made["test"], made["train"]) == (recorded["test"], recorded["train"])
    assert len(recorded["test"]) == 200 and not set(recorded["test"]) & set(recorded["train"])
    test = pd.read_parquet(tmp_path / "test.parquet")
    train = pd.read_parquet(tmp_path / "train.parquet")
    norm = lambda df: {protocol.normalize_answer(e["question"]) for e in df["extra_info"]}  # noqa: E731
    assert not norm(test) & norm(train)
    assert dict(test["data_source"].value_counts()) == {"nq": 100, "hotpotqa": 100}
