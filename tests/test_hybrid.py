"""Hybrid targets (Qwen3-Next: GatedDeltaNet linear attention beside full attention).

Their recurrent state cannot be cropped. On the static cache (what decoding uses) each verify
keeps the state after every row and the commit takes the accepted one (`specdec.runtime.linear`);
on a dynamic cache `CausalLM` snapshots it before each forward and a rollback restores a snapshot
and replays the ids up to the new length (as it does for Mamba2 hybrids). transformers' reference
gated-delta kernels compute in float32 whatever the model's dtype, so two fresh forwards that
split a sequence differently already disagree by ~1e-8; the exactness and parity tests swap in
a float64 kernel of the same recurrence (checked against the reference), and one test checks
the stock kernels bit for bit against a run that needed no rollback.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
import transformers.models.qwen3_next.modeling_qwen3_next as qwen3_next
from transformers import (BambaConfig, BambaForCausalLM, DynamicCache, PreTrainedModel, Qwen3NextConfig,
                          Qwen3NextForCausalLM)

from specdec.protocols import row_view
import specdec
from specdec import Sampling
from specdec.drafters import DraftModelDrafter, NgramDrafter
from specdec.protocols import DraftContext
from specdec.runtime.obstacles import uncroppable_layers
from specdec.runtime.engine import compile_failures
from specdec.runtime.linear import LinearStates
from specdec.runtime.target import CausalLM
from specdec.types import Draft

from drafters_for_tests import GarbageDrafter, RandomTreeDrafter
from strategies import VERIFY_STEPS, random_verify
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
        query, key = (x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + 1e-6) for x in (query, key))  # transformers' l2norm
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


def tiny_mamba_hybrid(vocab_size: int = 64, seed: int = 0) -> PreTrainedModel:
    """A random Bamba in float64: a Mamba2 layer, then an attention layer (transformers' reference
    PyTorch kernels). Its Mamba2 state rolls back by snapshot and replay, on a dynamic cache."""
    torch.manual_seed(seed)
    config = BambaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, attn_layer_indices=[1], mamba_n_heads=4,
                         mamba_d_head=8, mamba_n_groups=1, mamba_d_state=8, mamba_d_conv=4, mamba_expand=1,
                         max_position_embeddings=256, bos_token_id=None, eos_token_id=None, pad_token_id=None,
                         tie_word_embeddings=False)
    return BambaForCausalLM(config).to(torch.float64).eval()


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


@pytest.mark.parametrize(("chunks", "length"), ROLLBACKS)
def test_a_static_rollback_commits_the_state_kept_for_that_position(hybrid, chunks, length):
    """The same chunks fed as fixed-shape steps on the static cache (each row's state kept, padded
    to one more row): the rollback takes the state after position length - 1, without a replay."""
    lm = CausalLM(hybrid)
    with torch.inference_mode():
        lm.reset(64)
        start = 0
        for size in chunks:
            lm.forward(IDS[start : start + size], keep=1, rows=size + 1)
            start += size
        lm.rollback(length)
        assert lm.cache_length == length and lm._replay is None
        logits, hidden = lm.forward(IDS[length : length + 4], keep=4, hidden=(lm.num_layers,))
        fresh = hybrid(input_ids=IDS[None, : length + 4], output_hidden_states=True)
    torch.testing.assert_close(logits, fresh.logits[0, length:], rtol=0, atol=1e-10)
    torch.testing.assert_close(hidden, fresh.hidden_states[-1][0, length:], rtol=0, atol=1e-10)


def test_a_static_rollback_before_the_last_commit_is_refused(hybrid):
    lm = CausalLM(hybrid)
    with torch.inference_mode():
        lm.reset(64)
        lm.forward(IDS[:8], keep=1)  # a prefill: committed as it is fed
        lm.forward(IDS[8:12], keep=1, rows=4)
        with pytest.raises(ValueError, match="committed 8 positions"):
            lm.rollback(5)
        lm.rollback(10)
        with pytest.raises(ValueError, match="committed 10 positions"):
            lm.rollback(9)


@settings(max_examples=25)
@given(prompt=st.integers(1, 9), steps=VERIFY_STEPS)
def test_after_any_verifies_each_linear_layer_holds_the_state_of_a_plain_forward(hybrid, prompt, steps):
    """Random chains (padded, rolled back to a random acceptance) and random trees (a random root
    path kept) on the static cache: every row's logits equal a plain forward's, and after each
    commit every GatedDeltaNet layer's recurrent state and conv window equal those a plain forward
    over the committed tokens leaves in transformers' own cache."""
    lm = CausalLM(hybrid)
    lm.reset(96)
    committed = [int(i) for i in IDS[:prompt]]
    with torch.inference_mode():
        if prompt > 1:
            lm.forward(torch.tensor(committed[:-1]), keep=1)
        for kind, size, rnd in steps:
            base = len(committed) - 1
            shown, accepted = random_verify(lm, committed, kind, size, rnd, 64, width=6)
            sequence = committed + accepted
            cache = DynamicCache(config=hybrid.config)
            reference = hybrid(input_ids=torch.tensor([sequence]), cache=cache, use_cache=True).logits[0, base:]
            torch.testing.assert_close(shown, reference, rtol=0, atol=1e-10)
            for index, layer in enumerate(lm.cache.layers):
                if isinstance(layer, LinearStates):
                    theirs = cache.layers[index]
                    torch.testing.assert_close(layer.state, theirs.recurrent_states[0], rtol=0, atol=1e-10)
                    torch.testing.assert_close(layer.window, theirs.conv_states[0], rtol=0, atol=1e-12)
            committed = sequence + [rnd.randrange(64)]


