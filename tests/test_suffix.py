"""The suffix drafter (SuffixDecoding): its tries' counts against brute force, its best-first
speculation, the global trie across generate calls and its memory bound, option errors,
greedy parity on the tiny architectures and chi-square losslessness at temperature > 0."""

from __future__ import annotations

import functools
import re
from collections import Counter

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from transformers import PreTrainedModel

import specdec
from specdec import Draft, DraftContext, Sampling
from specdec.protocols import RowView
from specdec.drafters.model_free.suffix import SuffixDrafter
from specdec.drafters.model_free.suffix_trie import OutputMemory, SuffixTrie, speculate
from specdec.trees import chain_parents, children, depths, first_path, path_to
from test_lossless_statistical import (ALPHA, MODEL, PLAIN, PROMPT as SHORT_PROMPT, TRUNCATED, chi_square_p_value,
                                       exact_distribution)
from tiny import ARCHITECTURES, hf_greedy, tiny_model

VOCAB = 64
PROMPT = [5, 9, 14, 22, 5, 9, 14, 22, 5, 9, 14]  # repetitive: the prompt's trie drafts from step one
NEW_TOKENS = 24


def substring_counts(sequences: list[list[int]], max_depth: int) -> Counter[tuple[int, ...]]:
    """Occurrences of every substring of 1..max_depth tokens, by brute force."""
    counts: Counter[tuple[int, ...]] = Counter()
    for ids in sequences:
        for start in range(len(ids)):
            for end in range(start + 1, min(len(ids), start + max_depth) + 1):
                counts[tuple(ids[start:end])] += 1
    return counts


def assert_trie_equals_brute_force(trie: SuffixTrie, sequences: list[list[int]]) -> None:
    """Every node's count is its string's occurrences, its total the sum of its children's."""
    expected = substring_counts(sequences, trie.max_depth)
    assert trie.nodes == len(expected), f"{trie.nodes} nodes for {len(expected)} distinct substrings"
    assert trie.count([]) == sum(len(ids) for ids in sequences)
    for string, count in expected.items():
        assert trie.count(string) == count, f"count of {string}: {trie.count(string)}, expected {count}"
        node = trie.find(string)
        assert node.total == sum(child.count for child in (node.children or {}).values())


def context(tokens: list[int]) -> DraftContext:
    return DraftContext(torch.tensor(tokens), Sampling(), torch.Generator(), None, VOCAB)  # no target needed


# --- the tries ---------------------------------------------------------------------------------

def test_counts_and_probabilities_of_a_hand_made_sequence():
    trie = SuffixTrie(max_depth=3)
    trie.extend(trie.start(), [1, 2, 3, 1, 2, 4, 1, 2, 3])
    assert trie.count([1, 2]) == 3 and trie.count([2, 3]) == 2 and trie.count([1, 2, 3]) == 2
    assert trie.continuations([1, 2]) == {3: 2 / 3, 4: 1 / 3}
    assert trie.continuations([1, 2, 3]) == {}, "depth 3 is the limit: nothing deeper is counted"
    assert trie.continuations([2, 3]) == {1: 1.0}, "the last occurrence has no continuation and does not count"
    assert trie.find([1, 2, 3, 1]) is None


@given(ids=st.lists(st.integers(0, 3), min_size=0, max_size=40),
       chunks=st.lists(st.integers(1, 7), min_size=1, max_size=10), max_depth=st.integers(1, 6))
def test_trie_fed_in_chunks_counts_every_substring(ids, chunks, max_depth):
    trie = SuffixTrie(max_depth)
    active, position = trie.start(), 0
    for size in chunks + [len(ids)]:
        active = trie.extend(active, ids[position : position + size])
        position = min(len(ids), position + size)
        assert_trie_equals_brute_force(trie, [ids[:position]])


@given(outputs=st.lists(st.lists(st.integers(0, 3), min_size=0, max_size=12), min_size=1, max_size=12),
       bound=st.integers(0, 40))
def test_memory_holds_exactly_its_latest_outputs_within_the_bound(outputs, bound):
    memory = OutputMemory(max_depth=3, max_nodes=bound)
    for output in outputs:
        kept = memory.add(output)
        assert memory.trie.nodes <= bound
        assert_trie_equals_brute_force(memory.trie, list(memory.outputs))
        if kept < len(output):  # it alone outgrew the bound: everything older was evicted first
            assert list(memory.outputs) == ([output[:kept]] if kept else [])
        elif output:
            assert memory.outputs[-1] == output


