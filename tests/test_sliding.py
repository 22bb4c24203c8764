"""Sliding-window targets on the static cache (Mistral, Gemma 2 and 3, GPT-OSS, Cohere2): the window
in the mask, exact after any sequence of verifies, every drafter family, trees, extra rows and
ragged batches, eager and compiled (Gemma 3, whose graphs take one mask per kind of layer).

Every context here runs several windows long (a window of 4 positions, prompts of 11 and 30 new
tokens), so the window really slides.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import specdec
from specdec import CausalLM, Sampling
from specdec.drafters import DraftModelDrafter, NgramDrafter
from specdec.drafters.feature_heads.eagle import EagleDrafter, save_eagle
from specdec.drafters.feature_heads.medusa import MedusaDrafter
from specdec.drafters.feature_heads.medusa_files import save_medusa
from specdec.runtime.engine import compile_failures
from specdec.runtime.windows import FULL, SLIDING, Attention, attention_kinds, layer_masks, within_window

from drafters_for_tests import GarbageDrafter, OracleTreeDrafter, RandomTreeDrafter
from strategies import VERIFY_STEPS, random_verify
from test_eagle import random_head
from test_lossless_statistical import (ALPHA, MODEL, PROMPT as STAT_PROMPT, chi_square_p_value, exact_distribution,
                                       sample_counts)
from test_medusa import random_heads
from tiny import SLIDING_ARCHITECTURES, hf_greedy, tiny_model

WINDOW = 4
VOCAB = 64
HIDDEN = 32
PROMPT = [5, 9, 14, 22, 5, 9, 14, 22, 5, 9, 14]
# Gemma 2's and GPT-OSS's eager attention take the softmax in float32, whose rounding depends on the
# number of columns summed (the static cache's capacity against a plain forward's length); a
# window off by one position moves logits by 1e-2 and more
ATOL = 1e-6


def _target(arch: str, dtype: torch.dtype = torch.float64) -> torch.nn.Module:
    """A tiny model of `arch` with a window of WINDOW positions (seed 1: a greedy output that does
    not fall into a one-token loop)."""
    return tiny_model(arch, vocab_size=VOCAB, sliding_window=WINDOW, dtype=dtype, seed=1)


# --- the masks --------------------------------------------------------------------------------------

def test_a_sliding_mask_keeps_only_the_last_W_positions_of_what_is_visible() -> None:
    visible = torch.ones(1, 3, 10, dtype=torch.bool).tril(diagonal=7)  # rows at 7, 8, 9 see up to themselves
    queries = torch.tensor([[7, 8, 9]])
    keys = torch.arange(10)[None]
    kept = within_window(visible, queries, keys, 3)
    assert kept[0].nonzero().tolist() == [[0, 5], [0, 6], [0, 7], [1, 6], [1, 7], [1, 8], [2, 7], [2, 8], [2, 9]]
    moved = keys.clone()
    moved[0, 6], moved[0, 9] = 8, 5  # columns written at other positions (tree nodes): the window reads those
    assert within_window(visible, queries, moved, 3)[0, 2].nonzero().flatten().tolist() == [6, 7, 8]


def test_models_that_mix_kinds_of_layer_get_one_mask_per_kind() -> None:
    visible = torch.ones(1, 2, 8, dtype=torch.bool).tril(diagonal=6)  # rows at 6 and 7, causal
    queries, keys = torch.tensor([[6, 7]]), torch.arange(8)[None]
    mixed = layer_masks(Attention(full=True, window=2), visible, queries, keys, torch.float32)
    assert isinstance(mixed, dict) and set(mixed) == {FULL, SLIDING}
    assert mixed[FULL].shape == (1, 1, 2, 8) and torch.equal(mixed[FULL][0, 0] == 0, visible[0])
    assert (mixed[SLIDING][0, 0] == 0).nonzero().tolist() == [[0, 5], [0, 6], [1, 6], [1, 7]]
    only = layer_masks(Attention(full=False, window=2), visible, queries, keys, torch.float32)
    assert isinstance(only, torch.Tensor) and torch.equal(only, mixed[SLIDING])
    with pytest.raises(ValueError, match="positions its columns hold"):
        layer_masks(Attention(full=True, window=2), visible, queries, None, torch.float32)


@pytest.mark.parametrize("arch, kinds", [("mistral", Attention(False, WINDOW)), ("gemma3", Attention(True, WINDOW)),
                                         ("gpt_oss", Attention(True, WINDOW)), ("llama", Attention(True, None))])
def test_the_kinds_of_attention_are_those_the_forward_masks(arch: str, kinds: Attention) -> None:
    """A Llama given a stray sliding_window attends fully (its forward never builds a window)."""
    assert attention_kinds(tiny_model(arch, vocab_size=VOCAB, sliding_window=WINDOW)) == kinds


def test_a_model_that_builds_one_mask_slides_in_every_layer_whatever_its_layer_types() -> None:
    """Mistral accepts layer_types but windows every layer (one mask): so do its trees."""
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(1)
    config = MistralConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=WINDOW,
                           layer_types=["sliding_attention", "full_attention"], bos_token_id=None, eos_token_id=None,
                           pad_token_id=None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers notes that Mistral ignores layer_types
        model = MistralForCausalLM(config).to(torch.float64).eval()
    assert attention_kinds(model) == Attention(False, WINDOW)
    reference, ids = [], list(PROMPT)  # greedy by full forwards: transformers' own cache mixes kinds here
    with torch.inference_mode():
        for _ in range(24):
            reference.append(int(model(input_ids=torch.tensor([ids + reference])).logits[0, -1].argmax()))
    assert specdec.generate(model, PROMPT, drafter=RandomTreeDrafter(seed=1), num_draft_tokens=3,
                            max_new_tokens=24).tokens == reference


def test_a_sliding_layer_without_a_window_is_refused_by_name() -> None:
    model = _target("gemma3")
    model.config.sliding_window = None
    with pytest.raises(ValueError, match="sliding_window is None"):
        attention_kinds(model)


# --- the static cache: exact after any sequence of verifies ------------------------------------------

@pytest.mark.parametrize("arch", SLIDING_ARCHITECTURES)
@settings(max_examples=12)
@given(prompt=st.integers(1, 9), steps=VERIFY_STEPS)
def test_after_any_verifies_each_layer_attends_exactly_what_a_plain_forward_does(arch: str, prompt: int,
                                                                                  steps: list) -> None:
    """Random chains (padded to a fixed width, rolled back to a random acceptance) and random trees
    (a random root path kept) on the static cache: every row's logits, and the next token's after
    the last step, equal a plain forward over the committed tokens, whose sliding layers see the
    last W positions."""
    model = _MODELS.setdefault(arch, _target(arch))
    lm = CausalLM(model)
    lm.reset(128)
    assert lm.static and lm.tree_obstacle is None
    committed = list(range(3, 3 + prompt))
    with torch.inference_mode():
        if prompt > 1:
            lm.forward(torch.tensor(committed[:-1]), keep=1)
        for kind, size, rnd in steps:
            base = len(committed) - 1
            shown, accepted = random_verify(lm, committed, kind, size, rnd, VOCAB, width=7)
            sequence = committed + accepted
            reference = model(input_ids=torch.tensor([sequence])).logits[0, base:]  # (rows kept, V)
            torch.testing.assert_close(shown, reference, rtol=0, atol=ATOL)
            committed = sequence + [rnd.randrange(VOCAB)]
            assert lm.cache_length == len(committed) - 1
        logits, _ = lm.forward(torch.tensor(committed[-1:]), keep=1)
    torch.testing.assert_close(logits[0], model(input_ids=torch.tensor([committed])).logits[0, -1], rtol=0,
                               atol=ATOL)


_MODELS: dict[str, torch.nn.Module] = {}


# --- every drafter family, eager: greedy parity with transformers ----------------------------------------

def _medusa(directory: Path, target: torch.nn.Module) -> MedusaDrafter:
    save_medusa(random_heads(hidden=HIDDEN, vocab=VOCAB, seed=4), directory)
    return MedusaDrafter(directory)


def _eagle(directory: Path, target: torch.nn.Module) -> EagleDrafter:
    save_eagle(random_head(seed=5, hidden=HIDDEN, vocab=VOCAB), directory)
    return EagleDrafter(directory)


DRAFTERS = {
    "ngram": lambda directory, target: NgramDrafter(),
    "draft-model": lambda directory, target: DraftModelDrafter(target),  # the target itself: long acceptances
    "lookahead": lambda directory, target: specdec.make_drafter("lookahead"),  # extra rows beside the chain
    "suffix": lambda directory, target: specdec.make_drafter("suffix"),
    "medusa": _medusa,
    "eagle": _eagle,
    "tree": lambda directory, target: RandomTreeDrafter(seed=1),
}


@pytest.mark.parametrize("arch", SLIDING_ARCHITECTURES)
def test_every_drafter_family_keeps_greedy_parity_on_a_sliding_target(tmp_path: Path, arch: str) -> None:
    target = _target(arch)
    reference = hf_greedy(target, PROMPT, 30)
    for name, make in DRAFTERS.items():
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no fallback, no dropped rows: the fast path serves it
            result = specdec.generate(target, PROMPT, drafter=make(tmp_path / name, target), num_draft_tokens=3,
                                      max_new_tokens=30)
        assert result.tokens == reference, f"{arch} with {name}"
        assert result.stats.drafted > 0


@pytest.mark.parametrize("arch", SLIDING_ARCHITECTURES)
def test_a_ragged_batch_on_a_sliding_target_decodes_each_row_as_alone(arch: str) -> None:
    """Rows of different lengths accept different numbers of tokens (holes in the cache, which the
    window must not count), chains and trees, and an EOS inside an accepted block ends one row."""
    target = _target(arch)
    prompts = [PROMPT, PROMPT[:3], [7, 1, 7, 1, 7, 1, 7, 1, 7]]
    references = [hf_greedy(target, prompt, 30) for prompt in prompts]
    # a token new to row 0 that the draft model (the target itself, all accepted) emits inside a block of k + 1
    eos = next(token for i, token in enumerate(references[0]) if i % 4 in (1, 2) and token not in references[0][:i])
    for drafter in (lambda: DraftModelDrafter(target), lambda: RandomTreeDrafter(seed=2)):
        batch = specdec.generate_batch(target, prompts, drafter=drafter(), num_draft_tokens=3, max_new_tokens=30)
        assert [row.tokens for row in batch] == references
    ended = specdec.generate_batch(target, prompts, drafter=DraftModelDrafter(target), num_draft_tokens=3,
                                   max_new_tokens=30, eos_token_id=eos)
    for row, reference in zip(ended, references):
        expected = reference[: reference.index(eos) + 1] if eos in reference else reference
        assert row.tokens == expected
    assert ended[0].tokens[-1] == eos and ended[0].stats.steps < len(ended[0].tokens), "an EOS inside a block"


def test_sampling_on_a_sliding_target_is_lossless() -> None:
    """Gemma 3's sliding and full layers, 11 positions against a window of 4, chains and sampled trees."""
    arch = "gemma3"
    target = tiny_model(arch, sliding_window=WINDOW, **{**MODEL, "layers": 2})
    sampling = Sampling(temperature=1.0)
    for drafter in (NgramDrafter(max_ngram=3), RandomTreeDrafter(seed=3, sampled=True)):
        counts, drafted, accepted, _ = sample_counts(target, drafter, sampling, runs=400)
        assert 0 < accepted < drafted, (drafted, accepted)
        p_value = chi_square_p_value(counts, exact_distribution(target, STAT_PROMPT, sampling))
        assert p_value >= ALPHA, f"{arch} with {drafter.name}: chi-square p = {p_value:.3g}"


