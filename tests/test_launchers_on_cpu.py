"""Which Python the launchers run (scripts/_python.sh): the environment the user activated wins over the
repo's CPU test .venv; a launcher whose interpreter lacks what it needs says which one it picked and why.
Also: `make check-gpu-install` builds no .venv, and the GPU preflight's C compiler check."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from train.trainer import preflight

ROOT = Path(__file__).resolve().parent.parent
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"  # no Python with this project on it


def fake_env(root: Path, python: str) -> Path:
    """A virtualenv/conda-like folder whose bin/python runs ``python``."""
    (root / "bin").mkdir(parents=True)
    exe = root / "bin" / "python"
    exe.write_text(f'#!/bin/sh\nexec "{python}" "$@"\n')
    exe.chmod(0o755)
    return root


def picked(env_vars: dict, script: str = 'echo "$PY|$PY_WHY"') -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHON", "VIRTUAL_ENV", "CONDA_PREFIX", "PYTHONPATH")}
    env.update({"PATH": SYSTEM_PATH, **env_vars})
    return subprocess.run(["bash", "-c", f"source scripts/_python.sh && {script}"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def envs(tmp_path_factory):
    base = tmp_path_factory.mktemp("envs")
    with_project = fake_env(base / "gpu-env", sys.executable)  # this interpreter imports train and retrieval
    system = subprocess.run(["bash", "-c", "PATH=" + SYSTEM_PATH + " command -v python3"], capture_output=True,
                            text=True).stdout.strip()
    without = fake_env(base / "empty-env", system or "/bin/false")
    return with_project, without


def test_repo_has_a_venv():
    assert (ROOT / ".venv" / "bin" / "python").exists(), "make install first (the precedence tests need .venv)"


@pytest.mark.parametrize("var", ["VIRTUAL_ENV", "CONDA_PREFIX"])
def test_the_active_environment_wins_over_the_repo_venv(envs, var):
    with_project, _ = envs
    r = picked({var: str(with_project)})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"{with_project}/bin/python|the active environment {with_project}"


def test_python_variable_wins_over_everything(envs):
    with_project, _ = envs
    r = picked({"VIRTUAL_ENV": str(with_project), "PYTHON": sys.executable})
    assert r.stdout.strip() == f"{sys.executable}|$PYTHON"


def test_an_active_environment_without_the_project_falls_back_to_venv_and_says_so(envs):
    _, without = envs
    r = picked({"VIRTUAL_ENV": str(without)})
    assert r.returncode == 0, r.stderr
    py, why = r.stdout.strip().split("|")
    assert py == str(ROOT / ".venv" / "bin" / "python") and ".venv" in why and "no active environment" in why


def test_a_launcher_needing_vllm_names_the_python_it_picked(envs, bm25_server):
    """The CPU .venv has no vLLM: the GPU training launcher refuses it, naming it and why it was picked."""
    _, without = envs
    r = picked({"VIRTUAL_ENV": str(without)}, 'need_stack "training (the presets roll out with vLLM)" vllm')
    assert r.returncode == 1
    assert f"{ROOT}/.venv/bin/python lacks" in r.stderr and "picked: the repo's .venv" in r.stderr
    assert "pip install -e '.[gpu,lucene,dev]'" in r.stderr
    r = subprocess.run(["bash", "scripts/train_grpo.sh"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHON": sys.executable, "RETRIEVER_URL": f"{bm25_server.url}/retrieve"})
    assert r.returncode == 1 and "training (the presets roll out with vLLM) needs vllm" in r.stderr, r.stderr
    assert "picked: $PYTHON" in r.stderr


def test_check_gpu_install_builds_no_venv(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS", "PYTHON")}
    r = subprocess.run(["make", "-n", "--no-print-directory", f"VENV={tmp_path / 'v'}", "check-gpu-install"],
                       cwd=ROOT, capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "python3 scripts/check_gpu_install.py", r.stdout


def test_check_gpu_install_needs_only_the_standard_library():
    r = subprocess.run([sys.executable, "-S", "-c", "import sys; sys.path.insert(0, 'scripts'); "
                        "import check_gpu_install as c; print(sorted(c.preset_attention()))"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "['sdpa']", r.stderr


def test_gpu_preflight_needs_a_c_compiler_and_python_headers(tmp_path):
    none = lambda name: None
    with pytest.raises(RuntimeError, match="no C compiler.*Failed to find C compiler.*gcc_linux-64"):
        preflight.compiler_preflight({}, which=none)
    with pytest.raises(RuntimeError, match="no C compiler"):
        preflight.compiler_preflight({"CC": "/nonexistent/cc"}, which=none)
    gcc = lambda name: f"/usr/bin/{name}" if name == "gcc" else None
    with pytest.raises(RuntimeError, match="Python.h is missing.*python3-dev"):
        preflight.compiler_preflight({}, which=gcc, python_include=str(tmp_path))
    (tmp_path / "Python.h").write_text("")
    preflight.compiler_preflight({}, which=gcc, python_include=str(tmp_path))
    cc = lambda name: "/opt/conda/bin/x86_64-conda-linux-gnu-cc" if name.endswith("-cc") else None
    preflight.compiler_preflight({"CC": "x86_64-conda-linux-gnu-cc"}, which=cc, python_include=str(tmp_path))
