"""Lookahead decoding: the branch's layout and pool on hand-made examples, the Jacobi rows riding
the verify forward (their logits those of each column run as a sequence, the cache back to the
committed length, one target forward a step), greedy parity eager and compiled, losslessness at
temperature > 0 (the enumerated law of test_lossless_statistical, ALPHA = 1e-4, fixed seeds),
malformed extra rows refused, and the fallback on a hybrid target.

Float64 tiny models (sdpa attention), so rows of one masked forward and plain forwards of the
same sequences agree to rounding and no argmax can flip between them.
"""

from __future__ import annotations

import importlib
import re
import warnings
from collections.abc import Callable
from typing import Any, ClassVar

import pytest
import torch
import transformers.models.qwen3_next.modeling_qwen3_next as qwen3_next
from torch._dynamo.utils import counters

import specdec
from specdec import Sampling
from specdec.drafters import NgramDrafter
from specdec.drafters.model_free.lookahead import LookaheadDrafter, NgramPool, branch_layout, shift_levels
from specdec.protocols import DraftContext, RowView
from specdec.runtime.target import CausalLM
from specdec.trees import path_to
from specdec.types import Draft, ExtraRows
from specdec.verifier import DraftError
from test_greedy_parity import PROMPT, VOCAB, _reference, _target
from test_hybrid import gated_delta_float64, tiny_hybrid
from test_lossless_statistical import (ALPHA, MODEL, PLAIN, PROMPT as STAT_PROMPT, TRUNCATED, chi_square_p_value,
                                       exact_distribution, sample_counts)
from test_verifier_tree import verify_tree_siblings_against_p
from tiny import ARCHITECTURES, hf_greedy, tiny_model

NEW_TOKENS = 32
EXACT = dict(rtol=0.0, atol=1e-9)


# --- the lookahead branch and the pool, by hand -------------------------------------------------------

def test_branch_layout_places_each_column_as_a_contiguous_sequence() -> None:
    positions, visible = branch_layout(levels=2, window=3)
    # rows: (0,0) (0,1) (0,2) (1,0) (1,1) (1,2); token (l, j) at offset l + j + 1
    assert positions.tolist() == [1, 2, 3, 2, 3, 4]
    expected = [
        [1, 0, 0, 0, 0, 0],  # (0,0): level 0 up to its column
        [1, 1, 0, 0, 0, 0],  # (0,1)
        [1, 1, 1, 0, 0, 0],  # (0,2)
        [1, 0, 0, 1, 0, 0],  # (1,0): (0,0), then its own column's climb
        [1, 1, 0, 0, 1, 0],  # (1,1): (0,0), (0,1), itself
        [1, 1, 1, 0, 0, 1],  # (1,2)
    ]
    assert visible.int().tolist() == expected
    positions, visible = branch_layout(levels=3, window=2)
    assert positions.tolist() == [1, 2, 2, 3, 3, 4]
    assert visible[5].int().tolist() == [1, 1, 0, 1, 0, 1], "(2,1) sees (0,0), (0,1), (1,1), itself"
    assert visible[4].int().tolist() == [1, 0, 1, 0, 1, 0], "(2,0) sees (0,0), (1,0), itself"


def test_levels_warm_up_then_each_column_gives_an_ngram_and_the_levels_shift() -> None:
    levels = [[10, 11]]  # N = 3: two levels of W = 2
    assert shift_levels(levels, [20, 21], ngram=3) == [], "warm-up: a second level, nothing pooled"
    assert levels == [[10, 11], [20, 21]]
    assert shift_levels(levels, [30, 31], ngram=3) == [(10, 20, 30), (11, 21, 31)]
    assert levels == [[20, 21], [30, 31]], "level 0 dropped, the new tokens on top"
    assert shift_levels(levels, [40, 41], ngram=3) == [(20, 30, 40), (21, 31, 41)]
    levels = [[1, 2, 3]]  # N = 2: one level, pooled from the first step
    assert shift_levels(levels, [4, 5, 6], ngram=2) == [(1, 4), (2, 5), (3, 6)] and levels == [[4, 5, 6]]


