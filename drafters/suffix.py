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

import heapq
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from specdec.protocols import DraftContext
from specdec.trees import chain_parents
from specdec.types import Draft

__all__ = ["OutputMemory", "Speculation", "SuffixDrafter", "SuffixTrie", "TrieNode", "speculate"]


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
