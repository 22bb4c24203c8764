"""Which layers a self-drafting target keeps: a training-free search on calibration text, cached
per model.

The procedure (in the spirit of Zhang et al. 2023, "Draft & Verify", whose skipped layers are
chosen to keep the draft close to the target, and Xia et al. 2025, "SWIFT", whose choice is made
on the fly from the target's own outputs, without training):

1. Run the full model over the calibration ids once, keeping its keys and values: its top-1 next
   token at each position is what a greedy verify accepts there.
2. Measure a view as it drafts: in one forward over the ids, its query at position t sees the
   FULL model's keys and values of positions < t (the committed cache it drafts over) and its
   own at t, so its top-1 at t is the first draft token after ids[: t + 1]; its agreement is the
   share of positions where that equals step 1's.
3. Skip each layer alone: its importance is how far the agreement drops (ties broken by the mean
   KL divergence of the two next-token distributions, then by index). Rank the layers, least
   important first.
4. For n = 1 .. L-1, skip the n least important: measure the view's agreement a_n and the
   modelled speedup of a chain of k drafts (after Leviathan et al. 2023, "Fast Inference from
   Transformers via Speculative Decoding", expected tokens per step and walltime improvement)

       S(n) = (1 - a^(k+1)) / ((1 - a) (1 + k c)),

   (tokens per verify over the cost of a verify plus k drafts, both in target forwards), and
   keep the n of largest S. A draft token's cost c is what a memory-bound decode step reads
   (`draft_cost`): the kept layers' parameters and the LM head's, over the whole model's
   (the embedding's one row is negligible): the head a draft cannot skip is a large share of a
   small model's step. The first draft's agreement stands in for the acceptance of every
   draft position (deeper drafts also read the view's own keys and values of earlier drafts).

`search_layers` is a pure function of (model, calibration ids, k); `cached_search` stores its
answer as JSON under `$XDG_CACHE_HOME/specdec/self-layers` (else `~/.cache/specdec/self-layers`),
keyed by a fingerprint of the model (its config and a sample of every parameter's bytes), the
calibration ids and k, written atomically.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from specdec.drafters.draft_models.layer_view import check_view, crop_layers, decoder_layers, layer_view, num_layers
from specdec.runtime.cache import KV
from specdec.runtime.forward import model_forward
from specdec.runtime.obstacles import static_obstacle
from specdec.runtime.windows import attention_kinds, layer_masks

__all__ = ["Calibration", "LayerChoice", "cache_directory", "cached_search", "draft_cost", "fingerprint", "modelled_speedup",
           "search_layers", "stdlib_calibration"]

PROCEDURE = "first-draft agreement, single-skip ranking, prefix sweep by modelled speedup, bytes read, v3"  # in every cache key
SAMPLES = 256  # elements of each parameter hashed into the fingerprint


@dataclass(frozen=True)
class LayerChoice:
    """What the search chose for a chain of k drafts: the kept layers (ascending), the view's top-1
    agreement with the full model and its modelled speedup; the ranking (least important first)
    and each layer's agreement when skipped alone, index by layer."""

    kept: tuple[int, ...]
    k: int
    agreement: float
    speedup: float
    ranking: tuple[int, ...]
    single_agreement: tuple[float, ...]


def modelled_speedup(agreement: float, k: int, cost: float) -> float:
    """(1 - a^(k+1)) / ((1 - a) (1 + k c)): expected tokens per verify of k drafts accepted with
    probability a each, over a verify plus k drafts costing c target forwards each."""
    tokens = sum(agreement**i for i in range(k + 1))  # (1 - a^(k+1)) / (1 - a), exact at a = 1
    return tokens / (1.0 + k * cost)


