"""The decode loop: cache invariants, EOS and max_new_tokens inside an accepted block,
determinism, drafter reuse and resolution, and argument errors."""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import ClassVar

import pytest
import torch
from transformers import PreTrainedModel
from transformers.cache_utils import StaticLayer

from specdec.protocols import row_view
import specdec
from specdec import CausalLM, Draft, DraftContext, Drafter, Generation, Sampling
from specdec.drafters.model_free.ngram import NgramDrafter
from tiny import hf_greedy, tiny_model

VOCAB = 64
PROMPT = [5, 9, 14, 22, 5, 9, 14, 22, 5, 9, 14]  # repetitive: n-gram lookup drafts at once
REFERENCE_TOKENS = 40
SAMPLED = Sampling(temperature=0.8, top_k=20, top_p=0.9)


@functools.lru_cache(maxsize=None)
def _target() -> PreTrainedModel:
    return tiny_model("llama", vocab_size=VOCAB, seed=0)


@functools.lru_cache(maxsize=None)
def _reference() -> tuple[int, ...]:
    """transformers' greedy continuation of PROMPT."""
    return tuple(hf_greedy(_target(), PROMPT, REFERENCE_TOKENS))


@functools.lru_cache(maxsize=None)
def _noisy_copy() -> PreTrainedModel:
    """The target with 20% Gaussian weight noise: a draft model that is often, not always, right."""
    model = copy.deepcopy(_target())
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for weight in model.parameters():
            if weight.numel() > 1:
                weight.add_(0.2 * weight.std() * torch.randn(weight.shape, generator=generator, dtype=weight.dtype))
    return model


def _make(kind: str) -> Drafter | None:
    return {
        "plain": lambda: None,
        "ngram": lambda: specdec.make_drafter("ngram"),
        "draft-model": lambda: specdec.make_drafter("draft-model", model=_noisy_copy()),
    }[kind]()


def _counters(result: Generation) -> tuple:
    stats = result.stats
    return stats.steps, stats.drafted, stats.accepted, stats.accepted_per_position


class OracleDrafter:
    """Proposes the target's known greedy continuation; records (generated so far, k) per call."""

    name: ClassVar[str] = "oracle"

    def __init__(self, prompt_length: int, continuation: tuple[int, ...]) -> None:
        self.prompt_length = prompt_length
        self.continuation = continuation
        self.asked: list[tuple[int, int]] = []

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        done = ctx.tokens.shape[0] - self.prompt_length
        self.asked.append((done, k))
        return Draft(torch.tensor(self.continuation[done : done + k], dtype=torch.long))


def _stored(layer: object) -> int:
    """Positions a cache layer holds: a static layer's length, a dynamic layer's stored rows."""
    if isinstance(layer, StaticLayer):
        return int(layer.cumulative_length)
    return int(layer.keys.shape[-2])  # type: ignore[attr-defined]


class CacheSpy:
    """Wraps a drafter and checks, at every call, that target and drafter caches hold exactly
    the committed tokens (the target: all but the last)."""

    name: ClassVar[str] = "cache-spy"

    def __init__(self, inner: Drafter) -> None:
        self.inner = row_view(inner)
        self.proposals = 0
        self.draft_checks = 0
        self.largest_target_cache = 0
        self.buffers: list[set[tuple[int, tuple[int, ...]]]] = []

    def prefill(self, ctx: DraftContext) -> None:
        if hasattr(self.inner, "prefill"):
            self.inner.prefill(ctx)
        self._check_draft_cache(ctx)

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        self._check_target_cache(ctx, "propose")
        self.proposals += 1
        return self.inner.propose(ctx, k)

    def commit(self, ctx: DraftContext, num_accepted: int) -> None:
        self._check_target_cache(ctx, "commit")
        if hasattr(self.inner, "commit"):
            self.inner.commit(ctx, num_accepted)
        self._check_draft_cache(ctx)

    def _check_target_cache(self, ctx: DraftContext, when: str) -> None:
        committed = ctx.tokens.shape[0]
        assert ctx.target.cache_length == committed - 1, (
            f"at {when}: target cache holds {ctx.target.cache_length}, {committed} tokens committed")
        stored = {_stored(layer) for layer in ctx.target.cache.layers}
        assert stored == {committed - 1}, f"at {when}: layers store {stored} positions, expected {committed - 1}"
        self.largest_target_cache = max(self.largest_target_cache, max(stored))
        buffers = {(layer.keys.data_ptr(), tuple(layer.keys.shape)) for layer in ctx.target.cache.layers}
        self.buffers.append(buffers)

    def _check_draft_cache(self, ctx: DraftContext) -> None:
        """The draft model's cache is a prefix of the committed tokens, verified by recomputation."""
        lm: CausalLM | None = getattr(self.inner, "lm", None)
        if lm is None:
            return
        cached = lm.cache_length
        committed = ctx.tokens.shape[0]
        assert cached <= committed - 1, f"draft cache holds {cached} positions, {committed} tokens committed"
        logits, _ = lm.forward(ctx.tokens[cached:], keep=1)  # (1, V)
        fresh = lm.model(input_ids=ctx.tokens.unsqueeze(0), use_cache=False).logits[0, -1:]  # (1, V)
        error = (logits - fresh).abs().max().item()
        assert error <= 1e-10, f"draft cache of {cached} positions is not the committed prefix ({error:.3g})"
        lm.rollback(cached)
        self.draft_checks += 1


