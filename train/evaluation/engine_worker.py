"""One engine of the evaluator's pool, in its own process (started by
:class:`~train.evaluation.pool.EnginePool` as ``python -m train.evaluation.engine_worker --settings JSON``,
the :class:`~train.inference.settings.AskSettings` whole): it answers ``{"ready": true, "settings": ...}``
with the settings it parsed, then questions come one JSON line each on stdin, answers go back on stdout.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import sys

from train.errors import InferenceError
from train.inference.backends import is_engine_dead

#: A worker's exit status when its engine died under it (the pool asks its questions elsewhere).
ENGINE_DEAD_EXIT = 3


async def _serve(asker, channel) -> int:
    """Answer questions until stdin closes (0) or the engine dies (:data:`ENGINE_DEAD_EXIT`): then the
    questions in flight get no answer here; the parent sees the worker end and asks them again."""
    loop = asyncio.get_running_loop()
    tasks: set[asyncio.Task] = set()
    dead = asyncio.Event()

    async def one(msg: dict) -> None:
        try:
            res = await asker.ask(msg["question"])
            out = {"id": msg["id"], "result": dataclasses.asdict(res)}
        except Exception as e:  # noqa: BLE001  (one question's failure is reported, not fatal)
            if is_engine_dead(e):
                if not dead.is_set():
                    dead.set()
                    channel.write(json.dumps({"engine_dead": f"{type(e).__name__}: {e}"}) + "\n")
                    channel.flush()
                return
            out = {"id": msg["id"], "error": f"{type(e).__name__}: {e}"}
        if dead.is_set():
            return
        channel.write(json.dumps(out, ensure_ascii=False) + "\n")
        channel.flush()

    async def read() -> None:
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line:
                return
            t = asyncio.create_task(one(json.loads(line)))
            tasks.add(t)
            t.add_done_callback(tasks.discard)

    reader = asyncio.ensure_future(read())
    stopper = asyncio.ensure_future(dead.wait())
    await asyncio.wait({reader, stopper}, return_when=asyncio.FIRST_COMPLETED)
    if dead.is_set():
        print("the engine died; this worker exits and its questions are asked on the other engines", file=sys.stderr)
        return ENGINE_DEAD_EXIT
    stopper.cancel()
    if tasks:
        await asyncio.gather(*tasks)
    return ENGINE_DEAD_EXIT if dead.is_set() else 0


def worker_main(argv: list[str]) -> int:
    # The answers go on a private copy of stdout; anything printed (vLLM logs to stdout) goes to stderr.
    channel = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    import argparse

    from train.inference.asker import build_asker
    from train.inference.settings import AskSettings

    ap = argparse.ArgumentParser(prog="python -m train.evaluation.engine_worker")
    ap.add_argument("--settings", required=True, help="AskSettings.to_json()")
    try:
        settings = AskSettings.from_json(ap.parse_args(argv).settings)  # checked as it is read
    except (InferenceError, ValueError, TypeError) as e:
        print(f"error: --settings: {e}", file=sys.stderr)
        return 2

    async def go() -> int:
        asker = build_asker(settings)
        channel.write(json.dumps({"ready": True, "settings": json.loads(settings.to_json())}) + "\n")
        channel.flush()
        rc = await _serve(asker, channel)
        if rc == ENGINE_DEAD_EXIT:  # now: asyncio.run would wait for the stdin reader thread
            sys.stderr.flush()
            os._exit(rc)
        return rc

    try:
        return asyncio.run(go())
    except InferenceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(worker_main(sys.argv[1:]))
