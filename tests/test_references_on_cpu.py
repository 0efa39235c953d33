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
# pointers: "X is documented in / defined in / see <place>", "X (<path>)": the place holds X
# --------------------------------------------------------------------------------------------------

TARGET = (r"(README(?:\.md)?|CONTRIBUTING(?:\.md)?|(?:train|retrieval|scripts|bench|docs|configs|data)/"
          r"(?:[\w-]+/)*[\w-]+\.(?:py|sh|md|yaml))(?:#([\w-]+))?")
POINTER = re.compile(r"(?:\b(?:documented|described|explained|defined|listed|configured|implemented|lives?|kept|"
                     r"defaults?|are|is)\s+in\s+(?:the\s+)?|\b[Ss]ee\s+(?:the\s+)?|\()" + TARGET + r"(?![\w/])")
#: what a sentence names: `code`, ``code``, :role:`Name`, snake_case words and dotted keys
IDENTIFIER = re.compile(r"`+:?([\w.:/-]+?):?`+|\b([a-z][a-z0-9]*(?:_[a-z0-9]+)+(?:\.[a-z_]\w*)*)\b")
COMMENT = re.compile(r"^\s*(?:#+|//|\*|\"\"\"|''')?\s?")
#: where a sentence (or clause) ends: a full stop, a semicolon, a table cell, an empty line, a bullet, a row of
#: an aligned table
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z(`*])|\s*[;|]\s*|\n\s*\n|\n(?=\s*[-*] |\s*[\w-]+ {2,})")
FILE_NAME = re.compile(r"\.(?:py|sh|md|ya?ml|json|jsonl|txt|toml|parquet|index)$")


@functools.lru_cache(maxsize=None)
def target_text(target: str) -> str | None:
    path = ROOT / (target + ".md" if target in ("README", "CONTRIBUTING") else target)
    return path.read_text(encoding="utf-8", errors="replace") if path.is_file() else None


def prose(path: Path) -> list[str]:
    """Each line's prose: a comment's text, a docstring's or string block's line (Python); code gives ""."""
    out, quote = [], None
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if path.suffix == ".md":
            out.append(line)
            continue
        if path.suffix == ".py":
            marks = re.findall(r'"""|\'\'\'', line)
            if quote or marks:
                text = line.strip().strip("\"'").removeprefix("r").strip("\"'") if marks else line.strip()
                for mark in marks:
                    quote = None if quote == mark else (quote or mark)
                out.append(text)
                continue
        m = re.search(r"(?:^|\s)#+\s?(.*)$", line)
        out.append(m.group(1) if m else "")
    return out


def named_things(sentence: str, targets: set[str]) -> set[str]:
    """The identifiers a sentence names, but not paths, file names, flags, placeholders (global_step_N)."""
    out = set()
    for m in IDENTIFIER.finditer(sentence):
        name = (m.group(1) or m.group(2) or "").strip(".:/")
        if m.group(1) and ":" in m.group(1):  # :class:`train.x.Name` -> Name
            name = name.split(":")[-1].split(".")[-1]
        if len(name) < 3 or "/" in name or name.startswith("-") or FILE_NAME.search(name) or name in targets \
                or PLACEHOLDER.search(name) or name.isdigit():
            continue
        out.add(name)
    return out


def pointer_problems(files: list[Path]) -> list[str]:
    """A pointer to a place must find there what its sentence names (one of the identifiers it names, or
    this file: a place that names it back), and a ``path.md#anchor`` must be a heading of that file. Only
    prose is read (comments, docstrings); a sentence runs over up to three lines."""
    from tests.test_docs_on_cpu import anchors

    bad = []
    for f in files:
        lines = prose(f)
        for i, line in enumerate(lines):
            if not line:
                continue
            before = lines[i - 1] if i else ""
            window = before + "\n" + line + "\n" + (lines[i + 1] if i + 1 < len(lines) else "")
            start = len(before) + 1
            for m in POINTER.finditer(window):
                if not start <= m.start() <= start + len(line):
                    continue  # reported on its own line
                target, anchor = m.group(1), m.group(2)
                text = target_text(target)
                if text is None or THEIRS.search(window[:m.start()]):
                    continue  # a path that does not exist: path_problems says so
                if anchor and target.endswith(".md") and anchor not in anchors(ROOT / target):
                    bad.append(f"{rel(f)}:{i + 1}: {target} has no heading #{anchor}")
                cuts = [0, *(x for c in SENTENCE_END.finditer(window) for x in c.span()), len(window)]
                offset, end = next((a, b) for a, b in zip(cuts[::2], cuts[1::2]) if a <= m.start() <= b)
                sentence = window[offset:end]
                # "X (path): what X does" names X and what follows; "X (path) does ...", "X is in path",
                # "see path" name what comes before
                at = m.start() - offset
                if m.group(0).startswith("(") and not window[m.end():].lstrip(")").startswith(":"):
                    sentence = sentence[:at]
                elif not m.group(0).startswith("("):
                    sentence = sentence[:at]
                things = named_things(sentence, {target})
                if things and not any(t in text for t in things) and f.name not in text:
                    bad.append(f"{rel(f)}:{i + 1}: points at {target} for {', '.join(sorted(things))}, "
                               f"which {target} does not mention")
    return bad


def test_every_pointer_finds_what_it_names():
    """(The tests' docstrings describe loosely what they exercise: they are left out, as for paths.)"""
    bad = pointer_problems(md_files() + [f for f in code_files() if not rel(f).startswith("tests/")])
    assert not bad, "pointers to a place that does not hold what they name:\n" + "\n".join(bad)


def test_the_pointer_check_catches_the_stale_pointers(tmp_path):
    """Three lines that had gone stale: two pointers to a place that no longer holds the thing,
    one statement split over two lines; and their fixed forms pass."""
    stale = tmp_path / "stale.py"
    stale.write_text('"""Configured under ``lld_alarm:`` in the training config (defaults in :class:`AlarmConfig`, '
                     'documented\nin the README). Pure Python.\n"""\n'
                     "# Checkpoint retention (train/checkpoints.py): the newest keep_last global_step_N folders, plus\n"
                     "# keep_steps (scripts/reproduce_paper.sh adds the step it evaluates). 0 or null keeps all.\n"
                     "# the report (docs/training.md#no-such-section) says so\n")
    bad = pointer_problems([stale])
    assert len(bad) == 3, bad
    assert "points at README for AlarmConfig, lld_alarm" in bad[0], bad
    assert "points at train/checkpoints.py for keep_last, keep_steps" in bad[1], bad
    assert "docs/training.md has no heading #no-such-section" in bad[2], bad
    fixed = tmp_path / "fixed.py"
    fixed.write_text('"""Configured under ``collapse_warning:`` in the training config (defaults in '
                     'configs/_base.yaml, documented\nin docs/training.md#collapse-warning). Pure Python.\n"""\n'
                     "# Checkpoint retention (train/trainer/checkpoint_store.py): the newest keep_last global_step_N "
                     "folders, plus\n# keep_steps (scripts/reproduce_paper.sh adds the step it evaluates).\n")
    assert pointer_problems([fixed]) == []
    split = tmp_path / "split.py"
    split.write_text('"""verl\'s FSDP engine for ``cpu``, and an ``hf`` rollout (transformers\ngenerate) behind '
                     'it."""\n')
    assert [line for line, _ in stale_statements([split])] == [1]


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


def stale_statements(files: list[Path]):
    """``(line, truth)`` for each statement of :data:`NO_LONGER_TRUE`, also when it runs over two lines."""
    for f in files:
        text = f.read_text(encoding="utf-8", errors="replace")
        lines = [COMMENT.sub("", line, count=1) for line in text.splitlines()]
        for i, line in enumerate(lines):
            joined = line + " " + (lines[i + 1] if i + 1 < len(lines) else "")
            for pattern, truth in NO_LONGER_TRUE:
                m = re.search(pattern, joined, flags=re.IGNORECASE)
                if m and m.start() <= len(line):  # one that starts on the next line is reported there
                    yield i + 1, f"{rel(f)}:{i + 1}: {line.strip()[:100]}\n    -> {truth}"


def test_no_statement_that_is_no_longer_true():
    bad = [msg for msg in (m for _, m in stale_statements([f for f in md_files() + code_files()
                                                           if f.name != "test_references_on_cpu.py"]))]
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
