"""The learnable task: generate its corpus, questions and tokenizer, warm-start the tiny policy, and run
RL on it (:func:`build`, :func:`run_rl`). What the task is and why it is learnable: the docstring of
:mod:`train.learnable`, the command that builds it.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Callable, Optional, Sequence

from train import REPO_ROOT

#: The rollout's retrieval settings, which the warm start's observations copy (cpu_learn.yaml).
TOPK = 1
MAX_OBS_TOKENS = 64
SOURCE = "facts"
BUILD_FILE = "build.json"  # the settings a finished build used; a rerun with the same ones reuses it

_ONSETS = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "gr", "kr", "tr"]
_VOWELS = ["a", "e", "i", "o", "u"]
_CODAS = ["", "", "", "l", "n", "r", "s", "k", "m"]


def invented_names(count: int, seed: int) -> list[str]:
    """``count`` distinct pronounceable names (2-3 syllables), the same for the same seed."""
    rng = random.Random(seed)
    names: list[str] = []
    seen: set[str] = set()
    while len(names) < count:
        word = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(rng.choice((2, 3))))
        word = (word + rng.choice(_CODAS)).capitalize()
        if word not in seen:
            seen.add(word)
            names.append(word)
    return names


def make_facts(count: int = 300, seed: int = 0) -> list[dict]:
    """One fact per invented country: ``{"country", "capital", "city"}``, every name distinct."""
    if count < 2:
        raise ValueError(f"the task needs at least 2 facts, got {count}")
    names = invented_names(3 * count, seed)
    return [{"country": names[3 * i], "capital": names[3 * i + 1], "city": names[3 * i + 2]} for i in range(count)]


def passage(fact: dict) -> str:
    return (f'"{fact["country"]}"\nThe capital of {fact["country"]} is {fact["capital"]}. '
            f'The largest city of {fact["country"]} is {fact["city"]}.')


def question(fact: dict) -> str:
    return f"What is the capital of {fact['country']}?"


def write_task(out: Path, count: int = 300, seed: int = 0) -> tuple[Path, Path]:
    """``out/corpus.jsonl`` (wiki-18 format) and ``out/qa.jsonl`` (FlashRAG format, ``dataset: facts``,
    the largest city kept as ``metadata.distractor``)."""
    out.mkdir(parents=True, exist_ok=True)
    facts = make_facts(count, seed)
    corpus, qa = out / "corpus.jsonl", out / "qa.jsonl"
    with open(corpus, "w", encoding="utf-8") as f:
        for i, fact in enumerate(facts):
            f.write(json.dumps({"id": str(i), "contents": passage(fact)}) + "\n")
    with open(qa, "w", encoding="utf-8") as f:
        for i, fact in enumerate(facts):
            f.write(json.dumps({"id": f"facts-{i}", "question": question(fact), "golden_answers": [fact["capital"]],
                                "dataset": SOURCE, "metadata": {"gold_doc_ids": [str(i)],
                                                                "distractor": fact["city"]}}) + "\n")
    return corpus, qa


def _records(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def tokenizer_texts(corpus: Path, qa: Path):
    """What the tokenizer is trained on: the protocol text (repeated, so its pieces are merged
    first), every passage as an observation shows it, every question."""
    from train.search_r1 import prompts, protocol

    skeleton = (prompts.PROMPT_TEMPLATE + protocol.INVALID_ACTION_MESSAGE
                + "<think> I need to search. </think><search> </search> <information> </information> "
                  "<think> I found it. </think><answer> </answer> Doc 1(Title: ) Doc 2(Title: ) Doc 3(Title: )")
    for _ in range(50):
        yield skeleton
    for rec in _records(corpus):
        yield rec["contents"]
        yield protocol.format_passage(1, rec["contents"])
    for rec in _records(qa):
        yield prompts.make_prompt(rec["question"])


def scripted_trajectories(names: list[str], count: int, *, wrong_rate: float, seed: int,
                          count_tokens: Callable[[str], int]) -> list[tuple[str, list[tuple[str, bool]]]]:
    """The warm start's ``count`` trajectories, each over a *fresh random fact* (country, capital and
    city drawn from the task's names, so that no country keeps one capital and nothing can be
    memorised: the policy has to learn to copy). Search with the question; the observation as the
    rollout shows it (the fact's passage first, as BM25 ranks it, then random others, ``TOPK`` in
    all, cut to ``MAX_OBS_TOKENS`` by whole passages); then a thought that restates the asked fact
    and the answer copied from it: the capital, or with probability ``wrong_rate`` the largest city
    (same passage, wrong field)."""
    from train.search_r1 import prompts, protocol

    rng = random.Random(seed)
    out = []
    for _ in range(count):
        facts = [dict(zip(("country", "capital", "city"), rng.sample(names, 3))) for _ in range(TOPK)]
        fact = facts[0]
        q = prompts.normalize_question(question(fact))
        obs = protocol.format_observation([passage(f) for f in facts], max_tokens=MAX_OBS_TOKENS,
                                          count_tokens=count_tokens)
        if rng.random() < wrong_rate:
            thought, answer = f"The largest city of {fact['country']} is {fact['city']}.", fact["city"]
        else:
            thought, answer = f"The capital of {fact['country']} is {fact['capital']}.", fact["capital"]
        out.append((q, [(f"<think> I need to search. </think><search> {q} </search>", True), (obs, False),
                        (f"<think> {thought} </think><answer> {answer} </answer>", True)]))
    return out


def build(out: Path, *, facts: int = 300, holdout: int = 20, seed: int = 0, sft_steps: int = 1000,
          wrong_rate: float = 0.8, progress: bool = True) -> dict:
    """Write the task (``corpus.jsonl``, ``qa.jsonl``; ``data/train.parquet`` and ``data/test.parquet``,
    the last ``holdout`` facts being the test rows) and a warm-started policy (``model/``). The warm
    start is taught no fact of the task (its facts are random recombinations of the names), so
    what it gets right, on train or test questions alike, it got by searching and copying."""
    from train.search_r1 import dataset as data_prep
    from train.sft.supervised import sft_protocol
    from train.toy.tiny_model import build_tiny_model

    if not 0.0 <= wrong_rate <= 1.0:
        raise ValueError(f"--wrong-rate must lie in [0, 1], got {wrong_rate}")
    if sft_steps < 0:
        raise ValueError(f"--sft-steps must be >= 0, got {sft_steps}")
    if not 0 < holdout < facts:
        raise ValueError(f"--holdout must lie in (0, --facts), got {holdout} of {facts}")
    model = out / "model"
    settings = {"facts": facts, "holdout": holdout, "seed": seed, "sft_steps": sft_steps, "wrong_rate": wrong_rate}
    if (model / "config.json").exists():
        built = json.loads((out / BUILD_FILE).read_text()) if (out / BUILD_FILE).is_file() else None
        if built == settings and (out / "data" / "train.parquet").is_file():
            return {"reused": True, "model": str(model), **settings}
        raise FileExistsError(f"{model} exists already, built with other settings ({built} vs {settings} now); "
                              f"remove {out} to build a new warm start")
    corpus, qa = write_task(out, facts, seed)
    records = _records(qa)
    train, test = records[:-holdout], records[-holdout:]
    for split, recs in (("train", train), ("test", test)):
        rows, _ = data_prep.build({SOURCE: (split, recs)}, sample_n=None, seed=seed, uid_prefix=split)
        data_prep.write_parquet(rows, out / "data" / f"{split}.parquet")
    build_tiny_model(model, corpus, seed=seed, hidden_size=128, layers=2, heads=4, vocab_size=3072,
                     tokenizer_texts=tokenizer_texts(corpus, qa))

    names = invented_names(3 * facts, seed)

    def trajectories(count_tokens):  # one fresh fact per example seen
        return scripted_trajectories(names, sft_steps * 16, wrong_rate=wrong_rate, seed=seed,
                                     count_tokens=count_tokens)

    stats = sft_protocol(model, trajectories, steps=sft_steps, batch=16, lr=3e-3, seed=seed, progress=progress,
                         sampling="replacement")
    (out / BUILD_FILE).write_text(json.dumps(settings))  # last: a build cut short is not reused
    return {"corpus": str(corpus), "qa": str(qa), "model": str(model), "train": len(train), "test": len(test),
            **stats}


def run_rl(task: Path, run_dir: Path, retriever_url: str, *, steps: int, seed: int = 0,
           overrides: Sequence[str] = (), plugins: Optional[str] = None, timeout: float = 1800) -> dict:
    """One ``configs/cpu_learn.yaml`` run (verl's trainer on CPU, as ``make demo`` runs it) from the
    warm start in ``task``, seeds ``data.seed = rollout.seed = seed``; returns ``{step: metrics}``
    from its metrics file (``run_dir/metrics.jsonl``). The log is ``run_dir/train.log``."""
    import os
    import subprocess
    import sys

    from train import PLUGINS_ENV
    from train.trainer.metrics_file import read_metrics

    run_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "VERL_PLATFORM": "cpu", "VERL_FILE_LOGGER_PATH": str(run_dir / "metrics.jsonl"),
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "offline",
           "TOKENIZERS_PARALLELISM": "false"}
    if plugins:
        env[PLUGINS_ENV] = plugins
    args = [sys.executable, "-m", "train.main", "--config-name", "cpu_learn",
            f"actor_rollout_ref.model.path={task / 'model'}", f"data.train_files={task / 'data' / 'train.parquet'}",
            f"data.val_files={task / 'data' / 'test.parquet'}", f"trainer.default_local_dir={run_dir / 'checkpoints'}",
            f"search_r1.retriever_url={retriever_url.rstrip('/')}/retrieve", f"trainer.total_training_steps={steps}",
            f"data.seed={seed}", f"actor_rollout_ref.rollout.seed={seed}", *overrides]
    with open(run_dir / "train.log", "w") as log:
        proc = subprocess.run(args, cwd=REPO_ROOT, env=env, stdout=log,
                              stderr=subprocess.STDOUT, timeout=timeout)
    if proc.returncode != 0:
        tail = (run_dir / "train.log").read_text(errors="replace")[-4000:]
        raise RuntimeError(f"training failed (rc {proc.returncode}); log {run_dir / 'train.log'}:\n{tail}")
    return read_metrics(run_dir / "metrics.jsonl")


def reward_rise(steps: dict, window: int = 3, key: str = "critic/score/mean") -> tuple[float, float]:
    """(mean reward of the first ``window`` training steps, of the last ``window``)."""
    values = [steps[s][key] for s in sorted(steps) if key in steps[s]]
    if len(values) < 2 * window:
        raise ValueError(f"{len(values)} steps logged {key}; the rise needs at least {2 * window}")
    return sum(values[:window]) / window, sum(values[-window:]) / window
