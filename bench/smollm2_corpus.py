"""The study's SmolLM2 runs: GRPO, +LLDS, +LLDS-MA and +SAPO's drift penalty from one warm start, with held-out EM.

    python bench/smollm2_corpus.py --regimes lrx10_updates4 --seeds 0 1 2   # what is missing, resumable
    python bench/smollm2_corpus.py --regimes preset --seeds 0 1 --commit    # git-commit each run as it ends
    python bench/study.py --model smollm2                                   # the report

Each run is ``configs/smollm2_grpo_llds.yaml`` (SmolLM2-135M-Instruct, verl's trainer on 2 CPU ranks with the
reference model and KL, the hf rollout, the search agent against a live MiniLM retriever over the bundled
corpus) from the warm start of ``bench/bench_smollm2.py`` (``--parts data,warm``: built when missing), with an
arm's overrides (:data:`bench.collapse_corpus.ARMS`) and a regime's (:data:`REGIMES`), seeds
``data.seed = rollout.seed = seed``: every arm of a seed starts from the same weights and sees the same
questions in the same order. After its last step the run is merged and the search agent answers the 200
held-out test questions greedily (vLLM's CPU engine, 2 searches, 128 new tokens a turn, as
``bench/bench_smollm2.py``'s held-out part).

A finished run leaves two files, written in this order, each whole (temporary name, then renamed):

- ``bench/study/smollm2/heldout/<variant>-s<seed>.jsonl``: one row per test question (uid, source, EM, F1,
  answer, searches);
- ``bench/collapse_corpus/smollm2/<variant>-s<seed>.jsonl``: the collapse corpus's format (a header, then
  the kept metrics of each step: :mod:`train.monitor.records`), which the collapse warning's replay reads too.

The corpus file marks the run done: a rerun skips it, and a run cut short (no corpus file) starts over
from the warm start, never from a half-finished run's checkpoint. ``--commit`` commits the two files at once
(only those paths), so a machine that is not kept costs at most the run in progress. The checkpoints are
deleted once the held-out rows are written (about 1.6 GB a run); metrics and logs stay under ``--work``.
The warm start's own held-out rows (the baseline of every gain) are ``heldout/warm_start.jsonl``; every
header names the study's warm start (``warm_start``: the sha256 of the weights its first run used) and the
weights the run itself started from (``warm_start_weights``), and the report refuses runs from two different
warm starts. The warm start is not kept between machines (1.6 GB). Its rebuild is bit-exact on the same kind of
CPU (an AVX-512 BF16 EPYC rebuilt it bit for bit on 2026-12-07) but not on another (a Zen 3 EPYC without AVX-512
gave loss 2.124 -> 0.158 as well, with other bits). A rebuilt warm start whose
sha256 differs from the study's counts as the study's when its greedy held-out answers agree with the recorded
ones on at least :data:`SAME_ANSWERS` of the questions and its EM is within :data:`SAME_EM` of theirs (checked
once per rebuild: one held-out evaluation, 4 minutes where the CPU has bf16 instructions and 43 without;
vLLM's greedy decoding is not batch-invariant, so even the same weights
need not repeat every answer); the run's header keeps the check (``warm_start_check``). Otherwise the runner
stops and says why: new runs could not be paired with the recorded ones.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_learning import serve  # noqa: E402
from bench.bench_smollm2 import MODEL, Bench, free_port, read_rows, run  # noqa: E402
from bench.collapse_corpus import ARMS, record  # noqa: E402

PRESET = "smollm2_grpo_llds"  # the arms' overrides are relative to it (ARMS: llds is the preset as shipped)
#: regime -> (variant suffix, overrides of the preset): the preset (2 optimizer updates per rollout batch of 4
#: questions, lr 5e-6), and the collapse-prone one: 4 updates per batch (mini-batches of 1 question, one pass: the
#: preset's compute) at 10x the learning rate. 8 updates at the preset's lr (mini-batches of 1, two passes)
#: showed no sign of collapse in 5 steps (logp_pos -0.02 to -0.04, entropy 0.18-0.32) at twice the step's cost.
REGIMES = {"preset": ("", []),
           "lrx10_updates4": ("_lrx10_updates4", ["actor_rollout_ref.actor.ppo_mini_batch_size=1",
                                                  "actor_rollout_ref.actor.optim.lr=5.0e-5"])}
#: the held-out evaluation (bench/bench_smollm2.py's): the search agent, greedy, vLLM's CPU engine
HELDOUT = ["--max-turns", "2", "--max-new-tokens", "128", "--concurrency", "64"]
HELDOUT_KEYS = ("uid", "data_source", "em", "f1", "answer", "searches")


def variants() -> dict[str, list[str]]:
    """``<arm><suffix>`` -> overrides of :data:`PRESET`."""
    return {arm + suffix: [*over, *regime] for arm, (_, over) in ARMS.items() for suffix, regime in REGIMES.values()}


def corpus_file(corpus: Path, variant: str, seed: int) -> Path:
    return corpus / "smollm2" / f"{variant}-s{seed}.jsonl"


def heldout_file(study: Path, name: str) -> Path:
    return study / "smollm2" / "heldout" / f"{name}.jsonl"


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def warm_start_id(sft: Path) -> str:
    """The warm start's identity: the sha256 of its weights (the same on every run of one study)."""
    files = sorted(sft.glob("*.safetensors"))
    if not files:
        raise SystemExit(f"{sft}: no warm start weights (bench/bench_smollm2.py --parts data,warm)")
    return hashlib.sha256("".join(sha256(f) for f in files).encode()).hexdigest()[:16]


