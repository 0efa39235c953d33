"""The GPU paths that need no vLLM, verl or Ray, checked on one GPU in a few minutes (``bench/gpu_check.sh``).

    bash bench/gpu_check.sh            # on a CUDA machine (torch with CUDA, transformers); < 8 min on one H200
    bash bench/gpu_check.sh --cpu      # the same parts on CPU at small sizes: checks the script itself

Parts (``--parts`` picks some):
  fork       torch.cuda.is_available() then fork: the child's CUDA fails (the mechanism that killed vLLM's
             EngineCore); train.inference.cuda_probe then fork: it works; and the evaluator's own path up to the
             engine's construction (``--engines 1``: one in-process engine however many GPUs are visible) leaves
             CUDA untouched (a stand-in vllm records it, as tests do)
  hf_kv      the hf engine on a tiny Qwen2: every kept cache owns exactly its rows' storage, the kept bytes
             stay under the bound, and GPU memory returns to the model's once the trajectories are released
             (the baseline is taken after a warm-up request, so the engine thread's cuBLAS workspace, 32 MiB
             on sm_90, which torch keeps per thread, is in it)
  flat       retrieval/flat.py with fp16 shards against exact fp32 search (ids, order, scores; q/s)
  logprobs   train/workers/logprobs.py's chunked log-probs against verl's formula at 8k/16k tokens (time, peak memory)
  attention  packed attention at 16,384 tokens: SDPA with the dense block-diagonal mask vs the document-aware
             path (bench/bench_attention.py), agreement and time per pass
  critic     the PPO critic's model build (train/value_model.load_value_model, SDPA) on a packed batch: values
             equal separate forwards
  threads    the retrieval server's batching engine (retrieval/batching.py's MicroBatcher) under 128 requests
             from 80 client threads (64 short-lived, 16 pooled), with a stand-in retriever that runs a matmul
             on the device: every search runs on the batcher's one thread, and device memory grows by less
             than one thread's cuBLAS workspace; the same load searching on each client thread (the old
             behaviour) is printed beside it, one workspace per thread (on CPU only the thread check applies)
It prints one table and exits 1 on any mismatch. verl is not needed: where it is missing, the one class
the hf engine returns (verl's TokenOutput) and the two base classes train/workers/value_model.py subclasses are
replaced by stand-ins (the critic check exercises the model build, not verl's engine around it). The parts that
run transformers (hf_kv, attention, critic and fork's evaluator row) need the major version pyproject.toml pins
(5.x); with another installed (a lent image with 4.x) they are skipped with the reason, in one line and one
table row each, and the others still run.
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

PARTS = ("fork", "hf_kv", "flat", "logprobs", "attention", "critic", "threads")
#: parts that run transformers' models or masks (fork only for its evaluator row)
NEEDS_TRANSFORMERS = ("hf_kv", "attention", "critic")
MiB = 1 << 20


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


# -- transformers' version --------------------------------------------------------------------------------

def transformers_pin() -> str:
    """The transformers requirement of pyproject.toml's [project] dependencies, e.g. ">=5.5.3,!=5.6.0,<5.11"."""
    import re

    text = (ROOT / "pyproject.toml").read_text()
    try:
        import tomllib

        deps = tomllib.loads(text).get("project", {}).get("dependencies", [])
    except ImportError:  # Python < 3.11: the quoted requirement strings
        deps = re.findall(r'"([^"]+)"', text)
    for dep in deps:
        m = re.fullmatch(r"\s*transformers\s*(\[[^\]]*\])?\s*([<>=!~][^;]*)?(;.*)?", dep)
        if m:
            return (m.group(2) or "").replace(" ", "")
    return ""


def installed_transformers() -> str | None:
    """The installed transformers' version (read without importing it), None when it is not installed."""
    from importlib import metadata

    try:
        return metadata.version("transformers")
    except metadata.PackageNotFoundError:
        return None


