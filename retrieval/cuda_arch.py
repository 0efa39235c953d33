"""Which GPUs a build's compiled architectures run on (standard library only: also used by
scripts/check_gpu_install.py, which runs in any Python with pip)."""

from __future__ import annotations

from typing import Sequence


def runs_on(capability: tuple[int, int], archs: Sequence[str]) -> bool:
    """CUDA's rule: a cubin for sm_XY runs on sm_XZ with Z >= Y (same major), an arch-specific
    ``sm_XYa`` cubin only on X.Y; PTX for compute_XY is compiled at load time for any capability >= XY."""
    for arch in archs:
        kind, _, num = arch.partition("_")
        digits = num.rstrip("af")
        if kind not in ("sm", "compute") or len(digits) < 2 or not digits.isdigit():
            continue
        built = (int(digits[:-1]), int(digits[-1]))
        if kind == "compute" and built <= tuple(capability):
            return True
        if kind == "sm" and (built == tuple(capability) if num.endswith("a") else
                             built[0] == capability[0] and built[1] <= capability[1]):
            return True
    return False
