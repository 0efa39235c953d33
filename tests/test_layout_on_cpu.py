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
LEVELS = {"errors": 0, "files": 0, "search_r1": 1, "llds": 1, "workers": 2, "cpu": 3, "inference": 3, "plugin": 4,
          "trainer": 5, "evaluation": 6, "toy": 6}
COMMAND_LEVEL = 7
#: Files directly in train/ that are not commands.
NOT_COMMANDS = {"__init__", "plugin", "errors", "files"}
#: Commands users run that must not pay for verl, torch, Ray, transformers or Flask (their --help
#: and light work start in well under a second).
LIGHT_COMMANDS = ["data_prep", "geometry", "checkpoints", "rehearsal", "settings", "paper_runs", "plot",
                  "evaluate", "tiny", "learnable", "demo", "cluster_check", "infer"]
HEAVY = ("verl", "torch", "ray", "transformers", "flask")
MAX_LINES = 380
#: __init__.py files that hold code, and why (every other one is a docstring, a map of its package).
INIT_WITH_CODE = {"train.cpu": "register() and enabled(): what verl's plugin entry point calls",
                  "train": "the paths (CONFIG_DIR, DATA_DIR, REPO_ROOT), without an import"}


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
