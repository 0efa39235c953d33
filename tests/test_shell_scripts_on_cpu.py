"""The shell scripts and the Makefile call Python that exists.

A module moved inside the project broke `make demo` at its last stage (`from train import protocol` in a
heredoc of scripts/demo.sh) while every test passed: no test ran that snippet. So, over every shell file
the project ships (scripts/, retrieval_launch.sh, bench/*.sh, .ci/*.sh, data/*.sh, .ci/run) and the Makefile:

* no Python heredoc (``python - <<EOF``): glue lives in a module the suite imports;
* each ``python -c '...'`` compiles, and every module it imports resolves (names included:
  ``from X import Y`` needs Y); one that imports the project is listed below with the run that
  executes it;
* each ``python -m X`` names a module that resolves;
* each project file a script names (``scripts/step_metrics.py``, ``bench/run.py``...) exists.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROJECT = {"train", "retrieval", "bench", "tests"}
#: modules of a stack that .venv lacks on purpose; the scripts check for them first (need_stack)
OPTIONAL = {"vllm"}
#: `python -c` snippets that import the project, and what executes them on every CI run
EXECUTED = {
    "scripts/_python.sh": "every launcher sources it to pick its Python (tests/test_journeys_on_cpu.py)",
    ".ci/install_vllm_env.sh": "the last step of the .venv-vllm install that .ci/run makes",
}
# a python interpreter as the scripts spell it: python, python3, "$PY", $(PY), "$VENV/bin/python", $PYTHON,
# and "$1" (scripts/_python.sh's _has_project, which is handed one)
PYTHON = r"""(?:\bpython3?\b|\$\{?PY\b\}?|\$\(PY\)|\$\{?PYTHON\b\}?|/bin/python\b|"\$1)"?"""
HEREDOC = re.compile(PYTHON + r"""[^\n]*?\s-\s[^\n]*<<-?\s*['"]?(\w+)""")
DASH_C = re.compile(PYTHON + r"""\s+-c\s+(?:"((?:[^"\\]|\\.)*)"|'([^']*)')""")
DASH_M = re.compile(PYTHON + r"""\s+(?:-[A-Za-z]\s+)*-m\s+([A-Za-z_][\w.]*)""")
PATH = re.compile(r"""(?<![\w/$.-])((?:scripts|bench|\.ci|train|retrieval|tests)/[\w./-]*\w\.(?:py|sh|yaml))\b""")


def shell_files() -> list[Path]:
    files = [*ROOT.glob("scripts/*.sh"), ROOT / "retrieval_launch.sh", *ROOT.glob("bench/*.sh"),
             *ROOT.glob(".ci/*.sh"), *ROOT.glob("data/*.sh"), ROOT / ".ci" / "run", ROOT / "Makefile"]
    return sorted(f for f in files if f.is_file())


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def resolves(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package that does not exist
        return False


def unresolved_imports(code: str) -> list[str]:
    """The imports of a snippet that would fail here: ``module`` or ``module.name``."""
    bad = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            bad += [a.name for a in node.names if a.name.split(".")[0] not in OPTIONAL and not resolves(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] not in OPTIONAL:
            if not resolves(node.module):
                bad.append(node.module)
                continue
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                if resolves(sub):
                    continue
                if not hasattr(importlib.import_module(node.module), a.name):
                    bad.append(sub)
    return bad


def imported_roots(code: str) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def snippets(path: Path) -> list[tuple[int, str]]:
    """``(line, code)`` of each ``python -c`` in a file; code with a shell substitution is left out."""
    out = []
    text = path.read_text()
    for m in DASH_C.finditer(text):
        code = m.group(1) if m.group(1) is not None else m.group(2)
        if m.group(1) is not None:
            code = code.replace('\\"', '"').replace("\\$", "$")
        if "$" in code:  # e.g. "import $m": built by the shell
            continue
        out.append((text.count("\n", 0, m.start()) + 1, code))
    return out


def test_the_scan_sees_what_it_must():
    """The patterns find the forms the scripts use (a scan that matched nothing would pass anything)."""
    text = ('"$PY" - "$A" <<\'PYEOF\'\nprint(1)\nPYEOF\n'
            '$(PY) -m pytest -q\n"$VENV/bin/python" -c "import json; print(1)"\n'
            '(cd / && "$1" -c "import train") >/dev/null\n'
            'Q=$("$PY" -c \'import sys\' x)\nexec "$PY" -m train.main --config-name x\n"$PY" scripts/step_metrics.py\n')
    assert [m.group(1) for m in HEREDOC.finditer(text)] == ["PYEOF"]
    assert [m.group(1) for m in DASH_M.finditer(text)] == ["pytest", "train.main"]
    assert [(m.group(1), m.group(2)) for m in DASH_C.finditer(text)] == [("import json; print(1)", None),
                                                                          ("import train", None), (None, "import sys")]
    assert PATH.findall(text) == ["scripts/step_metrics.py"]
    assert unresolved_imports("from train import protocol\nimport json") == ["train.protocol"]
    assert unresolved_imports("from train.search_r1 import protocol\nfrom retrieval.client import nope") == \
        ["retrieval.client.nope"]
    assert set(map(rel, shell_files())) >= {"scripts/demo.sh", "retrieval_launch.sh", "bench/gpu_check.sh",
                                             "Makefile", ".ci/run", ".ci/install_vllm_env.sh"}


def test_no_python_heredoc_in_a_shell_script():
    found = [f"{rel(p)}: {m.group(0).strip()}" for p in shell_files() for m in HEREDOC.finditer(p.read_text())]
    assert not found, "move this Python into a module the suite imports (e.g. python -m train.demo):\n" + \
        "\n".join(found)


@pytest.mark.parametrize("path", shell_files(), ids=rel)
def test_inline_python_compiles_and_its_imports_resolve(path):
    for line, code in snippets(path):
        where = f"{rel(path)}:{line}: python -c {code!r}"
        compile(code, where, "exec")
        assert not unresolved_imports(code), f"{where} imports what does not exist: {unresolved_imports(code)}"
        if imported_roots(code) & PROJECT:
            assert rel(path) in EXECUTED, f"{where} imports the project and no test runs it: move it into a module"


@pytest.mark.parametrize("path", shell_files(), ids=rel)
def test_every_python_dash_m_module_exists(path):
    text = path.read_text()
    modules = {m.group(1) for m in DASH_M.finditer(text)}
    missing = sorted(m for m in modules if m.split(".")[0] not in OPTIONAL and not resolves(m))
    assert not missing, f"{rel(path)} runs python -m {missing}, which do not exist"


@pytest.mark.parametrize("path", shell_files(), ids=rel)
def test_every_project_file_a_script_names_exists(path):
    missing = sorted({p for p in PATH.findall(path.read_text()) if not (ROOT / p).exists()})
    assert not missing, f"{rel(path)} names {missing}, which do not exist"


def test_every_snippet_that_imports_the_project_is_accounted_for():
    """The list above holds no file that no longer has such a snippet (it would excuse the next one)."""
    have = {rel(p) for p in shell_files() if any(imported_roots(c) & PROJECT for _, c in snippets(p))}
    assert have == set(EXECUTED), have ^ set(EXECUTED)


#: scripts/train_<name>.sh -> the preset it runs; the body is the same for each, with an optional MODEL default
LAUNCHERS = {"train_grpo.sh": "grpo", "train_llds.sh": "grpo_llds", "train_llds_r.sh": "grpo_llds_r",
             "train_llds_ma.sh": "grpo_llds_ma", "train_gspo_llds.sh": "gspo_llds", "train_ppo.sh": "ppo",
             "train_drift.sh": "grpo_drift"}


def test_every_launcher_is_the_shared_body_with_its_own_preset():
    """The journeys run train_drift.sh, train_llds_ma.sh, train_gspo_llds.sh and train_ppo.sh for a step and
    reproduce_paper.sh's ``run_preset grpo`` end to end; the other launchers are that same body, so this
    is what keeps them runnable: nothing but the body, an optional MODEL default, and their own preset."""
    from train.settings import PRESETS

    assert set(LAUNCHERS.values()) == set(PRESETS) | {"grpo_drift"}  # the paper's presets and SAPO's
    assert {p.name for p in (ROOT / "scripts").glob("train_*.sh")} == set(LAUNCHERS)
    body = ["set -euo pipefail", 'cd "$(dirname "$0")/.."', "source scripts/_common.sh"]
    for name, preset in LAUNCHERS.items():
        lines = [ln.strip() for ln in (ROOT / "scripts" / name).read_text().splitlines()
                 if ln.strip() and not ln.strip().startswith("#")]
        rest = [ln for ln in lines if ln not in body]
        assert [ln for ln in lines if ln in body] == body, name
        assert rest[-1] == f'run_preset {preset} "$@"' and lines[-1] == rest[-1], name
        assert all(re.fullmatch(r'(MODEL=\$\{MODEL:-[\w./-]+\}|: "\$\{MODEL:=[\w./-]+\}")(\s+#.*)?', ln)
                   for ln in rest[:-1]), (name, rest)