def test_the_pool_keeps_the_most_recent_distinct_continuations_of_each_key() -> None:
    pool = NgramPool(size=2)
    for gram in [(1, 2, 3), (1, 4, 5), (7, 8, 9), (1, 2, 3), (1, 6, 6)]:
        pool.add(gram)
    assert pool.get(1) == [(6, 6), (2, 3)], "a repeat moves to the front; the oldest falls out"
    assert pool.get(7) == [(8, 9)] and pool.get(2) == []


def test_a_hand_made_step_pools_the_targets_argmax_of_each_top_row() -> None:
    """commit reads ctx.extra_logits row by row: (level, column) -> the argmax of its row."""
    lookahead = LookaheadDrafter(window=2, ngram=3, pool_context=False)
    drafter = RowView(lookahead)
    ctx = DraftContext(torch.tensor([3, 4, 5]), Sampling(), torch.Generator(), None, 10)
    drafter.prefill(ctx)
    lookahead.levels[:] = [[1, 2]]
    first = drafter.propose(ctx, 4)
    assert first.tokens.numel() == 0 and first.extra is not None
    assert first.extra.tokens.tolist() == [1, 2] and first.extra.positions.tolist() == [1, 2]

    def logits_for(argmax: list[int]) -> torch.Tensor:
        return torch.nn.functional.one_hot(torch.tensor(argmax), 10).double()  # (m, V)

    drafter.commit(DraftContext(torch.tensor([3, 4, 5, 6]), Sampling(), torch.Generator(), None, 10,
                                extra_logits=logits_for([7, 8])), 0)
    assert lookahead.levels == [[1, 2], [7, 8]] and lookahead.pool.grams == {}
    drafter.commit(DraftContext(torch.tensor([3, 4, 5, 6, 1]), Sampling(), torch.Generator(), None, 10,
                                extra_logits=logits_for([0, 0, 9, 6])), 0)  # rows (1, 0) and (1, 1) on top
    assert lookahead.levels == [[7, 8], [9, 6]]
    assert lookahead.pool.get(1) == [(7, 9)] and lookahead.pool.get(2) == [(8, 6)]
    ctx = DraftContext(torch.tensor([3, 4, 5, 6, 1]), Sampling(), torch.Generator(), None, 10)
    assert drafter.propose(ctx, 4).tokens.tolist() == [7, 9], "the pooled continuation of the last token"
    assert drafter.propose(ctx, 1).tokens.tolist() == [7], "cut to k"


def test_context_ngrams_seed_the_pool_and_trees_merge_the_guesses() -> None:
    lookahead = LookaheadDrafter(window=3, ngram=3, tree=True)
    drafter = RowView(lookahead)
    ctx = DraftContext(torch.tensor([1, 2, 3, 1, 2, 4, 1, 5, 5, 1]), Sampling(), torch.Generator(), None, 10)
    drafter.prefill(ctx)
    draft = drafter.propose(ctx, 4)
    # continuations of 1, latest first: (5, 5), (2, 4), (2, 3) -> a trie
    assert draft.tokens.tolist() == [5, 2, 5, 4, 3] and draft.parents.tolist() == [-1, -1, 0, 1, 1]
    assert len(draft.tokens) <= lookahead.max_draft_nodes(4) == 6
    chain = RowView(LookaheadDrafter(window=3, ngram=3))
    chain.prefill(ctx)
    assert chain.propose(ctx, 4).tokens.tolist() == [5, 5] and chain.propose(ctx, 4).parents is None