def recorded_warm_starts(corpus: Path) -> set[str]:
    """The warm starts the recorded SmolLM2 runs name (one, in a sound study; none before its first run)."""
    from train.monitor.records import read_run

    return {read_run(path).header.get("warm_start") for path in sorted((corpus / "smollm2").glob("*.jsonl"))}


#: a rebuilt warm start is the study's when at least this share of its greedy held-out answers are the recorded
#: ones and its EM is within SAME_EM of theirs (2 questions of 200). The scale: 10 steps of RL leave 0.00-0.36 of
#: the warm start's answers unchanged, and two seeds of one arm agree on 0.27 (the recorded runs of 2026-12-06)
SAME_ANSWERS, SAME_EM = 0.90, 0.01


def differing(new: dict[str, dict], recorded: dict[str, dict]) -> list[str]:
    """The held-out questions where ``new`` differs from ``recorded`` (answer, EM or searches, or missing)."""
    return sorted(u for u in recorded.keys() | new.keys()
                  if u not in new or u not in recorded
                  or any(new[u].get(k) != recorded[u].get(k) for k in ("answer", "em", "searches")))


def same_warm_start(new: dict[str, dict], recorded: dict[str, dict]) -> dict:
    """How far a rebuilt warm start's held-out rows are from the recorded ones, and whether that is the same."""
    differ = differing(new, recorded)
    em_new, em_old = (sum(r["em"] for r in rows.values()) / max(len(rows), 1) for rows in (new, recorded))
    share = 1 - len(differ) / len(recorded)
    return {"answers_equal": round(share, 4), "differ": differ[:5], "em": round(em_new, 4),
            "recorded_em": round(em_old, 4), "same": share >= SAME_ANSWERS and abs(em_new - em_old) <= SAME_EM}