def test_a_long_stream_of_outputs_forgets_the_oldest_and_never_passes_the_bound():
    drafter = SuffixDrafter(max_depth=4, max_match=2, max_global_nodes=200)
    trie = drafter.memory.trie
    sizes: list[int] = []
    append = trie.append

    def checked(active, token):  # the bound holds after every single token, not only per output
        new = append(active, token)
        sizes.append(trie.nodes)
        assert trie.nodes <= 200
        return new

    trie.append = checked
    generator = torch.Generator().manual_seed(0)
    stream = [torch.randint(0, 30, (20,), generator=generator).tolist() for _ in range(60)]
    stream[0] = [60, 61, 62, 63] + stream[0][4:]  # ids only the first output holds
    for output in stream:
        assert drafter.remember(output) == len(output)
    assert max(sizes) > 150, "the stream must fill the memory, or the bound is not exercised"
    assert trie.count([60, 61]) == 0 and stream[0] not in drafter.memory.outputs, "the oldest output is forgotten"
    assert list(drafter.memory.outputs)[-1] == stream[-1] and trie.count(stream[-1][:4]) >= 1
    assert_trie_equals_brute_force(trie, list(drafter.memory.outputs))


def test_an_output_larger_than_the_bound_keeps_its_first_tokens():
    memory = OutputMemory(max_depth=3, max_nodes=10)
    assert memory.add([0, 1, 2, 3, 4, 5, 6, 7]) == 4  # 1 + 2 + 3 + 3 nodes; a fifth token could add 3
    assert memory.trie.nodes <= 10 and list(memory.outputs) == [[0, 1, 2, 3]]


# --- speculation -------------------------------------------------------------------------------

def test_best_first_tree_and_most_frequent_path_on_a_hand_made_trie():
    trie = SuffixTrie(max_depth=6)
    trie.extend(trie.start(), [1, 2, 3, 1, 2, 4, 1, 2, 3])
    node = trie.find([1, 2])  # children 3 (2/3), 4 (1/3); after either, 1 surely follows
    tree = speculate(node, depth=2, budget=8, min_prob=0.1, tree=True)
    assert (tree.tokens, tree.parents) == ([3, 4, 1, 1], [-1, -1, 0, 1])
    assert tree.score == pytest.approx(2 / 3 + 1 / 3 + 2 / 3 + 1 / 3)
    assert speculate(node, depth=2, budget=3, min_prob=0.1, tree=True).tokens == [3, 4, 1], "best first: 3 1 before 4 1"
    assert speculate(node, depth=2, budget=8, min_prob=0.5, tree=True).tokens == [3, 1]
    chain = speculate(node, depth=8, budget=8, min_prob=0.1, tree=False)
    assert (chain.tokens, chain.parents) == ([3, 1, 2, 4], [-1, 0, 1, 2]), "max_depth 6 = the match's 2 + 4 tokens"
    assert chain.score == pytest.approx(4 * 2 / 3)


@given(ids=st.lists(st.integers(0, 4), min_size=2, max_size=60), match=st.integers(1, 3),
       depth=st.integers(1, 5), budget=st.integers(1, 12), min_prob=st.sampled_from([0.0, 0.05, 0.2, 0.5]))
def test_speculation_tree_is_the_greedy_best_within_its_limits(ids, match, depth, budget, min_prob):
    trie = SuffixTrie(max_depth=8)
    trie.extend(trie.start(), ids)
    suffix = ids[-match:]
    node = trie.find(suffix)
    tree = speculate(node, depth, budget, min_prob, tree=True)
    chain = speculate(node, depth, budget, min_prob, tree=False)
    parents, level = tree.parents, depths(tree.parents)
    assert len(tree.tokens) <= budget and max(level, default=0) <= depth and level == sorted(level)
    paths = [[tree.tokens[i] for i in path_to(parents, node_)] for node_ in range(len(parents))]

    def probability(path: list[int]) -> float:
        p = 1.0
        for i, token in enumerate(path):
            p *= trie.continuations(suffix + path[:i]).get(token, 0.0)
        return p

    probabilities = [probability(path) for path in paths]
    assert all(p >= min_prob - 1e-12 and p > 0 for p in probabilities)
    assert tree.score == pytest.approx(sum(probabilities))
    for kids in children(parents):
        assert len({tree.tokens[kid] for kid in kids}) == len(kids), "siblings are distinct"
    frontier = [path + [token] for path in [[]] + paths if len(path) < depth
                for token in trie.continuations(suffix + path) if path + [token] not in paths]
    left = [probability(path) for path in frontier]
    if len(tree.tokens) == budget:
        assert all(p <= min(probabilities) + 1e-12 for p in left), "a more likely node was left out"
    else:
        assert all(p < min_prob + 1e-12 for p in left), "a node above min_prob was left out with budget to spare"
    first = [tree.tokens[i] for i in first_path(parents)]
    assert chain.tokens[: len(first)] == first, "the tree's first path is the most frequent path"