def transformers_status() -> tuple[str, bool | None]:
    """(one line, verdict): True when the installed transformers satisfies pyproject.toml's pin; None when it is
    the pin's major version but outside the pin (the parts run; a mismatch in them may be the version's);
    False when it is missing or of another major version (the parts that run it are skipped; the line says why:
    transformers 4.x has no ``masking_utils.create_causal_mask`` of 5.x's signature, no ``DynamicCache.layers``)."""
    import re

    pin = transformers_pin()
    have = installed_transformers()
    want = f"transformers{pin} (pyproject.toml)" if pin else "transformers 5.x (pyproject.toml)"
    if have is None:
        return f"transformers is not installed; the project needs {want}", False
    lower = re.search(r"(?:>=|==|~=|>)\s*(\d+)", pin)
    major = int(lower.group(1)) if lower else 5
    have_major = re.match(r"\s*(\d+)", have)
    if not have_major or int(have_major.group(1)) != major:
        return f"transformers {have} is installed; the project needs {want}", False
    try:
        from packaging.specifiers import SpecifierSet

        within = SpecifierSet(pin).contains(have, prereleases=True) if pin else True
    except Exception:  # noqa: BLE001  (no packaging, or a version it cannot parse: the major version matched)
        within = True
    if within:
        return f"transformers {have} satisfies the project's pin {want}", True
    return (f"transformers {have} is outside the project's pin {want}: the parts that run it still run, a "
            f"mismatch there may be the version's"), None


# -- cuBLAS workspaces ------------------------------------------------------------------------------------

@dataclass
class BlasWorkspace:
    """What torch allocates, through its caching allocator, the first time a thread runs a cuBLAS (Lt) matmul
    on a device, and keeps for the process per (cuBLAS handle, stream), a handle being held by one thread at a
    time (aten/src/ATen/cuda/CublasHandlePool.cpp: getCurrentCUDABlasHandle -> setWorkspaceForHandle, of
    getChosenWorkspaceSize() bytes; getCUDABlasLtWorkspace, of getCUDABlasLtWorkspaceSize() bytes, which only
    shares the cuBLAS one where TORCH_CUBLASLT_UNIFIED_WORKSPACE says so in some torch versions)."""

    cublas: int
    cublaslt: int
    lt_shared: bool
    how: str

    @property
    def per_thread(self) -> int:
        """The most one thread's first matmuls add to torch.cuda.memory_allocated()."""
        return self.cublas + (0 if self.lt_shared else self.cublaslt)

    def describe(self) -> str:
        lt = "(cuBLASLt shares it)" if self.lt_shared else f"+ up to {self.cublaslt / MiB:.2f} MiB cuBLASLt"
        return f"{self.cublas / MiB:.3f} MiB cuBLAS {lt} ({self.how})"


def torch_workspace_sizes(major: int, minor: int, env=None, hip_arch: str | None = None) -> BlasWorkspace:
    """The per-thread cuBLAS and cuBLASLt workspace sizes as torch 2.11's aten/src/ATen/cuda/CublasHandlePool.cpp
    computes them for a device of compute capability ``major.minor`` (``hip_arch``: a ROCm device) under the
    environment ``env``: parseChosenWorkspaceSize reads CUBLAS_WORKSPACE_CONFIG, ":SIZE:COUNT" pairs of SIZE KiB
    each (unset or unparsable: 4096 KiB x 8 = 32 MiB when major.minor is 9.0, else ":4096:2:16:8" = 8 MiB + 128
    KiB; ROCm 32 MiB, 128 MiB on gfx94x/gfx95x); parseCUDABlasLtWorkspaceSize reads CUBLASLT_WORKSPACE_SIZE in
    KiB (default 1024), capped at the cuBLAS size unless TORCH_CUBLASLT_UNIFIED_WORKSPACE=0."""
    import re

    env = os.environ if env is None else env
    raw_unified = env.get("TORCH_CUBLASLT_UNIFIED_WORKSPACE")
    unified = None if raw_unified is None else raw_unified.strip().lower() in ("1", "true", "yes", "on", "y")
    if hip_arch is not None:
        default = (128 if hip_arch.startswith(("gfx94", "gfx95")) else 32) * MiB
        val = next((env[k] for k in ("CUBLAS_WORKSPACE_CONFIG", "HIPBLAS_WORKSPACE_CONFIG", "ROCBLAS_WORKSPACE_CONFIG")
                    if k in env), None)
        arch = hip_arch or "ROCm"
    else:
        default = 4096 * 8 * 1024 if (major, minor) == (9, 0) else 4096 * 1024 * 2 + 16 * 1024 * 8
        val = env.get("CUBLAS_WORKSPACE_CONFIG")
        arch = f"sm_{major}{minor}"
    pairs = re.findall(r":([0-9]+):([0-9]+)", val or "")
    if val is not None and pairs:
        cublas, how = sum(int(a) * 1024 * int(b) for a, b in pairs), f"CUBLAS_WORKSPACE_CONFIG={val}"
    else:
        cublas, how = default, f"torch's default on {arch}"
    raw = env.get("CUBLASLT_WORKSPACE_SIZE") or (env.get("HIPBLASLT_WORKSPACE_SIZE") if hip_arch is not None else None)
    lt = (76 if hip_arch is not None else 1) * MiB
    if raw:
        try:
            lt = int(raw) * 1024
        except ValueError:
            pass
    if hip_arch is None and unified is not False:
        lt = min(lt, cublas)
    # the Lt workspace is one allocation with the cuBLAS one for certain only where the variable asks for it by
    # name: torch 2.11's getCUDABlasLtWorkspace tests check_env(...) == true, its size parser unset-or-true
    return BlasWorkspace(cublas, lt, hip_arch is None and unified is True, how)


