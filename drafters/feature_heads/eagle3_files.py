"""Reading and writing EAGLE-3 checkpoint directories in the SGLang and speculators layouts
(`specdec.drafters.feature_heads.eagle3_head` describes both)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from specdec.drafters.feature_heads.eagle3_head import SGLANG, SPECULATORS, Eagle3Head, read_spec, sglang_layer_ids
from specdec.drafters.feature_heads.weights import HEAD_FILES, PICKLE, SAFETENSORS, read_weights

__all__ = ["PICKLE", "SAFETENSORS", "eagle3_config", "eagle3_tensors", "load_eagle3", "save_eagle3"]

_IGNORED = ("rotary_emb.inv_freq",)
_NOT_LAYER = ("architectures", "transformers_version", "draft_vocab_size", "target_hidden_size", "eagle_config",
              "norm_before_residual", "eagle_aux_hidden_state_layer_ids")  # EAGLE-3's fields, not the layer's
_OPTIONAL_WITH_FULL_VOCAB = ("d2t", "t2d")  # a head over the whole target vocabulary may omit the mapping


def _our_names(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Tensor names in the SGLang layout: speculators' `layers.0.*` become `midlayer.*`."""
    return {("midlayer." + key[len("layers.0."):] if key.startswith("layers.0.") else key): value
            for key, value in weights.items() if not key.endswith(_IGNORED)}


def load_eagle3(path: str | Path) -> Eagle3Head:
    """Read an EAGLE-3 checkpoint directory of either layout (weights in their stored dtype)."""
    from specdec.checkpoints import resolve_checkpoint

    path = resolve_checkpoint(path, "EAGLE-3 head", HEAD_FILES)
    config_file = path / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"eagle3: {str(path)!r} is not an EAGLE-3 checkpoint (no config.json)")
    spec = read_spec(config_file)
    file, weights = read_weights(path, "eagle3")
    weights = _our_names(weights)
    head = Eagle3Head(spec, own_embedding="embed_tokens.weight" in weights)
    expected = head.state_dict()
    unexpected = sorted(key for key in weights if key not in expected)
    if unexpected:
        raise ValueError(f"eagle3: {file} holds keys an EAGLE-3 head does not have: {unexpected[:5]}; is it an "
                         "EAGLE-1 or Medusa checkpoint?")
    full_vocab = spec.draft_vocab_size == spec.layer.vocab_size
    for key, tensor in expected.items():
        if key not in weights:
            if full_vocab and key in _OPTIONAL_WITH_FULL_VOCAB:
                weights[key] = tensor if key == "d2t" else torch.ones_like(tensor)  # the identity mapping
                continue
            raise KeyError(f"eagle3: {file} lacks {key!r} (expected shape {tuple(tensor.shape)})")
        if weights[key].shape != tensor.shape:
            raise ValueError(f"eagle3: {file}: {key!r} has shape {tuple(weights[key].shape)}, expected "
                             f"{tuple(tensor.shape)} from {config_file}")
    _check_mapping(weights["d2t"], weights["t2d"], spec.layer.vocab_size, file)
    dtype = weights["fc.weight"].dtype
    head.to(dtype=dtype)
    head.load_state_dict({key: weights[key] if key in ("d2t", "t2d") else weights[key].to(dtype) for key in expected})
    head.files = (config_file, file)
    return head.eval()


def _check_mapping(d2t: torch.Tensor, t2d: torch.Tensor, vocab: int, file: Path) -> None:
    """d2t must map the draft vocabulary to distinct target ids, which t2d marks."""
    targets = torch.arange(d2t.shape[0]) + d2t.long()
    outside = ((targets < 0) | (targets >= vocab)).nonzero()
    if outside.numel():
        draft = int(outside[0, 0])
        raise ValueError(f"eagle3: {file}: 'd2t' maps draft id {draft} to {int(targets[draft])}, outside the target "
                         f"vocabulary [0, {vocab}); d2t holds offsets: target id = draft id + d2t[draft id]")
    if torch.unique(targets).numel() != targets.numel():
        raise ValueError(f"eagle3: {file}: 'd2t' maps two draft ids to one target id")
    marked = torch.zeros(vocab, dtype=torch.bool)
    marked[targets] = True
    if not torch.equal(marked, t2d.bool()):
        raise ValueError(f"eagle3: {file}: 't2d' marks {int(t2d.bool().sum())} target ids, 'd2t' maps to "
                         f"{targets.numel()}, and the two sets differ; they must describe one draft vocabulary")


