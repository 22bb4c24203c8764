"""The zoo's hybrid target (the Qwen3.5 case) measured, as docs/bench.md reports it.

    python -m specdec.bench.hybrid_zoo              # the hybrid family (built first if needed)
    python -m specdec.bench.hybrid_zoo --quick      # its quick family, a smoke run

Three tables, greedy, on the held-out code prompts:

1. Decoding one prompt at a time: plain decoding and the MTP module drafting chains and trees, on
   the design before (a dynamic cache: the recurrent state snapshotted before each verify,
   restored and replayed after a rejection, eager, trees verified as chains) and after (the
   static cache keeping every draft row's state, eager and compiled). Each row's speedup divides
   by plain decoding on the same engine.
2. The batch curve (`specdec.bench.batch_curve`): plain, mtp and ngram at B = 1, 2, 4, 8, 16.
3. The memory of the linear-attention state buffers per verify position: what one kept row costs
   (a recurrent state and a conv input per GatedDeltaNet layer), computed from the config and
   read back from the buffers a decode allocated.

Run it alone: a second job on a 2-core machine makes the timings meaningless.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from typing import Any

import torch

__all__ = ["main", "slot_bytes", "single_rows"]

K = 4


def slot_bytes(config: Any, dtype: torch.dtype) -> int:
    """Bytes one verify position keeps in a model's GatedDeltaNet layers: per layer a recurrent
    state [Hv, Dk, Dv] (float32 at least) and a conv input [channels] (the model's dtype)."""
    from specdec.runtime.linear import linear_dims

    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    dims = linear_dims(text)
    layers = sum(kind == "linear_attention" for kind in text.layer_types)
    state = torch.empty((), dtype=torch.promote_types(dtype, torch.float32)).element_size()
    return layers * (dims["heads"] * dims["dk"] * dims["dv"] * state + dims["channels"] * dtype.itemsize)


def _decode(lm: Any, prompts: list[torch.Tensor], drafter: Any, new_tokens: int, compile: bool
            ) -> tuple[list[list[int]], float, float]:
    """Greedy decoding of every prompt: tokens, summed wall seconds (compiling taken off),
    tokens per target forward."""
    from specdec.decoding.generate import generate
    from specdec.protocols import forget
    from specdec.runtime.engine import compile_seconds

    forget(drafter)
    tokens, seconds, steps, emitted = [], 0.0, 0, 0
    for prompt in prompts:
        before = compile_seconds()
        result = generate(lm, prompt, drafter=drafter, num_draft_tokens=K, max_new_tokens=new_tokens,
                                  compile=compile)
        tokens.append(result.tokens)
        seconds += result.stats.wall_seconds - (compile_seconds() - before)  # compiling is no decode time
        steps += result.stats.steps
        emitted += result.stats.new_tokens
    return tokens, seconds, emitted / max(steps, 1)


def single_rows(model: Any, directory: Any, prompts: list[torch.Tensor], new_tokens: int, repeats: int,
                compiled: bool = True) -> list[dict[str, Any]]:
    """Table 1's rows: for each design (before, after eager, after compiled unless `compiled` is
    false) plain, mtp chains and mtp trees; median seconds over `repeats` rounds after a warm-up."""
    import warnings

    from specdec import plugins, zoo
    from specdec.plugins import make_drafter
    from specdec.runtime.target import CausalLM

    options = zoo.drafter_options(directory)["mtp"]
    labels = {"plain": None, "mtp": options, "mtp+tree": {**options, **plugins.drafter_class("mtp").tree_options}}
    rows = []
    designs = (("before: snapshot + replay, eager", False), ("after: eager", False), ("after: compiled", True))
    for design, compile in designs if compiled else designs[:2]:
        lm = CausalLM(model)
        if design.startswith("before"):  # the design before: a dynamic cache, snapshots and replays
            lm.static_obstacle = "the design before: snapshot and replay"
        drafters = {label: None if opts is None else make_drafter("mtp", **opts) for label, opts in labels.items()}
        times: dict[str, list[float]] = {label: [] for label in labels}
        results: dict[str, tuple[list[list[int]], float, float]] = {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the design before warns that trees fall back to chains
            for round_number in range(repeats + 1):
                for label, drafter in drafters.items():
                    results[label] = _decode(lm, prompts, drafter, new_tokens, compile)
                    if round_number:
                        times[label].append(results[label][1])
        plain = statistics.median(times["plain"])
        for label in labels:
            seconds = statistics.median(times[label])
            tokens, _, mal = results[label]
            rows.append({"design": design, "drafter": label, "tokens_per_second": sum(map(len, tokens)) / seconds,
                         "speedup": plain / seconds, "mean_accepted_length": mal,
                         "same_as_plain": tokens == results["plain"][0]})
    return rows


def _single_table(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'design':<36}{'drafter':<10}{'tokens/s':>10}{'speedup':>9}{'MAL':>7}  same", "-" * 80]
    for row in rows:
        lines.append(f"{row['design']:<36}{row['drafter']:<10}{row['tokens_per_second']:>10.1f}"
                     f"{row['speedup']:>8.2f}x{row['mean_accepted_length']:>7.2f}  "
                     f"{'yes' if row['same_as_plain'] else 'NO'}")
    return "\n".join(lines)


def _memory(model: Any, lm: Any) -> str:
    """Table 3: bytes per verify position, computed and read back from a decode's buffers."""
    from specdec.runtime.linear import LinearStates

    per_slot = slot_bytes(model.config, model.dtype)
    layers = [layer for layer in lm.cache.layers if isinstance(layer, LinearStates) and layer.states is not None]
    held = sum(layer._states().nbytes + layer._inputs().nbytes for layer in layers)
    slots = layers[0].slots if layers else 0
    lines = [f"linear-attention layers: {len(layers)}; per verify position {per_slot / 2**10:.1f} KiB (computed)"]
    if slots:
        lines.append(f"a decode's buffers: {slots} slots, {held / 2**10:.1f} KiB, {held / slots / 2**10:.1f} KiB "
                     "per slot (read back)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the quick hybrid family (a smoke run)")
    parser.add_argument("--cache-dir", default=None, help="zoo cache directory (default: the user cache)")
    parser.add_argument("--prompts", type=int, default=2, help="held-out prompts per category (default 2)")
    parser.add_argument("--new-tokens", type=int, default=64, help="tokens per prompt (default 64)")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds; the median counts (default 3)")
    parser.add_argument("--batches", type=int, nargs="*", default=[1, 2, 4, 8, 16],
                        help="batch sizes of the curve (none: skip it)")
    parser.add_argument("--compiled-curve", action="store_true", help="the batch curve on the compiled engine")
    parser.add_argument("--eager", action="store_true", help="leave out the compiled design (a smoke run)")
    args = parser.parse_args(argv)

    from specdec import zoo
    from specdec.bench.batch_curve import BatchCurveConfig, curve_table, run_curve
    from specdec.bench.runner import Contender
    from specdec.checkpoints import load_causal_lm, load_tokenizer
    from specdec.runtime.target import CausalLM
    from specdec.data.prompts import first_per_category
    from specdec.zoo.measure import read_evaluation

    directory = zoo.ready(zoo.HYBRID_QUICK if args.quick else zoo.HYBRID, root=args.cache_dir)
    tokenizer = load_tokenizer(directory / "target")
    model = load_causal_lm(directory / "target")
    chosen = first_per_category(read_evaluation(directory).prompts, args.prompts)  # the same on every machine
    prompts = [torch.tensor(tokenizer(p.text, add_special_tokens=False)["input_ids"]) for p in chosen]
    text = model.config.get_text_config()
    print(f"hybrid zoo target {directory}: {text.num_hidden_layers} layers ({text.layer_types.count('linear_attention')} "
          f"GatedDeltaNet), hidden {text.hidden_size}; {len(prompts)} prompts, {args.new_tokens} new tokens, k = {K}, "
          f"greedy, {torch.get_num_threads()} threads\n")
    rows = single_rows(model, directory, prompts, args.new_tokens, args.repeats, compiled=not args.eager)
    print(_single_table(rows), flush=True)
    if args.batches:
        options = zoo.drafter_options(directory)
        contenders = (Contender("plain", compile=args.compiled_curve),
                      Contender("mtp", "mtp", options["mtp"], k=K, compile=args.compiled_curve),
                      Contender("ngram", "ngram", options["ngram"], k=K, compile=args.compiled_curve))
        config = BatchCurveConfig(tuple(args.batches), contenders, max_new_tokens=args.new_tokens,
                                  repeats=args.repeats, peers=False)
        records = run_curve(model, [prompt.tolist() for prompt in prompts], config)
        print(f"\nbatch curve ({'compiled' if args.compiled_curve else 'eager'}), tokens/s and speedup over plain:")
        print(curve_table(records), flush=True)
        if not all(r["same_as_plain"] in (True, None) for r in records):
            print("a batch row differed from plain decoding", file=sys.stderr)
            return 1
    lm = CausalLM(model)
    from specdec.plugins import make_drafter

    _decode(lm, prompts[:1], make_drafter("mtp", **zoo.drafter_options(directory)["mtp"]), args.new_tokens, False)
    print("\nstate buffers per verify position:\n" + _memory(model, lm))
    return 0 if all(row["same_as_plain"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
