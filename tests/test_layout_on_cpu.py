"""The layout of ``train/`` (see its ``__init__.py``): commands at the top, one concern per
subpackage, imports one way, no cycle, light commands that import no heavy library.

Pure AST reads plus a few fresh interpreters; no verl or torch import in this process.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TRAIN = ROOT / "train"

#: The import order: a module may import its own package and anything of a lower level, never higher.
LEVELS = {"errors": 0, "files": 0, "models": 0, "search_r1": 1, "llds": 1, "monitor": 1, "workers": 2, "cpu": 3,
          "inference": 3, "plugin": 4, "sft": 4, "trainer": 5, "evaluation": 6, "toy": 6,
          "gpucheck": 6}
COMMAND_LEVEL = 7
#: Files directly in train/ that are not commands.
NOT_COMMANDS = {"__init__", "plugin", "errors", "files"}
#: Commands users run that must not pay for verl, torch, Ray, transformers or Flask (their --help
#: and light work start in well under a second).
LIGHT_COMMANDS = ["data_prep", "geometry", "checkpoints", "rehearsal", "settings", "paper_runs", "plot",
                  "evaluate", "tiny", "learnable", "demo", "cluster_check", "infer", "get_model", "warm_start",
                  "gpu_check", "collapse"]
HEAVY = ("verl", "torch", "ray", "transformers", "flask")
MAX_LINES = 380
#: __init__.py files that hold code, and why (every other one is a docstring, a map of its package).
INIT_WITH_CODE = {"train.cpu": "register() and enabled(): what verl's plugin entry point calls",
                  "train": "the paths (CONFIG_DIR, DATA_DIR, REPO_ROOT) and the plugins variable's name, "
                           "without an import"}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(TRAIN.rglob("*.py"))}


def imports_of(path: Path, known: set[str]) -> list[tuple[str, int]]:
    """The ``train`` modules a file imports (anywhere in it, functions included), with the line."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names if a.name.split(".")[0] == "train"]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "train":
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                out.append((sub if sub in known else node.module, node.lineno))
    return out


def level(mod: str) -> int:
    parts = mod.split(".")
    if len(parts) == 1:
        return -1  # train itself: paths only
    if parts[1] in LEVELS:
        return LEVELS[parts[1]]
    return COMMAND_LEVEL


def commands() -> set[str]:
    return {f"train.{p.stem}" for p in TRAIN.glob("*.py") if p.stem not in NOT_COMMANDS}


def test_imports_go_one_way_and_no_package_module_imports_a_command():
    mods = modules()
    cmds = commands()
    wrong = []
    for mod, path in mods.items():
        if mod in cmds:
            continue
        for target, line in imports_of(path, set(mods)):
            if target not in mods:
                wrong.append(f"{path.relative_to(ROOT)}:{line}: imports {target}, which does not exist")
            elif target in cmds:
                wrong.append(f"{path.relative_to(ROOT)}:{line}: imports the command {target} (a package module "
                             f"must not: move what it needs into a package)")
            elif target.split(".")[:2] != mod.split(".")[:2] and level(target) > level(mod):
                wrong.append(f"{path.relative_to(ROOT)}:{line}: {mod} (level {level(mod)}) imports {target} "
                             f"(level {level(target)}): imports go {' <- '.join(LEVELS)} <- commands")
    assert not wrong, "\n".join(wrong)


