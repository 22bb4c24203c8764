"""The Medusa heads as a torch module (Cai et al. 2024, "Medusa: Simple LLM Inference Acceleration
Framework with Multiple Decoding Heads"): head i (0-based) maps the target's hidden state at
position t (whose own LM head gave token t+1) to token t+2+i through L residual blocks
`x + SiLU(W x + b)` and a bias-free projection to the vocabulary. Its state-dict keys are the
public Medusa-1 ones (`specdec.drafters.feature_heads.medusa_files` reads and writes them)."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["MedusaHeads", "ResBlock"]


class ResBlock(nn.Module):
    """x + SiLU(W x + b), H -> H."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + nn.functional.silu(self.linear(x))


class MedusaHeads(nn.Module):
    """K heads of L residual blocks and a vocabulary projection; state-dict keys are the
    public Medusa ones (`{h}.{l}.linear.weight|bias`, `{h}.{L}.weight`)."""

    def __init__(self, num_heads: int, num_layers: int, hidden_size: int, vocab_size: int) -> None:
        super().__init__()
        for field, value, least in (("num_heads", num_heads, 1), ("num_layers", num_layers, 0),
                                    ("hidden_size", hidden_size, 1), ("vocab_size", vocab_size, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"medusa: {field} must be an int >= {least}, got {value!r}")
        self.num_heads, self.num_layers = num_heads, num_layers
        self.hidden_size, self.vocab_size = hidden_size, vocab_size
        for h in range(num_heads):
            blocks = [ResBlock(hidden_size) for _ in range(num_layers)]
            self.add_module(str(h), nn.Sequential(*blocks, nn.Linear(hidden_size, vocab_size, bias=False)))

    def forward(self, hidden: torch.Tensor, count: int | None = None) -> torch.Tensor:
        """Logits [count, ..., V] of the first `count` heads (default all) for hidden [..., H]."""
        heads = list(self.children())[: self.num_heads if count is None else count]
        return torch.stack([head(hidden) for head in heads])
