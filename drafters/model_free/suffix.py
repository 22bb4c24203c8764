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

Every row of a batch keeps a request of its own and shares the global trie. The global trie is
bounded: at most `max_global_nodes` nodes. An output is folded into it when its row finishes
(`finish`), at the row's next `prefill` otherwise, or by `remember`; before each token would overflow the bound the
oldest outputs are evicted, and a single output larger than the bound keeps its first tokens.

Drafts are deterministic (a one-hot q) and siblings are distinct tokens (the children of a
trie node), so the verifier's sample-and-match rule keeps decoding lossless.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from specdec.drafters.model_free.suffix_trie import OutputMemory, Speculation, SuffixTrie, TrieNode, speculate
from specdec.protocols import Capability, DraftContext, Rows
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
    capabilities: ClassVar[frozenset[Capability]] = frozenset({Capability.STATE, Capability.LEARNS, Capability.TREES})
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
        self._requests: dict[int, _Request] = {}  # each row's request in progress

    def max_draft_nodes(self, k: int) -> int:
        return self.node_factor * k if self.tree else k

    def remember(self, tokens: Sequence[int]) -> int:
        """Add an output to the global trie now (e.g. a corpus of earlier answers); returns how
        many of its tokens were kept."""
        return self.memory.add(tokens)

    def forget(self) -> None:
        """Drop every remembered output (the global trie) and the requests in progress, as a fresh
        instance would start. Benchmarks call it between rounds, so that a round never drafts
        from an earlier round's answer to the same prompt."""
        self.memory = OutputMemory(self.max_depth, self.memory.max_nodes)
        self._requests = {}

    def prefill(self, rows: Rows) -> None:
        """Fold each row's previous request's output into the global trie (if `finish` did not);
        start its new request."""
        for row, ctx in rows.items():
            self._start(row, ctx.tokens.tolist())

    def finish(self, rows: Rows) -> None:
        """The rows' requests ended: fold their outputs into the global trie now (every row's output
        is remembered for all)."""
        for row, ctx in rows.items():
            request = self._observe(row, ctx)
            output = request.ids[request.prompt_length :]
            if output:
                self.memory.add(output)
            request.prompt_length = len(request.ids)  # folded: the next request's start adds nothing twice

    def commit(self, rows: Rows, accepted: Mapping[int, int]) -> None:
        for row, ctx in rows.items():
            self._observe(row, ctx)

    def propose(self, rows: Rows, k: Mapping[int, int]) -> dict[int, Draft]:
        return {row: self._propose(self._observe(row, ctx), ctx, k[row]) for row, ctx in rows.items()}

    def _propose(self, request: _Request, ctx: DraftContext, k: int) -> Draft:
        if request.version != self.memory.version:  # the global trie changed: match the tail again
            request.matches = self._walk(request, request.ids[-self.max_match :])
        best: Speculation | None = None
        for found in (_longest_continued(request.active, self.max_match),
                      _longest_continued(request.matches, self.max_match)):
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

    def _start(self, row: int, prompt: list[int]) -> _Request:
        """A new request of `row`: remember its last one's output, then index the prompt."""
        old = self._requests.get(row)
        if old is not None and old.ids[old.prompt_length :]:
            self.memory.add(old.ids[old.prompt_length :])
        request = self._requests[row] = _Request(list(prompt), len(prompt), SuffixTrie(self.max_depth))
        request.active = request.trie.extend(request.trie.start(), prompt)  # the context's suffixes
        request.matches = self._walk(request, prompt[-self.max_match :])  # their nodes in the global trie
        return request

    def _walk(self, request: _Request, tail: Sequence[int]) -> list[TrieNode]:
        """The global trie's nodes of the suffixes of `tail`, and mark them current for `request`."""
        request.version = self.memory.version
        matches = [self.memory.trie.root]
        for token in tail:
            matches = _advance(matches, token, self.max_match)
        return matches

    def _observe(self, row: int, ctx: DraftContext) -> _Request:
        """Row `row`'s request, counting the tokens committed since the last call (a shorter or
        different sequence is a new request that skipped prefill)."""
        request = self._requests.get(row)
        length = ctx.tokens.shape[0]
        if request is None or length < len(request.ids) or not request.ids:
            return self._start(row, ctx.tokens.tolist())
        seen = len(request.ids)
        if length == seen:
            return request
        fresh = ctx.tokens[seen - 1 :].tolist()  # one transfer: the last seen id, then the new ones
        if fresh[0] != request.ids[-1]:
            return self._start(row, ctx.tokens.tolist())
        for token in fresh[1:]:
            request.active = request.trie.append(request.active, token)
            request.matches = _advance(request.matches, token, self.max_match)
        request.ids.extend(fresh[1:])
        return request


@dataclass
class _Request:
    """One row's request: its committed ids, where its prompt ends (its output starts), its
    per-request trie, the trie nodes of the context's suffixes there (`active`) and in the global
    trie (`matches`, as of the global trie's `version`)."""

    ids: list[int]
    prompt_length: int
    trie: SuffixTrie
    active: list[TrieNode] = field(default_factory=list)
    matches: list[TrieNode] = field(default_factory=list)
    version: int = -1
