"""verl's agent-loop manager for Search-R1: a rollout that hit a retriever outage is redone, never
trained on; too many failed searches stop the step; the LLDS tensors (``answer_mask``,
``batch_valid_searches``) are added to the batch.

Selected in the presets with ``actor_rollout_ref.rollout.agent.agent_loop_manager_class=
train.search_r1.rollout_manager.SearchR1AgentLoopManager``.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

import numpy as np
import torch
from verl.experimental.agent_loop.agent_loop import AgentLoopManager
from verl.utils.ray_utils import auto_await

from retrieval.client import wait_healthy_async
from train.search_r1.config import SearchConfig, every_replica


def check_failure_rate(searches: int, failed: int, max_rate: float, url: str) -> None:
    """Abort (RuntimeError) when a step's share of failed searches passes ``max_rate``."""
    if searches and failed / searches > max_rate:
        raise RuntimeError(
            f"search_r1: {failed} of {searches} searches in this step failed ({failed / searches:.0%}, more than "
            f"search_r1.max_failure_rate={max_rate:g}); training on 'search failed' observations would teach the "
            f"policy not to search. Is the retriever at {url} up and healthy (python -m retrieval.client "
            f"{url.removesuffix('/retrieve')})? Raise search_r1.max_failure_rate (1.0 = never abort) to go on anyway.")


#: What V (the adaptive LLDS-MA weight's "valid searches") counts per trajectory: ``parsed`` = every
#: ``<search>`` action, an unexecuted one in the last generation included (the released code);
#: ``executed`` = searches that ran and the retriever answered.
VALID_SEARCH_FIELDS = {"parsed": "num_searches", "executed": "num_valid_searches"}


def add_search_tensors(output, valid_search_count: str = "parsed") -> Any:
    """Pad the per-trajectory ``answer_mask`` lists into an ``[B, R]`` tensor (like ``responses``)
    and add ``batch_valid_searches`` ``[B]`` (the batch mean V, for the adaptive LLDS-MA weight)."""
    nt = output.non_tensor_batch
    if "answer_mask" not in nt:
        return output
    B, R = output.batch["responses"].shape
    mask = torch.zeros(B, R, dtype=torch.int64)
    for i, m in enumerate(nt.pop("answer_mask")):
        m = list(m or [])[:R]
        mask[i, : len(m)] = torch.tensor(m, dtype=torch.int64)
    output.batch["answer_mask"] = mask * output.batch["response_mask"].to(torch.int64)
    field = VALID_SEARCH_FIELDS[valid_search_count]
    valid = np.asarray([float(v or 0) for v in nt.get(field, [0] * B)], dtype=np.float32)
    output.batch["batch_valid_searches"] = torch.full((B,), float(valid.mean()) if B else 0.0)
    return output


def _total(output, *keys: str) -> int:
    """The sum of per-trajectory counts (extra fields) over a rollout batch."""
    nt = output.non_tensor_batch
    return sum(int(v or 0) for key in keys for v in nt.get(key, []))


class SearchR1AgentLoopManager(AgentLoopManager):
    """verl's manager plus the outage rule and :func:`add_search_tensors`. Select it with
    ``actor_rollout_ref.rollout.agent.agent_loop_manager_class=train.search_r1.rollout_manager.SearchR1AgentLoopManager``.

    A rollout whose searches hit a retriever outage (unreachable, timed out, 5xx) is never trained
    on: the manager waits for ``/health`` (``search_r1.outage_wait_s``) and redoes the whole rollout
    (every group resampled; at most ``search_r1.outage_redos`` times), and stops the run when the
    retriever does not come back. Other failures (a rejected query) go to ``max_failure_rate``."""

    @functools.cached_property
    def search(self) -> SearchConfig:
        """The ``search_r1:`` block, read once for the run (the config does not change between steps)."""
        return SearchConfig.of(self.config)

    @auto_await
    async def generate_sequences(self, prompts):
        search = self.search
        for attempt in range(int(search.outage_redos) + 1):
            out = super().generate_sequences(prompts)
            if asyncio.iscoroutine(out) or isinstance(out, asyncio.Future):
                out = await out
            outage = _total(out, "num_outage_searches")
            if not outage or search.outage_wait_s <= 0:
                break
            sent = _total(out, "num_failed_searches", "num_valid_searches")
            if attempt == int(search.outage_redos):
                raise RuntimeError(
                    f"search_r1: the retriever at {search.retriever_url} failed {outage} of {sent} searches again, in "
                    f"{attempt + 1} rollouts of this step (search_r1.outage_redos={search.outage_redos}); stopping "
                    f"rather than training on 'search failed' observations. Check its log, then resume")
            print(f"search_r1: {outage} of {sent} searches in this rollout failed with the retriever at "
                  f"{search.retriever_url} unreachable or erroring; waiting for it (search_r1.outage_wait_s="
                  f"{search.outage_wait_s:g}), then redoing the rollout ({attempt + 1} of search_r1.outage_redos="
                  f"{search.outage_redos})", flush=True)
            down = await wait_every_replica(every_replica(search.retriever_url), search.outage_wait_s)
            if down:
                raise RuntimeError(
                    f"search_r1: the retriever at {down} did not answer /health within "
                    f"search_r1.outage_wait_s={search.outage_wait_s:g} s; stopping rather than training on "
                    f"'search failed' observations. Restart it and resume (trainer.resume_mode=auto) from the "
                    f"last checkpoint; raise search_r1.outage_wait_s to wait longer")
            print("search_r1: the retriever answers again; redoing the rollout", flush=True)
        failed = _total(out, "num_failed_searches")
        check_failure_rate(failed + _total(out, "num_valid_searches"), failed, search.max_failure_rate,
                           search.retriever_url)
        llds = self.config.get("llds") or {}
        return add_search_tensors(out, llds.get("valid_search_count", "parsed"))


async def wait_every_replica(urls: list[str], wait_s: float) -> str | None:
    """Wait until every retriever in ``urls`` answers /health, all within ``wait_s`` seconds in total;
    the first that did not, or None."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    for url in urls:
        if not await wait_healthy_async(url, max(0.0, deadline - loop.time()), report_every=30.0,
                                        log=lambda m: print(f"search_r1: {m}", flush=True)):
            return url
    return None