@pytest.mark.parametrize(("options", "fragment"), [
    ({"window": 0}, "window must be an int >= 1, got 0"),
    ({"ngram": 1}, "ngram must be an int >= 2, got 1"),
    ({"guesses": 0}, "guesses must be an int >= 1, got 0"),
    ({"window": 2.0}, "window must be an int >= 1, got 2.0"),
    ({"tree": 1}, "tree must be True or False, got 1"),
    ({"pool_context": "yes"}, "pool_context must be True or False, got 'yes'"),
    ({"seed": -1}, "seed must be an int >= 0, got -1"),
])
def test_bad_options_are_refused_naming_the_drafter_the_option_and_the_value(options: dict[str, Any],
                                                                           fragment: str) -> None:
    with pytest.raises(ValueError, match=re.escape(f"lookahead: {fragment}")):
        LookaheadDrafter(**options)


def test_declarations_follow_the_options() -> None:
    assert "lookahead" in specdec.drafter_names()
    drafter = specdec.make_drafter("lookahead", window=4, ngram=3, guesses=6, tree=True)
    assert drafter.extra_rows() == 8 and drafter.max_draft_nodes(5) == 12 and drafter.max_draft_nodes(1) == 6
    assert LookaheadDrafter(window=4, ngram=3).max_draft_nodes(5) == 2
    assert LookaheadDrafter.drafts_trees(LookaheadDrafter.tree_options)
    assert not LookaheadDrafter.drafts_trees({}) and not LookaheadDrafter.drafts_trees({"tree": True, "guesses": 1})


# --- the extra rows in the target's forward -------------------------------------------------------------

@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@torch.inference_mode()
def test_extra_rows_logits_are_each_column_run_as_a_sequence_and_the_tree_rows_are_unchanged(arch: str) -> None:
    model = _target(arch)
    lm = CausalLM(model)
    levels = [[7, 30, 2, 41], [12, 12, 50, 3], [60, 1, 9, 33]]  # L = 3, W = 4
    positions, visible = branch_layout(len(levels), 4)
    extra = ExtraRows(torch.tensor([t for level in levels for t in level]), positions, visible)
    parents, tokens = [-1, -1, 0, 2, 1], [11, 40, 3, 8, 19]
    for attempt in range(2):  # the first tree forward computes every row, later ones the root and extra rows
        lm.reset()
        lm.forward(torch.tensor(PROMPT[:-1]), keep=1)
        base = lm.cache_length
        tree = lm.forward_tree(torch.tensor(PROMPT[-1:] + tokens), parents, rows=8, extra=extra.padded(14))
        rows = [tree.row(r) for r in range(len(parents) + 1)]
        assert lm.cache_length == base + 8 + 14
        lm.keep_path(base, [0, 2])
        assert lm.cache_length == base + 2
        after, _ = lm.forward(torch.tensor([5]), keep=1)
        plain = model(input_ids=torch.tensor([PROMPT + [tokens[1], 5]])).logits[0, -1]
        torch.testing.assert_close(after[0], plain, **EXACT, msg=lambda m: f"{arch}: the kept path: {m}")
        assert tree.extra is not None and tree.extra.shape == (14, VOCAB)
        for node in range(-1, len(parents)):
            ids = PROMPT + [tokens[i] for i in path_to(parents, node)]
            want = model(input_ids=torch.tensor([ids])).logits[0, -1]
            torch.testing.assert_close(rows[node + 1], want, **EXACT, msg=lambda m: f"{arch} node {node}: {m}")
        for row in range(12):
            level, column = divmod(row, 4)
            column_ids = levels[0][: column + 1] + [levels[l][column] for l in range(1, level + 1)]
            want = model(input_ids=torch.tensor([PROMPT + column_ids])).logits[0, -1]
            torch.testing.assert_close(tree.extra[row], want, **EXACT,
                                       msg=lambda m: f"{arch} attempt {attempt}, extra row {level, column}: {m}")


