"""Every word a user reads points at something that exists: across every ``*.md`` of the tree and the
comments, docstrings, messages and YAML of the code,

* a section named by title (``README "GPU memory"``, ``docs/retrieval.md, "Build an IVF-PQ index"``)
  is a heading of that file;
* a project path (``train/evaluation/runner.py``, ``scripts/demo.sh``, ``docs/cpu.md``) exists, and
  no text sends a user outside the project (``../shared``);
* a ``--flag`` written after a command (``python -m retrieval.server --max-batch``,
  ``infer.py --file``) is a flag of that command (its ``--help``).

Links in markdown are checked by tests/test_docs_on_cpu.py; this file checks the words around them.
"""

from __future__ import annotations

import functools
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SKIP_PARTS = {"runs", "build", "node_modules", "__pycache__", "wandb", "outputs"}
CODE_SUFFIXES = {".py", ".sh", ".yaml", ".yml", ".toml", ".cfg"}


def tree_files(suffixes: set[str]) -> list[Path]:
    out = []
    for p in sorted(ROOT.rglob("*")):
        rel_parts = p.relative_to(ROOT).parts
        if any(x.startswith(".") and x != ".ci" for x in rel_parts) or SKIP_PARTS & set(rel_parts) \
                or any(x.endswith(".egg-info") for x in rel_parts):
            continue
        if p.is_file() and (p.suffix in suffixes or p.name in {"Makefile", "run"} and "." not in p.name):
            out.append(p)
    return out


def md_files() -> list[Path]:
    return tree_files({".md"})


def code_files() -> list[Path]:
    return [p for p in tree_files(CODE_SUFFIXES | {""}) if p.name != "test_references_on_cpu.py"]


def rel(p: Path) -> str:
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p)


