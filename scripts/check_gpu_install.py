"""Resolve the GPU install without installing it, and check what a GPU user would get.

    python scripts/check_gpu_install.py [--extras gpu,lucene,dev] [--report FILE]
    make check-gpu-install

Runs ``pip install --dry-run --ignore-installed --report`` of ``.[gpu,lucene,dev]`` (what the README
and environment.yml install) for this machine's platform, which must be Linux x86_64 with a Python
the project supports, and asserts:

- exactly one FAISS distribution, the GPU one (faiss-cpu and faiss-gpu-* share the ``faiss/`` package);
- the attention backend the presets name is there: ``sdpa`` ships with torch; ``flash_attention_2``
  would need flash-attn, which has no binary wheel on PyPI, so it must not be the preset default;
- the torch / vLLM pair verl 0.9.1's vLLM extra pins (torch 2.11.0, vllm 0.24.0), and a transformers
  inside verl's range.

Needs PyPI (package metadata only: about 1-2 minutes). Exit 0 when every check passes.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXPECTED = {"torch": "2.11.0", "vllm": "0.24.0"}
TRANSFORMERS_RANGE = ((5, 5, 3), (5, 11, 0))  # verl 0.9.1: >=5.5.3, <5.11 (and != 5.6.0)


def resolve(extras: str, report: Path) -> dict[str, str]:
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
           "--disable-pip-version-check", "--report", str(report), f"{ROOT}[{extras}]"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        err = "\n".join(line for line in r.stderr.splitlines() if "is ignored: it is neither" not in line)
        raise SystemExit(f"pip could not resolve .[{extras}]:\n{err[-4000:]}")
    data = json.loads(report.read_text())
    return {i["metadata"]["name"].lower().replace("_", "-"): i["metadata"]["version"] for i in data["install"]}


def preset_attention() -> set[str]:
    import yaml

    found = set()
    for path in sorted((ROOT / "configs").glob("*.yaml")):
        if path.name == "cpu_smoke.yaml":
            continue
        text = yaml.safe_load(path.read_text()) or {}
        for section in (text.get("actor_rollout_ref", {}).get("model", {}), text.get("critic", {}).get("model", {})):
            impl = (section.get("override_config") or {}).get("attn_implementation")
            if impl:
                found.add(impl)
    return found


def check(dists: dict[str, str], attention: set[str]) -> list[str]:
    problems = []
    faiss = sorted(n for n in dists if n == "faiss" or n.startswith("faiss-"))
    if len(faiss) != 1:
        problems.append(f"expected exactly one FAISS distribution, got {faiss or 'none'}")
    elif "gpu" not in faiss[0] and "cuda" not in faiss[0]:
        problems.append(f"the GPU install resolves a CPU FAISS ({faiss[0]}): RETRIEVER=e5 would have no GPU support")
    for name, version in EXPECTED.items():
        if dists.get(name) != version:
            problems.append(f"{name}: expected {version} (verl 0.9.1's vLLM extra), got {dists.get(name)}")
    tf = dists.get("transformers")
    if tf is None:
        problems.append("transformers is not resolved")
    else:
        v = tuple(int(x) for x in tf.split(".")[:3] if x.isdigit())
        if not (TRANSFORMERS_RANGE[0] <= v < TRANSFORMERS_RANGE[1]) or tf == "5.6.0":
            problems.append(f"transformers {tf} is outside verl 0.9.1's range >=5.5.3,<5.11,!=5.6.0")
    if not attention:
        problems.append("no preset sets model.override_config.attn_implementation: verl would default to "
                        "flash_attention_2, which nothing installs")
    for impl in sorted(attention):
        if impl == "flash_attention_2" and "flash-attn" not in dists:
            problems.append("a preset uses flash_attention_2 but flash-attn is not in the install")
        elif impl not in ("sdpa", "eager", "flash_attention_2"):
            problems.append(f"unknown attention backend in a preset: {impl}")
    return problems


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--extras", default="gpu,lucene,dev")
    ap.add_argument("--report", default=None, help="keep pip's JSON report here")
    args = ap.parse_args(argv)
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        print(f"error: resolves for this machine's platform; run it on Linux x86_64 "
              f"(this is {platform.system()} {platform.machine()})", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(args.report or Path(tmp) / "report.json")
        dists = resolve(args.extras, report)
    attention = preset_attention()
    faiss = [f"{n} {v}" for n, v in dists.items() if n.startswith("faiss")]
    print(f".[{args.extras}] resolves {len(dists)} distributions: torch {dists.get('torch')}, vllm "
          f"{dists.get('vllm')}, transformers {dists.get('transformers')}, {', '.join(faiss) or 'no faiss'}; "
          f"flash-attn {'yes' if 'flash-attn' in dists else 'no'}; preset attention {sorted(attention)}")
    problems = check(dists, attention)
    for p in problems:
        print(f"FAIL: {p}", file=sys.stderr)
    if not problems:
        print("ok: one FAISS (GPU), torch/vLLM pair as pinned, attention backend available")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
