"""Evaluation on every GPU of the node: one inference engine per GPU (or per group of
``--tensor-parallel-size`` GPUs), each in its own process, behind the asker interface
(``async ask(question) -> Result``) that :func:`train.evaluation.runner.evaluate` already drives.

Why one process per engine rather than vLLM's own data-parallel engine: an engine that dies (an
out-of-memory, a bad GPU) takes only its process down, its questions go to the others and the run
finishes; the hf backend gets the same split (CPU tests, machines without vLLM); no cross-GPU
communication is needed for data parallelism, so nothing here depends on NCCL or on vLLM's DP
coordinator.

The parent keeps the one results file (:func:`train.evaluation.runner.evaluate` writes it, a row at a time,
flushed), so a worker's death loses no row and writes none twice; the questions it had in flight are
asked again on another engine. Workers get questions on stdin and answer on a private copy of their
stdout (library prints go to their log, ``<out>.engineK.log``).

    python -m train.evaluation.engine_worker --settings JSON   (internal: one engine, AskSettings.to_json())

A worker gets the :class:`~train.inference.settings.AskSettings` whole (no flag is rewritten by hand) and
answers "ready" with the settings it parsed; the pool refuses a worker whose settings differ.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Optional

from train.errors import EngineDead, InferenceError
from train.inference.asker import Result
from train.inference.backends import vllm_engine_env
from train.inference.settings import AskSettings


class EnginesDown(EngineDead):
    """Every engine died; the rows already written are kept."""


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES names them (empty without CUDA). Asked
    without initialising CUDA here (:mod:`train.inference.cuda_probe`): with one engine, this process builds it."""
    from train.inference.cuda_probe import gpu_count

    n = gpu_count()
    if not n:
        return []
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    names = [d.strip() for d in env.split(",") if d.strip()] if env else [str(i) for i in range(n)]
    return names[:n]


def plan(engines: Optional[int], tensor_parallel: int, gpus: list[str]) -> list[Optional[str]]:
    """The CUDA_VISIBLE_DEVICES of each engine (None: no GPU, the CPU). ``engines`` None: as many as
    the visible GPUs allow (1 without GPUs). Raises InferenceError when the GPUs do not suffice. Both numbers
    come checked (>= 1) from the evaluator's options."""
    if not gpus:
        if tensor_parallel > 1:
            raise InferenceError(f"--tensor-parallel-size {tensor_parallel} needs GPUs; none is visible")
        return [None] * (engines or 1)
    fit = len(gpus) // tensor_parallel
    if fit < 1:
        raise InferenceError(f"--tensor-parallel-size {tensor_parallel} needs {tensor_parallel} GPUs; "
                             f"{len(gpus)} visible ({','.join(gpus)})")
    n = fit if engines is None else engines
    if n > fit:
        raise InferenceError(f"--engines {n} x --tensor-parallel-size {tensor_parallel} needs "
                             f"{n * tensor_parallel} GPUs; {len(gpus)} visible ({','.join(gpus)})")
    return [",".join(gpus[i * tensor_parallel:(i + 1) * tensor_parallel]) for i in range(n)]


class _Worker:
    def __init__(self, index: int, proc, log_path: Path):
        self.index, self.proc, self.log_path = index, proc, log_path
        self.pending: dict[int, tuple[str, asyncio.Future]] = {}
        self.alive = True
        self.reader: Optional[asyncio.Task] = None

    def log_tail(self, n: int = 15) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(lines[-n:])