def test_forward_costs_measure_a_hybrid_target_and_leave_its_cache_static(hybrid):
    """Timing a step cuts the cache back without committing (a commit could not be undone)."""
    from specdec.runtime.timing import forward_costs, tree_forward_costs

    lm = CausalLM(hybrid)
    chains = forward_costs(lm, IDS[:9], [1, 4], repeats=2)
    trees = tree_forward_costs(lm, IDS[:9], [5], repeats=2)
    assert all(seconds > 0 for seconds in [*chains.values(), *trees.values()])
    assert lm.static and lm.cache_length == 0 and lm.tree_obstacle is None


def test_a_hybrid_draft_model_cannot_grow_trees_level_by_level_and_says_so_first(hybrid):
    drafter = DraftModelDrafter(hybrid, tree=True)
    with pytest.raises(specdec.verifier.DraftError, match="follow one path per row"):
        specdec.generate(tiny_model("llama", vocab_size=64), [3, 17, 9, 3], drafter=drafter, max_new_tokens=4)


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
        self.inner = row_view(inner)
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
    "tree": lambda target: RandomTreeDrafter(seed=3),  # each node's state from its parent's
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


@pytest.mark.parametrize("drafter", ["draft-model", "sampled-tree"])
def test_sampling_with_rejections_is_lossless_on_a_hybrid_target(drafter):
    target = tiny_hybrid(vocab_size=VOCAB, hidden=16, head_scale=8.0)
    draft = tiny_model("llama", vocab_size=VOCAB, seed=1, layers=1, hidden=16, head_scale=8.0)
    proposer = DraftModelDrafter(draft) if drafter == "draft-model" else RandomTreeDrafter(seed=3, sampled=True)
    sampling = Sampling(temperature=1.0)
    counts, drafted, accepted, deep = sample_counts(target, proposer, sampling, runs=600)
    assert 0 < accepted < drafted and deep > 0, (drafted, accepted, deep)
    p_value = chi_square_p_value(counts, exact_distribution(target, PROMPT, sampling))
    assert p_value >= ALPHA, f"hybrid target with {drafter} is not lossless: chi-square p = {p_value:.3g}"


class HalfOracle:
    """A chain drafter right for its first two tokens and wrong for the rest: every verify
    commits a row in the middle of the chain."""

    name = "half-oracle"

    def __init__(self, reference: list[int]) -> None:
        self.reference = reference

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        start = int(ctx.tokens.shape[0])
        right = self.reference[start : start + min(k, 2)]
        wrong = [(token + 1) % ctx.vocab_size for token in self.reference[start + len(right) : start + k]]
        return Draft(torch.tensor(right + wrong, dtype=torch.long))


