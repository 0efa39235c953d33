"""verl's own vLLM rollout replica on vLLM's CPU build: the production rollout engine, not a stand-in.

Runs only where vLLM is importable: `make test-vllm` builds `.venv-vllm` (.ci/install_vllm_env.sh) and
runs this file there under a hard timeout (a vLLM engine that dies can hang the trainer); in `.venv`
it is skipped.

The training run is the real SmolLM2-135M-Instruct through its preset, in the GPU presets' shape on CPU:
verl's trainer, 2 ranks with the reference model and the KL loss, LLDS, the search_r1 agent loop against
a live retriever, with ``rollout.name=vllm`` (async server mode, weight sync from the FSDP actor every
step), then a checkpoint and a resume. verl starts vLLM with ``load_format: dummy`` (random weights), so
only the per-step weight sync (tied embeddings included) makes vLLM's rollout log-probs match the actor's:
the test fails on a gap. infer.py and the evaluator with the vLLM backend run a tiny Qwen2.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # make test-fast leaves these out

vllm = pytest.importorskip("vllm")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

#: What a CPU run of the vLLM rollout needs beyond cpu_smoke (see docs/cpu.md, "verl's vLLM rollout on CPU").
VLLM_CPU = ["actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.mode=async",
            "actor_rollout_ref.rollout.dtype=float32", "actor_rollout_ref.rollout.enforce_eager=true",
            "+actor_rollout_ref.rollout.enable_sleep_mode=false"]
#: Synced runs measured 6e-8 to 1.1e-7 per step (both sides fp32); 0.0010-0.0014 while the actor still
#: computed in verl's default bf16; 3.3-3.4 with the sync disabled
#: (bench/RESULTS.md, "verl's vLLM rollout on vLLM's CPU build").
MAX_LOG_PPL_GAP = 1e-4


@pytest.fixture(scope="module")
def sharp_model(tmp_path_factory, corpus_path) -> Path:
    """The tiny Qwen2 with its (tied) embeddings scaled x8 (token entropy ~1 nat instead of ~6.9: it stops
    and answers within a few tokens), for infer.py and the evaluator on vLLM. head_dim 32 (vLLM's CPU
    attention needs >= 32)."""
    import torch
    from transformers import AutoModelForCausalLM

    from train.toy.tiny_model import build_tiny_model

    path = build_tiny_model(tmp_path_factory.mktemp("sharp"), corpus_path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(8.0)
    model.save_pretrained(path)
    return path


def _env():
    return {**os.environ, "VERL_PLATFORM": "cpu", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "WANDB_MODE": "offline", "TOKENIZERS_PARALLELISM": "false", "RAY_DEDUP_LOGS": "0",
            "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}


def run_main(args, log: Path, timeout=600, preset="cpu_smoke"):
    with open(log, "w") as f:
        try:
            r = subprocess.run([sys.executable, "-m", "train.main", "--config-name", preset, *args], cwd=ROOT,
                               env=_env(), stdout=f, stderr=subprocess.STDOUT, timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"train.main with the vLLM rollout did not finish in {timeout} s (a dead engine hangs "
                        f"the trainer): {log.read_text()[-4000:]}")
    assert r.returncode == 0, log.read_text()[-6000:]


@pytest.fixture(scope="module")
def vllm_trained(tmp_path_factory, smollm2_dir, bm25_server, qa_path):
    """The real SmolLM2 (a Llama whose output layer is its input embedding matrix) by its name through its
    preset, shrunk to short steps (tests/models/test_smollm2_on_cpu.py: JOURNEY): 2 steps, then a resumed
    third. vLLM serves the synced weights: its log-probs equal the actor's after every update."""
    from tests.models.test_smollm2_on_cpu import PRESET, journey_args
    from train.data_prep import main as prep

    work = tmp_path_factory.mktemp("vllm_train")
    prep(["--out", str(work / "data"), "--local", str(qa_path), "--holdout", "5"])
    common = [*journey_args(work / "data", work / "ckpt", bm25_server.url), *VLLM_CPU]
    run_main([*common, "trainer.total_training_steps=2", "trainer.save_freq=2"], work / "run1.log", preset=PRESET)
    run_main([*common, "trainer.total_training_steps=3", "trainer.save_freq=3", "trainer.resume_mode=auto"],
             work / "run2.log", preset=PRESET)
    return work


def test_vllm_rollout_trains_syncs_weights_and_resumes(vllm_trained):
    from step_metrics import parse

    first, second = parse(vllm_trained / "run1.log"), parse(vllm_trained / "run2.log")
    assert sorted(first) == [1, 2] and sorted(second) == [3]
    for n, m in {**first, **second}.items():
        for key in ("actor/kl_loss", "actor/llds/penalty", "actor/llds/logp_pos_a1", "search_r1/gen_turns",
                    "rollout_corr/log_ppl_abs_diff", "timing_s/update_weights"):
            assert key in m, (n, key)
        # vLLM's rollout log-probs against the actor's recomputed ones: only the synced weights match
        assert m["rollout_corr/log_ppl_abs_diff"] < MAX_LOG_PPL_GAP, (n, m["rollout_corr/log_ppl_abs_diff"])
    assert "Sleep mode is not supported" not in (vllm_trained / "run1.log").read_text()
    assert (vllm_trained / "ckpt" / "global_step_3" / "actor").is_dir()


def test_infer_and_evaluate_with_the_vllm_backend(tmp_path, sharp_model, bm25_server, qa_path):
    """infer.py --backend vllm and train.evaluate --backend vllm --engines 2 on vLLM's CPU build."""
    from train.data_prep import main as prep

    prep(["--out", str(tmp_path / "data"), "--local", str(qa_path), "--holdout", "3"])
    env = {**_env(), "VLLM_CPU_KVCACHE_SPACE": "1"}
    r = subprocess.run([sys.executable, "infer.py", "Who illustrated American Splendor?", "--model", str(sharp_model),
                        "--backend", "vllm", "--retriever-url", bm25_server.url, "--max-new-tokens", "16",
                        "--max-turns", "1"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
    assert "Answer:" in r.stdout
    out = tmp_path / "eval.jsonl"
    # two vLLM engines, each in its own process (train/evaluation/pool.py), one results file
    r = subprocess.run([sys.executable, "-m", "train.evaluate", "--model", str(sharp_model), "--backend", "vllm",
                        "--data", str(tmp_path / "data" / "test.parquet"), "--retriever-url", bm25_server.url,
                        "--max-new-tokens", "16", "--max-turns", "1", "--out", str(out), "--engines", "2"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stderr[-4000:]
    assert "2 engines ready" in r.stderr and "on 2 engines:" in r.stdout
    uids = [line.split('"uid": ')[1].split(",")[0] for line in out.read_text().splitlines()]
    assert len(uids) == 6 == len(set(uids)) and "average (macro)" in r.stdout

