"""SuffixDecoding: model-free drafts from suffix trees of the prompt and of earlier outputs
(Oliaro et al. 2024, "SuffixDecoding: A Model-Free Approach to Speeding Up Large Language
Model Inference", arXiv 2411.04975).

Two tries of token counts, each truncated at `max_depth` (the paper's suffix trees, depth
limited): a per-request one over the prompt and the tokens generated so far, rebuilt by
`prefill`, and a global one over the outputs of earlier `generate` calls, kept by the drafter
instance. A node stands for a string s of at most `max_depth` tokens; its `count` is how often
s occurs, its `total` how often s is followed by a token (the sum of its children's counts).
Appending a token extends every suffix of the sequence shorter than `max_depth` (the "active"
nodes), so the tries grow by O(max_depth) per committed token, whatever the context length.

Each step matches the longest suffix of the context (at most `max_match` tokens) that occurred
earlier with a continuation, in each trie. From the matched node a child's probability is its
count over its parent's total; a node's score is the product along its path. Tree mode expands
best-first while the score stays >= `min_prob`, to depth k and at most `node_factor * k` nodes
(the paper's greedy speculation tree; `match_factor` adds its adaptive cap of
ceil(match_factor * match length) nodes). Chain mode follows the most frequent child (the
tree's first path). The draft of the trie whose draft scores higher (the sum of its nodes'
scores, the expected number of accepted tokens) wins, the per-request one on ties.

The global trie is bounded: at most `max_global_nodes` nodes. An output is folded into it at
the next `prefill` (the loop has no end-of-generation call; the tokens of a last step that
proposed nothing are not seen) or by `remember`; before each token would overflow the bound the
oldest outputs are evicted, and a single output larger than the bound keeps its first tokens.

Drafts are deterministic (a one-hot q) and siblings are distinct tokens (the children of a
trie node), so the verifier's sample-and-match rule keeps decoding lossless.
"""

from __future__ import annotations

import copy

import math
from collections.abc import Sequence
from typing import Any, ClassVar

import torch

from specdec.drafters.suffix_trie import OutputMemory, Speculation, SuffixTrie, TrieNode, speculate
from specdec.protocols import DraftContext
from specdec.trees import chain_parents
from specdec.types import Draft

__all__ = ["SuffixDrafter"]


def _advance(matches: list[TrieNode], token: int, longest: int) -> list[TrieNode]:
    """The trie nodes of the context's suffixes (lengths 0..) after one more token; a suffix
    absent from the trie ends the list (longer ones contain it, so are absent too)."""
    new = [matches[0]]
    for node in matches[: longest]:
        child = node.children.get(token) if node.children else None
        if child is None:
            break
        new.append(child)
    return new


def _longest_continued(suffixes: list[TrieNode], longest: int) -> tuple[TrieNode, int] | None:
    """The longest suffix (1..longest tokens) that occurred with a continuation, and its length."""
    for length in range(min(longest, len(suffixes) - 1), 0, -1):
        if suffixes[length].total:
            return suffixes[length], length
    return None


def _int_option(field: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"suffix: {field} must be an int >= {low}, got {value!r}")
    return value


def _real_option(field: str, value: Any, low: float, high: float, open_low: bool = False) -> float:
    inside = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) \
        and (low < value if open_low else low <= value) and value <= high
    if not inside:
        where = f"> {low}" if high == math.inf else f"in [{low}, {high}]"
        raise ValueError(f"suffix: {field} must be a finite number {where}, got {value!r}")
    return float(value)