class Recording(LookaheadDrafter):
    """Lookahead that checks the cache at every call and keeps what commit reads."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.lengths: list[tuple[int, int]] = []  # (cache length, committed length) at propose and commit
        self.extra_logits: list[torch.Tensor | None] = []
        self.sent: list[int] = []  # extra rows sent with each draft
        self.siblings = 0  # drafts in which some node has more than one child

    def propose(self, rows: dict[int, DraftContext], k: dict[int, int]) -> dict[int, Draft]:
        ctx = rows[0]
        self.lengths.append((ctx.target.cache_length, ctx.tokens.shape[0]))
        draft = super().propose(rows, k)[0]
        self.sent.append(0 if draft.extra is None else draft.extra.tokens.shape[0])
        self.siblings += draft.parents is not None and len(set(draft.parents.tolist())) < len(draft.parents)
        return {0: draft}

    def commit(self, rows: dict[int, DraftContext], accepted: dict[int, int]) -> None:
        ctx = rows[0]
        self.lengths.append((ctx.target.cache_length, ctx.tokens.shape[0]))
        self.extra_logits.append(ctx.extra_logits)
        super().commit(rows, accepted)


def test_the_jacobi_rows_ride_the_one_verify_forward_and_the_cache_keeps_the_committed_length() -> None:
    model = tiny_model("llama", vocab_size=VOCAB, seed=0)  # its own instance: its forward is counted
    fed: list[int] = []
    forward = model.forward

    def counted(*args: Any, **kwargs: Any) -> Any:
        fed.append(int(kwargs["input_ids"].shape[1]))
        return forward(*args, **kwargs)

    model.forward = counted  # type: ignore[method-assign]
    drafter = Recording(window=3, ngram=4, tree=True)
    result = specdec.generate(model, PROMPT, drafter=drafter, num_draft_tokens=4, max_new_tokens=NEW_TOKENS)
    assert result.tokens == list(_reference("llama"))
    steps = result.stats.steps
    assert len(fed) == 1 + steps, f"{len(fed)} target forwards for a prefill and {steps} steps"
    width = drafter.max_draft_nodes(4) + 1 + drafter.extra_rows()  # the node budget, the root, the Jacobi rows
    assert fed[1:] == [width] * (steps - 1) + [fed[-1]] and fed[-1] in (width, 1), fed
    assert all(cache == committed - 1 for cache, committed in drafter.lengths), drafter.lengths
    assert len(drafter.extra_logits) == len(drafter.sent) >= steps - 1
    for sent, logits in zip(drafter.sent, drafter.extra_logits):
        assert logits is not None and logits.shape == (sent, VOCAB)
    assert drafter.sent[:3] == [3, 6, 9], "the warm-up adds a level a step, then N - 1 levels of W"
    assert drafter.pool.grams, "the Jacobi rows filled the pool"


@pytest.mark.parametrize("k", [1, 4])
@pytest.mark.parametrize("mode", ["chain", "tree", "jacobi-only-tree"])
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_greedy_lookahead_equals_plain_greedy(arch: str, mode: str, k: int) -> None:
    options = {"chain": {}, "tree": {"tree": True}, "jacobi-only-tree": {"tree": True, "pool_context": False}}[mode]
    drafter = LookaheadDrafter(**options)
    result = specdec.generate(_target(arch), PROMPT, drafter=drafter, num_draft_tokens=k, max_new_tokens=NEW_TOKENS)
    assert result.tokens == list(_reference(arch)), f"{arch} {mode} k={k}"
    assert result.stats.drafted > 0
    if mode == "jacobi-only-tree" and arch == "llama":
        assert result.stats.accepted > 0, "no Jacobi n-gram was ever accepted"


def test_extra_rows_past_a_learned_position_table_are_clamped() -> None:
    """gpt2 with exactly prompt + new positions: near the end the branch's offsets run past it."""
    model = tiny_model("gpt2", vocab_size=VOCAB, seed=0, max_positions=len(PROMPT) + 20)
    result = specdec.generate(model, PROMPT, drafter=LookaheadDrafter(window=6), max_new_tokens=20)
    assert result.tokens == hf_greedy(model, PROMPT, 20)


