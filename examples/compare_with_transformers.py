"""Benchmark: specdec against transformers' own decoding on the same float32 model and prompt.

Greedy decoding, batch 1, CPU or GPU. Three pairs, each checked for identical tokens:
  plain        specdec.generate(drafter=None)        vs model.generate(do_sample=False)
  n-gram       specdec "ngram" drafter                vs generate(prompt_lookup_num_tokens=k)
  draft model  specdec "draft-model" drafter          vs generate(assistant_model=..., constant k,
                                                        no confidence cut)
Runs are interleaved and repeated; the table gives median seconds and tokens/s per side and
the ratio (specdec tokens/s over transformers tokens/s).

The models are random (no downloads), so the draft model is made to agree with the target
the way a trained one would: it is the target's first layers (shared embedding, final norm and
LM head), and the target's later layers are scaled down so they refine rather than overturn
the early layers' prediction. Timing depends on the machine: run it on an idle one.

    python examples/compare_with_transformers.py --new-tokens 128 --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import specdec


def build_models(args: argparse.Namespace) -> tuple[LlamaForCausalLM, LlamaForCausalLM]:
    """A random float32 Llama target and a draft made of its first `draft_layers` layers."""
    torch.manual_seed(args.seed)
    config = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=3 * args.hidden,
                         num_hidden_layers=args.layers, num_attention_heads=args.hidden // 64,
                         num_key_value_heads=max(1, args.hidden // 128), max_position_embeddings=4096,
                         tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    target = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        target.lm_head.weight.mul_(4.0)  # peaked, varied next-token distributions
        for layer in target.model.layers[args.draft_layers :]:
            layer.self_attn.o_proj.weight.mul_(args.refine_scale)
            layer.mlp.down_proj.weight.mul_(args.refine_scale)
    draft_config = LlamaConfig(**{**config.to_dict(), "num_hidden_layers": args.draft_layers})
    draft = LlamaForCausalLM(draft_config).eval()
    state = {k: v for k, v in target.state_dict().items()
             if not k.startswith("model.layers.") or int(k.split(".")[2]) < args.draft_layers}
    draft.load_state_dict(state)
    return target, draft


def timed(run: Callable[[], list[int]]) -> tuple[list[int], float]:
    start = time.perf_counter()
    tokens = run()
    return tokens, time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--draft-layers", type=int, default=1)
    parser.add_argument("--refine-scale", type=float, default=0.3)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--prompt-length", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)

    target, draft = build_models(args)
    target.to(args.device)
    draft.to(args.device)
    generator = torch.Generator().manual_seed(args.seed)
    pattern = torch.randint(0, args.vocab, (args.prompt_length // 4,), generator=generator)
    prompt = torch.cat([pattern, torch.randint(0, args.vocab, (args.prompt_length // 4,), generator=generator),
                        pattern, pattern]).to(args.device)  # some repetition, as in real prompts
    ids = prompt.unsqueeze(0)
    budget = args.new_tokens

    def hf(**extra: object) -> Callable[[], list[int]]:
        def run() -> list[int]:
            out = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=budget,
                                  min_new_tokens=budget, do_sample=False, pad_token_id=0, **extra)
            return out[0, ids.shape[1] :].tolist()
        return run

    def ours(drafter: specdec.Drafter | None) -> Callable[[], list[int]]:
        return lambda: specdec.generate(target, prompt, drafter=drafter, num_draft_tokens=args.k,
                                        max_new_tokens=budget).tokens

    pairs = {
        "plain": (ours(None), hf()),
        "n-gram": (ours(specdec.make_drafter("ngram", max_ngram=3)),
                   hf(prompt_lookup_num_tokens=args.k, max_matching_ngram_size=3)),
        "draft model": (ours(specdec.make_drafter("draft-model", model=draft)),
                        hf(assistant_model=draft, num_assistant_tokens=args.k,
                           num_assistant_tokens_schedule="constant", assistant_confidence_threshold=0.0)),
    }
    print(f"target {sum(p.numel() for p in target.parameters()) / 1e6:.1f}M params, draft "
          f"{sum(p.numel() for p in draft.parameters()) / 1e6:.1f}M, {args.device}, "
          f"{torch.get_num_threads()} threads, prompt {prompt.numel()}, {budget} new tokens, k={args.k}")
    for ours_run, hf_run in pairs.values():  # warm-up
        ours_run(), hf_run()
    print(f"{'pair':<12} {'specdec s':>10} {'hf s':>10} {'specdec tok/s':>14} {'hf tok/s':>10} "
          f"{'ratio':>7} {'same tokens':>12}")
    for name, (ours_run, hf_run) in pairs.items():
        ours_times, hf_times, same = [], [], True
        for _ in range(args.repeats):
            a, t_ours = timed(ours_run)
            b, t_hf = timed(hf_run)
            ours_times.append(t_ours)
            hf_times.append(t_hf)
            same &= a == b
        t_ours, t_hf = statistics.median(ours_times), statistics.median(hf_times)
        print(f"{name:<12} {t_ours:>10.3f} {t_hf:>10.3f} {budget / t_ours:>14.1f} {budget / t_hf:>10.1f} "
              f"{t_hf / t_ours:>6.2f}x {'yes' if same else 'NO':>12}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
