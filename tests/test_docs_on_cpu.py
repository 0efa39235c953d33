"""The user docs (every ``*.md`` of the tree: README.md, CONTRIBUTING.md, docs/, bench/RESULTS.md, ...)
hold only commands that run as pasted and links that resolve, and speak about the product, not about
how it is developed (tests/test_references_on_cpu.py checks the sections, paths and flags they name).

Offline, pure Python, no heavy imports: a command is checked by what it names (a script, a make target,
a module), not run.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MAX_README_LINES = 300


def doc_files() -> list[Path]:
    """Every ``*.md`` of the tree (README, CONTRIBUTING, docs/, bench/RESULTS.md, data/README.md, ...)."""
    from tests.test_references_on_cpu import md_files

    return md_files()


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


# --------------------------------------------------------------------------------------------------
# fenced shell blocks -> command lines
# --------------------------------------------------------------------------------------------------

SHELL_LANGS = {"bash", "sh", "shell", "console", "zsh"}
FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*([\w+-]*)")


@dataclass
class Command:
    file: Path
    line: int  # 1-based line of the command's first line
    text: str  # continuation lines joined

    def where(self) -> str:
        return f"{rel(self.file)}:{self.line}: {self.text}"


def shell_commands(path: Path) -> list[Command]:
    """Every command line of every ```bash/sh/shell/console block (backslash continuations joined;
    a console block's `$ ` prompt stripped, its output lines skipped)."""
    out: list[Command] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    fence = lang = None
    pending, start = "", 0
    for i, raw in enumerate(lines, 1):
        m = FENCE.match(raw)
        if fence is None:
            if m:
                fence, lang = m.group(2), m.group(3).lower()
            continue
        if m and raw.strip().startswith(fence[0] * len(fence)) and not m.group(3):
            fence = lang = None
            continue
        if lang not in SHELL_LANGS:
            continue
        text = raw.strip()
        if not pending:
            if lang == "console":
                if not text.startswith("$ "):
                    continue  # output
                text = text[2:]
            if not text or text.startswith("#"):
                continue
            start = i
        if text.endswith("\\"):
            pending += text[:-1] + " "
            continue
        out.append(Command(path, start, pending + text))
        pending = ""
    if pending:
        out.append(Command(path, start, pending))
    return out


# --------------------------------------------------------------------------------------------------
# what a command names
# --------------------------------------------------------------------------------------------------

ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
OPERATORS = {"&&", "||", "|", ";", "&", "|&"}
WRAPPERS = {"time", "nohup", "exec", "sudo", "command", "env"}
PROJECT_PACKAGES = {"train", "retrieval", "bench", "tests", "scripts"}


def simple_commands(text: str) -> list[list[str]]:
    """Split one command line on shell operators into argument lists (comments dropped)."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    parts: list[list[str]] = [[]]
    for tok in lexer:
        if tok in OPERATORS:
            parts.append([])
        else:
            parts[-1].append(tok)
    return [p for p in parts if p]


def strip_prefix(args: list[str]) -> list[str]:
    """Drop leading VAR=value assignments and wrappers (env, time, nohup, timeout N, ip netns exec NS)."""
    i = 0
    while i < len(args):
        a = args[i]
        if ASSIGN.match(a):
            i += 1
        elif a in WRAPPERS:
            i += 1
            while i < len(args) and args[i].startswith("-"):
                i += 1
        elif a == "timeout":
            i += 1
            while i < len(args) and (args[i].startswith("-") or re.fullmatch(r"[\d.]+[smhd]?", args[i])):
                i += 1
        elif a == "ip" and args[i + 1:i + 3] == ["netns", "exec"]:
            i += 4
        else:
            break
    return args[i:]


def make_targets() -> set[str]:
    targets = set()
    for line in (ROOT / "Makefile").read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9_.\-/ ]+?)\s*:(?!=)", line)
        if m and not line.startswith("\t"):
            targets.update(t for t in m.group(1).split() if not t.startswith("$"))
    return targets


def is_python(word: str) -> bool:
    return re.fullmatch(r"python(3(\.\d+)?)?", Path(word).name) is not None


def module_exists(name: str) -> bool:
    """A project module by its file (train/x.py, or a package with __init__.py/__main__.py); any other by
    the installed distribution's files, without importing it (importlib.util.find_spec on a dotted name
    would import the parents)."""
    parts = name.split(".")
    if parts[0] in PROJECT_PACKAGES:
        base = ROOT.joinpath(*parts)
        return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file() \
            or (base / "__main__.py").is_file()
    spec = importlib.util.find_spec(parts[0])
    if spec is None:
        return False
    if len(parts) == 1:
        return True
    for location in spec.submodule_search_locations or []:
        base = Path(location).joinpath(*parts[1:])
        if base.with_suffix(".py").is_file() or (base / "__init__.py").is_file():
            return True
    return False


def is_script_path(word: str) -> bool:
    return word.endswith((".sh", ".py")) or word.startswith("./") or word in {".ci/run"}


def problems_of(cmd: Command, targets: set[str]) -> list[str]:
    bad = []
    try:
        pieces = simple_commands(cmd.text)
    except ValueError as e:  # unbalanced quotes
        return [f"cannot parse ({e})"]
    for args in pieces:
        args = strip_prefix(args)
        if not args:
            continue
        prog, rest = args[0], args[1:]
        if prog in {"bash", "sh"}:
            script = next((a for a in rest if not a.startswith("-")), None)
            if script and not (ROOT / script).is_file():
                bad.append(f"`{prog} {script}`: no such script")
        elif prog == "make":
            for t in rest:
                if t.startswith("-") or "=" in t:
                    continue
                if t not in targets:
                    bad.append(f"`make {t}`: no such target in Makefile")
        elif is_python(prog):
            if "-c" in rest:
                continue
            if "-m" in rest:
                mod = rest[rest.index("-m") + 1] if rest.index("-m") + 1 < len(rest) else ""
                if not mod or not module_exists(mod):
                    bad.append(f"`python -m {mod}`: no such module")
            else:
                script = next((a for a in rest if not a.startswith("-")), None)
                if script and not (ROOT / script).is_file():
                    bad.append(f"`python {script}`: no such file")
        elif "/" in prog and is_script_path(prog):
            if not (ROOT / prog).is_file():
                bad.append(f"`{prog}`: no such script")
        elif prog.endswith((".sh", ".py")):
            bad.append(f"`{prog}`: not runnable as pasted (say `bash {prog}` or `python {prog}`, with its path)")
    return bad


def all_commands() -> list[Command]:
    return [c for f in doc_files() for c in shell_commands(f)]


def test_readme_is_short():
    n = len(README.read_text(encoding="utf-8").splitlines())
    assert n < MAX_README_LINES, \
        f"README.md has {n} lines (the limit is < {MAX_README_LINES}): move details into a docs/ page"


def test_docs_have_shell_blocks():
    """The parser finds the README's commands (a broken fence would silently check nothing)."""
    texts = [c.text for c in shell_commands(README)]
    assert any(t.startswith("make demo") for t in texts), texts
    assert any(t.startswith("make test") for t in texts), texts


def test_every_documented_command_names_what_exists():
    targets = make_targets()
    bad = [f"{c.where()}\n    -> {p}" for c in all_commands() for p in problems_of(c, targets)]
    assert not bad, "commands in fenced shell blocks that do not run as pasted:\n" + "\n".join(bad)


# --------------------------------------------------------------------------------------------------
# links
# --------------------------------------------------------------------------------------------------

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def strip_code(text: str) -> list[str]:
    """The file's lines with fenced blocks blanked and inline code removed (links there are not links)."""
    out, fence = [], None
    for line in text.splitlines():
        m = FENCE.match(line)
        if fence is None and m:
            fence = m.group(2)
            out.append("")
            continue
        if fence is not None:
            if m and not m.group(3) and line.strip().startswith(fence[0] * len(fence)):
                fence = None
            out.append("")
            continue
        out.append(re.sub(r"`[^`]*`", "", line))
    return out


def anchors(path: Path) -> set[str]:
    """GitHub's heading anchors: lower-case, punctuation dropped (inline code keeps its text), spaces to
    hyphens, -1/-2 for repeats."""
    seen: dict[str, int] = {}
    out = set()
    fence = None
    for line in path.read_text(encoding="utf-8").splitlines():
        m = FENCE.match(line)
        if fence is None and m:
            fence = m.group(2)
            continue
        if fence is not None:
            if m and not m.group(3) and line.strip().startswith(fence[0] * len(fence)):
                fence = None
            continue
        h = HEADING.match(line)
        if not h:
            continue
        slug = re.sub(r"[^\w\- ]", "", h.group(2).strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def link_problems(path: Path) -> list[str]:
    bad = []
    for i, line in enumerate(strip_code(path.read_text(encoding="utf-8")), 1):
        for target in LINK.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            file_part, _, frag = target.partition("#")
            dest = path if not file_part else (path.parent / file_part).resolve()
            if not dest.exists():
                bad.append(f"{rel(path)}:{i}: [{target}] -> {file_part}: no such file")
            elif frag and dest.suffix == ".md" and frag not in anchors(dest):
                bad.append(f"{rel(path)}:{i}: [{target}] -> no heading '#{frag}' in {rel(dest)}")
    return bad


def test_every_relative_link_resolves():
    bad = [p for f in doc_files() for p in link_problems(f)]
    assert not bad, "links to files or headings that do not exist:\n" + "\n".join(bad)


# --------------------------------------------------------------------------------------------------
# words about development
# --------------------------------------------------------------------------------------------------

#: phrases that belong to the development log, never to user text (case-insensitive regexes)
DEV_PHRASES = [
    r"\bissue\s*#\s*\d+", r"\bissue \d+\b", r"\bthis session\b", r"\bsessions? so far\b",
    r"\b(first|second|third|fourth|fifth|sixth|seventh|last|previous|next) session\b",
    r"\bthe last review\b", r"\breview pass\b", r"\bround [0-9]\b", r"\bwe fixed\b", r"\bthe brief\b",
    r"\bsteering repository\b", r"\bsessions?\b", r"\bthe issue'?s?\b", r"\b(?:was|were|is|none) lent\b",
    r"\bno GPU lent\b", r"\bsaid before\b", r"\bit now\b",
]


def test_docs_speak_about_the_product():
    bad = []
    for f in doc_files():
        for i, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1):
            for pattern in DEV_PHRASES:
                m = re.search(pattern, line, flags=re.IGNORECASE)
                if m:
                    bad.append(f"{rel(f)}:{i}: '{m.group(0)}' in: {line.strip()[:120]}")
    assert not bad, "words about how the project is developed, in user docs:\n" + "\n".join(bad)


# --------------------------------------------------------------------------------------------------
# the checks themselves catch broken docs
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("line, ok", [
    ("make demo", True),
    ("make no-such-target", False),
    ("bash scripts/train_llds.sh trainer.total_training_steps=2", True),
    ("MODEL=x N_GPUS=8 bash scripts/no_such.sh", False),
    ("RETRIEVER=bm25 bash retrieval_launch.sh &", True),
    ("python -m train.main --config-name grpo_llds", True),
    ("python -m train.no_such_module", False),
    ("python -m pytest -q tests", True),
    ("python infer.py 'Who?'", True),
    ("python no_such.py", False),
    ("ip netns exec A env REHEARSAL=cpu ROLE=head bash scripts/multinode.sh", True),
    ("timeout 60 .venv/bin/python -m retrieval.server --index x", True),
    ("bash scripts/train_grpo.sh | train_llds_r.sh", False),
    ("git clone . /tmp/c && cd /tmp/c && CI=true bash .ci/run", True),
])
def test_command_checker_catches_broken_commands(line, ok):
    got = problems_of(Command(README, 1, line), make_targets())
    assert (not got) == ok, f"{line!r}: {got}"


def test_link_checker_catches_a_broken_link(tmp_path, monkeypatch):
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    (tmp_path / "a.md").write_text("# Top\n\n## How to choose\n\n[ok](b.md) [ok](#top) [bad](c.md) [bad](b.md#nope)\n"
                                   "`[not a link](x.md)`\n")
    (tmp_path / "b.md").write_text("# B\n")
    got = link_problems(tmp_path / "a.md")
    assert len(got) == 2 and "c.md" in got[0] and "#nope" in got[1], got


# --------------------------------------------------------------------------------------------------
# settings tables: the default a page shows is the one configs/_base.yaml sets
# --------------------------------------------------------------------------------------------------

#: a table whose header reads ``| key (`block.*`) | default | ...``
KEY_TABLE = re.compile(r"^\|\s*key \(`(\w+)\.\*`\)\s*\|\s*default\s*\|")
NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:e-?\d+)?")


