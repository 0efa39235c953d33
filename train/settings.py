"""python -m train.settings: every training, rollout, retrieval and evaluation setting of the presets beside the
paper's value and the released code's, as one table
(docs/settings.md, "Settings: paper, released code, this project").

Each row names the config key it describes and the value each preset must have;
``tests/trainer/test_settings_on_cpu.py`` composes every preset and checks it against the table, and checks
that docs/settings.md holds the table as :func:`markdown` renders it. A change to a preset, or to a verl
default a preset inherits, cannot silently diverge from what the docs say.

    python -m train.settings          # print the markdown table
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

PRESETS = ["grpo", "grpo_llds", "grpo_llds_r", "grpo_llds_ma", "gspo_llds", "ppo"]
LLDS = ["grpo_llds", "grpo_llds_r", "grpo_llds_ma", "gspo_llds"]


@dataclass
class Row:
    area: str
    setting: str
    paper: str
    released: str
    # The config key (OmegaConf.select path), "updates" (optimizer updates per rollout batch), or None
    # for behaviour that is not a config value (then ``note`` says what this project does).
    key: Optional[str]
    # Expected value per preset; "*" for every preset not listed.
    ours: dict = field(default_factory=dict)
    note: str = ""

    def expected(self, preset: str) -> Any:
        return self.ours.get(preset, self.ours.get("*"))


def _llds(value, others=None) -> dict:
    return {**{p: value for p in LLDS}, "*": others}


ROWS: list[Row] = [
    # training
    Row("training", "advantage estimator", "GRPO (PPO rows: GAE)", "grpo", "algorithm.adv_estimator",
        {"*": "grpo", "ppo": "gae"}),
    Row("training", "policy loss", "PPO clip (GSPO row: GSPO)", "PPO clip; use_gspo=true for GSPO",
        "actor_rollout_ref.actor.policy_loss.loss_mode", {"*": "vanilla", "gspo_llds": "gspo"}),
    Row("training", "loss aggregation", "token mean", "token mean (GSPO's policy loss: seq-mean-token-mean)",
        "actor_rollout_ref.actor.loss_agg_mode", {"*": "token-mean", "gspo_llds": "seq-mean-token-mean"},
        "gspo_llds: verl applies it to entropy and KL too (released: token mean there)"),
    Row("training", "clip ratio", "0.2", "0.2", "actor_rollout_ref.actor.clip_ratio", {"*": 0.2}),
    Row("training", "dual-clip (clip_ratio_c)", "none", "none (verl 0.1 has no dual-clip)",
        "actor_rollout_ref.actor.clip_ratio_c", {"*": 1.0e9},
        "never binds: verl clamps log-ratios to +-20 (ratio <= 4.9e8); verl's default 3.0 would cut A<0 gradients"),
    Row("training", "learning rate", "1e-6", "1e-6", "actor_rollout_ref.actor.optim.lr", {"*": 1.0e-6}),
    Row("training", "warm-up ratio", "not stated", "0.285", "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio",
        {"*": 0.285}),
    Row("training", "training steps", "not stated", "1005", "trainer.total_training_steps", {"*": 1005}),
    Row("training", "prompts per rollout batch", "512", "512", "data.train_batch_size", {"*": 520, "ppo": 512},
        "launchers: 480 on 8 or 16 GPUs (train/geometry.py); verl needs equal mini-batches per rank"),
    Row("training", "samples per prompt", "5", "5 (n_agent)", "actor_rollout_ref.rollout.n", {"*": 5, "ppo": 1}),
    Row("training", "mini-batch", "not stated", "256 trajectories", "actor_rollout_ref.actor.ppo_mini_batch_size",
        {"*": 52, "ppo": 256}, "in prompts (x n trajectories): 260"),
    Row("training", "optimizer updates per rollout batch", "not stated (LLDS needs > 1)", "10 (Search-R1 PPO: 2)",
        "updates", {"*": 10, "ppo": 2}),
    Row("training", "PPO epochs", "1", "1", "actor_rollout_ref.actor.ppo_epochs", {"*": 1}),
    Row("training", "KL loss", "yes (GRPO)", "use_kl_loss=true", "actor_rollout_ref.actor.use_kl_loss",
        {"*": True, "ppo": False}),
    Row("training", "KL loss coefficient", "0.001", "0.001", "actor_rollout_ref.actor.kl_loss_coef", {"*": 0.001}),
    Row("training", "KL estimator", "not stated", "low_var_kl", "actor_rollout_ref.actor.kl_loss_type",
        {"*": "low_var_kl"}),
    Row("training", "KL in reward (PPO)", "PPO: 0.001", "Search-R1 PPO: fixed 0.001", "algorithm.use_kl_in_reward",
        {"*": False, "ppo": True}),
    Row("training", "entropy coefficient", "not stated", "0.001", "actor_rollout_ref.actor.entropy_coeff",
        {"*": 0.001}),
    Row("training", "gradient clip", "not stated", "1.0", "actor_rollout_ref.actor.optim.clip_grad", {"*": 1.0},
        "the key verl's FSDP engine reads (actor.grad_clip is read by nothing); ppo's critic the same"),
    Row("training", "critic lr / warm-up (PPO)", "n/a", "1e-5 / 0.015 (Search-R1 PPO)", "critic.optim.lr",
        {"*": 1.0e-5}, "critic used by ppo only; warm-up 0.015"),
    Row("training", "trainer attention", "n/a", "flash-attn 2 (verl 0.1 default)",
        "actor_rollout_ref.model.override_config.attn_implementation", {"*": "sdpa"},
        "no flash-attn wheel on PyPI; SDPA on packed batches, micro-batches <= 8,192 tokens "
        "(a dense mask costs the pack's square)"),
    Row("training", "FSDP strategy", "n/a", "FSDP1 (verl 0.1)", "actor_rollout_ref.actor.strategy", {"*": "fsdp2"},
        "actor, reference model and critic; the same on CPU and GPU"),
    Row("training", "compute precision", "not stated",
        "bf16 forward/backward, fp32 weights and reduction (verl 0.1 FSDP default)",
        "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype", {"*": "bf16"},
        "fp32 weights, reduction and buffers; ref the same; CPU configs: fp32 throughout (the hf rollout's precision)"),
    Row("training", "LLDS", "LLDS rows", "no_reduce_lambda > 0", "llds.enable", _llds(True, False)),
    Row("training", "LLDS lambda", "0.2 (Qwen2.5-7B-Instruct: 0.3)", "0.2 (7B-Ins run: 0.3)", "llds.lambda",
        _llds(0.2), "reproduce_paper.sh sets 0.3 for 7B-Instruct (train/paper_runs.py)"),
    Row("training", "LLDS gate", "action (A); response (R) ablation", "chunk_noreduce=true (A) / false (R)",
        "llds.gate", {**_llds("action"), "grpo_llds_r": "response"}),
    Row("training", "LLDS answer weight", "MA: beta = min(V/2, 1)", "MA: min(0.2 max(V-1, 0), lambda) / lambda",
        "llds.answer_weight", {**_llds(1.0), "grpo_llds_ma": "adaptive"}),
    Row("training", "LLDS-MA rule", "paper", "released", "llds.adaptive_rule", {**_llds("paper"),
                                                                           "grpo_llds_ma": "released"}),
    Row("training", "V (valid searches) counts", "valid searches", "parsed <search> actions, last turn included",
        "llds.valid_search_count", {"*": None, **{p: "parsed" for p in LLDS}}),
    Row("training", "LLDS normaliser", "preserved (A >= 0) tokens (Eq. 4)", "all loss tokens of the micro-batch",
        None, note="all loss tokens of the mini-batch (verl's global token count; split-invariant): "
                   "lambda acts as lambda x N_pre / N_all under Eq. 4"),
    # rollout
    Row("rollout", "temperature", "1.0", "1.0", "actor_rollout_ref.rollout.temperature", {"*": 1.0}),
    Row("rollout", "top_p", "1.0", "0.95 (yaml default; Search-R1 v0.2 PPO: 1.0)", "actor_rollout_ref.rollout.top_p",
        {"*": 0.95, "ppo": 1.0}, "what produced the table"),
    Row("rollout", "searches per trajectory (training)", "3 (Search-R1: 4)", "max_turns=3 (Search-R1 v0.2: 4)",
        "search_r1.max_turns", {"*": 3, "ppo": 4}, "+1 final generation"),
    Row("rollout", "tokens per generation", "500", "500", "search_r1.max_turn_tokens", {"*": 500}),
    Row("rollout", "observation tokens", "500", "500", "search_r1.max_obs_tokens", {"*": 500},
        "cut by whole passages"),
    Row("rollout", "prompt length", "2048", "max_start_length 2048", "data.max_prompt_length", {"*": 2048}),
    Row("rollout", "stop", "at </search> or </answer>", "none: decodes to EOS or 500 tokens, then cuts", None,
        note="stop strings in the engine; token ids kept as generated"),
    Row("rollout", "invalid turn ending in EOS", "not stated",
        "message appended, continues (EOS lost in re-tokenising)",
        None, note="message appended, continues; the EOS is dropped"),
    # retrieval
    Row("retrieval", "passages per search", "3", "3", "search_r1.topk", {"*": 3}),
    Row("retrieval", "retriever", "e5-base-v2, flat, wiki-18", "e5-base-v2 flat (faiss-gpu)", None,
        note="RETRIEVER=e5: the released e5_Flat.index, exact search in torch, fp16 shards over all GPUs"),
    # evaluation
    Row("evaluation", "searches per question", "4", "max_turns=4", "search_r1.val_max_turns", {"*": 4}),
    Row("evaluation", "decoding", "greedy", "greedy", "actor_rollout_ref.rollout.val_kwargs.do_sample",
        {"*": False}),
    Row("evaluation", "validate / save every", "50 steps", "50 / 50", "trainer.test_freq", {"*": 50},
        "save_freq 50; newest 3 kept + the evaluated step"),
    Row("evaluation", "validation set", "the 7 test sets", "test.parquet (51,713 rows)", "data.val_files",
        {"*": "data/processed/val_sample.parquet"}, "200 per source; the full table: scripts/evaluate.sh"),
    Row("evaluation", "evaluated checkpoint", "3B-Ins 650, 3B-Base 600, 7B-Base 450, 7B-Ins 650",
        "the same (hydra eval logs)", None, note="train/paper_runs.py, used by reproduce_paper.sh"),
]


def value(cfg, key: str) -> Any:
    from omegaconf import OmegaConf

    if key == "updates":
        actor = cfg.actor_rollout_ref.actor
        return cfg.data.train_batch_size // actor.ppo_mini_batch_size * actor.ppo_epochs
    block = key.split(".", 1)[0]
    if block in ("llds", "search_r1"):  # our blocks: the values the code uses, defaults included
        from train.llds.loss import LLDSConfig
        from train.search_r1.config import SearchConfig

        raw = OmegaConf.to_container(cfg.get(block) or {}, resolve=True)
        if block == "llds":
            parsed = LLDSConfig.from_dict(raw)
            if key != "llds.enable" and not parsed.enable:
                return None
            attr = {"lambda": "lam"}.get(key.split(".", 1)[1], key.split(".", 1)[1])
        else:
            parsed, attr = SearchConfig.of(cfg), key.split(".", 1)[1]
        return getattr(parsed, attr)
    v = OmegaConf.select(cfg, key, default=None)
    return OmegaConf.to_container(v, resolve=True) if OmegaConf.is_config(v) else v


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return ("%g" % v).replace("e-0", "e-").replace("e+0", "e").replace("e+", "e")
    return str(v)


def ours_cell(row: Row) -> str:
    if row.key is None:
        return row.note
    if row.ours.get("*", 0) is None:  # an LLDS setting: the LLDS presets' value, then their exceptions
        values = [row.ours[p] for p in LLDS]
        base = max(values, key=values.count)
        text = f"{_fmt(base)} (LLDS presets"
        text += "".join(f"; {p}: {_fmt(row.ours[p])}" for p in LLDS if row.ours[p] != base) + ")"
    else:
        default = row.ours.get("*")
        exceptions = [p for p in PRESETS if p in row.ours and row.ours[p] != default]
        if len(exceptions) > len(PRESETS) // 2:  # mostly exceptions: name the few with the default
            rest = [p for p in PRESETS if p not in exceptions]
            value = row.ours[exceptions[0]]
            text = f"{_fmt(value)} ({', '.join(rest)}: {_fmt(default)})"
        else:
            text = _fmt(default)
            if exceptions:
                text += " (" + "; ".join(f"{p}: {_fmt(row.ours[p])}" for p in exceptions) + ")"
    key = "" if row.key == "updates" else f" `{row.key.replace('actor_rollout_ref.', '')}`"
    note = f"; {row.note}" if row.note else ""
    return f"{text}{key}{note}"


def markdown() -> str:
    lines = ["| area | setting | paper | released code | this project |", "| --- | --- | --- | --- | --- |"]
    for r in ROWS:
        lines.append(f"| {r.area} | {r.setting} | {r.paper} | {r.released} | {ours_cell(r)} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown())
