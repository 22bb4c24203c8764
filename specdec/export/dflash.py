"""DFlash drafters (Chen et al. 2026, arXiv 2602.06036) in the published z-lab layout, the one vLLM
(`method: dflash`, `DFlashQwen3ForCausalLM`) and SGLang (`--speculative-algorithm DFLASH`,
`DFlashDraftModel`) both load (`specdec.export.layouts`).

specdec reads and writes this layout itself (`specdec.drafters.parallel.dflash_files`), so an export
is the checkpoint rewritten by specdec's writer (config.json: a Qwen3 config with `architectures:
["DFlashDraftModel"]`, `block_size`, `rope_theta` and `num_target_layers` at the top level,
`dflash_config.{mask_token_id, target_layer_ids, block_size}`, no `auto_map`; model.safetensors:
unprefixed `fc`, `hidden_norm`, `layers.N.*` with q/k/v and gate/up apart, `norm`; no embedding or
LM head, the engines share the target's) and reads back as it is. What the engines cannot serve is
refused: both capture the output of target layer ℓ as the residual entering layer ℓ + 1, so a
drafter fusing the last layer's output (which transformers gives after the final norm) is refused,
and one whose config does not say how many layers its target has needs --target to say it.
With --target the drafter's hidden size and vocabulary are checked against the target's, and
`num_target_layers` and a long enough `max_position_embeddings` are taken from it.

Serving (B = block_size; vLLM counts the B - 1 masked slots, SGLang the whole block):

    vllm serve TARGET --speculative-config '{"method": "dflash", "model": "OUT", "num_speculative_tokens": 15}' \\
        --attention-backend flash_attn
    python -m sglang.launch_server --model TARGET --speculative-algorithm DFLASH \\
        --speculative-draft-model-path OUT --speculative-num-draft-tokens 16
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from specdec.drafters.parallel.dflash_files import dflash_config, load_dflash
from specdec.drafters.parallel.dflash_head import DFlashHead
from specdec.export.fit import check_target_sizes, target_config
from specdec.staging import write_json

__all__ = ["SOURCE_FILES", "read", "write"]

SOURCE_FILES = ("config.json", "model.safetensors")  # what SRC, a hub id, gives
WEIGHTS = "model.safetensors"


def _target_layers(head: DFlashHead, src: Path, target: Path | None) -> tuple[int, int | None]:
    """(the target's layer count, its context length or None), from --target or else the config;
    refuses layer ids the engines do not capture."""
    spec = head.spec
    positions = None
    if target is not None:
        check_target_sizes("dflash", src, spec.layer.hidden_size, spec.layer.vocab_size, target)
        config = target_config(target)
        layers, positions = int(config.num_hidden_layers), getattr(config, "max_position_embeddings", None)
        if spec.num_target_layers is not None and spec.num_target_layers != layers:
            raise ValueError(f"export: the DFlash drafter at {str(src)!r} was made for a target of "
                             f"{spec.num_target_layers} layers but --target {str(target)!r} has {layers}; export "
                             "a drafter trained for this target")
    elif spec.num_target_layers is not None:
        layers = spec.num_target_layers
    else:
        raise ValueError(f"export: the DFlash drafter at {str(src)!r} does not say how many layers its target has "
                         "(no num_target_layers), which SGLang checks its layer ids against; pass --target")
    served = layers - 2  # layer ℓ is captured entering layer ℓ + 1 <= L - 1
    if any(i > served for i in spec.target_layer_ids):
        raise ValueError(f"export: the DFlash drafter at {str(src)!r} fuses target layers "
                         f"{list(spec.target_layer_ids)}, but vLLM and SGLang capture the outputs of layers "
                         f"0..{served} of a {layers}-layer target (layer ℓ as the residual entering ℓ + 1); "
                         "export a drafter that fuses earlier layers")
    return layers, None if positions is None else int(positions)


def write(src: Path, engine: str, staging: Path, target: Path | None) -> None:
    """Write the DFlash checkpoint at `src` into `staging` in the z-lab layout (the same for both engines)."""
    from safetensors.torch import save_file

    head = load_dflash(src)
    layers, positions = _target_layers(head, src, target)
    tensors = {key: value.detach().contiguous().cpu() for key, value in head.state_dict().items()
               if not key.startswith("rotary_emb.")}
    save_file(tensors, str(staging / WEIGHTS), metadata={"format": "pt"})
    config = dflash_config(replace(head.spec, num_target_layers=layers))
    if positions is not None:  # the engines refuse a context longer than the drafter says it takes
        config["max_position_embeddings"] = max(int(config.get("max_position_embeddings") or 0), positions)
    write_json(staging / "config.json", config)


def read(exported: Path, engine: str, scratch: Path) -> Path:
    """The directory specdec's DFlash loader reads for an export: the export itself."""
    return exported
