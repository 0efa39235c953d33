"""LLDS overhead (not a test): the actor update step with verl's ppo_loss vs ppo_loss + LLDS,
same model, same micro-batches, same process; prints the ratio.

    python bench/bench_llds.py                 # tiny Qwen2 on CPU
    python bench/bench_llds.py --device cuda --B 64 --T 4096 --loss-only   # the loss alone at real sizes

One "update step" = forward (log-probs) + loss + backward + optimizer step, per micro-batch
laid out by verl (TensorDict, no-padding). ``--loss-only`` times just the loss on random log-probs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bench.verl_layout import actor_config, jagged_log_probs, make_batch, padded_response_log_probs, to_micro_batches  # noqa: E402
from train.llds.loss import LLDSConfig, llds_ppo_loss  # noqa: E402


def timeit(fn, reps):
    fn()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def update_step_bench(args):
    from transformers import AutoModelForCausalLM

    from train.toy.tiny_model import build_tiny_model

    h, L = args.hidden_size, args.layers
    path = build_tiny_model(Path(tempfile.gettempdir()) / f"bench_qwen2_h{h}_l{L}", ROOT / "data" / "corpus.jsonl",
                            hidden_size=h, layers=L, heads=max(2, h // 64))
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    cfg = actor_config()
    t = make_batch(B=4, P=64, R=args.T, vocab=model.config.vocab_size)
    lp = padded_response_log_probs(model, t)
    t["old_log_probs"] = lp + 0.1 * torch.randn_like(lp)
    t["ref_log_prob"] = lp.clone()
    n_tok = int(t["response_mask"].sum())
    tds = to_micro_batches(t, 2, n_tok)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)

    def step(llds):
        opt.zero_grad()
        for td in tds:
            loss, _ = llds_ppo_loss(cfg, {"log_probs": jagged_log_probs(model, td)}, td, llds=llds)
            loss.backward()
        opt.step()

    off, on = LLDSConfig(enable=False), LLDSConfig(enable=True, gate="action")

    # The LLDS part alone, on these very micro-batches: loss + backward w.r.t. fixed log-probs.
    with torch.no_grad():
        fixed = [jagged_log_probs(model, td).values() for td in tds]

    def loss_only(llds):
        for td, values in zip(tds, fixed):
            leaf = values.clone().requires_grad_()
            nested = torch.nested.nested_tensor_from_jagged(leaf, offsets=td["input_ids"].offsets())
            loss, _ = llds_ppo_loss(cfg, {"log_probs": nested}, td, llds=llds)
            loss.backward()

    part = timeit(lambda: loss_only(on), args.reps * 4) - timeit(lambda: loss_only(off), args.reps * 4)
    base, cand = [], []
    for r in range(args.rounds):  # interleave in ABBA order, so drift and order effects hit both
        order = [(base, off), (cand, on)] if r % 2 == 0 else [(cand, on), (base, off)]
        for bucket, llds in order:
            bucket.append(timeit(lambda: step(llds), args.reps))
    b, c = statistics.median(base), statistics.median(cand)
    n_params = sum(p.numel() for p in model.parameters()) / 1e6
    print(f"update step (Qwen2 hidden {h}, {L} layers, {n_params:.2f}M params, CPU, 2 micro-batches of "
          f"2 x {64 + args.T} tokens): "
          f"verl ppo_loss {b * 1e3:.1f} ms, + LLDS {c * 1e3:.1f} ms, ratio {c / b:.3f} (A/B of whole steps)")
    print(f"LLDS term measured alone on the same micro-batches: {part * 1e3:.2f} ms per step = "
          f"{1 + part / b:.3f} x the step")


def loss_only_bench(args):
    cfg = actor_config()
    dev = args.device
    B, T = args.B, args.T
    t = make_batch(B=B, P=16, R=T, vocab=1000)
    lp = torch.randn(B, T).clamp(max=0) - 0.1
    t["old_log_probs"] = lp + 0.1 * torch.randn(B, T)
    t["ref_log_prob"] = lp.clone()
    td = to_micro_batches(t, 1, int(t["response_mask"].sum()))[0]
    td = td.to(dev)
    values = torch.randn(td["input_ids"].values().shape[0], device=dev, requires_grad=True)
    nested = lambda: torch.nested.nested_tensor_from_jagged(values.clamp(max=0), offsets=td["input_ids"].offsets())

    def run(llds):
        loss, _ = llds_ppo_loss(cfg, {"log_probs": nested()}, td, llds=llds)
        loss.backward()

    b = timeit(lambda: run(LLDSConfig(enable=False)), args.reps)
    c = timeit(lambda: run(LLDSConfig(enable=True)), args.reps)
    print(f"loss + backward only, B={B} T={T} on {dev}: ppo_loss {b * 1e3:.2f} ms, + LLDS {c * 1e3:.2f} ms, "
          f"ratio {c / b:.3f}")


def breakdown_bench(args):
    """The LLDS math alone (no verl): penalty + gate forward/backward, and the diagnostics."""
    from train.llds.penalty import llds_penalty_and_gate, llds_stats, merge_stats

    B, T = args.B, args.T
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(B, T, generator=g)
    new = (old + 0.05 * torch.randn(B, T, generator=g)).requires_grad_()
    adv = torch.randn(B, 1, generator=g).expand(B, T).contiguous()
    mask = torch.ones(B, T, dtype=torch.long)
    mask[:, T // 4: T // 4 + 10] = 0
    ans = torch.zeros(B, T, dtype=torch.long)
    ans[:, -3:] = 1
    pen = timeit(lambda: llds_penalty_and_gate(old, new, adv, mask, answer_mask=ans)[0].sum().backward(), args.reps)
    _, gate = llds_penalty_and_gate(old, new, adv, mask, answer_mask=ans)
    stats = timeit(lambda: merge_stats([llds_stats(old, new.detach(), adv, mask, answer_mask=ans, open_gate=gate)]),
                   args.reps)
    print(f"LLDS math alone at [{B}, {T}]: penalty + gate fwd/bwd {pen * 1e3:.2f} ms, diagnostics {stats * 1e3:.2f} ms")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--B", type=int, default=64)
    ap.add_argument("--T", type=int, default=256)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--loss-only", action="store_true")
    ap.add_argument("--breakdown", action="store_true", help="time the LLDS math alone at [B, T]")
    ap.add_argument("--hidden-size", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    args = ap.parse_args()
    torch.manual_seed(0)
    if args.breakdown:
        breakdown_bench(args)
    elif args.loss_only:
        loss_only_bench(args)
    else:
        update_step_bench(args)


if __name__ == "__main__":
    main()
