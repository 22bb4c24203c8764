"""The suffix tries of SuffixDecoding (Oliaro et al. 2024, arXiv 2411.04975): token counts of
every string of at most `max_depth` tokens, grown by O(max_depth) per appended token; a bounded
memory of earlier outputs that evicts the oldest; and the speculation read off a matched node
(the most frequent path, or a best-first tree of the paths whose score stays >= min_prob).

A node stands for a string s; its `count` is how often s occurs, its `total` how often s is
followed by a token (the sum of its children's counts). A child's probability is its count over
its parent's total; a node's score is the product along its path. `specdec.drafters.model_free.suffix`
drafts with these.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from specdec.trees import chain_parents

__all__ = ["OutputMemory", "Speculation", "SuffixTrie", "TrieNode", "speculate"]


class TrieNode:
    """One string of the trie: its occurrences, how many of them continue, and the children."""

    __slots__ = ("children", "count", "total")

    def __init__(self) -> None:
        self.count = 0  # occurrences of the string
        self.total = 0  # occurrences followed by a token: the sum of the children's counts
        self.children: dict[int, TrieNode] | None = None  # None while a leaf (saves a dict per leaf)


class SuffixTrie:
    """Counts of every substring of at most `max_depth` tokens of some sequences."""

    def __init__(self, max_depth: int) -> None:
        self.max_depth = max_depth
        self.root = TrieNode()
        self.nodes = 0  # nodes besides the root

    def start(self) -> list[TrieNode]:
        """The active nodes of a new, empty sequence: the root alone."""
        return [self.root]

    def append(self, active: list[TrieNode], token: int) -> list[TrieNode]:
        """Count one more token of the sequence whose suffixes (depth 0 up) are `active`; return
        the new suffixes shorter than max_depth. Creates at most len(active) nodes."""
        new = [self.root]
        for node in active:
            if node.children is None:
                node.children = {}
            child = node.children.get(token)
            if child is None:
                child = node.children[token] = TrieNode()
                self.nodes += 1
            child.count += 1
            node.total += 1
            if len(new) < self.max_depth:  # the child's depth is len(new)
                new.append(child)
        return new

    def extend(self, active: list[TrieNode], tokens: Sequence[int]) -> list[TrieNode]:
        """`append` each token in turn."""
        for token in tokens:
            active = self.append(active, token)
        return active

    def remove(self, tokens: Sequence[int]) -> None:
        """Uncount a whole sequence added earlier; nodes whose count drops to 0 are freed."""
        for start in range(len(tokens)):
            parent = self.root
            for token in tokens[start : start + self.max_depth]:
                assert parent.children is not None, "removing a sequence the trie does not hold"
                child = parent.children[token]
                child.count -= 1
                parent.total -= 1
                if child.count == 0:  # its subtree empties on this same walk
                    del parent.children[token]
                    self.nodes -= 1
                if not parent.children:
                    parent.children = None
                parent = child

    def find(self, tokens: Sequence[int]) -> TrieNode | None:
        """The node of `tokens`, or None when they never occurred (or are longer than max_depth)."""
        node: TrieNode | None = self.root
        for token in tokens:
            if node is None or node.children is None:
                return None
            node = node.children.get(token)
        return node

    def count(self, tokens: Sequence[int]) -> int:
        """How often `tokens` occur (the number of tokens for an empty string)."""
        node = self.find(tokens)
        return 0 if node is None else (node.total if not tokens else node.count)

    def continuations(self, tokens: Sequence[int]) -> dict[int, float]:
        """P(next token | `tokens`): each child's count over the node's total ({} if none)."""
        node = self.find(tokens)
        if node is None or not node.children:
            return {}
        return {token: child.count / node.total for token, child in node.children.items()}


class OutputMemory:
    """Earlier outputs in one SuffixTrie of at most `max_nodes` nodes, the oldest evicted first.

    The outputs themselves are kept too (to subtract their counts on eviction), at most
    `max_nodes` tokens of them: an answer repeated many times adds no node, yet must not grow
    the memory."""

    def __init__(self, max_depth: int, max_nodes: int) -> None:
        self.trie = SuffixTrie(max_depth)
        self.max_nodes = max_nodes
        self.outputs: deque[list[int]] = deque()  # the remembered outputs, oldest first
        self.tokens = 0  # the tokens of `outputs`
        self.version = 0  # bumped by every change (invalidates matches into the trie)

    def add(self, tokens: Sequence[int]) -> int:
        """Remember an output; returns how many of its first tokens were kept (all, unless it
        alone outgrows the bound). The trie never holds more than max_nodes nodes, nor the
        outputs more than max_nodes tokens."""
        trie, active, kept = self.trie, self.trie.start(), 0
        for token in tokens:
            while self.outputs and (trie.nodes + len(active) > self.max_nodes  # append adds <= len(active)
                                    or self.tokens + kept + 1 > self.max_nodes):
                self.tokens -= len(self.outputs[0])
                trie.remove(self.outputs.popleft())
            if trie.nodes + len(active) > self.max_nodes or self.tokens + kept + 1 > self.max_nodes:
                break
            active = trie.append(active, int(token))
            kept += 1
        if kept:
            self.outputs.append([int(token) for token in tokens[:kept]])
            self.tokens += kept
        self.version += 1
        return kept


@dataclass(frozen=True)
class Speculation:
    """A draft from one trie: tokens and parents (breadth-first, -1 = the root's child) and its
    score, the sum of its nodes' path probabilities (the expected number of accepted tokens)."""

    tokens: list[int]
    parents: list[int]
    score: float


def speculate(node: TrieNode, depth: int, budget: int, min_prob: float, tree: bool) -> Speculation:
    """The speculation from a matched `node`: at most `budget` nodes, `depth` deep, every
    node's path probability >= min_prob; a tree (best-first) or the most frequent path."""
    if tree:
        return _best_first(node, depth, budget, min_prob)
    return _most_frequent_path(node, min(depth, budget), min_prob)


def _most_frequent(node: TrieNode) -> tuple[int, TrieNode]:
    """The most frequent child and its token (the smallest id among equals)."""
    assert node.children is not None
    return min(node.children.items(), key=lambda item: (-item[1].count, item[0]))


def _most_frequent_path(node: TrieNode, length: int, min_prob: float) -> Speculation:
    tokens: list[int] = []
    score, probability = 0.0, 1.0
    while len(tokens) < length and node.children:
        token, child = _most_frequent(node)
        probability *= child.count / node.total
        if probability < min_prob:
            break
        tokens.append(token)
        score += probability
        node = child
    return Speculation(tokens, chain_parents(len(tokens)), score)


def _best_first(root: TrieNode, depth: int, budget: int, min_prob: float) -> Speculation:
    """Greedy speculation tree: repeatedly add the candidate child of highest path probability."""
    heap: list[tuple[float, int, int, int, TrieNode]] = []  # (-probability, depth, parent, token, node)

    def push_children(node: TrieNode, probability: float, index: int, level: int) -> None:
        if level > depth or not node.children:
            return
        for token, child in node.children.items():
            p = probability * child.count / node.total
            if p >= min_prob:
                heapq.heappush(heap, (-p, level, index, token, child))  # (parent, token) is unique

    tokens: list[int] = []
    parents: list[int] = []
    levels: list[int] = []
    score = 0.0
    push_children(root, 1.0, -1, 1)
    while heap and len(tokens) < budget:
        negative, level, parent, token, node = heapq.heappop(heap)
        tokens.append(token)
        parents.append(parent)
        levels.append(level)
        score -= negative
        push_children(node, -negative, len(tokens) - 1, level + 1)
    order = sorted(range(len(tokens)), key=lambda i: (levels[i], i))  # breadth-first, siblings by probability
    position = {old: new for new, old in enumerate(order)}
    return Speculation([tokens[i] for i in order], [position[parents[i]] if parents[i] >= 0 else -1 for i in order],
                       score)
