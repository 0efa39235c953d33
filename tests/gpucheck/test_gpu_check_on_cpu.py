"""The GPU check (python -m train.gpu_check, search-r1-gpu-check, bash bench/gpu_check.sh) in its CPU dry
mode: every part runs and passes; a broken path is reported as a mismatch with a non-zero exit; bad --parts is
refused; the retrieval batcher's one-thread rule is checked (and a batcher that searches on the caller's thread
fails); the evaluator is asked for one engine; a transformers of another major version skips the parts that
need it instead of crashing them; the cuBLAS workspace sizes the memory rows allow for are torch's; outside a
checkout (an installed wheel) the pin, the tiny model and the attention part still answer."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


@pytest.mark.slow
def test_dry_mode_runs_every_part():
    r = subprocess.run([sys.executable, "-m", "train.gpu_check", "--cpu"], cwd=ROOT, capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-3000:]
    table = r.stdout[r.stdout.index("part "):]
    for part in ("fork", "hf_kv", "flat", "logprobs", "attention", "critic", "threads"):
        assert f"\n{part} " in table, part
    assert "MISMATCH" not in table and " 0 mismatches" in r.stdout


def test_a_broken_path_is_a_mismatch(monkeypatch, capsys):
    from retrieval.flat import TorchFlatIndex
    from train import gpu_check

    real = TorchFlatIndex.search

    def reversed_order(self, queries, k):
        s, i = real(self, queries, k)
        return s[:, ::-1].copy(), np.ascontiguousarray(i[:, ::-1])

    monkeypatch.setattr(TorchFlatIndex, "search", reversed_order)
    assert gpu_check.main(["--cpu", "--parts", "flat"]) == 1
    assert "MISMATCH" in capsys.readouterr().out


def test_bad_parts_are_refused_through_the_checkout_wrapper():
    """bash bench/gpu_check.sh reaches the command (from another folder: it finds the checkout itself)."""
    r = subprocess.run(["bash", str(ROOT / "bench" / "gpu_check.sh"), "--cpu", "--parts", "flat,nope"], cwd="/",
                       env={**os.environ, "PYTHON": sys.executable}, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--parts: unknown nope" in r.stderr, r.stderr[-2000:]


# -- threads: the retrieval batcher keeps all device work on its one thread ---------------------------------

def test_the_threads_part_passes_with_the_batcher(capsys):
    from train import gpu_check

    assert gpu_check.main(["--cpu", "--parts", "threads"]) == 0
    out = capsys.readouterr().out
    assert "128 requests from 80 client threads" in out and "all on 'retrieval-batcher'" in out, out
    assert "the baseline searched on 80 client threads" in out and "MISMATCH" not in out


class CallerThreadBatcher:
    """A broken batcher: MicroBatcher's API, but each request searches on the thread that asks (the server's
    behaviour before the batching engine), while it claims the batcher's thread name."""

    def __init__(self, retriever, max_batch: int = 256, **kwargs):
        self.retriever = retriever

    @property
    def thread_name(self) -> str:
        return "retrieval-batcher"

    def search(self, queries, topk, timeout=None):
        return self.retriever.search(queries, topk)

    def submit(self, queries, topk):
        from concurrent.futures import Future

        f = Future()
        f.set_result(self.search(queries, topk))
        return f

    def close(self) -> None:
        pass


def test_a_batcher_that_searches_on_the_callers_thread_is_a_mismatch(monkeypatch, capsys):
    from retrieval import batching
    from train import gpu_check

    monkeypatch.setattr(batching, "MicroBatcher", CallerThreadBatcher)
    assert gpu_check.main(["--cpu", "--parts", "threads"]) == 1
    out = capsys.readouterr().out
    row = next(ln for ln in out.splitlines() if ln.startswith("threads") and "where the searches ran" in ln)
    assert "MISMATCH" in row and "on 80 threads: client-" in row, row


def test_the_client_load_reaches_every_thread_kind():
    """drive_clients: 64 short-lived threads alive at once plus a pool, each request answered with its rows."""
    import threading

    from train.gpucheck.search import drive_clients

    seen = []

    def search(queries, k):
        seen.append(threading.current_thread().name)
        return [[({"contents": q}, 1.0)] * k for q in queries]

    load = drive_clients(search, short=8, pooled=3, per_pooled=2)
    assert load["requests"] == 14 and not load["errors"]
    assert {n for n in seen if n.startswith("client-short-")} == {f"client-short-{i}" for i in range(8)}
    assert any(n.startswith("client-pool") for n in seen)
    load = drive_clients(lambda q, k: [[({"contents": "other"}, 1.0)] * k for _ in q], short=2, pooled=1,
                                   per_pooled=1)
    assert len(load["errors"]) == 3  # wrong rows are counted


# -- the memory rows allow for torch's per-thread cuBLAS workspace ------------------------------------------