def blas_workspace(device_index: int = 0) -> BlasWorkspace:
    """:func:`torch_workspace_sizes` for this device, or this torch's own getters where it has them."""
    import torch

    props = torch.cuda.get_device_properties(device_index)
    hip_arch = (getattr(props, "gcnArchName", "") or "") if torch.version.hip else None
    ws = torch_workspace_sizes(props.major, props.minor, hip_arch=hip_arch)
    get = getattr(torch._C, "_cuda_getCublasWorkspaceSize", None)
    get_lt = getattr(torch._C, "_cuda_getCublasLtWorkspaceSize", None)
    try:
        if get is not None:
            ws.cublas, ws.how = int(get()), "torch._C._cuda_getCublasWorkspaceSize()"
        if get_lt is not None:
            ws.cublaslt = int(get_lt())
    except Exception:  # noqa: BLE001  (the computed sizes stand)
        pass
    return ws


def memory(device: str) -> tuple[int, int]:
    """(allocated, reserved) bytes of the caching allocator on ``device``, after a synchronize; (0, 0) on CPU."""
    import torch

    if not device.startswith("cuda"):
        return 0, 0
    torch.cuda.synchronize()
    return torch.cuda.memory_allocated(), torch.cuda.memory_reserved()


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


def evaluator_argv(model: str) -> list[str]:
    """The evaluator's arguments for fork's third row: ``--engines 1``, so that with 2 or more GPUs visible it
    builds its one engine in this process (train/evaluation/runner.run_model: one device -> build_asker here)
    instead of an EnginePool of one real engine per GPU, each its own process, which would outlive the timeout."""
    return ["--model", model, "--data", "x", "--backend", "vllm", "--method", "direct", "--engines", "1"]


def part_fork(rep: Report, device: str, work: Path, evaluator: str | None = None) -> None:
    """``evaluator``: None runs the evaluator row; a reason skips it (transformers of another major version)."""
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
    check = "evaluator -> engine: forked child CUDA, parent initialised, start method"
    if evaluator is not None:
        rep.add("fork", check, f"skipped: {evaluator}", None)
        return
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
            f"opts = eval_options.EvalOptions.parse({evaluator_argv(str(model))!r})\n"
            f"eval_runner.run_model(opts, opts.ask.model, [], Path({str(work / 'o.jsonl')!r}))\n")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("ENGINE")), "")
    parts = line.split()
    ok = len(parts) == 4 and parts[1] == "0" and parts[2] == "False" and parts[3] == "spawn"
    rep.add("fork", check,
            (f"child rc {parts[1]}, initialised {parts[2]}, {parts[3]}" if len(parts) == 4
             else f"no engine reached: {r.stderr.strip()[-160:]}"), ok)


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


# -- threads --------------------------------------------------------------------------------------------

#: device memory the batched load may add beyond one thread's cuBLAS workspace (the stand-in's matmul blocks
#: are freed and reused; the workspace of a second thread doing device work is 8-32 MiB)
THREADS_SLACK = 4 * MiB


