"""transformers' own decoding as rows of the bench: `generate` plain (eager, and its best
configuration: `cache_implementation="static"` with its compiled forward), with prompt lookup
(`prompt_lookup_num_tokens`) and with an assistant model (constant k, no confidence cut).

transformers compiles the forward of a static-cache `generate` on its own on CUDA
(`mode="reduce-overhead"`); elsewhere it needs a `CompileConfig` that allows every device, given
here with its default mode.

transformers reads the assisted-generation schedule from the ASSISTANT's generation_config,
not from `generate`'s arguments; it is set there, or transformers adapts k on its own.
Target forwards are counted with a forward hook. transformers' prefill forward emits the first
token, so a peer's `steps` are all its target forwards (specdec's prefill emits nothing and is
not a step): the mean accepted length is new tokens per token-emitting forward on both sides.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch
from transformers import PreTrainedModel

from specdec.checkpoints import quiet_transformers
from specdec.types import Sampling, Stats

__all__ = ["PEERS", "hf_generate", "hf_generate_batch", "hf_missing", "hf_sampling", "pad_left"]

PEERS = ("hf-plain", "hf-static", "hf-prompt-lookup", "hf-assisted")


def hf_missing(sampling: Sampling, batch: bool = False) -> list[str]:
    """The settings transformers' `generate` cannot apply as specdec does: the OpenAI penalties and
    a constraint (it has no argument for them), and in a left-padded batch (`batch`) every setting
    that reads the prefix, since its processors see the pad ids. With any of them its rows would
    decode another distribution, so the bench leaves the peers out."""
    missing = [name for name in ("presence_penalty", "frequency_penalty") if getattr(sampling, name)]
    missing += [sampling.constraint[0]] if sampling.constraint is not None else []
    if batch:
        missing += [name for name in ("repetition_penalty", "no_repeat_ngram_size", "bad_words_ids",
                                      "logits_processors")
                    if getattr(sampling, name) not in (1.0, 0, ()) and name not in missing]
    return missing


def hf_sampling(sampling: Sampling) -> dict[str, Any]:
    """`generate`'s arguments for the settings (which `hf_missing` must not name), every one given,
    neutral when unset: `generate` fills a missing one from the checkpoint's generation_config
    (a repetition penalty, banned words, typical-p), which specdec never applies."""
    if hf_missing(sampling):
        raise ValueError(f"transformers' generate cannot apply {', '.join(hf_missing(sampling))}")
    extra: dict[str, Any] = {"do_sample": False} if sampling.greedy else {
        "do_sample": True, "temperature": float(sampling.temperature), "top_k": sampling.top_k or None,
        "top_p": float(sampling.top_p), "min_p": float(sampling.min_p) or None}
    extra.update(repetition_penalty=float(sampling.repetition_penalty),
                 no_repeat_ngram_size=sampling.no_repeat_ngram_size or None,
                 bad_words_ids=[list(word) for word in sampling.bad_words_ids] or None,
                 sequence_bias={(token,): float(bias) for token, bias in sampling.logit_bias} or None,
                 typical_p=1.0, epsilon_cutoff=0.0, eta_cutoff=0.0)
    if sampling.logits_processors:
        from transformers import LogitsProcessorList

        extra["logits_processor"] = LogitsProcessorList(sampling.logits_processors)
    return extra


def hf_generate(model: PreTrainedModel, prompt: torch.Tensor, peer: str, k: int, max_new_tokens: int,
                sampling: Sampling, assistant: PreTrainedModel | None = None) -> tuple[list[int], Stats]:
    """One transformers `generate` call: the new tokens and counters (steps = target forwards)."""
    if peer not in PEERS:
        raise ValueError(f"unknown transformers peer {peer!r}; choose from {PEERS}")
    extra: dict[str, Any] = {}
    if peer == "hf-static":
        extra = {"cache_implementation": "static", "compile_config": _compile_config(model)}
    elif peer == "hf-prompt-lookup":
        extra = {"prompt_lookup_num_tokens": k, "max_matching_ngram_size": 3}
    elif peer == "hf-assisted":
        if assistant is None:
            raise ValueError("hf-assisted needs an assistant model (the draft-model drafter's model)")
        config = assistant.generation_config
        config.num_assistant_tokens, config.num_assistant_tokens_schedule = k, "constant"
        config.assistant_confidence_threshold = 0.0
        extra = {"assistant_model": assistant}
    extra.update(hf_sampling(sampling))
    forwards = [0]
    handle = model.register_forward_hook(lambda *_: forwards.__setitem__(0, forwards[0] + 1))
    ids = prompt.to(model.device)[None]
    try:
        with quiet_transformers():  # transformers warns about the settings spelled out here
            start = time.perf_counter()
            out = model.generate(  # type: ignore[operator]
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                min_new_tokens=max_new_tokens, pad_token_id=0, eos_token_id=None, **extra)
            if model.device.type == "cuda":
                torch.cuda.synchronize(model.device)
            wall = time.perf_counter() - start
    finally:
        handle.remove()
    tokens = out[0, ids.shape[1]:].tolist()
    return tokens, Stats(steps=forwards[0], new_tokens=len(tokens), wall_seconds=wall)


def pad_left(prompts: Sequence[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts left-padded into ids [B, L] and their attention mask [B, L] (1 = a real token)."""
    longest = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), longest), pad_id, dtype=torch.long)
    mask = torch.zeros(len(prompts), longest, dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, longest - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
        mask[row, longest - len(prompt) :] = 1
    return ids, mask


def hf_generate_batch(model: PreTrainedModel, prompts: Sequence[list[int]], max_new_tokens: int, sampling: Sampling,
                      pad_id: int = 0) -> list[list[int]]:
    """transformers' batched plain `generate` (prompts left-padded with `pad_id`, exactly
    `max_new_tokens` new tokens each, its dynamic cache): each row's new tokens."""
    if hf_missing(sampling, batch=True):
        raise ValueError(f"transformers' batched generate cannot apply {', '.join(hf_missing(sampling, batch=True))}")
    ids, mask = (t.to(model.device) for t in pad_left(prompts, pad_id))
    extra = hf_sampling(sampling)
    with quiet_transformers():
        out = model.generate(ids, attention_mask=mask, max_new_tokens=max_new_tokens,  # type: ignore[operator]
                             min_new_tokens=max_new_tokens, pad_token_id=pad_id, eos_token_id=None, **extra)
        if model.device.type == "cuda":
            torch.cuda.synchronize(model.device)
    return out[:, ids.shape[1] :].tolist()


def _compile_config(model: PreTrainedModel) -> Any:
    """transformers' compile settings for a static-cache `generate`: its defaults on CUDA, its
    default mode (no CUDA graphs) on other devices, where it compiles only when told to."""
    from transformers import CompileConfig

    if model.device.type == "cuda":
        return CompileConfig()
    config = CompileConfig(mode="default")
    setattr(config, "_compile_all_devices", True)  # transformers' switch for devices other than CUDA
    return config
