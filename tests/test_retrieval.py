"""The retrieval drafter (REST): its frequency trie, greedy parity on the four tiny architectures,
plain sampling's distribution at temperature > 0, and options and vocabularies checked."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from transformers import PreTrainedModel

from specdec.protocols import row_view
import specdec
from specdec import Draft, DraftContext, Sampling
from specdec.data.datastore import DatastoreError
from specdec.data.datastore_build import build_datastore, build_datastore_from_ids
from specdec.drafters.model_free.retrieval import RetrievalDrafter, frequent_prefix_tree
from specdec.trees import children, depths, path_to
from test_datastore import WORDS, word_tokenizer
from test_lossless_statistical import (ALPHA, MODEL, PLAIN, PROMPT, TRUNCATED, VOCAB, chi_square_p_value,
                                       exact_distribution, sample_counts)
from tiny import ARCHITECTURES, tiny_model

NEW_TOKENS = 32


class Recorder:
    """Wraps a drafter and keeps every draft it proposes."""

    name = "retrieval"

    def __init__(self, inner: RetrievalDrafter) -> None:
        self.inner, self.drafts = row_view(inner), []

    def max_draft_nodes(self, k: int) -> int:
        return self.inner.max_draft_nodes(k)

    def prefill(self, ctx: DraftContext) -> None:
        self.inner.prefill(ctx)

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        draft = self.inner.propose(ctx, k)
        self.drafts.append(draft)
        return draft


def assert_well_formed(draft: Draft, k: int, nodes: int) -> None:
    """No q; at most `nodes` nodes; a tree is breadth-first within depth k with distinct siblings."""
    assert draft.probs is None and draft.tokens.numel() <= nodes
    if draft.parents is None or draft.tokens.numel() == 0:
        assert draft.tokens.numel() <= (k if draft.parents is None else 0)
        return
    parents, tokens = draft.parents.tolist(), draft.tokens.tolist()
    assert all(-1 <= parent < i for i, parent in enumerate(parents))
    level = depths(parents)
    assert level == sorted(level) and max(level) <= k, level
    for kids in children(parents):
        assert len({tokens[kid] for kid in kids}) == len(kids), f"duplicate siblings in {tokens}, {parents}"


# --- the frequency trie ----------------------------------------------------------------------

def test_the_trie_keeps_the_most_frequent_prefixes_and_orders_siblings_by_frequency():
    continuations = [((1, 2, 3), 3), ((1, 4), 2), ((5, 6), 2), ((1, 2, 7), 1)]
    # prefix counts: (1,) 6, (1, 2) 4, (1, 2, 3) 3, (1, 4) 2, (5,) 2, (5, 6) 2, (1, 2, 7) 1
    assert frequent_prefix_tree(continuations, 4) == ([1, 2, 4, 3], [-1, 0, 0, 1])
    assert frequent_prefix_tree(continuations, 6) == ([1, 5, 2, 4, 6, 3], [-1, -1, 0, 0, 1, 2])
    assert frequent_prefix_tree(continuations, 9, width=1) == ([1, 2, 3], [-1, 0, 1])
    assert frequent_prefix_tree([], 4) == ([], [])


@given(continuations=st.lists(st.tuples(st.lists(st.integers(0, 2), min_size=1, max_size=4).map(tuple),
                                        st.integers(1, 5)), max_size=8),
       nodes=st.integers(1, 20))
def test_the_trie_is_the_top_prefixes_by_frequency_then_first_seen(continuations, nodes):
    count: dict[tuple[int, ...], int] = {}
    seen: dict[tuple[int, ...], int] = {}
    for continuation, weight in continuations:
        for depth in range(1, len(continuation) + 1):
            count[continuation[:depth]] = count.get(continuation[:depth], 0) + weight
            seen.setdefault(continuation[:depth], len(seen))
    expected = sorted(count, key=lambda p: (-count[p], seen[p]))[:nodes]
    tokens, parents = frequent_prefix_tree(continuations, nodes)
    chosen = [tuple(tokens[i] for i in path_to(parents, node)) for node in range(len(tokens))]
    assert sorted(chosen) == sorted(expected)
    assert_well_formed(Draft(torch.tensor(tokens, dtype=torch.long), parents=torch.tensor(parents)), 4, nodes)
    for kids in children(parents):  # siblings most frequent first
        assert [count[chosen[kid]] for kid in kids] == sorted((count[chosen[kid]] for kid in kids), reverse=True)
    path, prefix = frequent_prefix_tree(continuations, 4, width=1)[0], ()  # the chain: most frequent child each time
    for token in path:
        options = [p for p in count if p[:-1] == prefix]
        prefix = min(options, key=lambda p: (-count[p], seen[p]))
        assert token == prefix[-1]


# --- greedy parity ---------------------------------------------------------------------------

@functools.cache
def _target(arch: str) -> PreTrainedModel:
    return tiny_model(arch, vocab_size=64, seed=1)


def _prompts() -> list[list[int]]:
    rng = np.random.default_rng(7)
    return [rng.integers(0, 64, 10).tolist() for _ in range(2)]


def _documents(futures: list[list[int]], seed: int) -> list[list[int]]:
    """Each prompt with its true greedy future, and for every cut three copies of a decoy: the
    16 ids before the cut, then a wrong turn. At a cut the longest match's most frequent
    continuation is the decoy's; the true one is its second sibling."""
    rng = np.random.default_rng(seed)
    documents = [list(future) for future in futures]
    for future in futures:
        for cut in range(10, len(future)):
            decoy = future[max(0, cut - 16) : cut] + rng.integers(0, 64, 4).tolist()
            documents.extend([decoy] * 3)
    return documents


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_greedy_output_equals_plain_decoding(arch, tmp_path):
    target = _target(arch)
    prompts = _prompts()
    plain = [specdec.generate(target, prompt, max_new_tokens=NEW_TOKENS).tokens for prompt in prompts]
    useful = build_datastore_from_ids(_documents([p + o for p, o in zip(prompts, plain)], 0), tmp_path / "useful",
                                      vocab_size=64)
    noise = build_datastore_from_ids([np.random.default_rng(1).integers(0, 64, 400)], tmp_path / "noise",
                                     vocab_size=64)
    accepted: dict[str, int] = {}
    for label, datastore, options in (("tree", useful, {"nodes": 12}), ("chain", useful, {"tree": False}),
                                      ("noise", noise, {})):
        drafter = Recorder(RetrievalDrafter(datastore, **options))
        accepted[label] = 0
        for prompt, expected in zip(prompts, plain):
            result = specdec.generate(target, prompt, drafter=drafter, num_draft_tokens=4,
                                      max_new_tokens=NEW_TOKENS)
            assert result.tokens == expected, (arch, label)
            accepted[label] += result.stats.accepted
        for draft in drafter.drafts:
            assert_well_formed(draft, 4, drafter.max_draft_nodes(4))
        if label != "noise":
            assert any(d.parents is not None for d in drafter.drafts) == (label == "tree"), label
    # the tree's second siblings hold the true future where the chain follows the decoys
    assert accepted["tree"] >= NEW_TOKENS and accepted["tree"] > accepted["chain"], accepted


