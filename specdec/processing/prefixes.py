"""The prefix of every row the pipeline processes: the committed ids every row shares, then the
row's own suffix (a verify position's draft prefix, a tree node's path, a drafter's own draft so far).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = ["Prefixes", "chain_paths", "tree_paths"]


@dataclass(frozen=True)
class Prefixes:
    """committed: LongTensor [T] (prompt, then generated ids); prompt_length: where the generated
    part of `committed` starts; suffixes: LongTensor [R, L], row r's own ids after the committed
    ones, padded on the right with -1 (L = 0: every row's prefix is the committed ids)."""

    committed: torch.Tensor
    prompt_length: int
    suffixes: torch.Tensor

    @classmethod
    def of(cls, committed: torch.Tensor, prompt_length: int, suffixes: Sequence[Sequence[int] | torch.Tensor],
           ) -> Prefixes:
        """From one id list (or LongTensor) per row."""
        rows = [s.tolist() if isinstance(s, torch.Tensor) else list(s) for s in suffixes]
        width = max((len(r) for r in rows), default=0)
        padded = torch.full((len(rows), width), -1, dtype=torch.long)
        for i, row in enumerate(rows):
            padded[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        return cls(committed, prompt_length, padded.to(committed.device))

    @classmethod
    def of_draft(cls, committed: torch.Tensor, prompt_length: int, draft: torch.Tensor,
                 paths: Sequence[Sequence[int]]) -> Prefixes:
        """Rows whose suffixes are draft[paths[r]]: draft LongTensor [n], paths of node indices."""
        width = max((len(p) for p in paths), default=0)
        index = torch.full((len(paths), width), -1, dtype=torch.long)
        for r, path in enumerate(paths):
            index[r, : len(path)] = torch.tensor(list(path), dtype=torch.long)
        index = index.to(draft.device)
        suffixes = torch.where(index >= 0, draft[index.clamp(min=0)] if draft.numel() else index, -1)
        return cls(committed, prompt_length, suffixes)

    @classmethod
    def of_verify(cls, committed: torch.Tensor, prompt_length: int, draft: torch.Tensor,
                  parents: Sequence[int] | None) -> Prefixes:
        """The rows of a draft's verify: a chain's (parents None) or a tree's (`tree_paths`)."""
        paths = chain_paths(draft.shape[0]) if parents is None else tree_paths(parents)
        return cls.of_draft(committed, prompt_length, draft, paths)

    @property
    def rows(self) -> int:
        return self.suffixes.shape[0]

    def suffix(self, row: int) -> list[int]:
        """Row `row`'s own ids."""
        ids = self.suffixes[row]
        return ids[ids >= 0].tolist()

    def ids(self, row: int) -> torch.Tensor:
        """Row `row`'s whole prefix as transformers' processors take it: LongTensor [1, T + len]."""
        ids = self.suffixes[row]
        return torch.cat([self.committed, ids[ids >= 0]]).unsqueeze(0)


def chain_paths(n: int) -> list[list[int]]:
    """A chain's n + 1 verify rows: row i follows the first i draft tokens."""
    return [list(range(i)) for i in range(n + 1)]


def tree_paths(parents: Sequence[int]) -> list[list[int]]:
    """A tree's verify rows: row 0 the root (no draft node), row j + 1 the path to node j, root
    side first (parents[j] < j, -1 for the root's children)."""
    paths: list[list[int]] = [[]]
    for node, parent in enumerate(parents):
        paths.append((paths[parent + 1] if parent >= 0 else []) + [node])
    return paths
