"""What a test run may leave behind on the machine, found the same way a user would stumble on it:
processes of ours still running, network namespaces of the multi-node test, and a Ray address file
(``/tmp/ray/ray_current_cluster``) that names a cluster nobody serves any more (a later address-less
``ray.init()`` would try to join it)."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

#: command-line pieces of the processes this project starts (Ray's own, servers, commands, engines)
MARKERS = ("raylet", "gcs_server", "ray::", "ray/dashboard", "ray/_private/", "default_worker.py", "log_monitor",
           "retrieval.server", "retrieval.launch", "retrieval_launch", "train.main", "train.evaluate",
           "train.evaluation.", "infer.py", "EngineCore", "multinode.sh")
#: the network namespaces tests/test_multinode_on_cpu.py makes
NETNS_PREFIXES = ("srhead", "srwork")
CLK_TCK = os.sysconf("SC_CLK_TCK")


def _boot_time() -> float:
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    raise RuntimeError("no btime in /proc/stat")


def started_at(pid: int) -> float:
    """A process's start time (seconds since the epoch), from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return _boot_time() + int(fields[19]) / CLK_TCK  # field 22 of stat; [0] here is field 3


def processes_since(t0: float, markers=MARKERS) -> list[str]:
    """``"PID: command line"`` of every live process started at or after ``t0`` whose command line holds
    one of ``markers`` (zombies and this process excluded)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if int(pid) == os.getpid():
            continue
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            if state == "Z" or not cmd or started_at(int(pid)) < t0 - 1:
                continue
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        if any(m in cmd for m in markers):
            found.append(f"{pid}: {cmd[:300]}")
    return found


def namespaces(prefixes=NETNS_PREFIXES) -> list[str]:
    try:
        out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.split()[0] for line in out.splitlines() if line.strip() and line.split()[0].startswith(prefixes)]


def ray_address_file() -> Path:
    """Where ``ray start --head`` records its address (Ray: ``ray._common.utils.get_ray_address_file``)."""
    return Path(os.environ.get("RAY_TMPDIR", "/tmp")) / "ray" / "ray_current_cluster"


def answers(address: str, timeout: float = 2.0) -> bool:
    host, _, port = address.strip().rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return True
    except (OSError, ValueError):
        return False


def stale_ray_address() -> str | None:
    """The address in Ray's address file when nothing answers there (None when there is no file or the
    cluster it names is up)."""
    f = ray_address_file()
    if not f.is_file():
        return None
    address = f.read_text().strip()
    return None if address and answers(address) else (address or "(empty)")


def forget_ray_address(match: str) -> bool:
    """Remove Ray's address file when it names a cluster whose address holds ``match`` (as ``ray stop``
    does for the cluster it stops)."""
    f = ray_address_file()
    try:
        if match in f.read_text():
            f.unlink()
            return True
    except OSError:
        pass
    return False


def left_behind(t0: float) -> list[str]:
    """Everything of ours still around that was made at or after ``t0``, one line each."""
    out = [f"process {p}" for p in processes_since(t0)]
    out += [f"network namespace {ns} (ip netns del {ns})" for ns in namespaces()]
    stale = stale_ray_address()
    if stale:
        out.append(f"{ray_address_file()} names {stale}, where no Ray cluster answers")
    return out
