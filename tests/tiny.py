"""Tiny random causal LMs built from configs, for tests (nothing is downloaded)."""

from __future__ import annotations

import math

import torch
from transformers import (
    Cohere2Config,
    Cohere2ForCausalLM,
    Gemma2Config,
    Gemma2ForCausalLM,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    GPT2Config,
    GPT2LMHeadModel,
    GptOssConfig,
    GptOssForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    PreTrainedModel,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

ARCHITECTURES = ("llama", "qwen2", "qwen3", "gpt2")
# models with sliding-window layers: Mistral slides in every layer, the others alternate sliding and
# full layers (GPT-OSS's experts run eagerly, transformers' grouped kernels take no float64)
SLIDING_ARCHITECTURES = ("mistral", "gemma2", "gemma3", "gpt_oss", "cohere2")
_MIXED = {"gemma2": (Gemma2Config, Gemma2ForCausalLM), "gemma3": (Gemma3TextConfig, Gemma3ForCausalLM),
          "gpt_oss": (GptOssConfig, GptOssForCausalLM), "cohere2": (Cohere2Config, Cohere2ForCausalLM)}


def tiny_model(
    arch: str = "llama",
    vocab_size: int = 64,
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
    layers: int = 2,
    hidden: int = 32,
    head_scale: float = 6.0,
    max_positions: int = 256,
    sliding_window: int | None = None,
) -> PreTrainedModel:
    """A randomly initialised causal LM in eval mode.

    The LM head is scaled by `head_scale` so next-token distributions are peaked and varied
    rather than near uniform. No EOS or pad id is set.
    """
    torch.manual_seed(seed)
    common = dict(vocab_size=vocab_size, bos_token_id=None, eos_token_id=None, pad_token_id=None,
                  tie_word_embeddings=False)
    if arch == "gpt2":
        config = GPT2Config(n_embd=hidden, n_layer=layers, n_head=4, n_positions=max_positions, **common)
        model = GPT2LMHeadModel(config)
    elif arch in _MIXED:
        cls_config, cls_model = _MIXED[arch]
        kinds = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]
        extra = {"num_local_experts": 4, "num_experts_per_tok": 2, "experts_implementation": "eager",
                 "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}} if arch == "gpt_oss" else {}
        config = cls_config(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4,
                            max_position_embeddings=max_positions, sliding_window=sliding_window or 4,
                            layer_types=kinds, **common, **extra)
        model = cls_model(config)
    else:
        cls_config, cls_model = {
            "llama": (LlamaConfig, LlamaForCausalLM),
            "qwen2": (Qwen2Config, Qwen2ForCausalLM),
            "qwen3": (Qwen3Config, Qwen3ForCausalLM),
            "mistral": (MistralConfig, MistralForCausalLM),
        }[arch]
        extra = {} if sliding_window is None else {"sliding_window": sliding_window}
        config = cls_config(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4,
                            max_position_embeddings=max_positions, **common, **extra)
        model = cls_model(config)
    model = model.to(dtype).eval()
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(head_scale)
    return model


def hf_greedy(model: PreTrainedModel, prompt: list[int], max_new_tokens: int) -> list[int]:
    """transformers' own greedy decoding of `prompt`, new tokens only."""
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                         do_sample=False, pad_token_id=0, eos_token_id=None)
    return out[0, len(prompt):].tolist()


NEAR_TIE_ULPS = 4  # the top-2 logit gap, in units in the last place of the top logit, below which rounding may pick either


def _ulp(value: float, dtype: torch.dtype) -> float:
    """The spacing of `dtype` numbers near `value`."""
    return 2.0 ** math.floor(math.log2(max(abs(value), torch.finfo(dtype).tiny))) * torch.finfo(dtype).eps


def assert_greedy_matches_up_to_near_ties(model: PreTrainedModel, prompt: list[int], ours: list[int],
                                          reference: list[int]) -> None:
    """Pass when two greedy outputs of `model` agree, or first differ where its top-2 logits (one
    forward over the prompt and the common prefix) are within NEAR_TIE_ULPS units in the last
    place of the top logit, in the model's dtype: there two correct computations that round
    differently may pick either token. Fail otherwise."""
    common = min(len(ours), len(reference))
    differing = next((i for i in range(common) if ours[i] != reference[i]), None)
    if differing is None:
        assert len(ours) == len(reference), f"lengths differ: {len(ours)} against {len(reference)}"
        return
    ids = torch.tensor([prompt + reference[:differing]], device=model.device)
    with torch.inference_mode():
        logits = model(input_ids=ids).logits[0, -1]  # (V,)
    top = logits.float().topk(2).values
    gap = float(top[0] - top[1])
    bound = NEAR_TIE_ULPS * _ulp(float(top[0]), logits.dtype)
    assert gap <= bound, (f"greedy outputs differ at new token {differing} ({ours[differing]} against "
                          f"{reference[differing]}) where the top-2 logit gap {gap:.4g} exceeds the near-tie bound "
                          f"{bound:.4g} ({NEAR_TIE_ULPS} ulps of {float(top[0]):.4g} in {logits.dtype}): not a "
                          "rounding tie")
