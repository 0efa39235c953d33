"""Supervised steps on Search-R1 trajectories (the warm start of a policy that cannot write the format).

Where they run: :func:`pick_device`. On a GPU the weights and the optimizer stay fp32 and the forward and
backward run under bf16 autocast (where the GPU has bf16); on the CPU everything is fp32, as it always was.
"""

from __future__ import annotations

import contextlib
import os
import random
import time
from typing import Callable, Optional

#: (question, [(text, trained?), ...]): the prompt is built from the question by the protocol
Trajectory = tuple[str, list[tuple[str, bool]]]

#: a tokenizer's files, copied as they are into the warm-started folder: the folder carries the tokenizer
#: the model came with, whatever the installed transformers would write when saving one
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.json", "merges.txt", "tokenizer.model", "chat_template.jinja", "chat_template.json")


def tokenize_trajectories(tok, trajectories: list[Trajectory], max_tokens: int) -> list[tuple[list[int], list[int]]]:
    """(input ids, labels) per trajectory: the rendered prompt and observations carry no loss
    (label -100); the policy's turns and the closing EOS do. Kept from the end when longer than
    ``max_tokens``."""
    from train.search_r1 import prompts

    out = []
    for q, parts in trajectories:
        ids = tok.encode(prompts.render_prompt(tok, q), add_special_tokens=False)
        labels = [-100] * len(ids)
        for text, trained in parts:
            t = tok.encode(text, add_special_tokens=False)
            ids += t
            labels += t if trained else [-100] * len(t)
        ids.append(tok.eos_token_id)
        labels.append(tok.eos_token_id)
        out.append((ids[-max_tokens:], labels[-max_tokens:]))
    return out


def pick_device(requested: Optional[str] = None) -> str:
    """Where the supervised steps run: ``requested`` (``cpu``, ``cuda``, ``cuda:N``), or with None or ``auto``
    the GPU when torch sees one, else the CPU. A GPU asked for where there is none is a UserError."""
    import torch

    if requested in (None, "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested.startswith("cuda") and not torch.cuda.is_available():
        from train.errors import UserError

        raise UserError(f"--device {requested}: torch sees no GPU here (--device cpu, or leave it out)")
    return requested


def sft_protocol(model_dir: str | os.PathLike, trajectories: Callable[[Callable[[str], int]], list[Trajectory]], *,
                 steps: int = 300, batch: int = 8, lr: float = 3e-3, seed: int = 0, max_tokens: int = 384,
                 progress: bool = False, out_dir: Optional[str | os.PathLike] = None, weight_decay: float = 0.01,
                 log: Optional[Callable[[str], None]] = None, sampling: str = "epochs", device: str = "cpu") -> dict:
    """Supervised steps on Search-R1 trajectories: ``trajectories(count_tokens)`` returns
    ``[(question, [(text, trained?), ...]), ...]`` (observations sized in the policy's tokens).
    Only the ``trained`` parts carry loss (observation tokens do not), plus the final EOS. Saves the
    model (and its tokenizer) to ``out_dir`` (default: over ``model_dir``). ``sampling``: ``"epochs"`` (every
    trajectory once before any twice) or ``"replacement"`` (each batch an independent draw: the toy policies'
    warm start, with which their recorded learning numbers were measured). ``device``: where the steps run
    (:func:`pick_device`; the toy policies keep the CPU, on which their numbers were measured); the saved
    weights are fp32 either way."""
    if sampling not in ("epochs", "replacement"):
        raise ValueError(f"sampling must be 'epochs' or 'replacement', got {sampling!r}")
    import torch
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dev = torch.device(device)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(dev)
    bf16 = dev.type == "cuda" and torch.cuda.is_bf16_supported()
    count = lambda s: len(tok.encode(s, add_special_tokens=False))  # noqa: E731
    examples = tokenize_trajectories(tok, trajectories(count), max_tokens)
    if len(examples) < batch:
        raise ValueError(f"{len(examples)} trajectories for a batch of {batch}")
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    rng = random.Random(seed)
    torch.manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    model.train()
    losses, t0, order = [], time.time(), []
    for step in tqdm(range(steps), desc="warm start (SFT)", unit="step", disable=not progress, mininterval=5):
        if sampling == "replacement":
            chunk = rng.sample(examples, batch)
        else:
            if len(order) < batch:
                order += rng.sample(range(len(examples)), len(examples))
            chunk = [examples[i] for i in order[:batch]]
            del order[:batch]
        width = max(len(i) for i, _ in chunk)
        input_ids = torch.full((batch, width), pad)
        labels = torch.full((batch, width), -100)
        attn = torch.zeros((batch, width), dtype=torch.long)
        for b, (ids, lab) in enumerate(chunk):
            input_ids[b, : len(ids)] = torch.tensor(ids)
            labels[b, : len(lab)] = torch.tensor(lab)
            attn[b, : len(ids)] = 1
        with torch.autocast("cuda", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext():
            loss = model(input_ids=input_ids.to(dev), attention_mask=attn.to(dev), labels=labels.to(dev)).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        if log and (step + 1) % 10 == 0:
            log(f"  step {step + 1}/{steps}: loss {sum(losses[-10:]) / 10:.4f} ({time.time() - t0:.0f} s)")
    model.eval()
    out = out_dir or model_dir
    model.save_pretrained(out)
    if out_dir:
        copy_tokenizer(model_dir, out, tok)
    return {"first_loss": losses[0], "last_loss": sum(losses[-10:]) / min(10, len(losses)), "examples": len(examples),
            "steps": steps, "batch": batch, "lr": lr, "seconds": round(time.time() - t0, 1),
            "epochs": round(steps * batch / len(examples), 2), "losses": [round(x, 4) for x in losses]}


def copy_tokenizer(src: str | os.PathLike, dst: str | os.PathLike, tok) -> None:
    """The tokenizer of the folder ``src`` into ``dst``, byte for byte (``tok.save_pretrained`` when ``src`` is
    not a local folder)."""
    import shutil
    from pathlib import Path

    if not Path(src).is_dir():
        tok.save_pretrained(dst)
        return
    for name in TOKENIZER_FILES:
        if (Path(src) / name).is_file():
            shutil.copy2(Path(src) / name, Path(dst) / name)