# --- the drafter -------------------------------------------------------------------------------

def test_the_longest_continued_suffix_wins_over_a_more_frequent_shorter_one():
    # "1 2" was followed by 3 twice and by 4 once, but the longer "1 2 3 1 2" only by 4
    draft = RowView(SuffixDrafter()).propose(context([1, 2, 3, 1, 2, 4, 1, 2, 3, 1, 2]), 6)
    assert draft.tokens.tolist() == [4, 1, 2, 3, 1, 2] and draft.parents is None


def test_tree_mode_drafts_the_continuations_of_an_ambiguous_suffix():
    draft = RowView(SuffixDrafter(tree=True)).propose(context([3, 1, 2, 3, 3, 1, 2, 4, 3, 1, 2]), 2)
    assert draft.tokens.tolist() == [3, 4, 3, 3] and draft.parents.tolist() == [-1, -1, 0, 1]
    chain = RowView(SuffixDrafter()).propose(context([3, 1, 2, 3, 3, 1, 2, 4, 3, 1, 2]), 2)
    assert chain.tokens.tolist() == [3, 3] and chain.parents is None


def test_nothing_to_match_gives_an_empty_draft():
    draft = RowView(SuffixDrafter(tree=True)).propose(context(list(range(20))), 4)
    assert draft.tokens.shape == (0,) and draft.tokens.dtype == torch.long


def test_match_factor_caps_the_draft_at_the_match_length_times_the_factor():
    ids = [7, 1, 2, 3, 4, 5, 6, 8, 1]  # "1" matches, length 1: 2 nodes with factor 2
    assert RowView(SuffixDrafter(match_factor=2.0)).propose(context(ids), 6).tokens.tolist() == [2, 3]
    assert RowView(SuffixDrafter()).propose(context(ids), 6).tokens.tolist() == [2, 3, 4, 5, 6, 8]


@given(ids=st.lists(st.integers(0, 4), min_size=1, max_size=50), cut=st.integers(1, 50),
       remembered=st.lists(st.integers(0, 4), max_size=20), tree=st.booleans(), k=st.integers(1, 5))
def test_drafts_kept_up_step_by_step_equal_those_of_a_fresh_drafter(ids, cut, remembered, tree, k):
    stepped, fresh = SuffixDrafter(max_depth=6, max_match=3, tree=tree), SuffixDrafter(max_depth=6, max_match=3,
                                                                                       tree=tree)
    for drafter in (stepped, fresh):
        drafter.remember(remembered)
    stepped, fresh = RowView(stepped), RowView(fresh)
    stepped.prefill(context(ids[:cut]))
    for end in range(min(cut, len(ids)) + 1, len(ids) + 1):
        stepped.commit(context(ids[:end]), 1)
    a, b = stepped.propose(context(ids), k), fresh.propose(context(ids), k)
    assert a.tokens.tolist() == b.tokens.tolist()
    assert (a.parents is None) == (b.parents is None) and (a.parents is None or a.parents.equal(b.parents))


def test_options_declare_trees_and_node_budgets():
    assert SuffixDrafter.drafts_trees(SuffixDrafter.tree_options) and not SuffixDrafter.drafts_trees({})
    assert SuffixDrafter().max_draft_nodes(5) == 5 and SuffixDrafter(tree=True, node_factor=3).max_draft_nodes(5) == 15


