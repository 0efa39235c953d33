"""Token-in/token-out on two real model families (the bundled Qwen2.5 tokenizer and the converted
SmolLM2, a Llama with its own special-token ids and a template that adds a system prompt): the tokens
a trajectory trains on are exactly the tokens the engine generated (cut after the first stop tag) plus
the observation tokens, every turn's prompt is the previous prompt plus those tokens, and only
generated tokens carry the response and answer masks. Nothing is decoded and re-encoded on the way."""

import asyncio
from pathlib import Path

import pytest
from transformers import AutoTokenizer
from verl.workers.rollout.replica import TokenOutput

from train.search_r1 import prompts
from train.search_r1 import protocol as P
from train.search_r1.agent_loop import end_of_turn_ids, standalone_loop

QWEN = Path(__file__).resolve().parents[1] / "data" / "qwen2.5_tokenizer"
QUESTION = "Who illustrated American Splendor?"


@pytest.fixture(scope="module", params=["qwen2.5", "smollm2"])
def family(request):
    if request.param == "qwen2.5":
        return request.param, AutoTokenizer.from_pretrained(QWEN), str(QWEN)
    path = request.getfixturevalue("smollm2_dir")
    return request.param, AutoTokenizer.from_pretrained(path), str(path)


def odd_ids(tok, text: str) -> list[int]:
    """``text`` tokenized one character at a time: valid ids a model may sample, but not the tokenizer's
    own encoding of the text (a decode-and-re-encode anywhere would change them)."""
    return [i for ch in text for i in tok.encode(ch, add_special_tokens=False)]


class Recorder:
    """Returns prepared token ids, one list per call, and records each call's prompt and output."""

    def __init__(self, outputs):
        self.outputs, self.calls = list(outputs), []

    async def generate(self, request_id=None, *, prompt_ids, sampling_params, **kw):
        ids = self.outputs.pop(0)[: sampling_params["max_tokens"]]
        self.calls.append((list(prompt_ids), ids))
        return TokenOutput(token_ids=ids)


class FakeSearch:
    async def aretrieve(self, queries, topk=None, return_scores=True):
        return [[{"document": {"id": str(i), "contents": f'"T{i}"\\nPassage {i} on {q}: Gerry Shamray.'}, "score": 1.0}
                 for i in range(3)] for q in queries]


def run(tok, path, mgr):
    async def go():
        loop = standalone_loop(tok, mgr, search={"max_turns": 3}, search_client=FakeSearch(), model_path=path)
        return await loop.run({"temperature": 1.0}, raw_prompt=prompts.make_messages(QUESTION))

    return asyncio.run(go())


def test_trained_tokens_are_generated_plus_observation_tokens(family):
    name, tok, path = family
    eos = tok.eos_token_id
    search = odd_ids(tok, "<think>look it up</think><search> American Splendor </search>") + odd_ids(tok, " trailing")
    invalid = odd_ids(tok, "I am not sure.") + [eos]  # an invalid turn ending in EOS: the EOS is dropped
    answer = odd_ids(tok, "<think>found</think><answer> Gerry Shamray </answer>") + odd_ids(tok, " more")
    mgr = Recorder([search, invalid, answer])
    out = run(tok, path, mgr)

    # the prompt is the model's own chat template over the protocol's messages (SmolLM2's adds its system turn)
    expected_prompt = tok.apply_chat_template(prompts.make_messages(QUESTION), add_generation_prompt=True,
                                              tokenize=True)
    expected_prompt = expected_prompt["input_ids"] if hasattr(expected_prompt, "keys") else expected_prompt
    assert out.prompt_ids == list(expected_prompt)
    if name == "smollm2":
        assert "You are a helpful AI assistant named SmolLM" in tok.decode(out.prompt_ids)

    n_search = len(odd_ids(tok, "<think>look it up</think><search> American Splendor </search>"))
    n_answer = len(odd_ids(tok, "<think>found</think><answer> Gerry Shamray </answer>"))
    kept = [search[:n_search], invalid[:-1], answer[:n_answer]]
    obs = [tok.encode(P.format_observation([f'"T{i}"\\nPassage {i} on American Splendor: Gerry Shamray.'
                                            for i in range(3)]), add_special_tokens=False),
           tok.encode(P.INVALID_ACTION_MESSAGE, add_special_tokens=False)]
    expected = kept[0] + obs[0] + kept[1] + obs[1] + kept[2]
    assert out.response_ids == expected
    assert out.response_mask == [1] * len(kept[0]) + [0] * len(obs[0]) + [1] * len(kept[1]) + [0] * len(obs[1]) + \
        [1] * len(kept[2])
    # each turn's prompt is the first prompt plus exactly the tokens kept so far
    assert [p for p, _ in mgr.calls] == [out.prompt_ids, out.prompt_ids + kept[0] + obs[0],
                                         out.prompt_ids + kept[0] + obs[0] + kept[1] + obs[1]]
    am = out.extra_fields["answer_mask"]
    assert sum(am) and all(m == 0 or out.response_mask[i] for i, m in enumerate(am))
    assert tok.decode([t for t, m in zip(out.response_ids, am) if m]).strip() == "<answer> Gerry Shamray </answer>"
    assert out.extra_fields["stop_reason"] == "answer" and out.extra_fields["num_eos_dropped"] == 1
    assert eos in end_of_turn_ids(tok, path)
    if name == "smollm2":  # the converted tokenizer: <|im_end|> ends a turn, <|im_start|> does not
        assert end_of_turn_ids(tok, path) == {tok.convert_tokens_to_ids("<|im_end|>")}


def test_the_real_smollm2_through_the_hf_engine(smollm2_dir):
    """What the engine really sampled, turn by turn, is what the trajectory holds, plus the observations."""
    from train.inference.hf_engine import HFBatchedServerManager

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    engine = HFBatchedServerManager.from_pretrained(str(smollm2_dir), device="cpu", seed=3)

    class Recording:
        calls = []

        async def generate(self, request_id=None, *, prompt_ids, sampling_params, **kw):
            out = await engine.generate(request_id, prompt_ids=prompt_ids, sampling_params=sampling_params)
            self.calls.append((list(prompt_ids), list(out.token_ids)))
            return out

    async def go():
        rec = Recording()
        loop = standalone_loop(tok, rec, search={"max_turns": 2, "max_turn_tokens": 24}, search_client=FakeSearch(),
                               model_path=str(smollm2_dir))
        out = await loop.run({"temperature": 1.0}, raw_prompt=prompts.make_messages(QUESTION))
        return out, rec

    try:
        out, rec = asyncio.run(go())
    finally:
        engine.close()
    assert len(rec.calls) >= 2  # an invalid or search turn, then more
    prompt = out.prompt_ids
    for k, (p, generated) in enumerate(rec.calls):
        assert p[: len(prompt)] == prompt
        so_far = p[len(prompt):]
        assert out.response_ids[: len(so_far)] == so_far
        n = len(so_far)
        # the model tokens of this turn: a prefix of what the engine sampled (cut at a stop tag, an EOS dropped)
        run_len = next((i for i, m in enumerate(out.response_mask[n:]) if m == 0), len(out.response_mask) - n)
        assert out.response_ids[n:n + run_len] == generated[:run_len]
        assert run_len >= len(generated) - 1
