"""The real SearchR1AgentLoop, driven by (a) a scripted server manager and (b) the tiny model
through transformers generate against a live retrieval server."""

import asyncio

import pytest
from verl.workers.rollout.replica import TokenOutput

from train.search_r1 import prompts
from train.search_r1 import protocol as P
from train.search_r1.agent_loop import cut_after_stop, segments, standalone_loop, stop_params
from train.search_r1.rollout_manager import add_search_tensors

QUESTION = [{"role": "user", "content": prompts.make_prompt("Who illustrated American Splendor")}]


class Scripted:
    """Returns fixed texts (tokenised), one per generate call, ignoring stop strings on purpose."""

    def __init__(self, tok, turns):
        self.tok, self.turns, self.calls = tok, list(turns), []

    async def generate(self, request_id=None, *, prompt_ids, sampling_params, **kw):
        self.calls.append((list(prompt_ids), dict(sampling_params)))
        text = self.turns.pop(0)
        ids = self.tok.encode(text, add_special_tokens=False)
        if text.endswith("<EOS>"):
            ids = self.tok.encode(text[:-5], add_special_tokens=False) + [self.tok.eos_token_id]
        return TokenOutput(token_ids=ids[: sampling_params["max_tokens"]])


class FakeSearch:
    def __init__(self, fail=False):
        self.queries, self.fail = [], fail

    async def aretrieve(self, queries, topk=None, return_scores=True):
        from retrieval.client import RetrieverUnavailable

        self.queries += list(queries)
        if self.fail:
            raise RetrieverUnavailable("down")
        return [[{"document": {"id": str(i), "contents": f'"T{i}"\npassage {i} about {q}'}, "score": 1.0}
                 for i in range(3)] for q in queries]


def run(tok, turns, search=None, sample_kwargs=None, **cfg):
    async def go():
        mgr = Scripted(tok, turns)
        loop = standalone_loop(tok, mgr, search=cfg.pop("search_cfg", {}), search_client=search or FakeSearch(), **cfg)
        out = await loop.run({"temperature": 1.0}, raw_prompt=QUESTION, **(sample_kwargs or {}))
        return out, mgr

    return asyncio.run(go())


def test_answer_on_first_turn(tiny_tokenizer):
    out, mgr = run(tiny_tokenizer, ["<think>easy</think><answer> Gerry Shamray </answer> trailing junk"])
    text = tiny_tokenizer.decode(out.response_ids)
    assert text == "<think>easy</think><answer> Gerry Shamray </answer>"
    assert out.response_mask == [1] * len(out.response_ids)
    span = [i for i, m in enumerate(out.extra_fields["answer_mask"]) if m]
    assert tiny_tokenizer.decode([out.response_ids[i] for i in span]).strip().startswith("<answer>")
    assert "think" not in tiny_tokenizer.decode([out.response_ids[i] for i in span])
    assert out.extra_fields["stop_reason"] == "answer" and out.extra_fields["num_searches"] == 0
    sp = mgr.calls[0][1]
    assert sp["stop"] == ["</search>", "</answer>"] and sp["include_stop_str_in_output"] is True


def test_k_searches_then_answer_exact_text_and_masks(tiny_tokenizer):
    search = FakeSearch()
    turns = ["<think>a</think><search> first q </search> NEVER SEEN <answer>x</answer>",
             "<think>b</think><search>second q</search>",
             "<think>c</think><answer>final</answer>"]
    out, mgr = run(tiny_tokenizer, turns, search)
    segs = segments(tiny_tokenizer, out)
    obs = lambda q: P.format_observation([f'"T{i}"\npassage {i} about {q}' for i in range(3)])
    assert segs == [("model", "<think>a</think><search> first q </search>"), ("observation", obs("first q")),
                    ("model", "<think>b</think><search>second q</search>"), ("observation", obs("second q")),
                    ("model", "<think>c</think><answer>final</answer>")]
    assert "NEVER SEEN" not in tiny_tokenizer.decode(out.response_ids)
    assert search.queries == ["first q", "second q"]
    # token-in/token-out: each call's prompt is the previous prompt + exactly the kept tokens
    assert mgr.calls[1][0] == mgr.calls[0][0] + out.response_ids[: len(mgr.calls[1][0]) - len(mgr.calls[0][0])]
    am = out.extra_fields["answer_mask"]
    assert len(am) == len(out.response_ids) and all(out.response_mask[i] for i, m in enumerate(am) if m)
    assert tiny_tokenizer.decode([t for t, m in zip(out.response_ids, am) if m]).endswith("<answer>final</answer>")
    e = out.extra_fields
    assert (e["num_searches"], e["num_valid_searches"], e["num_valid_actions"], e["num_invalid_actions"],
            e["num_gen_turns"], e["stop_reason"], e["search_failed"]) == (2, 2, 3, 0, 3, "answer", False)
    assert e["search_queries"] == ["first q", "second q"]  # as sent (the protocol strips the tags' spaces)