class DeviceRetriever:
    """A stand-in retriever (``search(queries, k) -> rows of (doc, score)``) whose search runs a matmul on the
    device, as the encoder and the index do, and records the name of the thread it ran on."""

    def __init__(self, device: str, dim: int = 256):
        import threading

        import torch

        g = torch.Generator().manual_seed(0)
        self.a = torch.randn(dim, dim, generator=g).to(device)
        self.b = torch.randn(dim, dim, generator=g).to(device)
        self.threads: list[str] = []
        self._lock = threading.Lock()

    def search(self, queries: list[str], k: int) -> list[list[tuple[dict, float]]]:
        import threading

        with self._lock:
            self.threads.append(threading.current_thread().name)
        score = float((self.a @ self.b).sum())  # one cuBLAS matmul on this thread (fixed size), then a sync
        return [[({"id": f"{q}/{j}", "contents": q}, score - j) for j in range(k)] for q in queries]


def drive_clients(search, short: int = 64, pooled: int = 16, per_pooled: int = 4, topk: int = 3,
                  timeout: float = 300.0) -> dict:
    """Requests of 1-4 queries from ``short`` short-lived threads (one request each; they wait for each other
    before they end, so all are alive at once, as in a burst on a thread-per-request server) and ``pooled``
    pooled threads (``per_pooled`` requests in all per thread on average, at least one each), all at the same
    time; ``search(queries, topk)`` returns the rows. Returns {requests, clients (distinct client thread names),
    errors}."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    errors: list[str] = []
    clients: set[str] = set()
    lock = threading.Lock()

    def one(i: int) -> None:
        with lock:
            clients.add(threading.current_thread().name)
        queries = [f"request {i} query {j}" for j in range(1 + i % 4)]
        try:
            rows = search(queries, topk)
            good = len(rows) == len(queries) and all(
                len(r) == topk and r[0][0]["contents"] == q for r, q in zip(rows, queries))
            if not good:
                raise AssertionError(f"wrong rows for request {i}")
        except Exception as e:  # noqa: BLE001
            with lock:
                errors.append(f"{type(e).__name__}: {e}")

    def then_wait(barrier: threading.Barrier):
        def run(i: int) -> None:
            one(i)
            try:
                barrier.wait()
            except threading.BrokenBarrierError:
                pass
        return run

    short_lived = then_wait(threading.Barrier(short, timeout=timeout))
    # each pool thread's first request waits for the others' before the pool takes more: the executor starts
    # all ``pooled`` threads (it starts one per submit only while none is idle) and each serves >= 1 request
    pool_first = then_wait(threading.Barrier(pooled, timeout=timeout))
    threads = [threading.Thread(target=short_lived, args=(i,), name=f"client-short-{i}", daemon=True)
               for i in range(short)]
    with ThreadPoolExecutor(pooled, thread_name_prefix="client-pool") as pool:
        for t in threads:
            t.start()
        futures = [pool.submit(pool_first, short + i) for i in range(pooled)]
        futures += [pool.submit(one, short + i) for i in range(pooled, pooled * per_pooled)]
        for f in futures:
            f.result(timeout=timeout)
    for t in threads:
        t.join(timeout=timeout)
    if any(t.is_alive() for t in threads):
        errors.append("client threads still running after the timeout")
    return {"requests": short + pooled * per_pooled, "clients": clients, "errors": errors}


def part_threads(rep: Report, device: str, short: int = 64, pooled: int = 16, per_pooled: int = 4) -> None:
    import torch

    from retrieval import batching

    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.empty_cache()  # cached free segments would hide new reserved memory
    ws = blas_workspace() if cuda else None
    retriever = DeviceRetriever(device)
    b = batching.MicroBatcher(retriever, max_batch=256)
    try:
        b.search(["warm-up"], 3, timeout=120)  # the batcher thread's first matmul: its workspace, before the baseline
        retriever.threads.clear()
        alloc0, res0 = memory(device)
        load = drive_clients(lambda q, k: b.search(q, k, timeout=120), short, pooled, per_pooled)
        alloc1, res1 = memory(device)
        name = b.thread_name
    finally:
        b.close()
    ran = sorted(set(retriever.threads))
    n_clients = len(load["clients"])
    where = (f"all on {name!r}" if ran == [name] else
             f"on {len(ran)} threads: {', '.join(ran[:4])}{', ...' if len(ran) > 4 else ''} (batcher: {name!r})")
    rep.add("threads", f"{load['requests']} requests from {n_clients} client threads ({short} short-lived, "
                       f"{pooled} pooled): where the searches ran",
            f"{len(retriever.threads)} searches, {where}", ran == [name] and len(retriever.threads) > 0)
    rep.add("threads", "every request got its own rows",
            "yes" if not load["errors"] else f"{len(load['errors'])} failed: {load['errors'][0][:100]}",
            not load["errors"])

    # the baseline: the same load, each client thread searching itself (the server before the batching engine)
    direct = DeviceRetriever(device)
    d_alloc0, d_res0 = memory(device)
    base = drive_clients(direct.search, short, pooled, per_pooled)
    d_alloc1, d_res1 = memory(device)
    searched = len(set(direct.threads))
    failed = f"; {len(base['errors'])} of its requests failed: {base['errors'][0][:80]}" if base["errors"] else ""
    if not cuda:
        rep.add("threads", "memory growth, batched vs on each client thread",
                f"n/a on CPU (no cuBLAS workspace); the baseline searched on {searched} client threads{failed}", None)
        return
    grow = max(alloc1 - alloc0, res1 - res0)
    d_grow = max(d_alloc1 - d_alloc0, d_res1 - d_res0)
    limit = ws.per_thread + THREADS_SLACK
    rep.add("threads", "device memory growth under the load, batched (allocated / reserved)",
            f"{(alloc1 - alloc0) / MiB:.1f} / {(res1 - res0) / MiB:.1f} MiB (bound: one thread's workspace "
            f"{ws.per_thread / MiB:.1f} + {THREADS_SLACK / MiB:.0f} MiB)", grow <= limit)
    rep.add("threads", "baseline, the search on each client thread (old behaviour): allocated / reserved",
            f"{(d_alloc1 - d_alloc0) / MiB:.1f} / {(d_res1 - d_res0) / MiB:.1f} MiB over {searched} threads = "
            f"{(d_alloc1 - d_alloc0) / max(searched, 1) / MiB:.1f} MiB each (torch's per thread: {ws.describe()})"
            f"{failed}", None)
    rep.add("threads", "growth on client threads / batched",
            f"{d_grow / MiB:.1f} / {grow / MiB:.1f} MiB = "
            + (f"{d_grow / grow:.0f}x" if grow >= MiB else f">= {d_grow / MiB:.0f}x (batched < 1 MiB)"), None)
    # the baseline's workspaces stay in torch's (handle, stream) map for the process: free them for what follows
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()
    torch.cuda.empty_cache()


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
    tf_line, tf_ok = transformers_status()
    needing = [p for p in parts if p in NEEDS_TRANSFORMERS] + (["fork's evaluator row"] if "fork" in parts else [])
    skip = None if tf_ok is not False else tf_line
    if skip and needing:
        print(f"{tf_line}: skipping {', '.join(needing)}", flush=True)
    else:
        print(tf_line, flush=True)
    rep = Report()
    if needing:
        rep.add("setup", "transformers vs pyproject.toml's pin", tf_line, None)
    skipped: list[str] = []
    t_all = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as tmp:
        work = Path(tmp)
        for part in parts:
            t0 = time.perf_counter()
            print(f"== {part}", flush=True)
            if skip and part in NEEDS_TRANSFORMERS:
                rep.add(part, "skipped", skip, None)
                skipped.append(part)
                continue
            try:
                if part == "fork":
                    part_fork(rep, device, work, evaluator=skip)
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
                elif part == "threads":
                    part_threads(rep, device)
            except Exception as e:  # noqa: BLE001  (a part that crashes is a mismatch; the others still run)
                rep.add(part, "ran", f"{type(e).__name__}: {str(e).splitlines()[0][:150] if str(e) else ''}", False)
            rep.add(part, "time", f"{time.perf_counter() - t0:.1f} s", None)
    print()
    print(rep.table())
    bad = [r for r in rep.rows if r.ok is False]
    if skip and "fork" in parts:
        skipped.append("fork's evaluator row")
    print(f"\n{len(rep.rows) - len(bad)} rows fine, {len(bad)} mismatches, {time.perf_counter() - t_all:.0f} s in all"
          + (f"; skipped: {', '.join(skipped)} ({skip})" if skipped else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
