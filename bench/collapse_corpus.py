"""The collapse corpus: labelled training runs that collapse and runs that don't, for the collapse warning.

    python bench/collapse_corpus.py                              # ORDER's variants x seeds 0-4, 16 steps
    python bench/collapse_corpus.py --variants grpo_bf16 --seeds 5 6 7
    python -m train.collapse replay bench/collapse_corpus/toy    # score the detectors on it
    python bench/collapse_corpus.py --rollback --variants grpo_lr5_nokl   # the same runs, rolled back
    python -m train.collapse label bench/collapse_rollback       # did the rollback keep them alive?

Runs ``configs/cpu_learn.yaml`` on the learnable task (the toy: ``train/learnable.py``) from its warm start,
one run at a time, in the knobs that make GRPO collapse (public reports: a bf16 actor, a higher learning
rate without KL, more optimizer updates per rollout batch) and in healthy settings, plus one injected
fault (the advantage sign flipped: a positive control, labelled ``fault``, not a natural collapse).

Each finished run becomes ``OUT/toy/<variant>-s<seed>.jsonl``: a header line (``{"run": {...}}``: model,
variant, seed, steps, overrides, fault) then one line per step with the metrics the warning and the label
read (:data:`train.monitor.records.KEEP`). The file is written whole when the run has finished every
step, so a run cut short leaves nothing; a rerun skips every run already recorded (resumable). The
label is not stored: ``python -m train.collapse label`` derives it from the rewards
(:mod:`train.monitor.labels`). About 3 minutes a run on 2 cores; scratch under ``--work``.

``--rollback`` runs the same variants and seeds with ``collapse_warning.action=rollback`` (a checkpoint
every step) into ``bench/collapse_rollback`` (apart: they are interventions, not corpus runs). Each file
holds the branch that survived (the steps before the rollback target, then the resumed steps); its header
counts the rollbacks and says whether the run ended stopped (an alarm with no rollback left, exit 5).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_learning import serve  # noqa: E402
from train.toy import learnable_task as learnable  # noqa: E402

SABOTAGE = str(ROOT / "tests" / "sabotage.py")
GRPO = ["llds.enable=false"]
BF16 = ["actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=bf16"]
UPDATES4 = ["actor_rollout_ref.actor.ppo_mini_batch_size=2"]  # 4 optimizer updates per rollout batch
UPDATES8 = ["actor_rollout_ref.actor.ppo_mini_batch_size=1"]  # 8
#: LLDS-MA as configs/grpo_llds_ma.yaml sets it (the released rule; with the toy's one search per answer,
#: V <= 1, so its answer-span weight is 0: the answer span goes unregularised)
LLDS_MA = ["+llds.answer_weight=adaptive", "+llds.adaptive_rule=released", "+llds.answer_lambda=0.2",
           "+llds.valid_search_baseline=2.0"]
DRIFT = GRPO + ["drift_penalty.enable=true"]  # SAPO's drift penalty, configs/grpo_drift.yaml
#: variant -> (overrides of cpu_learn.yaml, plugins, injected fault)
VARIANTS = {
    "llds": ([], None, False),                                              # cpu_learn as shipped (make demo)
    "grpo": (GRPO, None, False),
    "grpo_bf16": (GRPO + BF16, None, False),                                # crashed 3 of 5 seeds (RESULTS.md)
    "llds_bf16": (BF16, None, False),
    "grpo_lr5_nokl": (GRPO + ["actor_rollout_ref.actor.optim.lr=2.5e-3",
                              "actor_rollout_ref.actor.use_kl_loss=false"], None, False),
    "grpo_lr2_nokl": (GRPO + ["actor_rollout_ref.actor.optim.lr=1.0e-3",
                              "actor_rollout_ref.actor.use_kl_loss=false"], None, False),
    "fault_flipped": (GRPO + ["actor_rollout_ref.actor.policy_loss.loss_mode=sabotage_flipped"], SABOTAGE, True),
}
#: the order runs are taken in: every variant of a seed before the next seed, so an interrupted
#: generation leaves a balanced corpus
ORDER = ["grpo_bf16", "llds", "grpo_updates4", "grpo_lr2_nokl", "grpo", "grpo_updates8", "grpo_lr5_nokl",
         "fault_flipped"]
#: further variants (``--variants``): LLDS in the knobs that collapse GRPO
MORE = ["llds_bf16", "llds_updates8"]
#: the arms of the LLDS-vs-GRPO study (bench/study.py): arm -> (name, overrides)
ARMS = {"grpo": ("GRPO", GRPO), "llds": ("GRPO+LLDS", []), "lldsma": ("GRPO+LLDS-MA", LLDS_MA),
        "drift": ("GRPO+SAPO drift", DRIFT),
        # GRPO with no update on a step where every advantage is 0 (docs/training.md, flat_steps.skip_update)
        "skipflat": ("GRPO, flat steps skipped", GRPO + ["flat_steps.skip_update=true"])}
#: its regimes: name -> (variant suffix, overrides): the preset's (cpu_learn.yaml, 2 optimizer updates per
#: rollout batch) and more updates per batch, the knob that collapsed plain GRPO in the corpus
REGIMES = {"preset": ("", []), "updates4": ("_updates4", UPDATES4), "updates8": ("_updates8", UPDATES8)}
for _arm, (_, _arm_overrides) in ARMS.items():  # <arm><suffix>: grpo_updates8, llds_updates4, ...
    for _suffix, _regime_overrides in REGIMES.values():
        VARIANTS.setdefault(_arm + _suffix, (_arm_overrides + _regime_overrides, None, False))


def run_file(out: Path, variant: str, seed: int) -> Path:
    return out / "toy" / f"{variant}-s{seed}.jsonl"


def record(metrics: dict[int, dict], header: dict, path: Path) -> None:
    """Write a finished run's file at once (temporary name, then renamed)."""
    from train.monitor.records import keep

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(json.dumps({"run": header}) + "\n")
        for step in sorted(metrics):
            row = keep(metrics[step])
            if row:
                f.write(json.dumps({"step": step, **row}) + "\n")
    tmp.replace(path)


