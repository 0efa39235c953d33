"""The training-kernel parts: logprobs (the chunked log-probs against verl's formula), attention (packed
attention, bench/bench_attention.py's paths) and critic (the value model's build on a packed batch)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from train import REPO_ROOT
from train.gpucheck.environment import sync, tiny_model
from train.gpucheck.report import Report

# -- logprobs -------------------------------------------------------------------------------------------

def part_logprobs(rep: Report, device: str, tokens_list, vocab: int) -> None:
    import torch

    from train.workers.logprobs import chunked_logprobs

    cuda = device.startswith("cuda")
    dtype = torch.bfloat16 if cuda else torch.float32
    for tokens in tokens_list:
        g = torch.Generator(device="cpu").manual_seed(tokens)
        logits0 = (torch.randn(tokens, vocab, generator=g) * 3).to(device, dtype)
        labels = torch.randint(0, vocab, (tokens,), generator=g).to(device)
        results = {}
        for name in ("verl's formula", "chunked"):
            logits = logits0.clone().requires_grad_(True)
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                start_mem = torch.cuda.memory_allocated()
            t0 = time.perf_counter()
            if name == "chunked":
                lp = chunked_logprobs(logits, labels)
            else:  # verl's logprobs_from_logits_v2, vectorised: logit[label] - logsumexp(logits), in fp32
                lf = logits.float()
                lp = lf.gather(-1, labels[:, None]).squeeze(-1) - torch.logsumexp(lf, -1)
            lp.sum().backward()
            sync(device)
            dt = time.perf_counter() - t0
            peak = (torch.cuda.max_memory_allocated() - start_mem) / 2**30 if cuda else float("nan")
            results[name] = (lp.detach().float(), logits.grad.float(), dt, peak)
            del logits, lp
        (a, ga, ta, pa), (b, gb, tb, pb) = results["verl's formula"], results["chunked"]
        err, gerr = float((a - b).abs().max()), float((ga - gb).abs().max())
        tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
        rep.add("logprobs", f"{tokens:,} tokens x {vocab:,}: max |diff| log-prob / grad", f"{err:.1e} / {gerr:.1e}",
                err <= tol and gerr <= tol)
        mem = f", peak {pb:.2f} vs {pa:.2f} GiB" if cuda else ""
        rep.add("logprobs", f"{tokens:,} tokens: fwd+bwd time chunked vs formula",
                f"{tb * 1e3:.0f} vs {ta * 1e3:.0f} ms{mem}",
                None)


# -- attention ------------------------------------------------------------------------------------------

def part_attention(rep: Report, device: str, tokens: int, heads: int, kv_heads: int, head_dim: int) -> None:
    """The attention paths are bench/bench_attention.py's, in the source checkout (an installed wheel has no
    bench/: the part is skipped with that reason)."""
    if not (REPO_ROOT / "bench" / "bench_attention.py").is_file():
        rep.add("attention", "skipped", f"needs the source checkout's bench/bench_attention.py (not in {REPO_ROOT})",
                None)
        return
    if str(REPO_ROOT) not in sys.path:
        sys.path.append(str(REPO_ROOT))
    from bench import bench_attention as ba

    for row in ba.gpu_check_rows(device=device, tokens=tokens, heads=heads, kv_heads=kv_heads, head_dim=head_dim):
        rep.add("attention", row["check"], row["value"], row["ok"])


# -- critic ---------------------------------------------------------------------------------------------

def part_critic(rep: Report, device: str, work: Path) -> None:
    import torch
    from transformers import AutoConfig

    from train.workers import value_model

    path = tiny_model(work, hidden=128, layers=2, heads=4)
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    cfg = AutoConfig.from_pretrained(str(path), num_labels=1)
    cfg._attn_implementation = "sdpa"
    model = value_model.load_value_model(str(path), dtype, cfg, False).to(device).eval()
    attn = model.config._attn_implementation
    rep.add("critic", "value model built, attention", f"{type(model).__name__}, {attn}", attn == "sdpa")
    g = torch.Generator(device="cpu").manual_seed(0)
    lens = [37, 91, 64]
    seqs = [torch.randint(5, cfg.vocab_size, (n,), generator=g) for n in lens]
    with torch.no_grad():  # as verl's remove-padding pass: one row, restarting positions, no cache
        packed = model(input_ids=torch.cat(seqs)[None].to(device), use_cache=False,
                       position_ids=torch.cat([torch.arange(n) for n in lens])[None].to(device)).logits[0, :, 0]
        alone = torch.cat([model(input_ids=s[None].to(device), use_cache=False).logits[0, :, 0] for s in seqs])
    err = float((packed.float() - alone.float()).abs().max())
    tol = 5e-2 if dtype == torch.bfloat16 else 1e-4
    rep.add("critic", "packed values = separate forwards (max |diff|)", f"{err:.1e}", err <= tol)