class Calibration:
    """The full model's next-token log-probabilities on calibration ids [T] and its keys and values
    of every position, on a cache of 2T columns, against which a view drafts each position as it
    would in decoding: a view's query at position t sees the FULL model's keys and values of
    positions < t (the committed cache) and its own at t, so its top-1 at t is the first draft
    token after the committed prefix ids[: t + 1], every position in one forward."""

    def __init__(self, model: PreTrainedModel, ids: torch.Tensor) -> None:
        self.model, self.ids = model, ids
        length = ids.shape[0]
        if static_obstacle(model) is not None and attention_kinds(model).sliding:
            raise ValueError(f"{type(model).__name__} has sliding-window layers but no static cache, on which the "
                             "search lays out its calibration")
        self.kv = KV(model, 2 * length if static_obstacle(model) is None else None)
        self.kinds = attention_kinds(model)
        columns = torch.arange(2 * length, device=ids.device)  # (2T,)
        self.positions = torch.arange(length, device=ids.device)  # (T,)
        self.keys = (columns % length)[None]  # (1, 2T): column c holds position c mod T
        rows = self.positions[:, None]
        causal = (columns[None] <= rows) & (columns[None] < length)  # (T, 2T): the prefix and itself
        self.drafted = (columns[None] < rows) | (columns[None] == rows + length)  # (T, 2T): the prefix, then itself
        self.reference = self._forward(model, causal)  # (T, V)
        self.kv.advanced(length)

    def _forward(self, model: PreTrainedModel, visible: torch.Tensor) -> torch.Tensor:
        """Log-probabilities [T, V] of a forward of the ids seeing the columns `visible` [T, 2T] names."""
        width = self.kv.mask_width(self.ids.shape[0])
        dtype = next(self.model.parameters()).dtype
        mask = layer_masks(self.kinds, visible[None, :, :width], self.positions[None], self.keys[:, :width], dtype)
        logits, _ = model_forward(model, self.kv.cache, self.ids, 0, (), mask, self.positions[None])  # (T, V)
        return torch.log_softmax(logits.float(), dim=-1)

    def first_drafts(self, kept: list[int]) -> torch.Tensor:
        """Log-probabilities [T, V] of the first draft token of the view keeping `kept` after each
        prefix ids[: t + 1]."""
        length = self.ids.shape[0]
        try:
            return self._forward(layer_view(self.model, kept, check=False).model, self.drafted)  # (T, V)
        finally:
            if not self.kv.static:
                crop_layers(self.kv.cache, length)  # the view grew only the layers it ran
            self.kv.retreat(length)

    def agreement(self, kept: list[int]) -> tuple[float, float]:
        """(top-1 agreement with the full model, mean KL(full || view)) of the first draft token of
        the view keeping `kept`, over every calibration position."""
        drafted = self.first_drafts(kept)  # (T, V)
        same = (self.reference.argmax(-1) == drafted.argmax(-1)).double().mean()
        kl = (self.reference.exp() * (self.reference - drafted)).sum(-1).double().mean()
        return float(same), float(kl)


def draft_cost(model: PreTrainedModel, kept: Sequence[int]) -> float:
    """c: the parameters a step of the view reads (the `kept` layers and the LM head) over those a
    step of the whole model reads (every layer and the LM head)."""
    layers = model.get_submodule(decoder_layers(model))
    sizes = [sum(p.numel() for p in layer.parameters()) for layer in layers]  # type: ignore[union-attr]
    head = sum(p.numel() for p in model.get_output_embeddings().parameters())
    return (sum(sizes[i] for i in kept) + head) / (sum(sizes) + head)