def test_the_workspace_sizes_are_torchs():
    """aten/src/ATen/cuda/CublasHandlePool.cpp (torch 2.11) parseChosenWorkspaceSize / parseCUDABlasLtWorkspaceSize."""
    from train.gpucheck.environment import torch_workspace_sizes
    from train.gpucheck.hf_kv import HF_KV_SLACK
    from train.gpucheck.search import THREADS_SLACK

    MiB = 1 << 20
    h200 = torch_workspace_sizes(9, 0, {})
    assert h200.cublas == 32 * MiB and h200.cublaslt == 1 * MiB and h200.per_thread == 33 * MiB
    a100 = torch_workspace_sizes(8, 0, {})
    assert a100.cublas == 8 * MiB + 128 * 1024  # ":4096:2:16:8"
    assert torch_workspace_sizes(9, 0, {"CUBLAS_WORKSPACE_CONFIG": ":4096:2:16:8"}).cublas == a100.cublas
    assert torch_workspace_sizes(8, 0, {"CUBLAS_WORKSPACE_CONFIG": ":16:8"}).cublas == 128 * 1024
    assert torch_workspace_sizes(9, 0, {"CUBLAS_WORKSPACE_CONFIG": "nonsense"}).cublas == 32 * MiB
    shared = torch_workspace_sizes(9, 0, {"TORCH_CUBLASLT_UNIFIED_WORKSPACE": "1"})
    assert shared.lt_shared and shared.per_thread == 32 * MiB
    capped = torch_workspace_sizes(8, 0, {"CUBLAS_WORKSPACE_CONFIG": ":16:8",
                                                    "CUBLASLT_WORKSPACE_SIZE": "4096"})
    assert capped.cublaslt == 128 * 1024  # unified by default: the Lt size is capped at the cuBLAS one
    own = torch_workspace_sizes(8, 0, {"TORCH_CUBLASLT_UNIFIED_WORKSPACE": "0",
                                                 "CUBLASLT_WORKSPACE_SIZE": "4096"})
    assert own.cublaslt == 4 * MiB and not own.lt_shared
    assert HF_KV_SLACK < h200.cublas and THREADS_SLACK < a100.cublas


# -- fork: the evaluator builds one engine in-process however many GPUs are visible -------------------------

def test_the_evaluator_is_asked_for_one_engine():
    from train.evaluation import options as eval_options
    from train.evaluation.pool import plan
    from train.gpucheck.fork import evaluator_argv

    opts = eval_options.EvalOptions.parse(evaluator_argv("some/model"))
    assert opts.engines == 1
    assert plan(opts.engines, opts.ask.tensor_parallel_size, ["0", "1", "2", "3"]) == ["0"]  # one device: in-process
    assert len(plan(None, opts.ask.tensor_parallel_size, ["0", "1"])) == 2  # what it was: an engine per GPU


# -- transformers of another major version -------------------------------------------------------------------

def test_transformers_4_skips_the_parts_that_need_it_instead_of_crashing(monkeypatch, capsys):
    """As on a lent image with transformers 4.x: create_causal_mask has another signature there (it raised a
    TypeError in the attention part). The parts that need transformers are skipped with the reason, the
    others run, and the run is not a mismatch."""
    import importlib.metadata

    import transformers.masking_utils

    from train import gpu_check

    real_version = importlib.metadata.version

    def version(name):
        return "4.57.1" if name == "transformers" else real_version(name)

    def old_signature(*args, **kwargs):
        raise TypeError("create_causal_mask() missing 1 required positional argument: 'past_key_values'")

    monkeypatch.setattr(importlib.metadata, "version", version)
    monkeypatch.setattr(transformers.masking_utils, "create_causal_mask", old_signature)
    assert gpu_check.main(["--cpu", "--parts", "attention,critic,logprobs"]) == 0
    out = capsys.readouterr().out
    assert "transformers 4.57.1 is installed; the project needs transformers>=5" in out
    table = out[out.index("part "):]
    assert "MISMATCH" not in table
    for part in ("attention", "critic"):
        assert any(ln.startswith(part) and "skipped" in ln and "4.57.1" in ln for ln in table.splitlines()), part
    assert any(ln.startswith("logprobs") and ln.rstrip().endswith(" ok") for ln in table.splitlines())
    assert "skipped: attention, critic" in out


def test_the_transformers_pin_is_read_from_pyproject(monkeypatch):
    from train.gpucheck import environment

    pin = environment.transformers_pin()
    assert pin.startswith(">=5"), pin
    line, ok = environment.transformers_status()
    assert ok is True and pin in line  # the venv's transformers is within the pin
    monkeypatch.setattr(environment, "installed_transformers", lambda: None)
    assert environment.transformers_status()[1] is False
    monkeypatch.setattr(environment, "installed_transformers", lambda: "5.999.0")
    assert environment.transformers_status()[1] is None  # the right major version outside the pin: runs, with a word


# -- outside a checkout (an installed wheel: no pyproject.toml, no data/, no bench/) ------------------------------

def test_outside_a_checkout_the_pin_comes_from_the_installed_metadata(monkeypatch, tmp_path):
    from packaging.specifiers import SpecifierSet

    from train.gpucheck import environment

    in_checkout = environment.transformers_pin()
    monkeypatch.setattr(environment, "REPO_ROOT", tmp_path)
    installed = environment.transformers_pin()
    assert installed and SpecifierSet(installed) == SpecifierSet(in_checkout), (installed, in_checkout)


def test_outside_a_checkout_the_tiny_model_and_the_attention_part_still_answer(monkeypatch, tmp_path):
    from transformers import AutoTokenizer

    from train.gpucheck import environment, kernels
    from train.gpucheck.report import Report

    monkeypatch.setattr(environment, "DATA_DIR", tmp_path / "no_data")
    path = environment.tiny_model(tmp_path, hidden=32, layers=1, heads=2)
    tok = AutoTokenizer.from_pretrained(str(path))
    assert tok.decode(tok.encode("the capital of france is paris")).strip() == "the capital of france is paris"
    monkeypatch.setattr(kernels, "REPO_ROOT", tmp_path)
    rep = Report()
    kernels.part_attention(rep, "cpu", 256, 2, 1, 16)
    assert [(r.part, r.check, r.ok) for r in rep.rows] == [("attention", "skipped", None)]
    assert "bench/bench_attention.py" in rep.rows[0].value
