"""Finding and loading checkpoints: a local directory, a GGUF file or a hub id resolved through the
local hub cache, a causal LM in eval mode and its tokenizer.

`resolve_checkpoint` turns what a user typed (`DIR`, `FILE.gguf`, `org/name`, `org/name@revision`)
into a local directory, or a GGUF file as is: `load_causal_lm` and `load_tokenizer` read one
through `specdec.gguf`. Hub ids go through huggingface_hub's `snapshot_download`, cache only when
HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE is set; the cache directory and offline mode are read
from the environment at each call, not when huggingface_hub was imported.

A hub repository is never fetched whole: each caller names the files its checkpoint needs, as
glob patterns (`files=`, huggingface_hub's `allow_patterns`): `MODEL_FILES` for a transformers
causal LM (the default), `TOKENIZER_FILES` for a tokenizer, and each drafter's loader its own
(`specdec.drafters.feature_heads.medusa.HUB_FILES`, `specdec.drafters.feature_heads.weights.HEAD_FILES`,
`specdec.drafters.feature_heads.mtp_files.MTP_FILES`). PyTorch pickles among them (`*.bin`, `*.pt` and their
indexes) are fetched only from a repository that has no safetensors file among them, so a
repository that ships both formats is not downloaded twice.

Checkpoints that carry extra modules (an MTP module's `mtp.*` tensors beside the model's own)
load fine, but transformers prints a load report for the keys it does not use and progress
bars for every shard. specdec reads those keys itself (`specdec.drafters.feature_heads.mtp`), so the report
is noise: these loaders raise transformers' log level to errors while they run.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from specdec.distributed.sharding import check_tensor_parallel
from specdec.gguf import is_gguf, load_gguf_model, load_gguf_tokenizer

__all__ = ["MODEL_FILES", "TOKENIZER_FILES", "hub_cache_dir", "hub_offline", "is_gguf", "load_causal_lm",
           "load_tokenizer", "quiet_transformers", "resolve_checkpoint"]

# org/name, optionally @revision (a branch, tag or commit hash)
_HUB_ID = re.compile(r"(?P<repo>[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*)(?:@(?P<revision>[\w./-]+))?")

# What AutoTokenizer reads: the tokenizer's own files (fast, sentencepiece, BPE, tiktoken), its
# chat templates, and the config that names its class.
TOKENIZER_FILES = ("config.json", "tokenizer*", "special_tokens_map.json", "added_tokens.json", "vocab.*",
                   "merges.txt", "*.model", "*.tiktoken", "chat_template.*", "additional_chat_templates/*")
# What AutoModelForCausalLM reads, and its tokenizer: the config, the generation config and the
# weights in transformers' names (single or sharded with their index), safetensors else PyTorch.
MODEL_FILES = ("generation_config.json", "model*.safetensors", "model.safetensors.index.json", "pytorch_model*.bin",
               "pytorch_model.bin.index.json", *TOKENIZER_FILES)
_PICKLES = (".bin", ".pt", ".pth")  # weight files (and their indexes) fetched only where no safetensors file is


def hub_cache_dir() -> Path:
    """The hub cache directory, from HF_HUB_CACHE, HUGGINGFACE_HUB_CACHE or HF_HOME as set now."""
    env = os.environ
    home = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME") or os.path.join("~", ".cache"),
                                              "huggingface")
    cache = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE") or os.path.join(home, "hub")
    return Path(os.path.expandvars(os.path.expanduser(cache)))


def hub_offline() -> bool:
    """Whether HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE is set to a true value now."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.strip().upper() in ("1", "ON", "YES", "TRUE")


def resolve_checkpoint(name: str | Path, what: str, files: Sequence[str] = MODEL_FILES) -> Path:
    """The local directory holding the checkpoint `name`: an existing directory as is, a GGUF file
    (`specdec.gguf.is_gguf`) as is, else the hub cache's snapshot of the hub id
    `org/name[@revision]`, holding the repository's files that match the glob patterns `files`
    (downloaded unless offline; see the module docstring for pickles).

    Raises FileNotFoundError saying where it looked and what to do; `what` names the checkpoint
    in the message ("target", "medusa heads", ...).
    """
    if isinstance(files, str) or not files:
        raise ValueError(f"files must be a non-empty sequence of glob patterns, got {files!r}")
    path = Path(name).expanduser()
    if path.is_dir():
        return path
    text = str(name)
    if is_gguf(path):
        if not path.is_file():
            raise FileNotFoundError(f"{what} {text!r}: no GGUF file {str(path.absolute())!r}; pass an existing .gguf "
                                    "file, a checkpoint directory or a hub id")
        return path
    match = _HUB_ID.fullmatch(text)
    if match is None:
        raise FileNotFoundError(f"{what} {text!r} is not a directory (looked for {str(path.absolute())!r}; so no "
                                "config.json) and not a hub id of the form org/name or org/name@revision; pass a "
                                "checkpoint directory or a hub id")
    from huggingface_hub.errors import EntryNotFoundError

    repo, revision = match["repo"], match["revision"]
    cache, offline = hub_cache_dir(), hub_offline()
    try:
        return _snapshot(repo, revision, files, cache, offline)
    except (OSError, ValueError, EntryNotFoundError) as error:
        mode = ("on: HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE is set" if offline
                else f"off; the hub answered: {' '.join(str(error).split())[:300].rstrip('.')}")
        raise FileNotFoundError(
            f"{what} {text!r}: no local directory {str(path.absolute())!r}, and hub id {repo!r} (revision "
            f"{revision or 'main'}) is not in the hub cache {str(cache)!r} (offline mode {mode}). Pass a local "
            f"checkpoint directory, or fill that cache with `hf download {repo}` (on a machine with network, "
            "then copy the cache)" + (", or unset HF_HUB_OFFLINE to download it now" if offline else "")
        ) from error