@pytest.mark.parametrize(("options", "field"), [
    ({"max_depth": 1}, "max_depth"), ({"max_depth": 4.0}, "max_depth"), ({"max_match": 0}, "max_match"),
    ({"max_match": 24}, "max_match"), ({"min_prob": -0.1}, "min_prob"), ({"min_prob": 1.5}, "min_prob"),
    ({"min_prob": float("nan")}, "min_prob"), ({"tree": "yes"}, "tree"), ({"node_factor": 0}, "node_factor"),
    ({"node_factor": True}, "node_factor"), ({"match_factor": 0}, "match_factor"),
    ({"match_factor": float("inf")}, "match_factor"), ({"max_global_nodes": -1}, "max_global_nodes"),
])
def test_bad_options_raise_naming_the_drafter_the_option_and_the_value(options, field):
    with pytest.raises(ValueError, match=rf"^suffix: {field}.*{re.escape(repr(options[field]))}"):
        specdec.make_drafter("suffix", **options)


# --- through generate --------------------------------------------------------------------------

@functools.cache
def _target(arch: str) -> PreTrainedModel:
    return tiny_model(arch, vocab_size=VOCAB, seed=0)


@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_greedy_output_equals_transformers_greedy_across_calls(arch, tree):
    model, drafter = _target(arch), SuffixDrafter(tree=tree)
    for prompt in (PROMPT, PROMPT[2:] + [3, 4]):  # the second call also drafts from the first's output
        result = specdec.generate(model, prompt, drafter=drafter, num_draft_tokens=4, max_new_tokens=NEW_TOKENS)
        assert result.tokens == hf_greedy(model, prompt, NEW_TOKENS), f"{arch}, tree={tree}, prompt {prompt}"
        assert result.stats.drafted > 0 and result.stats.new_tokens == result.stats.steps + result.stats.accepted


def test_a_second_call_drafts_the_first_calls_output_and_a_fresh_drafter_does_not():
    model = tiny_model("llama", vocab_size=VOCAB, seed=0)
    prompt = list(range(10, 22))  # no repeats, nor any token of the output below
    drafter = SuffixDrafter()
    first = specdec.generate(model, prompt, drafter=drafter, num_draft_tokens=4, max_new_tokens=NEW_TOKENS).tokens
    assert len(set(first[:8])) == 8 and not set(first) & set(prompt), "the case needs a non-repeating start"
    follow_up = prompt + first[:4]  # its greedy continuation is first[4:]
    RowView(drafter).prefill(context(follow_up))
    assert RowView(drafter).propose(context(follow_up), 4).tokens.tolist() == first[4:8]
    fresh = RowView(SuffixDrafter())
    fresh.prefill(context(follow_up))
    assert fresh.propose(context(follow_up), 4).tokens.tolist() == []
    runs = [specdec.generate(model, follow_up, drafter=d, num_draft_tokens=4, max_new_tokens=12)
            for d in (drafter, SuffixDrafter())]
    assert runs[0].tokens == runs[1].tokens == first[4:16]
    assert runs[0].stats.accepted > runs[1].stats.accepted


def test_a_repeated_output_cannot_grow_the_memory_past_its_bound():
    memory = OutputMemory(8, 50)
    for _ in range(100):  # the same answer again and again adds no trie node after the first
        assert memory.add([1, 2, 3, 4]) == 4
        assert memory.trie.nodes <= 50 and memory.tokens <= 50
        assert memory.tokens == sum(len(output) for output in memory.outputs)
    assert len(memory.outputs) == 12 and memory.trie.count([1, 2, 3, 4]) == 12


def test_forget_drops_earlier_outputs_as_a_fresh_drafter_would():
    model = tiny_model("llama", vocab_size=VOCAB, seed=0)
    prompt = list(range(10, 22))
    drafter = SuffixDrafter()
    first = specdec.generate(model, prompt, drafter=drafter, num_draft_tokens=4, max_new_tokens=NEW_TOKENS).tokens
    follow_up = prompt + first[:4]
    drafter.forget()
    assert drafter.memory.trie.nodes == 0
    RowView(drafter).prefill(context(follow_up))  # the first call's output is not folded in after forget
    assert drafter.memory.trie.nodes == 0 and RowView(drafter).propose(context(follow_up), 4).tokens.tolist() == []


def test_the_bench_makes_every_round_start_from_a_fresh_memory():
    from specdec.bench.questions import Question
    from specdec.bench.runner import Contender, run_bench

    model = tiny_model("llama", vocab_size=VOCAB, seed=0)
    prompt = list(range(10, 22))
    contenders = [Contender("plain"), Contender("suffix", drafter="suffix", k=4)]
    runs, _ = run_bench(model, lambda turns, answers, index: prompt, lambda ids: "",
                        [Question("q", "code", ("a",))], contenders, Sampling(), max_new_tokens=NEW_TOKENS,
                        repeats=3, warmup=1)
    accepted = [r.stats.accepted for r in sorted(runs, key=lambda r: r.repeat) if r.contender == "suffix"]
    fresh = specdec.generate(model, prompt, drafter=SuffixDrafter(), num_draft_tokens=4,
                             max_new_tokens=NEW_TOKENS).stats.accepted
    assert accepted == [fresh] * 3  # no round drafts from the warm-up's or an earlier round's answer


