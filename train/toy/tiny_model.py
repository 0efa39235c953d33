"""A tiny, real, offline policy: a 2-layer Qwen2 with a byte-level BPE trained on a corpus, and its
scripted Search-R1 trajectories for its warm start (:func:`train.sft.supervised.sft_protocol`). Used by the tests, the
benchmarks and the learnable task; what the command writes: :mod:`train.tiny`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable, Iterator

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def _corpus_texts(corpus: Path, limit: int) -> Iterator[str]:
    from train.search_r1 import prompts, protocol

    # The protocol text (prompt, tags, messages) so the tokenizer covers it well.
    yield prompts.PROMPT_TEMPLATE + protocol.INVALID_ACTION_MESSAGE
    yield "<think> </think> <search> </search> <information> </information> <answer> </answer>"
    with open(corpus, encoding="utf-8") as f:
        for i, line in enumerate(f):
            if i >= limit:
                break
            yield json.loads(line)["contents"]


def build_tokenizer(corpus: Path, vocab_size: int = 1024, limit: int = 2000, texts: Iterable[str] | None = None):
    """Byte-level BPE trained on the first ``limit`` passages of ``corpus`` (or on ``texts``)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts if texts is not None else _corpus_texts(corpus, limit), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_tiny_model(out_dir: str | os.PathLike, corpus: str | os.PathLike, *, seed: int = 0,
                     hidden_size: int = 64, layers: int = 2, heads: int = 2, vocab_size: int = 1024,
                     tokenizer_texts: Iterable[str] | None = None) -> Path:
    """Write a tiny random Qwen2ForCausalLM plus its tokenizer to ``out_dir`` and return it.
    The tokenizer is trained on ``corpus`` unless ``tokenizer_texts`` are given."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    out = Path(out_dir)
    if (out / "config.json").exists() and (out / "tokenizer.json").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(Path(corpus), vocab_size=vocab_size, texts=tokenizer_texts)
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.pad_token_id,
    )
    model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def protocol_trajectories(qa: Path, corpus: Path, limit: int = 400,
                          count_tokens=None, obs_tokens: int = 48) -> list[tuple[str, list[tuple[str, bool]]]]:
    """(question, [(text, trained?)...]) pairs: search with the question, read the gold passage,
    answer with the gold answer. Built from the bundled QA and corpus (gold_doc_ids)."""
    from train.search_r1 import protocol

    with open(corpus, encoding="utf-8") as f:
        contents = [json.loads(line)["contents"] for line in f]
    out = []
    with open(qa, encoding="utf-8") as f:
        for line in f:
            rec = json.loads(line)
            docs = [contents[int(i)] for i in rec.get("metadata", {}).get("gold_doc_ids", [])[:1]]
            if not docs:
                continue
            q = rec["question"].strip()
            out.append((q, [
                (f"<think> I need to search. </think><search> {q} </search>", True),
                (protocol.format_observation(docs, max_tokens=obs_tokens, count_tokens=count_tokens)
                 if count_tokens else protocol.format_observation(docs), False),
                (f"<think> I found it. </think><answer> {rec['golden_answers'][0]} </answer>", True),
            ]))
            if len(out) >= limit:
                break
    return out