class SuffixDrafter:
    """SuffixDecoding over a per-request trie (prompt and output so far) and a global trie of
    earlier outputs that persists across generate calls.

    max_depth: the tries' depth (the longest string counted); match length plus draft depth
        never exceed it. max_match: the longest context suffix matched (< max_depth).
    min_prob: the least path probability of a drafted token. tree: draft a best-first tree of at
        most node_factor * k nodes instead of the most frequent path. match_factor: with a
        number, at most ceil(match_factor * match length) nodes (the paper's adaptive length).
    max_global_nodes: the global trie's bound in nodes (0: remember nothing).
    """

    name: ClassVar[str] = "suffix"
    tree_options: ClassVar[dict[str, Any]] = {"tree": True}  # the options that make it draft trees (bench rows)

    @staticmethod
    def drafts_trees(options: dict[str, Any]) -> bool:
        """Whether these options make it draft trees (tree=True)."""
        return options.get("tree") is True

    def __init__(self, max_depth: int = 24, max_match: int = 8, min_prob: float = 0.1, tree: bool = False,
                 node_factor: int = 4, match_factor: float | None = None, max_global_nodes: int = 262_144) -> None:
        self.max_depth = _int_option("max_depth", max_depth, 2)
        self.max_match = _int_option("max_match", max_match, 1)
        if max_match >= max_depth:
            raise ValueError(f"suffix: max_match ({max_match}) must be below max_depth ({max_depth}), "
                             "or nothing is left to draft after a full match")
        self.min_prob = _real_option("min_prob", min_prob, 0.0, 1.0)
        if not isinstance(tree, bool):
            raise ValueError(f"suffix: tree must be true or false, got {tree!r}")
        self.tree = tree
        self.node_factor = _int_option("node_factor", node_factor, 1)
        self.match_factor = None if match_factor is None else \
            _real_option("match_factor", match_factor, 0.0, math.inf, open_low=True)
        self.memory = OutputMemory(max_depth, _int_option("max_global_nodes", max_global_nodes, 0))
        self._ids: list[int] = []  # the committed sequence seen so far
        self._prompt_length = 0
        self._start([])

    def max_draft_nodes(self, k: int) -> int:
        return self.node_factor * k if self.tree else k

    def remember(self, tokens: Sequence[int]) -> int:
        """Add an output to the global trie now (e.g. a corpus of earlier answers); returns how
        many of its tokens were kept."""
        return self.memory.add(tokens)

    def forget(self) -> None:
        """Drop every remembered output (the global trie) and the request in progress, as a fresh
        instance would start. Benchmarks call it between rounds, so that a round never drafts
        from an earlier round's answer to the same prompt."""
        self.memory = OutputMemory(self.max_depth, self.memory.max_nodes)
        self._ids, self._prompt_length = [], 0
        self._start([])

    def prefill(self, ctx: DraftContext) -> None:
        """Fold the previous request's output into the global trie (if `finish` did not); rebuild
        the per-request one."""
        self._start(ctx.tokens.tolist())

    def finish(self, ctx: DraftContext) -> None:
        """The request ended: fold its output into the global trie now."""
        self._observe(ctx)
        output = self._ids[self._prompt_length :]
        if output:
            self.memory.add(output)
        self._prompt_length = len(self._ids)  # folded: the next request's start adds nothing twice

    def fork(self) -> SuffixDrafter:
        """A drafter for another row of a batch: the same options and the same global trie (what
        every row outputs is remembered for all), a request of its own."""
        twin = copy.copy(self)
        twin._ids, twin._prompt_length = [], 0
        twin._start([])
        return twin

    def commit(self, ctx: DraftContext, num_accepted: int) -> None:
        self._observe(ctx)

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        self._observe(ctx)
        if self._version != self.memory.version:  # the global trie changed: match the tail again
            self._matches = self._walk(self._ids[-self.max_match :])
        best: Speculation | None = None
        for found in (_longest_continued(self._active, self.max_match),
                      _longest_continued(self._matches, self.max_match)):
            if found is not None:
                node, length = found
                budget = self.max_draft_nodes(k)
                if self.match_factor is not None:
                    budget = min(budget, math.ceil(self.match_factor * length))
                spec = speculate(node, k, budget, self.min_prob, self.tree)
                if best is None or spec.score > best.score:
                    best = spec
        device = ctx.tokens.device
        if best is None or best.parents == chain_parents(len(best.tokens)):  # nothing, or a chain
            return Draft(torch.tensor([] if best is None else best.tokens, dtype=torch.long, device=device))
        return Draft(torch.tensor(best.tokens, dtype=torch.long, device=device),
                     parents=torch.tensor(best.parents, dtype=torch.long, device=device))

    def _start(self, prompt: list[int]) -> None:
        """A new request: remember the last one's output, then index the prompt."""
        output = self._ids[self._prompt_length :]
        if output:
            self.memory.add(output)
        self._ids = list(prompt)
        self._prompt_length = len(prompt)
        self._request = SuffixTrie(self.max_depth)
        self._active = self._request.extend(self._request.start(), prompt)  # the context's suffixes
        self._matches = self._walk(prompt[-self.max_match :])  # their nodes in the global trie

    def _walk(self, tail: Sequence[int]) -> list[TrieNode]:
        """The global trie's nodes of the suffixes of `tail`, and mark them current."""
        self._version = self.memory.version
        matches = [self.memory.trie.root]
        for token in tail:
            matches = _advance(matches, token, self.max_match)
        return matches

    def _observe(self, ctx: DraftContext) -> None:
        """Count the tokens committed since the last call (a shorter or different sequence is a
        new request that skipped prefill)."""
        length, seen = ctx.tokens.shape[0], len(self._ids)
        if length == seen:
            return
        if length < seen or seen == 0:
            self._start(ctx.tokens.tolist())
            return
        fresh = ctx.tokens[seen - 1 :].tolist()  # one transfer: the last seen id, then the new ones
        if fresh[0] != self._ids[-1]:
            self._start(ctx.tokens.tolist())
            return
        for token in fresh[1:]:
            self._active = self._request.append(self._active, token)
            self._matches = _advance(self._matches, token, self.max_match)
        self._ids.extend(fresh[1:])
