"""Token trees through the decode loop: the tree forward, the accepted path kept in the cache,
greedy parity, chains given as trees, statistical losslessness, the chain fallback, the stats.

Float64 tiny models (sdpa attention), so a tree forward and the plain forwards of the same paths
agree to rounding and no argmax can flip between them. The chi-square tests reuse the enumerated
continuation law of test_lossless_statistical (V = 5, 3 new tokens, ALPHA = 1e-4, fixed seeds);
a deliberately lossy tree verifier patched into the loop must fail them.
"""

from __future__ import annotations

import functools
import importlib
import re
import warnings
from collections.abc import Callable
from typing import ClassVar

import pytest
import torch
from transformers import PreTrainedModel

from specdec.protocols import row_view
import specdec
from drafters_for_tests import (ChainAsTree, GarbageDrafter, OracleTreeDrafter, RandomQDrafter, RandomTreeDrafter,
                                TopKTreeDrafter, TreeRecorder)
from specdec import Sampling, Stats
from specdec.drafters import NgramDrafter
from specdec.protocols import DraftContext
from specdec.runtime.target import CausalLM
from specdec.trees import depths, first_path, path_to
from specdec.types import Draft
from specdec.verifier import DraftError
from test_greedy_parity import VOCAB, _target
from test_hybrid import tiny_mamba_hybrid
from test_lossless_statistical import (ALPHA, MODEL, PLAIN, PROMPT as STAT_PROMPT, TRUNCATED, chi_square_p_value,
                                       exact_distribution, sample_counts)
from test_verifier_tree import verify_tree_siblings_against_p, verify_tree_stale_bonus
from tiny import hf_greedy, tiny_model

PROMPT = [5, 9, 14, 22, 5, 9, 14, 22, 5, 9, 14]
NEW_TOKENS = 24
TREE_ARCHITECTURES = ("llama", "qwen3", "gpt2")
EXACT = dict(rtol=0.0, atol=1e-9)
# transformers' eager attention takes its softmax in float32 whatever the model's dtype, so a
# tree row and the plain run of its path (different key sets) agree to float32 rounding only
EAGER = dict(rtol=0.0, atol=1e-6)


@functools.lru_cache(maxsize=None)
def _reference(arch: str) -> tuple[int, ...]:
    return tuple(hf_greedy(_target(arch), PROMPT, NEW_TOKENS))


# --- the tree forward and keep_path -----------------------------------------------------------------

SHAPES = {
    "bushy": [-1, -1, 0, 0, 1, 2, 3, 3, 5],
    "chain": [-1, 0, 1, 2],
    "wide": [-1] * 6,
    "random-order": [-1, 0, -1, 2, 1, 0, 4, 3],
    "duplicate-siblings": [-1, -1, -1, 0, 0],  # tokens below make siblings equal
}


def fresh(model: PreTrainedModel, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits [T, V] and last hidden states [T, H] of one plain forward of `ids`."""
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([ids]), output_hidden_states=True)
    return out.logits[0], out.hidden_states[-1][0]


def tree_forward(lm: CausalLM, ids: list[int], parents: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits [n + 1, V] and hidden states [n + 1, H] of a tree forward, each row's logits asked
    for one at a time (`forward_tree` returns rows on demand)."""
    tree = lm.forward_tree(torch.tensor(ids), parents)
    rows = torch.stack([tree.row(r) for r in range(len(parents) + 1)])
    torch.testing.assert_close(tree.all(), rows, **EXACT)
    assert [tree.argmax(r) for r in range(len(parents) + 1)] == rows.argmax(-1).tolist()
    return rows, tree.hidden


def tree_tokens(name: str, n: int) -> list[int]:
    if name == "duplicate-siblings":
        return [7, 7, 7, 3, 3]
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(n)).tolist()


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("arch", TREE_ARCHITECTURES)
def test_forward_tree_rows_equal_each_path_run_as_a_sequence(arch: str, attention: str) -> None:
    model = _target(arch)
    original = model.config._attn_implementation
    model.set_attn_implementation(attention)
    close = EXACT if attention == "sdpa" else EAGER
    try:
        lm = CausalLM(model)
        for name, parents in SHAPES.items():
            tokens = tree_tokens(name, len(parents))
            lm.reset()
            with torch.inference_mode():
                lm.forward(torch.tensor(PROMPT[:-1]), keep=1)
                logits, hidden = tree_forward(lm, PROMPT[-1:] + tokens, parents)
            assert logits.shape == (len(parents) + 1, VOCAB) and hidden.shape[0] == len(parents) + 1
            assert lm.cache_length == len(PROMPT) + len(parents)
            for node in range(-1, len(parents)):
                ids = PROMPT + [tokens[i] for i in path_to(parents, node)]
                want_logits, want_hidden = fresh(model, ids)
                torch.testing.assert_close(logits[node + 1], want_logits[-1], **close,
                                           msg=lambda m: f"{arch}/{attention} {name}, node {node}: {m}")
                torch.testing.assert_close(hidden[node + 1], want_hidden[-1], **close)
    finally:
        model.set_attn_implementation(original)