def write_rows(rows, path: Path) -> None:
    """The held-out rows, compact (:data:`HELDOUT_KEYS`), sorted by uid, written whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps({k: r.get(k) for k in HELDOUT_KEYS}) + "\n"
                           for r in sorted(rows, key=lambda r: r["uid"])))
    tmp.replace(path)


def git_commit(paths: list[Path], message: str) -> None:
    """Commit exactly ``paths`` (nothing else staged goes with them); a failure is reported, not fatal."""
    rel = [str(p.relative_to(ROOT)) for p in paths]
    add = subprocess.run(["git", "add", "--", *rel], cwd=ROOT, capture_output=True, text=True)
    done = add.returncode == 0 and subprocess.run(
        ["git", "commit", "-q", "-m", message, "--", *rel], cwd=ROOT, capture_output=True, text=True).returncode == 0
    print(f"  {'committed' if done else 'NOT committed (git failed)'}: {', '.join(rel)}", flush=True)


class Runner:
    def __init__(self, args):
        self.a = args
        self.corpus, self.study, self.work = (ROOT / args.corpus), (ROOT / args.study), (ROOT / args.work)
        self.bench = Bench(argparse.Namespace(out=args.base, index=args.index, vllm_python=args.vllm_python,
                                              warm_args=args.warm_args))
        self.sft = Path(args.base) / "sft"

    def prepare(self) -> tuple[str, str, dict | None]:
        """The data, the index and the warm start (each reused when there), its held-out rows; the study's warm
        start id and the sha256 of the weights on this machine (equal, or checked equivalent: module doc)."""
        from train.models.registry import resolve

        resolve(MODEL)  # converted? (python -m train.get_model smollm2-135m-instruct)
        self.bench.part_data()
        self.bench.part_warm()
        weights = warm_start_id(self.sft)
        recorded = recorded_warm_starts(self.corpus)
        if len(recorded) > 1:
            raise SystemExit(f"{self.corpus / 'smollm2'}: runs from {len(recorded)} warm starts ({sorted(recorded)})")
        path = heldout_file(self.study, "warm_start")
        if recorded and recorded != {weights} and not path.is_file():
            raise SystemExit(f"{path}: missing, and the warm start here (weights {weights}) is not the one the "
                             f"recorded runs name ({', '.join(sorted(recorded))}): nothing to check it against")
        if recorded == {weights} or (not recorded and path.is_file()):
            return weights, weights, None
        out = self.work / "warm_start" / "heldout.jsonl"
        self.bench.evaluate(str(self.sft), "search_r1", "vllm", out, extra=HELDOUT)
        rows = read_rows(out)
        if not path.is_file():
            write_rows(rows.values(), path)
            if self.a.commit:
                git_commit([path], f"Study (SmolLM2): the warm start's held-out rows (warm start {weights})")
            return weights, weights, None
        (study,) = recorded
        check = same_warm_start(rows, read_rows(path))
        said = (f"its greedy held-out answers agree with {path} on {check['answers_equal']:.1%} of the questions "
                f"(first differing: {', '.join(check['differ'][:3]) or '-'}), EM {check['em']:.3f} against "
                f"{check['recorded_em']:.3f}")
        if not check["same"]:
            raise SystemExit(
                f"{self.sft}: this warm start (weights {weights}) is not the study's ({study}): {said}; the study "
                f"asks >= {SAME_ANSWERS:.0%} and EM within {SAME_EM}. Runs from it cannot be paired with the "
                f"{self.corpus / 'smollm2'} runs: record a new study in another --corpus/--study")
        print(f"warm start rebuilt: weights {weights}, not the study's {study} bit for bit; {said}: counted as the "
              "study's", flush=True)
        return study, weights, check

    def one(self, variant: str, seed: int, overrides: list[str], port: int, warm: tuple[str, str, dict | None]) -> None:
        from train.evaluation.checkpoint_sweep import merge
        from train.trainer import checkpoint_store
        from train.trainer.metrics_file import read_metrics

        steps, run_dir = self.a.steps, self.work / f"{variant}-s{seed}"
        final = run_dir / "checkpoints" / f"global_step_{steps}"
        # None: trained by an earlier call (stopped during its evaluation), whose time is not known here
        t0, train_s = time.time(), None
        if checkpoint_store.problems(str(final)):  # not trained and saved whole to the end: from the warm start again
            shutil.rmtree(run_dir, ignore_errors=True)
            run_dir.mkdir(parents=True)
            cmd = [sys.executable, "-m", "train.main", "--config-name", PRESET,
                   f"actor_rollout_ref.model.path={self.sft}",
                   f"data.train_files={Path(self.a.base) / 'data' / 'train.parquet'}",
                   f"data.val_files={Path(self.a.base) / 'data' / 'test.parquet'}",
                   f"trainer.default_local_dir={run_dir / 'checkpoints'}", f"trainer.total_training_steps={steps}",
                   f"trainer.save_freq={steps}", f"search_r1.retriever_url=http://127.0.0.1:{port}/retrieve",
                   f"data.seed={seed}", f"actor_rollout_ref.rollout.seed={seed}", *overrides]
            os.environ.update(VERL_FILE_LOGGER_PATH=str(run_dir / "metrics.jsonl"), VERL_PLATFORM="cpu")
            try:
                run(cmd, run_dir / "train.log")
            finally:
                os.environ.pop("VERL_FILE_LOGGER_PATH", None)
            train_s = round(time.time() - t0)
        metrics = read_metrics(run_dir / "metrics.jsonl")
        trained = sorted(s for s in metrics if "critic/score/mean" in metrics[s])
        if trained != list(range(1, steps + 1)):
            raise SystemExit(f"{run_dir}: steps {trained} logged, expected 1-{steps}; not recorded")
        merged = run_dir / "merged"
        if not (merged / "config.json").is_file():
            merge(final, merged)
        out = run_dir / "heldout.jsonl"
        eval_s = self.bench.evaluate(str(merged), "search_r1", "vllm", out, extra=HELDOUT)
        rows = read_rows(out)
        em = sum(r["em"] for r in rows.values()) / len(rows)
        held = heldout_file(self.study, f"{variant}-s{seed}")
        write_rows(rows.values(), held)
        header = {"model": MODEL, "variant": variant, "seed": seed, "steps": steps, "preset": PRESET,
                  "overrides": overrides, "plugins": None, "fault": False, "crashed": False, "error": None,
                  "warm_start": warm[0], "warm_start_weights": warm[1],
                  **({"warm_start_check": warm[2]} if warm[2] else {}),
                  "heldout_em": round(em, 4), "heldout_questions": len(rows),
                  "wall_s": train_s, "heldout_s": round(eval_s)}
        path = corpus_file(self.corpus, variant, seed)
        record(metrics, header, path)
        rewards = " ".join(f"{metrics[s]['critic/score/mean']:.2f}" for s in trained)
        trained_in = f"trained {train_s} s" if train_s is not None else "trained earlier"
        print(f"{variant} seed {seed}: {trained_in}, held-out EM {em:.3f} ({eval_s:.0f} s); "
              f"reward {rewards}", flush=True)
        if self.a.commit:
            git_commit([held, path], f"Study (SmolLM2): {variant} seed {seed}, held-out EM {em:.3f}")
        shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
        shutil.rmtree(merged, ignore_errors=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--regimes", nargs="+", default=list(REGIMES), choices=list(REGIMES))
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--commit", action="store_true", help="git-commit each finished run's two files")
    ap.add_argument("--corpus", default="bench/collapse_corpus")
    ap.add_argument("--study", default="bench/study")
    ap.add_argument("--base", default="runs/smollm2", help="the data and the warm start (bench/bench_smollm2.py's)")
    ap.add_argument("--work", default="runs/study_smollm2", help="scratch: the runs' checkpoints, metrics and logs")
    ap.add_argument("--index", default="runs/index/minilm")
    ap.add_argument("--warm-args", default="--steps 40 --batch 4 --lr 5e-5 --obs-tokens 200")
    ap.add_argument("--vllm-python", default=os.environ.get("VLLM_PYTHON", str(ROOT / ".venv-vllm" / "bin" / "python")))
    args = ap.parse_args(argv)
    if args.steps < 2:
        ap.error(f"--steps must be >= 2, got {args.steps}")
    table = variants()
    # every arm of a seed before the next seed, the collapse regime first: an interruption leaves whole seeds
    todo = [(arm + REGIMES[r][0], s) for r in args.regimes for s in args.seeds for arm in args.arms]
    todo = [(v, s) for v, s in todo if not corpus_file(ROOT / args.corpus, v, s).is_file()]
    print(f"{len(todo)} SmolLM2 runs to do ({args.steps} steps each): {', '.join(f'{v}-s{s}' for v, s in todo)}",
          flush=True)
    if not todo:
        return
    runner = Runner(args)
    warm = runner.prepare()
    runner.work.mkdir(parents=True, exist_ok=True)
    port = free_port()
    server = serve(Path(args.index), port, runner.work / "retriever.log")
    try:
        for i, (variant, seed) in enumerate(todo, 1):
            print(f"[{i}/{len(todo)}] {variant} seed {seed} ...", flush=True)
            runner.one(variant, seed, table[variant], port, warm)
    finally:
        server.terminate()


if __name__ == "__main__":
    main()
