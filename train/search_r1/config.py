"""The ``search_r1:`` block of the trainer config (the Search-R1 task's settings), validated.

Also the defaults outside training: ``infer.py`` and the evaluator ask with ``val_max_turns``, ``topk``
and ``max_turn_tokens`` from here (one source for the turn, top-k and token defaults).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Any

from retrieval.client import MAX_QUERY_CHARS
from train.errors import ConfigError

#: in ``search_r1.retriever_url``: the address of the Ray node a rollout runs on (a retriever replica on every
#: node, ``ROLE=retriever bash scripts/multinode.sh``), e.g. ``http://{node_ip}:8000/retrieve``
NODE_IP = "{node_ip}"


def resolve_url(url: str) -> str:
    """``url`` with :data:`NODE_IP` replaced by the address of the Ray node this process runs on (Ray's own
    view, ``ray.util.get_node_ip_address()``; ``$NODE_IP`` outside Ray)."""
    if NODE_IP not in url:
        return url
    ip = None
    try:
        import ray

        if ray.is_initialized():
            ip = ray.util.get_node_ip_address()
    except ImportError:
        pass
    ip = ip or os.environ.get("NODE_IP")
    if not ip:
        raise ConfigError(f"search_r1.retriever_url={url!r} names {NODE_IP}, but this process runs on no Ray node and "
                          f"NODE_IP is not set: give the retriever's address")
    return url.replace(NODE_IP, ip)


def every_replica(url: str) -> list[str]:
    """The retriever URLs the rollouts of a run search: ``url`` itself, or with :data:`NODE_IP`, the replica
    of every alive Ray node (the driver waits for all of them after an outage, not only its own node's)."""
    if NODE_IP not in url:
        return [url]
    import ray

    if not ray.is_initialized():
        return [resolve_url(url)]
    ips = sorted({n["NodeManagerAddress"] for n in ray.nodes() if n.get("Alive")})
    return [url.replace(NODE_IP, ip) for ip in ips] or [resolve_url(url)]


@dataclass
class SearchConfig:
    # the retriever every rollout searches; {node_ip} (NODE_IP) = a replica on each node, reached on its own node
    retriever_url: str = "http://127.0.0.1:8000/retrieve"
    topk: int = 3
    max_turns: int = 3  # searches in training (then one last generation)
    val_max_turns: int = 4  # for rows whose extra_info.split is test/val/dev
    max_turn_tokens: int = 500  # new tokens per generation
    max_obs_tokens: int = 500  # tokens per observation (whole passages dropped to fit)
    timeout: float = 120.0  # per search, in total (all retries)
    retries: int = 5
    backoff: float = 0.5
    strict: bool = False  # raise when the retriever stays down, instead of a "search failed" observation
    # Abort the step when more than this fraction of its searches failed (retriever down or erroring):
    # otherwise the policy trains on "search failed" rollouts. 1.0 = never abort.
    max_failure_rate: float = 0.5
    # A rollout in which searches failed because the retriever was unreachable or kept answering 5xx
    # (an outage, not a bad query) is redone once the retriever answers /health again, waiting up to
    # outage_wait_s (a line every 30 s); at most outage_redos times per rollout, then the run stops.
    # outage_wait_s 0 = never wait: outage failures then only count toward max_failure_rate.
    outage_wait_s: float = 600.0
    outage_redos: int = 3
    max_query_chars: int = MAX_QUERY_CHARS  # longer queries are cut to this (the server's limit)
    # the corpus the retriever must serve, checked against its /health before Ray starts
    # (train/trainer/corpus_check.py): wiki18, sample, a passage count, an index_id, or any
    expect_corpus: Any = None

    def __post_init__(self) -> None:
        """Every value checked here, once: a SearchConfig that exists is valid, however it was built."""
        for name in ("topk", "max_turn_tokens", "max_obs_tokens", "max_query_chars"):
            if int(getattr(self, name)) < 1:
                raise ConfigError(f"search_r1.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("max_turns", "val_max_turns", "retries", "outage_redos"):
            if int(getattr(self, name)) < 0:
                raise ConfigError(f"search_r1.{name} must be >= 0, got {getattr(self, name)}")
        if not 0.0 <= float(self.max_failure_rate) <= 1.0:
            raise ConfigError(f"search_r1.max_failure_rate must be in [0, 1], got {self.max_failure_rate}")
        if float(self.outage_wait_s) < 0:
            raise ConfigError(f"search_r1.outage_wait_s must be >= 0 (0 = do not wait), got {self.outage_wait_s}")

    @classmethod
    def of(cls, trainer_config: Any) -> "SearchConfig":
        """The ``search_r1:`` block of a whole trainer config (OmegaConf or a plain dict), parsed: the one way
        the trainer, its config checks, the rollout manager, the agent loop and ``train.settings`` read it."""
        block = trainer_config.get("search_r1") if trainer_config is not None else None
        from omegaconf import OmegaConf

        if OmegaConf.is_config(block):
            block = OmegaConf.to_container(block, resolve=True)
        return cls.from_config(block)

    @classmethod
    def from_config(cls, cfg: Any) -> "SearchConfig":
        """The block itself (a mapping; ``retriever: {url, topk}`` is the older spelling of two keys)."""
        d = dict(cfg or {})
        retriever = d.pop("retriever", None) or {}
        d.setdefault("retriever_url", retriever.get("url", cls.retriever_url))
        if "topk" in retriever:
            d.setdefault("topk", retriever["topk"])
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ConfigError(f"unknown search_r1 config keys: {sorted(unknown)} (known: {sorted(known)})")
        return cls(**d)
