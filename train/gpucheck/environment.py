"""What the GPU check's parts share: verl stand-ins where verl is not installed, the tiny model they run,
device memory and synchronisation, the installed transformers against the project's pin, and the per-thread
cuBLAS workspaces torch allocates (which the memory rows allow for)."""

from __future__ import annotations

import os
import sys
import types
from dataclasses import dataclass
from pathlib import Path

from train import DATA_DIR, REPO_ROOT

MiB = 1 << 20
#: what the tiny model's tokenizer learns from where the checkout's data/corpus.jsonl is absent (an installed wheel)
TOKENIZER_TEXTS = [f"the capital of {c} is {t} . question {i} : who wrote passage {i} ?"
                   for i, (c, t) in enumerate([("france", "paris"), ("italy", "rome"), ("spain", "madrid"),
                                               ("japan", "tokyo"), ("egypt", "cairo"), ("peru", "lima")] * 40)]


def stand_in_verl() -> bool:
    """Stand-ins for the verl names these paths import, when verl is not installed. True if used."""
    try:
        import verl.workers.rollout.replica  # noqa: F401
        return False
    except ImportError:
        pass

    @dataclass
    class TokenOutput:
        token_ids: list
        log_probs: list | None = None
        stop_reason: str | None = None

    class EngineRegistry:
        _engines: dict = {}

    mods = {name: types.ModuleType(name) for name in (
        "verl", "verl.workers", "verl.workers.rollout", "verl.workers.rollout.replica", "verl.workers.engine",
        "verl.workers.engine.base", "verl.workers.engine.fsdp", "verl.workers.engine.fsdp.transformer_impl")}
    mods["verl.workers.rollout.replica"].TokenOutput = TokenOutput
    mods["verl.workers.engine.base"].EngineRegistry = EngineRegistry
    mods["verl.workers.engine.fsdp.transformer_impl"].FSDPEngineWithValueHead = type("FSDPEngineWithValueHead", (), {})
    sys.modules.update(mods)
    return True


def tiny_model(work: Path, hidden: int = 256, layers: int = 2, heads: int = 4) -> Path:
    """A tiny random Qwen2 in ``work``; its tokenizer learns the checkout's corpus, or a few sentences without one."""
    from train.toy.tiny_model import build_tiny_model

    corpus = DATA_DIR / "corpus.jsonl"
    return build_tiny_model(work / f"tiny_{hidden}_{layers}_{heads}", corpus, hidden_size=hidden, layers=layers,
                            heads=heads, tokenizer_texts=None if corpus.is_file() else TOKENIZER_TEXTS)


def sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


# -- transformers' version --------------------------------------------------------------------------------

def transformers_pin() -> str:
    """The transformers requirement of pyproject.toml's [project] dependencies, e.g. ">=5.5.3,!=5.6.0,<5.11"
    (an installed wheel without the checkout: the same requirement, from the installed package's metadata)."""
    import re

    if not (REPO_ROOT / "pyproject.toml").is_file():
        from importlib import metadata

        try:
            reqs = metadata.requires("search-r1-llds") or []
        except metadata.PackageNotFoundError:
            reqs = []
        return next((m.group(1).replace(" ", "") for r in reqs
                     if (m := re.fullmatch(r"\s*transformers\s*(?:\[[^\]]*\])?\s*\(?([<>=!~][^;)]*)\)?\s*", r))), "")
    text = (REPO_ROOT / "pyproject.toml").read_text()
    try:
        import tomllib

        deps = tomllib.loads(text).get("project", {}).get("dependencies", [])
    except ImportError:  # Python < 3.11: the quoted requirement strings
        deps = re.findall(r'"([^"]+)"', text)
    for dep in deps:
        m = re.fullmatch(r"\s*transformers\s*(\[[^\]]*\])?\s*([<>=!~][^;]*)?(;.*)?", dep)
        if m:
            return (m.group(2) or "").replace(" ", "")
    return ""


def installed_transformers() -> str | None:
    """The installed transformers' version (read without importing it), None when it is not installed."""
    from importlib import metadata

    try:
        return metadata.version("transformers")
    except metadata.PackageNotFoundError:
        return None


def transformers_status() -> tuple[str, bool | None]:
    """(one line, verdict): True when the installed transformers satisfies pyproject.toml's pin; None when it is
    the pin's major version but outside the pin (the parts run; a mismatch in them may be the version's);
    False when it is missing or of another major version (the parts that run it are skipped; the line says why:
    transformers 4.x has no ``masking_utils.create_causal_mask`` of 5.x's signature, no ``DynamicCache.layers``)."""
    import re

    pin = transformers_pin()
    have = installed_transformers()
    want = f"transformers{pin} (pyproject.toml)" if pin else "transformers 5.x (pyproject.toml)"
    if have is None:
        return f"transformers is not installed; the project needs {want}", False
    lower = re.search(r"(?:>=|==|~=|>)\s*(\d+)", pin)
    major = int(lower.group(1)) if lower else 5
    have_major = re.match(r"\s*(\d+)", have)
    if not have_major or int(have_major.group(1)) != major:
        return f"transformers {have} is installed; the project needs {want}", False
    try:
        from packaging.specifiers import SpecifierSet

        within = SpecifierSet(pin).contains(have, prereleases=True) if pin else True
    except Exception:  # noqa: BLE001  (no packaging, or a version it cannot parse: the major version matched)
        within = True
    if within:
        return f"transformers {have} satisfies the project's pin {want}", True
    return (f"transformers {have} is outside the project's pin {want}: the parts that run it still run, a "
            f"mismatch there may be the version's"), None