def default_problems(page: Path, base: dict) -> list[str]:
    """Each row of a key table whose default column disagrees with ``base`` (configs/_base.yaml): a scalar
    must read as the config's value (``true``/``false`` for booleans); a mapping (``name: [a, b]`` items) must
    name the same keys with numbers equal to the config's at the precision written."""
    bad, block = [], None
    for i, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        m = KEY_TABLE.match(line)
        if m:
            block = m.group(1)
            continue
        if block is None or not line.startswith("|"):
            block = None
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        key = cells[0].strip("`")
        if set(key) <= set("- ") or len(cells) < 2:
            continue
        where = f"{rel(page)}:{i}: `{block}.{key}`"
        if key not in (base.get(block) or {}):
            bad.append(f"{where}: configs/_base.yaml has no such key")
            continue
        want, shown = base[block][key], cells[1]
        if isinstance(want, dict):
            items = dict(re.findall(r"`(\w+): \[([^\]]*)\]`", shown))
            if sorted(items) != sorted(want):
                bad.append(f"{where}: shows {sorted(items)}, the config sets {sorted(want)}")
                continue
            for name, text in items.items():
                nums = NUMBER.findall(text)
                ok = len(nums) == len(want[name]) and all(
                    abs(float(n) - float(w)) <= 0.5 * 10 ** -(len(n.split(".")[1]) if "." in n else 0)
                    for n, w in zip(nums, want[name]))
                if not ok:
                    bad.append(f"{where}: shows {name}: [{text}], the config sets {want[name]}")
        else:
            expect = str(want).lower() if isinstance(want, bool) else str(want)
            if shown.strip("`") != expect:
                bad.append(f"{where}: shows {shown}, the config sets {expect}")
    return bad


