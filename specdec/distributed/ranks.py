"""One verdict on every rank: the processes that hold a sharded target take the same decisions.

A target sharded across processes (transformers' tensor or pipeline parallelism under
`torchrun`) runs each forward as a collective: every rank must feed the same ids, or the
all-reduces mix different sequences. Each rank also runs its own copy of the loop, drafter and
generator, and a random draw taken on one rank is not taken on another: at temperature > 0 two
ranks given different seeds accept different tokens (a bug serving engines have shipped).
specdec keeps them together with three agreements, all from the ranks' leader (rank 0 of the
group that holds the model):

1. the seed: once per generation, the leader's seed replaces every rank's, so generators
   start equal and replicated drafters draw alike;
2. the draft: once per step, before the verify forward, the leader's laid-out draft (ids,
   tree parents, extra rows) is what every rank feeds;
3. the verdict: once per step, after the forward, the leader's numbers accepted, tokens and
   paths are what every rank commits.

Each agreement is one broadcast of a small integer tensor. With `SPECDEC_CHECK_RANKS=1` every
rank also gathers every rank's own draft and verdict and raises `RankDisagreement`, naming the
ranks that differ from the leader, as soon as one does (all ranks raise together, so none waits
on a collective the others left).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

__all__ = ["CHECK_VARIABLE", "RankDisagreement", "Ranks", "model_ranks"]

CHECK_VARIABLE = "SPECDEC_CHECK_RANKS"


class RankDisagreement(RuntimeError):
    """Ranks that hold one target reached different drafts or verdicts."""


@dataclass(frozen=True)
class Ranks:
    """The processes that hold one model together.

    group: their process group; rank, size: this process's rank in it and its size; leader:
    the global rank of group rank 0, whose decisions every rank takes; device: where
    collectives' tensors live (CPU for gloo); check: gather and compare every agreement.
    """

    group: Any
    rank: int
    size: int
    leader: int
    device: torch.device
    check: bool

    def agree(self, payload: torch.Tensor, what: str) -> torch.Tensor:
        """The leader's `payload` (a 1-D integer tensor, the same length on every rank), on this
        rank's device. With the check on, first raise if any rank's own payload differs."""
        import torch.distributed as dist

        local = payload.to(device=self.device, dtype=torch.long, copy=True).contiguous()  # a copy: the
        # broadcast writes into it, and the caller compares its own payload with the leader's
        if self.check:
            gathered = [torch.empty_like(local) for _ in range(self.size)]
            dist.all_gather(gathered, local, group=self.group)
            differ = [r for r in range(1, self.size) if not torch.equal(gathered[r], gathered[0])]
            if differ:
                named = f"ranks {', '.join(str(r) for r in differ)} disagree" if len(differ) > 1 else \
                    f"rank {differ[0]} disagrees"
                raise RankDisagreement(f"{named} with rank 0 on the {what}: rank 0 has {_shown(gathered[0])}, "
                                       f"rank {differ[0]} has {_shown(gathered[differ[0]])}")
            return gathered[0].to(payload.device)
        dist.broadcast(local, src=self.leader, group=self.group)
        return local.to(payload.device)

    def agree_seed(self, seed: int) -> int:
        """The leader's seed: ranks may be given different seeds, or none, and every rank takes the
        leader's (never checked: differing seeds are allowed)."""
        return self.agree_value(seed)

    def agree_value(self, value: int) -> int:
        """The leader's `value` (an int), broadcast without a check: a setting the leader decides for
        every rank, such as the generation's seed or its verification rule (whose walk over a tree
        decides which rows, and so which collectives, each rank computes)."""
        import torch.distributed as dist

        payload = torch.tensor([value], dtype=torch.long, device=self.device)
        dist.broadcast(payload, src=self.leader, group=self.group)
        return int(payload.item())


def model_ranks(model: nn.Module) -> Ranks | None:
    """The ranks holding `model` when it is sharded across processes (transformers' tensor or
    pipeline parallelism, or DTensor parameters); None for a model whole on this process."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() == 1:
        return None
    mesh = getattr(model, "_device_mesh", None)
    sharded = (mesh is not None and mesh.size() > 1) or getattr(model, "_pp_stage", None) is not None \
        or any(_is_dtensor(p) for p in model.parameters())
    if not sharded:
        return None
    world = dist.get_world_size()
    if mesh is not None and mesh.size() != world:
        raise ValueError(f"the model is sharded over {mesh.size()} of the {world} processes; specdec decodes a model "
                         "held by every process of the group (launch as many processes as the model's shards)")
    group = dist.group.WORLD
    backend = dist.get_backend(group)
    device = torch.device("cpu") if backend == "gloo" else _parameter_device(model)
    return Ranks(group, dist.get_rank(group), world, dist.get_global_rank(group, 0), device,
                 check=os.environ.get(CHECK_VARIABLE, "") not in ("", "0"))


def _is_dtensor(tensor: torch.Tensor) -> bool:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # a torch without DTensor shards nothing this way
        return False
    return isinstance(tensor, DTensor)


def _parameter_device(model: nn.Module) -> torch.device:
    for parameter in model.parameters():
        return torch.device(parameter.device.type, parameter.device.index) if parameter.device.type != "meta" \
            else torch.device("cpu")
    return torch.device("cpu")


def _shown(payload: torch.Tensor) -> str:
    values = payload.tolist()
    return str(values if len(values) <= 16 else values[:16] + ["..."])
