"""The fork part: torch.cuda.is_available() then fork poisons the child's CUDA (the mechanism that killed
vLLM's EngineCore), train.inference.cuda_probe then fork does not, and the evaluator's path up to the vLLM
engine's construction leaves CUDA untouched (a stand-in vllm records it; tests use the same stand-in)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from train import REPO_ROOT
from train.gpucheck.environment import tiny_model
from train.gpucheck.report import Report

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
        code = (f"import sys; sys.path.insert(0, {str(REPO_ROOT)!r})\nimport torch\n{fork_source(touch)}\n{probe}\n"
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
    code = (f"import sys; sys.path[:0] = [{str(fakes)!r}, {str(REPO_ROOT)!r}]\nfrom pathlib import Path\n"
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

