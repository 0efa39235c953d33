"""``make bench``'s runner: the busy-machine warning and the per-part peak memory (own process)."""

import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import run as bench_run  # noqa: E402


def test_busy_cores_from_proc_stat(monkeypatch):
    """Busy cores = (1 - idle share of the jiffies that passed) x cores; iowait counts as idle."""
    readings = iter([(1000.0, 600.0), (1400.0, 700.0)])  # 400 jiffies passed, 100 of them idle
    monkeypatch.setattr(bench_run, "cpu_times", lambda: next(readings))
    monkeypatch.setattr(bench_run.time, "sleep", lambda s: None)
    monkeypatch.setattr(bench_run.os, "cpu_count", lambda: 2)
    assert bench_run.busy_cores(1.0) == 1.5


def test_cpu_times_reads_the_machine():
    total0, idle0 = bench_run.cpu_times()
    spin = subprocess.Popen([sys.executable, "-c", "import time\nt=time.time()\nwhile time.time()-t<1: pass"])
    spin.wait()
    total1, idle1 = bench_run.cpu_times()
    assert total1 > total0 and idle1 >= idle0 and (total1 - total0) - (idle1 - idle0) > 0  # the spin was busy time


def test_each_part_in_its_own_process_with_its_peak_memory(monkeypatch, capsys):
    big = "-c \"import numpy as np; a = np.ones(300 * 2**20 // 8); print(a.sum() > 0)\""
    small = "-c \"print('small')\""
    monkeypatch.setattr(bench_run, "PARTS", {"big": big, "small": small, "fails": "-c \"raise SystemExit(3)\""})
    monkeypatch.setattr(bench_run, "busy_cores", lambda seconds=1.0: 0.0)
    assert bench_run.main(["--parts", "big,small"]) == 0
    out = capsys.readouterr().out
    rows = {line.split("|")[1].strip(): line.split("|") for line in out.splitlines() if line.startswith("| big")
            or line.startswith("| small")}
    assert float(rows["big"][4]) >= 300 and float(rows["small"][4]) < 150  # the small part is not charged the big one's
    assert bench_run.main(["--parts", "fails"]) == 1
    monkeypatch.setattr(bench_run, "busy_cores", lambda seconds=1.0: 1.5)
    assert bench_run.main(["--parts", "small"]) == 0
    err = capsys.readouterr().err
    assert "WARNING: the machine is busy before small: 1.50 of" in err and "measured on a busy machine: small" in err


def test_unknown_part_is_refused():
    import pytest

    with pytest.raises(SystemExit):
        bench_run.main(["--parts", "nope"])


def test_rehearsal_bench_parts_and_the_busy_part(capsys):
    """bench/bench_rehearsal.py: bad --parts / --command are refused by name; the busy part reports a
    command's exit status, wall time and busy cores."""
    import pytest

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from bench import bench_rehearsal

    for argv, words in ((["--parts", "nope"], "unknown or no part"), (["--parts", ""], "unknown or no part"),
                        (["--parts", "busy"], "needs a --command"),
                        (["--parts", "imports", "--command", "true"], "--command goes with --parts busy")):
        with pytest.raises(SystemExit) as e:
            bench_rehearsal.main(argv)
        assert e.value.code == 2 and words in capsys.readouterr().err, argv
    assert bench_rehearsal.main(["--parts", "busy", "--command", "exit 3"]) == 3
    out = capsys.readouterr().out
    assert "`exit 3` exited 3 after" in out and "cores busy on average" in out
