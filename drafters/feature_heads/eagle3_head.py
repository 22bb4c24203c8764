"""The EAGLE-3 head and its two checkpoint layouts (Li et al. 2025, "EAGLE-3: Scaling up Inference
Acceleration of Large Language Models via Training-Time Test", arXiv 2503.01840).

Depth 1 reads g = fc(cat of the target's hidden states at three layers) [3·H_t -> H]; the one
decoder layer attends over cat(input_layernorm(embed(next token)), hidden_norm(g)) (q/k/v read
2H), its residual starts from g (or from hidden_norm(g): `norm_before_residual`), and then runs
as Llama's. Its pre-norm output feeds the next depth in place of g (no fc) and gives logits =
lm_head(norm(out)) over a draft vocabulary of V_draft tokens, target id = draft id + d2t[draft id].

Layer ids follow transformers' `hidden_states` index (0 = the embeddings, i = the residual stream
entering layer i); the default is (2, L // 2, L - 3) for an L-layer target. Checkpoints:
- SafeAILab / SGLang / SpecForge: config.json is a one-layer Llama config with `draft_vocab_size`,
  optional `target_hidden_size` and `eagle_config.eagle_aux_hidden_state_layer_ids`, which name
  layer OUTPUTS (our index - 1); tensors `fc.weight`, `midlayer.*` (with `hidden_norm`),
  `norm.weight`, `lm_head.weight`, `d2t`, `t2d`, optionally `embed_tokens.weight`.
- speculators (vLLM): `speculators_model_type: "eagle3"`, the layer config under
  `transformer_layer_config`, `eagle_aux_hidden_state_layer_ids` in our index,
  `norm_before_residual` (absent: true), tensors under `layers.0.*` instead of `midlayer.*`.
Without `embed_tokens.weight` the head embeds with the target's embedding.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
import torch
from torch import nn
from transformers import LlamaConfig
from transformers.cache_utils import Cache
from transformers.masking_utils import create_causal_mask
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm, LlamaRotaryEmbedding

__all__ = ["Eagle3Head", "Eagle3Spec", "TargetVocab", "default_layers", "read_spec", "sglang_layer_ids"]

SGLANG, SPECULATORS = "sglang", "speculators"
_UNSUPPORTED_FLAGS = ("norm_before_fc", "fc_norm", "use_aux_norm", "norm_output")  # variants not implemented


def default_layers(num_layers: int) -> tuple[int, int, int]:
    """EAGLE-3's layers for an L-layer target, in `hidden_states` indices: (2, L // 2, L - 3)."""
    return 2, num_layers // 2, num_layers - 3


def sglang_layer_ids(layers: tuple[int, ...]) -> list[int]:
    """SGLang's `eagle_aux_hidden_state_layer_ids` (layer outputs) for `hidden_states` indices."""
    return [i - 1 for i in layers]


@dataclass(frozen=True)
class Eagle3Spec:
    """What an EAGLE-3 checkpoint's config says beyond its one-layer Llama config."""

    layer: LlamaConfig  # the decoder layer's config; vocab_size is the TARGET's
    draft_vocab_size: int
    target_hidden_size: int
    layers: tuple[int, ...] | None  # hidden_states indices; None: default_layers of the target
    norm_before_residual: bool
    layout: str  # SGLANG or SPECULATORS: where it was read from
    config_file: Path | None = None


def read_spec(config_file: Path) -> Eagle3Spec:
    """Parse an EAGLE-3 config.json of either layout; raises naming the file and the field."""
    try:
        raw = json.loads(config_file.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"eagle3: cannot read {config_file}: {error}") from error
    if raw.get("speculators_model_type") is not None or "Eagle3Speculator" in (raw.get("architectures") or []):
        if raw.get("speculators_model_type") != "eagle3":
            raise ValueError(f"eagle3: {config_file}: 'speculators_model_type' is "
                             f"{raw.get('speculators_model_type')!r}, expected 'eagle3'")
        layer = raw.get("transformer_layer_config")
        if not isinstance(layer, dict):
            raise ValueError(f"eagle3: {config_file} is a speculators config without a 'transformer_layer_config' "
                             "object")
        layout, flags, ids = SPECULATORS, raw, raw.get("eagle_aux_hidden_state_layer_ids")
        norm_before_residual = bool(raw.get("norm_before_residual", True))  # vLLM reads an absent field as true
    else:
        layer, layout, flags = raw, SGLANG, raw
        eagle = raw.get("eagle_config") or {}
        ids = eagle.get("eagle_aux_hidden_state_layer_ids")
        if ids is not None and (not isinstance(ids, list) or not ids or not all(isinstance(i, int) for i in ids)):
            raise ValueError(f"eagle3: {config_file}: eagle_config.eagle_aux_hidden_state_layer_ids must be a "
                             f"non-empty list of layer ids, got {ids!r}")
        ids = None if ids is None else [i + 1 for i in ids]  # layer outputs -> hidden_states indices
        norm_before_residual = bool(raw.get("norm_before_residual", False))
        if eagle.get("use_aux_hidden_state") is False:
            raise ValueError(f"eagle3: {config_file}: eagle_config.use_aux_hidden_state is false; such heads "
                             "read one hidden state, which specdec's eagle3 drafter does not serve")
    for flag in _UNSUPPORTED_FLAGS:
        if flags.get(flag):
            raise ValueError(f"eagle3: {config_file}: {flag!r} is set; specdec serves EAGLE-3 heads without it")
    model_type = layer.get("model_type", "llama")
    if model_type != "llama":
        raise ValueError(f"eagle3: {config_file}: the decoder layer's model_type is {model_type!r}; specdec serves "
                         "Llama-layer EAGLE-3 heads")
    config = LlamaConfig(**{key: value for key, value in layer.items() if key not in ("model_type", "architectures")})
    if config.num_hidden_layers != 1:
        raise ValueError(f"eagle3: {config_file}: num_hidden_layers is {config.num_hidden_layers}; EAGLE-3 heads "
                         "have one decoder layer")
    vocab = raw.get("draft_vocab_size", layer.get("draft_vocab_size")) or config.vocab_size
    target_hidden = raw.get("target_hidden_size", layer.get("target_hidden_size")) or config.hidden_size
    if ids is not None and (not isinstance(ids, list) or not ids or not all(isinstance(i, int) for i in ids)):
        raise ValueError(f"eagle3: {config_file}: eagle_aux_hidden_state_layer_ids must be a non-empty list of "
                         f"layer ids, got {ids!r}")
    return Eagle3Spec(config, int(vocab), int(target_hidden), None if ids is None else tuple(int(i) for i in ids),
                      norm_before_residual, layout, config_file)