def test_settings_tables_show_the_configs_defaults():
    import yaml

    base = yaml.safe_load((ROOT / "configs" / "_base.yaml").read_text(encoding="utf-8"))
    pages = [p for p in doc_files()
             if any(KEY_TABLE.match(line) for line in p.read_text(encoding="utf-8").splitlines())]
    assert pages, "no page has a key table any more: the check would check nothing"
    bad = [msg for p in pages for msg in default_problems(p, base)]
    assert not bad, "\n".join(bad)


def test_the_defaults_check_catches_a_stale_level(tmp_path, monkeypatch):
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    base = {"w": {"action": "warn", "enable": True, "levels": {"ratio": [0.057759, 0.086638]}}}
    page = tmp_path / "p.md"
    page.write_text("| key (`w.*`) | default | meaning |\n| --- | --- | --- |\n| `action` | `warn` | x |\n"
                    "| `enable` | true | x |\n| `levels` | `ratio: [0.058, 0.087]`, fitted | x |\n")
    assert default_problems(page, base) == []
    page.write_text(page.read_text().replace("0.058", "0.052").replace("| true |", "| false |")
                    + "\n| key (`w.*`) | default | meaning |\n| `nope` | 1 | x |\n")
    got = default_problems(page, base)
    assert len(got) == 3 and "enable" in got[0] and "ratio" in got[1] and "no such key" in got[2], got
