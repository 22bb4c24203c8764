"""The verify probe: what the target thinks of a given continuation, from ONE forward.

The prefix and the continuation are tokenised separately and fed together in a single target
forward. Position i of the continuation is checked the way the greedy verifier checks draft
token i (`specdec.verifier.verify_greedy`): accepted while it equals the target's argmax; at the
first mismatch the verifier would emit the argmax as the correction and stop, so later
positions are never reached. Each position also reports the target's probability of the token
(at temperature 1), its rank, and the target's top tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from specdec.verifier import verify_greedy

__all__ = ["ProbePosition", "ProbeResult", "probe"]


@dataclass(frozen=True)
class ProbePosition:
    """One continuation token: its id, the target's view of it, and the greedy verdict."""

    token: int
    probability: float  # p(token) at temperature 1
    rank: int  # 1 = the target's argmax
    top: tuple[tuple[int, float], ...]  # the target's top tokens and probabilities
    verdict: str  # "accepted", "rejected" (the first mismatch) or "not reached"


@dataclass(frozen=True)
class ProbeResult:
    """The probe of one continuation: per position, the accepted count and the correction."""

    positions: tuple[ProbePosition, ...]
    num_accepted: int
    correction: int  # the token the verifier emits after the accepted ones (correction or bonus)
    bonus: bool  # True when every continuation token was accepted


@torch.inference_mode()
def probe(model: PreTrainedModel, prefix: list[int], continuation: list[int], top: int = 5) -> ProbeResult:
    """Check `continuation` after `prefix` with one forward of `model` (greedy verifier's rule)."""
    if not prefix:
        raise ValueError("the prefix tokenises to no tokens; give a non-empty prefix")
    if not continuation:
        raise ValueError("the continuation tokenises to no tokens; give a non-empty continuation")
    if top < 1:
        raise ValueError(f"top must be >= 1, got {top}")
    device = model.get_output_embeddings().weight.device
    ids = torch.tensor(prefix + continuation, device=device)[None]  # (1, P + C)
    n = len(continuation)
    logits = model(input_ids=ids, logits_to_keep=n + 1).logits[0].float()  # (C + 1, V): rows P-1 .. P+C-1
    probs = logits.softmax(-1)
    drafted = torch.tensor(continuation, device=device)
    verdict = verify_greedy(logits.argmax(-1), drafted)
    values, indices = probs[:n].topk(min(top, probs.shape[-1]), dim=-1)  # (C, top)
    chosen = probs[torch.arange(n, device=device), drafted]  # (C,)
    ranks = (probs[:n] > chosen[:, None]).sum(-1) + 1  # (C,)
    positions = []
    for i, token in enumerate(continuation):
        state = "accepted" if i < verdict.num_accepted else "rejected" if i == verdict.num_accepted else "not reached"
        positions.append(ProbePosition(token, float(chosen[i]), int(ranks[i]),
                                       tuple(zip(indices[i].tolist(), values[i].tolist())), state))
    return ProbeResult(tuple(positions), verdict.num_accepted, int(verdict.tokens[-1]), verdict.num_accepted == n)
