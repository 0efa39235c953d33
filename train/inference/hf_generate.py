"""A transformers-``generate`` stand-in for verl's LLM server manager (CPU or one GPU).

It implements the one method the agent loop calls, ``async generate(request_id, *, prompt_ids,
sampling_params, **kw) -> TokenOutput``, honouring ``max_tokens``, ``temperature`` (0 = greedy),
``top_p``, ``stop`` (checked on the decoded tail after every token, so decoding never runs past a
stop string) and ``logprobs``. Used by ``infer.py`` and the evaluator with ``--backend hf`` and by
the CPU tests; on GPUs training uses verl's vLLM/SGLang servers instead.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Optional

import torch


class _StopOnStrings:
    def __init__(self, tokenizer, stops, start: int):
        self.tokenizer, self.stops, self.start = tokenizer, list(stops), start

    def __call__(self, input_ids, scores, **kwargs) -> bool:
        tail = self.tokenizer.decode(input_ids[0, self.start:][-32:])
        return any(s in tail for s in self.stops)


class HFServerManager:
    def __init__(self, model, tokenizer, device: Optional[str] = None, seed: Optional[int] = None):
        self.model, self.tokenizer = model, tokenizer
        self.device = device or next(model.parameters()).device
        self._lock = threading.Lock()
        self._gen = torch.Generator(device="cpu")
        if seed is not None:
            self._gen.manual_seed(seed)
        self.calls = 0

    @classmethod
    def from_pretrained(cls, path: str, device: Optional[str] = None, dtype: Optional[str] = None, seed: int = 0):
        from train.inference.sampling import load_model

        model, tok, device = load_model(path, device, dtype)
        return cls(model, tok, device, seed)

    def _generate(self, prompt_ids: list[int], sp: dict[str, Any]):
        from transformers import StoppingCriteriaList
        from verl.workers.rollout.replica import TokenOutput

        from train.inference.sampling import Sampling

        s = Sampling.from_params(sp)
        max_tokens, temperature, top_p, stops = s.max_tokens, s.temperature, s.top_p, list(s.stops)
        ids = torch.tensor([prompt_ids], device=self.device)
        kwargs = dict(max_new_tokens=max_tokens, do_sample=temperature > 0, pad_token_id=self.tokenizer.pad_token_id,
                      eos_token_id=self.tokenizer.eos_token_id, output_scores=s.logprobs,
                      return_dict_in_generate=True, attention_mask=torch.ones_like(ids))
        if temperature > 0:
            kwargs.update(temperature=temperature, top_p=top_p, top_k=0)
        if stops:
            kwargs["stopping_criteria"] = StoppingCriteriaList([_StopOnStrings(self.tokenizer, stops, ids.shape[1])])
        with self._lock, torch.inference_mode():
            self.calls += 1
            torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=self._gen)))
            out = self.model.generate(ids, **kwargs)
        new = out.sequences[0, ids.shape[1]:].tolist()
        logprobs = None
        if s.logprobs and out.scores:
            logprobs = [float(torch.log_softmax(sc[0].float(), -1)[t]) for sc, t in zip(out.scores, new)]
        if (new and new[-1] == self.tokenizer.pad_token_id
                and self.tokenizer.pad_token_id != self.tokenizer.eos_token_id):
            while new and new[-1] == self.tokenizer.pad_token_id:
                new.pop()
        return TokenOutput(token_ids=new, log_probs=logprobs, stop_reason="completed")

    async def generate(self, request_id=None, *, prompt_ids, sampling_params, **kwargs):
        return await asyncio.to_thread(self._generate, list(prompt_ids), dict(sampling_params))
