"""How many GPUs this process may use, asked without initialising CUDA in it.

A vLLM engine built outside Ray starts its EngineCore by ``fork`` unless CUDA is already initialised
in the parent (vLLM checks ``torch.cuda.is_initialized()``). ``torch.cuda.is_available()`` does not
initialise CUDA, but it calls the CUDA runtime's device count, which runs ``cuInit`` and marks the
process as unsafe to fork (torch/cuda/__init__.py ``is_available``: ``torch._C._cuda_getDeviceCount``;
torch/csrc/cuda/Module.cpp ``THCPModule_getDeviceCount_wrap``: ``poison_fork()``). The forked
EngineCore then dies with "Cannot re-initialize CUDA in forked subprocess". A CPU build of torch
returns before that call, so CPU runs never show it.

:func:`gpu_count` asks NVML (``torch.cuda._device_count_nvml``, which honours
``CUDA_VISIBLE_DEVICES`` and touches no CUDA driver state), and where NVML cannot answer, asks a
short-lived child interpreter, so this process stays safe to fork either way.
"""

from __future__ import annotations

import os
import subprocess
import sys

_count: int | None = None


def gpu_count() -> int:
    """The CUDA devices visible to this process (0 for a CPU build of torch); never runs ``cuInit`` here."""
    global _count
    if _count is not None:
        return _count
    import torch

    if not hasattr(torch._C, "_cuda_getDeviceCount"):  # a CPU build: torch.cuda._is_compiled() is False
        _count = 0
        return 0
    n = torch.cuda._device_count_nvml()  # -1 when NVML is missing or failed
    if n < 0:
        code = "import torch; print(torch.cuda.device_count())"
        try:
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                                 env=dict(os.environ))
            n = int(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 and out.stdout.strip() else 0
        except (subprocess.TimeoutExpired, ValueError, OSError):
            n = 0
    _count = max(0, int(n))
    return _count


def default_device() -> str:
    """``cuda`` when a GPU is visible, else ``cpu`` (for in-process engines; see :func:`gpu_count`)."""
    return "cuda" if gpu_count() else "cpu"