# (shape, accepted path as node indices): nothing, a first child, a later sibling's branch, deep ones
KEPT_PATHS = [("bushy", []), ("bushy", [0]), ("bushy", [1, 4]), ("bushy", [0, 2, 5, 8]), ("bushy", [0, 3, 7]),
              ("chain", [0, 1, 2, 3]), ("wide", [5]), ("random-order", [2, 3, 7]), ("random-order", [0, 1, 4, 6]),
              ("duplicate-siblings", [1]), ("duplicate-siblings", [0, 4])]


@pytest.mark.parametrize("arch", TREE_ARCHITECTURES)
def test_keep_path_leaves_the_cache_of_a_fresh_chain_run(arch: str) -> None:
    model = _target(arch)
    lm = CausalLM(model)
    follow = [11, 40, 3]
    for name, path in KEPT_PATHS:
        parents = SHAPES[name]
        assert not path or path == path_to(parents, path[-1])
        tokens = tree_tokens(name, len(parents))
        lm.reset()
        with torch.inference_mode():
            lm.forward(torch.tensor(PROMPT[:-1]), keep=1)
            base = lm.cache_length
            tree_forward(lm, PROMPT[-1:] + tokens, parents)
            lm.keep_path(base, [0] + [node + 1 for node in path])
            assert lm.cache_length == base + 1 + len(path)
            # the next step: the last accepted token is not cached yet; feed it and three more
            accepted = [tokens[node] for node in path]
            logits, _ = lm.forward(torch.tensor(follow), keep=len(follow))
        want, _ = fresh(model, PROMPT + accepted + follow)
        torch.testing.assert_close(logits, want[-len(follow):], **EXACT,
                                   msg=lambda m: f"{arch} {name}, kept path {path}: {m}")


def test_two_tree_steps_in_a_row_stay_exact() -> None:
    """A tree, its path kept, then another tree on top: each row still equals its sequence."""
    model = _target("llama")
    lm = CausalLM(model)
    parents = SHAPES["bushy"]
    first, second = tree_tokens("bushy", 9), [30, 31, 32, 33, 34, 35, 36, 37, 38]
    lm.reset()
    with torch.inference_mode():
        lm.forward(torch.tensor(PROMPT[:-1]), keep=1)
        tree_forward(lm, PROMPT[-1:] + first, parents)
        lm.keep_path(len(PROMPT) - 1, [0, 2, 5])  # nodes 1, 4 accepted, then a correction 50
        logits, _ = tree_forward(lm, [50] + second, parents)
    committed = PROMPT + [first[1], first[4], 50]
    for node in range(-1, len(parents)):
        want, _ = fresh(model, committed + [second[i] for i in path_to(parents, node)])
        torch.testing.assert_close(logits[node + 1], want[-1], **EXACT)


# --- greedy parity ----------------------------------------------------------------------------------

def assert_tree_bookkeeping(stats: Stats, drafter: TreeRecorder, tokens: list[int]) -> None:
    """Stats count nodes and depths; ctx.accepted names the nodes whose tokens were committed."""
    trees = drafter.drafts
    assert stats.new_tokens == len(tokens) == stats.steps + stats.accepted
    assert stats.drafted == sum(int(d.tokens.shape[0]) for d in trees), "drafted counts tree nodes"
    reached = [max(depths(d.parents.tolist()), default=0) for d in trees]
    width = len(stats.drafted_per_position)
    assert list(stats.drafted_per_position) == [sum(r > i for r in reached) for i in range(width)], (
        "drafted_per_position[i] counts the steps whose tree reached depth i + 1")
    assert len(drafter.commits) == len(trees)
    lengths = [len(accepted) for _, accepted, _ in drafter.commits]
    assert sum(lengths) == stats.accepted
    assert list(stats.accepted_per_position) == [sum(n > i for n in lengths) for i in range(width)]
    for draft, accepted, committed in drafter.commits:
        parents = draft.parents.tolist()
        assert [int(draft.tokens[i]) for i in accepted] == committed, "ctx.accepted maps to other nodes"
        assert all(parents[node] == (accepted[i - 1] if i else -1) for i, node in enumerate(accepted)), (
            f"ctx.accepted {accepted} is not a root path of {parents}")


