"""Mixture-of-experts targets under the compiled engine: experts that run transformers' eager
implementation (a loop over the routed experts, which dynamo cannot trace whole) are moved to one
that compiles (`specdec.runtime.forward.compilable_experts`), so the step compiles instead of
falling back, and decodes the tokens the eager engine decodes."""

from __future__ import annotations

import warnings

import pytest
import torch
from transformers import PreTrainedModel, Qwen3MoeConfig, Qwen3MoeForCausalLM

import specdec
from specdec.runtime.engine import compile_failures
from specdec.runtime.forward import compilable_experts
from specdec.runtime.target import CausalLM
from tiny import tiny_model

PROMPT = [3, 17, 9, 3, 17, 9, 3, 17]


def tiny_moe(dtype: torch.dtype = torch.float64, experts: str = "eager") -> PreTrainedModel:
    """A random two-layer Qwen3-MoE (4 experts, 2 per token) whose experts run `experts`."""
    torch.manual_seed(0)
    config = Qwen3MoeConfig(vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=32,
                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                            num_experts=4, num_experts_per_tok=2, max_position_embeddings=256, bos_token_id=None,
                            eos_token_id=None, pad_token_id=None, tie_word_embeddings=False,
                            experts_implementation=experts)
    model = Qwen3MoeForCausalLM(config).to(dtype).eval()
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(6.0)  # peaked, varied next-token distributions
    return model


@pytest.mark.parametrize("dtype, chosen", [(torch.float64, "batched_mm"), (torch.float32, "batched_mm"),
                                           (torch.bfloat16, "grouped_mm")])
def test_eager_experts_are_moved_to_a_compilable_implementation_for_their_dtype(dtype: torch.dtype, chosen: str):
    model = tiny_moe(dtype)
    assert compilable_experts(model) == chosen
    assert model.get_experts_implementation()[""] == chosen
    assert all(m.config._experts_implementation == chosen for m in model.modules() if hasattr(m, "gate_up_proj"))
    assert compilable_experts(model) is None  # nothing runs eagerly any more


def test_experts_chosen_by_the_user_and_dense_models_are_left_as_they_are():
    model = tiny_moe(torch.float32, experts="grouped_mm")
    assert compilable_experts(model) is None and model.get_experts_implementation()[""] == "grouped_mm"
    dense = tiny_model("llama")
    assert dense.get_experts_implementation()[""] == "eager"  # what a dense model reports: nothing to move
    assert compilable_experts(dense) is None


def test_a_moe_target_with_eager_experts_compiles_and_decodes_the_eager_tokens():
    """In float64, where the grouped kernel has none; plain decoding, so one graph compiles (the
    one-row step: the verify of k + 1 rows runs the same layers)."""
    model = tiny_moe(torch.float64)
    eager = specdec.generate(model, PROMPT, max_new_tokens=16)
    assert model.get_experts_implementation()[""] == "eager"  # the reference ran the eager experts
    failed = compile_failures()  # those of earlier tests in this process
    lm = CausalLM(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # a fallback to eager decoding warns: fail on it
        compiled = specdec.generate(lm, PROMPT, max_new_tokens=16, compile=True)
    assert compiled.tokens == eager.tokens
    assert lm.compiled and compile_failures() == failed, compile_failures()
    assert model.get_experts_implementation()[""] == "batched_mm"  # the switch stays, as documented