class Eagle3Head(nn.Module):
    """fc, one decoder layer over (embedding, feature) pairs, the final norm and a draft-vocabulary
    LM head. Module names are the SGLang layout's tensor names."""

    def __init__(self, spec: Eagle3Spec, own_embedding: bool = False) -> None:
        super().__init__()
        config = spec.layer
        config._attn_implementation = "sdpa"
        self.config, self.spec = config, spec
        hidden, eps = config.hidden_size, config.rms_norm_eps
        fused = len(spec.layers or (0, 0, 0))
        if fused * spec.target_hidden_size == hidden:
            raise ValueError(f"eagle3: fc's input ({fused} x {spec.target_hidden_size}) equals the head's hidden size "
                             f"{hidden}, so fused and fed-back features cannot be told apart")
        self.fc = nn.Linear(fused * spec.target_hidden_size, hidden, bias=False)
        self.midlayer = LlamaDecoderLayer(config, 0)
        attention, bias = self.midlayer.self_attn, bool(getattr(config, "attention_bias", False))
        for name in ("q_proj", "k_proj", "v_proj"):  # q, k and v read cat(embedding, feature): 2H
            old = getattr(attention, name)
            setattr(attention, name, nn.Linear(2 * hidden, old.out_features, bias=bias))
        self.midlayer.hidden_norm = LlamaRMSNorm(hidden, eps=eps)
        self.norm = LlamaRMSNorm(hidden, eps=eps)
        self.lm_head = nn.Linear(hidden, spec.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(spec.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(config.vocab_size, dtype=torch.bool))
        self.embed_tokens = nn.Embedding(config.vocab_size, hidden) if own_embedding else None
        self.rotary_emb = LlamaRotaryEmbedding(config)  # buffers only, not saved
        self.files: tuple[Path | str, Path | str] = (spec.config_file or "config.json", "the weights")

    def forward(self, embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
                cache: Cache | None = None, mask: torch.Tensor | None = None) -> torch.Tensor:
        """embeds [n, H] (or [B, n, H] in training); hidden: fused target states [.., n, m·H_t] (fc
        applies) or fed-back outputs [.., n, H]; positions [n] or [B, n] -> pre-norm outputs shaped like
        `embeds`. `mask`: an additive 4D mask instead of the causal one."""
        g = self.fc(hidden) if hidden.shape[-1] == self.fc.in_features else hidden
        single = g.dim() == 2
        g, embeds = (g[None], embeds[None]) if single else (g, embeds)  # (B, n, H)
        layer = self.midlayer
        normed = layer.hidden_norm(g)
        residual = normed if self.spec.norm_before_residual else g
        x = torch.cat([layer.input_layernorm(embeds), normed], dim=-1)  # (B, n, 2H)
        position_ids = positions if positions.dim() == 2 else positions[None]  # (B or 1, n)
        mask = create_causal_mask(config=self.config, inputs_embeds=g, attention_mask=mask, cache=cache,
                                  position_ids=position_ids)  # a 4D mask comes back as it is
        rotary = self.rotary_emb(g, position_ids=position_ids)
        attended, _ = layer.self_attn(hidden_states=x, position_embeddings=rotary, attention_mask=mask, cache=cache,
                                      position_ids=position_ids, use_cache=cache is not None)
        out = residual + attended
        out = out + layer.mlp(layer.post_attention_layernorm(out))  # (B, n, H)
        return out[0] if single else out

    def draft_logits(self, out: torch.Tensor) -> torch.Tensor:
        """Logits [.., V_draft] over the draft vocabulary for pre-norm outputs [.., H]."""
        return self.lm_head(self.norm(out))

    def target_ids(self) -> torch.Tensor:
        """The target id of each draft id [V_draft]."""
        return torch.arange(self.d2t.shape[0], device=self.d2t.device) + self.d2t


class TargetVocab(nn.Module):
    """A head's logits over the target's vocabulary: the draft vocabulary's logits at their target
    ids, -inf elsewhere, so a processed distribution is zero outside the draft vocabulary."""

    def __init__(self, head: Eagle3Head) -> None:
        super().__init__()
        self.norm, self.lm_head = head.norm, head.lm_head  # shared with the head, not copies
        self.vocab_size = head.config.vocab_size
        self.register_buffer("targets", head.target_ids(), persistent=False)  # (V_draft,)

    def forward(self, out: torch.Tensor) -> torch.Tensor:
        """Pre-norm outputs [n, H] -> logits [n, V]."""
        logits = self.lm_head(self.norm(out))  # (n, V_draft)
        full = logits.new_full((logits.shape[0], self.vocab_size), float("-inf"))
        return full.index_copy(1, self.targets, logits)
