"""The target adapter `specdec.CausalLM`: cached forwards equal full forwards, `logits_to_keep`,
post-norm hidden states, exact rollback, and refusal of models that are not causal LMs."""

from __future__ import annotations

import functools

import pytest
import torch
from torch import nn
from transformers import LlamaConfig, LlamaModel, PreTrainedModel

from specdec import CausalLM
from tiny import ARCHITECTURES, tiny_model

VOCAB = 64
POSITIONS = 96
TOLERANCE = 1e-10  # float64: a cached forward may round differently, but only at this level
IDS = torch.tensor([3, 17, 42, 8, 8, 61, 0, 25, 33, 12, 50, 7, 19, 2, 44, 63, 5, 30])  # (18,)
OTHER = torch.tensor([9, 9, 41, 27, 1, 58, 36, 14, 22, 11, 6, 48, 39, 20, 55, 4, 31, 16])  # (18,)


@functools.lru_cache(maxsize=None)
def _model(arch: str) -> PreTrainedModel:
    return tiny_model(arch, vocab_size=VOCAB, max_positions=POSITIONS)


def _full_logits(model: PreTrainedModel, ids: torch.Tensor) -> torch.Tensor:
    """Logits [T, V] of one uncached forward over ids [T]."""
    with torch.inference_mode():
        return model(input_ids=ids.unsqueeze(0), use_cache=False).logits[0]


