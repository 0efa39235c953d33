"""The wheel as a user gets it: built from this checkout (offline, the project venv's setuptools), installed
with ``--no-deps`` into a venv of its own that sees the project venv's dependencies but neither the
source tree nor the editable install, and used from a folder outside the checkout: every module of
train/ and retrieval/ is in it, the presets (``train.CONFIG_DIR``) and the paper's table are inside the
installed package, and the commands start (``--help``; ``train.paper_runs`` reads the packaged table)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("train", "retrieval")
#: what the build does not need (and what may be large: data/ holds wiki-18 once downloaded)
SKIP_TOP = {".git", "build", "dist", "data", "runs", "outputs", "wandb", "checkpoints", ".pytest_cache", "shared"}
#: ``python -m MODULE --help`` in the installed venv (train.main: Hydra's help, which prints the preset)
COMMANDS = ["train.main", "train.evaluate", "train.data_prep", "train.plot", "retrieval.server", "retrieval.launch",
            "retrieval.build", "retrieval.client"]


def _ignore(root: Path):
    def ignore(folder, names):
        top = Path(folder).resolve() == root
        return {n for n in names if n == "__pycache__" or n.endswith((".egg-info", ".pyc")) or n.startswith(".venv")
                or (top and n in SKIP_TOP)}
    return ignore


def _run(cmd, **kw):
    kw.setdefault("timeout", 300)
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)


def _checkout_files(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for pkg in PACKAGES for p in (root / pkg).rglob("*.py")
            if "__pycache__" not in p.parts}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel of a copy of the checkout (the build writes build/ and *.egg-info beside its sources)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    shutil.copytree(ROOT, src, ignore=_ignore(ROOT))
    r = _run([sys.executable, "-m", "pip", "wheel", "--disable-pip-version-check", "--no-index", "--no-deps",
              "--no-build-isolation", "-q", "-w", tmp / "dist", src], cwd=tmp)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    wheels = list((tmp / "dist").glob("search_r1_llds-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> dict:
    """A fresh venv with the wheel installed and the project venv's site-packages on its path through a
    plain path line in a .pth (such a line does not run the .pth files of the folder it adds, so the
    editable install's finder is not loaded)."""
    tmp = tmp_path_factory.mktemp("wheel_venv")
    venv = tmp / "venv"
    r = _run([sys.executable, "-m", "venv", "--without-pip", venv])
    assert r.returncode == 0, r.stderr[-3000:]
    py = venv / "bin" / "python"
    site = Path(_run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    assert site.is_dir() and site.is_relative_to(venv), site
    (site / "search_r1_llds_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    r = _run([sys.executable, "-m", "pip", "--python", py, "install", "--disable-pip-version-check", "--no-index",
              "--no-deps", "-q", wheel])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    work = tmp / "elsewhere"  # the commands' working folder: outside the checkout
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", WANDB_MODE="disabled")
    return {"venv": venv, "py": py, "site": site, "cwd": work, "env": env}


def test_wheel_holds_every_module_and_the_packaged_files(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
    shipped = {n for n in names if n.endswith(".py") and n.split("/", 1)[0] in PACKAGES}
    missing = sorted(_checkout_files(ROOT) - shipped)
    assert not missing, f"in the checkout but not in the wheel (a subpackage left out of pyproject.toml?): {missing}"
    assert not sorted(shipped - _checkout_files(ROOT)), "in the wheel but not in the checkout (a stale build/?)"
    # configs/ at the top of the checkout lands inside the package
    presets = {"train/" + p.relative_to(ROOT).as_posix() for p in (ROOT / "configs").rglob("*.yaml")}
    assert {"train/configs/grpo_llds.yaml", "train/configs/rehearsal/cpu.yaml"} <= presets
    assert not sorted(presets - names), f"presets missing from the wheel: {sorted(presets - names)}"
    assert "train/evaluation/paper_results.json" in names
    assert not [n for n in names if n.split("/", 1)[0] in ("tests", "bench", "scripts", "data")], sorted(names)


CHECK = r"""
import importlib.metadata as md, json, sys
from pathlib import Path
import train, train.plugin, train.cpu.platform, retrieval, retrieval.server
from train.evaluation import report
print(json.dumps({
    "train": train.__file__, "retrieval": retrieval.__file__, "config_dir": train.CONFIG_DIR,
    "presets": sorted(p.name for p in Path(train.CONFIG_DIR).glob("*.yaml")),
    "paper_results": str(Path(train.__file__).parent / "evaluation" / "paper_results.json"),
    "report_table": str(report.PAPER_RESULTS),
    "path": sys.path,
    "finders": [f"{getattr(f, '__module__', '')}.{getattr(f, '__qualname__', type(f).__qualname__)}"
                for f in sys.meta_path],  # most finders are classes
    "plugin": [e.value for e in md.entry_points(group="verl.plugins") if e.name == "search_r1_llds"],
}))
"""


def test_installed_wheel_imports_from_its_venv(venv):
    r = _run([venv["py"], "-c", CHECK], cwd=venv["cwd"], env=venv["env"])
    assert r.returncode == 0, r.stderr[-4000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    site = venv["site"]
    for key in ("train", "retrieval", "config_dir", "paper_results", "report_table"):
        assert Path(got[key]).is_relative_to(site), (key, got[key], site)
    assert Path(got["config_dir"]).is_dir() and "grpo_llds.yaml" in got["presets"], got
    assert Path(got["paper_results"]).is_file() and Path(got["report_table"]).is_file()
    # neither the checkout nor the editable install is seen
    deps = Path(sysconfig.get_paths()["purelib"]).resolve()  # the project venv's (inside the checkout on CI)
    seen = [p for p in got["path"] if p and Path(p).resolve().is_relative_to(ROOT)
            and not Path(p).resolve().is_relative_to(deps)]
    assert not seen, got["path"]
    assert not [f for f in got["finders"] if "editable" in f.lower()], got["finders"]
    assert set(got["plugin"]) == {"train.plugin"}, got["plugin"]


@pytest.mark.parametrize("module", COMMANDS)
def test_installed_wheel_command_help(venv, module):
    r = _run([venv["py"], "-m", module, "--help"], cwd=venv["cwd"], env=venv["env"])
    assert r.returncode == 0, f"python -m {module} --help exited {r.returncode}:\n{r.stderr[-4000:]}"
    out = r.stdout + r.stderr
    assert (("powered by Hydra" in out and "== Config ==" in out) if module == "train.main"
            else "usage" in out), out[-3000:]
    assert not [pkg for pkg in PACKAGES if f"{ROOT}/{pkg}" in out], \
        f"python -m {module} --help ran the checkout's code:\n{out[-3000:]}"


def test_installed_wheel_reads_the_packaged_paper_table(venv):
    """train.paper_runs (reproduce_paper.sh's lookup) reads train/evaluation/paper_results.json."""
    r = _run([venv["py"], "-m", "train.paper_runs", "Qwen/Qwen2.5-3B-Instruct", "grpo_llds"], cwd=venv["cwd"],
             env=venv["env"])
    assert r.returncode == 0, r.stderr[-3000:]
    assert "PAPER_ROW=" in r.stdout and "PAPER_STEP=650" in r.stdout, r.stdout


#: the console scripts (pyproject.toml [project.scripts]) and what their --help shows
SCRIPTS = {"search-r1-train": "powered by Hydra", "search-r1-infer": "usage: infer.py",
           "search-r1-evaluate": "usage: python -m train.evaluate", "search-r1-data": "usage",
           "search-r1-plot": "usage", "search-r1-index": "usage", "search-r1-retriever": "usage",
           "search-r1-launch": "usage: python -m retrieval.launch",
           "search-r1-get-model": "usage: python -m train.get_model",
           "search-r1-warm-start": "usage: python -m train.warm_start",
           "search-r1-gpu-check": "usage: python -m train.gpu_check"}


def test_console_scripts_are_immune_to_a_train_py_in_the_working_folder(venv, tmp_path):
    """A user's own train.py (or retrieval.py) beside them shadows the package for `python -m train.X`
    (its sys.path starts with the working folder); the console scripts import the installed package."""
    work = tmp_path / "mine"
    work.mkdir()
    for name in ("train.py", "retrieval.py"):
        (work / name).write_text("raise SystemExit('the working folder\\'s own module was imported')\n")
    shadowed = _run([venv["py"], "-m", "train.evaluate", "--help"], cwd=work, env=venv["env"])
    assert shadowed.returncode != 0, "python -m train.X was not shadowed: this test shows nothing"
    for script, expect in SCRIPTS.items():
        r = _run([venv["venv"] / "bin" / script, "--help"], cwd=work, env=venv["env"])
        assert r.returncode == 0 and expect in r.stdout + r.stderr, f"{script}: {r.stderr[-2000:]}"


def test_the_installed_infer_command_answers(venv, tiny_model_dir, bm25_index_dir):
    """`search-r1-infer "..."` from the wheel asks a model (a tiny one here) over an in-process index."""
    r = _run([venv["venv"] / "bin" / "search-r1-infer", "What is the capital of France?", "--model", tiny_model_dir,
              "--index", bm25_index_dir, "--max-new-tokens", "8", "--max-turns", "1", "--device", "cpu"],
             cwd=venv["cwd"], env=venv["env"])
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Question: What is the capital of France?" in r.stdout and "Answer:" in r.stdout, r.stdout[-2000:]