# --- caches -------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["ngram", "draft-model"])
def test_caches_hold_exactly_the_committed_tokens_over_a_long_run(kind: str) -> None:
    spy = CacheSpy(_make(kind))
    lm = CausalLM(_target())
    lm.static_eagerly = True  # the static cache eagerly, as a sliding or hybrid target keeps it
    new_tokens = 150
    result = specdec.generate(lm, PROMPT, drafter=spy, num_draft_tokens=4, max_new_tokens=new_tokens,
                              sampling=Sampling(temperature=1.0), seed=0)
    assert len(result.tokens) == new_tokens
    assert result.stats.steps - 1 <= spy.proposals <= result.stats.steps  # a budget of 1 needs no draft
    assert 0 < result.stats.accepted < result.stats.drafted, "the run must mix acceptances and rejections"
    if kind == "draft-model":
        assert spy.draft_checks == spy.proposals + 1  # after prefill and the commit of every proposal
    assert spy.largest_target_cache <= len(PROMPT) + new_tokens - 1
    assert lm.cache_length == len(PROMPT) + new_tokens - 1
    assert lm.static and all(buffers == spy.buffers[0] for buffers in spy.buffers), \
        "the static cache is allocated once per call: the same buffers at every step"


# --- EOS and max_new_tokens inside a block --------------------------------------------------------

def _eos_position(offset: int, block: int) -> int:
    """Index of a new token at `offset` within its block that appears nowhere before it."""
    reference = _reference()
    fresh = [i for i in range(len(reference)) if i % block == offset and reference[i] not in reference[:i]]
    assert fresh, f"no fresh token at block offset {offset}: pick another prompt"
    later = [i for i in fresh if i >= block]
    return (later or fresh)[0]


@pytest.mark.parametrize("offset", [0, 1, 2, 4], ids=["first", "second", "third", "bonus"])
def test_eos_inside_an_accepted_block_ends_the_output_there(offset: int) -> None:
    k = 4
    position = _eos_position(offset, k + 1)
    reference = _reference()
    eos = reference[position]
    expected = list(reference[: position + 1])
    unused = min(set(range(VOCAB)) - set(reference) - set(PROMPT))

    oracle = OracleDrafter(len(PROMPT), reference)
    lm = CausalLM(_target())
    result = specdec.generate(lm, PROMPT, drafter=oracle, num_draft_tokens=k, max_new_tokens=REFERENCE_TOKENS,
                              eos_token_id=eos)
    assert result.tokens == expected
    assert result.stats.steps == position // (k + 1) + 1, "every oracle block is accepted whole"
    assert lm.cache_length == len(PROMPT) + len(result.tokens) - 1, "tokens past EOS were left in the cache"

    plain = specdec.generate(_target(), PROMPT, max_new_tokens=REFERENCE_TOKENS, eos_token_id=eos)
    assert plain.tokens == expected and plain.stats.steps == position + 1
    for stop in ([unused, eos], (eos, unused)):
        listed = specdec.generate(_target(), PROMPT, drafter=OracleDrafter(len(PROMPT), reference),
                                  num_draft_tokens=k, max_new_tokens=REFERENCE_TOKENS, eos_token_id=stop)
        assert listed.tokens == expected, f"eos_token_id={stop!r}"


