"""Dynamic trees of i.i.d. sampled siblings (`grow_sampled_tree`), the temperature > 0 mode of
the eagle, mtp and draft-model tree drafters: their shape, their q rows, and whole
continuations through `specdec.generate` matching plain sampling's enumerated law."""

from __future__ import annotations


import pytest
import torch
from test_lossless_statistical import (ALPHA, MODEL, PLAIN, PROMPT, TRUNCATED, chi_square_p_value, exact_distribution,
                                       sample_counts)
from tiny import tiny_model

import specdec
from specdec.drafters import DraftModelDrafter
from specdec.drafters.tree_search.dynamic import DynamicTree, grow, grow_sampled_tree
from specdec.sampling import probabilities
from specdec.trees import depths
from specdec.types import Sampling


def _table(seed: int = 0, vocab: int = 30) -> torch.Tensor:
    return torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(seed)) * 2  # logits by last token


def _grow(settings: DynamicTree, k: int, sampling: Sampling, seed: int = 0):
    table = _table()
    seen: list[list[int]] = []

    def expand(search, nodes):
        seen.append(list(nodes))
        return table[torch.tensor([search.tokens[n] for n in nodes])]

    draft, kept = grow_sampled_tree(table[3], expand, settings, k, sampling, torch.Generator().manual_seed(seed))
    return draft, kept, seen, table


@pytest.mark.parametrize(("top_k", "total", "k"), [(4, 16, 4), (3, 10, 5), (2, 7, 3), (1, 4, 4), (8, 64, 4)])
def test_the_node_budget_is_split_over_the_levels_and_nothing_drawn_is_dropped(top_k: int, total: int, k: int):
    sampling = Sampling(temperature=0.8, top_p=0.95)
    draft, kept, seen, table = _grow(DynamicTree(top_k=top_k, total_tokens=total), k, sampling)
    parents = draft.parents.tolist()
    n = len(parents)
    assert kept == list(range(n)) and n <= total
    assert max(depths(parents)) <= k
    assert all(parent < i for i, parent in enumerate(parents))
    expanded = {node for level in seen for node in level}
    for node in expanded:  # every expanded node kept all its draws
        assert parents.count(node) >= 1
    assert {p for p in parents if p >= 0} <= expanded
    # each node's q row is the processed distribution at its parent, and it could have been drawn
    tokens = draft.tokens.tolist()
    for i, parent in enumerate(parents):
        context = 3 if parent < 0 else tokens[parent]
        assert torch.equal(draft.probs[i], probabilities(table[context], sampling))
        assert draft.probs[i, tokens[i]] > 0


def test_levels_share_the_budget_so_the_tree_reaches_the_full_depth():
    draft, _, _, _ = _grow(DynamicTree(top_k=4, total_tokens=16), 4, Sampling(temperature=1.0))
    levels = depths(draft.parents.tolist())
    assert [levels.count(d) for d in (1, 2, 3, 4)] == [4, 4, 4, 4]


def test_greedy_or_unsampled_drafters_keep_the_top_k_tree():
    table = _table()

    def expand(search, nodes):
        return table[torch.tensor([search.tokens[n] for n in nodes])]

    generator = torch.Generator().manual_seed(0)
    for sampling, sampled in ((Sampling(), True), (Sampling(temperature=0.7), False)):
        draft, _ = grow(table[3], expand, DynamicTree(), 4, sampling, generator, sampled=sampled)
        assert draft.probs is None  # deterministic candidates
    draft, _ = grow(table[3], expand, DynamicTree(), 4, Sampling(temperature=0.7), generator, sampled=True)
    assert draft.probs is not None


@pytest.fixture(scope="module")
def target():
    return tiny_model(seed=0, **MODEL)


@pytest.fixture(scope="module")
def other_model():
    return tiny_model(seed=1, **MODEL)


@pytest.mark.parametrize("sampling", [PLAIN, TRUNCATED], ids=["t1", "t0.7-k4-p0.9"])
def test_sampled_draft_model_trees_give_plain_samplings_law(target, other_model, sampling: Sampling):
    drafter = DraftModelDrafter(other_model, tree=True, top_k=3, total_tokens=6)
    counts, drafted, accepted, deep = sample_counts(target, drafter, sampling)
    assert accepted > 0 and deep > 0 and accepted < drafted, (drafted, accepted, deep)
    p_value = chi_square_p_value(counts, exact_distribution(target, PROMPT, sampling))
    assert p_value >= ALPHA, f"sampled draft-model trees ({sampling}) are not lossless: p = {p_value:.3g}"


def test_sampled_trees_hold_duplicate_siblings_and_stay_exact_when_the_drafter_is_the_target(target):
    drafter = DraftModelDrafter(target, tree=True, top_k=3, total_tokens=6, siblings="iid")  # q == p
    counts, drafted, accepted, _ = sample_counts(target, drafter, PLAIN, runs=400)
    assert accepted > 0
    p_value = chi_square_p_value(counts, exact_distribution(target, PROMPT, PLAIN))
    assert p_value >= ALPHA, f"q == p sampled trees are not lossless: p = {p_value:.3g}"


def test_a_drafter_equal_to_the_target_has_its_first_sampled_sibling_accepted_every_time(target):
    """With q == p each sampled child is accepted with min(1, p/q) = 1: every step goes k deep."""
    drafter = DraftModelDrafter(target, tree=True, top_k=3, total_tokens=9)
    runs = [specdec.generate(target, PROMPT, drafter=drafter, num_draft_tokens=3, max_new_tokens=30,
                             sampling=PLAIN, seed=seed).stats for seed in range(5)]
    assert all(r.accepted_per_position[:3] == r.drafted_per_position[:3] for r in runs)
    assert sum(r.new_tokens for r in runs) / sum(r.steps for r in runs) > 3.5


class CheckedDraftModel(DraftModelDrafter):
    """After every commit, the draft model's cache must predict exactly what a fresh forward
    over the committed tokens predicts (the accepted path was gathered into place)."""

    def commit(self, rows, accepted):
        super().commit(rows, accepted)
        tokens = rows[0].tokens
        lm = self._forms.rows[0].lm  # row 0's draft-model cache
        cached = lm.cache_length
        assert cached <= tokens.shape[0] - 1
        logits, _ = lm.forward(tokens[cached:], keep=1)
        lm.rollback(cached)
        fresh = lm.model(input_ids=tokens[None]).logits[0, -1]
        assert torch.allclose(logits[0], fresh, atol=1e-9), "the draft model's cache drifted from its tokens"


@pytest.mark.parametrize("sampling", [Sampling(), PLAIN], ids=["greedy", "t1"])
def test_the_draft_models_cache_holds_exactly_the_committed_tokens_after_tree_steps(target, other_model,
                                                                                  sampling: Sampling):
    drafter = CheckedDraftModel(other_model, tree=True, top_k=3, total_tokens=9)
    result = specdec.generate(target, PROMPT, drafter=drafter, num_draft_tokens=3, max_new_tokens=24,
                              sampling=sampling, seed=3)
    assert result.stats.accepted > 0 and len(result.tokens) == 24
