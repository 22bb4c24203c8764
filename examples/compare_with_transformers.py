"""Benchmark: specdec against transformers' own decoding on the same float32 model and prompt.

Greedy decoding, batch 1, CPU or GPU. Three pairs, each checked for identical tokens:
  plain        specdec.generate(drafter=None)        vs model.generate(do_sample=False)
  n-gram       specdec "ngram" drafter                vs generate(prompt_lookup_num_tokens=k)
  draft model  specdec "draft-model" drafter          vs generate(assistant_model=..., constant k,
                                                        no confidence cut)
Runs are interleaved and repeated; the table gives median seconds and tokens/s per side and
the ratio (specdec tokens/s over transformers tokens/s).

Models (nothing is downloaded):
  --models zoo      (default) the zoo's target and draft model (the shipped full family;
                    --quick for the small family, built here) and a held-out code prompt: real
                    acceptance, small models (overhead matters).
  --models random   a random Llama of --hidden/--layers/--vocab; its draft model is its first
                    --draft-layers layers (shared embedding, final norm and LM head), and its
                    later layers are scaled by --refine-scale so they refine rather than
                    overturn the early prediction. Large sizes show the compute-bound regime.
Timing depends on the machine: run it on an idle one.

    python examples/compare_with_transformers.py --repeats 5
    python examples/compare_with_transformers.py --models random --hidden 768 --layers 16
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedModel

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


def zoo_models(quick: bool, cache_dir: str | None = None) -> tuple[PreTrainedModel, PreTrainedModel, torch.Tensor]:
    """The zoo's target and draft model (the shipped family, or the quick one built here), and a held-out
    code prompt."""
    from specdec import zoo
    from specdec.checkpoints import load_causal_lm, load_tokenizer
    from specdec.data.corpus import stdlib_corpus
    from specdec.data.prompts import code_prompts

    directory = zoo.ready(zoo.QUICK if quick else zoo.FULL, root=cache_dir)
    tokenizer = load_tokenizer(directory / "target")
    prompt = code_prompts(stdlib_corpus(), per_category=1, categories=("block",))[0]
    ids = torch.tensor(tokenizer(prompt.text, add_special_tokens=False)["input_ids"])
    return load_causal_lm(directory / "target"), load_causal_lm(directory / "draft-model"), ids


def random_prompt(args: argparse.Namespace) -> torch.Tensor:
    """Random ids with some repetition, as real prompts have."""
    generator = torch.Generator().manual_seed(args.seed)
    pattern = torch.randint(0, args.vocab, (args.prompt_length // 4,), generator=generator)
    other = torch.randint(0, args.vocab, (args.prompt_length // 4,), generator=generator)
    return torch.cat([pattern, other, pattern, pattern])


class ForwardCounter:
    """Counts a model's forward calls (target forwards per run are a fair cost measure)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.calls = 0
        model.register_forward_pre_hook(self._count)

    def _count(self, module: torch.nn.Module, inputs: object) -> None:
        self.calls += 1


def timed(run: Callable[[], list[int]], counter: ForwardCounter) -> tuple[list[int], float, int]:
    """Tokens, seconds and target forwards of one run."""
    before = counter.calls
    start = time.perf_counter()
    tokens = run()
    return tokens, time.perf_counter() - start, counter.calls - before


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", choices=("zoo", "random"), default="zoo")
    parser.add_argument("--quick", action="store_true", help="with --models zoo: the quick family")
    parser.add_argument("--cache-dir", default=None, help="with --models zoo: the zoo cache directory")
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--draft-layers", type=int, default=1)
    parser.add_argument("--refine-scale", type=float, default=0.03)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--prompt-length", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)

    torch.manual_seed(args.seed)
    if args.models == "zoo":
        target, draft, prompt = zoo_models(args.quick, args.cache_dir)
    else:
        (target, draft), prompt = build_models(args), random_prompt(args)
    target.to(args.device)
    draft.to(args.device)
    prompt = prompt.to(args.device)
    # transformers reads the assisted-generation settings from the assistant's own config.
    draft.generation_config.num_assistant_tokens = args.k
    draft.generation_config.num_assistant_tokens_schedule = "constant"
    draft.generation_config.assistant_confidence_threshold = 0.0  # no confidence cut
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
                        hf(assistant_model=draft)),
    }
    print(f"target {sum(p.numel() for p in target.parameters()) / 1e6:.1f}M params, draft "
          f"{sum(p.numel() for p in draft.parameters()) / 1e6:.1f}M, {args.device}, "
          f"{torch.get_num_threads()} threads, prompt {prompt.numel()}, {budget} new tokens, k={args.k}")
    for ours_run, hf_run in pairs.values():  # warm-up
        ours_run(), hf_run()
    counter = ForwardCounter(target)
    print(f"{'pair':<12} {'specdec s':>10} {'hf s':>10} {'specdec tok/s':>14} {'hf tok/s':>10} "
          f"{'ratio':>7} {'target forwards':>16} {'same tokens':>12}")
    for name, (ours_run, hf_run) in pairs.items():
        ours_times, hf_times, same = [], [], True
        for _ in range(args.repeats):
            a, t_ours, ours_forwards = timed(ours_run, counter)
            b, t_hf, hf_forwards = timed(hf_run, counter)
            ours_times.append(t_ours)
            hf_times.append(t_hf)
            same &= a == b
        t_ours, t_hf = statistics.median(ours_times), statistics.median(hf_times)
        forwards = f"{ours_forwards} / {hf_forwards}"
        print(f"{name:<12} {t_ours:>10.3f} {t_hf:>10.3f} {budget / t_ours:>14.1f} {budget / t_hf:>10.1f} "
              f"{t_hf / t_ours:>6.2f}x {forwards:>16} {'yes' if same else 'NO':>12}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
