"""The process group a sharded target runs in: this process's rank and the group's size, the
checks that make a bad `--tp` fail before any weight is read (a process group to shard over,
`torchrun`; as many processes as shards; attention heads the shards divide evenly), and rank 0
alone writing output.

Under `torchrun --nproc_per_node N`, `specdec.checkpoints.load_causal_lm(path, tp=N)` gives every
process its 1/N of each attention and MLP projection (transformers' `DistributedConfig(tp_size=N)`,
the model's own tensor-parallel plan); the forward's all-reduces leave the same logits and hidden
states on every rank. specdec then decodes it as any target (`specdec.distributed.ranks` keeps the
ranks agreed).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["agree_object", "check_tensor_parallel", "in_process_group", "is_main_process", "process_rank",
           "rank_zero_first", "rank_zero_output", "world_size"]


def in_process_group() -> bool:
    """Whether this process belongs to a group of several: launched by torchrun (WORLD_SIZE > 1)
    or with torch.distributed initialized over more than one process."""
    return world_size() > 1


def process_rank() -> int:
    """This process's global rank (0 outside a process group)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0"))


def is_main_process() -> bool:
    """Whether this process writes results: rank 0, or the only process."""
    return process_rank() == 0


def check_tensor_parallel(config: Any, tp: int, what: str = "--tp") -> None:
    """Raise ValueError naming the problem when `config`'s model cannot be split `tp` ways here."""
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise ValueError(f"{what} must be an int >= 1, got {tp!r}")
    if tp == 1:
        return
    import importlib.util

    if importlib.util.find_spec("accelerate") is None:
        raise ValueError(f"{what} {tp}: transformers' tensor parallelism needs accelerate; "
                         "pip install 'specdec[distributed]' (or accelerate)")
    if not in_process_group():
        raise ValueError(f"{what} {tp} needs a process group of {tp} processes; launch with "
                         f"torchrun --nproc_per_node {tp} -m specdec ...")
    world = world_size()
    if world != tp:
        raise ValueError(f"{what} {tp} shards the model over {tp} processes, but torchrun started {world}; "
                         f"launch with --nproc_per_node {tp}")
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = getattr(text, "num_attention_heads", None)
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    for name, count in (("num_attention_heads", heads), ("num_key_value_heads", kv_heads)):
        if isinstance(count, int) and count % tp:
            raise ValueError(f"{what} {tp} does not divide the model's {name} ({count}); choose a --tp that "
                             f"divides {count}")


def world_size() -> int:
    """Processes in this process's group: torch.distributed's world, else torchrun's WORLD_SIZE, else 1."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return int(os.environ.get("WORLD_SIZE", "1"))


@contextlib.contextmanager
def rank_zero_output() -> Iterator[None]:
    """Run a command so that only rank 0 prints its results: under torchrun, join the process
    group (gloo for CPU tensors, NCCL for CUDA ones) and silence every other rank's stdout (its
    errors still reach stderr); leave the group at the end. Outside torchrun, nothing changes."""
    import torch.distributed as dist

    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or not dist.is_available():
        yield
        return
    joined = not dist.is_initialized()
    if joined:
        from datetime import timedelta

        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        # two hours, as transformers waits: rank 0 may build the zoo or evaluate while the others wait
        dist.init_process_group(backend="cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo",
                                timeout=timedelta(hours=2))
    try:
        if process_rank() == 0:
            yield
        else:
            with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):
                yield
    finally:
        sys.stdout.flush()
        if joined and dist.is_initialized():
            dist.destroy_process_group()


@contextlib.contextmanager
def rank_zero_first() -> Iterator[None]:
    """Run the body on every rank, rank 0's first (the others wait at a barrier until it is done):
    for work whose result rank 0 leaves on disk for the others, such as building the zoo."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        yield
        return
    if dist.get_rank() != 0:
        dist.barrier()
    yield
    if dist.get_rank() == 0:
        dist.barrier()


def agree_object(value: Any) -> Any:
    """Rank 0's `value` (any picklable object) on every rank of the process group; `value` itself
    outside one. For decisions a command takes from timings, which differ from rank to rank."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]