def test_repeated_query_shares_overall_and_within_a_question():
    from train.search_r1.metrics import repeated_query_shares

    # question a: 2 samples, 4 searches, one repeat; question b: "x" again (a repeat across questions) and "y"
    shares = repeated_query_shares([["x", "z"], ["x", "w"], ["x", "y"], None], ["a", "a", "b", "b"])
    assert shares["search_r1/repeated_query_share"] == [pytest.approx(2 / 6)]
    assert shares["search_r1/repeated_query_share_in_question"] == [pytest.approx(1 / 6)]
    assert repeated_query_shares([[], None], ["a", "b"])["search_r1/repeated_query_share"] == [0.0]


def test_invalid_action_then_max_turns(tiny_tokenizer):
    turns = ["I am rambling", "<search>q1</search>", "<search>q2</search>", "<search>q3</search>"]
    out, _ = run(tiny_tokenizer, turns, search_cfg={"max_turns": 3})
    segs = segments(tiny_tokenizer, out)
    assert segs[1] == ("observation", P.INVALID_ACTION_MESSAGE)
    assert segs[-1] == ("model", "<search>q3</search>")  # last generation: counted, not run
    e = out.extra_fields
    assert e["stop_reason"] == "max_turns" and e["num_invalid_actions"] == 1 and e["num_searches"] == 3
    assert e["num_valid_searches"] == 2 and e["num_gen_turns"] == 4 and sum(e["answer_mask"]) == 0
    assert e["search_queries"] == ["q1", "q2"]  # the last generation's search is not sent


def test_eval_rows_get_val_max_turns(tiny_tokenizer):
    turns = ["<search>q</search>"] * 5
    out, mgr = run(tiny_tokenizer, list(turns), sample_kwargs={"extra_info": {"split": "test"}},
                   search_cfg={"max_turns": 1, "val_max_turns": 4})
    assert len(mgr.calls) == 5 and out.extra_fields["num_gen_turns"] == 5


def test_length_budget_mid_observation(tiny_tokenizer):
    first = "<search>long q</search>"
    n_first = len(tiny_tokenizer.encode(first, add_special_tokens=False))
    out, _ = run(tiny_tokenizer, [first, "<answer>never</answer>"], response_length=n_first + 7)
    assert len(out.response_ids) == n_first + 7 == len(out.response_mask)
    assert out.response_mask == [1] * n_first + [0] * 7
    assert out.extra_fields["stop_reason"] == "length"


def test_invalid_turn_ending_in_eos_goes_on_without_the_eos(tiny_tokenizer):
    """The released loop: the invalid-action message is appended and generation continues up to
    max_turns; the EOS of the invalid turn is not kept in the trajectory."""
    eos = tiny_tokenizer.eos_token_id
    out, mgr = run(tiny_tokenizer, ["no tags<EOS>", "<search> q </search>", "still none<EOS>",
                                    "<answer> a </answer>"], search_cfg={"max_turns": 3})
    e = out.extra_fields
    assert e["stop_reason"] == "answer" and e["num_gen_turns"] == 4 and e["num_invalid_actions"] == 2
    assert e["num_eos_dropped"] == 2 and eos not in out.response_ids
    segs = segments(tiny_tokenizer, out)
    assert segs[0] == ("model", "no tags") and segs[1] == ("observation", P.INVALID_ACTION_MESSAGE)
    assert segs[4] == ("model", "still none")
    # token-in/token-out: the next prompt holds exactly the kept tokens (no EOS) + the message
    kept = tiny_tokenizer.encode("no tags", add_special_tokens=False)
    assert mgr.calls[1][0][len(mgr.calls[0][0]):] == kept + tiny_tokenizer.encode(P.INVALID_ACTION_MESSAGE,
                                                                                    add_special_tokens=False)
    # the last generation ends the trajectory whatever it is; there the EOS is kept
    out, _ = run(tiny_tokenizer, ["none<EOS>", "none again<EOS>"], search_cfg={"max_turns": 1})
    assert out.extra_fields["stop_reason"] == "eos" and out.response_ids[-1] == eos
    assert out.extra_fields["num_gen_turns"] == 2


