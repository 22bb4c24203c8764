"""How a tree's siblings were drawn, and the q each sibling is verified against.

A tree verifier tests the children of a node one after another, and each test needs the
distribution the child was drawn from *given everything drawn before it*: its ancestors and its
elder siblings. That depends on how the drafter drew the siblings, which it declares
(`Draft.siblings`):

- ``"iid"``: each sibling an independent draw from its row of `probs` (SpecInfer, Miao et al.
  2024, §4.3); duplicates are allowed and each is tried. The row is the child's q as it stands.
- ``"without_replacement"``: the siblings of one node are successive draws without replacement
  from one shared row, in draft order (e.g. Gumbel-top-k: the order of the perturbed scores;
  Jeon et al. 2024, "Recursive Speculative Decoding"). Sibling j was drawn from that row with
  siblings 0..j-1 removed and renormalised, and is verified against exactly that.
- ``"distinct"``: deterministic candidates (no `probs`, e.g. a top-k): each a one-hot q, the
  sample-and-match rule.

Verifying a draft under the wrong declaration biases the output, so what can be checked is
(`sibling_fault`): sampled declarations need rows and deterministic ones none; siblings drawn
without replacement never repeat a token and share their row. The one lie a single draft cannot
show, distinct i.i.d. draws declared as drawn without replacement or the reverse, is why the
drafters draw siblings through one helper that returns the declaration with the draw.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specdec.trees import children

__all__ = ["SIBLING_DRAWS", "declared_siblings", "sibling_fault", "sibling_rows"]

SIBLING_DRAWS = ("iid", "without_replacement", "distinct")


def declared_siblings(siblings: str | None, sampled: bool) -> str:
    """The declaration of a draft (`Draft.siblings`), None read as today's default: "iid" for a
    draft with rows, "distinct" for one without."""
    if siblings is None:
        return "iid" if sampled else "distinct"
    return siblings


def sibling_fault(siblings: object, tokens: Sequence[int] | None, parents: Sequence[int] | None,
                  probs: torch.Tensor | None) -> str | None:
    """What breaks the declaration `siblings` in this draft (None: nothing). tokens, parents: [n]
    lists, or None for a chain (only the declaration against the probs is checked: a chain has
    no siblings); probs: [n, V] or None."""
    if siblings is not None and siblings not in SIBLING_DRAWS:
        return f"siblings={siblings!r} is not one of {', '.join(map(repr, SIBLING_DRAWS))}"
    drawn = declared_siblings(siblings, probs is not None)  # type: ignore[arg-type]
    if drawn == "distinct":
        if probs is not None:
            return ("siblings='distinct' declares deterministic candidates, but the draft reports probs; "
                    "a sampled tree declares siblings='iid' or 'without_replacement'")
        return None
    if probs is None:
        return (f"siblings={drawn!r} declares sampled siblings, but the draft has no probs (the q each was "
                "drawn from); deterministic candidates declare siblings='distinct'")
    if drawn == "without_replacement" and tokens is not None and parents is not None:
        for group in children(parents):
            seen: dict[int, int] = {}
            for node in group:
                if tokens[node] in seen:
                    return (f"nodes {seen[tokens[node]]} and {node} are siblings with the same token "
                            f"{tokens[node]}, impossible when drawn without replacement; a drafter that "
                            "draws siblings independently declares siblings='iid'")
                seen[tokens[node]] = node
                if node != group[0] and not torch.equal(probs[node], probs[group[0]]):
                    return (f"nodes {group[0]} and {node} are siblings drawn without replacement but report "
                            "different rows; report the one row they were drawn from (the verifier removes "
                            "the elder siblings itself)")
    return None


def sibling_rows(probs: torch.Tensor | None, tokens: Sequence[int], parents: Sequence[int],
                 siblings: str | None) -> torch.Tensor | None:
    """The q [n, V] each node is verified against: the distribution it was drawn from given its
    ancestors and its elder siblings (None: every node deterministic, one-hot).

    For "without_replacement" sibling j's row is the shared row with siblings 0..j-1 zeroed and
    renormalised; otherwise the rows as reported."""
    if probs is None or declared_siblings(siblings, True) != "without_replacement":
        return probs
    rows = probs.clone()
    for group in children(parents):
        for j in range(1, len(group)):
            row = probs[group[0]].clone()  # (V,)
            row[[tokens[elder] for elder in group[:j]]] = 0.0
            rows[group[j]] = row / row.sum()
    return rows
