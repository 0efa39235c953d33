"""The settings of asking a model: one frozen object that ``infer.py``, ``python -m train.evaluate``,
its engine workers and its checkpoint sweep all take whole.

- :class:`AskSettings` holds every setting an asker is built from (the model, the backend and its
  vLLM engine settings, the method, the retriever, the search budget, sampling, the concurrency);
- :func:`add_flags` puts their flags on a command's parser and :meth:`AskSettings.from_args` reads them
  back: a flag is a field, with the same name (``tests/inference/test_settings_on_cpu.py`` fails on a
  field without a flag or a flag without a field);
- :meth:`AskSettings.to_json` / :meth:`AskSettings.from_json` carry them whole to an engine worker in
  another process, and :meth:`AskSettings.replace` changes one (the sweep's model per checkpoint).

No torch, transformers or vLLM import here: a command's ``--help`` and a worker's start stay light.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from dataclasses import dataclass, fields
from typing import Optional

from train.errors import InferenceError
from train.models import registry as models
from train.search_r1 import prompts
from train.search_r1.config import SearchConfig

#: the defaults outside training: the evaluation settings of the training config (search_r1 block)
MAX_TURNS, TOPK, MAX_NEW_TOKENS = SearchConfig.val_max_turns, SearchConfig.topk, SearchConfig.max_turn_tokens
#: The released LLDS checkpoint used when --model is not given (SEGAgentRL on the Hugging Face hub:
#: Qwen2.5-3B-Instruct trained with GSPO + LLDS-A, the best 3B row of the paper, avg EM .451).
DEFAULT_MODEL = "SEGAgentRL/LLDS-A-GSPO-Qwen2.5-3B-Ins"
#: vLLM engine settings for evaluation and infer.py, written out instead of inherited: an engine built
#: with ``AsyncLLMEngine.from_engine_args`` gets UsageContext.ENGINE_CONTEXT's defaults (vllm
#: engine/arg_utils.py: 128 sequences, 2,048 batched tokens), while the evaluator keeps 256 questions
#: in flight per engine (``--concurrency``). ``max_num_seqs`` follows the concurrency; 16,384 batched
#: tokens lets a step prefill several returning observations (500 tokens each) at once, as vLLM's own
#: ``LLM`` class does on large GPUs. ``gpu_memory_utilization`` is a share of the GPU's *total* memory
#: that vLLM checks against its *free* memory at start: leave room for the retriever's shard on the
#: same GPU (docs/training.md, "GPU memory per GPU").
VLLM_DEFAULTS = {"max_num_seqs": 256, "max_num_batched_tokens": 16384, "gpu_memory_utilization": 0.85}
#: ``--dtype``: the weights' and activations' type. ``auto``: with ``--backend hf``, bf16 on a GPU and fp32 on
#: the CPU; with vLLM, the model's config (bf16 for Qwen2.5 and SmolLM2). vLLM's CPU build computes a bf16
#: linear layer with a oneDNN kernel only where the CPU has bf16 instructions (AVX-512 BF16 / AMX); elsewhere
#: it falls back to a torch matmul, 5.15x slower than fp32 on an AMD EPYC Zen 3 (bench/bench_vllm_dtype.py).
#: Greedy answers may differ between types.
DTYPES = ("auto", "bfloat16", "float16", "float32")
#: the fields besides the weights that decide an answer (:meth:`AskSettings.answer_settings`)
ANSWER_FIELDS = ("backend", "dtype", "method", "max_turns", "topk", "max_new_tokens", "temperature")


@dataclass(frozen=True)
class AskSettings:
    """Everything an asker is built from. Each field is the flag of the same name (``--max-turns``)."""

    model: Optional[str] = DEFAULT_MODEL
    backend: str = "hf"
    method: str = "search_r1"
    retriever_url: str = "http://127.0.0.1:8000"
    index: Optional[str] = None
    corpus: Optional[str] = None
    max_turns: int = MAX_TURNS
    topk: int = TOPK
    max_new_tokens: int = MAX_NEW_TOKENS
    temperature: float = 0.0
    seed: int = 0
    device: Optional[str] = None
    dtype: str = "auto"
    concurrency: int = 256
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = VLLM_DEFAULTS["gpu_memory_utilization"]
    max_num_seqs: Optional[int] = None
    max_num_batched_tokens: int = VLLM_DEFAULTS["max_num_batched_tokens"]

    @classmethod
    def from_args(cls, args: argparse.Namespace, **overrides) -> "AskSettings":
        """The settings of parsed :func:`add_flags` arguments; a flag a command does not offer keeps
        its default (the evaluator is greedy: no ``--temperature``)."""
        given = {f.name: getattr(args, f.name) for f in fields(cls) if hasattr(args, f.name)}
        settings = {**given, **overrides}
        if "model" in settings:  # a name of train/models/registry.py -> its converted folder
            settings["model"] = models.resolve(settings["model"])
        return cls(**settings)

    def answer_settings(self) -> dict:
        """What decides the answers, as a results file records it beside its rows
        (:class:`train.inference.results_file.ResultsFile`): the model's weights
        (:func:`train.models.registry.weights_id`), the backend and its dtype, the method, the search budget
        and the sampling. Not the retriever's address, the device or the engine's sizes: those change
        between resumes of one evaluation (a new port) without changing what is asked."""
        out = {"weights": models.weights_id(self.model), "model_path": self.model,
               **{name: getattr(self, name) for name in ANSWER_FIELDS}}
        if self.temperature > 0:
            out["seed"] = self.seed
        return out

    def replace(self, **changes) -> "AskSettings":
        return dataclasses.replace(self, **changes)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "AskSettings":
        """Settings sent whole to another process, checked there (:meth:`problems`; the first raises)."""
        data = json.loads(text)
        unknown = set(data) - {f.name for f in fields(cls)}
        if unknown:
            raise InferenceError(f"settings with unknown fields {sorted(unknown)} (a worker of another version?)")
        settings = cls(**data)
        wrong = settings.problems()
        if wrong:
            raise InferenceError(wrong[0])
        return settings

    def problems(self) -> list[str]:
        """What is wrong with these values, one message each naming the flag (empty: nothing). The one check
        of an asker's settings: every command checks them here as it reads them (:func:`from_parsed`,
        :meth:`from_json`), and what is built from them (the asker, the engines) takes them as they are."""
        out = []
        if self.backend not in ("hf", "vllm"):
            out.append(f"--backend must be hf or vllm, got {self.backend!r}")
        if self.method not in prompts.METHODS:
            out.append(f"--method must be one of {', '.join(prompts.METHODS)}, got {self.method!r}")
        for name in ("concurrency", "topk", "max_new_tokens", "tensor_parallel_size", "max_num_batched_tokens"):
            if getattr(self, name) < 1:
                out.append(f"--{name.replace('_', '-')} must be >= 1")
        if self.max_turns < 0:
            out.append("--max-turns must be >= 0")
        if self.temperature < 0:
            out.append("--temperature must be >= 0")
        if self.max_num_seqs is not None and self.max_num_seqs < 1:
            out.append("--max-num-seqs must be >= 1")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            out.append(f"--gpu-memory-utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.dtype not in DTYPES:
            out.append(f"--dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.tensor_parallel_size > 1 and self.backend != "vllm":
            out.append("--tensor-parallel-size needs --backend vllm")
        return out

    def vllm_engine(self) -> dict:
        """The vLLM engine's settings (``max_num_seqs`` defaults to the questions in flight)."""
        return {"gpu_memory_utilization": self.gpu_memory_utilization,
                "max_num_seqs": int(self.max_num_seqs or self.concurrency or VLLM_DEFAULTS["max_num_seqs"]),
                "max_num_batched_tokens": self.max_num_batched_tokens}