# --- compiled ------------------------------------------------------------------------------------------

@pytest.mark.usefixtures("strict_compile")
def test_compiled_decoding_of_a_sliding_target_equals_eager() -> None:
    """Gemma 3 mixes sliding and full layers: a chain compiles transformers' own windowed mask
    over the full-length layers; a batch of token trees (each row's accepted path kept, its
    windows measured in its own positions) takes one explicit mask per kind of layer into the
    graph, as a single prompt's tree does (the batch's windows over holes and ragged rows are
    checked eagerly above)."""
    target = _target("gemma3", dtype=torch.float32)
    target.config._attn_implementation = "sdpa"
    reference = specdec.generate(target, PROMPT, max_new_tokens=30).tokens
    eager = specdec.generate(target, PROMPT, drafter=GarbageDrafter(seed=1), num_draft_tokens=3, max_new_tokens=30)
    lm = CausalLM(target)
    compiled = specdec.generate(lm, PROMPT, drafter=GarbageDrafter(seed=1), num_draft_tokens=3, max_new_tokens=30,
                                compile=True)
    assert compiled.tokens == eager.tokens == reference
    assert lm.compiled, compile_failures()
    trees = specdec.generate_batch(lm, [PROMPT, PROMPT], drafter=OracleTreeDrafter(PROMPT + reference, seed=2),
                                   num_draft_tokens=3, max_new_tokens=30, compile=True)
    assert [row.tokens for row in trees] == [reference, reference]
    assert trees[0].stats.mean_accepted_length > 2, "the trees' accepted paths were kept"
    assert not [key for key in compile_failures() if "Gemma3" in key[0]], compile_failures()
