"""Serving the retrieval app with waitress: sizing, a background handle, drain on SIGTERM, stop.

:class:`Server` is the one handle the command, the tests and the benchmarks use::

    server = Server(app, ServeConfig(port=0)).start()     # in a background thread; server.url
    ...
    server.stop()                                          # request threads, sockets, then the batcher

``python -m retrieval.server`` calls :meth:`Server.run_until_signal`: on SIGTERM or SIGINT it stops
accepting, lets in-flight requests finish and their responses go out, then returns. This module is
the only one that reads waitress's internals (its channel map and task dispatcher).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from typing import Optional

from retrieval.app import state_of
from retrieval.settings import ServeConfig

log = logging.getLogger("retrieval.server")


def default_threads(max_batch: int) -> int:
    """Request threads: each waits on its batch, so fewer threads than ``max_batch`` single-query
    requests would cap every batch below ``max_batch``; 32 more keep /health and parsing responsive."""
    return max(64, max_batch + 32)


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now (the OS's pick): for a server started next, in tests and benchmarks."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def raise_open_files(want: int) -> None:
    """Raise this process's open-files limit to ``want`` (at most the hard limit); a warning says when it
    cannot, since the server then refuses connections below ``--connection-limit``."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        target = want if hard == resource.RLIM_INFINITY else min(want, hard)
        if soft != resource.RLIM_INFINITY and soft < target:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except ImportError:  # no resource module (Windows): no limit to raise here
        return
    except (ValueError, OSError) as e:
        log.warning("could not raise the open-files limit to %d (%s: %s); connections beyond the current limit "
                    "will be refused: raise it with ulimit -n, or lower --connection-limit", want,
                    type(e).__name__, e)


class Server:
    """A waitress server for the app (threaded production WSGI), sized for a training step's burst.

    ``connection_limit`` connections (the open-files limit is raised to fit), idle or stalled connections
    closed after ``channel_timeout`` seconds, request bodies over the app's limit refused from their
    Content-Length (before waitress spools them to disk), and poll() instead of select(): select() fails
    outright past 1,024 descriptors ("filedescriptor out of range"), which ~1,000 idle connections reach."""

    def __init__(self, app, config: Optional[ServeConfig] = None, *, quiet: bool = False):
        from waitress.server import create_server

        cfg = config or ServeConfig()
        problems = cfg.problems()
        if problems:
            raise ValueError("; ".join(problems))
        self.app, self.state = app, state_of(app)
        threads = cfg.threads or default_threads(self.state.config.max_batch)
        raise_open_files(cfg.connection_limit + threads + 64)
        self.waitress = create_server(
            app, host=cfg.host, port=cfg.port, threads=threads, connection_limit=cfg.connection_limit,
            channel_timeout=cfg.channel_timeout, cleanup_interval=max(1, cfg.channel_timeout // 5),
            max_request_body_size=self.state.config.max_body_bytes, ident="retrieval", asyncore_use_poll=True)
        self.host, self.threads = cfg.host, threads
        self.port = int(self.waitress.effective_port)
        self.url = f"http://{'127.0.0.1' if cfg.host in ('0.0.0.0', '') else cfg.host}:{self.port}"
        (log.debug if quiet else log.info)("serving on http://%s:%d (threads=%d, connection_limit=%d)",
                                             cfg.host, self.port, threads, cfg.connection_limit)
        self._thread: Optional[threading.Thread] = None
        self._draining = self._drained = False

    def start(self) -> "Server":
        """Serve in a background thread (tests, benchmarks); returns self."""
        self._thread = threading.Thread(target=self.waitress.run, name="retrieval-serve", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """From another thread: the task threads finish first (waitress's own ``close()`` closes the wake-up
        pipe under a thread still answering, which then logs "Bad file descriptor"), then the sockets
        close, then the batching thread stops."""
        self.waitress.task_dispatcher.shutdown(timeout=10)
        self.waitress.close()
        self.state.close()

    def run_until_signal(self, drain_timeout: Optional[float] = None) -> None:
        """Serve in this thread until SIGTERM/SIGINT, then drain in-flight requests (at most
        ``drain_timeout`` s, default the request deadline + 5 s) and return."""
        import signal

        drain_timeout = self.state.config.request_timeout_s + 5 if drain_timeout is None else drain_timeout
        signal.signal(signal.SIGTERM, lambda *_: self._on_signal(drain_timeout))
        signal.signal(signal.SIGINT, lambda *_: self._on_signal(drain_timeout))
        try:
            self.waitress.run()
        except KeyboardInterrupt:
            pass
        finally:
            self.waitress.task_dispatcher.shutdown(timeout=5)
            self.state.close()
        log.info("stopped")

    def _on_signal(self, drain_timeout: float) -> None:
        if self._drained:
            raise KeyboardInterrupt
        if self._draining:
            return
        self._draining = True
        log.info("signal: no new connections; draining %d in-flight requests", self.state.in_flight)
        self.waitress.accepting = False
        self.waitress.del_channel()  # out of the loop's map: no more accepts
        threading.Thread(target=self._drain, args=(drain_timeout,), name="retrieval-drain", daemon=True).start()

    def _drain(self, drain_timeout: float) -> None:
        import _thread

        # Close the listening socket from here, not in the signal handler: the interrupted select()
        # is retried with the old descriptor lists, and a descriptor closed under it fails the loop.
        self.waitress.pull_trigger()
        time.sleep(0.2)
        try:
            self.waitress.socket.close()
        except OSError:
            pass
        deadline = time.monotonic() + drain_timeout
        while time.monotonic() < deadline and (self.state.in_flight > 0 or self._pending_output()):
            time.sleep(0.05)
        if self.state.in_flight:
            log.warning("shutting down with %d requests still running after %.0f s", self.state.in_flight,
                        drain_timeout)
        self._drained = True
        _thread.interrupt_main()  # -> _on_signal raises KeyboardInterrupt in the loop; run_until_signal returns

    def _pending_output(self) -> bool:
        for ch in list(self.waitress._map.values()):
            if getattr(ch, "requests", None) or getattr(ch, "total_outbufs_len", 0):
                return True
        return False
