"""Every verification rule is lossless to 1e-12, proven by exact enumeration, and the rules
relate as their papers say; planted bugs in each rule are caught.

Rules (`specdec.verifier`): token-wise chains (`verify_chain`), block chains (`verify_block`),
SpecInfer's sibling residual over trees (`verify_tree`), traversal verification of trees
(`verify_traversal`), and both tree rules over siblings drawn without replacement, each tested
against the q it was drawn from given its elder siblings (`sibling_rows`).

The harness (`test_verifier_tree`): float64 models over 3-5 tokens whose p and q depend on the
whole prefix, with exact zeros, ties, one-hot rows and q = p (zero residual mass); the real
verifier's law is enumerated with scripted draws over every draft the drafter can make, and the
emitted tokens extended by plain sampling must give the target's law of the first L tokens.
Further cases: an end token that absorbs (the draft may run past it, inside a block), and a
drafter whose q puts mass on ids the target rules out.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import pytest
import torch

from specdec.trees import chain_parents, children
from specdec.types import Verdict
from specdec.verifier import verify_block, verify_chain, verify_traversal, verify_tree
from specdec.verifier.siblings import sibling_fault, sibling_rows
from test_verifier_tree import (TRUNCATED, ConcreteDraft, PrefixModel, exact_law, lossless_error,
                                marginal_verifier_law, prefixes_of, sample_draft, target_rows)

EXACT = 1e-12
Law = dict[tuple[tuple[int, ...], tuple[int, ...]], float]


def chain_rule(verify: Callable[..., Verdict]) -> Callable[..., Verdict]:
    """A chain rule in the tree verifier's signature (the harness's)."""
    return lambda p, tokens, parents, q, generator: verify(p, tokens, q, generator)


CHAIN_RULES = {"token": chain_rule(verify_chain), "block": chain_rule(verify_block),
               "sibling": verify_tree, "traversal": verify_traversal}
TREE_RULES = {"sibling": verify_tree, "traversal": verify_traversal}

# Trees up to 6 nodes: bushy roots, deep branches, siblings under siblings, in draft orders that are
# not breadth-first.
TREES = [[-1, -1], [-1, 0, -1], [-1, -1, 0, 1], [-1, 0, 0, 1], [-1, 0, 1, -1, 3], [-1, -1, -1, 0, 0],
         [-1, 0, -1, 2, 1, 0], [-1, -1, 0, 2, 0, 1]]


class EndToken(PrefixModel):
    """A PrefixModel whose last id ends the text: after it the target emits only it (the loop
    stops at the first; an absorbing end token is the same law), the drafter drafts on anyway."""

    def p(self, prefix: tuple[int, ...]) -> tuple[float, ...]:
        end = self.vocab - 1
        if end in prefix:
            return tuple(1.0 if t == end else 0.0 for t in range(self.vocab))
        row = list(super().p(prefix))
        row[end] += 0.3  # the end is likely, so blocks hold it often
        total = sum(row)
        return tuple(x / total for x in row)


def assert_exact(model: PrefixModel, law: Law, length: int, context: str) -> None:
    error = lossless_error(model, law, length)
    assert error <= EXACT, f"{context}: the first {length} tokens' law is off by {error:.3g}"


def expected_accepted(law: Law) -> float:
    return sum(w * len(path) for (path, _), w in law.items())


def depth(parents: Sequence[int]) -> int:
    out = [0] * len(parents)
    for i, parent in enumerate(parents):
        out[i] = 1 if parent < 0 else out[parent] + 1
    return max(out, default=0)


# --- every rule, lossless to 1e-12 ----------------------------------------------------------------

@pytest.mark.parametrize("rule", list(CHAIN_RULES))
@pytest.mark.parametrize("mode", ["shared", "mixed", "top"])
@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_every_rule_is_exact_on_chains(rule: str, mode: str, k: int) -> None:
    parents = chain_parents(k)
    for seed in range(3 if k < 4 else 1):
        models = [PrefixModel(seed, 3), PrefixModel(seed + 10, 4, TRUNCATED), EndToken(seed + 20, 3)]
        if k <= 2:
            models.append(PrefixModel(seed + 30, 5))  # the widest vocabulary, where the enumeration stays small
        for model in models:
            law = marginal_verifier_law(CHAIN_RULES[rule], model, parents, mode)
            assert_exact(model, law, k + 1, f"{rule}, {mode}, k {k}, {model!r}")


@pytest.mark.parametrize("rule", list(TREE_RULES))
@pytest.mark.parametrize("mode", ["shared", "per-sibling", "mixed", "top", "arbitrary"])
def test_tree_rules_are_exact(rule: str, mode: str) -> None:
    for i, parents in enumerate(TREES):
        vocab = 3 if len(parents) > 4 or mode in ("shared", "per-sibling") else 4
        model = (EndToken if i % 3 == 2 else PrefixModel)(100 + i, vocab, TRUNCATED if i % 2 else None)
        law = marginal_verifier_law(TREE_RULES[rule], model, parents, mode)
        assert_exact(model, law, depth(parents) + 1, f"{rule}, {mode}, parents {parents}")


# --- siblings drawn without replacement ---------------------------------------------------------

class FullSupport(PrefixModel):
    """Draft rows with every token possible, so that a node's siblings can always be drawn
    without replacement (the drafter's row mixed with the uniform)."""

    def q(self, prefix: tuple[int, ...], slot: int) -> tuple[float, ...]:
        row = super().q(prefix, 0)
        return tuple(0.7 * x + 0.3 / self.vocab for x in row)


def without_replacement_drafts(model: PrefixModel, parents: Sequence[int]
                               ) -> Iterator[tuple[float, ConcreteDraft]]:
    """Every draft whose siblings are successive draws without replacement from the shared row
    q(prefix, 0), with its probability; each node reports the shared row, as declared."""
    order = children(parents)

    def extend(i: int, tokens: tuple[int, ...], weight: float) -> Iterator[tuple[float, ConcreteDraft]]:
        if i == len(parents):
            prefixes = prefixes_of(parents, tokens)
            rows = tuple(model.q(prefixes[node], 0) for node in range(len(parents)))
            yield weight, ConcreteDraft(tokens, rows)
            return
        prefix = prefixes_of(parents[:i], tokens)[parents[i]] + (tokens[parents[i]],) if parents[i] >= 0 else ()
        row = list(model.q(prefix, 0))
        for elder in order[parents[i] + 1]:
            if elder < i:
                row[tokens[elder]] = 0.0
        total = sum(row)
        for token, w in enumerate(row):
            if w > 0:
                yield from extend(i + 1, tokens + (token,), weight * w / total)

    yield from extend(0, (), 1.0)


def without_replacement_law(verify: Callable[..., Verdict], model: PrefixModel, parents: Sequence[int],
                            declared: str) -> Law:
    law: defaultdict = defaultdict(float)
    for weight, draft in without_replacement_drafts(model, parents):
        tokens, q = draft.tensors(model.vocab)
        rows = sibling_rows(q, draft.tokens, parents, declared)
        p = target_rows(model, parents, draft.tokens)
        for key, w in exact_law(lambda: verify(p, tokens, list(parents), rows, None)).items():
            law[key] += weight * w
    return dict(law)


WOR_TREES = [[-1, -1], [-1, -1, -1], [-1, -1, 0, 0], [-1, 0, -1, 0, 2], [-1, -1, -1, 1, 1]]


@pytest.mark.parametrize("rule", list(TREE_RULES))
def test_siblings_drawn_without_replacement_are_exact(rule: str) -> None:
    for i, parents in enumerate(WOR_TREES):
        model = FullSupport(200 + i, 3 if len(parents) > 3 else 4, TRUNCATED if i % 2 else None)
        law = without_replacement_law(TREE_RULES[rule], model, parents, "without_replacement")
        assert_exact(model, law, depth(parents) + 1, f"{rule}, parents {parents}")


@pytest.mark.parametrize("rule", list(TREE_RULES))
def test_a_wrong_declaration_is_caught_by_the_enumeration(rule: str) -> None:
    """Siblings drawn without replacement but verified as i.i.d. draws from the shared row: lossy."""
    errors = []
    for i, parents in enumerate(WOR_TREES):
        model = FullSupport(200 + i, 3 if len(parents) > 3 else 4)
        errors.append(lossless_error(model, without_replacement_law(TREE_RULES[rule], model, parents, "iid"),
                                     depth(parents) + 1))
    assert max(errors) > 1e-3, f"the wrong declaration went unnoticed: errors {errors}"


def test_conditional_rows_remove_the_elder_siblings() -> None:
    shared = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    probs = shared.repeat(4, 1)
    rows = sibling_rows(probs, [3, 1, 0, 2], [-1, -1, 0, -1], "without_replacement")
    torch.testing.assert_close(rows[0], shared)
    torch.testing.assert_close(rows[1], torch.tensor([1, 2, 3, 0], dtype=torch.float64) / 6)
    torch.testing.assert_close(rows[2], shared)  # the only child of node 0
    torch.testing.assert_close(rows[3], torch.tensor([1, 0, 3, 0], dtype=torch.float64) / 4)
    assert sibling_rows(probs, [3, 1, 0, 2], [-1, -1, 0, -1], "iid") is probs


@pytest.mark.parametrize(("siblings", "tokens", "probs", "says"), [
    ("without_replacement", [1, 1], True, "same token 1"),
    ("without_replacement", [1, 2], "different", "different rows"),
    ("distinct", [1, 2], True, "reports probs"),
    ("iid", [1, 2], False, "no probs"),
    ("without_replacement", [1, 2], False, "no probs"),
    ("sorted", [1, 2], True, "not one of"),
])
def test_declarations_a_draft_breaks_are_named(siblings: str, tokens: list[int], probs: object, says: str) -> None:
    rows = None
    if probs:
        rows = torch.full((2, 3), 1 / 3, dtype=torch.float64)
        if probs == "different":
            rows[1] = torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64)
    fault = sibling_fault(siblings, tokens, [-1, -1], rows)
    assert fault is not None and says in fault