@pytest.mark.parametrize("max_new_tokens", [0, 1, 2, 3, 5, 7])
def test_max_new_tokens_inside_a_block_gives_exactly_that_many_tokens(max_new_tokens: int) -> None:
    oracle = OracleDrafter(len(PROMPT), _reference())
    lm = CausalLM(_target())
    result = specdec.generate(lm, PROMPT, drafter=oracle, num_draft_tokens=4, max_new_tokens=max_new_tokens)
    assert result.tokens == list(_reference()[:max_new_tokens])
    assert result.stats.new_tokens == max_new_tokens
    for generated, k in oracle.asked:
        assert 1 <= k <= max_new_tokens - generated - 1, (
            f"drafter asked for {k} tokens with {generated} of {max_new_tokens} generated")
    assert result.stats.drafted == sum(k for _, k in oracle.asked)
    assert lm.cache_length == len(PROMPT) + max_new_tokens - 1
    if max_new_tokens == 0:
        assert result.stats.steps == 0 and oracle.asked == []


# --- determinism and drafter state ---------------------------------------------------------------

@pytest.mark.parametrize("kind", ["plain", "ngram", "draft-model"])
def test_same_seed_gives_same_output_and_different_seeds_differ(kind: str) -> None:
    def run(seed: int) -> Generation:
        return specdec.generate(_target(), PROMPT, drafter=_make(kind), num_draft_tokens=3, max_new_tokens=30,
                                sampling=SAMPLED, seed=seed)

    first, again = run(1234), run(1234)
    assert first.tokens == again.tokens
    assert _counters(first) == _counters(again)
    assert run(1).tokens != run(2).tokens


@pytest.mark.parametrize("kind", ["ngram", "draft-model"])
def test_a_reused_drafter_behaves_like_a_fresh_one(kind: str) -> None:
    reused = _make(kind)
    short_prompt = [40, 3, 17]

    def run(drafter: Drafter | None, prompt: list[int], seed: int) -> Generation:
        return specdec.generate(_target(), prompt, drafter=drafter, num_draft_tokens=4, max_new_tokens=24,
                                sampling=SAMPLED, seed=seed)

    first = run(reused, PROMPT, 5)
    second = run(reused, short_prompt, 6)  # after a longer run: stale state would show
    third = run(reused, PROMPT, 5)
    for reused_result, prompt, seed in ((second, short_prompt, 6), (third, PROMPT, 5)):
        fresh = run(_make(kind), prompt, seed)
        assert reused_result.tokens == fresh.tokens
        assert _counters(reused_result) == _counters(fresh)
    assert third.tokens == first.tokens


# --- drafter resolution ------------------------------------------------------------------------

def test_a_drafter_named_by_string_is_made_from_the_registry() -> None:
    by_name = specdec.generate(_target(), PROMPT, drafter="ngram", max_new_tokens=20)
    by_instance = specdec.generate(_target(), PROMPT, drafter=specdec.make_drafter("ngram"), max_new_tokens=20)
    assert by_name.tokens == list(_reference()[:20])
    assert by_name.stats.drafted > 0
    assert _counters(by_name) == _counters(by_instance)


def test_an_unknown_drafter_name_raises_listing_the_known_ones() -> None:
    with pytest.raises(ValueError, match="no-such-drafter") as caught:
        specdec.generate(_target(), PROMPT, drafter="no-such-drafter", max_new_tokens=2)
    for known in ("ngram", "draft-model"):
        assert known in str(caught.value)


@pytest.mark.parametrize("drafter, name", [(NgramDrafter, "NgramDrafter"), (object(), "object")],
                         ids=["class", "no-propose"])
def test_a_drafter_that_is_not_an_instance_with_propose_raises_type_error(drafter: object, name: str) -> None:
    with pytest.raises(TypeError, match=name):
        specdec.generate(_target(), PROMPT, drafter=drafter, max_new_tokens=2)  # type: ignore[arg-type]


def test_a_draft_model_loaded_from_a_directory_drafts(tmp_path: Path) -> None:
    directory = tmp_path / "draft"
    _target().save_pretrained(directory)
    drafter = specdec.make_drafter("draft-model", model=str(directory))
    result = specdec.generate(_target(), PROMPT, drafter=drafter, num_draft_tokens=4, max_new_tokens=20)
    assert result.tokens == list(_reference()[:20])
    assert result.stats.accepted == result.stats.drafted > 0, "the saved target drafting for itself is always right"


