"""The warm start's supervised steps on a GPU (skipped without one): they learn there, as on the CPU, and the
saved weights are fp32 (bf16 autocast changes how the steps compute, never what is stored)."""

import pytest
import torch

from train.search_r1 import protocol
from train.sft.supervised import sft_protocol


@pytest.mark.gpu
def test_supervised_steps_on_the_gpu_learn_and_save_fp32_weights(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    def trajectories(count_tokens):
        return [(f"question {i}?", [(protocol.search_turn(f"question {i}", "I search."), True),
                                    (protocol.format_observation([f"\"Doc {i}\"\nanswer {i}"]), False),
                                    (protocol.answer_turn(f"answer {i}", "Found."), True)]) for i in range(8)]

    stats = sft_protocol(tiny_model_dir, trajectories, steps=100, batch=4, lr=3e-3, out_dir=tmp_path / "sft",
                         device="cuda")
    assert stats["last_loss"] < 0.2 * stats["first_loss"], stats["losses"]
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "sft")
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert torch.cuda.max_memory_allocated() > 0  # the steps ran on the GPU
