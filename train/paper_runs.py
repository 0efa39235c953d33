"""python -m train.paper_runs: the paper's runs, keyed by model and preset: which row of
``train/evaluation/paper_results.json`` a run reproduces, the checkpoint step the paper evaluated, and LLDS's lambda.

Sources (arXiv 2512.04220 v2, App. B.2.1, and the released code's hydra evaluation logs): lambda is 0.2
for every model except Qwen2.5-7B-Instruct (0.3); the evaluated checkpoint is step 650 for 3B-Instruct,
600 for 3B-Base, 450 for 7B-Base and 650 for 7B-Instruct. The GRPO, GSPO and PPO baseline rows are the
best checkpoint before collapse (quoted from Search-R1), so they have no fixed step.

    python -m train.paper_runs MODEL PRESET     # prints STEP=... LAMBDA=... PAPER_ROW=... for the shell
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from typing import Optional

from train.errors import ConfigError, exit_on_error
from train.evaluation.report import PAPER_RESULTS

#: Hub name -> (row prefix in paper_results.json, evaluated step for the LLDS runs, lambda)
MODELS = {
    "Qwen/Qwen2.5-3B": ("3B-Base", 600, 0.2),
    "Qwen/Qwen2.5-3B-Instruct": ("3B-Ins", 650, 0.2),
    "Qwen/Qwen2.5-7B": ("7B-Base", 450, 0.2),
    "Qwen/Qwen2.5-7B-Instruct": ("7B-Ins", 650, 0.3),
}
#: Preset -> (row suffix, whether it is an LLDS run with the per-model step and lambda)
PRESETS = {
    "grpo": ("GRPO", False),
    "grpo_llds": ("GRPO+LLDS", True),
    "grpo_llds_r": ("GRPO+LLDS-R", True),
    "grpo_llds_ma": ("GRPO+LLDS-MA", True),
    "gspo_llds": ("GSPO+LLDS", True),
    "ppo": ("PPO", False),
}


def lookup(model: str, preset: str) -> dict:
    """``{"row", "step", "lambda"}`` for a model and preset; ``step``/``lambda`` are None where the
    paper fixes none (baselines). Raises ValueError naming what is known."""
    key = model.rstrip("/")
    short = next((m for m in MODELS if key == m or key.endswith("/" + m.split("/")[-1]) or key == m.split("/")[-1]),
                 None)
    if short is None:
        raise ValueError(f"no paper run for model {model!r}; known: {', '.join(MODELS)}")
    if preset not in PRESETS:
        raise ValueError(f"no paper run for preset {preset!r}; known: {', '.join(PRESETS)}")
    prefix, step, lam = MODELS[short]
    suffix, is_llds = PRESETS[preset]
    row = f"{prefix} {suffix}"
    rows = json.loads(PAPER_RESULTS.read_text())["rows"]
    if row not in rows:
        raise ValueError(f"the paper has no row {row!r} (model {short}, preset {preset}); rows: {', '.join(rows)}")
    return {"row": row, "step": step if is_llds else None, "lambda": lam if is_llds else None}


@exit_on_error
def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m train.paper_runs", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("preset")
    args = ap.parse_args(argv)
    try:
        run = lookup(args.model, args.preset)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    out = {"PAPER_ROW": run["row"], "PAPER_STEP": run["step"] or "", "PAPER_LAMBDA": run["lambda"] or ""}
    print(" ".join(f"{k}={shlex.quote(str(v))}" for k, v in out.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
