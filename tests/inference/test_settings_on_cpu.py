"""One settings object for asking (train/inference/settings.py): a flag is a field, the settings travel
whole to the engine workers of the evaluator's pool, and the checkpoint sweep changes only the model."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest

from train.inference.settings import AskSettings

#: fields a test on CPU cannot set to another value (hf is the only backend here; tensor parallelism needs vLLM)
CPU_ONLY_DEFAULT = {"backend", "tensor_parallel_size"}


def flags_of(ap) -> set[str]:
    return {a.dest for a in ap._actions if a.option_strings and a.dest != "help"}


def test_every_field_is_a_flag_of_infer_and_every_asking_flag_a_field():
    from train import infer

    fields = {f.name for f in dataclasses.fields(AskSettings)}
    flags = flags_of(infer.build_parser())
    assert fields <= flags, f"settings without a flag in infer.py: {sorted(fields - flags)}"
    assert flags - fields == {"file", "out"}, f"infer.py flags that are not settings: {sorted(flags - fields)}"


def test_the_evaluator_offers_every_field_but_sampling():
    from train.evaluation.options import EvalOptions, build_parser

    fields = {f.name for f in dataclasses.fields(AskSettings)}
    flags = flags_of(build_parser())
    assert fields - flags == {"temperature", "seed"}  # the evaluation is greedy
    own = {f.name for f in dataclasses.fields(EvalOptions)} - {"ask"}
    assert flags - fields == own, "every evaluator flag is a field of EvalOptions or AskSettings"


def non_default(settings: AskSettings, model: str) -> AskSettings:
    """Every field at a value other than its default (a field added later is covered by itself)."""
    changes = {}
    for f in dataclasses.fields(AskSettings):
        d = getattr(settings, f.name)
        if f.name in CPU_ONLY_DEFAULT:
            continue
        if f.name == "model":
            changes[f.name] = model
        elif f.name == "method":
            changes[f.name] = "direct"  # asks no retriever, so the URL, index and corpus below are only carried
        elif f.name == "device":
            changes[f.name] = "cpu"
        elif f.name == "dtype":
            changes[f.name] = "bfloat16"  # the hf engine loads the tiny model in bf16 on the CPU
        elif isinstance(d, bool):
            changes[f.name] = not d
        elif isinstance(d, int) or d is None and "num" in f.name:
            changes[f.name] = (d or 0) + 3
        elif isinstance(d, float):
            changes[f.name] = 0.5 if d != 0.5 else 0.25
        else:
            changes[f.name] = f"/nowhere/{f.name}" if f.name in ("index", "corpus") else f"http://127.0.0.2:9/{f.name}"
    out = settings.replace(**changes)
    same = [f.name for f in dataclasses.fields(AskSettings)
            if getattr(out, f.name) == getattr(settings, f.name) and f.name not in CPU_ONLY_DEFAULT]
    assert not same, f"non_default() does not know how to change {same}"
    return out


def test_round_trip_and_replace():
    s = AskSettings(backend="vllm", tensor_parallel_size=2, max_num_seqs=7, model="m")
    assert AskSettings.from_json(s.to_json()) == s
    assert s.replace(model="other") == dataclasses.replace(s, model="other") and s.model == "m"
    with pytest.raises(Exception, match="unknown fields"):
        AskSettings.from_json(json.dumps({**json.loads(s.to_json()), "nope": 1}))
    assert "--tensor-parallel-size needs --backend vllm" in AskSettings(tensor_parallel_size=2).problems()
    assert s.vllm_engine() == {"gpu_memory_utilization": 0.85, "max_num_seqs": 7, "max_num_batched_tokens": 16384}
    assert AskSettings(concurrency=64).vllm_engine()["max_num_seqs"] == 64


def test_answer_settings_name_the_weights_and_what_decides_an_answer(tmp_path):
    import shutil

    from train.models.registry import weights_id

    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    (a / "model.safetensors").write_bytes(bytes(range(256)) * 4096)  # 1 MiB
    shutil.copytree(a, tmp_path / "copy")
    b.mkdir()
    (b / "model.safetensors").write_bytes(bytes(range(256)) * 2048 + bytes(reversed(range(256))) * 2048)
    assert weights_id(str(a)) == weights_id(str(tmp_path / "copy")) != weights_id(str(b))
    assert weights_id("Qwen/Qwen2.5-3B") == "name:Qwen/Qwen2.5-3B" and weights_id(None) == "name:None"
    s = AskSettings(model=str(a), max_turns=2)
    made = s.answer_settings()
    assert made["weights"] == weights_id(str(a)) and made["model_path"] == str(a) and made["max_turns"] == 2
    assert "seed" not in made and s.replace(temperature=1.0, seed=3).answer_settings()["seed"] == 3
    # where the retriever is, the device and the engine's sizes do not decide an answer: a resume may change them
    assert s.replace(retriever_url="http://127.0.0.1:9", concurrency=7, device="cpu",
                     max_num_seqs=3).answer_settings() == made


def test_a_bad_value_names_its_flag(capsys):
    from tests.conftest import refuses
    from train import infer

    refuses(infer.main, ["q", "--topk", "0"], capsys, "--topk must be >= 1", code=2)
    refuses(infer.main, ["q", "--gpu-memory-utilization", "1.5"], capsys, "--gpu-memory-utilization must be in", code=2)
    refuses(infer.main, ["q", "--dtype", "fp8"], capsys,
            "--dtype must be one of auto, bfloat16, float16, float32, got 'fp8'", code=2)


def test_every_setting_reaches_each_worker_of_a_two_engine_pool(tiny_model_dir, tmp_path):
    """The pool hands the settings whole to ``python -m train.evaluation.engine_worker``; each worker says
    which it parsed, and both equal what was sent, for every field at a non-default value."""
    from train.evaluation.pool import EnginePool

    settings = non_default(AskSettings(), str(tiny_model_dir))

    async def go():
        pool = EnginePool(settings, [None, None], tmp_path / "o")
        await pool.start()
        try:
            answers = await asyncio.gather(*(pool.ask(f"What is the capital of X{i}?") for i in range(4)))
        finally:
            await pool.close()
        return pool, answers

    pool, answers = asyncio.run(go())
    sent = json.loads(settings.to_json())
    assert pool.worker_settings == [sent, sent]
    assert len(answers) == 4 and all(a.stop_reason in ("answer", "eos", "length") for a in answers)
    assert all(a.generated_tokens <= settings.max_new_tokens for a in answers)


def test_a_worker_refuses_settings_it_cannot_read(tmp_path):
    import subprocess
    import sys

    from tests.conftest import ROOT

    r = subprocess.run([sys.executable, "-m", "train.evaluation.engine_worker", "--settings", '{"topk": 0}'],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "error: --settings: --topk must be >= 1" in r.stderr, r.stderr
    r = subprocess.run([sys.executable, "-m", "train.evaluation.engine_worker", "--settings", '{"extra": 1}'],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "unknown fields ['extra']" in r.stderr, r.stderr


def test_dtype_reaches_the_hf_engine(tiny_model_dir):
    """``--dtype``: auto keeps fp32 on the CPU; a named type is the one the model is loaded in."""
    import torch

    from train.inference.backends import make_generator

    for dtype, want in (("auto", torch.float32), ("bfloat16", torch.bfloat16)):
        gen = make_generator(AskSettings(model=str(tiny_model_dir), device="cpu", dtype=dtype))
        assert {p.dtype for p in gen.model.parameters()} == {want}, dtype
