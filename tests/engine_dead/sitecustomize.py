"""Loaded by every Python started with this folder on PYTHONPATH (tests/evaluation/test_eval_engines_on_cpu.py):
the first evaluation engine worker to claim ENGINE_DEAD_LOCK gets an engine that, after
ENGINE_DEAD_AFTER answers, fails every request with an ``EngineDeadError``, as vLLM's front-end does
once its EngineCore died (vllm/v1/engine/exceptions.py). The other workers are untouched."""

import os
import sys

# an engine worker of the evaluator's pool (python -m train.evaluation.engine_worker); sys.argv is not set
# up yet while site runs (it reads ['-m', ...]), the interpreter's own command line is
if "train.evaluation.engine_worker" in getattr(sys, "orig_argv", []) and os.environ.get("ENGINE_DEAD_LOCK"):
    try:
        os.close(os.open(os.environ["ENGINE_DEAD_LOCK"], os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        pass
    else:
        from train.inference.hf_engine import HFBatchedServerManager

        class EngineDeadError(Exception):
            pass

        real = HFBatchedServerManager.generate
        left = {"n": int(os.environ.get("ENGINE_DEAD_AFTER", "3"))}

        async def generate(self, *a, **k):
            if left["n"] <= 0:
                raise EngineDeadError("EngineCore encountered an issue (simulated)")
            left["n"] -= 1
            return await real(self, *a, **k)

        HFBatchedServerManager.generate = generate
