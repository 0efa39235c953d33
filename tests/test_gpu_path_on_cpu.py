"""What a GPU user's first run hits, shown on CPU where CPU can show it (issue: GPU first run).

Attention backend, one FAISS per install, launchers without .venv, wandb without an account,
per-query retriever errors and the failure-rate abort, multi-node paths, the Lucene folder, the
driver preflight, end-of-turn ids from the generation config, the validation sample, checkpoint
retention, evaluation concurrency, and the retriever's batch ceiling.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import struct
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
import tomllib
import torch
from hydra import compose, initialize_config_dir

from tests.search_r1.test_agent_loop_on_cpu import QUESTION, FakeSearch, Scripted, run
from train import CONFIG_DIR
from train.trainer import preflight
from train.trainer.config_checks import check_config

ROOT = Path(__file__).resolve().parent.parent
PRESETS = ["grpo", "grpo_llds", "grpo_llds_r", "grpo_llds_ma", "grpo_drift", "ppo"]


def load(name, model, overrides=()):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return compose(config_name=name, overrides=[f"actor_rollout_ref.model.path={model}", *overrides])


# 1. attention backend ------------------------------------------------------------------------------

@pytest.mark.parametrize("name", PRESETS)
def test_presets_use_sdpa_for_actor_ref_and_critic(name, tiny_model_dir):
    from verl.utils.config import omega_conf_to_dataclass

    cfg = load(name, tiny_model_dir)
    model = omega_conf_to_dataclass(cfg.actor_rollout_ref.model)  # verl's HFModelConfig (actor and ref)
    assert model.hf_config._attn_implementation == "sdpa"
    assert cfg.actor_rollout_ref.actor.use_dynamic_bsz is True
    assert cfg.actor_rollout_ref.actor.ppo_max_token_len_per_gpu == 8192  # holds the longest trajectory
    assert cfg.data.max_prompt_length + cfg.data.max_response_length <= 8192
    assert cfg.actor_rollout_ref.ref.log_prob_use_dynamic_bsz is True  # follows the actor
    if name == "ppo":
        critic = omega_conf_to_dataclass(cfg.critic.model)
        assert critic.hf_config._attn_implementation == "sdpa"
        assert cfg.critic.ppo_max_token_len_per_gpu == cfg.critic.ppo_infer_max_token_len_per_gpu == 8192


def test_sdpa_on_packed_sequences_equals_separate_forwards(tiny_model_dir):
    """verl's remove-padding path packs sequences into one row with restarting position_ids, no
    attention mask and use_cache=False (verl's FSDP engine forward); transformers then builds a
    block-diagonal mask, so SDPA does not attend across the packed sequences. (With a KV cache,
    transformers skips that detection: the packed rows would leak into each other.)"""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, attn_implementation="sdpa",
                                                 torch_dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(3, model.config.vocab_size, (n,), generator=g) for n in (7, 12, 5)]
    with torch.no_grad():
        separate = [model(input_ids=s.unsqueeze(0)).logits[0] for s in seqs]
        packed_ids = torch.cat(seqs).unsqueeze(0)
        position_ids = torch.cat([torch.arange(len(s)) for s in seqs]).unsqueeze(0)
        packed = model(input_ids=packed_ids, position_ids=position_ids, use_cache=False).logits[0]
    for i, s in enumerate(seqs):
        start = sum(len(x) for x in seqs[:i])
        torch.testing.assert_close(packed[start: start + len(s)], separate[i], rtol=1e-4, atol=1e-4)
    # the packed mask is what keeps them apart: with the cache on (no packed detection) they leak
    with torch.no_grad():
        leaked = model(input_ids=packed_ids, position_ids=position_ids).logits[0]  # cache on
    assert not torch.allclose(leaked[7:19], separate[1], atol=1e-3)


# 3. one FAISS per install ---------------------------------------------------------------------------

def test_exactly_one_faiss_per_install_path():
    """One FAISS build per install, from an extra: faiss-cpu (`cpu`) or faiss-gpu 1.15.1 (`gpu`), never both
    (all FAISS builds write the faiss/ package); every install path asks for exactly one of the two."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    faiss = lambda reqs: [r for r in reqs if r.lower().startswith("faiss")]
    extras = project["optional-dependencies"]
    assert faiss(project["dependencies"]) == []
    assert faiss(extras["cpu"]) == ["faiss-cpu>=1.8"]
    assert faiss(extras["gpu"]) == ["faiss-gpu==1.15.1"] and "verl[vllm]==0.9.1" in extras["gpu"]
    for name, reqs in extras.items():
        assert name in ("cpu", "gpu") or faiss(reqs) == [], name
    env = (ROOT / "environment.yml").read_text()
    assert "faiss" not in [line.strip(" -").split("=")[0] for line in env.splitlines()
                           if not line.strip().startswith("#")]
    assert "-e .[gpu,lucene,dev]" in env  # GPU: faiss-gpu
    make = (ROOT / "Makefile").read_text()
    assert "'.[cpu,dev,lucene]'" in make and "gpu" not in make.split("'.[cpu,dev,lucene]'")[0].splitlines()[-1]
    vllm_env = "\n".join(line for line in (ROOT / ".ci" / "install_vllm_env.sh").read_text().splitlines()
                         if not line.lstrip().startswith("#"))  # CPU tests: faiss-cpu by name, then the project
    assert " faiss-cpu " in vllm_env and "faiss-gpu" not in vllm_env and "--no-deps -e ." in vllm_env


def test_gpu_install_check_logic():
    sys.path.insert(0, str(ROOT / "scripts"))
    from check_gpu_install import check, check_archs, preset_attention

    good = {"torch": "2.11.0", "vllm": "0.24.0", "transformers": "5.9.0", "faiss-gpu": "1.15.1"}
    no_faiss = {k: v for k, v in good.items() if "faiss" not in k}
    assert preset_attention() == {"sdpa"}
    assert check(good, {"sdpa"}) == []
    for faiss in ({"faiss-cpu": "1.15.1"}, {"faiss-gpu-cu12": "1.14.1.post1"}, {}):  # not faiss-gpu
        assert any("exactly one FAISS distribution, faiss-gpu" in p for p in check({**no_faiss, **faiss}, {"sdpa"}))
    both = check({**good, "faiss-cpu": "1.15.1"}, {"sdpa"})  # two builds writing faiss/
    assert len(both) == 1 and "['faiss-cpu', 'faiss-gpu']" in both[0]
    assert any("flash-attn" in p for p in check(good, {"flash_attention_2"}))
    assert any("torch" in p for p in check({**good, "torch": "2.13.0"}, {"sdpa"}))
    assert any("transformers" in p for p in check({**good, "transformers": "5.19.0"}, {"sdpa"}))
    # GPU code: faiss-gpu-cu12 1.14.1.post1's libfaiss had sm_70 and sm_80 only; torch 2.11.0's sm_75-sm_121
    assert check_archs({"sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"}) == []
    problem = check_archs({"sm_70", "sm_80"})
    assert len(problem) == 1 and "sm_90" in problem[0] and "sm_70 sm_80" in problem[0]
    assert check_archs({"sm_80", "compute_80"}) == []  # PTX is compiled for newer GPUs at load time
    assert check_archs({"sm_86", "sm_90"}) and "sm_80" in check_archs({"sm_86", "sm_90"})[0]
    # faiss-gpu needs native code (SASS): 1.15.1 has it; PTX alone does not count for it
    faiss_gpu_1_15_1 = {"sm_70", "sm_75", "sm_80", "sm_86", "sm_89", "sm_90", "compute_90"}
    assert check_archs(faiss_gpu_1_15_1, what="faiss-gpu", native=True, uses="IVF search") == []
    ptx_only = check_archs({"sm_70", "sm_80", "compute_80"}, what="faiss-gpu", native=True, uses="IVF search")
    assert len(ptx_only) == 1 and "faiss-gpu has no native GPU code for sm_90" in ptx_only[0]


def _fatbin(*entries) -> bytes:
    """A CUDA fat binary: entries ``(kind, arch)``, kind 2 compiled code (sm_XY), 1 PTX (compute_XY)."""
    body = b""
    for kind, arch in entries:
        head = bytearray(64)
        struct.pack_into("<HHIQ", head, 0, kind, 0x101, 64, 24)
        struct.pack_into("<I", head, 28, arch)
        body += bytes(head) + bytes(range(24))
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body


def _wheel(path: Path, fatbins: list[bytes], filler: int = 3 << 20, method=zipfile.ZIP_DEFLATED) -> Path:
    """A wheel whose faiss/libfaiss.so is an ELF file: header, ``filler`` bytes of code (with a misaligned
    fat binary magic in it), the fat binaries back to back from an 8-byte boundary, ``filler`` bytes of
    other sections, a section table."""
    rng = np.random.default_rng(0)
    code = rng.integers(0, 256, filler, dtype=np.uint8).tobytes()  # incompressible; filler: a multiple of 8
    code += b"\0" * 3 + struct.pack("<IHHQ", 0xBA55ED50, 1, 16, 8) + b"\0" * 5  # a decoy header, misaligned
    sections = b"".join(f + b"\0" * (-len(f) % 8) for f in fatbins) + rng.integers(0, 256, filler, np.uint8).tobytes()
    shoff = 64 + len(code) + len(sections)
    head = bytearray(64)
    head[:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<Q", head, 0x28, shoff)
    with zipfile.ZipFile(path, "w", method) as z:
        z.writestr("faiss/libfaiss.so", bytes(head) + code + sections + b"\0" * 256)
    return path


def test_faiss_gpu_architectures_are_read_from_the_first_fat_binaries_of_a_streamed_wheel(tmp_path):
    """check-gpu-install reads libfaiss.so's GPU code as a stream, stopping after the first fat binaries."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from check_gpu_install import check_archs, wheel_fatbin_archs

    first = _fatbin((2, 80), (2, 90), (1, 90))
    wheel = _wheel(tmp_path / "faiss_gpu.whl", [first, first, _fatbin((2, 70))])
    archs, found, read = wheel_fatbin_archs(str(wheel), want=2)
    assert archs == {"sm_80", "sm_90", "compute_90"} and found == 2  # the third (sm_70) is not read
    assert read < wheel.stat().st_size - (1 << 20)  # it stopped in the stream: the rest of the wheel is not read
    assert wheel_fatbin_archs(str(wheel), want=10)[:2] == ({"sm_70", "sm_80", "sm_90", "compute_90"}, 3)
    stored = _wheel(tmp_path / "stored.whl", [first], method=zipfile.ZIP_STORED)
    assert wheel_fatbin_archs(str(stored))[:2] == ({"sm_80", "sm_90", "compute_90"}, 1)
    none = _wheel(tmp_path / "cpu_only.whl", [])
    assert wheel_fatbin_archs(str(none))[:2] == (set(), 0)
    assert "faiss-gpu has no native GPU code for sm_80, sm_90 (it has none)" in check_archs(
        set(), what="faiss-gpu", native=True)[0]
    with zipfile.ZipFile(tmp_path / "bz.whl", "w", zipfile.ZIP_BZIP2) as z:
        z.writestr("faiss/libfaiss.so", b"\x7fELF")
    with pytest.raises(ValueError, match="zip method 12"):
        wheel_fatbin_archs(str(tmp_path / "bz.whl"))


def test_dense_index_without_faiss_says_what_installs_it(monkeypatch):
    from retrieval import dense

    monkeypatch.setitem(sys.modules, "faiss", None)  # import faiss -> ImportError (pip install -e . alone)
    with pytest.raises(ImportError, match=r"pip install -e '\.\[cpu\]' \(faiss-cpu\).*pip install -e '\.\[gpu\]' "
                                          r"\(faiss-gpu 1\.15\.1\).*Never both"):
        dense.import_faiss()


# 4. launchers without .venv ------------------------------------------------------------------------

def _copy_without_venv(tmp_path: Path) -> Path:
    dst = tmp_path / "repo"
    ignore = shutil.ignore_patterns(".venv*", ".git", "runs", "__pycache__", "*.egg-info", ".pytest_cache")
    shutil.copytree(ROOT, dst, ignore=ignore)
    return dst


def test_scripts_run_with_the_environments_python(tmp_path):
    """`pip install -e` into conda or the system Python: no .venv; `python` imports the project."""
    repo = _copy_without_venv(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "PYTHON"}
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"  # the env's `python` comes first
    env["PYTHONPATH"] = str(repo)
    r = subprocess.run(["bash", "scripts/download_data.sh", "--help"], cwd=repo, env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "--val-per-source" in r.stdout
    r = subprocess.run(["bash", "scripts/download_wiki18.sh", str(tmp_path / "w"), "nonsense"], cwd=repo, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "unknown item 'nonsense'" in r.stderr, r.stderr
    for script in [*(ROOT / "scripts").glob("*.sh"), ROOT / "retrieval_launch.sh"]:
        if script.name != "_python.sh":
            assert ".venv/bin/python" not in script.read_text(), script.name


# 5. wandb without an account -------------------------------------------------------------------------

def test_wandb_without_account_goes_offline(tmp_path):
    env = {"HOME": str(tmp_path), "NETRC": str(tmp_path / "none")}
    notice = preflight.wandb_preflight(["console", "wandb"], env)
    assert env["WANDB_MODE"] == "offline" and "offline" in notice
    assert preflight.wandb_preflight(["console"], {}) is None
    keyed = {"WANDB_API_KEY": "x"}
    assert preflight.wandb_preflight(["wandb"], keyed) is None and "WANDB_MODE" not in keyed
    netrc = tmp_path / ".netrc"
    netrc.write_text("machine api.wandb.ai\n  login user\n  password abc\n")
    netrc.chmod(0o600)
    logged_in = {"NETRC": str(netrc)}
    assert preflight.wandb_preflight(["wandb"], logged_in) is None and "WANDB_MODE" not in logged_in
    with pytest.raises(RuntimeError, match="no wandb API key"):
        preflight.wandb_preflight(["wandb"], {"WANDB_MODE": "online", "NETRC": str(tmp_path / "none")})
    assert "WANDB_MODE=${WANDB_MODE:-online}" not in (ROOT / "scripts/_common.sh").read_text()


# 6. per-query retriever errors, query cap, failure-rate abort ----------------------------------------

class RejectingSearch(FakeSearch):
    """A live server's answers to bad queries: the client raises RetrievalRequestError (a 4xx)."""

    async def aretrieve(self, queries, topk=None, return_scores=True):
        from retrieval.client import RetrievalRequestError

        self.queries += list(queries)
        if any("bad" in q for q in queries):
            raise RetrievalRequestError("retrieval server rejected the request (400): queries[0] ...")
        return await super().aretrieve([], topk) or [[{"document": {"id": "0", "contents": '"T"\nok'}}]]


def test_rejected_search_is_a_failure_observation_not_a_crash(tiny_tokenizer):
    from train.search_r1 import protocol as P

    search = RejectingSearch()
    out, _ = run(tiny_tokenizer, ["<search> bad query </search>", "<search> fine </search>",
                                  "<answer> x </answer>"], search)
    assert out.extra_fields["num_failed_searches"] == 1 and out.extra_fields["num_valid_searches"] == 1
    assert out.extra_fields["search_failed"] is True
    assert P.format_search_failure().strip() in tiny_tokenizer.decode(out.response_ids)


def test_long_query_is_capped_to_what_the_server_accepts(tiny_tokenizer, bm25_server):
    from retrieval.client import RetrievalClient

    long_q = "american splendor " * 400  # 7,200 characters; the server refuses > 4,096
    client = RetrievalClient(bm25_server.url, retries=0)
    out, _ = run(tiny_tokenizer, [f"<search>{long_q}</search>", "<answer> x </answer>"], client,
                 search_cfg={"max_turn_tokens": 8000}, response_length=16000)
    assert out.extra_fields["num_valid_searches"] == 1 and out.extra_fields["num_failed_searches"] == 0


def test_failure_rate_abort():
    from train.search_r1.config import SearchConfig
    from train.search_r1.rollout_manager import check_failure_rate

    check_failure_rate(10, 5, 0.5, "http://h:8000/retrieve")  # at the threshold: go on
    check_failure_rate(0, 0, 0.5, "u")
    with pytest.raises(RuntimeError, match=r"6 of 10 searches .*max_failure_rate=0.5.*http://h:8000"):
        check_failure_rate(10, 6, 0.5, "http://h:8000/retrieve")
    check_failure_rate(10, 10, 1.0, "u")  # 1.0 never aborts
    with pytest.raises(ValueError, match="max_failure_rate"):
        SearchConfig.from_config({"max_failure_rate": 1.5})


def test_manager_aborts_a_step_of_failed_searches(tiny_tokenizer):
    """The check runs on the batch verl's manager returns (a stand-in batch: the manager's own
    generate path needs Ray workers; the CPU training test runs it for real)."""
    import numpy as np
    from omegaconf import OmegaConf

    from train.search_r1.rollout_manager import SearchR1AgentLoopManager

    class Out:
        def __init__(self, failed, valid):
            self.non_tensor_batch = {"num_failed_searches": np.array(failed), "num_valid_searches": np.array(valid)}
            self.batch = {}

    mgr = SearchR1AgentLoopManager.__new__(SearchR1AgentLoopManager)
    mgr.config = OmegaConf.create({"search_r1": {"retriever_url": "http://x:1/retrieve"}})

    async def parent(self, prompts):
        return prompts

    import verl.experimental.agent_loop.agent_loop as al
    orig = al.AgentLoopManager.generate_sequences
    al.AgentLoopManager.generate_sequences = parent
    try:
        with pytest.raises(RuntimeError, match="3 of 4 searches"):
            asyncio.run(SearchR1AgentLoopManager.generate_sequences.__wrapped__(mgr, Out([1, 2], [1, 0])))
        out = asyncio.run(SearchR1AgentLoopManager.generate_sequences.__wrapped__(mgr, Out([0, 1], [3, 2])))
        assert out is not None
    finally:
        al.AgentLoopManager.generate_sequences = orig


# 7. multi-node ---------------------------------------------------------------------------------------

def test_multinode_needs_absolute_shared_checkpoint_dir(tiny_model_dir):
    with pytest.raises(ValueError, match="absolute path"):
        check_config(load("grpo_llds", tiny_model_dir, ["trainer.nnodes=2"]))
    check_config(load("grpo_llds", tiny_model_dir, ["trainer.nnodes=2", "trainer.n_gpus_per_node=2",
                                                    "trainer.default_local_dir=/shared/ckpt"]))
    with pytest.raises(ValueError, match="absolute path"):  # the checkpoint check comes first
        check_config(load("grpo_llds", tiny_model_dir, ["trainer.nnodes=3"]))
    check_config(load("grpo_llds", tiny_model_dir))  # one node: relative is fine


def test_multinode_submit_excludes_data_and_outputs():
    text = (ROOT / "scripts/multinode.sh").read_text()
    excludes = json.loads(text.split("EXCLUDES='", 1)[1].split("'", 1)[0])
    for p in ("data/wiki18/", "data/processed/", "checkpoints/", "runs/", ".venv/"):
        assert p in excludes
    assert '--runtime-env-json "{\\"excludes\\": $EXCLUDES, \\"env_vars\\": $ENVS}"' in text
    assert 'trainer.default_local_dir="$CKPT_DIR"' in text
    r = subprocess.run(["bash", "scripts/multinode.sh"], cwd=ROOT, capture_output=True, text=True,
                       env={**os.environ, "ROLE": "submit", "RETRIEVER_URL": "http://10.0.0.1:8000/retrieve",
                            "CKPT_DIR": "ckpt", "PYTHON": sys.executable}, timeout=60)
    assert r.returncode == 1 and "must be an absolute path" in r.stderr


# 8. Lucene folder and the default download list ------------------------------------------------------

def _fake_hub(tmp_path: Path) -> Path:
    """A huggingface_hub stand-in that lays files out as the hub repos do and logs each call."""
    pkg = tmp_path / "fakehub" / "huggingface_hub"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(
        "import os, json\n"
        "LAYOUT = {'PeterJinGo/wiki-18-bm25-index': ['bm25/segments_1', 'bm25/_0.cfs']}\n"
        "def snapshot_download(repo_id, repo_type, allow_patterns, local_dir):\n"
        "    import fnmatch\n"
        "    with open(os.environ['FAKE_HUB_LOG'], 'a') as f: f.write(json.dumps([repo_id, allow_patterns]) + '\\n')\n"
        "    for rel in LAYOUT.get(repo_id, []):\n"
        "        if any(fnmatch.fnmatch(rel, p) for p in allow_patterns):\n"
        "            p = os.path.join(local_dir, rel); os.makedirs(os.path.dirname(p), exist_ok=True)\n"
        "            open(p, 'w').write('x')\n")
    return pkg.parent


def test_bm25_lands_where_lucene_serves_it(tmp_path):
    hub = _fake_hub(tmp_path)
    log = tmp_path / "hub.log"
    env = {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": f"{hub}:{ROOT}", "FAKE_HUB_LOG": str(log)}
    dest = tmp_path / "wiki18"
    r = subprocess.run(["bash", "scripts/download_wiki18.sh", str(dest), "bm25"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert (dest / "bm25" / "segments_1").is_file() and not (dest / "bm25" / "bm25").exists()
    from retrieval.launch import plan

    (dest / "wiki-18.jsonl").write_text("")
    p = plan(["lucene", "--wiki18", str(dest)])
    assert p.build is None and (p.load.kind, p.load.index, p.load.corpus) == (
        "lucene", str(dest / "bm25"), str(dest / "wiki-18.jsonl")), p.load
    # the default list is corpus,e5: no BM25 download for e5 users
    assert 'WHAT=${2:-corpus,e5}' in (ROOT / "scripts/download_wiki18.sh").read_text()
    r = subprocess.run(["bash", "retrieval_launch.sh"], cwd=ROOT, capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHON": sys.executable, "RETRIEVER": "lucene",
                            "WIKI18": str(tmp_path / "empty")})
    assert r.returncode == 2 and "download_wiki18.sh" in r.stderr and "corpus,bm25" in r.stderr


# 9. driver preflight ---------------------------------------------------------------------------------

def test_driver_preflight_names_the_driver_requirement():
    gpus = ["GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)"]
    with pytest.raises(RuntimeError, match=r"driver 550\.54.*>= 580"):
        preflight.cuda_preflight(gpus=gpus, cuda_available=False, torch_cuda="13.0", driver="550.54")
    with pytest.raises(RuntimeError, match="CPU build"):
        preflight.cuda_preflight(gpus=gpus, cuda_available=False, torch_cuda=None, driver="580.1")
    preflight.cuda_preflight(gpus=gpus, cuda_available=True, torch_cuda="13.0")
    preflight.cuda_preflight(gpus=[], cuda_available=False, torch_cuda=None)  # no GPUs: nothing to say


# 10. end of turn from the generation config ----------------------------------------------------------

def test_generation_config_eos_ids_end_a_turn(tmp_path, tiny_model_dir, tiny_tokenizer):
    from transformers import GenerationConfig

    from train.search_r1.agent_loop import end_of_turn_ids

    model_dir = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model_dir)
    other = tiny_tokenizer.convert_tokens_to_ids("<|endoftext|>")  # the tokenizer's EOS is <|im_end|>
    assert other is not None and other != tiny_tokenizer.eos_token_id
    GenerationConfig(eos_token_id=[tiny_tokenizer.eos_token_id, other]).save_pretrained(model_dir)
    assert end_of_turn_ids(tiny_tokenizer, str(model_dir)) == {tiny_tokenizer.eos_token_id, other}

    class EndsWithOther(Scripted):
        async def generate(self, request_id=None, *, prompt_ids, sampling_params, **kw):
            out = await super().generate(request_id, prompt_ids=prompt_ids, sampling_params=sampling_params)
            out.token_ids = list(out.token_ids) + [other]
            return out

    async def go(path):
        loop_ = __import__("train.search_r1.agent_loop", fromlist=["standalone_loop"]).standalone_loop(
            tiny_tokenizer, EndsWithOther(tiny_tokenizer, ["I am done.", "more", "more", "more", "more"]),
            search_client=FakeSearch(), model_path=path)
        return await loop_.run({"temperature": 1.0}, raw_prompt=QUESTION)

    # recognised as an end of turn: an invalid turn's EOS is dropped and the trajectory goes on
    # (train/search_r1/agent_loop.py), and the last generation ends with it
    out = asyncio.run(go(str(model_dir)))
    assert out.extra_fields["num_eos_dropped"] == 3 and out.extra_fields["stop_reason"] == "eos"
    # with the tokenizer's EOS only, <|endoftext|> is just another token
    out = asyncio.run(go(None))
    assert out.extra_fields["num_eos_dropped"] == 0 and out.extra_fields["stop_reason"] == "max_turns"


# 11. validation sample -------------------------------------------------------------------------------

def test_validation_sample_is_stratified_and_used_by_presets(tmp_path, qa_path, tiny_model_dir):
    import pandas as pd

    from train.data_prep import main as prep

    prep(["--out", str(tmp_path), "--local", str(qa_path), "--holdout", "30", "--val-per-source", "7"])
    val = pd.read_parquet(tmp_path / "val_sample.parquet")
    test = pd.read_parquet(tmp_path / "test.parquet")
    assert val.groupby("data_source").size().to_dict() == {s: 7 for s in test.data_source.unique()}
    assert set(val.extra_info.map(lambda e: e["uid"])) <= set(test.extra_info.map(lambda e: e["uid"]))
    prep(["--out", str(tmp_path / "again"), "--local", str(qa_path), "--holdout", "30", "--val-per-source", "7"])
    again = pd.read_parquet(tmp_path / "again" / "val_sample.parquet")
    uids = lambda df: list(df.extra_info.map(lambda e: e["uid"]))
    assert uids(again) == uids(val)  # the same rows every run
    for name in PRESETS:
        assert load(name, tiny_model_dir).data.val_files.endswith("val_sample.parquet")
    assert 'data.val_files="$DATA_DIR/val_sample.parquet"' in (ROOT / "scripts/_common.sh").read_text()


# 12. checkpoint retention ----------------------------------------------------------------------------

def test_checkpoint_pruning_keeps_recent_and_evaluated_steps(tmp_path, tiny_model_dir):
    from train.trainer import checkpoint_store

    for s in (50, 100, 150, 200, 250, 300):
        (tmp_path / f"global_step_{s}" / "actor").mkdir(parents=True)
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("300")
    assert checkpoint_store.prune(str(tmp_path), 2, keep_steps=[100]) == [50, 150, 200]
    assert checkpoint_store.saved_steps(str(tmp_path)) == [100, 250, 300]
    assert checkpoint_store.prune(str(tmp_path), 0) == []
    cfg = load("grpo_llds", tiny_model_dir)
    assert checkpoint_store.check_config(cfg.checkpoints) == (3, [])
    with pytest.raises(ValueError, match="keep_steps"):
        checkpoint_store.check_config({"keep_steps": ["x"]})
    with pytest.raises(ValueError, match="unknown checkpoints"):
        check_config(load("grpo_llds", tiny_model_dir, ["+checkpoints.keep=1"]))
    assert "checkpoints.keep_steps=[$STEP]" in (ROOT / "scripts/reproduce_paper.sh").read_text()


# 13. evaluation concurrency --------------------------------------------------------------------------

def test_evaluator_keeps_many_questions_in_flight_and_builds_loops_lazily(tmp_path, tiny_tokenizer, monkeypatch):
    from train.evaluation import runner as eval_runner
    from train.inference.asker import Asker
    from train.inference.settings import AskSettings
    from train.search_r1 import agent_loop

    state = {"in_flight": 0, "peak": 0, "loops": 0}

    class Slow:
        async def generate(self, request_id=None, *, prompt_ids, sampling_params, **kw):
            from verl.workers.rollout.replica import TokenOutput

            state["in_flight"] += 1
            state["peak"] = max(state["peak"], state["in_flight"])
            await asyncio.sleep(0.3)  # long enough that all `concurrency` questions overlap, even under load
            state["in_flight"] -= 1
            return TokenOutput(token_ids=tiny_tokenizer.encode("<answer> x </answer>", add_special_tokens=False))

    real = agent_loop.standalone_loop

    def counting(*a, **k):
        state["loops"] += 1
        assert state["loops"] - state["done"] <= 40  # never more loops alive than the concurrency
        return real(*a, **k)

    state["done"] = 0
    monkeypatch.setattr(agent_loop, "standalone_loop", counting)
    asker = Asker(Slow(), tiny_tokenizer, FakeSearch(), AskSettings(model=None, concurrency=40))
    rows = [{"uid": f"u{i}", "data_source": "nq", "question": f"question {i}?", "golds": ["x"]} for i in range(120)]
    orig_ask = asker.ask

    async def ask(q):
        r = await orig_ask(q)
        state["done"] += 1
        return r

    asker.ask = ask
    results = asyncio.run(eval_runner.evaluate(rows, asker, tmp_path / "out.jsonl"))
    assert len(results) == 120 and all(r["em"] == 1.0 for r in results)
    assert state["peak"] == 40
    assert Asker(Slow(), tiny_tokenizer, FakeSearch()).concurrency == 256  # AskSettings' default


# 15. retriever batch ceiling -------------------------------------------------------------------------

def test_batches_can_reach_max_batch_beyond_64_requests():
    from retrieval.app import create_app
    from retrieval.serving import Server, default_threads
    from retrieval.settings import ServeConfig, ServerConfig
    from tests.conftest import free_port

    class SlowRetriever:
        kind, corpus = "fake", [None]

        class index:
            ntotal = 1

        def search(self, queries, k):
            time.sleep(1.5)  # requests pile up while a batch runs
            return [[({"id": "0", "contents": q}, 1.0)] for q in queries]

    app = create_app(SlowRetriever(), ServerConfig(max_batch=128))
    assert default_threads(128) == 160
    port = free_port()
    server = Server(app, ServeConfig(port=port), quiet=True).start()  # default threads for max_batch 128
    assert server.threads == 160
    import httpx

    barrier = threading.Barrier(140)

    def one(i):
        with httpx.Client(timeout=60) as c:
            barrier.wait(30)
            assert c.post(f"http://127.0.0.1:{port}/retrieve",
                          json={"queries": [f"q{i}"], "topk": 1}).status_code == 200

    try:
        httpx.post(f"http://127.0.0.1:{port}/retrieve", json={"queries": ["warm"]}, timeout=30)
        workers = [threading.Thread(target=one, args=(i,)) for i in range(140)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(60)
        largest = httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).json()["largest_batch"]
        assert largest > 64, largest
    finally:
        server.stop()


def test_wandb_mode_reaches_ray_workers_through_the_runtime_env(tiny_model_dir, monkeypatch):
    from omegaconf import OmegaConf

    from train.trainer.ray_setup import forward_env_to_ray

    cfg = load("grpo_llds", tiny_model_dir)
    monkeypatch.setenv("WANDB_MODE", "offline")
    forward_env_to_ray(cfg, ("WANDB_MODE",))
    env = OmegaConf.to_container(cfg.ray_kwargs.ray_init.runtime_env)
    assert env["env_vars"]["WANDB_MODE"] == "offline"