@pytest.mark.usefixtures("strict_compile")
def test_compiled_lookahead_equals_eager_in_a_few_graphs() -> None:
    model = tiny_model("qwen3", vocab_size=VOCAB, seed=0, layers=1, hidden=24)  # shapes no other test compiles
    options = dict(window=3, ngram=3, tree=True)
    eager = specdec.generate(model, PROMPT, drafter=LookaheadDrafter(**options), num_draft_tokens=2,
                             max_new_tokens=16)
    before = int(counters["stats"]["unique_graphs"])
    compiled = specdec.generate(model, PROMPT, drafter=LookaheadDrafter(**options), num_draft_tokens=2,
                                max_new_tokens=16, compile=True)
    graphs = int(counters["stats"]["unique_graphs"]) - before
    assert compiled.tokens == eager.tokens == hf_greedy(model, PROMPT, 16)
    assert compiled.stats.accepted == eager.stats.accepted > 0
    assert 1 <= graphs <= 2, f"{graphs} graphs: the padded tree + Jacobi rows, and the one-row last step"


# --- losslessness at temperature > 0 --------------------------------------------------------------------

@pytest.fixture(scope="module")
def stat_target() -> Any:
    return tiny_model(seed=0, **MODEL)


RUNS = 600
STAT_CASES = {
    # prompt n-grams: chain-shaped trees (the prompt repeats one pattern) two deep, with the rows
    "context-tree-t1": (dict(window=5, ngram=3, tree=True), PLAIN),
    # N = 2 pools the Jacobi rows' n-grams from the first step: one-deep trees of a Jacobi guess
    # beside the prompt's continuation of the same token from step two
    "jacobi-tree-t0.7": (dict(window=5, ngram=2, tree=True), TRUNCATED),
}


@pytest.mark.parametrize("key", list(STAT_CASES))
def test_lookahead_continuations_match_plain_sampling(stat_target: Any, key: str) -> None:
    options, sampling = STAT_CASES[key]
    drafter = Recording(**options)
    counts, drafted, accepted, _ = sample_counts(stat_target, drafter, sampling, runs=RUNS)
    assert 0 < accepted < drafted, (drafted, accepted)
    if key.startswith("jacobi"):
        assert drafter.siblings > 0, "no draft had sibling guesses: sample-and-match was never exercised"
    p_value = chi_square_p_value(counts, exact_distribution(stat_target, STAT_PROMPT, sampling))
    assert p_value >= ALPHA, f"lookahead {key} is not lossless: chi-square p = {p_value:.3g}"