class EnginePool:
    """``n`` worker processes, each running an asker built from ``settings`` on its own engine
    (``settings.concurrency`` questions in flight each)."""

    def __init__(self, settings: AskSettings, devices: list[Optional[str]], log_prefix: Path,
                 start_timeout: float = 1800.0):
        self.settings, self.devices, self.log_prefix = settings, list(devices), Path(log_prefix)
        self.concurrency = settings.concurrency * len(devices)  # questions evaluate() keeps in flight
        self.worker_settings: list[Optional[dict]] = []  # what each worker said it parsed (its "ready")
        self.start_timeout = start_timeout
        self.workers: list[_Worker] = []
        self._next_id = 0
        self.reasked = 0  # questions asked again after their engine died

    async def start(self) -> "EnginePool":
        self.log_prefix.parent.mkdir(parents=True, exist_ok=True)
        cpu_threads = max(1, (os.cpu_count() or 1) // len(self.devices))
        for i, dev in enumerate(self.devices):
            env = {**os.environ, **vllm_engine_env(i)}  # spawned EngineCore, a compile cache of its own
            if dev is not None:
                env["CUDA_VISIBLE_DEVICES"] = dev
            else:  # CPU engines share the cores instead of each taking them all
                env.setdefault("OMP_NUM_THREADS", str(cpu_threads))
            log_path = self.log_prefix.with_name(f"{self.log_prefix.name}.engine{i}.log")
            log = open(log_path, "w")
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "train.evaluation.engine_worker", "--settings", self.settings.to_json(),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE, stderr=log, env=env, limit=2**26)
            log.close()
            self.workers.append(_Worker(i, proc, log_path))
        await asyncio.gather(*(self._wait_ready(w) for w in self.workers))
        for w in self.workers:
            w.reader = asyncio.create_task(self._read(w))
        where = ", ".join(f"engine {w.index}: " + (f"GPU {d}" if d else "CPU")
                          for w, d in zip(self.workers, self.devices))
        print(f"{len(self.workers)} engines ready ({where}); logs {self.log_prefix}.engineK.log", file=sys.stderr)
        return self

    async def _wait_ready(self, w: _Worker) -> None:
        try:
            line = await asyncio.wait_for(w.proc.stdout.readline(), self.start_timeout)
        except asyncio.TimeoutError:
            line = b""
        try:
            msg = json.loads(line)
            ok = msg.get("ready") is True
        except (json.JSONDecodeError, AttributeError):
            msg, ok = {}, False
        if not ok:
            await self.close()
            raise InferenceError(f"engine {w.index} did not start; the end of {w.log_path}:\n{w.log_tail()}")
        self.worker_settings.append(msg.get("settings"))
        sent = json.loads(self.settings.to_json())
        if msg.get("settings") != sent:
            await self.close()
            got = msg.get("settings") or {}
            diff = sorted(k for k in set(sent) | set(got) if sent.get(k) != got.get(k))
            raise InferenceError(f"engine {w.index} was built with other settings than sent ({diff}); is the "
                                 f"same version of this project installed for {sys.executable}?")

    async def _read(self, w: _Worker) -> None:
        while True:
            line = await w.proc.stdout.readline()
            if not line:
                break
            msg = json.loads(line)
            if "engine_dead" in msg:  # its engine is gone; the worker exits and its questions move on
                w.alive = False
                print(f"engine {w.index}: {msg['engine_dead']}", file=sys.stderr)
                continue
            item = w.pending.pop(msg["id"], None)
            if item is None:
                continue
            _, fut = item
            if fut.done():
                continue
            if "error" in msg:
                fut.set_exception(InferenceError(f"engine {w.index}: {msg['error']}"))
            else:
                fut.set_result(Result(**msg["result"]))
        # end of stream: the worker exited (killed, crashed, or closed by us)
        w.alive = False
        await w.proc.wait()
        if not w.pending:
            return
        live = [x for x in self.workers if x.alive]
        print(f"engine {w.index} died (exit {w.proc.returncode}) with {len(w.pending)} questions in flight; "
              + (f"asking them on the {len(live)} other engines" if live else "no engine is left")
              + f". The end of {w.log_path}:\n{w.log_tail()}", file=sys.stderr)
        pending, w.pending = list(w.pending.values()), {}
        for question, fut in pending:
            if fut.done():
                continue
            if not live:
                fut.set_exception(EnginesDown(f"every engine died (the last: engine {w.index}, exit "
                                              f"{w.proc.returncode}; log {w.log_path})"))
                continue
            self.reasked += 1
            asyncio.create_task(self._reask(question, fut))

    async def _reask(self, question: str, fut: asyncio.Future) -> None:
        try:
            res = await self.ask(question)
        except Exception as e:  # noqa: BLE001
            if not fut.done():
                fut.set_exception(e)
            return
        if not fut.done():
            fut.set_result(res)

    async def ask(self, question: str) -> Result:
        live = [w for w in self.workers if w.alive]
        if not live:
            raise EnginesDown("every engine died; see " + ", ".join(str(w.log_path) for w in self.workers))
        w = min(live, key=lambda x: len(x.pending))
        self._next_id += 1
        rid = self._next_id
        fut = asyncio.get_running_loop().create_future()
        w.pending[rid] = (question, fut)
        try:
            w.proc.stdin.write((json.dumps({"id": rid, "question": question}) + "\n").encode())
            await w.proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the worker is gone: its reader hands the question to another engine
        return await fut

    async def close(self) -> None:
        for w in self.workers:
            if w.proc.returncode is None:
                try:
                    w.proc.stdin.close()
                except Exception:  # noqa: BLE001
                    pass
        for w in self.workers:
            try:
                await asyncio.wait_for(w.proc.wait(), 60)
            except asyncio.TimeoutError:
                w.proc.kill()
                await w.proc.wait()
            if w.reader is not None:
                await w.reader