def test_no_import_cycle():
    mods = modules()
    graph = {m: sorted({t for t, _ in imports_of(p, set(mods)) if t in mods and t != m}) for m, p in mods.items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for t in graph[m]:
            if t == "train":
                continue
            if state.get(t) == 1:
                cycle = stack[stack.index(t):] + [t]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in graph:
        if m not in state:
            visit(m)


def test_commands_name_themselves_and_modules_stay_small():
    wrong = []
    for mod, path in modules().items():
        n = len(path.read_text().splitlines())
        if n > MAX_LINES:
            wrong.append(f"{path.relative_to(ROOT)}: {n} lines (at most {MAX_LINES}: split it along its seams)")
    for cmd in sorted(commands()):
        doc = ast.get_docstring(ast.parse((TRAIN / f"{cmd.split('.')[1]}.py").read_text())) or ""
        if not doc.startswith(f"python -m {cmd}"):
            wrong.append(f"train/{cmd.split('.')[1]}.py: the docstring must start with `python -m {cmd}` "
                         f"(it starts {doc[:60]!r})")
    assert not wrong, "\n".join(wrong)


def test_package_inits_are_maps():
    wrong = []
    for init in sorted(TRAIN.rglob("__init__.py")):
        mod = module_name(init)
        tree = ast.parse(init.read_text())
        body = tree.body[1:] if tree.body and isinstance(tree.body[0], ast.Expr) else tree.body
        if not ast.get_docstring(tree):
            wrong.append(f"{init.relative_to(ROOT)}: no docstring (a map of the package)")
        if body and mod not in INIT_WITH_CODE:
            wrong.append(f"{init.relative_to(ROOT)}: holds code; an __init__ is a docstring only (no re-exports)")
        for node in body:
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("train"):
                wrong.append(f"{init.relative_to(ROOT)}:{node.lineno}: imports {node.module} at import time")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("command", LIGHT_COMMANDS)
def test_light_commands_import_no_heavy_library(command):
    code = (f"import sys, train.{command}; "
            f"print(','.join(sorted(m for m in {HEAVY!r} if m in sys.modules)))")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "", f"python -m train.{command} imports {r.stdout.strip()} at start"


def test_an_old_module_path_in_a_config_names_where_it_moved():
    from omegaconf import OmegaConf

    from train.errors import ConfigError
    from train.trainer.config_checks import check_moved_names

    old = OmegaConf.create({"actor_rollout_ref": {"rollout": {"agent": {
        "agent_loop_manager_class": "train.agent_loop.SearchR1AgentLoopManager"}}}})
    with pytest.raises(ConfigError, match=r"agent_loop_manager_class=.*moved to "
                                          r"train\.search_r1\.rollout_manager\.SearchR1AgentLoopManager"):
        check_moved_names(old)
    with pytest.raises(ConfigError, match=r"custom_reward_function\.path.*pkg://train\.search_r1\.reward"):
        check_moved_names(OmegaConf.create({"custom_reward_function": {"path": "pkg://train.reward"}}))
    check_moved_names(OmegaConf.create({"custom_reward_function": {"path": "pkg://train.search_r1.reward"}}))


# retrieval/: the same rules (size cap, one-way imports, no cycle, commands apart), over a flat package ---------

RETRIEVAL = ROOT / "retrieval"
#: The import order of retrieval/ (a module imports only lower levels); commands sit above them all.
RETRIEVAL_LEVELS = {
    "errors": -1, "flags": -1,
    "client": 0, "corpus": 0, "cuda_arch": 0, "cache": 0, "encoder": 0,
    "flat": 1, "folder": 1,
    "gpu_ivf": 2, "rerank": 2, "bm25": 2, "lucene": 2,
    "dense": 3, "recall": 4, "dense_build": 5, "kinds": 6, "settings": 7, "index": 8, "batching": 8, "app": 9,
    "serving": 10,
}
RETRIEVAL_COMMANDS = {"server", "build", "launch", "hub"}


def retrieval_imports(path: Path) -> list[tuple[str, int]]:
    """The retrieval modules (by short name) and train modules a file imports, anywhere in it, with the line."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [f"{node.module}.{a.name}" if node.module == "retrieval" else node.module for a in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "train":
                out.append(("train", node.lineno))
            elif parts[0] == "retrieval" and len(parts) > 1:
                out.append((parts[1], node.lineno))
    return out


def test_retrieval_modules_are_mapped_small_and_import_one_way():
    wrong = []
    stems = {p.stem for p in RETRIEVAL.glob("*.py")} - {"__init__"}
    unmapped = stems - set(RETRIEVAL_LEVELS) - RETRIEVAL_COMMANDS
    assert not unmapped, f"retrieval/{sorted(unmapped)}: give each a level in RETRIEVAL_LEVELS (or list a command)"
    for path in sorted(RETRIEVAL.glob("*.py")):
        n = len(path.read_text().splitlines())
        if n > MAX_LINES:
            wrong.append(f"retrieval/{path.name}: {n} lines (at most {MAX_LINES}: split it along its seams)")
        if path.stem in RETRIEVAL_COMMANDS or path.stem == "__init__":
            if path.stem in RETRIEVAL_COMMANDS and not (ast.get_docstring(ast.parse(path.read_text())) or ""):
                wrong.append(f"retrieval/{path.name}: a command needs a docstring")
            continue
        for target, line in retrieval_imports(path):
            where = f"retrieval/{path.name}:{line}"
            if target == "train":
                wrong.append(f"{where}: imports train (retrieval/ stands alone; train imports retrieval.client)")
            elif target in RETRIEVAL_COMMANDS:
                wrong.append(f"{where}: imports the command retrieval.{target}")
            elif target not in RETRIEVAL_LEVELS:
                wrong.append(f"{where}: imports retrieval.{target}, which does not exist")
            elif target != path.stem and RETRIEVAL_LEVELS[target] >= RETRIEVAL_LEVELS[path.stem]:
                wrong.append(f"{where}: retrieval.{path.stem} (level {RETRIEVAL_LEVELS[path.stem]}) imports "
                             f"retrieval.{target} (level {RETRIEVAL_LEVELS[target]}): imports go down only")
    assert not wrong, "\n".join(wrong)


def test_retrieval_init_is_a_map_of_every_module():
    tree = ast.parse((RETRIEVAL / "__init__.py").read_text())
    doc = ast.get_docstring(tree) or ""
    assert len(tree.body) == 1, "retrieval/__init__.py holds its docstring only"
    missing = [p.stem for p in sorted(RETRIEVAL.glob("*.py")) if p.stem != "__init__" and f"{p.stem}" not in doc]
    assert not missing, f"retrieval/__init__.py's map does not name {missing}"