def test_chi_square_detects_siblings_checked_against_p_instead_of_the_residual(stat_target: Any,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The test above has power: a verifier that forgets to zero a rejected sibling (or, in a chain,
    the rejected token) fails it."""
    rules = importlib.import_module("specdec.verifier.rules")
    monkeypatch.setattr(rules, "verify_tree", verify_tree_siblings_against_p)  # whichever tree rule the run uses
    monkeypatch.setattr(rules, "verify_traversal", verify_tree_siblings_against_p)
    chain_verdict = rules.chain_verdict

    def correction_from_p(p, tokens, q, generator):  # type: ignore[no-untyped-def]
        num, out, acceptance, uniforms = chain_verdict(p, tokens, q, generator)
        if int(num) < tokens.shape[0]:  # lossy: the correction ignores the rejected token
            out = out.clone()
            out[int(num)] = torch.multinomial(p[int(num)], 1, generator=generator)[0]
        return num, out, acceptance, uniforms

    monkeypatch.setattr(rules, "chain_verdict", correction_from_p)  # whichever chain rule the run uses
    monkeypatch.setattr(rules, "block_verdict", correction_from_p)
    options, sampling = STAT_CASES["context-tree-t1"]
    counts, drafted, _, _ = sample_counts(stat_target, LookaheadDrafter(**options), sampling, runs=RUNS)
    assert drafted > 0
    p_value = chi_square_p_value(counts, exact_distribution(stat_target, STAT_PROMPT, sampling))
    assert p_value < ALPHA, f"a lossy tree verifier went undetected: p = {p_value:.3g}, N = {RUNS}"


def test_extra_rows_change_no_verdict_even_when_sampling(stat_target: Any) -> None:
    """A tree drafter with garbage extra rows emits, seed for seed, what it emits without them."""
    vocab = MODEL["vocab_size"]
    for seed in range(3):
        without = WithExtra(NgramDrafter(branches=3), lambda m: None, as_tree=True)
        ridden = WithExtra(NgramDrafter(branches=3), lambda m: garbage(m, vocab=vocab), as_tree=True)
        plain, extra = (specdec.generate(stat_target, STAT_PROMPT, drafter=drafter, max_new_tokens=20, sampling=PLAIN,
                                         seed=seed) for drafter in (without, ridden))
        assert extra.tokens == plain.tokens, f"seed {seed}"
        assert extra.stats.accepted == plain.stats.accepted > 0 and extra.stats.drafted == plain.stats.drafted


# --- malformed extra rows -------------------------------------------------------------------------------

def garbage(m: int, offset: int = 1, vocab: int = VOCAB) -> ExtraRows:
    """m random rows at offsets from `offset` on, each seeing a random half of the others."""
    generator = torch.Generator().manual_seed(m)
    visible = torch.rand(m, m, generator=generator) < 0.5
    return ExtraRows(torch.randint(0, vocab, (m,), generator=generator), torch.arange(m) + offset, visible)


class WithExtra:
    """Wraps a drafter, attaching the rows `make(declared)` to each of its drafts; `as_tree`
    sends its chains as chain-shaped trees."""

    name: ClassVar[str] = "with-extra"

    def __init__(self, inner: Any, make: Callable[[int], Any], declared: int | None = 4, as_tree: bool = False) -> None:
        self.inner, self.make, self.declared, self.as_tree = RowView(inner), make, declared, as_tree
        if declared is None:
            self.extra_rows = None  # declares nothing

    def extra_rows(self) -> int:
        return self.declared  # type: ignore[return-value]

    def max_draft_nodes(self, k: int) -> int:
        return self.inner.drafter.max_draft_nodes(k)

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        draft = self.inner.propose(ctx, k)
        parents = draft.parents
        if parents is None and self.as_tree:
            parents = torch.arange(-1, draft.tokens.shape[0] - 1)
        return Draft(draft.tokens, draft.probs, parents, self.make(self.declared or 4))


MALFORMED: dict[str, tuple[Callable[[int], Any], str]] = {
    "not ExtraRows": (lambda m: (torch.zeros(m, dtype=torch.long),), "extra must be a specdec.types.ExtraRows"),
    "2-D tokens": (lambda m: ExtraRows(torch.zeros(1, m, dtype=torch.long), torch.ones(m, dtype=torch.long),
                                       torch.eye(m, dtype=torch.bool)), "extra.tokens must be a 1-D LongTensor"),
    "int32 positions": (lambda m: ExtraRows(torch.zeros(m, dtype=torch.long), torch.ones(m, dtype=torch.int32),
                                            torch.eye(m, dtype=torch.bool)), "extra.positions must be a LongTensor"),
    "short positions": (lambda m: ExtraRows(torch.zeros(m, dtype=torch.long), torch.ones(m - 1, dtype=torch.long),
                                            torch.eye(m, dtype=torch.bool)), "extra.positions must be a LongTensor"),
    "float visible": (lambda m: ExtraRows(torch.zeros(m, dtype=torch.long), torch.ones(m, dtype=torch.long),
                                          torch.eye(m)), "extra.visible must be a BoolTensor"),
    "visible wrong shape": (lambda m: ExtraRows(torch.zeros(m, dtype=torch.long), torch.ones(m, dtype=torch.long),
                                                torch.eye(m + 1, dtype=torch.bool)), "extra.visible must be"),
    "id out of range": (lambda m: ExtraRows(torch.full((m,), VOCAB), torch.ones(m, dtype=torch.long),
                                            torch.eye(m, dtype=torch.bool)), f"extra token id(s) [{VOCAB}"),
    "negative id": (lambda m: ExtraRows(torch.full((m,), -2), torch.ones(m, dtype=torch.long),
                                        torch.eye(m, dtype=torch.bool)), "extra token id(s) [-2"),
    "offset 0": (lambda m: garbage(m, offset=0), "extra position offset(s) [0] below 1"),
    "too many rows": (lambda m: garbage(m + 1), "5 extra rows, but its extra_rows() is 4"),
}


@pytest.mark.parametrize("sampling", [Sampling(), PLAIN], ids=["greedy", "sampled"])
@pytest.mark.parametrize("inner", ["chain", "tree"])
@pytest.mark.parametrize("key", list(MALFORMED))
def test_malformed_extra_rows_are_refused_naming_the_drafter(key: str, inner: str, sampling: Sampling) -> None:
    make, fragment = MALFORMED[key]
    drafter = WithExtra(NgramDrafter(branches=1 if inner == "chain" else 3), make)
    with pytest.raises(DraftError, match=re.escape(drafter.name)) as error:
        specdec.generate(_target("llama"), PROMPT, drafter=drafter, max_new_tokens=6, sampling=sampling, seed=0)
    assert fragment in str(error.value)


def test_extra_rows_need_a_declared_count() -> None:
    drafter = WithExtra(NgramDrafter(), garbage, declared=None)
    with pytest.raises(DraftError, match="with-extra.*it declares no extra_rows"):
        specdec.generate(_target("llama"), PROMPT, drafter=drafter, max_new_tokens=6)
    drafter = WithExtra(NgramDrafter(), garbage, declared=-1)
    with pytest.raises(DraftError, match=re.escape("'with-extra': extra_rows() must return an int >= 0, got -1")):
        specdec.generate(_target("llama"), PROMPT, drafter=drafter, max_new_tokens=6)


# --- a target that cannot run masks --------------------------------------------------------------------

@pytest.fixture
def float64_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(qwen3_next, "torch_chunk_gated_delta_rule", gated_delta_float64)
    monkeypatch.setattr(qwen3_next, "torch_recurrent_gated_delta_rule", gated_delta_float64)


def test_a_hybrid_target_drafts_from_the_pool_without_jacobi_rows_with_one_warning(float64_kernels: None) -> None:
    model = tiny_hybrid(vocab_size=VOCAB)
    lm = CausalLM(model)
    lm.reset(256)
    reason = lm.masked_obstacle  # it runs trees, each row on its parent's state, but no rows seeing several
    assert reason is not None and lm.tree_obstacle is None
    expected = hf_greedy(model, PROMPT, 16)
    drafter = Recording()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = specdec.generate(model, PROMPT, drafter=drafter, num_draft_tokens=3, max_new_tokens=16)
    ours = [w for w in caught if issubclass(w.category, UserWarning) and "extra rows" in str(w.message)]
    assert len(ours) == 1, [str(w.message) for w in caught]
    assert "lookahead" in str(ours[0].message) and reason in str(ours[0].message)
    assert ours[0].filename == __file__, "the warning points at the caller of generate"
    assert result.tokens == expected
    assert result.stats.drafted > 0, "the prompt's n-grams still draft"
    assert drafter.extra_logits and all(logits is None for logits in drafter.extra_logits)
    assert drafter.levels and len(drafter.levels) == 1, "without the rows' logits the branch stays as it was"