def _error_line(text: str) -> str:
    """The last line of a failed run's log tail that names an error (what the label reads of a crash)."""
    lines = [ln.strip() for ln in text.splitlines() if "Error" in ln or "error" in ln]
    return (lines[-1] if lines else text.splitlines()[0])[:500]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", nargs="+", default=ORDER, choices=sorted(VARIANTS))
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--out", default=None, help="the corpus (committed): bench/collapse_corpus, with --rollback "
                    "bench/collapse_rollback")
    ap.add_argument("--rollback", action="store_true", help="collapse_warning.action=rollback")
    ap.add_argument("--rollback-lr-scale", type=float, default=None,
                    help="with --rollback: collapse_warning.rollback_lr_scale (default: the preset's); the run files "
                    "are then named <variant>_lrx<scale>-s<seed>")
    ap.add_argument("--work", default="runs/collapse_corpus", help="scratch: the runs' folders and logs")
    ap.add_argument("--task", default="runs/learn_task", help="task + warm start (built when missing)")
    ap.add_argument("--port", type=int, default=8012)
    args = ap.parse_args(argv)
    if args.steps < 2:
        ap.error(f"--steps must be >= 2, got {args.steps}")
    if args.rollback_lr_scale is not None and not (args.rollback and 0 < args.rollback_lr_scale <= 1):
        ap.error(f"--rollback-lr-scale needs --rollback and a value in (0, 1], got {args.rollback_lr_scale}")
    args.out = args.out or ("bench/collapse_rollback" if args.rollback else "bench/collapse_corpus")
    if args.rollback:
        args.work += "_rollback"
    out, work, task = (ROOT / args.out).resolve(), (ROOT / args.work).resolve(), (ROOT / args.task).resolve()
    from train.monitor.detectors import WarningConfig

    scale = WarningConfig().rollback_lr_scale if args.rollback_lr_scale is None else args.rollback_lr_scale
    suffix = f"_lrx{args.rollback_lr_scale:g}" if args.rollback and args.rollback_lr_scale is not None else ""
    todo = [(v, s) for s in args.seeds for v in args.variants if not run_file(out, v + suffix, s).is_file()]
    done = len(args.seeds) * len(args.variants) - len(todo)
    print(f"{done} runs recorded already, {len(todo)} to run ({args.steps} steps each) -> {out / 'toy'}", flush=True)
    if not todo:
        return
    learnable.build(task)  # reuses an identical finished build
    if not (task / "bm25" / "manifest.json").is_file():
        import subprocess

        subprocess.run([sys.executable, "-m", "retrieval.build", "--corpus", str(task / "corpus.jsonl"),
                        "--out", str(task / "bm25"), "--kind", "bm25"], check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    work.mkdir(parents=True, exist_ok=True)
    server = serve(task / "bm25", args.port, work / "retriever.log")
    try:
        for i, (variant, seed) in enumerate(todo, 1):
            overrides, plugins, fault = VARIANTS[variant]
            run_dir = work / f"{variant}{suffix}-s{seed}"
            if run_dir.exists():  # an earlier attempt that did not finish: start it over
                import shutil

                shutil.rmtree(run_dir)
            spec = [*overrides, "trainer.val_before_train=false", "trainer.test_freq=-1",
                    *(["collapse_warning.action=rollback", "trainer.save_freq=1"] if args.rollback else
                      ["trainer.save_freq=-1"]),
                    *([f"collapse_warning.rollback_lr_scale={args.rollback_lr_scale}"] if suffix else [])]
            t0 = time.time()
            try:
                metrics = learnable.run_rl(task, run_dir, f"http://127.0.0.1:{args.port}", steps=args.steps,
                                           seed=seed, overrides=spec, plugins=plugins)
            except RuntimeError as e:  # a crash is an outcome too, if it trained at least one step
                from train.trainer.metrics_file import read_metrics

                try:
                    metrics = read_metrics(run_dir / "metrics.jsonl")
                except (OSError, ValueError):  # no step logged
                    metrics = {}
                print(f"[{i}/{len(todo)}] {variant} seed {seed}: training failed ({str(e).splitlines()[0]}); "
                      f"{len(metrics)} steps logged", flush=True)
                stopped = str(e).startswith("training failed (rc 5)")  # the warning, no rollback left
                crashed, error = not stopped, _error_line(str(e))
            else:
                crashed, error, stopped = False, None, False
            rollbacks = len(list(run_dir.glob("metrics.jsonl.rolled_back_*")))
            trained = [s for s in metrics if "critic/score/mean" in metrics[s]]
            if not (crashed or stopped) and sorted(trained) != list(range(1, args.steps + 1)):
                print(f"[{i}/{len(todo)}] {variant} seed {seed}: {len(trained)} of {args.steps} steps; not recorded",
                      flush=True)
                continue
            if (crashed or stopped) and not trained:
                continue
            header = {"model": "toy", "variant": variant + suffix, "seed": seed, "steps": args.steps,
                      "overrides": overrides, "plugins": "tests/sabotage.py" if plugins else None,
                      "fault": fault, "crashed": crashed, "error": error, "wall_s": round(time.time() - t0),
                      **({"rollbacks": rollbacks, "stopped": stopped, "rollback_lr_scale": scale} if args.rollback
                         else {})}
            record(metrics, header, run_file(out, variant + suffix, seed))
            rewards = " ".join(f"{metrics[s]['critic/score/mean']:.2f}" for s in sorted(trained))
            print(f"[{i}/{len(todo)}] {variant} seed {seed}: {time.time() - t0:.0f} s; reward {rewards}"
                  + (f"; {rollbacks} rollback(s){', stopped' if stopped else ''}" if args.rollback else ""), flush=True)
    finally:
        server.terminate()


if __name__ == "__main__":
    main()