# --- errors ------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "arguments, error, pattern",
    [
        (dict(input_ids=[]), ValueError, "empty"),
        (dict(input_ids=torch.tensor([], dtype=torch.long)), ValueError, "empty"),
        (dict(input_ids=[3, -7, 4]), ValueError, "-7"),
        (dict(input_ids=[3, 1000, 4]), ValueError, "1000"),
        (dict(input_ids=torch.tensor([[1, 2], [3, 4]])), ValueError, "batch"),
        (dict(input_ids=torch.tensor([1.0, 2.0])), ValueError, "float"),
        (dict(input_ids=[1.5, 2.0]), (TypeError, ValueError), "float|integer"),
        (dict(num_draft_tokens=-1), ValueError, "num_draft_tokens"),
        (dict(max_new_tokens=-1), ValueError, "max_new_tokens"),
        (dict(max_new_tokens=2.5), ValueError, "max_new_tokens"),
        (dict(eos_token_id="2"), (TypeError, ValueError), "eos_token_id"),
        (dict(eos_token_id=2.0), (TypeError, ValueError), "eos_token_id"),
        (dict(eos_token_id=[1, None]), (TypeError, ValueError), "eos_token_id"),
        (dict(sampling={"temperature": 0.5}), TypeError, "Sampling"),
    ],
    ids=["empty-list", "empty-tensor", "negative-id", "id-past-vocab", "batch-of-2", "float-tensor",
         "float-list", "negative-k", "negative-budget", "float-budget", "eos-str", "eos-float", "eos-none-in-list",
         "sampling-dict"],
)
def test_bad_arguments_raise_naming_the_fault(arguments: dict, error: type, pattern: str) -> None:
    call = dict(input_ids=PROMPT, max_new_tokens=4) | arguments
    with pytest.raises(error, match=pattern):
        specdec.generate(_target(), **call)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_a_prompt_longer_than_the_trained_positions_is_refused(arch: str) -> None:
    model = tiny_model(arch, vocab_size=VOCAB, max_positions=16, layers=1, hidden=16)
    with pytest.raises(ValueError, match="17.*16"):
        specdec.generate(model, list(range(17)), max_new_tokens=0)


def test_learned_positions_bound_prompt_plus_budget_but_rotary_ones_do_not() -> None:
    learned = tiny_model("gpt2", vocab_size=VOCAB, max_positions=16, layers=1, hidden=16)
    with pytest.raises(ValueError, match="max_new_tokens <= 6"):
        specdec.generate(learned, list(range(10)), max_new_tokens=7)
    assert len(specdec.generate(learned, list(range(10)), max_new_tokens=6).tokens) == 6
    rotary = tiny_model("llama", vocab_size=VOCAB, max_positions=16, layers=1, hidden=16)
    assert len(specdec.generate(rotary, list(range(10)), max_new_tokens=12).tokens) == 12


def test_a_draft_model_with_another_vocabulary_is_refused() -> None:
    drafter = specdec.make_drafter("draft-model", model=tiny_model("llama", vocab_size=VOCAB + 16, layers=1))
    with pytest.raises(ValueError, match="vocabulary"):
        specdec.generate(_target(), PROMPT, drafter=drafter, max_new_tokens=4)


@pytest.mark.parametrize(
    "options, option",
    [({"max_ngram": 0}, "max_ngram"), ({"min_ngram": 0}, "min_ngram"),
     ({"min_ngram": 4, "max_ngram": 2}, "min_ngram"), ({"max_ngram": 2.0}, "max_ngram")],
)
def test_bad_ngram_options_raise_value_error_naming_the_option(options: dict, option: str) -> None:
    with pytest.raises(ValueError, match=option):
        specdec.make_drafter("ngram", **options)


def test_an_unknown_drafter_option_raises_type_error_listing_accepted_ones() -> None:
    with pytest.raises(TypeError, match="bogus") as caught:
        specdec.make_drafter("ngram", bogus=1)
    for accepted in ("max_ngram", "min_ngram"):
        assert accepted in str(caught.value)


@pytest.mark.parametrize("make_path", [lambda tmp: tmp, lambda tmp: tmp / "missing"], ids=["empty-dir", "missing"])
def test_a_draft_model_path_that_is_not_a_model_directory_raises(tmp_path: Path, make_path) -> None:
    with pytest.raises(FileNotFoundError, match="config.json"):
        specdec.make_drafter("draft-model", model=str(make_path(tmp_path)))