@pytest.mark.usefixtures("strict_compile")
def test_a_hybrid_target_compiles_on_the_static_cache_chains_and_tree_batches(hybrid):
    """Its GatedDeltaNet layers keep each row's state in the compiled verify, with no snapshot
    and no replay: a chain padded to k + 1 rows decoding one prompt, and token trees for a batch
    of two (each batch row its own tree, each node from its parent, each row's path committed;
    ragged batches are the eager tests' business, `test_hybrid_batch`). Both decodes end without a
    one-row step, so each compiles one verify graph.
    The tokens are transformers'. The experts run as batched matmuls, which compile (the eager
    ones do not). (Single-prompt trees compile the same layer forward; checked by hand, kept out
    of the suite's compile budget.)"""
    from drafters_for_tests import OracleTreeDrafter

    prompts = [[3, 17, 9, 3, 17, 9, 3, 17]] * 2  # rows that finish together: one batch shape
    expected = [hf_greedy(hybrid, prompts[0], 20)] * 2
    hybrid.set_experts_implementation("batched_mm")
    failed = compile_failures()  # those of earlier tests in this process
    try:
        lm = CausalLM(hybrid)
        with warnings.catch_warnings():
            warnings.simplefilter("error", UserWarning)  # no fallback, no message
            # 3 tokens a step to 18, then a chain of one: every step replays the k + 1-row graph
            chain = specdec.generate(lm, prompts[0], drafter=HalfOracle(prompts[0] + expected[0]), num_draft_tokens=3,
                                     max_new_tokens=20, compile=True)
            trees = specdec.generate_batch(lm, prompts, drafter=OracleTreeDrafter(prompts[0] + expected[0], seed=2),
                                           num_draft_tokens=3, max_new_tokens=20, compile=True)
        assert chain.tokens == expected[0] and chain.stats.steps == 7, chain.stats
        assert lm.static and lm.compiled and lm._replay is None, compile_failures()
        assert [row.tokens for row in trees] == expected and compile_failures() == failed, compile_failures()
        assert trees[0].stats.mean_accepted_length > 2, "the tree's accepted paths were committed"
    finally:
        hybrid.set_experts_implementation("eager")


def test_the_hybrid_step_benchmark_times_every_mode_on_one_model():
    """`python -m specdec.bench.hybrid_steps`, shrunk: every mode runs the same steps (eager here)."""
    from specdec.bench import hybrid_steps

    model = hybrid_steps.target(hidden=64, layers=4, vocab=128)
    for mode in ("dynamic", "static"):
        assert hybrid_steps.measure(model, mode, accepted=2, steps=3, warmup=1, prompt=12) > 0
    assert hybrid_steps.main(["--bad"]) == 2


def tiny_qwen35(vocab_size: int = 64, hidden: int = 32, seed: int = 0) -> PreTrainedModel:
    """A random Qwen3.5 (its GatedDeltaNet layers project q, k, v, z, b and a apart) in float64:
    linear, full, linear attention."""
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    torch.manual_seed(seed)
    config = Qwen3_5TextConfig(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=3,
        layer_types=LAYER_TYPES, num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8,
        linear_conv_kernel_dim=4, max_position_embeddings=256, bos_token_id=None, eos_token_id=None,
        pad_token_id=None, tie_word_embeddings=False)
    model = Qwen3_5ForCausalLM(config).to(torch.float64).eval()
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(6.0)
        for module in model.modules():  # a gate norm away from its all-ones start
            if type(module).__name__ == "Qwen3_5GatedDeltaNet":
                module.norm.weight.normal_(1.0, 0.3)
    return model


@settings(max_examples=10)
@given(steps=VERIFY_STEPS)
def test_qwen35_layers_are_kept_per_row_too(monkeypatch_module_qwen35, steps):
    """Qwen3.5's split projections: after random verifies every row's logits equal a plain forward's."""
    model = monkeypatch_module_qwen35
    lm = CausalLM(model)
    lm.reset(96)
    committed = [int(i) for i in IDS[:7]]
    with torch.inference_mode():
        lm.forward(torch.tensor(committed[:-1]), keep=1)
        for kind, size, rnd in steps:
            base = len(committed) - 1
            shown, accepted = random_verify(lm, committed, kind, size, rnd, 64, width=6)
            reference = model(input_ids=torch.tensor([committed + accepted])).logits[0, base:]
            torch.testing.assert_close(shown, reference, rtol=0, atol=1e-10)
            committed = committed + accepted + [rnd.randrange(64)]


@pytest.fixture(scope="module")
def monkeypatch_module_qwen35():
    """A tiny Qwen3.5 whose gated-delta kernels are the float64 reference for this module's tests."""
    import transformers.models.qwen3_5.modeling_qwen3_5 as qwen3_5

    patch = pytest.MonkeyPatch()
    patch.setattr(qwen3_5, "torch_chunk_gated_delta_rule", gated_delta_float64)
    patch.setattr(qwen3_5, "torch_recurrent_gated_delta_rule", gated_delta_float64)
    yield tiny_qwen35()
    patch.undo()


def test_qwen35_greedy_output_equals_transformers_with_chains_and_trees(monkeypatch_module_qwen35):
    model = monkeypatch_module_qwen35
    prompt = [3, 17, 9, 3, 17, 9, 3, 17]
    expected = hf_greedy(model, prompt, 20)
    for drafter in (NgramDrafter(max_ngram=3), DraftModelDrafter(model), RandomTreeDrafter(seed=3)):
        assert specdec.generate(model, prompt, drafter=drafter, num_draft_tokens=3, max_new_tokens=20).tokens == expected
