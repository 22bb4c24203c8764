"""Hybrid targets (Qwen3-Next: GatedDeltaNet linear attention beside full attention).

Their recurrent state cannot be cropped; `CausalLM` snapshots it before each forward and a
rollback restores a snapshot and replays the ids up to the new length. transformers' reference
gated-delta kernels compute in float32 whatever the model's dtype, so two fresh forwards that
split a sequence differently already disagree by ~1e-8; the exactness and parity tests swap in
a float64 kernel of the same recurrence (checked against the reference), and one test checks
the stock kernels bit for bit against a run that needed no rollback.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import transformers.models.qwen3_next.modeling_qwen3_next as qwen3_next
from transformers import PreTrainedModel, Qwen3NextConfig, Qwen3NextForCausalLM

import specdec
from specdec import Sampling
from specdec.drafters import DraftModelDrafter, NgramDrafter
from specdec.protocols import DraftContext
from specdec.runtime.cache import uncroppable_layers
from specdec.runtime.target import CausalLM
from specdec.types import Draft

from drafters_for_tests import GarbageDrafter
from test_lossless_statistical import ALPHA, PROMPT, VOCAB, chi_square_p_value, exact_distribution, sample_counts
from tiny import hf_greedy, tiny_model

REFERENCE_KERNELS = (qwen3_next.torch_chunk_gated_delta_rule, qwen3_next.torch_recurrent_gated_delta_rule)
LAYER_TYPES = ["linear_attention", "full_attention", "linear_attention"]


def gated_delta_float64(query, key, value, g, beta, initial_state=None, output_final_state=False,
                        use_qk_l2norm_in_kernel=False, **_):
    """The gated delta rule token by token in float64: q, k [B, T, Hk, Dk], v [B, T, Hv, Dv],
    g, beta [B, T, Hv] -> out [B, T, Hv, Dv] and the final state [B, Hv, Dk, Dv]."""
    dtype, heads = query.dtype, value.shape[2]
    query, key = (x.double().repeat_interleave(heads // x.shape[2], dim=2) for x in (query, key))
    if use_qk_l2norm_in_kernel:
        query, key = (F.normalize(x, dim=-1, eps=1e-6) for x in (query, key))
    query = query / query.shape[-1] ** 0.5
    value, g, beta = value.double(), g.double(), beta.double()
    batch, steps, _, dk = key.shape
    state = (torch.zeros(batch, heads, dk, value.shape[-1], dtype=torch.float64) if initial_state is None
             else initial_state.double())
    out = []
    for t in range(steps):
        state = state * g[:, t].exp()[..., None, None]
        delta = (value[:, t] - torch.einsum("bhkv,bhk->bhv", state, key[:, t])) * beta[:, t, :, None]  # (B, Hv, Dv)
        state = state + key[:, t, :, :, None] * delta[:, :, None, :]
        out.append(torch.einsum("bhkv,bhk->bhv", state, query[:, t]))
    return torch.stack(out, dim=1).to(dtype), (state if output_final_state else None)


@pytest.fixture(autouse=True)
def float64_kernels(monkeypatch):
    monkeypatch.setattr(qwen3_next, "torch_chunk_gated_delta_rule", gated_delta_float64)
    monkeypatch.setattr(qwen3_next, "torch_recurrent_gated_delta_rule", gated_delta_float64)


def tiny_hybrid(vocab_size: int = 64, hidden: int = 32, seed: int = 0, head_scale: float = 6.0) -> PreTrainedModel:
    """A random Qwen3-Next in float64: linear, full, linear attention; the middle layer's MLP
    is a mixture of experts, run eagerly (the grouped kernel has no float64)."""
    torch.manual_seed(seed)
    config = Qwen3NextConfig(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=3,
        layer_types=LAYER_TYPES, mlp_only_layers=[0, 2], num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=hidden, shared_expert_intermediate_size=hidden, num_attention_heads=4, num_key_value_heads=2,
        head_dim=hidden // 4, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
        linear_value_head_dim=8, linear_conv_kernel_dim=4, max_position_embeddings=256,
        bos_token_id=None, eos_token_id=None, pad_token_id=None, tie_word_embeddings=False,
    )
    model = Qwen3NextForCausalLM(config).to(torch.float64).eval()
    model.set_experts_implementation("eager")
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(head_scale)
    return model


@pytest.fixture(scope="module")
def hybrid() -> PreTrainedModel:
    return tiny_hybrid()


IDS = torch.randint(0, 64, (24,), generator=torch.Generator().manual_seed(7))


def test_float64_kernel_is_the_reference_recurrence():
    generator = torch.Generator().manual_seed(0)
    q, k = (torch.randn(1, 9, 2, 8, generator=generator) for _ in range(2))
    v = torch.randn(1, 9, 4, 8, generator=generator)
    g, beta = -torch.rand(1, 9, 4, generator=generator), torch.rand(1, 9, 4, generator=generator)
    start = torch.randn(1, 4, 8, 8, generator=generator)
    for reference in REFERENCE_KERNELS:
        out, state = reference(q, k, v, g, beta, initial_state=start, output_final_state=True,
                               use_qk_l2norm_in_kernel=True)
        mine, my_state = gated_delta_float64(q, k, v, g, beta, initial_state=start, output_final_state=True,
                                             use_qk_l2norm_in_kernel=True)
        torch.testing.assert_close(mine.float(), out, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(my_state.float(), state, rtol=1e-4, atol=1e-5)


def test_hybrid_layers_are_served(hybrid):
    assert uncroppable_layers(hybrid) == []
    lm = CausalLM(hybrid)
    lm.reset()
    assert [type(layer).__name__ for layer in lm.cache.layers] == [
        "LinearAttentionLayer", "DynamicLayer", "LinearAttentionLayer"]


# Chunks fed after reset, then the rollback length: within the last forward (replay), at its
# start (snapshot only), across several one-token forwards (a draft model), back to 0.
ROLLBACKS = [([9, 5], 11), ([9, 5], 9), ([9, 5], 14), ([9, 5], 13), ([9, 1, 1, 1, 1], 10), ([9, 1, 1, 1, 1], 12),
             ([9, 2, 3], 10), ([6], 0), ([6], 3), ([1, 4], 1), ([1, 4], 2)]


@pytest.mark.parametrize(("chunks", "length"), ROLLBACKS)
def test_rollback_then_forward_equals_a_fresh_forward(hybrid, chunks, length):
    lm = CausalLM(hybrid)
    with torch.inference_mode():
        lm.reset()
        start = 0
        for size in chunks:
            lm.forward(IDS[start : start + size], keep=1)
            start += size
        lm.rollback(length)
        assert lm.cache_length == length
        logits, hidden = lm.forward(IDS[length : length + 4], keep=4, hidden=(lm.num_layers,))
        fresh = hybrid(input_ids=IDS[None, : length + 4], output_hidden_states=True)
    torch.testing.assert_close(logits, fresh.logits[0, length:], rtol=0, atol=1e-10)
    torch.testing.assert_close(hidden, fresh.hidden_states[-1][0, length:], rtol=0, atol=1e-10)


def test_repeated_steps_stay_exact(hybrid):
    lm = CausalLM(hybrid)
    with torch.inference_mode():
        lm.reset()
        lm.forward(IDS[:5], keep=1)
        for length in (7, 8, 8, 11, 12, 14):  # forward 4 ids, keep up to `length`
            lm.forward(IDS[lm.cache_length : lm.cache_length + 4], keep=1)
            lm.rollback(length)
        logits, _ = lm.forward(IDS[14:18], keep=4)
        fresh = hybrid(input_ids=IDS[None, :18]).logits[0, 14:]
    torch.testing.assert_close(logits, fresh, rtol=0, atol=1e-10)


def test_rollback_with_the_stock_kernels_matches_a_run_without_rollback(hybrid, monkeypatch):
    monkeypatch.setattr(qwen3_next, "torch_chunk_gated_delta_rule", REFERENCE_KERNELS[0])
    monkeypatch.setattr(qwen3_next, "torch_recurrent_gated_delta_rule", REFERENCE_KERNELS[1])
    rolled, straight = CausalLM(hybrid), CausalLM(hybrid)
    with torch.inference_mode():
        rolled.reset()
        straight.reset()
        rolled.forward(IDS[:8], keep=1)
        rolled.forward(IDS[8:13], keep=5)
        rolled.rollback(10)  # restores the state at 8, replays IDS[8:10]
        straight.forward(IDS[:8], keep=1)
        straight.forward(IDS[8:10], keep=1)
        ours, _ = rolled.forward(IDS[10:14], keep=4)
        theirs, _ = straight.forward(IDS[10:14], keep=4)
    assert torch.equal(ours, theirs)


def test_rollback_before_the_last_snapshot_is_refused(hybrid):
    lm = CausalLM(hybrid)
    with torch.inference_mode():
        lm.reset()
        lm.forward(IDS[:8], keep=1)
        lm.rollback(8)
        lm.forward(IDS[8:12], keep=1)
        with pytest.raises(ValueError, match="roll back"):
            lm.rollback(5)


class CheckedDrafter:
    """Wraps a drafter (None: drafts nothing) and records whether the target cache held
    exactly the committed tokens but the last at every propose."""

    name = "checked"

    def __init__(self, inner: object | None) -> None:
        self.inner = inner
        self.lengths_ok: list[bool] = []

    def prefill(self, ctx: DraftContext) -> None:
        if hasattr(self.inner, "prefill"):
            self.inner.prefill(ctx)

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        self.lengths_ok.append(ctx.target.cache_length == ctx.tokens.shape[0] - 1)
        return self.inner.propose(ctx, k) if self.inner is not None else Draft(ctx.tokens[:0])

    def commit(self, ctx: DraftContext, num_accepted: int) -> None:
        if hasattr(self.inner, "commit"):
            self.inner.commit(ctx, num_accepted)


GREEDY_DRAFTERS = {
    "none": lambda target: None,
    "ngram": lambda target: NgramDrafter(max_ngram=3),
    "self-draft": lambda target: DraftModelDrafter(target),
    "llama-draft": lambda target: DraftModelDrafter(tiny_model("llama", vocab_size=64, seed=1)),
    "garbage": lambda target: GarbageDrafter(seed=3),
}


@pytest.mark.parametrize("key", list(GREEDY_DRAFTERS))
def test_greedy_matches_transformers(hybrid, key):
    prompt = [3, 17, 9, 3, 17, 9, 3, 17]
    expected = hf_greedy(hybrid, prompt, 20)
    drafter = CheckedDrafter(GREEDY_DRAFTERS[key](hybrid))
    result = specdec.generate(hybrid, prompt, drafter=drafter, num_draft_tokens=4, max_new_tokens=20)
    assert result.tokens == expected
    assert drafter.lengths_ok and all(drafter.lengths_ok), drafter.lengths_ok
    if key != "none":
        assert result.stats.drafted > 0


def test_sampling_with_rejections_is_lossless_on_a_hybrid_target():
    target = tiny_hybrid(vocab_size=VOCAB, hidden=16, head_scale=8.0)
    draft = tiny_model("llama", vocab_size=VOCAB, seed=1, layers=1, hidden=16, head_scale=8.0)
    sampling = Sampling(temperature=1.0)
    counts, drafted, accepted, deep = sample_counts(target, DraftModelDrafter(draft), sampling, runs=600)
    assert 0 < accepted < drafted and deep > 0, (drafted, accepted, deep)
    p_value = chi_square_p_value(counts, exact_distribution(target, PROMPT, sampling))
    assert p_value >= ALPHA, f"hybrid target with a draft model is not lossless: chi-square p = {p_value:.3g}"


def test_compile_keeps_a_hybrid_target_on_its_snapshot_and_replay_path_with_one_message(hybrid):
    """The hybrid target decodes eagerly on its dynamic cache; its llama draft model compiles."""
    prompt = [3, 17, 9, 3, 17, 9, 3, 17]
    draft = tiny_model("llama", vocab_size=64, seed=1, dtype=torch.float32).double()
    with pytest.warns(UserWarning, match="Qwen3NextForCausalLM decodes eagerly: its linear-attention layers") as caught:
        result = specdec.generate(hybrid, prompt, drafter=DraftModelDrafter(draft), max_new_tokens=20, compile=True)
    assert sum("decodes eagerly" in str(w.message) for w in caught) == 1
    assert result.tokens == hf_greedy(hybrid, prompt, 20)
    lm = CausalLM(hybrid)
    lm.reset(256, compile=True)
    assert not lm.static and not lm.compiled