TREE_DRAFTERS: dict[str, Callable[[str], TreeRecorder]] = {
    "garbage-tree": lambda arch: RandomTreeDrafter(seed=3),
    "wide-garbage-tree": lambda arch: RandomTreeDrafter(seed=4, branching=5, max_nodes=20),
    "sampled-iid-tree": lambda arch: RandomTreeDrafter(seed=5, sampled=True),
    "oracle-tree": lambda arch: OracleTreeDrafter(list(PROMPT) + list(_reference(arch)), seed=6),
}


@pytest.mark.parametrize("k", [1, 4])
@pytest.mark.parametrize("key", list(TREE_DRAFTERS))
@pytest.mark.parametrize("arch", TREE_ARCHITECTURES)
def test_greedy_tree_output_equals_plain_greedy(arch: str, key: str, k: int) -> None:
    drafter = TREE_DRAFTERS[key](arch)
    result = specdec.generate(_target(arch), PROMPT, drafter=drafter, num_draft_tokens=k,
                              max_new_tokens=NEW_TOKENS, seed=0)
    assert result.tokens == list(_reference(arch)), f"{arch}, {key}, k={k}"
    assert_tree_bookkeeping(result.stats, drafter, result.tokens)
    assert result.stats.drafted > 0
    if key == "oracle-tree":
        assert result.stats.mean_accepted_length > 1
        assert result.stats.steps == -(-NEW_TOKENS // (k + 1)), "the true branch is accepted in full every step"


@pytest.mark.parametrize("sampling", [Sampling(), Sampling(temperature=1.0)], ids=["greedy", "sampled"])
def test_an_eos_inside_the_accepted_path_ends_the_run(sampling: Sampling) -> None:
    arch = "llama"
    reference = list(_reference(arch))
    eos = reference[6]  # first seen at new token 6: the second step's (5 tokens a step) second node
    assert reference.index(eos) == 6
    drafter = OracleTreeDrafter(list(PROMPT) + reference, seed=3, first=True)
    result = specdec.generate(_target(arch), PROMPT, drafter=drafter, num_draft_tokens=4, max_new_tokens=NEW_TOKENS,
                              eos_token_id=eos, sampling=sampling, seed=0)
    assert eos not in result.tokens[:-1]
    assert result.tokens[-1] == eos or len(result.tokens) == NEW_TOKENS
    if sampling.greedy:
        assert result.tokens == reference[:7]
        assert len(drafter.commits[-1][1]) == 2, "the EOS node ends the last commit"
        assert drafter.commits[-1][2] == reference[5:7]
        assert result.stats.accepted == 8, "nodes accepted past the EOS still count as accepted"
        assert result.stats.new_tokens == 7
    for draft, accepted, committed in drafter.commits:
        assert [int(draft.tokens[i]) for i in accepted] == committed


class EmptyTrees(TreeRecorder):
    """Every other step an empty tree (parents given, no nodes), else a random one."""

    name: ClassVar[str] = "empty-trees"

    def __init__(self) -> None:
        super().__init__()
        self.inner = RandomTreeDrafter(seed=8, sampled=True)
        self.inner.drafts = self.drafts
        self.count = 0

    def max_draft_nodes(self, k: int) -> int:
        return self.inner.max_draft_nodes(k)

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        self.count += 1
        if self.count % 2:
            empty = ctx.tokens[:0]
            return self._record(ctx, Draft(empty, torch.zeros(0, ctx.vocab_size, dtype=torch.float64), empty.clone()))
        self._length = int(ctx.tokens.shape[0])
        return self.inner.propose(ctx, k)


@pytest.mark.parametrize("sampling", [Sampling(), Sampling(temperature=1.0)], ids=["greedy", "sampled"])
def test_empty_trees_emit_one_token(sampling: Sampling) -> None:
    drafter = EmptyTrees()
    result = specdec.generate(_target("llama"), PROMPT, drafter=drafter, num_draft_tokens=3,
                              max_new_tokens=NEW_TOKENS, sampling=sampling, seed=0)
    assert len(result.tokens) == NEW_TOKENS
    if sampling.greedy:
        assert result.tokens == list(_reference("llama"))
    assert_tree_bookkeeping(result.stats, drafter, result.tokens)


def test_wide_trees_at_the_learned_position_limit() -> None:
    """gpt2 with exactly prompt + new positions: a tree's rows sit at depth positions, so a wide
    tree needs no positions past the limit even though its cache briefly holds more rows."""
    model = tiny_model("gpt2", vocab_size=VOCAB, seed=0, max_positions=len(PROMPT) + NEW_TOKENS)
    expected = hf_greedy(model, PROMPT, NEW_TOKENS)
    drafter = RandomTreeDrafter(seed=9, branching=6, max_nodes=30)
    result = specdec.generate(model, PROMPT, drafter=drafter, num_draft_tokens=4, max_new_tokens=NEW_TOKENS)
    assert result.tokens == expected
    assert max(len(d.tokens) for d in drafter.drafts) > 20


def test_oracle_branch_is_found_among_siblings() -> None:
    """The true branch sits at random sibling slots: accepted paths go through later siblings."""
    arch = "llama"
    drafter = OracleTreeDrafter(list(PROMPT) + list(_reference(arch)), seed=1, branches=4)
    result = specdec.generate(_target(arch), PROMPT, drafter=drafter, num_draft_tokens=3, max_new_tokens=NEW_TOKENS)
    assert result.tokens == list(_reference(arch))
    later = [accepted for draft, accepted, _ in drafter.commits if accepted != tuple(first_path(draft.parents.tolist()))
             [: len(accepted)]]
    assert later, "every accepted path was the first-child path: the sibling walk was never exercised"


class HiddenProbe:
    """Wraps a tree drafter, asking for the target's hidden states and recording what it gets."""

    name: ClassVar[str] = "hidden-probe"
    uses_hidden_states: ClassVar[bool] = True

    def __init__(self, inner: TreeRecorder) -> None:
        self.inner = row_view(inner)
        self.seen: list[tuple[list[int], torch.Tensor]] = []

    def max_draft_nodes(self, k: int) -> int:
        return self.inner.max_draft_nodes(k)  # type: ignore[attr-defined]

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        self.seen.append((ctx.tokens.tolist(), ctx.hidden_states.clone()))
        return self.inner.propose(ctx, k)

    def commit(self, ctx: DraftContext, num_accepted: int) -> None:
        self.seen.append((ctx.tokens.tolist(), ctx.hidden_states.clone()))
        self.inner.commit(ctx, num_accepted)


@pytest.mark.parametrize("inner", ["garbage-tree", "oracle-tree"])
@pytest.mark.parametrize("arch", TREE_ARCHITECTURES)
def test_hidden_states_after_a_tree_step_are_those_of_the_committed_path(arch: str, inner: str) -> None:
    """ctx.hidden_states: the rows of the positions processed since the last step, i.e. the root
    and the accepted nodes, gathered out of the tree forward."""
    probe = HiddenProbe(TREE_DRAFTERS[inner](arch))
    result = specdec.generate(_target(arch), PROMPT, drafter=probe, num_draft_tokens=3, max_new_tokens=12)
    assert result.tokens == list(_reference(arch))[:12]
    _, hidden = fresh(_target(arch), PROMPT + result.tokens)
    assert len(probe.seen) > 2
    if inner == "oracle-tree":
        assert any(states.shape[0] > 2 for _, states in probe.seen[1:]), "no long accepted path was checked"
    for tokens, states in probe.seen:
        n = states.shape[0]
        assert 1 <= n < len(tokens)
        torch.testing.assert_close(states, hidden[len(tokens) - 1 - n : len(tokens) - 1], **EXACT)


# --- a chain given as a tree ----------------------------------------------------------------------------

CHAIN_DRAFTERS: dict[str, Callable[[], object]] = {
    "garbage": lambda: GarbageDrafter(seed=2),
    "random-q": lambda: RandomQDrafter(seed=2),
    "ngram": lambda: NgramDrafter(max_ngram=3),
    "draft-model": lambda: specdec.make_drafter("draft-model", model=tiny_model("llama", vocab_size=VOCAB, seed=1,
                                                                                  layers=1)),
}


@pytest.mark.parametrize("key", list(CHAIN_DRAFTERS))
def test_chain_as_tree_matches_the_chain_exactly_at_greedy(key: str) -> None:
    """Same tokens, same counters. Only greedy is compared token for token: sampled chains draw
    k uniforms up front (verify_chain) while trees draw one per node tried, so after a rejection
    the two streams part; their laws are equal (test_verifier_tree: chain law test)."""
    model = _target("llama")
    chain = specdec.generate(model, PROMPT, drafter=CHAIN_DRAFTERS[key](), num_draft_tokens=4,
                             max_new_tokens=NEW_TOKENS, seed=0)
    tree = specdec.generate(model, PROMPT, drafter=ChainAsTree(CHAIN_DRAFTERS[key]()), num_draft_tokens=4,
                            max_new_tokens=NEW_TOKENS, seed=0)
    assert tree.tokens == chain.tokens == list(_reference("llama"))
    for field in ("steps", "new_tokens", "drafted", "accepted", "accepted_per_position", "drafted_per_position"):
        assert getattr(tree.stats, field) == getattr(chain.stats, field), field
    assert chain.stats.drafted > 0


# --- statistical losslessness (the enumerated law of test_lossless_statistical) -----------------------

RUNS = 600


@pytest.fixture(scope="module")
def stat_target() -> PreTrainedModel:
    return tiny_model(seed=0, **MODEL)


@pytest.fixture(scope="module")
def stat_other() -> PreTrainedModel:
    return tiny_model(seed=1, **MODEL)


def iid_tree(model: PreTrainedModel, other: PreTrainedModel) -> TreeRecorder:
    """i.i.d. siblings from random rows, three per parent, over V = 5: duplicates are frequent."""
    return RandomTreeDrafter(seed=12345, sampled=True, shared_rows=True, branching=3, max_nodes=12)


def topk_tree(model: PreTrainedModel, other: PreTrainedModel) -> TreeRecorder:
    return TopKTreeDrafter(other, branching=2)


STAT_DRAFTERS = {"iid-tree": iid_tree, "topk-tree": topk_tree}


def sibling_evidence(drafter: TreeRecorder) -> tuple[int, int]:
    """(trees with equal sibling tokens, accepted paths that left the first-child path)."""
    duplicates = 0
    for draft in drafter.drafts:
        parents, tokens = draft.parents.tolist(), draft.tokens.tolist()
        groups: dict[int, list[int]] = {}
        for node, parent in enumerate(parents):
            groups.setdefault(parent, []).append(tokens[node])
        duplicates += any(len(set(g)) < len(g) for g in groups.values())
    off_first = sum(accepted != tuple(first_path(d.parents.tolist()))[: len(accepted)] for d, accepted, _ in
                    drafter.commits)
    return duplicates, off_first


@pytest.mark.parametrize("sampling", [PLAIN, TRUNCATED], ids=["t1", "t0.7-k4-p0.9"])
@pytest.mark.parametrize("key", list(STAT_DRAFTERS))
def test_tree_continuations_match_plain_sampling(stat_target, stat_other, key: str, sampling: Sampling) -> None:
    drafter = STAT_DRAFTERS[key](stat_target, stat_other)
    counts, drafted, accepted, deep = sample_counts(stat_target, drafter, sampling, runs=RUNS)
    assert 0 < accepted < drafted and deep > 0, (drafted, accepted, deep)
    duplicates, off_first = sibling_evidence(drafter)
    assert off_first > 0, f"{key}: no accepted path went through a later sibling"
    if key == "iid-tree":
        assert duplicates > 0, "no tree had duplicate siblings: the case is vacuous"
    p_value = chi_square_p_value(counts, exact_distribution(stat_target, STAT_PROMPT, sampling))
    assert p_value >= ALPHA, f"{key} ({sampling}) is not lossless: chi-square p = {p_value:.3g}"


# De-duplicating i.i.d. siblings is lossy too, but only at second order (a duplicate changes the
# correction only when the first copy's residual keeps two tokens q also covers): on these peaked
# targets a few percent on one cell at best, which N = 600 cannot resolve at ALPHA = 1e-4. The
# closed form in test_verifier_tree shows it exactly (test_duplicate_iid_siblings_are_each_tried).
@pytest.mark.parametrize(("lossy", "key"), [
    pytest.param(verify_tree_stale_bonus, "iid-tree", id="stale-residual-bonus"),
    pytest.param(verify_tree_siblings_against_p, "topk-tree", id="siblings-against-p"),
])
def test_chi_square_detects_a_lossy_tree_verifier(stat_target, stat_other, monkeypatch, lossy, key: str) -> None:
    rules = importlib.import_module("specdec.verifier.rules")
    monkeypatch.setattr(rules, "verify_tree", lossy)  # whichever tree rule the run uses
    monkeypatch.setattr(rules, "verify_traversal", lossy)
    counts, drafted, _, _ = sample_counts(stat_target, STAT_DRAFTERS[key](stat_target, stat_other), PLAIN, runs=RUNS)
    assert drafted > 0
    p_value = chi_square_p_value(counts, exact_distribution(stat_target, STAT_PROMPT, PLAIN))
    assert p_value < ALPHA, f"{lossy.__name__} went undetected: p = {p_value:.3g}, N = {RUNS}"


# --- targets that cannot run a tree: the first-child chain, with one warning ---------------------------

FALLBACK_TARGETS = {
    "mamba2-hybrid-bamba": lambda: tiny_mamba_hybrid(vocab_size=VOCAB),
}
FALLBACK_REASONS = {"mamba2-hybrid-bamba": "dynamic cache"}


@pytest.mark.parametrize("drafter_key", ["oracle-first", "garbage-tree", "sampled-tree"])
@pytest.mark.parametrize("target_key", list(FALLBACK_TARGETS))
def test_untreeable_targets_verify_the_first_child_path_with_one_warning(target_key: str,
                                                                         drafter_key: str) -> None:
    model = FALLBACK_TARGETS[target_key]()
    lm = CausalLM(model)
    lm.reset(256)
    reason = lm.tree_obstacle
    assert reason is not None and FALLBACK_REASONS[target_key] in reason
    expected = hf_greedy(model, PROMPT, 16)
    drafter = {"oracle-first": lambda: OracleTreeDrafter(PROMPT + expected, seed=2, branches=3, first=True),
               "garbage-tree": lambda: RandomTreeDrafter(seed=2),
               "sampled-tree": lambda: RandomTreeDrafter(seed=2, sampled=True)}[drafter_key]()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = specdec.generate(model, PROMPT, drafter=drafter, num_draft_tokens=3, max_new_tokens=16)
    ours = [w for w in caught if issubclass(w.category, UserWarning) and "token trees" in str(w.message)]
    assert len(ours) == 1, [str(w.message) for w in caught]
    assert reason in str(ours[0].message) and drafter.name in str(ours[0].message)
    assert ours[0].filename == __file__, "the warning points at the caller of generate"
    assert result.tokens == expected
    assert len(drafter.commits) == len(drafter.drafts) > 0
    for draft, accepted, committed in drafter.commits:
        chain = first_path(draft.parents.tolist())
        assert accepted == tuple(chain[: len(accepted)]), f"{accepted} is not a prefix of the first path {chain}"
        assert [int(draft.tokens[i]) for i in accepted] == committed
    if drafter_key == "oracle-first":
        assert result.stats.mean_accepted_length > 1
        assert any(accepted != tuple(range(len(accepted))) for _, accepted, _ in drafter.commits), (
            "the first-child path was always nodes 0, 1, 2, ...: the mapping back was not exercised")
        # counters follow the verified chain, not the tree
        assert result.stats.drafted == sum(len(first_path(d.parents.tolist())) for d in drafter.drafts)


def test_fallback_warns_once_per_generate_call() -> None:
    model = FALLBACK_TARGETS["mamba2-hybrid-bamba"]()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for seed in range(2):
            specdec.generate(model, PROMPT, drafter=RandomTreeDrafter(seed=seed), num_draft_tokens=3, max_new_tokens=8)
    assert sum("token trees" in str(w.message) for w in caught) == 2


# --- stats for trees -------------------------------------------------------------------------------------

class FixedTree(TreeRecorder):
    """The same 7-node tree, 3 deep, every step (cut to depth k when the budget shrinks k):
    the greedy continuation on node 2's branch two deep, garbage elsewhere."""

    name: ClassVar[str] = "fixed-tree"
    PARENTS = [-1, -1, -1, 2, 2, 4, 0]  # depths 1, 1, 1, 2, 2, 3, 2

    def __init__(self, reference: list[int]) -> None:
        super().__init__()
        self.reference = reference

    def max_draft_nodes(self, k: int) -> int:
        return len(self.PARENTS)

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        truth = self.reference[ctx.tokens.shape[0] :] + [0, 0, 0]
        wrong = [(t + 1) % VOCAB for t in truth]
        tokens = [wrong[0], wrong[0], truth[0], wrong[1], truth[1], wrong[2], truth[1]]
        keep = [i for i, d in enumerate(depths(self.PARENTS)) if d <= k]
        index = {old: new for new, old in enumerate(keep)}
        parents = [index.get(self.PARENTS[i], -1) for i in keep]
        return self._record(ctx, Draft(torch.tensor([tokens[i] for i in keep]), None, torch.tensor(parents)))


def test_tree_stats_count_nodes_and_depths() -> None:
    model = _target("llama")
    reference = list(PROMPT) + list(_reference("llama"))
    drafter = FixedTree(reference)
    result = specdec.generate(model, PROMPT, drafter=drafter, num_draft_tokens=3, max_new_tokens=11)
    assert result.tokens == list(_reference("llama"))[:11]
    stats = result.stats
    # each full step accepts nodes 2 and 4, then emits the argmax (node 5 is wrong): 3 tokens;
    # after 9 the budget of 2 leaves k = 1, a tree cut to nodes 0, 1, 2: node 2 and the bonus
    assert [len(d.tokens) for d in drafter.drafts] == [7, 7, 7, 3]
    assert stats.steps == 4 and stats.accepted == 7
    assert stats.drafted == 24, "drafted counts every node"
    assert stats.drafted_per_position == (4, 3, 3), "steps whose tree reached depth 1, 2, 3"
    assert stats.accepted_per_position == (4, 3, 0)
    assert [accepted for _, accepted, _ in drafter.commits] == [(2, 4)] * 3 + [(2,)]
    assert_tree_bookkeeping(stats, drafter, result.tokens)


# --- the loop refuses broken trees ---------------------------------------------------------------------

class TooDeep:
    name: ClassVar[str] = "too-deep-tree"

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        return Draft(torch.zeros(k + 1, dtype=torch.long), None, torch.arange(-1, k))


class BadParent:
    name: ClassVar[str] = "bad-parent-tree"

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        return Draft(torch.zeros(2, dtype=torch.long), None, torch.tensor([-1, 1]))


@pytest.mark.parametrize("sampling", [Sampling(), Sampling(temperature=1.0)], ids=["greedy", "sampled"])
@pytest.mark.parametrize(("drafter", "fragment"), [(TooDeep(), "deep"), (BadParent(), "parents[1] = 1")])
def test_generate_refuses_broken_trees_naming_the_drafter(drafter: object, fragment: str, sampling: Sampling) -> None:
    with pytest.raises(DraftError, match=re.escape(drafter.name)) as error:
        specdec.generate(_target("llama"), PROMPT, drafter=drafter, num_draft_tokens=3, max_new_tokens=6,
                         sampling=sampling, seed=0)
    assert fragment in str(error.value)


def test_a_model_whose_layers_window_by_row_index_verifies_chains_only() -> None:
    """GPT-Neo's local layers apply their own window by row index, not by the rows' positions."""
    from transformers import GPTNeoConfig, GPTNeoForCausalLM

    torch.manual_seed(0)
    config = GPTNeoConfig(vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=4, window_size=4,
                          attention_types=[[["global", "local"], 1]], max_position_embeddings=256,
                          bos_token_id=None, eos_token_id=None)
    model = GPTNeoForCausalLM(config).to(torch.float64).eval()
    lm = CausalLM(model)
    lm.reset(256)
    assert lm.tree_obstacle is not None and "local attention" in lm.tree_obstacle
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = specdec.generate(model, PROMPT, drafter=RandomTreeDrafter(seed=2), num_draft_tokens=3,
                                  max_new_tokens=16)
    assert any("token trees" in str(w.message) for w in caught)
    assert result.tokens == hf_greedy(model, PROMPT, 16)
