"""The fixed-shape EAGLE-2 tree (`specdec.drafters.tree_search.graph.topk_tree`) against the host-side
search it replaces in the drafters (`grow_tree`, kept as the reference): the same nodes, the same
parents, and the same attention masks for each depth's forward as `TreeColumns` gives."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec.drafters.tree_search.graph import expansions, topk_tree, tree_depth
from specdec.drafters.tree_search.dynamic import DynamicTree, TreeColumns, grow_tree

VOCAB = 24


def _table(seed: int) -> torch.Tensor:
    """Next-token logits [V, V] by last token, with a few exact ties among them."""
    table = torch.randn(VOCAB, VOCAB, generator=torch.Generator().manual_seed(seed)) * 2
    table[:, 5] = table[:, 6]  # ties go to the node made first on both sides
    return table


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), top_k=st.integers(1, 4), total=st.integers(1, 40), depth=st.integers(1, 5),
       temperature=st.sampled_from([1.0, 0.35, 2.5]), real=st.integers(0, 9))
def test_the_tensor_tree_is_the_host_search_with_the_same_masks(seed, top_k, total, depth, temperature, real):
    table = _table(seed)
    tree = DynamicTree(top_k=top_k, total_tokens=total, value_temperature=temperature)
    root = table[seed % VOCAB]
    width = real + depth * top_k + 3  # a static cache's capacity: more columns than the tree fills
    columns = TreeColumns(real, lambda rows: width, rows=top_k)
    host_masks: list[torch.Tensor] = []

    def host_expand(search, nodes):
        host_masks.append(columns.visible(search, nodes, torch.device("cpu")))
        return table[torch.tensor([search.tokens[n] for n in nodes])]

    reference, _ = grow_tree(root, host_expand, tree, depth, torch.device("cpu"))
    masks: list[torch.Tensor] = []
    positions: list[list[int]] = []

    def expand(e, tokens, states, at, mask):
        masks.append(mask[0, 0] == 0)
        positions.append(at.tolist())
        return states, table[tokens]

    tokens, parents = topk_tree(expand, root, (torch.zeros(1, 2),), torch.tensor(real), torch.tensor(40), width,
                                tree, depth)
    assert tokens.tolist() == reference.tokens.tolist()
    assert parents.tolist() == reference.parents.tolist()
    assert len(masks) == len(host_masks) == depth - 1
    for mask, host in zip(masks, host_masks):
        assert torch.equal(mask, host)
    assert positions == [[40 + e] * top_k for e in range(1, depth)]  # depth-e nodes run at start + e
    assert expansions(tree, depth) == (depth - 1) * top_k


def test_a_cache_that_grows_gets_masks_over_the_entries_so_far():
    table = _table(1)
    tree = DynamicTree(top_k=3, total_tokens=9)
    widths: list[int] = []

    def expand(e, tokens, states, at, mask):
        widths.append(mask.shape[-1])
        return states, table[tokens]

    topk_tree(expand, table[2], (torch.zeros(1, 2),), torch.tensor(7), torch.tensor(0), None, tree, 4)
    assert widths == [7 + 3, 7 + 6, 7 + 9]


def test_the_tree_depth_is_the_loops_k_unless_the_tree_is_shallower():
    assert tree_depth(DynamicTree(), 5) == 5
    assert tree_depth(DynamicTree(depth=3), 5) == 3
    assert tree_depth(DynamicTree(depth=8), 5) == 5
