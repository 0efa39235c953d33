"""The GPU paths that need no vLLM, verl or Ray, checked on one GPU in a few minutes (``bench/gpu_check.sh``).

    bash bench/gpu_check.sh            # on a CUDA machine (torch with CUDA, transformers); < 8 min on one H200
    bash bench/gpu_check.sh --cpu      # the same parts on CPU at small sizes: checks the script itself

Parts (``--parts`` picks some):
  fork       torch.cuda.is_available() then fork: the child's CUDA fails (the mechanism that killed vLLM's
             EngineCore); train.inference.cuda_probe then fork: it works; and the evaluator's own path up to the
             engine's construction leaves CUDA untouched (a stand-in vllm records it, as tests do)
  hf_kv      the hf engine on a tiny Qwen2: every kept cache owns exactly its rows' storage, the kept bytes
             stay under the bound, and GPU memory returns to the model's once the trajectories are released
  flat       retrieval/flat.py with fp16 shards against exact fp32 search (ids, order, scores; q/s)
  logprobs   train/workers/logprobs.py's chunked log-probs against verl's formula at 8k/16k tokens (time, peak memory)
  attention  packed attention at 16,384 tokens: SDPA with the dense block-diagonal mask vs the document-aware
             path (bench/bench_attention.py), agreement and time per pass
  critic     the PPO critic's model build (train/value_model.load_value_model, SDPA) on a packed batch: values
             equal separate forwards
It prints one table and exits 1 on any mismatch. verl is not needed: where it is missing, the one class
the hf engine returns (verl's TokenOutput) and the two base classes train/workers/value_model.py subclasses are
replaced by stand-ins (the critic check exercises the model build, not verl's engine around it).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import textwrap
import time
import types
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PARTS = ("fork", "hf_kv", "flat", "logprobs", "attention", "critic")


@dataclass
class Row:
    part: str
    check: str
    value: str
    ok: bool | None  # None: information, not a pass/fail check


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)

    def add(self, part: str, check: str, value, ok: bool | None = True) -> None:
        self.rows.append(Row(part, check, str(value), ok))
        mark = {True: "ok", False: "MISMATCH", None: "info"}[ok]
        print(f"  [{part}] {check}: {value} ({mark})", flush=True)

    def table(self) -> str:
        w = [max(len(getattr(r, a)) for r in self.rows + [Row("part", "check", "value", None)])
             for a in ("part", "check", "value")]
        lines = [f"{'part':<{w[0]}}  {'check':<{w[1]}}  {'value':<{w[2]}}  status"]
        lines.append("-" * len(lines[0]))
        for r in self.rows:
            status = {True: "ok", False: "MISMATCH", None: "info"}[r.ok]
            lines.append(f"{r.part:<{w[0]}}  {r.check:<{w[1]}}  {r.value:<{w[2]}}  {status}")
        return "\n".join(lines)


def stand_in_verl() -> bool:
    """Stand-ins for the verl names these paths import, when verl is not installed. True if used."""
    try:
        import verl.workers.rollout.replica  # noqa: F401
        return False
    except ImportError:
        pass

    @dataclass
    class TokenOutput:
        token_ids: list
        log_probs: list | None = None
        stop_reason: str | None = None

    class EngineRegistry:
        _engines: dict = {}

    mods = {name: types.ModuleType(name) for name in (
        "verl", "verl.workers", "verl.workers.rollout", "verl.workers.rollout.replica", "verl.workers.engine",
        "verl.workers.engine.base", "verl.workers.engine.fsdp", "verl.workers.engine.fsdp.transformer_impl")}
    mods["verl.workers.rollout.replica"].TokenOutput = TokenOutput
    mods["verl.workers.engine.base"].EngineRegistry = EngineRegistry
    mods["verl.workers.engine.fsdp.transformer_impl"].FSDPEngineWithValueHead = type("FSDPEngineWithValueHead", (), {})
    sys.modules.update(mods)
    return True


def tiny_model(work: Path, hidden: int = 256, layers: int = 2, heads: int = 4) -> Path:
    from train.toy.tiny_model import build_tiny_model

    return build_tiny_model(work / f"tiny_{hidden}_{layers}_{heads}", ROOT / "data" / "corpus.jsonl",
                            hidden_size=hidden, layers=layers, heads=heads)


def sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


# -- fork ---------------------------------------------------------------------------------------------

def fork_source(touch: str) -> str:
    """Source of ``fork_and_touch()``: fork, run ``touch`` (one line) in the child, return its exit code
    (3 and its error on stderr when it raised)."""
    return textwrap.dedent(f"""
        def fork_and_touch():
            import os, sys
            pid = os.fork()
            if pid == 0:
                try:
                    {touch}
                    os._exit(0)
                except Exception as e:
                    sys.stderr.write(type(e).__name__ + ": " + (str(e).splitlines() or [""])[0] + "\\n")
                    os._exit(3)
            _, status = os.waitpid(pid, 0)
            return os.waitstatus_to_exitcode(status)
    """)


def write_stand_in_vllm(folder: Path, *, cpu: bool, engine_body: str, preamble: str = "") -> Path:
    """A stand-in ``vllm`` package in ``folder`` (put it first on sys.path): ``vllm.platforms.current_platform``
    says CPU or GPU, ``AsyncEngineArgs`` keeps its keywords (``.kw``), and
    ``AsyncLLMEngine.from_engine_args(args)`` runs ``engine_body`` (source; ``preamble`` at module level),
    which is where the real engine would start its EngineCore. Returns ``folder``."""
    (folder / "vllm" / "platforms").mkdir(parents=True, exist_ok=True)
    (folder / "vllm" / "platforms" / "__init__.py").write_text(
        f"class _Platform:\n    def is_cpu(self):\n        return {bool(cpu)}\n\n\ncurrent_platform = _Platform()\n")
    body = textwrap.indent(textwrap.dedent(engine_body).strip(), " " * 8)
    (folder / "vllm" / "__init__.py").write_text(
        f"{textwrap.dedent(preamble)}\n\nclass AsyncEngineArgs:\n"
        "    def __init__(self, **kw):\n        self.kw = kw\n\n\n"
        f"class AsyncLLMEngine:\n    @staticmethod\n    def from_engine_args(args):\n{body}\n")
    return folder


def part_fork(rep: Report, device: str, work: Path) -> None:
    cuda = device.startswith("cuda")
    touch = "torch.zeros(1, device='cuda').add_(1); torch.cuda.synchronize()" if cuda else "torch.zeros(1).add_(1)"
    env = {k: v for k, v in os.environ.items() if k != "PYTORCH_NVML_BASED_CUDA_CHECK"}
    for label, probe, want in (("is_available() then fork: child CUDA", "torch.cuda.is_available()", 3),
                               ("cuda_probe.gpu_count() then fork: child CUDA",
                                "from train.inference.cuda_probe import gpu_count; gpu_count()", 0)):
        code = (f"import sys; sys.path.insert(0, {str(ROOT)!r})\nimport torch\n{fork_source(touch)}\n{probe}\n"
                "sys.exit(fork_and_touch())\n")
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
        if not cuda:
            rep.add("fork", label, f"rc {r.returncode} (CPU: the mechanism needs CUDA)", r.returncode == 0)
        elif want == 3:  # shows the mechanism; not a check of our code
            rep.add("fork", label, "fails: " + (r.stderr.strip().splitlines() or ["?"])[-1][:70] if r.returncode
                    else "works (this driver/torch does not poison fork)", None)
        else:
            rep.add("fork", label, "works" if r.returncode == 0 else f"fails: {r.stderr.strip()[-120:]}",
                    r.returncode == 0)
    # The evaluator's path, up to the engine: a stand-in vllm forks a child that uses CUDA, as EngineCore does.
    fakes = write_stand_in_vllm(work / "fake_vllm", cpu=not cuda,
                                preamble="import os\nimport torch\n" + fork_source(touch),
                                engine_body="""
        import torch
        print("ENGINE", fork_and_touch(), torch.cuda.is_initialized(), os.environ.get("VLLM_WORKER_MULTIPROC_METHOD"))
        raise SystemExit(0)
    """)
    model = tiny_model(work, hidden=64)
    code = (f"import sys; sys.path[:0] = [{str(fakes)!r}, {str(ROOT)!r}]\nfrom pathlib import Path\n"
            "from train import evaluate\n"
            "from train.evaluation import options as eval_options, runner as eval_runner\n"
            f"opts = eval_options.EvalOptions.parse(['--model', {str(model)!r}, '--data', 'x', "
            "'--backend', 'vllm', "
            "'--method', 'direct'])\n"
            f"eval_runner.run_model(opts, opts.ask.model, [], Path({str(work / 'o.jsonl')!r}))\n")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("ENGINE")), "")
    parts = line.split()
    ok = len(parts) == 4 and parts[1] == "0" and parts[2] == "False" and parts[3] == "spawn"
    rep.add("fork", "evaluator -> engine: forked child CUDA, parent initialised, start method",
            (f"child rc {parts[1]}, initialised {parts[2]}, {parts[3]}" if len(parts) == 4
             else f"no engine reached: {r.stderr.strip()[-160:]}"), ok)


# -- hf_kv ----------------------------------------------------------------------------------------------

def part_hf_kv(rep: Report, device: str, work: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from train.inference.hf_engine import HFBatchedServerManager

    path = tiny_model(work, hidden=256, layers=2, heads=4)
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).to(device).eval()
    tok = AutoTokenizer.from_pretrained(str(path))
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
    rows = 32
    bound = 64 << 20
    eng = HFBatchedServerManager(model, tok, device, 0, max_batch=rows, max_cached_bytes=bound)
    text = "the capital of france is paris and the capital of italy is rome . "
    prompts = [tok.encode(text * (2 + i % 7)) for i in range(rows)]

    async def go():
        return await asyncio.gather(*(eng.generate(request_id=f"r{i}", prompt_ids=p,
                                                   sampling_params={"temperature": 0, "max_tokens": 8 + 5 * (i % 9)})
                                      for i, p in enumerate(prompts)))

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
        torch.cuda.synchronize()
        held = torch.cuda.memory_allocated() - base
        rep.add("hf_kv", "GPU memory held with the caches kept",
                f"{held / 2**20:.1f} MiB (kept {own_total / 2**20:.1f})",
                held <= own_total + (8 << 20))
    for rid in list(eng.cache):
        eng.release(rid)
    if cuda:
        torch.cuda.synchronize()
        left = torch.cuda.memory_allocated() - base
        rep.add("hf_kv", "GPU memory after every trajectory is released", f"{left / 2**20:.2f} MiB above the model",
                left <= (8 << 20))
    rep.add("hf_kv", f"{rows} requests of 8-48 tokens, batched", f"{dt:.2f} s", None)
    eng.close()


# -- flat -----------------------------------------------------------------------------------------------

def part_flat(rep: Report, device: str, work: Path, n: int, d: int = 768, queries: int = 256, k: int = 10) -> None:
    import torch

    from retrieval.flat import TorchFlatIndex

    g = torch.Generator(device="cpu").manual_seed(0)
    vec = torch.randn(n, d, generator=g).half()  # what the fp16 shards hold, exactly
    q = torch.randn(queries, d, generator=g).numpy()
    shard = vec.to(device)
    index = TorchFlatIndex([shard])
    modes = list(getattr(index, "modes", []))  # how each shard scores in fp32 ("split": torch.mm to fp32 on CUDA)
    rep.add("flat", "fp32 scoring mode per shard (CUDA: split expected, upcast is slower)",
            ",".join(map(str, modes)) or "?", None)
    s, i = index.search(q, k)  # warm-up and the result
    # exact fp32 reference over the same (fp16-valued) vectors: fp32 products, no TF32
    prev = torch.backends.cuda.matmul.allow_tf32 if device.startswith("cuda") else None
    if prev is not None:
        torch.backends.cuda.matmul.allow_tf32 = False
    ref_s, ref_i = [], []
    qt = torch.from_numpy(q).to(device)
    for lo in range(0, queries, 64):
        sc = qt[lo:lo + 64] @ shard.float().T if n * d <= (1 << 26) else torch.cat(
            [qt[lo:lo + 64] @ shard[j:j + (1 << 18)].float().T for j in range(0, n, 1 << 18)], 1)
        a, b = torch.topk(sc, k, dim=1)
        ref_s.append(a.cpu())
        ref_i.append(b.cpu())
    if prev is not None:
        torch.backends.cuda.matmul.allow_tf32 = prev
    ref_s, ref_i = torch.cat(ref_s).numpy(), torch.cat(ref_i).numpy()
    same = (i == ref_i)
    # a differing id is acceptable only as a tie (equal fp32 scores in both)
    ties = (~same) & (abs(s - ref_s) <= 1e-5 * abs(ref_s).max())
    rep.add("flat", f"top-{k} ids and order vs exact fp32 ({n:,} x {d})",
            f"{same.mean() * 100:.3f}% identical, {int((~same & ~ties).sum())} real differences",
            bool((same | ties).all()))
    err = float(abs(s - ref_s).max())
    rep.add("flat", "max |score - fp32 score|", f"{err:.2e}", err <= 1e-3)
    reps = 5
    sync(device)
    t0 = time.perf_counter()
    for _ in range(reps):
        index.search(q, k)
    sync(device)
    rep.add("flat", f"throughput, batches of {queries}", f"{reps * queries / (time.perf_counter() - t0):,.0f} q/s",
            None)


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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpu", action="store_true", help="dry mode: every part on CPU at small sizes")
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    ap.add_argument("--flat-n", type=int, default=None, help="vectors in the flat check (default 1M on GPU)")
    args = ap.parse_args(argv)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        ap.error(f"--parts: unknown {', '.join(unknown)} (choose from {', '.join(PARTS)})")
    import torch

    if args.cpu:
        device = "cpu"
    else:
        if not torch.cuda.is_available():  # this process builds no vLLM engine: the fork rule does not apply
            print("error: no CUDA device visible to torch; run with --cpu for the dry mode", file=sys.stderr)
            return 2
        device = "cuda"
    verl_stub = stand_in_verl()
    name = torch.cuda.get_device_name(0) if device == "cuda" else "CPU"
    print(f"gpu_check on {name}: torch {torch.__version__}, parts {', '.join(parts)}"
          + (" (verl stand-ins: verl is not installed)" if verl_stub else ""), flush=True)
    rep = Report()
    t_all = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as tmp:
        work = Path(tmp)
        for part in parts:
            t0 = time.perf_counter()
            print(f"== {part}", flush=True)
            try:
                if part == "fork":
                    part_fork(rep, device, work)
                elif part == "hf_kv":
                    part_hf_kv(rep, device, work)
                elif part == "flat":
                    part_flat(rep, device, work, n=args.flat_n or (1_000_000 if device == "cuda" else 20_000),
                              d=768 if device == "cuda" else 64)
                elif part == "logprobs":
                    if device == "cuda":
                        part_logprobs(rep, device, (8192, 16384), 151_936)
                    else:
                        part_logprobs(rep, device, (256,), 4096)
                elif part == "attention":
                    if device == "cuda":
                        part_attention(rep, device, 16_384, 16, 2, 128)
                    else:
                        part_attention(rep, device, 1024, 4, 2, 32)
                elif part == "critic":
                    part_critic(rep, device, work)
            except Exception as e:  # noqa: BLE001  (a part that crashes is a mismatch; the others still run)
                rep.add(part, "ran", f"{type(e).__name__}: {str(e).splitlines()[0][:150] if str(e) else ''}", False)
            rep.add(part, "time", f"{time.perf_counter() - t0:.1f} s", None)
    print()
    print(rep.table())
    bad = [r for r in rep.rows if r.ok is False]
    print(f"\n{len(rep.rows) - len(bad)} rows fine, {len(bad)} mismatches, {time.perf_counter() - t_all:.0f} s in all")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
