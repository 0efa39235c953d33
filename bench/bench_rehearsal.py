"""Where a CPU rehearsal of a training launcher spends its time, and whether running two at once helps.

    python bench/bench_rehearsal.py                      # imports and concurrency
    python bench/bench_rehearsal.py --parts imports      # one part
    python bench/bench_rehearsal.py --parts busy --command "make test-vllm"   # busy cores of any command

The CI suite runs 14 training start-ups on 2 cores (the README's launchers, reproduce_paper.sh,
multinode.sh, the fault and resume runs), and ``make test-vllm`` 2 more. This benchmark measures the
two facts that bound its time:

* ``imports``: the CPU one process spends importing what every process of a run imports (verl's
  engine workers and our agent loop: torch, tensordict, transformers, ...), in a fresh interpreter,
  with the heaviest top-level packages from ``python -X importtime``. A run has about 9 such
  processes (train.main, the TaskRunner, 2 WorkerDicts, 2 rollout servers, verl's request load
  balancer, the agent-loop worker, the reward worker).
* ``concurrency``: ``REHEARSAL=cpu bash scripts/train_grpo.sh trainer.total_training_steps=1`` alone,
  then two at once (each with its own checkpoint folder and Ray instance, one BM25 retriever for
  both): wall time, the machine's busy cores over each (/proc/stat), the time to verl's first
  "Training Progress" line (the start-up), and the ratio of two-at-once to twice alone. A ratio near
  1.0 means the runs are CPU-bound and a parallel test runner cannot shorten the suite.
* ``busy``: the wall time of ``--command`` (run with bash in the repository root) and the machine's
  busy cores over it, e.g. ``make test`` or ``make test-vllm``: how much of the 2 cores a suite leaves idle.

Everything is built in a temporary folder: a tiny model (train/tiny.py), the bundled QA as parquet,
a BM25 index of the bundled corpus. Run it on an otherwise idle machine (``make bench`` warns when
it is not).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.run import busy_since, cpu_times  # noqa: E402

IMPORTS = "import verl.workers.engine_workers, train.search_r1.agent_loop"


def bench_imports(repeats: int = 3) -> None:
    walls = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", IMPORTS], cwd=ROOT, check=True, capture_output=True,
                       env={**os.environ, "VERL_PLATFORM": "cpu"})
        walls.append(time.perf_counter() - t0)
    base = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        base.append(time.perf_counter() - t0)
    r = subprocess.run([sys.executable, "-X", "importtime", "-c", IMPORTS], cwd=ROOT, check=True,
                       capture_output=True, text=True, env={**os.environ, "VERL_PLATFORM": "cpu"})
    top: dict[str, int] = {}
    for line in r.stderr.splitlines():
        m = re.match(r"import time:\s+\d+ \|\s+(\d+) \| \s*(\S+)", line)
        if m and "." not in m.group(2) and not m.group(2).startswith("_"):  # packages, wherever first imported
            top[m.group(2)] = max(top.get(m.group(2), 0), int(m.group(1)))
    print(f"\n## imports: `{IMPORTS}` in a fresh interpreter")
    print(f"wall (best of {repeats}): {min(walls):.2f} s; a bare interpreter: {min(base):.2f} s")
    print("heaviest packages (cumulative import time where first imported, s; nested ones count in their parents too):")
    for name, us in sorted(top.items(), key=lambda kv: -kv[1])[:10]:
        print(f"  {name:40s} {us / 1e6:6.2f}")


class Run:
    """One launcher rehearsal; its output is read line by line to time the start-up."""

    def __init__(self, env: dict, ckpt: Path, log: Path):
        self.t0 = time.monotonic()
        self.first_step = None
        self.log = log
        self.proc = subprocess.Popen(["bash", "scripts/train_grpo.sh", "trainer.total_training_steps=1",
                                      f"trainer.default_local_dir={ckpt}"], cwd=ROOT, env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        with open(self.log, "w") as f:
            for line in self.proc.stdout:
                f.write(line)
                if self.first_step is None and "Training Progress:" in line:
                    self.first_step = time.monotonic() - self.t0

    def wait(self) -> tuple[float, float | None]:
        rc = self.proc.wait(timeout=1800)
        self.reader.join(timeout=30)
        if rc != 0:
            raise SystemExit(f"train_grpo.sh rehearsal exited {rc}; its log: {self.log}")
        return time.monotonic() - self.t0, self.first_step


def measured(env: dict, work: Path, count: int, tag: str) -> dict:
    start, t0 = cpu_times(), time.monotonic()
    runs = [Run(env, work / f"ckpt_{tag}{i}", work / f"{tag}{i}.log") for i in range(count)]
    results = [r.wait() for r in runs]
    return {"wall": time.monotonic() - t0, "busy": busy_since(start), "runs": results}


def bench_busy(command: str) -> int:
    start, t0 = cpu_times(), time.monotonic()
    rc = subprocess.run(["bash", "-c", command], cwd=ROOT).returncode
    print(f"\n## busy: `{command}` exited {rc} after {time.monotonic() - t0:.1f} s, "
          f"{busy_since(start):.2f} of {os.cpu_count()} cores busy on average")
    return rc


def bench_concurrency(work: Path) -> None:
    from retrieval.bm25 import build_bm25
    from retrieval.client import wait_healthy
    from train.data_prep import main as prep
    from train.toy.tiny_model import build_tiny_model

    model = build_tiny_model(work / "model", ROOT / "data" / "corpus.jsonl")
    prep(["--out", str(work / "data"), "--local", str(ROOT / "data" / "qa.jsonl"), "--holdout", "10"])
    index = build_bm25(str(ROOT / "data" / "corpus.jsonl"), str(work / "bm25"), progress=False)
    with socket.socket() as s:  # a free port for the retriever
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "retrieval.server", "--index", str(index), "--port", str(port)],
                              cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        if not wait_healthy(f"http://127.0.0.1:{port}", 120, interval=0.5, pid=server.pid):
            raise SystemExit("the BM25 retriever did not come up")
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "disabled",
               "REHEARSAL": "cpu", "MODEL": str(model), "DATA_DIR": str(work / "data"),
               "RETRIEVER_URL": f"http://127.0.0.1:{port}/retrieve"}
        alone = measured(env, work, 1, "alone")
        both = measured(env, work, 2, "both")
    finally:
        server.terminate()
        server.wait(timeout=30)
    print("\n## concurrency: `REHEARSAL=cpu bash scripts/train_grpo.sh trainer.total_training_steps=1`")
    print("| runs at once | wall s | busy cores | start-up s (to the first step) |")
    print("| ---: | ---: | ---: | ---: |")
    for n, m in ((1, alone), (2, both)):
        starts = ", ".join(f"{s:.0f}" if s is not None else "?" for _, s in m["runs"])
        print(f"| {n} | {m['wall']:.1f} | {m['busy']:.2f} | {starts} |")
    print(f"two at once / twice alone: {both['wall'] / (2 * alone['wall']):.2f} "
          f"(1.00: no gain from running them side by side)")


PARTS = ("imports", "concurrency", "busy")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", default="imports,concurrency", help=f"comma-separated, of {', '.join(PARTS)}")
    ap.add_argument("--command", help="the command the busy part runs (bash, in the repository root)")
    args = ap.parse_args(argv)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown or not parts:
        ap.error(f"--parts: unknown or no part(s) {', '.join(unknown)!r}; choose from {', '.join(PARTS)}")
    if ("busy" in parts) != bool(args.command):
        ap.error("--command goes with --parts busy, and the busy part needs a --command")
    if "imports" in parts:
        bench_imports()
    if "concurrency" in parts:
        work = Path(tempfile.mkdtemp(prefix="bench_rehearsal_"))
        try:
            bench_concurrency(work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return bench_busy(args.command) if "busy" in parts else 0


if __name__ == "__main__":
    sys.exit(main())
