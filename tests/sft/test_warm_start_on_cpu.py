"""The warm start (train/sft/, python -m train.warm_start): which questions become trajectories, what carries
loss, that the supervised steps learn, and the command on a real split and a real BM25 index."""

import json
from pathlib import Path

import pytest

from tests.conftest import refuses, run_command
from train.search_r1 import prompts, protocol
from train.sft.supervised import sft_protocol, tokenize_trajectories
from train.sft.trajectories import retrieved_trajectories, supported_answer

ROOT = Path(__file__).resolve().parents[2]


def test_a_gold_answer_counts_only_as_whole_words_after_normalization():
    passages = ["\"Metro\"\nThe Parisian metro opened in 1900.", "\"France\"\nIts capital is PARIS, the largest city."]
    assert supported_answer(["Lyon", "paris"], passages) == "paris"  # the first gold found, case and commas aside
    assert supported_answer(["Paris"], passages[:1]) is None  # "Parisian" is not "Paris"
    assert supported_answer(["The Metro"], passages) == "The Metro"  # articles dropped on both sides
    assert supported_answer(["", "  "], passages) is None


def test_trajectories_search_the_question_and_answer_from_what_came_back(tiny_tokenizer):
    passages = {"who wrote hamlet?": ["\"Hamlet\"\nHamlet is a tragedy by William Shakespeare. " + "word " * 200,
                                      "\"Globe\"\nA theatre in London."],
                "capital of peru?": ["\"Peru\"\nA country in South America."]}
    asked = []

    def search(queries):
        asked.append(list(queries))
        return [passages[q] for q in queries]

    count = lambda s: len(tiny_tokenizer.encode(s, add_special_tokens=False))  # noqa: E731
    rows = [(" who wrote hamlet? ", ["William Shakespeare"]), ("capital of peru?", ["Lima"])]
    out, counts = retrieved_trajectories(rows, search, count, obs_tokens=60, batch=1)
    assert counts == {"questions": 2, "kept": 1, "unsupported": 1}  # Lima is in no passage: no trajectory
    assert asked == [["who wrote hamlet?"], ["capital of peru?"]]  # the question itself, one search each
    (question, parts), = out
    assert question == "who wrote hamlet?" and [trained for _, trained in parts] == [True, False, True]
    (search_turn, _), (observation, _), (answer_turn, _) = parts
    assert protocol.parse_turn(search_turn) == protocol.Action("search", "who wrote hamlet?")
    assert protocol.parse_turn(answer_turn) == protocol.Action("answer", "William Shakespeare")
    # the observation is the agent loop's, cut to whole passages within its token budget
    assert observation == protocol.format_observation(passages["who wrote hamlet?"], max_tokens=60,
                                                      count_tokens=count)
    assert count(observation) <= 60 and "Globe" not in observation
    assert protocol.is_valid_sequence(search_turn + observation + answer_turn)


def test_only_the_policy_turns_and_the_closing_eos_carry_loss(tiny_tokenizer):
    tok = tiny_tokenizer
    parts = [("<think> x </think><search> q </search>", True),
             (protocol.format_observation(["\"T\"\nsome passage"]), False), ("<answer> a </answer>", True)]
    [(ids, labels)] = tokenize_trajectories(tok, [("what is q?", parts)], max_tokens=10_000)
    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    prompt = enc(prompts.render_prompt(tok, "what is q?"))
    search, obs, answer = (enc(t) for t, _ in parts)
    assert ids == prompt + search + obs + answer + [tok.eos_token_id]
    assert labels == [-100] * len(prompt) + search + [-100] * len(obs) + answer + [tok.eos_token_id]
    [(cut, cut_labels)] = tokenize_trajectories(tok, [("what is q?", parts)], max_tokens=12)
    assert cut == ids[-12:] and cut_labels == labels[-12:]  # kept from the end: the answer and EOS survive


def test_supervised_steps_learn_the_turns_and_leave_the_source_untouched(tiny_model_dir, tmp_path):
    import torch

    def trajectories(count_tokens):
        return [(f"question {i}?", [(protocol.search_turn(f"question {i}", "I search."), True),
                                    (protocol.format_observation([f"\"Doc {i}\"\nanswer {i}"]), False),
                                    (protocol.answer_turn(f"answer {i}", "Found."), True)]) for i in range(8)]

    before = (tiny_model_dir / "model.safetensors").read_bytes()
    stats = sft_protocol(tiny_model_dir, trajectories, steps=100, batch=4, lr=3e-3, out_dir=tmp_path / "sft")
    assert (tiny_model_dir / "model.safetensors").read_bytes() == before
    assert stats["examples"] == 8 and stats["epochs"] == 50.0 and len(stats["losses"]) == 100
    assert stats["last_loss"] < 0.2 * stats["first_loss"], stats["losses"]
    from transformers import AutoModelForCausalLM, AutoTokenizer

    def first_turn(folder):
        tok = AutoTokenizer.from_pretrained(folder)
        model = AutoModelForCausalLM.from_pretrained(folder)
        ids = tok.encode(prompts.render_prompt(tok, "question 3?"), add_special_tokens=False)
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), max_new_tokens=64, do_sample=False, pad_token_id=tok.pad_token_id)
        return protocol.truncate_at_stop(tok.decode(out[0, len(ids):]))

    # greedy, the warm-started model writes a search turn where the model it started from did not
    assert protocol.parse_turn(first_turn(tiny_model_dir)).kind == "invalid"
    taught = first_turn(tmp_path / "sft")
    assert protocol.parse_turn(taught).kind == "search" and taught.startswith("<think> I search. </think>"), taught