def add_flags(ap: argparse.ArgumentParser, *, sampling: bool = True,
              concurrency_help: str = "questions in flight (default %(default)s)") -> None:
    """The flags of :class:`AskSettings` (``--model`` and ``--method`` are the commands' own: their
    help differs). ``sampling=False`` leaves out ``--temperature`` and ``--seed`` (the evaluator is greedy)."""
    d = AskSettings()
    ap.add_argument("--backend", choices=["hf", "vllm"], default=d.backend)
    ap.add_argument("--retriever-url", default=d.retriever_url)
    ap.add_argument("--index", default=d.index, help="index directory (or .index file) for an in-process retriever")
    ap.add_argument("--corpus", default=d.corpus, help="corpus jsonl for --index without a manifest")
    ap.add_argument("--max-turns", type=int, default=d.max_turns, help="searches per question (default %(default)s)")
    ap.add_argument("--topk", type=int, default=d.topk, help="passages per search (default %(default)s)")
    ap.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens, help="per turn (default %(default)s)")
    if sampling:
        ap.add_argument("--temperature", type=float, default=d.temperature, help="0 = greedy")
        ap.add_argument("--seed", type=int, default=d.seed)
    ap.add_argument("--device", default=d.device)
    ap.add_argument("--dtype", default=d.dtype, help="auto (hf: bf16 on a GPU, fp32 on the CPU; vLLM: the model's "
                    "config), bfloat16, float16 or float32; on a CPU without bf16 instructions float32 is the fast one "
                    "with vLLM")
    ap.add_argument("--concurrency", type=int, default=d.concurrency, help=concurrency_help)
    ap.add_argument("--tensor-parallel-size", type=int, default=d.tensor_parallel_size,
                    help="GPUs per vLLM engine (default %(default)s)")
    g = ap.add_argument_group("vLLM engine (--backend vllm)")
    g.add_argument("--gpu-memory-utilization", type=float, default=d.gpu_memory_utilization,
                   help="share of each GPU's total memory the engine may take (default %(default)s); vLLM checks it "
                        "against the free memory at start, so leave room for a retriever on the same GPU")
    g.add_argument("--max-num-seqs", type=int, default=d.max_num_seqs,
                   help="sequences the engine decodes at once (default: the questions in flight, --concurrency)")
    g.add_argument("--max-num-batched-tokens", type=int, default=d.max_num_batched_tokens,
                   help="tokens per engine step, prefill chunks included (default %(default)s)")


def from_parsed(ap: argparse.ArgumentParser, args: argparse.Namespace, **overrides) -> AskSettings:
    """:meth:`AskSettings.from_args`, with a bad value reported as an argparse error (exit 2, naming the flag)."""
    settings = AskSettings.from_args(args, **overrides)
    wrong = settings.problems()
    if wrong:
        ap.error(wrong[0])
    return settings
