"""What vLLM and SGLang load for each drafter kind: file names, tensor key names and config.json
fields, written down from those engines' sources and docs (each layout cites what it was read from).

Key templates use `{h}` (a Medusa head), `{l}` (a residual block), `{i}` (an MTP or DFlash layer) and
`{e}` (an expert) for non-negative integers. `keys` must all occur in an export; `optional_keys` may
(which MLP an MTP layer has depends on the target). The exporters in this package write these
layouts with their own code; `mismatches` holds an export against its layout (tests/test_export.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ENGINES", "LAYOUTS", "UNSUPPORTED", "Layout", "layout_for", "mismatches"]

ENGINES = ("vllm", "sglang")


@dataclass(frozen=True)
class Layout:
    """One engine's expectations for one drafter kind's checkpoint directory."""

    kind: str
    engine: str
    loader: str  # the engine class that loads it
    sources: tuple[str, ...]  # engine files and docs this layout was read from
    weights: str  # the safetensors file holding the drafter's tensors
    keys: tuple[str, ...]  # templates every export holds
    optional_keys: tuple[str, ...] = ()  # templates an export may hold
    config: Mapping[str, Any] = field(default_factory=dict)  # config.json fields and the values the engine needs
    config_fields: tuple[str, ...] = ()  # config.json fields that must be present, any value
    absent_config: tuple[str, ...] = ()  # config.json fields that must NOT be present (the engine misreads them)
    target_architectures: tuple[str, ...] = ()  # target architectures the engine serves this kind for (MTP)


_LLAMA_LAYER = ("layers.0.self_attn.q_proj.weight", "layers.0.self_attn.k_proj.weight",
                "layers.0.self_attn.v_proj.weight", "layers.0.self_attn.o_proj.weight",
                "layers.0.mlp.gate_proj.weight", "layers.0.mlp.up_proj.weight", "layers.0.mlp.down_proj.weight",
                "layers.0.post_attention_layernorm.weight")  # layer 0 has no input_layernorm in EAGLE-1
_LLAMA_FIELDS = ("hidden_size", "vocab_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                 "head_dim", "rms_norm_eps", "max_position_embeddings")

_EAGLE3_LAYER = " ".join(f"{{prefix}}.{name}.weight" for name in (
    "input_layernorm", "hidden_norm", "post_attention_layernorm", "self_attn.q_proj", "self_attn.k_proj",
    "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"))

_QWEN3_NEXT_MTP = ("mtp.fc.weight", "mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight",
                   "mtp.norm.weight", "mtp.layers.{i}.input_layernorm.weight",
                   "mtp.layers.{i}.post_attention_layernorm.weight", "mtp.layers.{i}.self_attn.q_proj.weight",
                   "mtp.layers.{i}.self_attn.k_proj.weight", "mtp.layers.{i}.self_attn.v_proj.weight",
                   "mtp.layers.{i}.self_attn.o_proj.weight", "mtp.layers.{i}.self_attn.q_norm.weight",
                   "mtp.layers.{i}.self_attn.k_norm.weight")
_QWEN3_NEXT_MLP = ("mtp.layers.{i}.mlp.gate_proj.weight", "mtp.layers.{i}.mlp.up_proj.weight",  # dense
                   "mtp.layers.{i}.mlp.down_proj.weight",
                   "mtp.layers.{i}.mlp.gate.weight", "mtp.layers.{i}.mlp.experts.{e}.gate_proj.weight",  # MoE
                   "mtp.layers.{i}.mlp.experts.{e}.up_proj.weight", "mtp.layers.{i}.mlp.experts.{e}.down_proj.weight",
                   "mtp.layers.{i}.mlp.shared_expert.gate_proj.weight",
                   "mtp.layers.{i}.mlp.shared_expert.up_proj.weight",
                   "mtp.layers.{i}.mlp.shared_expert.down_proj.weight", "mtp.layers.{i}.mlp.shared_expert_gate.weight")
_MTP_CONFIG = {"mtp_num_hidden_layers": 1, "num_nextn_predict_layers": 1, "mtp_use_dedicated_embeddings": False}

# DFlash (z-lab/dflash `dflash/model.py`): one published layout, which both engines load. No embed_tokens or
# lm_head: without them both share the target's (vLLM would use a drafter's own, has_own_embed_tokens).
_DFLASH_KEYS = ("fc.weight", "hidden_norm.weight", "norm.weight",
                *(f"layers.{{i}}.{name}.weight" for name in (
                    "input_layernorm", "post_attention_layernorm", "self_attn.q_proj", "self_attn.k_proj",
                    "self_attn.v_proj", "self_attn.o_proj", "self_attn.q_norm", "self_attn.k_norm", "mlp.gate_proj",
                    "mlp.up_proj", "mlp.down_proj")))
_DFLASH_BIASES = tuple(f"layers.{{i}}.self_attn.{name}_proj.bias" for name in "qkvo")  # with attention_bias
_DFLASH_CONFIG = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "tie_word_embeddings": False}
_DFLASH_FIELDS = ("block_size", "rope_theta", "num_target_layers", "dflash_config", "hidden_size",
                  "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size",
                  "rms_norm_eps", "max_position_embeddings", "vocab_size", "layer_types")

LAYOUTS: dict[tuple[str, str], Layout] = {
    ("medusa", "vllm"): Layout(
        kind="medusa", engine="vllm", loader="Medusa (architecture MedusaModel, config MedusaConfig)",
        sources=("vllm/model_executor/models/medusa.py (bias = medusa_fc_bias; unknown names skipped)",
                 "vllm/transformers_utils/configs/medusa.py (num_heads, num_hidden_layers, truncated_vocab_size)",
                 "vllm/config/speculative.py (method 'medusa', model_type 'medusa')"),
        weights="model.safetensors",
        keys=("blocks.{h}.layers.{l}.weight", "blocks.{h}.layers.{l}.bias", "lm_heads.{h}.weight"),
        config={"model_type": "medusa", "architectures": ["MedusaModel"], "original_lm_head": False,
                "medusa_fc_bias": True},
        config_fields=("hidden_size", "vocab_size", "num_heads", "num_hidden_layers", "truncated_vocab_size")),
    ("eagle", "vllm"): Layout(
        kind="eagle", engine="vllm", loader="EagleLlamaForCausalLM (EAGLEConfig prefixes 'Eagle' to architectures)",
        sources=("vllm/model_executor/models/llama_eagle.py (fc without bias; layer 0 input norm = Identity)",
                 "vllm/transformers_utils/configs/eagle.py (LlamaForCausalLM -> EagleLlamaForCausalLM)",
                 "vllm/model_executor/models/llama.py (attention bias = attention_bias or bias)",
                 "docs/features/speculative_decoding/eagle.md"),
        weights="model.safetensors",
        keys=("fc.weight", *_LLAMA_LAYER),
        config={"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 1,
                "bias": False, "tie_word_embeddings": False},
        config_fields=_LLAMA_FIELDS),
    ("eagle", "sglang"): Layout(
        kind="eagle", engine="sglang", loader="LlamaForCausalLMEagle",
        sources=("python/sglang/srt/models/llama_eagle.py (fc with a bias; layer 0 input norm removed)",
                 "python/sglang/srt/models/llama.py (attention bias = attention_bias or bias)",
                 "docs/advanced_features/speculative_decoding.md (--speculative-algorithm EAGLE)"),
        weights="model.safetensors",
        keys=("fc.weight", "fc.bias", *_LLAMA_LAYER),
        config={"architectures": ["LlamaForCausalLMEagle"], "model_type": "llama", "num_hidden_layers": 1,
                "tie_word_embeddings": False},
        config_fields=_LLAMA_FIELDS,
        absent_config=("bias",)),
    ("eagle3", "vllm"): Layout(
        kind="eagle3", engine="vllm", loader="Eagle3LlamaForCausalLM (a speculators config, SpeculatorsConfig)",
        sources=("vllm/transformers_utils/configs/speculators/base.py (speculators_model_type, "
                 "transformer_layer_config, speculators_config.proposal_methods / verifier.name_or_path)",
                 "vllm/transformers_utils/configs/speculators/algos.py (draft_vocab_size, target_hidden_size, "
                 "norm_before_residual absent = true, eagle_aux_hidden_state_layer_ids)",
                 "vllm/model_executor/models/llama_eagle3.py (fc without bias; d2t -> draft_id_to_target_id; "
                 "t2d skipped; embed_tokens shared when absent)"),
        weights="model.safetensors",
        keys=("fc.weight", *_EAGLE3_LAYER.format(prefix="layers.0").split(), "norm.weight", "lm_head.weight", "d2t",
              "t2d"),
        optional_keys=("embed_tokens.weight",),
        config={"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3"},
        config_fields=("transformer_layer_config", "speculators_config", "draft_vocab_size", "target_hidden_size",
                       "norm_before_residual")),
    ("eagle3", "sglang"): Layout(
        kind="eagle3", engine="sglang", loader="LlamaForCausalLMEagle3",
        sources=("python/sglang/srt/models/llama_eagle3.py (midlayer -> layers.0; d2t offsets as hot token ids; "
                 "t2d skipped; fc bias = config.bias; residual = the unnormed fusion)",
                 "python/sglang/srt/models/llama.py (eagle_aux_hidden_state_layer_ids + 1 captured)",
                 "docs/advanced_features/speculative_decoding.md (--speculative-algorithm EAGLE3)"),
        weights="model.safetensors",
        keys=("fc.weight", *_EAGLE3_LAYER.format(prefix="midlayer").split(), "norm.weight", "lm_head.weight", "d2t",
              "t2d"),
        optional_keys=("embed_tokens.weight",),
        config={"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "num_hidden_layers": 1,
                "tie_word_embeddings": False},
        config_fields=(*_LLAMA_FIELDS, "draft_vocab_size", "eagle_config"),
        absent_config=("bias",)),
    ("mtp", "vllm"): Layout(
        kind="mtp", engine="vllm", loader="Qwen3NextMTP (model_type qwen3_next rewritten to qwen3_next_mtp)",
        sources=("vllm/model_executor/models/qwen3_next_mtp.py ('mtp.' read as 'model.'; num_nextn_predict_layers)",
                 "vllm/config/speculative.py (qwen3_next -> Qwen3NextMTP)",
                 "docs/features/speculative_decoding/mtp.md (method 'mtp' on the target's own checkpoint)"),
        weights="model-mtp.safetensors", keys=_QWEN3_NEXT_MTP, optional_keys=_QWEN3_NEXT_MLP, config=_MTP_CONFIG,
        target_architectures=("Qwen3NextForCausalLM",)),
    ("mtp", "sglang"): Layout(
        kind="mtp", engine="sglang", loader="Qwen3NextForCausalLMMTP",
        sources=("python/sglang/srt/models/qwen3_next_mtp.py (fc without bias, GemmaRMSNorm norms)",
                 "python/sglang/srt/configs/model_config.py (draft Qwen3NextForCausalLM -> Qwen3NextForCausalLMMTP)",
                 "docs/basic_usage/qwen3.md (--speculative-algo NEXTN on the target itself)"),
        weights="model-mtp.safetensors", keys=_QWEN3_NEXT_MTP, optional_keys=_QWEN3_NEXT_MLP, config=_MTP_CONFIG,
        target_architectures=("Qwen3NextForCausalLM",)),
    ("dflash", "vllm"): Layout(
        kind="dflash", engine="vllm", loader="DFlashQwen3ForCausalLM (architecture DFlashDraftModel)",
        sources=(("vllm/model_executor/models/qwen3_dflash.py (names prefixed 'model.' at load; q/k/v and gate/up "
                  "stacked; dflash_config.mask_token_id; dflash_config.target_layer_ids + 1 as the captured aux "
                  "layers; fc input = hidden_size x len(ids); rope_parameters, max_position_embeddings; "
                  "sliding layer_types run causally; embed_tokens / lm_head the target's when absent)"),
                 ("vllm/v1/spec_decode/dflash.py (1 + num_speculative_tokens query slots: num_speculative_tokens "
                  "= block_size - 1)"),
                 "vllm/config/speculative.py (method 'dflash', parallel drafting)"),
        weights="model.safetensors", keys=_DFLASH_KEYS, optional_keys=_DFLASH_BIASES, config=_DFLASH_CONFIG,
        config_fields=_DFLASH_FIELDS, absent_config=("auto_map",)),
    ("dflash", "sglang"): Layout(
        kind="dflash", engine="sglang", loader="DFlashDraftModel (EntryClass, by architectures)",
        sources=(("python/sglang/srt/models/dflash.py (names with or without 'model.'; q/k/v and gate/up stacked; "
                  "unknown names skipped; fc.weight's width checked against the captured features; full "
                  "layers non-causal, sliding ones causal)"),
                 ("python/sglang/srt/speculative/dflash_utils.py (parse_dflash_draft_config: "
                  "dflash_config.block_size else block_size; num_target_layers; target_layer_ids within "
                  "[0, num_target_layers), captured + 1; dflash_config.mask_token_id else mask_token '<|MASK|>')"),
                 ("docs/advanced_features/speculative_decoding.md (--speculative-algorithm DFLASH, "
                  "--speculative-num-draft-tokens = block_size)"),
                 "SpecForge scripts/gates/normalize_dflash_export.py (architectures DFlashDraftModel, no auto_map)"),
        weights="model.safetensors", keys=_DFLASH_KEYS, optional_keys=_DFLASH_BIASES, config=_DFLASH_CONFIG,
        config_fields=_DFLASH_FIELDS, absent_config=("auto_map",)),
}

UNSUPPORTED: dict[tuple[str, str], str] = {
    ("medusa", "sglang"): (
        "SGLang has no Medusa drafter: its --speculative-algorithm takes EAGLE, EAGLE3, STANDALONE and NGRAM "
        "(python/sglang/srt/speculative/spec_info.py), so specdec exports eagle and mtp to sglang; "
        "export medusa --to vllm instead"),
}


def layout_for(kind: str, engine: str) -> Layout:
    """The layout `engine` loads for `kind`; ValueError saying what it loads when it loads none."""
    if engine not in ENGINES:
        raise ValueError(f"export: unknown engine {engine!r}; use one of {list(ENGINES)}")
    if (kind, engine) in UNSUPPORTED:
        raise ValueError(f"export: {engine} cannot load a {kind} drafter: {UNSUPPORTED[kind, engine]}")
    if (kind, engine) not in LAYOUTS:
        kinds = sorted(k for k, e in LAYOUTS if e == engine)
        raise ValueError(f"export: no {engine} layout for {kind!r}; {engine} loads {kinds}")
    return LAYOUTS[kind, engine]


def _pattern(template: str) -> re.Pattern[str]:
    parts = re.split(r"(\{[hlie]\})", template)
    return re.compile("".join(r"\d+" if re.fullmatch(r"\{[hlie]\}", part) else re.escape(part) for part in parts))


def mismatches(layout: Layout, keys: Iterable[str], config: Mapping[str, Any]) -> list[str]:
    """What in (tensor keys, config.json) departs from `layout`, one line each; [] when it holds."""
    keys = sorted(keys)
    required = {template: _pattern(template) for template in layout.keys}
    allowed = [*required.values(), *(_pattern(t) for t in layout.optional_keys)]
    problems = [f"key {key!r} matches no {layout.engine} template" for key in keys
                if not any(p.fullmatch(key) for p in allowed)]
    problems += [f"no key matches the {layout.engine} template {t!r}" for t, p in required.items()
                 if not any(p.fullmatch(key) for key in keys)]
    problems += [f"config {name!r} is {config.get(name)!r}, {layout.engine} needs {value!r}"
                 for name, value in layout.config.items() if config.get(name, _MISSING) != value]
    problems += [f"config lacks {name!r}" for name in layout.config_fields if name not in config]
    problems += [f"config has {name!r}, which {layout.engine} misreads" for name in layout.absent_config
                 if name in config]
    return problems


_MISSING = object()