# --- sampling ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def small_datastore(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The statistical tests' prompt followed by random continuations, and random documents, over
    their vocabulary: the longest match has many continuations."""
    rng = np.random.default_rng(3)
    documents = [PROMPT + rng.integers(0, VOCAB, 3).tolist() for _ in range(12)]
    return build_datastore_from_ids(documents + [rng.integers(0, VOCAB, 150) for _ in range(4)],
                                    tmp_path_factory.mktemp("retrieval") / "ds", vocab_size=VOCAB)


@pytest.mark.parametrize(("tree", "sampling"), [(True, PLAIN), (False, TRUNCATED)],
                         ids=["tree-t1", "chain-t0.7-k4-p0.9"])
def test_continuations_at_temperature_follow_plain_sampling(small_datastore, tree, sampling):
    target = tiny_model(seed=0, **MODEL)
    drafter = RetrievalDrafter(small_datastore, tree=tree, nodes=12, occurrences=32)
    ctx = DraftContext(torch.tensor(PROMPT), sampling, torch.Generator(), specdec.CausalLM(target), VOCAB)
    first = drafter.propose({0: ctx}, {0: 3})[0]
    assert (first.parents is not None) == tree and first.probs is None  # siblings to sample-and-match
    counts, drafted, accepted, deep = sample_counts(target, drafter, sampling)
    assert drafted > 0 and 0 < accepted < drafted and deep > 0, (drafted, accepted, deep)
    p_value = chi_square_p_value(counts, exact_distribution(target, PROMPT, sampling))
    assert p_value >= ALPHA, f"retrieval (tree={tree}, {sampling}) is not lossless: chi-square p = {p_value:.3g}"


# --- options and vocabularies -----------------------------------------------------------------

def test_the_datastore_option_is_required():
    with pytest.raises(ValueError, match="retrieval: the datastore option is required"):
        specdec.make_drafter("retrieval")


@pytest.mark.parametrize(("options", "named"), [
    ({"nodes": 0}, "nodes"), ({"occurrences": 2.5}, "occurrences"), ({"max_match": True}, "max_match"),
    ({"min_match": 0}, "min_match"), ({"min_match": 5, "max_match": 4}, "min_match"), ({"tree": "yes"}, "tree"),
    ({"verify": 1}, "verify"), ({"datastore": 3}, "datastore")])
def test_bad_options_raise_naming_the_drafter_option_and_value(small_datastore, options, named):
    with pytest.raises(ValueError, match=rf"retrieval: {named}.*{options[named]!r}"):
        specdec.make_drafter("retrieval", **{"datastore": str(small_datastore), **options})


def test_tree_mode_is_the_default_and_declares_its_node_budget(small_datastore):
    assert RetrievalDrafter.drafts_trees({}) and RetrievalDrafter.drafts_trees(RetrievalDrafter.tree_options)
    assert not RetrievalDrafter.drafts_trees({"tree": False})
    assert RetrievalDrafter(small_datastore).max_draft_nodes(4) == 32
    assert RetrievalDrafter(small_datastore, nodes=100, occurrences=3).max_draft_nodes(4) == 12
    assert RetrievalDrafter(small_datastore, tree=False).max_draft_nodes(4) == 4


def test_a_datastore_of_another_vocabulary_fails_at_prefill_naming_it(tmp_path):
    datastore = build_datastore_from_ids([[1, 2, 99]], tmp_path / "ds", vocab_size=100)
    with pytest.raises(ValueError, match=r"prefill.*datastore\.json.*100 ids.*LM head has 64"):
        specdec.generate(_target("llama"), [1, 2], drafter=RetrievalDrafter(datastore), max_new_tokens=2)


def test_the_tokenizer_option_checks_the_fingerprint(tmp_path):
    datastore = build_datastore(["w1 w2 w3"], word_tokenizer(), tmp_path / "ds")
    tokenizer_dir = tmp_path / "tokenizer"
    word_tokenizer().save_pretrained(tokenizer_dir)
    drafter = specdec.make_drafter("retrieval", datastore=str(datastore), tokenizer=str(tokenizer_dir))
    ctx = DraftContext(torch.tensor([5, 1, 2]), Sampling(), torch.Generator(), specdec.CausalLM(_target("llama")),
                       len(WORDS))
    assert drafter.propose({0: ctx}, {0: 2})[0].tokens.tolist() == [3]
    with pytest.raises(DatastoreError, match=r"datastore\.json.*fingerprint"):
        RetrievalDrafter(datastore, tokenizer=word_tokenizer(WORDS[::-1]))
