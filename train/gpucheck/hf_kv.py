"""The hf_kv part: the hf engine's kept KV caches own exactly their rows' storage, stay under the bound,
and give the device memory back once the trajectories are released."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from train.gpucheck.environment import MiB, blas_workspace, memory, tiny_model
from train.gpucheck.report import Report

# -- hf_kv ----------------------------------------------------------------------------------------------

#: what the hf engine may hold beyond its kept caches once a load is done (the last prompt's prefill keys/values,
#: < 1 MiB here, stay referenced by the engine thread's loop until the next request): the kept caches are
#: ~14 MiB (bf16; 28 MiB in fp32 on CPU), so a leak of a third of them shows
HF_KV_SLACK = 4 * MiB


def part_hf_kv(rep: Report, device: str, work: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from train.inference.hf_engine import HFBatchedServerManager

    path = tiny_model(work, hidden=256, layers=2, heads=4)
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).to(device).eval()
    tok = AutoTokenizer.from_pretrained(str(path))
    cuda = device.startswith("cuda")
    rows = 32
    bound = 64 << 20
    eng = HFBatchedServerManager(model, tok, device, 0, max_batch=rows, max_cached_bytes=bound)
    text = "the capital of france is paris and the capital of italy is rome . "
    prompts = [tok.encode(text * (4 + i % 7)) for i in range(rows)]

    async def go():
        return await asyncio.gather(*(eng.generate(request_id=f"r{i}", prompt_ids=p,
                                                   sampling_params={"temperature": 0, "max_tokens": 8 + 5 * (i % 9)})
                                      for i, p in enumerate(prompts)))

    # Warm-up: the engine's thread (started by its first request) runs its first matmuls, and torch allocates
    # that thread's cuBLAS (and cuBLASLt) workspace through the caching allocator and keeps it for the process
    # (32 MiB on sm_90, 8.125 MiB on sm_80). It is the engine's, not the caches': the baseline comes after it.
    before_warm = memory(device)[0]

    async def warm():
        return await eng.generate(request_id="warm-up", prompt_ids=prompts[0][:16],
                                  sampling_params={"temperature": 0, "max_tokens": 4})

    asyncio.run(warm())
    eng.release("warm-up")
    base = memory(device)[0]
    if cuda:
        rep.add("hf_kv", "engine thread warm-up held (its cuBLAS workspace)",
                f"{(base - before_warm) / MiB:.2f} MiB (torch's per thread: {blas_workspace().describe()})", None)
    t0 = time.perf_counter()
    asyncio.run(go())
    dt = time.perf_counter() - t0
    bad = 0
    own_total = 0
    for _, (tokens, kv) in eng.cache.items():
        for k, v in kv:
            for t in (k, v):
                own = t.numel() * t.element_size()
                own_total += own
                bad += int(t.untyped_storage().nbytes() != own or t.shape[0] != 1 or t.shape[2] != len(tokens))
    rep.add("hf_kv", f"{len(eng.cache)} kept caches own exactly their rows", f"{bad} tensors hold more", bad == 0)
    rep.add("hf_kv", "kept bytes within the bound", f"{eng.kept_bytes / 2**20:.1f} of {bound / 2**20:.0f} MiB",
            eng.kept_bytes == own_total and eng.kept_bytes <= bound)
    if cuda:
        held = memory(device)[0] - base
        rep.add("hf_kv", "GPU memory held with the caches kept (over the warmed-up engine)",
                f"{held / MiB:.1f} MiB (kept {own_total / MiB:.1f}, slack {HF_KV_SLACK / MiB:.0f})",
                held <= own_total + HF_KV_SLACK)
    for rid in list(eng.cache):
        eng.release(rid)
    if cuda:
        left = memory(device)[0] - base
        rep.add("hf_kv", "GPU memory after every trajectory is released",
                f"{left / MiB:.2f} MiB above the warmed-up engine (slack {HF_KV_SLACK / MiB:.0f})",
                left <= HF_KV_SLACK)
    rep.add("hf_kv", f"{rows} requests of 8-48 tokens, batched", f"{dt:.2f} s", None)
    eng.close()