def lines_of(files: list[Path]):
    for f in files:
        for i, line in enumerate(f.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            yield f, i, line


# --------------------------------------------------------------------------------------------------
# sections named by title
# --------------------------------------------------------------------------------------------------

DOC = r"(README(?:\.md)?|CONTRIBUTING(?:\.md)?|docs/[\w-]+\.md|bench/RESULTS\.md)"
SECTION = re.compile(DOC + r"""(?:'s)?,?\s+(?:section\s+|heading\s+)?"""
                     r"""(?:"([^"\n]{3,90})"|'([^'\n]{3,90})'|“([^”\n]{3,90})”)""")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")


def normal(title: str) -> str:
    return re.sub(r"[^\w]+", " ", title.replace("`", "").lower()).strip()


@functools.lru_cache(maxsize=None)
def headings(doc: str) -> frozenset[str]:
    path = ROOT / (doc if doc.endswith(".md") else doc + ".md")
    if not path.is_file():
        return frozenset()
    return frozenset(normal(m.group(1)) for line in path.read_text(encoding="utf-8").splitlines()
                     if (m := HEADING.match(line)))


def section_problems(files: list[Path]) -> list[str]:
    bad = []
    for f, i, line in lines_of(files):
        for m in SECTION.finditer(line):
            doc, title = m.group(1), m.group(2) or m.group(3) or m.group(4)
            t = normal(title)
            if not any(h == t or h.startswith(t + " ") for h in headings(doc)):  # a title, or its start
                bad.append(f"{rel(f)}:{i}: {doc} has no heading {title!r}")
    return bad


def test_every_section_named_by_title_exists():
    bad = section_problems(md_files() + code_files())
    assert not bad, "sections named that no document has:\n" + "\n".join(bad)


# --------------------------------------------------------------------------------------------------
# paths
# --------------------------------------------------------------------------------------------------

PATH = re.compile(r"(?<![\w./~$@{-])((?:train|retrieval|scripts|bench|docs|tests|ci|data|\.ci)/"
                  r"(?:[\w.-]+/)*[\w-]+(?:\.(?:py|sh|md|yaml|json|txt|toml)\b|/))")
#: where the project writes or downloads (named in docs, made by a run): not in a checkout
GENERATED = ("data/processed/", "data/wiki18/")
#: a placeholder a user fills in (configs/NAME.yaml), not a path
PLACEHOLDER = re.compile(r"NAME|(?:^|[/_])[NX](?:[/._]|$)")
#: another project's files (Search-R1's scripts/data_process/nq.py), named as theirs
THEIRS = re.compile(r"(Search-R1|verl|vLLM|LLDS release|FlashRAG)'s[\W#:]*$|\bits\W*$")
OUTSIDE = re.compile(r"(?<![\w.])\.\./shared\b|(?<![\w/])shared/data/|steering repositor")


def path_problems(files: list[Path]) -> list[str]:
    bad = []
    prev = ""
    for f, i, line in lines_of(files):
        before = (prev if i > 1 else "") + " "
        prev = line
        for m in PATH.finditer(line):
            p = m.group(1)
            if p.startswith(GENERATED) or "*" in p or PLACEHOLDER.search(p) \
                    or THEIRS.search(before + line[:m.start()]):
                continue
            if not (ROOT / p).exists():
                bad.append(f"{rel(f)}:{i}: {p} does not exist")
        if OUTSIDE.search(line):
            bad.append(f"{rel(f)}:{i}: points outside the project: {line.strip()[:100]}")
    return bad


def test_every_project_path_named_exists():
    """(The tests themselves name paths that do not exist on purpose: they are left out.)"""
    bad = path_problems(md_files() + [f for f in code_files() if not rel(f).startswith("tests/")])
    assert not bad, "paths that do not exist (or lie outside the project):\n" + "\n".join(bad)


# --------------------------------------------------------------------------------------------------
# flags after a command
# --------------------------------------------------------------------------------------------------

COMMAND = re.compile(r"(?<![\w./-])(?:python3?\s+(?:-m\s+)?)?((?:train|retrieval)\.[a-z_][\w.]*|infer\.py|"
                     r"bench/\w+\.py|scripts/\w+\.py)")
END = re.compile(r"[`)\"';|]|&&|\s-{2}\s|$")
FLAG = re.compile(r"(?<![\w-])(--[a-z][\w-]*)")
#: commands whose flags are not argparse's (Hydra), or that are not commands
NOT_ARGPARSE = {"train.main", "train.plugin", "train.errors", "train.files"}


@functools.lru_cache(maxsize=None)
def flags_of(command: str) -> frozenset[str]:
    """Every flag of a command's --help, its subcommands' included (empty: not a command)."""
    if command.endswith(".py"):
        if not (ROOT / command).is_file():
            return frozenset()
        base = [sys.executable, command]
    else:
        path = ROOT.joinpath(*command.split("."))
        if not (path.with_suffix(".py").is_file() or (path / "__main__.py").is_file()):
            return frozenset()
        base = [sys.executable, "-m", command]
    def help_of(*extra):  # stdout and stderr (an engine worker keeps stdout for its answers)
        r = subprocess.run([*base, *extra, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=180)
        return r.stdout + r.stderr

    text = help_of()
    subs = re.search(r"^usage:.*?\{([\w,-]+)\}", text, flags=re.S | re.M)
    for sub in (subs.group(1).split(",") if subs else []):
        text += help_of(sub)
    return frozenset(FLAG.findall(text)) | {"--help"}


def attributed_flags(line: str) -> list[tuple[str, str]]:
    """``(command, flag)`` for each ``--flag`` written after a command, up to the end of its code span,
    sentence part or shell command."""
    out = []
    matches = list(COMMAND.finditer(line))
    for k, m in enumerate(matches):
        stop = matches[k + 1].start() if k + 1 < len(matches) else len(line)
        tail = line[m.end():stop]
        end = END.search(tail)
        out += [(m.group(1), f) for f in FLAG.findall(tail[:end.start() if end else len(tail)])]
    return out


def flag_problems(files: list[Path]) -> list[str]:
    bad = []
    for f, i, line in lines_of(files):
        for command, flag in attributed_flags(line):
            if command in NOT_ARGPARSE or command.startswith(("train.main", "retrieval.client.")):
                continue
            known = flags_of(command)
            if known and flag not in known:
                bad.append(f"{rel(f)}:{i}: {command} has no flag {flag}")
    return bad


@pytest.mark.slow  # one --help per command named (about 40 s on 2 cores)
def test_every_flag_written_after_a_command_is_one_of_its_flags():
    bad = flag_problems(md_files() + code_files())
    assert not bad, "flags that their command does not have:\n" + "\n".join(bad)


# --------------------------------------------------------------------------------------------------
# the checks catch what they are for
# --------------------------------------------------------------------------------------------------

def test_the_checks_catch_stale_words(tmp_path):
    f = tmp_path / "x.py"
    f.write_text('"""See the README, "Install on GPU machines", and README "Try it on a CPU: two commands".\n'
                 "Details in train/evaluation/nowhere.py and train/evaluation/runner.py; "
                 "the bundled files are in ../shared/data.\n"
                 "Longest query (``retrieval.server --max-query-chars``); ``python -m retrieval.server --port``.\n"
                 '"""\n')
    orig = ROOT
    try:
        sections = section_problems([f])
        paths = path_problems([f])
    finally:
        assert ROOT == orig
    assert len(sections) == 1 and "no heading 'Install on GPU machines'" in sections[0], sections
    assert any("train/evaluation/nowhere.py does not exist" in p for p in paths), paths
    assert any("outside the project" in p for p in paths), paths
    assert not any("runner.py does not exist" in p for p in paths), paths
    assert attributed_flags(f.read_text().splitlines()[2]) == [("retrieval.server", "--max-query-chars"),
                                                              ("retrieval.server", "--port")]
    assert attributed_flags("`python -m train.evaluate --limit 2` then `infer.py --file q.jsonl --out a`") == \
        [("train.evaluate", "--limit"), ("infer.py", "--file"), ("infer.py", "--out")]
    assert attributed_flags("python infer.py 'q' -- --not-ours; python -m train.demo check --steps 3") == \
        [("train.demo", "--steps")]


# --------------------------------------------------------------------------------------------------
# facts that went stale once, and the bundled data's counts
# --------------------------------------------------------------------------------------------------

#: statements that were true once and are not now: (pattern, what is true)
NO_LONGER_TRUE = [
    (r"hf.{0,40}rollout.{0,80}transformers'?\s*`?generate|hf: transformers generate",
     "the hf rollout serves the batched engine (train/inference/hf_engine.py), not transformers' generate"),
    (r"80 GB[^|\n]{0,60}\bT4\b", "a T4 has 16 GB: the 80 GB GPUs are A100 80 GB, H100, H200 (B200: more)"),
    (r"eval_steps", "the checkpoint sweep writes CKPT_DIR/eval/ (its default), reproduce_paper.sh too"),
]


def test_no_statement_that_is_no_longer_true():
    bad = []
    for f, i, line in lines_of(md_files() + code_files()):
        for pattern, truth in NO_LONGER_TRUE:
            if re.search(pattern, line, flags=re.IGNORECASE) and f.name != "test_references_on_cpu.py":
                bad.append(f"{rel(f)}:{i}: {line.strip()[:100]}\n    -> {truth}")
    assert not bad, "\n".join(bad)


def test_no_test_reads_outside_the_project():
    """A test that reads a file beside the checkout (../shared) skips, or fails, in every fresh clone."""
    bad = [f"{rel(f)}:{i}: {line.strip()}" for f, i, line in lines_of(sorted((ROOT / "tests").rglob("*.py")))
           if re.search(r"\bROOT\.parent\b|parents\[[3-9]\]|\.parent\.parent\.parent", line)
           and f.name != "test_references_on_cpu.py"]
    assert not bad, "\n".join(bad)


def test_the_data_readme_lists_the_bundled_files_with_their_counts():
    text = (ROOT / "data" / "README.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `([\w.]+)` \| ([\d,]+) (\w+) \|", text, flags=re.M)
    assert {r[0] for r in rows} == {"corpus.jsonl", "qa.jsonl"}, rows
    for name, count, _ in rows:
        n = sum(1 for line in open(ROOT / "data" / name, encoding="utf-8") if line.strip())
        assert n == int(count.replace(",", "")), f"data/README.md says {count} for {name}; the file has {n}"
    import json

    paper = json.loads((ROOT / "train" / "evaluation" / "paper_results.json").read_text())
    m = re.search(r"`train/evaluation/paper_results.json` \((\d+) rows", text)
    assert m and int(m.group(1)) == len(paper["rows"]), (m and m.group(0), len(paper["rows"]))