def test_declarations_that_hold_pass() -> None:
    rows = torch.full((3, 3), 1 / 3, dtype=torch.float64)
    assert sibling_fault("iid", [1, 1, 0], [-1, -1, 0], rows) is None
    assert sibling_fault("without_replacement", [1, 2, 1], [-1, -1, 0], rows) is None
    assert sibling_fault("distinct", [1, 2, 1], [-1, -1, 0], None) is None
    assert sibling_fault(None, [1, 1], [-1, -1], rows) is None and sibling_fault(None, [1, 2], [-1, -1], None) is None


# --- how the rules relate -------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["shared", "mixed", "top"])
def test_traversal_on_a_chain_has_the_law_of_block(mode: str) -> None:
    for k, seed in itertools.product([1, 2, 3], range(3)):
        model = PrefixModel(300 + seed, 3, TRUNCATED if seed else None)
        parents = chain_parents(k)
        traversal = marginal_verifier_law(verify_traversal, model, parents, mode)
        block = marginal_verifier_law(CHAIN_RULES["block"], model, parents, mode)
        keys = set(traversal) | set(block)
        worst = max(abs(traversal.get(key, 0.0) - block.get(key, 0.0)) for key in keys)
        assert worst <= EXACT, f"{mode}, k {k}, seed {seed}: traversal and block differ by {worst:.3g}"


