"""SmolLM2-135M-Instruct through the whole pipeline on CPU, one command (``make bench-smollm2``):

    python bench/bench_smollm2.py [--parts data,table,warm,rl,heldout] [--out runs/smollm2] [--steps 10]
                                  [--save-freq 5] [--rollout hf|vllm] [--table-limit 25]

Needs ``.venv`` and the CPU vLLM environment ``.venv-vllm`` (``make .venv-vllm/.installed``; the table and
the held-out evaluations run vLLM there, ``--vllm-python``) and the converted model (``make models``).
About 75 minutes on 2 cores with the defaults (the times of docs/real-model.md: the table ~15 min, the warm
start 5, the two RL runs of 10 steps ~16 each, the held-out evaluations ~20, the hf one of them ~13); longer
on a slower machine. Every part is reused when rerun, so an interrupted run goes on where it stopped.

- ``data``: the recorded split of the bundled questions (data/split.json: 200 test, 500 train).
- ``table``: the untrained model on the test split (``--table-limit`` per dataset) with the paper's four
  methods (direct, CoT, RAG, the search agent), each with the hf and the vLLM CPU engine: EM and F1
  per dataset, the engines' greedy agreement and their questions/s ratio, measured in this run.
- ``warm``: the warm start on the training split (``python -m train.warm_start``).
- ``rl``: GRPO + LLDS and plain GRPO from that warm start (configs/smollm2_grpo_llds.yaml,
  smollm2_grpo.yaml; ``--steps``, resumed when checkpoints exist) against a live retriever over the
  bundled corpus; per step: reward, searches, response length, the likelihood of positive-advantage
  tokens (``actor/llds/logp_pos``), the collapse alarm, where the step's seconds go (``timing_s/*``).
- ``heldout``: greedy EM of the search agent on the whole test split at three points (the untrained
  model, the warm start, after each RL run), with bootstrap 95% intervals over the questions, paired
  by question for the gains.

Every part writes its files under ``--out`` and reuses what is there (delete a file to redo it); an
evaluation is reused, or resumed after an interruption, only while its command and the weights of its
model are unchanged;
``--out``/results.json gathers the numbers and the tables are printed at the end. The retriever is
the MiniLM flat index over the bundled corpus (``runs/index/minilm``, built when missing). The hf
engine and training run with this interpreter; vLLM with ``--vllm-python`` (the CPU vLLM environment of
``make .venv-vllm/.installed``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
MODEL = "smollm2-135m-instruct"
METHODS = ["direct", "cot", "rag", "search_r1"]
PRESETS = {"grpo_llds": "smollm2_grpo_llds", "grpo": "smollm2_grpo"}
VLLM_ROLLOUT = ["actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.mode=async",
                "actor_rollout_ref.rollout.dtype=float32", "actor_rollout_ref.rollout.enforce_eager=true",
                "+actor_rollout_ref.rollout.enable_sleep_mode=false"]
#: trajectories per step of configs/_smollm2.yaml (data.train_batch_size x actor_rollout_ref.rollout.n)
TRAJECTORIES = 4 * 4
STEP_KEYS = [("critic/score/mean", "reward"), ("search_r1/searches", "searches"),
             ("response_length/mean", "resp_len"), ("actor/llds/logp_pos", "logp_pos"),
             ("actor/llds/penalty", "llds_pen"), ("search_r1/lld_alarm", "alarm"), ("actor/entropy", "entropy"),
             ("critic/advantages/max", "adv_max"), ("timing_s/step", "s/step")]


def env() -> dict:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "offline",
            "TOKENIZERS_PARALLELISM": "false", "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2")}


def run(cmd: list[str], log: Path, **kw) -> float:
    """Run ``cmd`` with its output in ``log``; seconds taken (an error names the log)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    with open(log, "w") as f:
        rc = subprocess.run(cmd, cwd=ROOT, env=env(), stdout=f, stderr=subprocess.STDOUT, **kw).returncode
    if rc != 0:
        tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-30:])
        raise SystemExit(f"{' '.join(cmd[:4])} ... failed (rc {rc}); log {log}:\n{tail}")
    return time.time() - t0


