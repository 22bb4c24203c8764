"""Loading local transformers checkpoints quietly: a causal LM in eval mode and its tokenizer.

Checkpoints that carry extra modules (an MTP module's `mtp.*` tensors beside the model's own)
load fine, but transformers prints a load report for the keys it does not use and progress
bars for every shard. specdec reads those keys itself (`specdec.drafters.mtp`), so the report
is noise: these loaders raise transformers' log level to errors while they run.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

__all__ = ["load_causal_lm", "load_tokenizer", "quiet_transformers"]


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """Within the block, transformers logs errors only and shows no progress bars."""
    from transformers.utils import logging

    level = logging.get_verbosity()
    bars = logging.is_progress_bar_enabled()
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        logging.set_verbosity(level)
        if bars:
            logging.enable_progress_bar()


def _checked(path: str | Path, what: str) -> Path:
    directory = Path(path)
    if not (directory / "config.json").is_file():
        raise FileNotFoundError(f"{str(directory)!r} is not a {what} checkpoint directory (no config.json)")
    return directory


def load_causal_lm(path: str | Path, dtype: torch.dtype | None = None) -> PreTrainedModel:
    """The causal LM saved at `path`, in eval mode, from local files only."""
    directory = _checked(path, "model")
    kwargs: dict[str, Any] = {"local_files_only": True}
    if dtype is not None:
        kwargs["dtype"] = dtype
    with quiet_transformers():
        return AutoModelForCausalLM.from_pretrained(directory, **kwargs).eval()


def load_tokenizer(path: str | Path) -> Any:
    """The tokenizer saved at `path` (AutoTokenizer), from local files only."""
    with quiet_transformers():
        return AutoTokenizer.from_pretrained(Path(path), local_files_only=True)
