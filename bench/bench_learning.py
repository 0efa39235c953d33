"""Does the pipeline learn, how reliably, and what breaks it: GRPO(+LLDS) on the learnable task.

    python bench/bench_learning.py --seeds 0 1 2 3 4                       # the spread over seeds
    python bench/bench_learning.py --variants llds_on llds_off --seeds 0 1 2   # LLDS on vs off
    python bench/bench_learning.py --variants flipped zero_off --seeds 0     # must not learn

Builds the task and its warm start once (``--task``; an identical finished build is reused), serves its BM25 index,
then runs (or reuses, when ``OUT/<variant>/seed<N>`` already holds a complete run) ``configs/cpu_learn.yaml``
for ``--steps`` steps per (variant, seed), one run at a time
(two CPU runs at once slow each other down badly). Prints, per run, the mean reward of the first and
last ``--window`` steps and the rise; per variant, the mean, spread and minimum of the rise. Each
variant's per-step mean over seeds goes to ``OUT/<variant>/metrics.jsonl``, and one set of PNGs
(``python -m train.plot``) puts the variants on the same axes in ``OUT/plots``.

Variants: ``llds_on`` (cpu_learn as shipped), ``llds_off`` (``llds.enable=false``), ``flipped`` (the
advantage sign flipped in the policy loss) and ``zero`` (the policy loss times zero; the KL and LLDS
terms stay), both from ``tests/sabotage.py`` through ``SEARCH_R1_PLUGINS``, and ``flipped_off`` /
``zero_off``: the same with LLDS off.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from train.toy import learnable_task as learnable  # noqa: E402

SABOTAGE = str(ROOT / "tests" / "sabotage.py")
VARIANTS = {
    "llds_on": ([], None),
    "llds_off": (["llds.enable=false"], None),
    "flipped": (["actor_rollout_ref.actor.policy_loss.loss_mode=sabotage_flipped"], SABOTAGE),
    "zero": (["actor_rollout_ref.actor.policy_loss.loss_mode=sabotage_zero"], SABOTAGE),
    "flipped_off": (["actor_rollout_ref.actor.policy_loss.loss_mode=sabotage_flipped", "llds.enable=false"],
                    SABOTAGE),
    "zero_off": (["actor_rollout_ref.actor.policy_loss.loss_mode=sabotage_zero", "llds.enable=false"], SABOTAGE),
}


def serve(index: Path, port: int, log: Path) -> subprocess.Popen:
    from retrieval.client import RetrievalClient

    proc = subprocess.Popen([sys.executable, "-m", "retrieval.server", "--index", str(index), "--port", str(port)],
                            stdout=open(log, "w"), stderr=subprocess.STDOUT, cwd=ROOT)
    client = RetrievalClient(f"http://127.0.0.1:{port}")
    for _ in range(120):
        try:
            client.health()
            return proc
        except Exception:
            if proc.poll() is not None:
                raise RuntimeError(f"the retrieval server exited: {log.read_text()[-2000:]}")
            time.sleep(1)
    raise RuntimeError("the retrieval server did not come up in 120 s")


def finished(run_dir: Path, spec: dict):
    """The metrics of a run already complete in ``run_dir`` with the same settings (``run.json``,
    written when it finished) and all its training steps, else None."""
    from train.trainer.metrics_file import read_metrics

    try:
        if json.loads((run_dir / "run.json").read_text()) != spec:
            return None
        metrics = read_metrics(run_dir / "metrics.jsonl")
    except (FileNotFoundError, ValueError):
        return None
    done = [s for s in metrics if "critic/score/mean" in metrics[s]]
    return metrics if sorted(done) == list(range(1, spec["steps"] + 1)) else None


def mean_over_seeds(runs: list[dict]) -> dict[int, dict[str, float]]:
    """Per step and metric, the mean over the runs that logged it (a step without positive-advantage
    tokens logs no ``logp_pos``)."""
    out: dict[int, dict[str, float]] = {}
    for step in sorted(set.intersection(*(set(r) for r in runs))):
        keys = set.union(*(set(r[step]) for r in runs))
        out[step] = {k: statistics.fmean(r[step][k] for r in runs if k in r[step]) for k in keys}
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", nargs="+", default=["llds_on"], choices=sorted(VARIANTS))
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--window", type=int, default=3, help="steps averaged at each end for the rise")
    ap.add_argument("--task", default="runs/learn_task", help="task + warm start (built when missing)")
    ap.add_argument("--out", default="runs/bench_learning")
    ap.add_argument("--port", type=int, default=8011)
    ap.add_argument("--no-val", action="store_true", help="skip the held-out EM passes (faster)")
    args = ap.parse_args(argv)
    if args.window < 1 or args.steps < 2 * args.window:
        ap.error(f"--steps must be at least 2 x --window ({2 * max(args.window, 1)}), got {args.steps}")
    task, out = (ROOT / args.task).resolve(), (ROOT / args.out).resolve()
    print(f"task and warm start: {task}", flush=True)
    learnable.build(task)  # reuses an identical finished build; refuses one made with other settings
    if not (task / "bm25" / "manifest.json").is_file():
        subprocess.run([sys.executable, "-m", "retrieval.build", "--corpus", str(task / "corpus.jsonl"),
                        "--out", str(task / "bm25"), "--kind", "bm25"], check=True, cwd=ROOT,
                       stdout=subprocess.DEVNULL)
    out.mkdir(parents=True, exist_ok=True)
    server = serve(task / "bm25", args.port, out / "retriever.log")
    url = f"http://127.0.0.1:{args.port}"
    extra = ["trainer.val_before_train=false", "trainer.test_freq=-1"] if args.no_val else []
    rises: dict[str, list[float]] = {}
    try:
        print(f"{'variant':<10}{'seed':>5}{'first':>8}{'last':>8}{'rise':>8}{'min searches':>14}{'alarms':>8}"
              f"{'s/step':>8}{'wall s':>8}", flush=True)
        for variant in args.variants:
            overrides, plugins = VARIANTS[variant]
            runs = []
            for seed in args.seeds:
                run_dir = out / variant / f"seed{seed}"
                t0 = time.time()
                spec = {"task": str(task), "steps": args.steps, "seed": seed, "plugins": plugins,
                        "overrides": [*overrides, *extra, f"trainer.save_freq={10 * args.steps}"]}
                steps = finished(run_dir, spec)  # an interrupted benchmark resumes where it stopped
                if steps is None:
                    (run_dir / "run.json").unlink(missing_ok=True)
                    steps = learnable.run_rl(task, run_dir, url, steps=args.steps, seed=seed,
                                             overrides=spec["overrides"], plugins=plugins)
                    (run_dir / "run.json").write_text(json.dumps(spec))
                first, last = learnable.reward_rise(steps, args.window)
                searches = min(m["search_r1/searches"] for m in steps.values() if "search_r1/searches" in m)
                alarms = sum(m.get("search_r1/lld_alarm", 0) for m in steps.values())
                rises.setdefault(variant, []).append(last - first)
                runs.append(steps)
                step_s = statistics.fmean(m["timing_s/step"] for m in steps.values() if "timing_s/step" in m)
                print(f"{variant:<10}{seed:>5}{first:>8.3f}{last:>8.3f}{last - first:>+8.3f}{searches:>14.2f}"
                      f"{alarms:>8.0f}{step_s:>8.1f}{time.time() - t0:>8.0f}", flush=True)
            with open(out / variant / "metrics.jsonl", "w") as f:
                for step, data in mean_over_seeds(runs).items():
                    f.write(json.dumps({"step": step, "data": data}) + "\n")
    finally:
        server.terminate()
    print(f"\nrise = mean reward of the last {args.window} steps - of the first {args.window} ({args.steps} steps)")
    for variant, values in rises.items():
        sd = statistics.stdev(values) if len(values) > 1 else 0.0
        print(f"{variant:<10} n={len(values)}  mean {statistics.fmean(values):+.3f}  sd {sd:.3f}  "
              f"min {min(values):+.3f}  max {max(values):+.3f}")
    from train.trainer.metrics_file import read_metrics
    from train.trainer.plots import plot_runs

    names = list(rises)
    for path in plot_runs([read_metrics(out / v) for v in names], names, out / "plots"):
        print(path)


if __name__ == "__main__":
    main()