def test_generate_keeps_the_global_trie_within_its_bound():
    model = tiny_model("llama", vocab_size=VOCAB, seed=1)
    drafter = SuffixDrafter(max_depth=6, max_match=3, max_global_nodes=120)
    for start in range(8):
        specdec.generate(model, [start, start + 9, start + 20], drafter=drafter, num_draft_tokens=3,
                         max_new_tokens=16)
        assert drafter.memory.trie.nodes <= 120
    assert len(drafter.memory.outputs) < 7, "eight outputs of ~15 tokens cannot all fit in 120 nodes"
    assert_trie_equals_brute_force(drafter.memory.trie, list(drafter.memory.outputs))


# --- losslessness at temperature > 0 -----------------------------------------------------------

TREE_PROMPT = [3, 1, 2, 3, 3, 1, 2, 4, 3, 1, 2]  # "3 1 2" was followed by 3 and by 4: a tree from step one
LENGTH = 3  # new tokens per generation: V**3 = 125 outcomes
RUNS = 800


class CountingTrees:
    """Wraps a drafter and counts the drafts that branch."""

    capabilities = SuffixDrafter.capabilities

    def __init__(self, inner: SuffixDrafter) -> None:
        self.inner, self.name, self.trees = inner, inner.name, 0

    def max_draft_nodes(self, k: int) -> int:
        return self.inner.max_draft_nodes(k)

    def prefill(self, rows: dict[int, DraftContext]) -> None:
        self.inner.prefill(rows)

    def commit(self, rows: dict[int, DraftContext], accepted: dict[int, int]) -> None:
        self.inner.commit(rows, accepted)

    def finish(self, rows: dict[int, DraftContext]) -> None:
        self.inner.finish(rows)

    def forget(self) -> None:
        self.inner.forget()

    def propose(self, rows: dict[int, DraftContext], k: dict[int, int]) -> dict[int, Draft]:
        drafts = self.inner.propose(rows, k)
        for draft in drafts.values():
            self.trees += draft.parents is not None and draft.parents.tolist() != chain_parents(len(draft.parents))
        return drafts


@pytest.mark.parametrize(("tree", "prompt", "sampling"), [
    pytest.param(False, SHORT_PROMPT, PLAIN, id="chain-t1"),
    pytest.param(True, TREE_PROMPT, TRUNCATED, id="tree-t0.7-k4-p0.9"),
])
def test_continuations_match_plain_sampling_with_a_drafter_kept_across_runs(tree, prompt, sampling):
    """One drafter for all runs: its global trie drafts earlier runs' continuations. Each run's
    law given the past is plain sampling's, so the runs are i.i.d. from it (lossless)."""
    model = tiny_model(seed=0, **MODEL)
    drafter = CountingTrees(SuffixDrafter(tree=tree))
    vocab = MODEL["vocab_size"]
    counts = np.zeros(vocab**LENGTH, dtype=np.int64)
    drafted = accepted = deep = 0
    for seed in range(RUNS):
        result = specdec.generate(model, prompt, drafter=drafter, num_draft_tokens=3, max_new_tokens=LENGTH,
                                  sampling=sampling, seed=seed)
        x1, x2, x3 = result.tokens
        counts[(x1 * vocab + x2) * vocab + x3] += 1
        drafted, accepted = drafted + result.stats.drafted, accepted + result.stats.accepted
        deep += result.stats.drafted_per_position[1]
    assert 0 < accepted < drafted and deep > 0, f"drafted {drafted}, accepted {accepted}, deep {deep}: vacuous"
    assert drafter.inner.memory.outputs, "the global trie must have remembered earlier runs"
    if tree:
        assert drafter.trees > RUNS // 2, f"only {drafter.trees} drafts branched"
    p_value = chi_square_p_value(counts, exact_distribution(model, prompt, sampling))
    assert p_value >= ALPHA, f"suffix (tree={tree}, {sampling}) is not lossless: chi-square p = {p_value:.3g}"
