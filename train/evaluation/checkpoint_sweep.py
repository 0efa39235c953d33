"""EM at every saved checkpoint of a run, and the best step: ``python -m train.evaluate --checkpoints
CKPT_DIR --data data/processed/val_sample.parquet``.

The GRPO/GSPO/PPO rows of the paper's table are "the best checkpoint before collapse": this evaluates
each complete ``global_step_N`` of a run (``trainer.default_local_dir``) on one fixed sample,
merging verl's FSDP shards to HF format in a temporary folder (deleted after; a merged ``hf/``
folder inside the step is used as it is), and writes to ``--out`` (default ``CKPT_DIR/eval``):

- ``global_step_N.jsonl``: the per-question rows (resumable, as every evaluation);
- ``steps.jsonl``: one row per evaluated step (EM per source, macro EM); a step already there is
  not evaluated again, so a stopped run goes on where it stopped;
- ``best.json``: the best step (highest macro EM; the earliest on a tie, i.e. before a collapse);
- ``em_vs_step.png``: EM against step, beside the training reward of ``CKPT_DIR/metrics.jsonl``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from train.files import atomic_write

if TYPE_CHECKING:
    from train.evaluation.options import EvalOptions


def read_steps(path: Path) -> dict[int, dict]:
    rows: dict[int, dict] = {}
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                d = json.loads(line)
                rows[int(d["step"])] = d
            except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                continue  # a line cut by an interruption: that step is evaluated again
    return rows


def best_step(rows: dict[int, dict]) -> Optional[dict]:
    if not rows:
        return None
    return max(rows.values(), key=lambda d: (d["em"], -d["step"]))


def merge(step_dir: Path, target: Path) -> Path:
    """verl's FSDP actor shards of ``step_dir`` -> an HF model folder ``target``."""
    actor = step_dir / "actor"
    if not actor.is_dir():
        raise FileNotFoundError(f"{actor}: no actor shards to merge")
    cmd = [sys.executable, "-m", "verl.model_merger", "merge", "--backend", "fsdp", "--local_dir", str(actor),
           "--target_dir", str(target)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0 or not (target / "config.json").is_file():
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-15:])
        raise RuntimeError(f"merging {actor} failed (rc {proc.returncode}):\n{tail}")
    return target


