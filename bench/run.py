"""``make bench``: every benchmark part in its own process, with its peak memory, on a machine checked
for other load first.

    python bench/run.py                    # all parts below
    python bench/run.py --parts retrieval:encoder,eval:hf_engine

Before each part the machine's load is sampled for a second (/proc/stat): when processes outside
this run keep more than ``--busy`` cores busy, a WARNING says so, since ratios measured beside other
work are off (a busy run once printed "2.88 of the encoder limit", a ratio that cannot exceed 1).
Each part runs as ``python bench/<script> --parts <part>`` (or the script's own flags) in a child
process; its peak resident memory is that process's high-water mark (``VmHWM`` in /proc, read as it
exits; a fresh address space, so neither this runner's memory nor another part's is in it; processes
the part starts itself are not counted). A summary table ends the run.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: part name -> the command (relative to the repository root)
PARTS = {
    "retrieval:concurrency": "bench/bench_retrieval.py --parts concurrency",
    "retrieval:encoder": "bench/bench_retrieval.py --parts encoder",
    "retrieval:build": "bench/bench_retrieval.py --parts build",
    "retrieval:scale": "bench/bench_retrieval.py --parts scale --scale-n 200000",
    "llds": "bench/bench_llds.py",
    "eval:hf_engine": "bench/bench_eval.py --parts hf_engine",
    "eval:engines": "bench/bench_eval.py --parts engines",
    "attention": "bench/bench_attention.py --heads 4 --kv-heads 1",
}


def cpu_times() -> tuple[float, float]:
    with open("/proc/stat") as f:
        fields = [float(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)  # idle + iowait
    return sum(fields), idle


def busy_since(start: tuple[float, float]) -> float:
    """Cores kept busy by everything on the machine since ``start = cpu_times()``."""
    total0, idle0 = start
    total1, idle1 = cpu_times()
    span = total1 - total0
    if span <= 0:
        return 0.0
    return (1.0 - (idle1 - idle0) / span) * (os.cpu_count() or 1)


def busy_cores(seconds: float = 1.0) -> float:
    """Cores kept busy over ``seconds`` by everything on the machine (this process sleeps)."""
    start = cpu_times()
    time.sleep(seconds)
    return busy_since(start)


#: Runs a benchmark script as __main__ and, as it exits, writes its peak RSS (kB) to the file in argv[1].
_WRAPPER = """
import atexit, runpy, sys
out, script = sys.argv[1], sys.argv[2]
def peak():
    with open("/proc/self/status") as f:
        kb = next(line.split()[1] for line in f if line.startswith("VmHWM:"))
    with open(out, "w") as g:
        g.write(kb)
atexit.register(peak)
sys.argv = sys.argv[2:]
sys.path.insert(0, str(__import__("pathlib").Path(script).resolve().parent))
runpy.run_path(script, run_name="__main__")
"""


def run_part(name: str, command: str) -> tuple[int, float, float]:
    """(exit status, wall seconds, peak RSS in MiB) of one part in its own process."""
    import tempfile

    with tempfile.NamedTemporaryFile("r", suffix=".peak") as peak:
        args = shlex.split(command)
        if args[0] == "-c":  # a bare snippet (tests): run it as a script file
            script = Path(peak.name + ".py")
            script.write_text(args[1])
            args = [str(script), *args[2:]]
        t0 = time.perf_counter()
        rc = subprocess.run([sys.executable, "-c", _WRAPPER, peak.name, *args], cwd=ROOT).returncode
        wall = time.perf_counter() - t0
        text = Path(peak.name).read_text().strip()
        Path(peak.name + ".py").unlink(missing_ok=True)
    return rc, wall, (int(text) / 1024 if text else float("nan"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, from: {', '.join(PARTS)}")
    ap.add_argument("--busy", type=float, default=0.3, help="cores of outside load that trigger the warning")
    args = ap.parse_args(argv)
    parts = [p for p in args.parts.split(",") if p]
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        ap.error(f"unknown part(s) {', '.join(unknown)}; known: {', '.join(PARTS)}")
    if args.busy < 0:
        ap.error("--busy must be >= 0")
    rows, warned = [], []
    for name in parts:
        load = busy_cores()
        if load > args.busy:
            warned.append(name)
            print(f"WARNING: the machine is busy before {name}: {load:.2f} of {os.cpu_count()} cores in use by other "
                  f"processes; its timings and ratios are not comparable (stop the other work and rerun)",
                  file=sys.stderr, flush=True)
        print(f"\n==== {name}: python {PARTS[name]}", flush=True)
        rc, wall, rss = run_part(name, PARTS[name])
        rows.append((name, rc, wall, rss, load))
    print("\n| part | exit | wall s | peak RSS MiB | busy cores before |\n| --- | ---: | ---: | ---: | ---: |")
    for name, rc, wall, rss, load in rows:
        print(f"| {name} | {rc} | {wall:.1f} | {rss:.0f} | {load:.2f} |")
    if warned:
        print(f"WARNING: measured on a busy machine: {', '.join(warned)}", file=sys.stderr)
    return 0 if all(rc == 0 for _, rc, *_ in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