@pytest.mark.parametrize("mode", ["shared", "per-sibling", "mixed", "top"])
def test_traversal_on_a_depth_one_tree_is_the_sibling_rule_draw_for_draw(mode: str) -> None:
    rng = np.random.default_rng(7)
    for width, seed in itertools.product([1, 2, 3, 4], range(4)):
        model = PrefixModel(400 + seed, 4, TRUNCATED if seed % 2 else None)
        parents = [-1] * width
        draft = sample_draft(model, parents, mode, rng)
        tokens, q = draft.tensors(model.vocab)
        p = target_rows(model, parents, draft.tokens)
        for draw in range(5):
            a = verify_tree(p, tokens, parents, q, torch.Generator().manual_seed(draw))
            b = verify_traversal(p, tokens, parents, q, torch.Generator().manual_seed(draw))
            assert a.tokens.tolist() == b.tokens.tolist() and a.path == b.path
            torch.testing.assert_close(a.acceptance, b.acceptance, rtol=0, atol=0)


@pytest.mark.parametrize("mode", ["shared", "per-sibling", "mixed"])
def test_block_and_traversal_never_keep_less(mode: str) -> None:
    """E[accepted]: block >= token-wise on chains; traversal >= the sibling rule on these trees
    (both reduce to their counterpart on one-hot q, where they keep the same)."""
    for i, parents in enumerate(TREES[:6]):
        model = PrefixModel(500 + i, 3, TRUNCATED if i % 2 else None)
        sibling = expected_accepted(marginal_verifier_law(verify_tree, model, parents, mode))
        traversal = expected_accepted(marginal_verifier_law(verify_traversal, model, parents, mode))
        assert traversal >= sibling - EXACT, f"{mode}, parents {parents}: {traversal} < {sibling}"
    for k in (1, 2, 3):
        model = PrefixModel(600 + k, 3)
        token = expected_accepted(marginal_verifier_law(CHAIN_RULES["token"], model, chain_parents(k), mode))
        block = expected_accepted(marginal_verifier_law(CHAIN_RULES["block"], model, chain_parents(k), mode))
        assert block >= token - EXACT
        if k == 1:
            assert block == pytest.approx(token, abs=EXACT)


