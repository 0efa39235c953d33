"""A verl platform for CPU: device ``cpu``, collectives on gloo, Ray slots as a custom resource."""

from __future__ import annotations

import contextlib
import types
from typing import Any, Optional

import torch
from verl.plugin.platform.platform_base import PlatformBase
from verl.plugin.platform.platform_manager import PlatformRegistry

#: Ray resource each CPU "device" worker takes. verl's resource-pool check counts only the "GPU"
#: (or "NPU") resource, so CPU runs declare logical Ray GPU slots (ray.init(num_gpus=n) in
#: train.main): a scheduling token, nothing runs on a GPU (Ray's CUDA_VISIBLE_DEVICES is ignored by
#: the CPU build of torch).
RAY_RESOURCE = "GPU"


def _noop(*args, **kwargs):
    return None


def _zero(*args, **kwargs):
    return 0


class _CPUDeviceModule(types.ModuleType):
    """What verl calls on ``get_torch_device()``: torch.cpu where it has it, no-ops for memory stats."""

    def __init__(self):
        super().__init__("verl_cpu_device")

    def __getattr__(self, name: str) -> Any:
        if hasattr(torch.cpu, name):
            return getattr(torch.cpu, name)
        if name in ("memory_allocated", "memory_reserved", "max_memory_allocated", "max_memory_reserved"):
            return _zero
        if name == "mem_get_info":
            return lambda *a, **k: (0, 0)
        if name in ("manual_seed", "manual_seed_all"):
            return torch.manual_seed
        if name in ("is_available",):
            return lambda: True
        if name == "get_device_name":
            return lambda *a, **k: "CPU"
        if name == "device_count":
            return lambda: 1
        if name == "current_device":
            return _zero
        return _noop


DEVICE_MODULE = _CPUDeviceModule()


@PlatformRegistry.register(platform="cpu")
class PlatformCPU(PlatformBase):
    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self):
        return DEVICE_MODULE

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check=False) -> bool:
        return False  # never auto-detected: VERL_PLATFORM=cpu selects it

    def current_device(self) -> str:
        # verl uses get_device_id() only as a torch device argument (.to(), device=, torch.device());
        # "cpu" is right for all of them, an int would mean an accelerator index.
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: Optional[int] = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0):
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "VERL_CPU_VISIBLE_DEVICES"

    @contextlib.contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return RAY_RESOURCE

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None