def read_rows(path: Path) -> dict[str, dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {r["uid"]: r for r in rows}


class Bench:
    def __init__(self, args):
        self.a, self.out = args, Path(args.out)
        self.data = self.out / "data"
        self.results_path = self.out / "results.json"
        self.results = json.loads(self.results_path.read_text()) if self.results_path.is_file() else {}

    def save(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        self.results_path.write_text(json.dumps(self.results, indent=1) + "\n")

    # -- parts -------------------------------------------------------------------------------------

    def part_data(self) -> None:
        recorded = json.loads((ROOT / "data" / "split.json").read_text())
        argv = recorded["command"].split()[3:]
        argv[argv.index("--out") + 1] = str(self.data)
        run([sys.executable, "-m", "train.data_prep", *argv], self.out / "logs" / "data_prep.log")
        made = json.loads((self.data / "split.json").read_text())
        if made["test"] != recorded["test"]:
            raise SystemExit("the test split differs from data/split.json")
        index = Path(self.a.index)
        if not (index / "manifest.json").is_file():
            run([sys.executable, "-m", "retrieval.build", "--corpus", str(ROOT / "data" / "corpus.jsonl"),
                 "--out", str(index)], self.out / "logs" / "index.log")
        print(f"data: {len(made['train'])} train, {len(made['test'])} test questions; index {index}")

    def evaluate(self, model: str, method: str, backend: str, out: Path, limit=None, extra=()) -> float:
        """``python -m train.evaluate`` into ``out``; wall seconds. A complete evaluation is reused and an
        interrupted one resumed from the rows in ``out``, only while the command and the model's weights
        are the ones they were made with (``out.stamp``); otherwise it starts over."""
        py = self.a.vllm_python if backend == "vllm" else sys.executable
        cmd = [py, "-m", "train.evaluate", "--model", model, "--data", str(self.data / "test.parquet"),
               "--method", method, "--backend", backend, "--index", self.a.index, "--out", str(out), *extra]
        if limit:
            cmd += ["--limit", str(limit)]
        done, stamp_file = out.with_suffix(".done"), out.with_suffix(".stamp")
        out.parent.mkdir(parents=True, exist_ok=True)  # the stamp is the first file of a fresh --out
        stamp = json.dumps({"command": cmd[1:], "weights": weights_stamp(model)}, sort_keys=True)
        if not stamp_file.is_file() or stamp_file.read_text() != stamp:
            out.unlink(missing_ok=True)
            done.unlink(missing_ok=True)
            stamp_file.write_text(stamp)
        if done.is_file():
            return json.loads(done.read_text())["seconds"]
        seconds = run(cmd, out.with_suffix(".log"))
        done.write_text(json.dumps({"seconds": seconds}) + "\n")
        return seconds

    def part_table(self) -> None:
        """The untrained model, four methods, two engines, the same questions and settings."""
        table = {}
        extra = ["--max-new-tokens", str(self.a.table_tokens), "--max-turns", "2", "--concurrency", "32"]
        for method in METHODS:
            for backend in ("hf", "vllm"):
                out = self.out / "table" / f"{method}_{backend}.jsonl"
                seconds = self.evaluate(MODEL, method, backend, out, self.a.table_limit, extra)
                rows = read_rows(out)
                speed = evaluator_speed(out.with_suffix(".log"))
                table[f"{method}/{backend}"] = {"seconds": round(seconds, 1), "questions": len(rows), **speed,
                                                "generated_tokens": sum(r["generated_tokens"] for r in rows.values()),
                                                **scores(rows.values())}
                print(f"table {method:9s} {backend:4s}: {len(rows)} questions in {seconds:.0f} s, "
                      f"EM {table[f'{method}/{backend}']['em']:.3f}", flush=True)
            a = read_rows(self.out / "table" / f"{method}_hf.jsonl")
            b = read_rows(self.out / "table" / f"{method}_vllm.jsonl")
            same = [u for u in a if u in b and a[u]["trajectory"] == b[u]["trajectory"]]
            same_answer = [u for u in a if u in b and a[u]["answer"] == b[u]["answer"]]
            table[f"{method}/agreement"] = {"trajectory": len(same) / len(a), "answer": len(same_answer) / len(a),
                                            "qps_ratio_vllm_over_hf": table[f"{method}/vllm"]["qps"]
                                            / table[f"{method}/hf"]["qps"]}
        self.results["table"] = {"settings": {"limit_per_dataset": self.a.table_limit, "extra": extra}, **table}
        self.save()

    def part_warm(self) -> None:
        out = self.out / "sft"
        if not (out / "warm_start.json").is_file():
            run([sys.executable, "-m", "train.warm_start", "--model", MODEL, "--data", str(self.data / "train.parquet"),
                 "--index", self.a.index, "--out", str(out), *self.a.warm_args.split()], self.out / "logs" / "warm.log")
        record = json.loads((out / "warm_start.json").read_text())
        record.pop("losses", None)
        self.results["warm_start"] = record
        self.save()
        print(f"warm start: {record['kept']} trajectories, loss {record['first_loss']:.3f} -> "
              f"{record['last_loss']:.3f}, {record['seconds']:.0f} s", flush=True)

    def part_rl(self) -> None:
        port = free_port()
        (self.out / "logs").mkdir(parents=True, exist_ok=True)
        server = subprocess.Popen([sys.executable, "-m", "retrieval.server", "--index", self.a.index, "--port",
                                   str(port)], cwd=ROOT, env=env(), stdout=subprocess.DEVNULL,
                                  stderr=open(self.out / "logs" / "retriever.log", "w"))
        try:
            wait_for(port)
            for name, preset in PRESETS.items():
                self.train(name, preset, port)
        finally:
            server.terminate()
            server.wait(30)

    def train(self, name: str, preset: str, port: int) -> None:
        from train.evaluation.checkpoint_sweep import merge
        from train.trainer.metrics_file import read_metrics

        run_dir = self.out / name
        metrics = run_dir / "metrics.jsonl"
        steps = self.a.steps
        py = self.a.vllm_python if self.a.rollout == "vllm" else sys.executable
        cmd = [py, "-m", "train.main", "--config-name", preset, f"actor_rollout_ref.model.path={self.out / 'sft'}",
               f"data.train_files={self.data / 'train.parquet'}", f"data.val_files={self.data / 'test.parquet'}",
               f"trainer.default_local_dir={run_dir / 'checkpoints'}", f"trainer.total_training_steps={steps}",
               f"trainer.save_freq={self.a.save_freq or steps}", f"search_r1.retriever_url=http://127.0.0.1:{port}/retrieve",
               *(VLLM_ROLLOUT if self.a.rollout == "vllm" else [])]
        final = run_dir / "checkpoints" / f"global_step_{steps}"
        memory = run_dir / "peak_memory.json"
        if not (final / "actor").is_dir():
            os.environ["VERL_FILE_LOGGER_PATH"] = str(metrics)
            watch = PeakMemory()
            try:
                print(f"rl {name}: {steps} steps ({self.a.rollout} rollout) ...", flush=True)
                os.environ["VERL_PLATFORM"] = "cpu"
                watch.start()
                run(cmd, run_dir / f"train_{int(time.time())}.log")
            finally:
                watch.stop()
                os.environ.pop("VERL_FILE_LOGGER_PATH", None)
            memory.write_text(json.dumps(watch.peaks(), indent=1) + "\n")
        merged = run_dir / "merged"
        if not (merged / "config.json").is_file():
            merge(final, merged)
        per_step = read_metrics(metrics)
        self.results[f"rl/{name}"] = {"preset": preset, "steps": steps, "rollout": self.a.rollout,
                                      "per_step": {s: {n: m.get(k) for k, n in STEP_KEYS} for s, m in per_step.items()},
                                      "timing": mean_of(per_step, "timing_s/"), "perf": mean_of(per_step, "perf/"),
                                      "peak_rss_gb": json.loads(memory.read_text()) if memory.is_file() else None}
        self.save()

    def part_heldout(self) -> None:
        points = {"untrained": MODEL, "warm_start": str(self.out / "sft")}
        for name in PRESETS:
            if (self.out / name / "merged" / "config.json").is_file():
                points[f"after_{name}"] = str(self.out / name / "merged")
        rows = {}
        for point, model in points.items():
            out = self.out / "heldout" / f"{point}.jsonl"
            # the presets' 2 searches; 128 new tokens a turn: the warm-started model's turns take 20-60, and the
            # untrained one's prose is cut there (the table above shows it answers nothing either way)
            seconds = self.evaluate(model, "search_r1", self.a.heldout_backend, out,
                                    extra=["--max-turns", "2", "--max-new-tokens", "128", "--concurrency", "64"])
            rows[point] = read_rows(out)
            print(f"held-out {point}: EM {scores(rows[point].values())['em']:.3f} ({seconds:.0f} s)", flush=True)
        held = {p: {**scores(r.values()), "em_ci95": bootstrap_mean([r[u]["em"] for u in sorted(r)])}
                for p, r in rows.items()}
        # the two engines on a model that answers: the warm start, greedy, on the same 200 questions
        other = "hf" if self.a.heldout_backend == "vllm" else "vllm"
        out = self.out / "heldout" / f"warm_start_{other}.jsonl"
        self.evaluate(points["warm_start"], "search_r1", other, out,
                      extra=["--max-turns", "2", "--max-new-tokens", "128", "--concurrency", "64"])
        ours, theirs = rows["warm_start"], read_rows(out)
        logs = {self.a.heldout_backend: out.parent / "warm_start.log", other: out.with_suffix(".log")}
        speed = {e: evaluator_speed(log)["qps"] for e, log in logs.items()}
        self.results["engines_on_the_warm_start"] = {
            "questions": len(ours),
            "same_trajectory": mean(ours[u]["trajectory"] == theirs[u]["trajectory"] for u in ours),
            "same_answer": mean(ours[u]["answer"] == theirs[u]["answer"] for u in ours),
            "em": {self.a.heldout_backend: scores(ours.values())["em"], other: scores(theirs.values())["em"]},
            "qps": speed, "vllm_over_hf_qps": speed["vllm"] / speed["hf"]}
        for a, b in [("untrained", "warm_start"), *[("warm_start", p) for p in rows if p.startswith("after_")]]:
            common = sorted(set(rows[a]) & set(rows[b]))
            diffs = [rows[b][u]["em"] - rows[a][u]["em"] for u in common]
            held[f"gain {b} - {a}"] = {"em": sum(diffs) / len(diffs), "ci95": bootstrap_mean(diffs),
                                       "questions": len(common)}
        self.results["heldout"] = held
        self.save()


def weights_stamp(model: str) -> str:
    """The model's weights as the evaluator records them (:func:`train.models.registry.weights_id`, a registry
    name resolved first): what tells one checkpoint written to a path from the next, and a re-merge of the same
    checkpoint from another."""
    from train.models.registry import ModelNotReady, resolve, weights_id

    try:
        return weights_id(resolve(model))
    except ModelNotReady:
        return ""


def evaluator_speed(log: Path) -> dict:
    """Questions/s and generated tokens/s as the evaluator reports them (engine start-up excluded)."""
    import re

    m = re.search(r"questions in ([0-9.]+) s on \d+ engines?: ([0-9.]+) questions/s, ([0-9.]+) generated tokens/s",
                  log.read_text(errors="replace"))
    if not m:
        raise SystemExit(f"{log}: no speed line from the evaluator")
    return {"eval_seconds": float(m.group(1)), "qps": float(m.group(2)), "tokens_per_s": float(m.group(3))}


def scores(rows) -> dict:
    rows = list(rows)
    out = {"em": mean([r["em"] for r in rows]), "f1": mean([r["f1"] for r in rows])}
    for source in sorted({r["data_source"] for r in rows}):
        part = [r for r in rows if r["data_source"] == source]
        out[source] = {"em": mean([r["em"] for r in part]), "f1": mean([r["f1"] for r in part]), "n": len(part)}
    out["searches"] = mean([r.get("searches") or 0 for r in rows])
    out["answered"] = mean([r.get("answer") is not None for r in rows])
    return out


def mean(xs) -> float:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else float("nan")


def bootstrap_mean(xs: list[float], n: int = 10_000, seed: int = 0) -> list[float]:
    """Percentile bootstrap 95% interval of the mean of ``xs`` (resampling the questions)."""
    rng = random.Random(seed)
    k = len(xs)
    means = sorted(sum(xs[rng.randrange(k)] for _ in range(k)) / k for _ in range(n))
    return [round(means[int(0.025 * n)], 4), round(means[int(0.975 * n) - 1], 4)]


def mean_of(per_step: dict, prefix: str) -> dict:
    keys = sorted({k for m in per_step.values() for k in m if k.startswith(prefix)})
    steps = sorted(per_step)[1:] or sorted(per_step)  # the first step pays the start-up
    return {k: round(mean(per_step[s][k] for s in steps if k in per_step[s]), 3) for k in keys}


class PeakMemory:
    """The high-water resident memory of each Ray actor of a run (``ray::WorkerDict``: one FSDP rank each,
    actor + reference; ``ray::HFServer``: a rollout replica), sampled every 2 s from /proc."""

    def __init__(self, every: float = 2.0):
        import threading

        self.every, self._peak, self._stop = every, {}, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            for proc in Path("/proc").iterdir():
                try:
                    if not proc.name.isdigit():
                        continue
                    name = (proc / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
                    if not name.startswith("ray::"):
                        continue
                    rss = next(int(line.split()[1]) for line in (proc / "status").read_text().splitlines()
                               if line.startswith("VmRSS:"))
                except (OSError, StopIteration, ValueError):
                    continue
                key = (proc.name, name.split(".")[0])
                self._peak[key] = max(self._peak.get(key, 0), rss)

    def peaks(self) -> dict:
        """``{actor kind: [peak GB of each process]}``, largest first."""
        out = {}
        for (_, kind), kb in self._peak.items():
            out.setdefault(kind, []).append(round(kb / 2**20, 2))
        return {k: sorted(v, reverse=True)[:4] for k, v in sorted(out.items()) if max(v) > 1.0}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(port: int, timeout: float = 300) -> None:
    import httpx

    t0 = time.time()
    while time.time() - t0 < timeout:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise SystemExit(f"the retriever on :{port} did not come up in {timeout:.0f} s")


def print_tables(results: dict) -> None:
    t = results.get("table")
    if t:
        print("\n| method | engine | NQ EM | NQ F1 | HotpotQA EM | HotpotQA F1 | avg EM | answered | searches | "
              "questions/s | tokens/s |")
        print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for m in METHODS:
            for e in ("hf", "vllm"):
                r = t.get(f"{m}/{e}")
                if r:
                    print(f"| {m} | {e} | {r['nq']['em']:.3f} | {r['nq']['f1']:.3f} | {r['hotpotqa']['em']:.3f} | "
                          f"{r['hotpotqa']['f1']:.3f} | {r['em']:.3f} | {r['answered']:.2f} | {r['searches']:.2f} | "
                          f"{r['qps']:.2f} | {r['tokens_per_s']:.0f} |")
        print("\n| method | same trajectory | same answer | vLLM/hf questions/s |")
        print("| --- | ---: | ---: | ---: |")
        for m in METHODS:
            g = t.get(f"{m}/agreement")
            if g:
                print(f"| {m} | {g['trajectory']:.2f} | {g['answer']:.2f} | {g['qps_ratio_vllm_over_hf']:.2f} |")
    g = results.get("engines_on_the_warm_start")
    if g:
        print(f"\nthe warm start, greedy, {g['questions']} test questions: same trajectory {g['same_trajectory']:.2f}, "
              f"same answer {g['same_answer']:.2f}; EM " + ", ".join(f"{e} {v:.3f}" for e, v in g["em"].items())
              + "; questions/s " + ", ".join(f"{e} {v:.2f}" for e, v in g["qps"].items())
              + f" (vLLM/hf {g['vllm_over_hf_qps']:.2f})")
    h = results.get("heldout")
    if h:
        print("\n| point | EM [95% CI] | NQ EM | HotpotQA EM | F1 | answered | searches |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        for p, r in h.items():
            if p.startswith("gain"):
                print(f"| {p} | {r['em']:+.3f} [{r['ci95'][0]:+.3f}, {r['ci95'][1]:+.3f}] (paired, n={r['questions']}) "
                      f"| | | | | |")
            else:
                print(f"| {p} | {r['em']:.3f} [{r['em_ci95'][0]:.3f}, {r['em_ci95'][1]:.3f}] | {r['nq']['em']:.3f} | "
                      f"{r['hotpotqa']['em']:.3f} | {r['f1']:.3f} | {r['answered']:.2f} | {r['searches']:.2f} |")
    for name in PRESETS:
        r = results.get(f"rl/{name}")
        if not r:
            continue
        print(f"\n{name} ({r['preset']}, {r['rollout']} rollout), per step:")
        print("| step | " + " | ".join(n for _, n in STEP_KEYS) + " |")
        print("| ---: | " + " | ".join("---:" for _ in STEP_KEYS) + " |")
        for s, m in sorted(r["per_step"].items(), key=lambda kv: int(kv[0])):
            print(f"| {s} | " + " | ".join("" if m.get(n) is None else f"{m[n]:.3g}" for _, n in STEP_KEYS) + " |")
        gen = r["timing"].get("timing_s/gen")
        length = mean(m["resp_len"] for m in r["per_step"].values() if m.get("resp_len") is not None)
        if gen:
            print(f"rollout: {TRAJECTORIES * length / gen:.0f} response tokens/s ({TRAJECTORIES} trajectories of "
                  f"{length:.0f} tokens, observations included, in {gen:.1f} s)")
        print("seconds per step (mean after step 1): " + ", ".join(f"{k[9:]} {v:.1f}" for k, v in r["timing"].items()
                                                                   if k.count("/") == 1 and v >= 0.05))
        if r["perf"]:
            print("perf: " + ", ".join(f"{k[5:]} {v}" for k, v in r["perf"].items() if "mfu" not in k))
        if r.get("peak_rss_gb"):
            print("peak resident memory (GB) per process: "
                  + "; ".join(f"{k} {v}" for k, v in r["peak_rss_gb"].items() if max(v) > 1.0))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", default="data,table,warm,rl,heldout")
    ap.add_argument("--out", default="runs/smollm2")
    ap.add_argument("--index", default="runs/index/minilm")
    ap.add_argument("--steps", type=int, default=10,
                    help="RL steps per run (default 10, the runs of docs/real-model.md: about 16 min each; the "
                         "presets' own 32: about an hour each)")
    ap.add_argument("--save-freq", type=int, default=5, help="checkpoint every N steps and at the end (default 5, as "
                    "the runs of docs/real-model.md; 0: only at the end)")
    ap.add_argument("--rollout", choices=["hf", "vllm"], default="hf")
    ap.add_argument("--table-limit", type=int, default=25, help="test questions per dataset in the methods table")
    ap.add_argument("--table-tokens", type=int, default=128, help="new tokens per turn in the methods table")
    ap.add_argument("--heldout-backend", choices=["hf", "vllm"], default="vllm")
    ap.add_argument("--warm-args", default="--steps 40 --batch 4 --lr 5e-5 --obs-tokens 200")
    ap.add_argument("--vllm-python", default=os.environ.get("VLLM_PYTHON", str(ROOT / ".venv-vllm" / "bin" / "python")))
    ap.add_argument("--print-only", action="store_true", help="print the tables of --out/results.json")
    args = ap.parse_args(argv)
    bench = Bench(args)
    if not args.print_only:
        from train.models.registry import resolve

        resolve(MODEL)  # converted? (python -m train.get_model smollm2-135m-instruct)
        parts = args.parts.split(",")
        unknown = set(parts) - {"data", "table", "warm", "rl", "heldout"}
        if unknown:
            ap.error(f"unknown --parts {sorted(unknown)}")
        for part in ("data", "table", "warm", "rl", "heldout"):
            if part in parts:
                t0 = time.time()
                getattr(bench, f"part_{part}")()
                bench.results.setdefault("seconds", {})[part] = round(time.time() - t0, 1)
                bench.save()
    print_tables(bench.results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