def test_the_command_warm_starts_from_a_training_split(tiny_model_dir, bm25_index_dir, recorded_split, tmp_path,
                                                       capsys):
    from train.warm_start import main

    out = tmp_path / "sft"
    rc, text = run_command(main, ["--model", str(tiny_model_dir), "--data", str(recorded_split / "train.parquet"),
                                  "--index", str(bm25_index_dir), "--out", str(out), "--steps", "4", "--batch", "4",
                                  "--lr", "1e-3", "--max-tokens", "256", "--obs-tokens", "120"], capsys)
    assert rc == 0, text
    record = json.loads((out / "warm_start.json").read_text())
    assert record["questions"] == 500 and record["kept"] + record["unsupported"] == 500
    assert 100 < record["kept"] < 500, record  # BM25 finds the gold passage of many questions, not of all
    assert f"{record['kept']} of 500 training questions" in text and "warm start: loss" in text
    assert (out / "model.safetensors").is_file()
    for name in ("tokenizer.json", "tokenizer_config.json"):  # the model's own tokenizer, not one saved again
        assert (out / name).read_bytes() == (tiny_model_dir / name).read_bytes(), name


def test_the_command_refuses_what_is_not_a_training_split(tiny_model_dir, bm25_index_dir, recorded_split, tmp_path,
                                                          capsys):
    from train.warm_start import main

    base = ["--model", str(tiny_model_dir), "--index", str(bm25_index_dir), "--out", str(tmp_path / "o")]
    refuses(main, [*base, "--data", str(recorded_split / "test.parquet")], capsys,
            r"row 0 is from split 'test'; a warm start reads a training split only")
    refuses(main, [*base, "--data", str(tmp_path / "none.parquet")], capsys, r"none.parquet: no such file")
    refuses(main, ["--model", str(tmp_path / "no-model"), "--index", str(bm25_index_dir), "--out", str(tmp_path),
                   "--data", str(recorded_split / "train.parquet")], capsys, r"--model .*no-model: no such folder")
    refuses(main, [*base, "--data", str(recorded_split / "train.parquet"), "--steps", "0"], capsys,
            r"--steps must be >= 1")
    assert not (tmp_path / "o").exists()


def test_the_device_is_the_gpu_when_torch_sees_one(monkeypatch):
    import torch

    from train.errors import UserError
    from train.sft.supervised import pick_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert pick_device(None) == pick_device("auto") == pick_device("cpu") == "cpu"
    with pytest.raises(UserError, match="--device cuda: torch sees no GPU"):
        pick_device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert pick_device(None) == pick_device("auto") == "cuda"
    assert pick_device("cuda:1") == "cuda:1" and pick_device("cpu") == "cpu"  # asked for: kept


def test_the_command_hands_the_gpu_to_the_supervised_steps(tiny_model_dir, bm25_index_dir, recorded_split, tmp_path,
                                                           capsys, monkeypatch):
    """Where torch sees a GPU, ``python -m train.warm_start`` trains there (the steps on a GPU:
    tests/sft/test_warm_start_gpu.py); ``--device cpu`` keeps the CPU."""
    import torch

    from train.sft import supervised
    from train.warm_start import main

    seen = {}

    def steps(model, trajectories, **kw):
        seen.update(kw)
        return {"first_loss": 1.0, "last_loss": 0.5, "epochs": 1.0, "seconds": 0.0}

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(supervised, "sft_protocol", steps)
    out = tmp_path / "sft"
    out.mkdir()
    rc, text = run_command(main, ["--model", str(tiny_model_dir), "--data", str(recorded_split / "train.parquet"),
                                  "--index", str(bm25_index_dir), "--out", str(out), "--steps", "1"], capsys)
    assert rc == 0, text
    assert seen["device"] == "cuda" and "s on cuda); model in" in text
    assert json.loads((out / "warm_start.json").read_text())["device"] == "cuda"
    rc, text = run_command(main, ["--model", str(tiny_model_dir), "--data", str(recorded_split / "train.parquet"),
                                  "--index", str(bm25_index_dir), "--out", str(out), "--device", "cpu"], capsys)
    assert rc == 0 and seen["device"] == "cpu", text