def search_layers(model: PreTrainedModel, ids: torch.Tensor, k: int) -> LayerChoice:
    """The layers to keep for drafting chains of k tokens, by the procedure in the module
    docstring, measured on calibration ids [T]."""
    total = num_layers(model)
    if total < 2:
        raise ValueError(f"{type(model).__name__} has {total} decoder layer; a self-draft needs one to skip")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"the search needs the number of draft tokens k >= 1, got {k!r}")
    ids = ids.to(device=next(model.parameters()).device, dtype=torch.long).reshape(-1)  # (T,)
    if ids.numel() < 1:
        raise ValueError("the layer search needs at least one calibration token")
    config = model.config.get_text_config()
    limit = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    ids = ids[: int(limit)] if limit else ids  # the positions the model has
    with torch.inference_mode():
        check_view(model, layer_view(model, [i for i in range(total) if i != total // 2], check=False))
        calibration = Calibration(model, ids)
        single = [calibration.agreement([i for i in range(total) if i != layer]) for layer in range(total)]
        ranking = sorted(range(total), key=lambda layer: (-single[layer][0], single[layer][1], layer))
        best: LayerChoice | None = None
        for n in range(1, total):
            kept = sorted(ranking[n:])
            agreement = single[ranking[0]][0] if n == 1 else calibration.agreement(kept)[0]
            speedup = modelled_speedup(agreement, k, draft_cost(model, kept))
            if best is None or speedup > best.speedup:
                best = LayerChoice(tuple(kept), k, agreement, speedup, tuple(ranking),
                                   tuple(a for a, _ in single))
    assert best is not None
    return best


def fingerprint(model: PreTrainedModel) -> str:
    """sha256 over the model's class, its config (JSON) and, for every parameter, its name, shape,
    dtype and the bytes of SAMPLES elements spread over it: a model changed anywhere in its weights
    almost surely changes it, without hashing gigabytes."""
    digest = hashlib.sha256(type(model).__name__.encode())
    try:
        digest.update(model.config.to_json_string(use_diff=False).encode())
    except (TypeError, ValueError):  # a config holding something JSON cannot write
        digest.update(repr(model.config).encode())
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            flat = parameter.detach().reshape(-1)
            sample = flat[:: max(1, flat.numel() // SAMPLES)][:SAMPLES].to("cpu").contiguous()
            digest.update(f"{name}:{tuple(parameter.shape)}:{parameter.dtype}".encode())
            digest.update(sample.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def cache_directory() -> Path:
    """$XDG_CACHE_HOME/specdec/self-layers, else ~/.cache/specdec/self-layers."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "specdec" / "self-layers"


def cached_search(model: PreTrainedModel, ids: torch.Tensor, k: int, source: str = "",
                  directory: Path | None = None) -> LayerChoice:
    """`search_layers(model, ids, k)`, read from the cache when this model, these ids and k were
    searched before, else searched and stored (`source` names the calibration text in the file).
    An unreadable entry is searched again; an unwritable directory warns and stores nothing."""
    ids = ids.reshape(-1).to("cpu", torch.long)
    key = {"procedure": PROCEDURE, "model": fingerprint(model),
           "calibration": hashlib.sha256(ids.numpy().tobytes()).hexdigest(), "k": k}
    name = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]
    folder = directory if directory is not None else cache_directory()
    path = folder / f"{type(model).__name__}-{name}.json"
    stored = _read(path, key)
    if stored is not None:
        return stored
    choice = search_layers(model, ids, k)
    entry = {**key, "architecture": type(model).__name__, "calibration_source": source,
             "calibration_tokens": int(ids.numel()), **asdict(choice)}
    try:
        _write_atomically(path, json.dumps(entry, indent=1))
    except OSError as error:
        warnings.warn(f"specdec: self: cannot cache the chosen layers in {str(folder)!r}: {error}", stacklevel=2)
    return choice


def _read(path: Path, key: dict[str, Any]) -> LayerChoice | None:
    try:
        entry = json.loads(path.read_text(encoding="utf-8"))
        if any(entry.get(field) != value for field, value in key.items()):
            return None
        return LayerChoice(tuple(entry["kept"]), int(entry["k"]), float(entry["agreement"]), float(entry["speedup"]),
                           tuple(entry["ranking"]), tuple(entry["single_agreement"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_atomically(path: Path, text: str) -> None:
    """Write `text` to a temporary file beside `path`, then rename it into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def stdlib_calibration(tokenizer: Any, count: int) -> torch.Tensor:
    """The first `count` ids [<= count] of the standard library's held-out source files
    (`specdec.data.corpus.stdlib_corpus`, sorted by path), joined by blank lines and tokenized by
    `tokenizer` (an `encode(text)` method or a call returning `input_ids`) without special tokens."""
    from specdec.data.corpus import read_text, stdlib_corpus

    ids: list[int] = []
    for path in stdlib_corpus().heldout:
        text = read_text(path)
        if not text:
            continue
        ids.extend(_encode(tokenizer, text[: 6 * count] + "\n\n"))  # a file's head is plenty
        if len(ids) >= count:
            break
    return torch.tensor(ids[:count], dtype=torch.long)


def _encode(tokenizer: Any, text: str) -> list[int]:
    if hasattr(tokenizer, "encode"):
        return list(tokenizer.encode(text, add_special_tokens=False))
    return list(tokenizer(text)["input_ids"])