def test_valid_search_count_for_llds_ma(tiny_tokenizer):
    """V counts parsed <search> actions by default (the released code), the unexecuted one in the
    last generation included; "executed" counts searches that ran."""
    import numpy as np
    import torch
    from verl import DataProto

    out, _ = run(tiny_tokenizer, ["<search>a</search>", "<search>b</search>"], search_cfg={"max_turns": 1})
    e = out.extra_fields
    assert e["num_searches"] == 2 and e["num_valid_searches"] == 1
    dp = lambda: DataProto.from_dict(
        tensors={"responses": torch.zeros(2, 3, dtype=torch.long), "response_mask": torch.ones(2, 3)},
        non_tensors={"answer_mask": np.array([[0], [0]], dtype=object),
                     "num_searches": np.array([2, 3], dtype=object),
                     "num_valid_searches": np.array([1, 2], dtype=object)})
    assert add_search_tensors(dp()).batch["batch_valid_searches"].tolist() == [2.5, 2.5]
    assert add_search_tensors(dp(), "executed").batch["batch_valid_searches"].tolist() == [1.5, 1.5]


def test_retriever_down(tiny_tokenizer):
    out, _ = run(tiny_tokenizer, ["<search>q</search>", "<answer>a</answer>"], FakeSearch(fail=True))
    assert P.SEARCH_FAILED_TEXT in tiny_tokenizer.decode(out.response_ids)
    assert out.extra_fields["search_failed"] is True and out.extra_fields["num_valid_searches"] == 0
    from retrieval.client import RetrieverUnavailable

    with pytest.raises(RetrieverUnavailable):
        run(tiny_tokenizer, ["<search>q</search>"], FakeSearch(fail=True), search_cfg={"strict": True})


def test_bad_config_is_named(tiny_tokenizer):
    with pytest.raises(ValueError, match="unknown search_r1 config keys"):
        run(tiny_tokenizer, ["x"], search_cfg={"topK": 3})
    with pytest.raises(ValueError, match="topk must be >= 1"):
        run(tiny_tokenizer, ["x"], search_cfg={"topk": 0})


def test_a_long_query_is_cut_once_and_sent_as_counted(tiny_tokenizer):
    search = FakeSearch()
    out, _ = run(tiny_tokenizer, ["<search> " + "abc " * 20 + "</search>", "<answer> x </answer>"], search,
                 search_cfg={"max_query_chars": 10})
    assert search.queries == ["abc abc ab"] == out.extra_fields["search_queries"]  # what the server got is counted


def test_search_config_is_checked_however_it_is_built_and_parsed_one_way():
    from omegaconf import OmegaConf

    from train.errors import ConfigError
    from train.search_r1.config import SearchConfig

    with pytest.raises(ConfigError, match="search_r1.topk must be >= 1"):
        SearchConfig(topk=0)  # built directly (the asker does): checked all the same
    assert SearchConfig.of(OmegaConf.create({"search_r1": {"topk": 5, "max_turns": "${search_r1.topk}"}})) == \
        SearchConfig(topk=5, max_turns=5)  # a whole trainer config, interpolations resolved
    assert SearchConfig.of({}) == SearchConfig.of(OmegaConf.create({})) == SearchConfig()


def test_every_way_a_training_trajectory_ends_has_its_share_in_the_metrics():
    from train.search_r1.metrics import STOP_SHARES

    # search_failed: only a baseline's one retrieval (the asker), never an agent-loop trajectory
    assert {reason for reason, _ in STOP_SHARES} == set(P.StopReason) - {P.StopReason.SEARCH_FAILED}


def test_stop_params_per_engine():
    assert stop_params("vllm") == {"stop": ["</search>", "</answer>"], "include_stop_str_in_output": True}
    assert stop_params("hf") == stop_params("vllm")
    assert stop_params("sglang") == {"stop": ["</search>", "</answer>"], "no_stop_trim": True}


