"""An ``hf`` rollout for verl: transformers behind verl's server-replica interface.

- :class:`HFServer`: a Ray actor holding a copy of the policy in the batching engine
  (train/inference/hf_engine.py: concurrent trajectories decoded together, each one's KV cache kept across its
  turns); ``generate`` is what verl's ``LLMServerClient`` calls (token ids in, :class:`TokenOutput`
  out, stop strings honoured).
- :class:`HFReplica`: the ``RolloutReplica`` that launches one server per replica.
- :class:`HFRollout`: the ``BaseRollout`` inside the hybrid actor worker; ``update_weights``
  receives the trainer's full parameters after each step and loads them into the server.

Selected with ``actor_rollout_ref.rollout.name=hf``. Meant for CPU runs (tests, demo) and tiny
models; GPU training uses vLLM or SGLang.
"""

from __future__ import annotations

import logging
from typing import Optional

import ray
import torch
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutReplica

log = logging.getLogger(__name__)
NAME = "hf"


def server_name(replica_rank: int) -> str:
    return f"verl_hf_rollout_server_{replica_rank}"


class HFServer:
    def __init__(self, model_path: str, max_model_len: Optional[int] = None, seed: int = 0):
        from train.inference.hf_engine import HFBatchedServerManager

        torch.set_num_threads(max(1, torch.get_num_threads()))
        self.manager = HFBatchedServerManager.from_pretrained(model_path, device="cpu", dtype="float32", seed=seed)
        self.version = 0

    async def generate(self, request_id=None, *, prompt_ids, sampling_params, image_data=None, video_data=None,
                       **kwargs):
        out = await self.manager.generate(request_id, prompt_ids=prompt_ids, sampling_params=dict(sampling_params))
        out.extra_fields["global_steps"] = self.version
        return out

    def load_weights(self, state: dict, global_steps: Optional[int] = None) -> int:
        model = self.manager.model
        own = model.state_dict()
        missing = [k for k in own if k not in state and not k.endswith("lm_head.weight")]
        if missing:
            raise RuntimeError(f"hf rollout: weights missing for {missing[:5]} ...")
        with torch.no_grad():
            for k, v in state.items():
                if k in own:
                    own[k].copy_(v.to(own[k].dtype))
        self.manager.clear_cache()  # kept KV caches belong to the old weights
        if global_steps is not None:
            self.version = global_steps
        return len(state)

    async def wake_up(self):
        return None

    async def sleep(self):
        return None

    async def abort_all_requests(self, reject_request: bool = False):
        return None

    async def resume_generation(self):
        return None

    async def clear_kv_cache(self):
        return None

    async def release_kv_cache(self):
        return None

    async def resume_kv_cache(self):
        return None

    async def start_profile(self, **kwargs):
        return None

    async def stop_profile(self):
        return None


class HFReplica(RolloutReplica):
    async def launch_servers(self):
        name = server_name(self.replica_rank)
        server = ray.remote(HFServer).options(name=name, num_cpus=0, max_concurrency=1000).remote(
            self.model_config.get("local_path") or self.model_config.path,
            seed=int(self.config.seed) + self.replica_rank)  # rollout.seed, as vLLM replicas use it
        await server.wake_up.remote()
        self.servers = [server]
        self._server_handle = server
        self._server_address = name

    def rollout_worker_use_gpu(self) -> bool:
        return False


class HFRollout(BaseRollout):
    """Lives in each hybrid actor worker: forwards the trainer's weights to the replica's server."""

    def __init__(self, config, model_config, device_mesh, *args, **kwargs):
        super().__init__(config, model_config, device_mesh)
        world = (self.config.tensor_model_parallel_size * self.config.data_parallel_size
                 * self.config.pipeline_model_parallel_size)
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        self.replica_rank, self.is_leader_rank = rank // world, rank % world == 0
        self.sleep_level = 2

    async def resume(self, tags: list[str]):
        return None

    async def release(self):
        return None

    async def update_weights(self, weights, wire_format: str = "named_tensors", global_steps: Optional[int] = None,
                             **kwargs):
        if wire_format != "named_tensors":
            raise ValueError(f"hf rollout supports only named_tensors weight updates, got {wire_format!r}")
        state = {}
        for name, tensor in weights:  # every rank iterates: producing full tensors may be collective
            if self.is_leader_rank:
                state[name] = tensor.detach().to("cpu", copy=True)
        if self.is_leader_rank:
            server = ray.get_actor(server_name(self.replica_rank))
            await server.load_weights.remote(state, global_steps)


def register() -> None:
    """Add ``hf`` to verl's rollout and replica registries."""
    from verl.workers.rollout import base
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    base._ROLLOUT_REGISTRY[(NAME, "async")] = f"{__name__}.HFRollout"
    RolloutReplicaRegistry.register(NAME, lambda: HFReplica)