def plot(rows: dict[int, dict], ckpt_dir: Path, out: Path) -> Optional[Path]:
    """EM per step (and per source), with the training reward on a second axis when the run's
    metrics file is there."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    from train.trainer.metrics_file import read_metrics
    from train.trainer.plots import REWARD, series

    steps = sorted(rows)
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, [rows[s]["em"] for s in steps], "o-", color="C0", label="EM (macro)")
    sources = sorted({k for s in steps for k in rows[s]["sources"]})
    if len(sources) > 1:
        for i, src in enumerate(sources):
            xs = [s for s in steps if src in rows[s]["sources"]]
            ax.plot(xs, [rows[s]["sources"][src] for s in xs], ":", color=f"C{i + 2}", label=f"EM {src}")
    best = best_step(rows)
    ax.axvline(best["step"], color="grey", ls="--", lw=1)
    ax.set_xlabel("step")
    ax.set_ylabel("exact match")
    ax.set_title(f"{ckpt_dir.name}: EM per checkpoint (best: step {best['step']}, {best['em']:.3f})")
    try:
        metrics = read_metrics(ckpt_dir / "metrics.jsonl")
        xs, ys = series(metrics, REWARD)
        if xs:
            ax2 = ax.twinx()
            ax2.plot(xs, ys, "-", color="C1", alpha=0.6, label="training reward")
            ax2.set_ylabel("training reward")
            ax2.legend(loc="lower right")
    except (FileNotFoundError, ValueError):
        pass
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    path = out / "em_vs_step.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def evaluate_checkpoints(opts: "EvalOptions", rows: list[dict], paper: Optional[dict], generator=None) -> int:
    """Every complete checkpoint of ``opts.checkpoints``, each asked with ``opts.ask`` and its merged model.
    Raises :class:`~train.errors.CheckpointError` (exit 2) when none can be evaluated and
    :class:`~train.errors.RetrieverDown` (exit 3) naming the step when the retriever fails."""
    from train.errors import CheckpointError, DataError, RetrieverDown
    from train.evaluation.report import describe_speed, table
    from train.evaluation.results import macro_em
    from train.evaluation.runner import run_model
    from train.inference.results_file import differences
    from train.trainer import checkpoint_store as checkpoints

    root = Path(opts.checkpoints)
    if not root.is_dir():
        raise CheckpointError(f"--checkpoints {root}: no such folder")
    steps = checkpoints.saved_steps(str(root))
    if not steps:
        raise CheckpointError(f"--checkpoints {root}: no global_step_N folder in it")
    out = Path(opts.out) if opts.out else root / "eval"
    out.mkdir(parents=True, exist_ok=True)
    summary = out / "steps.jsonl"
    data = str(Path(opts.data).resolve())
    # a step counts as done only for the same data and questions (another --data, --limit or --sources
    # evaluates it again; its per-question jsonl then refuses rows for other questions)
    # ... and with the same settings (the search budget, the method, the engine, ...; the weights are each step's
    # own): a step evaluated with others is refused up front, as its per-question jsonl would refuse it
    settings = {k: v for k, v in opts.ask.answer_settings().items() if k not in ("weights", "model_path")}
    before = read_steps(summary)
    for step, d in sorted(before.items()):
        if d.get("settings") not in (None, settings):
            raise DataError(f"{summary}: step {step} was evaluated with other settings "
                            f"({differences(d['settings'], settings)}); pass another "
                            f"--out, or delete {out} to start over")
    done = {s: d for s, d in before.items() if d.get("data") == data and d.get("asked") == len(rows)}
    print(f"{len(steps)} checkpoints in {root}: steps {', '.join(map(str, steps))}; "
          f"{sum(s in done for s in steps)} already evaluated ({summary})")
    for step in steps:
        if step in done:
            continue
        folder = Path(checkpoints.step_dir(str(root), step))
        wrong = checkpoints.problems(str(folder))
        if wrong:
            print(f"step {step}: skipped, the checkpoint is incomplete ({wrong[0]})", file=sys.stderr)
            continue
        with tempfile.TemporaryDirectory(prefix=f"merge_step{step}_", dir=out) as tmp:
            model = folder / "hf"
            if not (model / "config.json").is_file():
                print(f"step {step}: merging the FSDP shards to HF format ...", file=sys.stderr)
                model = merge(folder, Path(tmp) / "hf")
            try:
                results, stats = run_model(opts, str(model), rows, out / f"global_step_{step}.jsonl", generator)
            except RetrieverDown as e:
                raise RetrieverDown(f"step {step}: {e}", results=e.results) from None
        per, em = macro_em(results)
        row = {"step": step, "n": len(results), "em": em, "sources": per, "data": data, "asked": len(rows),
               "settings": settings}
        with open(summary, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
        done[step] = row
        print(f"step {step}: EM {em:.3f} over {len(results)} questions ({describe_speed(stats)})")
    evaluated = {s: done[s] for s in steps if s in done}
    if not evaluated:
        raise CheckpointError("no checkpoint could be evaluated")
    print(f"\n{'step':>8}{'n':>7}{'EM':>8}")
    for s, d in evaluated.items():
        print(f"{s:>8}{d['n']:>7}{d['em']:>8.3f}")
    best = best_step(evaluated)
    atomic_write(out / "best.json", json.dumps(best) + "\n")
    picture = plot(evaluated, root, out)
    print(f"best step: {best['step']} (EM {best['em']:.3f}); {out / 'best.json'}"
          + (f"; plot {picture}" if picture else ""))
    if paper:
        from train.evaluation.results import read_done

        print("\nthe best step beside the paper's row:\n"
              + table(list(read_done(out / f"global_step_{best['step']}.jsonl").values()), paper))
    return 0
