"""The evaluator's inputs: a training checkpoint (verl's global_step_N, FSDP shards) given
as the model is merged once into global_step_N/hf and evaluated; a paper row against a retriever that does
not serve wiki-18 is refused before any question, naming --expect-corpus."""

import json
import shutil

import pytest

from train import evaluate
from train.errors import CheckpointError
from train.evaluation import checkpoint_input


@pytest.fixture
def step_dir(tmp_path, tiny_model_dir):
    """A one-rank verl checkpoint of the tiny model, as the FSDP engine saves it: actor/ with the model shard,
    fsdp_config.json and huggingface/ (config and tokenizer), and data.pt."""
    import torch
    from transformers import AutoModelForCausalLM

    step = tmp_path / "run" / "checkpoints" / "global_step_3"
    hf = step / "actor" / "huggingface"
    hf.mkdir(parents=True)
    for f in tiny_model_dir.iterdir():
        if f.is_file() and not f.name.endswith((".safetensors", ".bin")):
            shutil.copy(f, hf / f.name)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    torch.save(model.state_dict(), step / "actor" / "model_world_size_1_rank_0.pt")
    (step / "actor" / "fsdp_config.json").write_text(json.dumps({"FSDP_version": 2, "world_size": 1}))
    torch.save({}, step / "data.pt")
    return step


def test_a_checkpoint_is_merged_once_and_evaluated_as_hf(step_dir, tiny_model_dir):
    import torch
    from transformers import AutoModelForCausalLM

    said = []
    assert checkpoint_input.step_folder(str(tiny_model_dir)) is None  # an HF folder is left as it is
    assert checkpoint_input.model_folder(str(tiny_model_dir), log=said.append) == str(tiny_model_dir) and not said
    for given in (step_dir / "actor", step_dir / "actor" / "huggingface"):
        assert checkpoint_input.step_folder(str(given)) == step_dir
    assert checkpoint_input.results_name(str(step_dir)) == "checkpoints-global_step_3"

    merged = checkpoint_input.model_folder(str(step_dir), log=said.append)
    assert merged == str(step_dir / "hf") and (step_dir / "hf" / "config.json").is_file()
    assert "is a verl checkpoint (FSDP shards" in said[0] and f"merging it once into {step_dir / 'hf'}" in said[0]
    assert not list(step_dir.glob(".hf-merging-*"))  # the temporary folder is gone
    a, b = (AutoModelForCausalLM.from_pretrained(p) for p in (tiny_model_dir, merged))
    for k, v in a.state_dict().items():  # the same weights (the merger may store them in bf16)
        assert torch.allclose(v.float(), b.state_dict()[k].float(), rtol=1e-2, atol=1e-3), k
    said.clear()
    assert checkpoint_input.model_folder(str(step_dir / "actor"), log=said.append) == merged
    assert said == [f"{step_dir / 'actor'} is a verl checkpoint: evaluating its merged model {merged}"]


def test_an_incomplete_checkpoint_is_refused_with_the_reason(step_dir, tmp_path, capsys):
    (step_dir / "data.pt").unlink()  # a save cut short
    with pytest.raises(CheckpointError, match="is a verl checkpoint that is not complete .*data.pt is missing"):
        checkpoint_input.model_folder(str(step_dir))
    assert evaluate.main(["--model", str(step_dir), "--data", str(tmp_path / "none.parquet")]) == 2


def test_a_failed_merge_names_the_command(step_dir, monkeypatch):
    from train.evaluation import checkpoint_sweep

    def broken(step, target):
        raise RuntimeError("merging failed (rc 1)")

    monkeypatch.setattr(checkpoint_sweep, "merge", broken)
    with pytest.raises(CheckpointError) as e:
        checkpoint_input.model_folder(str(step_dir))
    assert (f"python -m verl.model_merger merge --backend fsdp --local_dir {step_dir / 'actor'} "
            f"--target_dir {step_dir / 'hf'}") in str(e.value)
    assert not (step_dir / "hf").exists() and not list(step_dir.glob(".hf-merging-*"))


def test_a_paper_row_against_the_sample_is_refused(bm25_server, tmp_path, capsys):
    base = ["--model", "m", "--data", str(tmp_path / "none.parquet"), "--retriever-url", bm25_server.url]
    assert evaluate.main([*base, "--paper-row", "3B-Ins GRPO+LLDS"]) == 2
    err = capsys.readouterr().err
    assert "--paper-row '3B-Ins GRPO+LLDS' (the paper's corpus: wiki18): the retriever at" in err, err
    assert "5,148 passages" in err and "or set --expect-corpus any to use this one deliberately" in err
    # the override, a matching expectation, a method without search: past the check (to the missing data file)
    for extra in (["--paper-row", "3B-Ins GRPO+LLDS", "--expect-corpus", "any"],
                  ["--paper-row", "3B-Ins GRPO+LLDS", "--expect-corpus", "sample"],
                  ["--paper-row", "3B-Ins Direct", "--method", "direct"], []):
        assert evaluate.main([*base, *extra]) == 2
        err = capsys.readouterr().err
        assert "the retriever at" not in err and "none.parquet" in err, (extra, err)
    assert evaluate.main([*base, "--expect-corpus", "wiki18"]) == 2  # asked for without a paper row
    assert "--expect-corpus wiki18: the retriever at" in capsys.readouterr().err
