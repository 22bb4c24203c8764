"""Tree drafts from the n-gram drafter (`branches`) and the Medusa drafter (`medusa_choices`,
`tree`): their shapes, greedy parity through `specdec.generate`, the n-gram tree's gain on
a prompt with several continuations, option validation, and state across steps."""

from __future__ import annotations

import functools
import heapq
import itertools
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from transformers import PreTrainedModel

from specdec.protocols import RowView, row_view
import specdec
from specdec import Draft, DraftContext, Sampling
from specdec.cli.common import parse_drafter_spec
from specdec.drafters.feature_heads.medusa import MedusaDrafter
from specdec.drafters.feature_heads.medusa_choices import HEAD_DECAY, HEAD_TOP1, RANK_DECAY, check_medusa_choices, default_medusa_choices
from specdec.drafters.model_free.ngram import NgramDrafter, NgramIndex
from specdec.runtime.target import CausalLM
from specdec.trees import children, depths
from test_lossless_statistical import (ALPHA, MODEL, PROMPT as SHORT_PROMPT, TRUNCATED, chi_square_p_value,
                                       exact_distribution, sample_counts)
from test_medusa import HIDDEN, PROMPT, VOCAB, checkpoint, fitted_heads, random_heads
from tiny import tiny_model

NEW_TOKENS = 24
CHOICES = [(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]  # the brief's example


@functools.lru_cache(maxsize=None)
def _target(arch: str) -> PreTrainedModel:
    return tiny_model(arch, vocab_size=VOCAB, hidden=HIDDEN, seed=0)


def assert_well_formed(draft: Draft, k: int) -> None:
    """A tree: parents before children, breadth-first, depth <= k, distinct sibling tokens."""
    assert draft.parents is not None and draft.probs is None
    parents = draft.parents.tolist()
    assert len(parents) == draft.tokens.shape[0]
    assert all(-1 <= parent < i for i, parent in enumerate(parents))
    level = depths(parents)
    assert level == sorted(level) and max(level) <= k, f"not breadth-first within depth {k}: {level}"
    tokens = draft.tokens.tolist()
    for kids in children(parents):
        siblings = [tokens[kid] for kid in kids]
        assert len(set(siblings)) == len(siblings), f"duplicate siblings {siblings}"


class Recorder:
    """Wraps a drafter; keeps its drafts and checks, at every commit, that `ctx.accepted`
    names draft nodes whose tokens are exactly the newly committed ones."""

    def __init__(self, inner: object) -> None:
        self.inner, self.drafts, self.accepted = row_view(inner), [], []
        self.name = getattr(inner, "name", "recorder")
        self.uses_hidden_states = getattr(self.inner, "uses_hidden_states", False)
        self._length = 0

    def prefill(self, ctx: DraftContext) -> None:
        self.inner.prefill(ctx)

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        self._length = ctx.tokens.shape[0]
        draft = self.inner.propose(ctx, k)
        self.drafts.append(draft)
        return draft

    def commit(self, ctx: DraftContext, num_accepted: int) -> None:
        draft = self.drafts[-1]
        assert len(ctx.accepted) == num_accepted
        committed = ctx.tokens[self._length : self._length + num_accepted].tolist()
        assert draft.tokens[list(ctx.accepted)].tolist() == committed
        if draft.parents is not None and ctx.accepted:  # a path: each node the previous one's child
            parents = draft.parents.tolist()
            assert [parents[node] for node in ctx.accepted] == [-1, *ctx.accepted[:-1]]
        self.accepted.append(num_accepted)
        if hasattr(self.inner, "commit"):
            self.inner.commit(ctx, num_accepted)


# --- n-gram trees -------------------------------------------------------------------------

def test_continuations_of_several_matches_merge_as_a_breadth_first_trie():
    index = NgramIndex(1, 2, branches=3)
    index.extend([1, 2, 3, 1, 2, 4, 1, 2, 5, 1, 2])
    assert index.continuations(2) == [[5, 1], [4, 1], [3, 1]]  # latest match first
    drafter = RowView(NgramDrafter(max_ngram=2, branches=3))
    ctx = DraftContext(torch.tensor([1, 2, 3, 1, 2, 4, 1, 2, 5, 1, 2]), Sampling(), torch.Generator(),
                       CausalLM(_target("llama")), VOCAB)
    draft = drafter.propose(ctx, 2)
    assert draft.tokens.tolist() == [5, 4, 3, 1, 1, 1]
    assert draft.parents.tolist() == [-1, -1, -1, 0, 1, 2]
    assert_well_formed(draft, 2)


def test_shared_prefixes_are_stored_once_and_the_first_path_is_the_chain():
    ids = [7, 3, 1, 2, 8, 9, 4, 7, 3, 1, 2, 8, 6, 4, 7, 3, 1, 2, 5, 4, 7, 3]
    chain = NgramIndex(1, 3)
    chain.extend(ids)
    tree = NgramIndex(1, 3, branches=3)
    tree.extend(ids)
    paths = tree.continuations(4)
    assert paths == [[1, 2, 5, 4], [1, 2, 8, 6], [1, 2, 8, 9]]
    assert paths[0] == chain.continuation(4)
    drafter = RowView(NgramDrafter(branches=3))
    ctx = DraftContext(torch.tensor(ids), Sampling(), torch.Generator(), CausalLM(_target("llama")), VOCAB)
    draft = drafter.propose(ctx, 4)
    assert draft.tokens.tolist() == [1, 2, 5, 8, 4, 6, 9]  # "1 2" once, "8" once
    assert draft.parents.tolist() == [-1, 0, 1, 1, 2, 3, 3]
    assert_well_formed(draft, 4)


def test_identical_continuations_add_nothing_and_one_distinct_path_is_a_chain():
    index = NgramIndex(1, 2, branches=4)
    index.extend([1, 2, 3, 1, 2, 3, 1, 2])
    assert index.continuations(3) == [[3, 1, 2]]
    ctx = DraftContext(torch.tensor([1, 2, 3, 1, 2, 3, 1, 2]), Sampling(), torch.Generator(),
                       CausalLM(_target("llama")), VOCAB)
    draft = RowView(NgramDrafter(max_ngram=2, branches=4)).propose(ctx, 3)
    assert draft.parents is None and draft.tokens.tolist() == [3, 1, 2]
    short = DraftContext(torch.tensor([1, 2]), Sampling(), torch.Generator(), ctx.target, VOCAB)
    assert RowView(NgramDrafter(branches=4)).propose(short, 3).tokens.numel() == 0  # no match: nothing


def test_shorter_ngrams_fill_in_when_the_longest_has_fewer_matches_than_branches():
    index = NgramIndex(1, 2, branches=3)
    index.extend([7, 2, 9, 1, 2, 3, 1, 2])  # "1 2" once (-> 3); "2" also after 7 (-> 9)
    assert index.continuations(2) == [[3, 1], [9, 1]]
    index = NgramIndex(2, 2, branches=3)  # min_ngram 2: no unigram fallback
    index.extend([7, 2, 9, 1, 2, 3, 1, 2])
    assert index.continuations(2) == [[3, 1]]


def brute_force_paths(ids: list[int], min_n: int, max_n: int, branches: int, k: int) -> list[list[int]]:
    """The documented rule, by scanning: for n from the longest down, the latest `branches`
    starts of the last n ids whose continuation position is new, latest first; LZ77 copies;
    distinct paths, at most `branches`."""
    used: set[int] = set()
    paths: list[list[int]] = []
    for n in range(min(max_n, len(ids) - 1), min_n - 1, -1):
        fresh = 0
        for start in range(len(ids) - n - 1, -1, -1):
            if fresh == branches:
                break
            if ids[start : start + n] != ids[len(ids) - n :] or start + n in used:
                continue
            fresh += 1
            used.add(start + n)
            extended = list(ids)
            for i in range(k):
                extended.append(extended[start + n + i])
            if extended[len(ids) :] not in paths:
                paths.append(extended[len(ids) :])
            if len(paths) == branches:
                return paths
    return paths


@given(ids=st.lists(st.integers(0, 3), min_size=1, max_size=50),
       chunks=st.lists(st.integers(1, 6), min_size=1, max_size=12),
       sizes=st.tuples(st.integers(1, 3), st.integers(0, 2), st.integers(2, 4)), k=st.integers(1, 5))
def test_tree_index_fed_in_chunks_matches_brute_force(ids, chunks, sizes, k):
    min_n, extra, branches = sizes
    index = NgramIndex(min_n, min_n + extra, branches)
    chain = NgramIndex(min_n, min_n + extra)
    position = 0
    for size in chunks + [len(ids)]:
        index.extend(ids[position : position + size])
        chain.extend(ids[position : position + size])
        position = min(len(ids), position + size)
        paths = index.continuations(k)
        assert paths == brute_force_paths(ids[:position], min_n, min_n + extra, branches, k)
        assert paths[:1] == ([chain.continuation(k)] if chain.continuation(k) else [])


@functools.lru_cache(maxsize=None)
def bigram_target() -> tuple[PreTrainedModel, list[int]]:
    """A tiny model whose attention outputs are zeroed, so each next token depends on the last
    token alone, and its longest greedy walk without a repeat."""
    model = tiny_model("llama", vocab_size=256, hidden=32, seed=0)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
    lm = CausalLM(model)
    lm.reset()
    with torch.inference_mode():
        successor = lm.forward(torch.arange(256), keep=256)[0].argmax(dim=-1).tolist()
    walks = []
    for start in range(256):
        walk = [start]
        while successor[walk[-1]] not in walk:
            walk.append(successor[walk[-1]])
        walks.append(walk)
    return model, max(walks, key=len)


@pytest.mark.parametrize(("max_ngram", "period"), [(1, 3), (3, 4)])
def test_branches_accept_more_on_a_prompt_whose_latest_match_is_a_decoy(max_ngram, period):
    # The prompt holds the target's greedy walk W, then a decoy copy of W with every
    # `period`-th token changed, then W's first token: every suffix's latest match is in the
    # decoy, which soon goes wrong; the older match in W continues exactly as the target does.
    model, walk = bigram_target()
    assert len(walk) >= 30, walk
    walk = walk[:30]
    decoy = [(token + 1) % 256 if i % period == period - 1 else token for i, token in enumerate(walk)]
    prompt = walk + decoy + walk[:1]
    plain = specdec.generate(model, prompt, max_new_tokens=NEW_TOKENS)
    assert plain.tokens == walk[1 : NEW_TOKENS + 1]
    lengths = {}
    for branches in (1, 2, 4):
        recorder = Recorder(NgramDrafter(max_ngram=max_ngram, branches=branches))
        result = specdec.generate(model, prompt, drafter=recorder, num_draft_tokens=4, max_new_tokens=NEW_TOKENS)
        assert result.tokens == plain.tokens
        assert any(d.parents is not None for d in recorder.drafts) == (branches > 1)
        lengths[branches] = result.stats.mean_accepted_length
    assert lengths[2] == lengths[4] == pytest.approx(4.8), lengths  # 24 tokens in 5 steps of k + 1
    assert lengths[1] < lengths[2] - 0.5, lengths


class IndexChecker(Recorder):
    """At every propose, the n-gram index must hold exactly the committed tokens."""

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        draft = super().propose(ctx, k)
        assert self.inner.drafter._indexes[0].ids == ctx.tokens.tolist()
        return draft


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("branches", [2, 4])
def test_ngram_trees_keep_greedy_output_and_the_index_in_step(arch, branches):
    target = _target(arch)
    prompt = [5, 9, 14, 22, 5, 9, 30, 22, 5, 9, 14, 41, 5, 9]
    plain = specdec.generate(target, prompt, max_new_tokens=32)
    recorder = IndexChecker(NgramDrafter(branches=branches))
    for _ in range(2):  # a drafter reused across generations
        result = specdec.generate(target, prompt, drafter=recorder, num_draft_tokens=3, max_new_tokens=32)
        assert result.tokens == plain.tokens
    trees = [d for d in recorder.drafts if d.parents is not None]
    assert trees, "no tree was proposed"
    for draft in trees:
        assert_well_formed(draft, 3)
        assert len(children(draft.parents.tolist())[0]) <= branches


def test_ngram_tree_at_temperature_is_deterministic_candidates():
    recorder = Recorder(NgramDrafter(branches=3))
    prompt = [5, 9, 14, 22, 5, 9, 30, 22, 5, 9, 14, 41, 5, 9]
    specdec.generate(_target("llama"), prompt, drafter=recorder, max_new_tokens=16,
                     sampling=Sampling(temperature=0.8), seed=0)
    assert any(d.parents is not None for d in recorder.drafts)
    assert all(d.probs is None for d in recorder.drafts)


@pytest.mark.parametrize("value", [0, -1, 2.0, True, "2", None])
def test_bad_branches_raise_naming_the_value(value):
    with pytest.raises(ValueError, match=rf"ngram: branches must be an int >= 1, got {value!r}"):
        specdec.make_drafter("ngram", branches=value)


def test_cli_specs_reach_the_options():
    name, options = parse_drafter_spec("ngram:branches=4,max_ngram=2")
    drafter = specdec.make_drafter(name, **options)
    assert (drafter.branches, drafter.max_ngram) == (4, 2)


# --- Medusa trees -------------------------------------------------------------------------

def test_default_tree_is_prefix_closed_breadth_first_and_the_best_scored_paths():
    for heads, size in ((1, 8), (2, 16), (3, 24), (5, 24)):
        tree = default_medusa_choices(heads)
        assert len(tree) == size and len(set(tree)) == size
        assert tree == sorted(tree, key=lambda path: (len(path), path))
        assert all(path[:cut] in tree for path in tree for cut in range(1, len(path)))
        assert max(len(path) for path in tree) == min(heads, 4)
    assert default_medusa_choices(3)[:4] == [(0,), (1,), (2,), (3,)]
    assert (0, 0, 0) in default_medusa_choices(3)

    def score(path: tuple[int, ...]) -> float:
        return math.prod(HEAD_TOP1 * HEAD_DECAY**h * RANK_DECAY**r for h, r in enumerate(path))

    every = [path for length in range(1, 4) for path in itertools.product(range(10), repeat=length)]
    best = heapq.nlargest(24, every, key=score)
    assert sorted(map(score, best)) == pytest.approx(sorted(map(score, default_medusa_choices(3))))
    assert default_medusa_choices(2, nodes=5, max_rank=2) == [(0,), (1,), (0, 0), (0, 1), (1, 0)]


def test_medusa_tree_is_the_heads_top_k_breadth_first_and_cut_at_depth_k(tmp_path):
    heads = random_heads()
    drafter = RowView(MedusaDrafter(checkpoint(tmp_path, heads), medusa_choices=list(reversed(CHOICES))))
    lm = CausalLM(_target("llama"))
    lm.reset()
    with torch.inference_mode():
        _, hidden = lm.forward(torch.tensor(PROMPT[:-1]), keep=1, hidden=(lm.num_layers,))
        ctx = DraftContext(torch.tensor(PROMPT), Sampling(), torch.Generator(), lm, VOCAB, hidden)
        drafter.prefill(ctx)
        top = heads(hidden[-1]).topk(2, dim=-1).indices.tolist()  # (3, 2)
        for k, expected in ((4, CHOICES), (3, CHOICES), (2, CHOICES[:5]), (1, CHOICES[:2])):
            draft = drafter.propose(ctx, k)
            assert draft.tokens.tolist() == [top[len(path) - 1][path[-1]] for path in expected]
            assert draft.parents.tolist() == [-1, -1, 0, 0, 1, 2][: len(expected)]
            assert_well_formed(draft, k)
        chain = RowView(MedusaDrafter(tmp_path))
        chain.prefill(ctx)
        assert chain.propose(ctx, 3).tokens.tolist() == [top[0][0], top[1][0], top[2][0]]  # the first path


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("options", [{"tree": True}, {"medusa_choices": CHOICES}, {"medusa_choices": "default"}],
                         ids=["tree", "choices", "preset"])
def test_medusa_trees_keep_greedy_output(tmp_path, arch, options):
    target = _target(arch)
    plain = specdec.generate(target, PROMPT, max_new_tokens=NEW_TOKENS)
    for heads, k in ((random_heads(), 4), (fitted_heads(target, PROMPT, 3), 2)):
        recorder = Recorder(MedusaDrafter(checkpoint(tmp_path, heads), **options))
        result = specdec.generate(target, PROMPT, drafter=recorder, num_draft_tokens=k, max_new_tokens=NEW_TOKENS)
        assert result.tokens == plain.tokens
        assert recorder.drafts and all(d.parents is not None for d in recorder.drafts if d.tokens.numel())
        for draft in recorder.drafts:
            assert_well_formed(draft, k)


def test_fitted_heads_accept_at_least_as_much_as_a_tree_as_as_a_chain(tmp_path):
    target = _target("llama")
    directory = checkpoint(tmp_path, fitted_heads(target, PROMPT, 3))
    chain = specdec.generate(target, PROMPT, drafter=MedusaDrafter(directory), num_draft_tokens=3,
                             max_new_tokens=NEW_TOKENS)
    tree = specdec.generate(target, PROMPT, drafter=MedusaDrafter(directory, tree=True), num_draft_tokens=3,
                            max_new_tokens=NEW_TOKENS)
    assert tree.tokens == chain.tokens
    assert tree.stats.mean_accepted_length >= chain.stats.mean_accepted_length > 3.0


class HiddenChecker(Recorder):
    """At every propose, the drafter's hidden row must be the target's at tokens[-2],
    recomputed from scratch: the accepted path's rows reached it, not a rejected sibling's."""

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        draft = super().propose(ctx, k)
        if ctx.tokens.shape[0] >= 2:
            fresh = CausalLM(ctx.target.model)
            fresh.reset()
            _, hidden = fresh.forward(ctx.tokens[:-1], keep=1, hidden=(fresh.num_layers,))
            torch.testing.assert_close(self.inner.drafter._last[0], hidden[-1:], rtol=0, atol=1e-9)
        return draft


@pytest.mark.parametrize("sampling", [Sampling(), Sampling(temperature=0.8)], ids=["greedy", "t0.8"])
def test_medusa_state_follows_the_accepted_path(tmp_path, sampling):
    target = _target("qwen3")
    checker = HiddenChecker(MedusaDrafter(checkpoint(tmp_path, fitted_heads(target, PROMPT, 3)), tree=True))
    specdec.generate(target, PROMPT, drafter=checker, num_draft_tokens=3, max_new_tokens=32, sampling=sampling,
                     seed=1)
    assert any(n > 0 for n in checker.accepted) and all(d.probs is None for d in checker.drafts)
    assert any(d.tokens.shape[0] > 0 and (d.parents is not None) for d in checker.drafts)


def test_medusa_tree_is_lossless_at_temperature(tmp_path):
    target = tiny_model(seed=0, **MODEL)
    heads = random_heads(num_heads=2, hidden=MODEL["hidden"], vocab=MODEL["vocab_size"], seed=3)
    drafter = MedusaDrafter(checkpoint(tmp_path, heads), medusa_choices=[(0,), (1,), (2,), (0, 0), (0, 1), (1, 0)])
    counts, drafted, accepted, deep = sample_counts(target, drafter, TRUNCATED)
    assert drafted > 0 and accepted > 0 and deep > 0
    p_value = chi_square_p_value(counts, exact_distribution(target, SHORT_PROMPT, TRUNCATED))
    assert p_value >= ALPHA, f"medusa tree at {TRUNCATED} is not lossless: p = {p_value:.3g}"


@pytest.mark.parametrize(("choices", "message"), [
    ([(0,), (1, 0)], r"entry \(1, 0\) needs its prefix \(1,\), which is missing"),
    ([(0,), (0, 0), (0, 0, 0), (0, 0, 0, 0)], r"entry \(0, 0, 0, 0\) is 4 deep but the checkpoint has 3 heads"),
    ([(0,), (64,)], r"entry \(64,\) has rank 64 outside \[0, 64\)"),
    ([(0,), (0, -1)], r"entry \(0, -1\) has rank -1 outside"),
    ([(0,), (1,), (0,)], r"entry \(0,\) is given twice"),
    ([(0,), ()], r"entry \(\) is not a non-empty tuple of ints"),
    ([(0,), (0, 1.0)], r"entry \(0, 1\.0\) is not a non-empty tuple of ints"),
    ([(0,), (True,)], r"entry \(True,\) is not"),
    ([(0,), "01"], r"entry '01' is not"),
    ([], r"medusa_choices must be a non-empty list of paths"),
    (7, r"medusa_choices must be a non-empty list of paths .* got 7"),
    ("wide", r"medusa_choices preset 'wide' is unknown; use one of \['default'\]"),
], ids=["prefix", "deep", "vocab", "negative", "twice", "empty-path", "float", "bool", "string-path", "empty",
        "int", "preset"])
def test_bad_medusa_choices_raise_naming_the_entry(tmp_path, choices, message):
    with pytest.raises(ValueError, match=message):
        MedusaDrafter(checkpoint(tmp_path, random_heads()), medusa_choices=choices)


def test_other_medusa_options_are_checked(tmp_path):
    directory = checkpoint(tmp_path, random_heads())
    with pytest.raises(ValueError, match="tree must be true or false, got 'yes'"):
        MedusaDrafter(directory, tree="yes")
    with pytest.raises(ValueError, match="siblings must be one of 'iid', 'without_replacement', got 'sorted'"):
        MedusaDrafter(directory, sample=True, tree=True, siblings="sorted")
    assert MedusaDrafter(directory, sample=True, tree=True).choices is not None  # a sampled tree
    assert check_medusa_choices([[1], [0], [0, 0]], 3, VOCAB) == [(0,), (1,), (0, 0)]  # lists, any order
    assert MedusaDrafter(directory).choices is None


def test_preset_and_tree_flag_from_the_cli_give_the_default_tree(tmp_path):
    directory = checkpoint(tmp_path, random_heads())
    built = []
    for spec in (f"medusa:path={directory},medusa_choices=default", f"medusa:path={directory},tree=true"):
        name, options = parse_drafter_spec(spec)
        built.append(specdec.make_drafter(name, **options).choices)
    assert built[0] == built[1] == default_medusa_choices(3)
    assert specdec.make_drafter("medusa", path=directory, medusa_choices=CHOICES).choices == CHOICES


def test_default_tree_ranks_stay_inside_a_small_vocabulary(tmp_path):
    directory = checkpoint(tmp_path, random_heads(num_heads=2, vocab=4, hidden=HIDDEN))
    choices = MedusaDrafter(directory, tree=True).choices
    assert choices and all(rank < 4 for path in choices for rank in path)