def test_one_hot_candidates_keep_the_same_under_every_tree_rule() -> None:
    for i, parents in enumerate(TREES):
        model = PrefixModel(700 + i, 3)
        for mode in ("top", "arbitrary"):
            sibling = expected_accepted(marginal_verifier_law(verify_tree, model, parents, mode))
            traversal = expected_accepted(marginal_verifier_law(verify_traversal, model, parents, mode))
            assert traversal >= sibling - EXACT, f"{mode}, parents {parents}"


def test_greedy_rows_make_every_rule_emit_the_argmax_path() -> None:
    """At temperature 0 p is one-hot at the argmax: every rule keeps the longest draft prefix
    that follows the argmax and emits the argmax after it."""
    vocab, k = 4, 4
    generator = torch.Generator().manual_seed(0)
    for trial in range(30):
        argmax = torch.randint(vocab, (k + 1,), generator=generator)
        p = torch.nn.functional.one_hot(argmax, vocab).to(torch.float64)  # (k + 1, V)
        drafted = torch.where(torch.rand(k, generator=generator) < 0.7, argmax[:k], torch.randint(vocab, (k,)))
        q = torch.softmax(torch.randn(k, vocab, generator=generator, dtype=torch.float64), -1)
        matches = int((drafted == argmax[:k]).long().cumprod(0).sum())
        for name, rule in CHAIN_RULES.items():
            for rows in (q, None):
                verdict = rule(p, drafted, chain_parents(k), rows, generator)
                assert verdict.num_accepted == matches, f"{name}, trial {trial}"
                assert verdict.tokens.tolist() == argmax[: matches + 1].tolist()


# --- planted bugs -----------------------------------------------------------------------------------

def test_a_traversal_with_a_stale_row_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Traversal that keeps the node's p row after a child's subtree failed (no residual) is lossy."""
    import specdec.verifier.traversal as traversal
    monkeypatch.setattr(traversal, "normalized_residual", lambda residual, fallback: fallback)
    errors = []
    for i, parents in enumerate(TREES[:5]):
        model = PrefixModel(800 + i, 3)
        errors.append(lossless_error(model, marginal_verifier_law(verify_traversal, model, parents, "shared"),
                                     depth(parents) + 1))
    assert max(errors) > 1e-3, f"a stale row went unnoticed: errors {errors}"



def test_an_empty_draft_emits_the_targets_next_token_under_every_rule() -> None:
    """A drafter that drafts nothing this step (a ragged batch row, the budget's end): the token
    comes from p at the root, whatever the rule."""
    p = torch.tensor([[0.1, 0.0, 0.6, 0.3]], dtype=torch.float64)
    empty = torch.zeros(0, dtype=torch.long)
    for name, rule in CHAIN_RULES.items():
        law = exact_law(lambda: rule(p, empty, [], None, None))
        assert law == pytest.approx({((), (0,)): 0.1, ((), (2,)): 0.6, ((), (3,)): 0.3}, abs=EXACT), name


# --- the expected number kept, exactly, per rule ---------------------------------------------------

@pytest.mark.parametrize(("rule", "verify", "tree"), [("token", CHAIN_RULES["token"], False),
                                                     ("block", CHAIN_RULES["block"], False),
                                                     ("token", verify_tree, True),
                                                     ("traversal", verify_traversal, True)])
def test_expected_accepted_is_the_mean_of_the_rules_enumerated_law(rule: str, verify: Callable[..., Verdict],
                                                                  tree: bool) -> None:
    """`expected_accepted` on one fixed draft equals the mean number kept under the rule's exact law."""
    from specdec.verifier import expected_accepted as expected_of_rule

    rng = np.random.default_rng(11)
    shapes = TREES if tree else [chain_parents(k) for k in (1, 2, 3, 4)]
    for i, parents in enumerate(shapes):
        for mode in ("shared", "mixed", "top"):
            model = PrefixModel(1000 + i, 3, TRUNCATED if i % 2 else None)
            draft = sample_draft(model, parents, mode, rng)
            tokens, q = draft.tensors(model.vocab)
            p = target_rows(model, parents, draft.tokens)
            law = exact_law(lambda: verify(p, tokens, list(parents), q, None))
            got = expected_of_rule(rule, p, tokens, list(parents) if tree else None, q)
            assert got == pytest.approx(expected_accepted(law), abs=EXACT), f"{rule}, {mode}, parents {parents}"