def _snapshot(repo: str, revision: str | None, files: Sequence[str], cache: Path, offline: bool) -> Path:
    """The snapshot of `repo` holding its `files`: the pickles among them only where the others
    bring no safetensors file."""
    from huggingface_hub import snapshot_download

    def fetch(patterns: list[str]) -> Path:
        return Path(snapshot_download(repo, revision=revision, cache_dir=cache, local_files_only=offline,
                                      allow_patterns=patterns))

    pickles = [pattern for pattern in files if pattern.removesuffix(".index.json").endswith(_PICKLES)]
    others = [pattern for pattern in files if pattern not in pickles]
    if others:
        snapshot = fetch(others)
        safetensors = [pattern for pattern in others if pattern.endswith(".safetensors")]
        if not pickles or any(next(snapshot.glob(pattern), None) is not None for pattern in safetensors):
            return snapshot
    return fetch(pickles)  # a repository with PyTorch weights only


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
    directory = resolve_checkpoint(path, what)
    if not (directory / "config.json").is_file():
        raise FileNotFoundError(f"{str(directory)!r} is not a {what} checkpoint directory (no config.json)")
    return directory


def load_causal_lm(path: str | Path, dtype: torch.dtype | None = None, tp: int = 1,
                   quantize: str | None = None) -> PreTrainedModel:
    """The causal LM at `path` (a directory, a GGUF file or a hub id: `resolve_checkpoint`), in eval
    mode; `tp` > 1 shards it over that many processes under torchrun, after the checks of
    `specdec.distributed.sharding.check_tensor_parallel` (which fail before any weight is read).
    A GGUF file's weights are dequantised to `dtype` (float32 when None) and cannot be sharded.
    `quantize` ("int8") quantizes its linear layers once loaded (`specdec.quantize`)."""
    if quantize is not None:
        from specdec.runtime.quantize import SCHEMES, quantize as quantized

        if quantize not in SCHEMES:  # before any weight is read
            raise ValueError(f"quantize={quantize!r} is not a known scheme; choose one of {', '.join(SCHEMES)}")
        if tp != 1:
            raise ValueError(f"quantize={quantize!r} with tp={tp}: a sharded model's weights are split tensors "
                             "that specdec does not quantize; load it with tp=1 or without quantize")
        return quantized(load_causal_lm(path, dtype, tp), quantize)  # type: ignore[return-value]
    located = resolve_checkpoint(path, "model")
    if is_gguf(located):
        if tp != 1:
            raise ValueError(f"GGUF file {str(located)!r} cannot be sharded with tp={tp}: transformers' tensor "
                             "parallelism loads checkpoint directories; convert it first with `specdec convert "
                             f"{str(located)} --out DIR` and pass DIR")
        with quiet_transformers():
            return load_gguf_model(located, dtype)
    directory = _checked(located, "model")
    kwargs: dict[str, Any] = {"local_files_only": True}
    if dtype is not None:
        kwargs["dtype"] = dtype
    if tp != 1:  # every rank holds 1/tp of each projection: transformers' tensor parallelism
        from transformers import AutoConfig
        from transformers.distributed import DistributedConfig

        check_tensor_parallel(AutoConfig.from_pretrained(directory, local_files_only=True), tp)
        kwargs["distributed_config"] = DistributedConfig(tp_size=tp)
    with quiet_transformers():
        return AutoModelForCausalLM.from_pretrained(directory, **kwargs).eval()


def load_tokenizer(path: str | Path) -> Any:
    """The tokenizer (AutoTokenizer) at `path`, a directory, a GGUF file (its metadata's tokenizer
    and chat template) or a hub id (`resolve_checkpoint`, its `TOKENIZER_FILES` only)."""
    directory = resolve_checkpoint(path, "tokenizer", TOKENIZER_FILES)
    if is_gguf(directory):
        with quiet_transformers():
            return load_gguf_tokenizer(directory)
    with quiet_transformers():
        return AutoTokenizer.from_pretrained(directory, local_files_only=True)
