"""EAGLE-3 heads in the layouts vLLM (speculators `Eagle3Speculator`) and SGLang
(`LlamaForCausalLMEagle3` with `eagle_config`) load (`specdec.export.layouts`).

specdec reads both layouts itself (`specdec.drafters.feature_heads.eagle3_files`), so an export is written with
specdec's own writers and reads back as it is. What the engines cannot represent is refused:
- SGLang starts the layer's residual from the unnormed fusion, so a head with
  `norm_before_residual` true has no SGLang layout;
- both engines fuse exactly three layers, captured in ascending order, from the residual stream
  entering target layers 0..L-1 (vLLM's and SGLang's Llama forward; vLLM not index 0), so other
  heads, and a head reading index L (the post-norm last layer), cannot be served;
- `norm_before_residual` is written explicitly in both (vLLM reads an absent field as true).
With `--target` the export is checked against the target's sizes and layers, its embedding is
stored as `embed_tokens.weight` (both engines then use it), and vLLM's verifier names the target.
"""

from __future__ import annotations

from pathlib import Path

import torch

from specdec.drafters.feature_heads.eagle3_files import SAFETENSORS, eagle3_config, eagle3_tensors, load_eagle3
from specdec.drafters.feature_heads.eagle3_head import SGLANG, SPECULATORS, Eagle3Head, default_layers
from specdec.drafters.feature_heads.weights import HEAD_FILES
from specdec.export.fit import target_config
from specdec.staging import write_json

__all__ = ["SOURCE_FILES", "read", "write"]

SOURCE_FILES = HEAD_FILES  # what SRC, a hub id, gives

LAYOUT = {"vllm": SPECULATORS, "sglang": SGLANG}


def _check(head: Eagle3Head, engine: str, src: Path, target: Path | None) -> torch.Tensor | None:
    """Refuse what `engine` cannot serve; the target's embedding when `target` is given."""
    layers = head.spec.layers
    if layers is not None and (len(layers) != 3 or any(a >= b for a, b in zip(layers, layers[1:]))):
        raise ValueError(f"export: the EAGLE-3 head at {str(src)!r} fuses hidden states {layers}; vLLM and SGLang "
                         "fuse exactly three layers, captured in ascending order, so serve three distinct ascending "
                         "layers")
    if engine == "vllm" and layers is not None and layers[0] == 0:
        raise ValueError(f"export: the EAGLE-3 head at {str(src)!r} reads hidden state 0 (the embeddings), which "
                         "vLLM's Llama forward does not capture (no residual before layer 0); export it --to sglang")
    if engine == "sglang" and head.spec.norm_before_residual:
        raise ValueError(f"export: the EAGLE-3 head at {str(src)!r} sets norm_before_residual, but SGLang's "
                         "LlamaForCausalLMEagle3 starts the residual from the unnormed fusion "
                         "(python/sglang/srt/models/llama_eagle3.py); export it --to vllm")
    if target is None:
        return None
    config = target_config(target)
    layers = layers or default_layers(int(config.num_hidden_layers))
    served = int(config.num_hidden_layers) - 1
    if any(not 0 <= i <= served for i in layers):
        raise ValueError(f"export: the EAGLE-3 head at {str(src)!r} reads hidden states {tuple(layers)}, but the "
                         f"engines capture the residual stream entering layers 0..{served} of --target "
                         f"{str(target)!r} (index {served + 1}, the post-norm last layer, is not captured)")
    for name, ours, theirs in (("vocabulary", head.config.vocab_size, config.vocab_size),
                               ("hidden size", head.spec.target_hidden_size, config.hidden_size)):
        if ours != theirs:
            raise ValueError(f"export: the EAGLE-3 head at {str(src)!r} was made for a target {name} of {ours} but "
                             f"--target {str(target)!r} has {theirs}; export a head trained for this target")
    if head.embed_tokens is not None:
        return None
    from specdec.checkpoints import load_causal_lm

    embedding = load_causal_lm(target).get_input_embeddings().weight
    if embedding.shape[1] != head.config.hidden_size:
        raise ValueError(f"export: the target's embedding {tuple(embedding.shape)} does not fit the EAGLE-3 head's "
                         f"hidden size {head.config.hidden_size}")
    return embedding


def write(src: Path, engine: str, staging: Path, target: Path | None) -> None:
    """Write the EAGLE-3 checkpoint at `src` into `staging` in `engine`'s layout."""
    from safetensors.torch import save_file

    head = load_eagle3(src)
    embedding = _check(head, engine, src, target)
    layout = LAYOUT[engine]
    save_file(eagle3_tensors(head, layout, embedding), str(staging / SAFETENSORS), metadata={"format": "pt"})
    verifier = None
    if target is not None:
        verifier = {"name_or_path": str(target), "architectures": list(target_config(target).architectures or [])}
    write_json(staging / "config.json", eagle3_config(head, layout, verifier))


def read(exported: Path, engine: str, scratch: Path) -> Path:
    """The directory specdec's EAGLE-3 loader reads for an export: the export itself."""
    return exported
