"""The generation backends outside training and what builds them: vLLM's async engine
(:class:`VLLMServerManager`), the batched transformers engine (:mod:`train.inference.hf_engine`), the
one tokenizer loader, and the search client (HTTP server or an
in-process index). Every backend has verl's server-manager interface: ``await generate(request_id,
prompt_ids=..., sampling_params=...) -> TokenOutput``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from train.errors import EngineDead, InferenceError
from train.inference.settings import VLLM_DEFAULTS, AskSettings


def looks_local(path: str) -> bool:
    return path.startswith(("/", "./", "../", "~")) or os.path.exists(path) or path.count("/") != 1


def check_model_path(model: str) -> None:
    """A local model folder that is not there is an error here, before anything loads."""
    if not model:
        raise InferenceError("no --model given")
    if looks_local(model) and not Path(os.path.expanduser(model)).is_dir():
        raise InferenceError(f"model path not found: {model}")


def load_tokenizer_and_check(model: str):
    from transformers import AutoTokenizer

    check_model_path(model)
    try:
        return AutoTokenizer.from_pretrained(os.path.expanduser(model))
    except OSError as e:
        raise InferenceError(f"cannot load model {model!r}: {e}".split("\n")[0]) from None


def is_engine_dead(exc: BaseException) -> bool:
    """``exc`` says the whole engine is gone, not one request: ours, or vLLM's ``EngineDeadError``
    (vllm/v1/engine/exceptions.py), which the front-end raises for every request once its core died."""
    return isinstance(exc, EngineDead) or any(c.__name__ == "EngineDeadError" for c in type(exc).__mro__)


def vllm_engine_env(index: int | None = None) -> dict[str, str]:
    """Environment for a process that builds a vLLM engine outside Ray.

    - ``VLLM_WORKER_MULTIPROC_METHOD=spawn``: vLLM forks its EngineCore by default (vllm/envs.py);
      a spawned core owes nothing to what the parent did with CUDA (see train/inference/cuda_probe.py).
    - With ``index`` (one of several engines starting at once): its own ``VLLM_CACHE_ROOT``
      subfolder, so engines never write the same torch.compile cache files at the same time (verl
      turns the cache off for its rollouts for that reason); each engine still reuses its own
      cache on the next run.
    Values the user set are kept."""
    env = {"VLLM_WORKER_MULTIPROC_METHOD": os.environ.get("VLLM_WORKER_MULTIPROC_METHOD", "spawn")}
    if index is not None:
        root = os.environ.get("VLLM_CACHE_ROOT") or os.path.join(
            os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "vllm")
        env["VLLM_CACHE_ROOT"] = os.path.join(root, f"search_r1_engine{index}")
    return env


class VLLMServerManager:
    """vLLM's async engine behind the server-manager interface (batched across concurrent calls)."""

    def __init__(self, model: str, dtype: str = "auto", gpu_memory_utilization: float = VLLM_DEFAULTS[
                 "gpu_memory_utilization"], seed: int = 0, tensor_parallel_size: int = 1,
                 max_num_seqs: int = VLLM_DEFAULTS["max_num_seqs"],
                 max_num_batched_tokens: int = VLLM_DEFAULTS["max_num_batched_tokens"]):
        # the engine settings come checked (AskSettings.problems, as a command reads them): vLLM gets them as they are
        os.environ.update(vllm_engine_env())  # before vLLM reads it (it is read when the core starts)
        try:
            from vllm import AsyncEngineArgs, AsyncLLMEngine
            from vllm.platforms import current_platform
        except ImportError as e:
            raise InferenceError("--backend vllm needs vLLM (pip install -e .[gpu])") from e

        # Which build this is, from vLLM's platform (NVML on GPUs), never torch.cuda.is_available(): that
        # runs cuInit here, and the EngineCore that vLLM forks would die (train/inference/cuda_probe.py).
        # vLLM's CPU build (tests, CI): no CUDA graphs to capture; its KV cache size comes from
        # VLLM_CPU_KVCACHE_SPACE (GiB), not from gpu_memory_utilization. Prefix caching (vLLM's default)
        # lets each turn of a trajectory reuse the KV of the turns before it.
        on_cpu = current_platform.is_cpu()
        self.engine_args = dict(model=model, dtype=dtype, gpu_memory_utilization=gpu_memory_utilization, seed=seed,
                                enforce_eager=on_cpu, tensor_parallel_size=tensor_parallel_size,
                                max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                                enable_prefix_caching=True)
        self.engine = AsyncLLMEngine.from_engine_args(AsyncEngineArgs(**self.engine_args))
        self._n = 0

    async def generate(self, request_id=None, *, prompt_ids, sampling_params, **kwargs):
        from verl.workers.rollout.replica import TokenOutput
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        sp = dict(sampling_params)
        logprobs = sp.pop("logprobs", None)
        sp["logprobs"] = 0 if logprobs else None
        self._n += 1
        final = None
        try:
            async for out in self.engine.generate(TokensPrompt(prompt_token_ids=list(prompt_ids)),
                                                  SamplingParams(**sp), request_id=f"{request_id}-{self._n}"):
                final = out
        except Exception as e:
            if is_engine_dead(e) or getattr(self.engine, "errored", False):
                raise EngineDead(f"the vLLM engine died ({type(e).__name__}: {e})") from e
            raise
        comp = final.outputs[0]
        lps = [next(iter(d.values())).logprob for d in comp.logprobs] if logprobs and comp.logprobs else None
        return TokenOutput(token_ids=list(comp.token_ids), log_probs=lps, stop_reason="completed")


def make_generator(settings: AskSettings):
    """The generation backend of ``settings``: ``hf`` (transformers; batched decoding with the KV cache
    kept across the turns of a trajectory, :class:`train.inference.hf_engine.HFBatchedServerManager`,
    which loads the model and its tokenizer once) or ``vllm`` (:meth:`AskSettings.vllm_engine`)."""
    model = settings.model
    if settings.backend == "hf":
        from train.inference.hf_engine import HFBatchedServerManager

        check_model_path(model)
        try:
            return HFBatchedServerManager.from_pretrained(
                os.path.expanduser(model), device=settings.device, seed=settings.seed,
                dtype=None if settings.dtype == "auto" else settings.dtype)
        except OSError as e:
            raise InferenceError(f"cannot load model {model!r}: {e}".split("\n")[0]) from None
    if settings.backend == "vllm":
        return VLLMServerManager(model, dtype=settings.dtype, seed=settings.seed,
                                 tensor_parallel_size=settings.tensor_parallel_size, **settings.vllm_engine())
    raise InferenceError(f"--backend must be hf or vllm, got {settings.backend!r}")


def make_search_client(retriever_url: Optional[str] = None, corpus: Optional[str] = None,
                       index: Optional[str] = None, topk: int = 3, check: bool = True):
    """An HTTP client (checked for reachability) or an in-process retriever."""
    from retrieval.client import LocalRetrievalClient, RetrievalClient

    if index:
        from retrieval.index import load_retriever

        try:
            return LocalRetrievalClient(load_retriever(index, corpus), topk=topk)
        except (FileNotFoundError, ValueError) as e:
            raise InferenceError(f"cannot load the index: {e}") from None
    url = retriever_url or "http://127.0.0.1:8000"
    client = RetrievalClient(url, topk=topk, retries=2, backoff=0.2)
    if check:
        try:
            client.health()
        except Exception:
            raise InferenceError(
                f"the retrieval server at {url} is not reachable. Start it with `bash retrieval_launch.sh` "
                "(or pass --index DIR for an in-process retriever).") from None
    return client
