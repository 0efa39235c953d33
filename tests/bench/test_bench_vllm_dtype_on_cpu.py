"""bench/bench_vllm_dtype.py without vLLM (.venv): the engine that cannot start is named with its output, and
nothing is printed as a result (the table itself needs .venv-vllm: bench/RESULTS.md has its numbers)."""

import subprocess
import sys

import pytest

from tests.conftest import ROOT


def test_an_engine_that_fails_is_named_and_no_table_is_printed(tiny_model_dir):
    try:
        import vllm  # noqa: F401
        pytest.skip("vLLM is installed here: the failing engine is what this test needs")
    except ImportError:
        pass
    r = subprocess.run([sys.executable, "bench/bench_vllm_dtype.py", "--model", str(tiny_model_dir),
                        "--dtypes", "float32", "--prompts", "2", "--tokens", "4"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and "error: the float32 engine failed" in r.stderr, r.stderr[-2000:]
    assert "No module named 'vllm'" in r.stderr and "tokens/s" not in r.stdout