def _assert_close(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    error = (actual - expected).abs().max().item()
    assert error <= TOLERANCE, f"{what}: max |difference| {error:.3g} > {TOLERANCE}"


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_forward_after_cached_prefix_equals_full_forward(arch: str) -> None:
    model = _model(arch)
    lm = CausalLM(model)
    full = _full_logits(model, IDS)  # (T, V)
    lm.reset()
    with torch.inference_mode():
        first, _ = lm.forward(IDS[:8], keep=1)
        second, _ = lm.forward(IDS[8:11], keep=3)
        third, _ = lm.forward(IDS[11:], keep=IDS.shape[0] - 11)
    _assert_close(first, full[7:8], f"{arch} prefix of 8")
    _assert_close(second, full[8:11], f"{arch} 3 tokens after 8 cached")
    _assert_close(third, full[11:], f"{arch} 7 tokens after 11 cached")


@pytest.mark.parametrize("keep", [1, 2, 5, 6])
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_logits_to_keep_returns_exactly_the_last_rows(arch: str, keep: int) -> None:
    model = _model(arch)
    lm = CausalLM(model)
    full = _full_logits(model, IDS[:10])  # (10, V)
    lm.reset()
    with torch.inference_mode():
        lm.forward(IDS[:4], keep=1)
        logits, _ = lm.forward(IDS[4:10], keep=keep)  # 6 new positions
    assert logits.shape == (keep, VOCAB)
    _assert_close(logits, full[10 - keep :], f"{arch} keep={keep}")


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_hidden_states_are_the_post_norm_last_layer(arch: str) -> None:
    model = _model(arch)
    lm = CausalLM(model)
    assert lm.final_norm is not None, f"{arch}: the adapter found no final norm"
    lm.reset()
    with torch.inference_mode():
        prefix_logits, prefix_hidden = lm.forward(IDS[:7], keep=7, hidden=(lm.num_layers,))
        logits, hidden = lm.forward(IDS[7:12], keep=5, hidden=(lm.num_layers,))
        no_hidden = lm.forward(IDS[12:14], keep=1)[1]
        hidden_size = lm.lm_head.weight.shape[1]
        assert prefix_hidden.shape == (7, hidden_size)
        assert hidden.shape == (5, hidden_size), "hidden states cover only the positions just run"
        _assert_close(lm.lm_head(prefix_hidden), prefix_logits, f"{arch} lm_head(hidden) of the prefix")
        _assert_close(lm.lm_head(hidden), logits, f"{arch} lm_head(hidden) after a cached prefix")
    assert no_hidden is None


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("static", [False, True])
def test_hidden_states_of_any_layers_come_from_the_same_forward(arch: str, static: bool) -> None:
    model = _model(arch)
    lm = CausalLM(model)
    layers = (lm.num_layers, 0, 1, 1)  # any order, repeats allowed
    with torch.inference_mode():
        full = model(input_ids=IDS[None, :12], output_hidden_states=True).hidden_states
        lm.reset(256 if static else None)
        lm.forward(IDS[:7], keep=1)
        _, states = lm.forward(IDS[7:12], keep=5, hidden=layers, rows=8 if static else None)
    assert lm.static is static and states.shape == (5, len(layers) * lm.hidden_size)
    expected = torch.cat([full[i][0, 7:12] for i in layers], dim=-1)
    _assert_close(states, expected, f"{arch} layers {layers}")


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_rollback_then_forward_reproduces_a_fresh_run(arch: str) -> None:
    model = _model(arch)
    lm = CausalLM(model)
    lm.reset()
    with torch.inference_mode():
        lm.forward(IDS[:12], keep=1)
        lm.rollback(7)
        assert lm.cache_length == 7
        logits, _ = lm.forward(OTHER[7:10], keep=3)  # a different continuation of IDS[:7]
        expected = _full_logits(model, torch.cat([IDS[:7], OTHER[7:10]]))[7:]
        _assert_close(logits, expected, f"{arch} after rollback 12 -> 7")

        lm.rollback(0)
        logits, _ = lm.forward(OTHER[:5], keep=5)
        _assert_close(logits, _full_logits(model, OTHER[:5]), f"{arch} after rollback to 0")


@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("fed", [1, 2])
def test_a_fed_chain_feeds_padded_ids_then_runs_the_loop_after_the_real_ones(arch: str, fed: int) -> None:
    """`fed_chain`: the ids fed (padded to k + 1 rows), then a greedy loop of k tokens from the last
    one's logits, in one step: the tokens of greedy decoding, the cache holding the real ids and
    the loop's, and a later forward that equals a full one (the padding left no trace)."""
    from specdec.drafters.draft_models.draft_model import draft_chain
    from specdec.types import Sampling

    model, k, start = _model(arch), 4, 9
    lm = CausalLM(model)
    lm.reset(256)
    with torch.inference_mode():
        lm.forward(IDS[:start], keep=1)
        tokens, probs = lm.fed_chain(draft_chain, IDS[start : start + fed], k + 1, k - 1, None, Sampling(), k)
        assert probs is None and lm.cache_length == start + fed + k - 1
        sequence = IDS[: start + fed]
        for _ in range(k):  # greedy decoding by full forwards
            sequence = torch.cat([sequence, _full_logits(model, sequence)[-1].argmax()[None]])
        assert tokens.tolist() == sequence[start + fed :].tolist()
        logits, _ = lm.forward(sequence[-1:], keep=1)
        _assert_close(logits, _full_logits(model, sequence)[-1:], f"{arch} after a fed chain of {fed}")


def test_cache_length_tracks_forwards_rollbacks_and_resets() -> None:
    lm = CausalLM(_model("llama"))
    assert lm.cache_length == 0, "a new adapter holds nothing"
    lm.reset()
    assert lm.cache_length == 0
    with torch.inference_mode():
        lm.forward(IDS[:5], keep=1)
        assert lm.cache_length == 5
        lm.forward(IDS[5:8], keep=3)
        assert lm.cache_length == 8
        lm.rollback(8)
        assert lm.cache_length == 8, "rollback to the current length is a no-op"
        lm.rollback(6)
        assert lm.cache_length == 6
        with pytest.raises(ValueError, match="7"):
            lm.rollback(7)  # cannot grow a cache by cropping
        with pytest.raises(ValueError, match="-1"):
            lm.rollback(-1)
        assert lm.cache_length == 6, "a refused rollback changes nothing"
    lm.reset()
    assert lm.cache_length == 0


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_vocab_size_max_positions_dtype_and_device_are_read_from_the_model(arch: str) -> None:
    lm = CausalLM(tiny_model(arch, vocab_size=50, max_positions=40, layers=1, hidden=16))
    assert lm.vocab_size == 50
    assert lm.max_positions == 40
    assert lm.dtype == torch.float64
    assert lm.device == torch.device("cpu")


def _bare_llama() -> LlamaModel:
    """A transformers model without an LM head."""
    return LlamaModel(LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                  num_attention_heads=2, num_key_value_heads=1))


@pytest.mark.parametrize(
    "make, name",
    [(_bare_llama, "LlamaModel"), (lambda: nn.Linear(4, 4), "Linear"), (lambda: "gpt2", "str")],
    ids=["bare-llama-model", "plain-module", "string"],
)
def test_a_model_that_is_not_a_causal_lm_raises_type_error_naming_it(make, name: str) -> None:
    with pytest.raises(TypeError, match=name):
        CausalLM(make())
