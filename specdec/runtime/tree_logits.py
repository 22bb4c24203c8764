"""The target's logits over a tree forward's rows, computed a row at a time where the model
allows: a verifier's walk visits at most depth + 1 of a tree's rows, and the LM head (V columns
per row, the widest matmul of a small model) then runs on those alone."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["TreeLogits", "head_reproduces"]


class TreeLogits:
    """The logits of a tree forward's n + 1 rows, a row at a time on demand; the root's row
    comes with the forward, and `full` holds every row when the model computed them all.
    `extra`: the logits of the drafter's extra rows that rode after the tree's, if any."""

    def __init__(self, hidden: torch.Tensor, head: nn.Module, full: torch.Tensor | None,
                 root: torch.Tensor | None = None, states: torch.Tensor | None = None,
                 extra: torch.Tensor | None = None) -> None:
        self.hidden = hidden  # (n+1, H) last-layer, post-final-norm
        self.states = states  # (n+1, m * H): the hidden states of the layers a drafter asked for
        self.extra = extra  # (m, V): the logits of the extra rows after the tree's (`ExtraRows`), if any
        self._head = head
        self._full = full  # (n+1, V) when every row was computed by the model
        self._rows: dict[int, torch.Tensor] = {} if root is None else {0: root}
        self._dtype = root.dtype if root is not None else None  # the model's logits dtype

    def row(self, r: int) -> torch.Tensor:
        """Logits [V] of row r (0 = the root, i + 1 = node i)."""
        if self._full is not None:
            return self._full[r]
        if r not in self._rows:
            logits = self._head(self.hidden[r : r + 1])[0]
            self._rows[r] = logits if self._dtype is None else logits.to(self._dtype)
        return self._rows[r]

    def argmax(self, r: int) -> int:
        return int(self.row(r).argmax())

    def all(self) -> torch.Tensor:
        """Logits [n + 1, V] of every row."""
        if self._full is not None:
            return self._full
        return torch.stack([self.row(r) for r in range(self.hidden.shape[0])])


_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")


def head_reproduces(config: object, head: nn.Module, states: torch.Tensor, logits: torch.Tensor) -> bool:
    """Whether the model's logits [n, V] are its LM head applied to its last hidden states [n, H]:
    not with logit soft-capping or scaling (read from the config, then checked numerically to a
    few ulps of the hidden states' dtype), nor if the hidden states were taken before a norm."""
    for name in _LOGIT_TRANSFORMS:
        value = getattr(config, name, None)
        if value is not None and value not in (0, 1, 1.0):
            return False
    mine = head(states).float()  # (n, V)
    reference = logits.float()
    if mine.shape != reference.shape:
        return False
    scale = max(float(reference.abs().max()), 1.0) if reference.numel() else 1.0
    return bool((mine - reference).abs().max() <= 16 * torch.finfo(states.dtype).eps * scale)