def test_cut_after_stop_tokens(tiny_tokenizer):
    ids = tiny_tokenizer.encode("<search> q </search>tail tokens", add_special_tokens=False)
    cut = cut_after_stop(tiny_tokenizer, ids)
    assert tiny_tokenizer.decode(cut).startswith("<search> q </search>")
    assert P.find_stop(tiny_tokenizer.decode(cut[:-1])) is None


def test_add_search_tensors_pads_into_batch():
    import numpy as np
    import torch
    from verl import DataProto

    dp = DataProto.from_dict(tensors={"responses": torch.zeros(2, 5, dtype=torch.long),
                                      "response_mask": torch.tensor([[1, 1, 1, 1, 0], [1, 1, 0, 0, 0]])},
                             non_tensors={"answer_mask": np.array([[0, 0, 1, 1], [1, 1]], dtype=object),
                                          "num_valid_searches": np.array([1, 2], dtype=object)})
    out = add_search_tensors(dp, "executed")
    assert out.batch["answer_mask"].tolist() == [[0, 0, 1, 1, 0], [1, 1, 0, 0, 0]]
    assert out.batch["batch_valid_searches"].tolist() == [1.5, 1.5]


def test_tiny_model_against_live_server(tiny_model_dir, bm25_server):
    """transformers generate behind the server-manager interface, real HTTP retrieval."""
    from retrieval.client import RetrievalClient
    from train.inference.hf_generate import HFServerManager

    mgr = HFServerManager.from_pretrained(str(tiny_model_dir), device="cpu", seed=0)
    tok = mgr.tokenizer

    class ForcedSearch:
        """The random model rarely writes tags, so its first turn is forced to search."""

        def __init__(self):
            self.first = True

        async def generate(self, request_id=None, *, prompt_ids, sampling_params, **kw):
            if self.first:
                self.first = False
                return TokenOutput(token_ids=tok.encode("<search> Harvey Pekar </search>", add_special_tokens=False))
            return await mgr.generate(request_id, prompt_ids=prompt_ids, sampling_params=sampling_params)

    async def go():
        client = RetrievalClient(bm25_server.url, topk=3)
        loop = standalone_loop(tok, ForcedSearch(),
                               search={"max_turns": 1, "max_turn_tokens": 16, "max_obs_tokens": 300},
                               search_client=client, response_length=2000)
        out = await loop.run({"temperature": 1.0, "logprobs": True}, raw_prompt=QUESTION)
        await client.aclose()
        return out

    out = asyncio.run(go())
    segs = segments(tok, out)
    assert segs[0] == ("model", "<search> Harvey Pekar </search>")
    assert segs[1][0] == "observation" and segs[1][1].startswith("\n\n<information>Doc 1(Title: ")
    assert "Pekar" in segs[1][1] and segs[1][1].endswith("</information>\n\n")
    assert len(tok.encode(segs[1][1], add_special_tokens=False)) <= 300  # whole passages dropped to fit
    n_first = len(tok.encode(segs[0][1], add_special_tokens=False))
    assert segs[2][0] == "model" and 0 < sum(out.response_mask) - n_first <= 16
    assert len(out.response_logprobs) == len(out.response_ids)


def test_a_retriever_url_with_node_ip_names_the_node_the_rollout_runs_on(monkeypatch):
    from train.errors import ConfigError
    from train.search_r1.config import resolve_url

    assert resolve_url("http://10.0.0.1:8000/retrieve") == "http://10.0.0.1:8000/retrieve"
    monkeypatch.delenv("NODE_IP", raising=False)
    with pytest.raises(ConfigError, match=r"names \{node_ip\}, but this process runs on no Ray node"):
        resolve_url("http://{node_ip}:8000/retrieve")
    monkeypatch.setenv("NODE_IP", "10.0.0.7")
    assert resolve_url("http://{node_ip}:8000/retrieve") == "http://10.0.0.7:8000/retrieve"
    import ray  # inside Ray (an agent-loop worker): Ray's own address of this node wins

    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray.util, "get_node_ip_address", lambda: "10.0.0.9")
    assert resolve_url("http://{node_ip}:8000/retrieve") == "http://10.0.0.9:8000/retrieve"