# -- cuBLAS workspaces ------------------------------------------------------------------------------------

@dataclass
class BlasWorkspace:
    """What torch allocates, through its caching allocator, the first time a thread runs a cuBLAS (Lt) matmul
    on a device, and keeps for the process per (cuBLAS handle, stream), a handle being held by one thread at a
    time (aten/src/ATen/cuda/CublasHandlePool.cpp: getCurrentCUDABlasHandle -> setWorkspaceForHandle, of
    getChosenWorkspaceSize() bytes; getCUDABlasLtWorkspace, of getCUDABlasLtWorkspaceSize() bytes, which only
    shares the cuBLAS one where TORCH_CUBLASLT_UNIFIED_WORKSPACE says so in some torch versions)."""

    cublas: int
    cublaslt: int
    lt_shared: bool
    how: str

    @property
    def per_thread(self) -> int:
        """The most one thread's first matmuls add to torch.cuda.memory_allocated()."""
        return self.cublas + (0 if self.lt_shared else self.cublaslt)

    def describe(self) -> str:
        lt = "(cuBLASLt shares it)" if self.lt_shared else f"+ up to {self.cublaslt / MiB:.2f} MiB cuBLASLt"
        return f"{self.cublas / MiB:.3f} MiB cuBLAS {lt} ({self.how})"


def torch_workspace_sizes(major: int, minor: int, env=None, hip_arch: str | None = None) -> BlasWorkspace:
    """The per-thread cuBLAS and cuBLASLt workspace sizes as torch 2.11's aten/src/ATen/cuda/CublasHandlePool.cpp
    computes them for a device of compute capability ``major.minor`` (``hip_arch``: a ROCm device) under the
    environment ``env``: parseChosenWorkspaceSize reads CUBLAS_WORKSPACE_CONFIG, ":SIZE:COUNT" pairs of SIZE KiB
    each (unset or unparsable: 4096 KiB x 8 = 32 MiB when major.minor is 9.0, else ":4096:2:16:8" = 8 MiB + 128
    KiB; ROCm 32 MiB, 128 MiB on gfx94x/gfx95x); parseCUDABlasLtWorkspaceSize reads CUBLASLT_WORKSPACE_SIZE in
    KiB (default 1024), capped at the cuBLAS size unless TORCH_CUBLASLT_UNIFIED_WORKSPACE=0."""
    import re

    env = os.environ if env is None else env
    raw_unified = env.get("TORCH_CUBLASLT_UNIFIED_WORKSPACE")
    unified = None if raw_unified is None else raw_unified.strip().lower() in ("1", "true", "yes", "on", "y")
    if hip_arch is not None:
        default = (128 if hip_arch.startswith(("gfx94", "gfx95")) else 32) * MiB
        val = next((env[k] for k in ("CUBLAS_WORKSPACE_CONFIG", "HIPBLAS_WORKSPACE_CONFIG", "ROCBLAS_WORKSPACE_CONFIG")
                    if k in env), None)
        arch = hip_arch or "ROCm"
    else:
        default = 4096 * 8 * 1024 if (major, minor) == (9, 0) else 4096 * 1024 * 2 + 16 * 1024 * 8
        val = env.get("CUBLAS_WORKSPACE_CONFIG")
        arch = f"sm_{major}{minor}"
    pairs = re.findall(r":([0-9]+):([0-9]+)", val or "")
    if val is not None and pairs:
        cublas, how = sum(int(a) * 1024 * int(b) for a, b in pairs), f"CUBLAS_WORKSPACE_CONFIG={val}"
    else:
        cublas, how = default, f"torch's default on {arch}"
    raw = env.get("CUBLASLT_WORKSPACE_SIZE") or (env.get("HIPBLASLT_WORKSPACE_SIZE") if hip_arch is not None else None)
    lt = (76 if hip_arch is not None else 1) * MiB
    if raw:
        try:
            lt = int(raw) * 1024
        except ValueError:
            pass
    if hip_arch is None and unified is not False:
        lt = min(lt, cublas)
    # the Lt workspace is one allocation with the cuBLAS one for certain only where the variable asks for it by
    # name: torch 2.11's getCUDABlasLtWorkspace tests check_env(...) == true, its size parser unset-or-true
    return BlasWorkspace(cublas, lt, hip_arch is None and unified is True, how)


def blas_workspace(device_index: int = 0) -> BlasWorkspace:
    """:func:`torch_workspace_sizes` for this device, or this torch's own getters where it has them."""
    import torch

    props = torch.cuda.get_device_properties(device_index)
    hip_arch = (getattr(props, "gcnArchName", "") or "") if torch.version.hip else None
    ws = torch_workspace_sizes(props.major, props.minor, hip_arch=hip_arch)
    get = getattr(torch._C, "_cuda_getCublasWorkspaceSize", None)
    get_lt = getattr(torch._C, "_cuda_getCublasLtWorkspaceSize", None)
    try:
        if get is not None:
            ws.cublas, ws.how = int(get()), "torch._C._cuda_getCublasWorkspaceSize()"
        if get_lt is not None:
            ws.cublaslt = int(get_lt())
    except Exception:  # noqa: BLE001  (the computed sizes stand)
        pass
    return ws


def memory(device: str) -> tuple[int, int]:
    """(allocated, reserved) bytes of the caching allocator on ``device``, after a synchronize; (0, 0) on CPU."""
    import torch

    if not device.startswith("cuda"):
        return 0, 0
    torch.cuda.synchronize()
    return torch.cuda.memory_allocated(), torch.cuda.memory_reserved()

