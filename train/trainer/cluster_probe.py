"""Before a multi-node job: from every alive Ray node, the retriever's /health and the shared paths.

:func:`probe_nodes` runs one small Ray task pinned to each alive node (``NodeAffinitySchedulingStrategy``,
``soft=False``); :func:`problems` turns the reports into the reasons to refuse the job (pure). A
``{node_ip}`` in the URL is each node's own address: the node's own retriever replica.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class NodeReport:
    node: str                      # "host (the URL it asked)"
    status: object                 # the HTTP status of /health, or the error's repr
    missing: tuple[str, ...]       # shared paths this node cannot see
    index: Optional[tuple]         # (kind, passages, indexed, index_id) the replica serves


def health_url(retriever_url: str) -> str:
    return retriever_url.removesuffix("/retrieve") + "/health"


def probe_nodes(retriever_url: str, paths: list[str]) -> list[NodeReport]:
    """One report per alive node of the Ray cluster this process joins (``address="auto"``)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    ray.init(address="auto")

    # runs on each node; a closure returning plain values, so Ray ships it by value and a node needs no
    # import of this module
    def _probe(url: str, paths: list[str]) -> tuple:
        import os
        import socket

        import httpx

        missing = tuple(p for p in paths if not os.path.exists(p))
        url = url.replace("{node_ip}", ray.util.get_node_ip_address())
        index = None
        try:
            r = httpx.get(url, timeout=10)
            status = r.status_code
            h = r.json() if status == 200 else {}
            index = (h.get("kind"), h.get("passages"), h.get("indexed"), h.get("index_id"))
        except Exception as e:  # unreachable, refused, not JSON: reported, and the job is refused
            status = repr(e)
        return f"{socket.gethostname()} ({url})", status, missing, index

    probe = ray.remote(num_cpus=0)(_probe)
    nodes = [n for n in ray.nodes() if n["Alive"]]
    url = health_url(retriever_url)
    pinned = [probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
              for n in nodes]
    return [NodeReport(*r) for r in ray.get([p.remote(url, paths) for p in pinned])]


def problems(reports: list[NodeReport]) -> list[str]:
    """Why the job cannot run on these nodes (empty: it can)."""
    out = []
    bad = [r.node for r in reports if r.status != 200 or r.missing]
    if bad:
        out.append(f"retriever unreachable or shared paths missing on {bad}")
    if len({r.index for r in reports}) > 1:
        out.append("the retriever replicas serve different indexes (kind, passages, indexed, index_id; copy one "
                   "index folder to every node): " + "; ".join(f"{r.node}: {r.index}" for r in reports))
    return out