def eagle3_config(head: Eagle3Head, layout: str = SGLANG, verifier: dict[str, Any] | None = None,
                  speculative_tokens: int = 3) -> dict[str, Any]:
    """The config.json of `head` in `layout` (SGLANG or SPECULATORS); `verifier` is speculators'
    `speculators_config.verifier` ({"name_or_path", "architectures"})."""
    if layout not in (SGLANG, SPECULATORS):
        raise ValueError(f"eagle3: unknown layout {layout!r}; choose {SGLANG!r} or {SPECULATORS!r}")
    spec = head.spec
    layer = {key: value for key, value in head.config.to_dict().items()
             if not key.startswith("_") and key not in _NOT_LAYER}
    layer.update(model_type="llama", num_hidden_layers=1, tie_word_embeddings=False)
    rope = dict(layer.get("rope_parameters") or {})
    if "rope_theta" in rope:  # as engines on transformers 4.x read them
        layer["rope_theta"] = rope.pop("rope_theta")
        if rope.get("rope_type", "default") != "default":
            layer["rope_scaling"] = rope
    if layout == SGLANG:
        config = {**layer, "architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": spec.draft_vocab_size,
                  "target_hidden_size": spec.target_hidden_size, "norm_before_residual": spec.norm_before_residual,
                  "eagle_config": {"use_aux_hidden_state": True}}
        if spec.layers is not None:
            config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = sglang_layer_ids(spec.layers)
        return config
    config = {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
              "transformer_layer_config": {**layer, "architectures": ["LlamaForCausalLM"]},
              "draft_vocab_size": spec.draft_vocab_size, "target_hidden_size": spec.target_hidden_size,
              "norm_before_residual": spec.norm_before_residual,
              "speculators_config": {
                  "algorithm": "eagle3", "default_proposal_method": "greedy",
                  "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": speculative_tokens,
                                        "verifier_accept_k": 1, "accept_tolerance": 0.0}],
                  "verifier": verifier or {"name_or_path": None, "architectures": []}}}
    if spec.layers is not None:
        config["eagle_aux_hidden_state_layer_ids"] = list(spec.layers)
    return config


def eagle3_tensors(head: Eagle3Head, layout: str = SGLANG, embedding: torch.Tensor | None = None
                   ) -> dict[str, torch.Tensor]:
    """The tensors of `head` under `layout`'s names; `embedding` [V, H] is stored as
    `embed_tokens.weight` in place of the head's own (if it has one)."""
    state = {key: tensor.detach().cpu().contiguous() for key, tensor in head.state_dict().items()}
    if embedding is not None:
        state["embed_tokens.weight"] = embedding.detach().to("cpu", head.fc.weight.dtype).contiguous()
    if layout == SPECULATORS:
        state = {("layers.0." + key[len("midlayer."):] if key.startswith("midlayer.") else key): value
                 for key, value in state.items()}
    return state


def save_eagle3(head: Eagle3Head, path: str | Path, layout: str = SGLANG, embedding: torch.Tensor | None = None,
                verifier: dict[str, Any] | None = None, speculative_tokens: int = 3, safe: bool = True) -> Path:
    """Write `head` as an EAGLE-3 checkpoint directory in `layout` (`eagle3_config`, `eagle3_tensors`)."""
    config = eagle3_config(head, layout, verifier, speculative_tokens)
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True, default=str) + "\n")
    state = eagle3_tensors(head, layout, embedding)
    if safe:
        from safetensors.torch import save_file

        save_file(state, str(path / SAFETENSORS), metadata={"format": "pt"})
    else:
        torch.save(state, path / PICKLE)
    return path
