"""The engine on Llama-shaped targets built from configs (nothing downloaded): forward costs,
plain decoding against transformers, drafters on the same target, how close each plain row
comes to the memory-bandwidth bound, and the batch curve (`specdec.bench.batch_curve`) on the
first target and the zoo. `make bench-gpu` runs the "gpu" setting; the tests run
"tiny" on the CPU.

    python -m specdec.bench.synthetic --setting gpu --device cuda --out bench-gpu
    python -m specdec.bench.synthetic --setting cpu-300m --out bench-300m

The targets' weights are random, so the drafters built for them (a draft model made of the
target's first layers, random EAGLE, MTP and Medusa heads) measure cost, not acceptance; the
zoo section (`--zoo`) runs the zoo's trained drafters on its own target for that.
Bandwidth share: a plain step reads every weight once (the embedding table but one row), so
weight bytes / bandwidth is the fastest a step can be; the share is that bound over the
measured seconds per token. The bandwidth is the device's published peak where known (GPUs),
and a measured copy bandwidth besides.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

import torch
from transformers import PreTrainedModel

from specdec.bench.batch_curve import BatchCurveConfig, curve_table, run_curve, stops_paying
from specdec.bench.peers import hf_generate
from specdec.bench.report import ideal_speedup
from specdec.bench.runner import Contender
from specdec.bench.shapes import DRAFTERS, SETTINGS, Setting, Shape, build_target, drafter_factories
from specdec.decoding.generate import generate
from specdec.runtime.engine import compile_seconds
from specdec.runtime.target import CausalLM
from specdec.runtime.timing import forward_costs, tree_forward_costs
from specdec.types import Sampling
from specdec.versions import software_versions

__all__ = ["SCHEMA", "SETTINGS", "main", "run_setting", "weight_bytes"]

SCHEMA = "specdec-synthetic-bench/1"
PEAK_BANDWIDTH = {"H200": 4.8e12, "H100 NVL": 3.9e12, "H100 PCIe": 2.0e12, "H100": 3.35e12, "A100-SXM4-80GB": 2.04e12,
                  "A100 80GB": 1.94e12, "A100": 1.56e12, "L40S": 0.864e12, "RTX 4090": 1.008e12}  # bytes/s


def weight_bytes(model: PreTrainedModel) -> int:
    """Bytes a plain step reads: every parameter but the input embedding, of which one row."""
    embedding = cast(torch.Tensor, model.get_input_embeddings().weight)
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    return total - embedding.numel() * embedding.element_size() + embedding.shape[1] * embedding.element_size()


def copy_bandwidth(device: torch.device, megabytes: int = 512) -> float:
    """Bytes per second of a large tensor copy (read and write counted), the median of 5."""
    source = torch.empty(megabytes * 2**20, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    times = []
    for _ in range(6):
        _synchronize(device)
        start = time.perf_counter()
        target.copy_(source)
        _synchronize(device)
        times.append(time.perf_counter() - start)
    return 2 * source.numel() / statistics.median(times[1:])


def peak_bandwidth(device: torch.device) -> float | None:
    """The published peak memory bandwidth of a known GPU (None elsewhere)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((value for key, value in PEAK_BANDWIDTH.items() if key in name), None)


@dataclass
class Row:
    """One decoding configuration on one target."""

    target: str
    contender: str
    engine: str
    tokens_per_second: float
    mean_accepted_length: float
    seconds_per_step: float
    draft_seconds_per_step: float
    compile_seconds: float
    same_as_plain: bool | None = None
    ideal_speedup: float | None = None
    speedup: float | None = None
    bandwidth_share: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _timed(run: Callable[[], Any], repeats: int) -> tuple[Any, float, float]:
    """(the last result, the median seconds of `repeats` calls after a warm-up one, compile seconds)."""
    before = compile_seconds()
    run()
    compiled = compile_seconds() - before
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = run()
        times.append(time.perf_counter() - start)
    return result, statistics.median(times), compiled


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _cost(lm: CausalLM, prompt: torch.Tensor, costs: dict[str, float], rows: int, tree: bool, compile: bool) -> float:
    """T of a chain or tree verify of `rows` rows, measured (and kept in `costs`) when not yet known."""
    key = f"{'tree ' if tree else ''}T({rows})"
    if key not in costs:
        with torch.inference_mode():
            measure = tree_forward_costs if tree else forward_costs
            costs[key] = measure(lm, prompt, [rows], repeats=10, compile=compile)[rows]
    return costs[key]


def run_target(shape: Shape, setting: Setting, device: torch.device, log: Callable[[str], None]) -> dict[str, Any]:
    """Every measure of one synthetic target: its forwards' costs on each engine, plain decoding and
    each drafter on each engine, the batch curve (on the first target), and transformers' own
    decoding (peers)."""
    model = build_target(shape, getattr(torch, setting.dtype), device)
    parameters = sum(p.numel() for p in model.parameters())
    log(f"{shape.name}: {parameters / 1e9:.2f}B parameters in {setting.dtype} on {device}")
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, shape.vocab, (setting.prompt,), generator=generator)
    motif = torch.randint(0, shape.vocab, (16,), generator=generator)
    repetitive = motif.repeat(setting.prompt // 16 + 1)[: setting.prompt]  # for prompt lookup
    lm = CausalLM(model)
    bound = weight_bytes(model) / (peak_bandwidth(device) or copy_bandwidth(device))
    costs = _forward_costs(lm, prompt, setting, log)
    rows, plain = _decode_rows(lm, shape, setting, prompt, repetitive, costs, bound, log)
    batch = _batch_curve(model, shape, setting, generator, log) if setting.batches and shape == setting.shapes[0] \
        else None
    if setting.peers:
        rows += _peer_rows(model, shape, setting, prompt, plain, bound, log)
    result = {"target": asdict(shape), "parameters": parameters, "weight_bytes": weight_bytes(model),
              "bandwidth_bound_seconds": bound, "forward_costs": costs, "rows": [asdict(row) for row in rows]}
    if batch is not None:
        result["batch"] = batch
    return result


def _forward_costs(lm: CausalLM, prompt: torch.Tensor, setting: Setting, log: Callable[[str], None]
                   ) -> dict[str, dict[str, float]]:
    """engine -> the seconds of a forward of 1 and k + 1 rows ("T(n)") and of each tree width
    ("tree T(n)"), and the seconds spent compiling them."""
    costs: dict[str, dict[str, float]] = {}
    for engine in setting.engines:
        compile, before = engine == "compiled", compile_seconds()
        with torch.inference_mode():
            chain = forward_costs(lm, prompt, [1, setting.k + 1], repeats=10, compile=compile)
            tree = tree_forward_costs(lm, prompt, list(setting.tree_rows), repeats=10, compile=compile)
        costs[engine] = {f"T({n})": t for n, t in chain.items()} | {f"tree T({n})": t for n, t in tree.items()}
        costs[engine]["compile_seconds"] = compile_seconds() - before
        log(f"  {engine} forward costs: " + ", ".join(f"{key} {1000 * t:.2f} ms" for key, t in costs[engine].items()
                                                         if key.startswith(("T(", "tree"))))
    return costs


def _decode_rows(lm: CausalLM, shape: Shape, setting: Setting, prompt: torch.Tensor, repetitive: torch.Tensor,
                 costs: dict[str, dict[str, float]], bound: float, log: Callable[[str], None]
                 ) -> tuple[list[Row], dict[Any, Any]]:
    """A row for plain decoding and each drafter on each engine (prompt lookup on the repetitive
    prompt, over plain decoding of it), and plain decoding's (tokens, seconds) by engine."""
    rows: list[Row] = []
    plain: dict[Any, Any] = {}  # engine (and "ngram") -> (tokens or Generation, seconds)
    with tempfile.TemporaryDirectory() as scratch:
        factories = drafter_factories(lm.model, Path(scratch), setting.drafters)
        for engine in setting.engines:
            compile = engine == "compiled"
            for name in ("plain", *setting.drafters):
                text = repetitive if name == "ngram" else prompt
                drafter = factories[name]() if name != "plain" else None

                def decode(text: torch.Tensor = text, drafter: Any = drafter) -> Any:
                    return generate(lm, text, drafter, num_draft_tokens=setting.k, max_new_tokens=setting.new_tokens,
                                    compile=compile)

                result, seconds, compiled = _timed(decode, setting.repeats)
                stats = result.stats
                row = Row(shape.name, name, engine, stats.new_tokens / seconds, stats.mean_accepted_length,
                          seconds / stats.steps, stats.draft_seconds / stats.steps, compiled)
                if name == "plain":
                    plain[engine] = (result.tokens, seconds)
                    row.bandwidth_share = bound / (seconds / stats.new_tokens)
                    if "ngram" in setting.drafters:  # prompt lookup's baseline: plain decoding of its prompt
                        plain[engine, "ngram"] = _timed(lambda: decode(repetitive, None), setting.repeats)[:2]
                else:
                    tokens, baseline = plain[engine, "ngram"] if name == "ngram" else plain[engine]
                    tokens = tokens.tokens if name == "ngram" else tokens
                    row.same_as_plain, row.speedup = result.tokens == tokens, baseline / seconds
                    width = max(1, round(stats.drafted / stats.steps)) + 1  # the ideal, from the verify's cost
                    verify = _cost(lm, prompt, costs[engine], width, tree="+tree" in name, compile=compile)
                    row.ideal_speedup = ideal_speedup(stats.mean_accepted_length, costs[engine]["T(1)"], verify,
                                                      row.draft_seconds_per_step)
                    row.extra["verify_rows"] = width
                rows.append(row)
                log(f"  {engine} {name}: {row.tokens_per_second:.1f} tokens/s, {row.mean_accepted_length:.2f} per step")
    return rows, plain


def _batch_curve(model: Any, shape: Shape, setting: Setting, generator: torch.Generator, log: Callable[[str], None]
                 ) -> dict[str, Any]:
    """The batch curve of plain decoding and `setting.batch_drafters`, compiled, on random prompts."""
    with tempfile.TemporaryDirectory() as scratch:
        factories = drafter_factories(model, Path(scratch), setting.batch_drafters)
        contenders = (Contender("plain", compile=True), *(
            Contender(name, name.removesuffix("+tree"), {}, setting.k, tree=name.endswith("+tree"), compile=True)
            for name in setting.batch_drafters))
        prompts = [torch.randint(0, shape.vocab, (setting.prompt,), generator=generator).tolist()
                   for _ in range(max(setting.batches))]
        config = BatchCurveConfig(batches=setting.batches, contenders=contenders, max_new_tokens=setting.new_tokens,
                                  repeats=setting.repeats, peers=setting.peers)
        records = run_curve(model, prompts, config, made={name: factories[name]() for name in setting.batch_drafters})
    batch = {"records": records, "stops_paying": stops_paying(records), "table": curve_table(records)}
    log(batch["table"])
    return batch


def _peer_rows(model: Any, shape: Shape, setting: Setting, prompt: torch.Tensor, plain: dict[Any, Any],
               bound: float, log: Callable[[str], None]) -> list[Row]:
    """A row for each of transformers' own greedy decodings (dynamic and static cache)."""
    rows: list[Row] = []
    for peer in ("hf-plain", "hf-static"):
        call = functools.partial(hf_generate, model, prompt, peer, 0, setting.new_tokens, Sampling())
        (tokens, stats), seconds, compiled = _timed(call, setting.repeats)
        reference = plain.get("eager", plain.get("compiled"))
        rows.append(Row(shape.name, peer, "transformers", stats.new_tokens / seconds, 1.0, seconds / stats.steps,
                        0.0, compiled, same_as_plain=reference is not None and tokens == reference[0],
                        bandwidth_share=bound / (seconds / stats.new_tokens)))
        log(f"  {peer}: {rows[-1].tokens_per_second:.1f} tokens/s")
    return rows


def table(results: Sequence[dict[str, Any]]) -> str:
    """The rows of every target as a markdown table."""
    lines = ["| target | contender | engine | tokens/s | tokens/step | ms/step | speedup | ideal | bandwidth share | "
             "compile s |", "|---|---|---|---|---|---|---|---|---|---|"]
    for result in results:
        for r in result["rows"]:
            def cell(value: float | None, text: str) -> str:
                return "-" if value is None else text.format(value)

            lines.append(f"| {r['target']} | {r['contender']} | {r['engine']} | {r['tokens_per_second']:.1f} | "
                         f"{r['mean_accepted_length']:.2f} | {1000 * r['seconds_per_step']:.2f} | "
                         f"{cell(r['speedup'], '{:.2f}x')} | {cell(r['ideal_speedup'], '{:.2f}x')} | "
                         f"{cell(r['bandwidth_share'], '{:.0%}')} | {r['compile_seconds']:.1f} |")
    return "\n".join(lines)


def run_setting(setting: Setting, device: torch.device, out: Path, zoo_dir: Path | None = None,
                log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run a setting, write `results.json` and `table.md` into `out`, return the document."""
    results = [run_target(shape, setting, device, log) for shape in setting.shapes]
    document: dict[str, Any] = {"schema": SCHEMA, "setting": asdict(setting), "device": str(device),
                                "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
                                "copy_bandwidth": copy_bandwidth(device), "peak_bandwidth": peak_bandwidth(device),
                                "versions": software_versions(), "targets": results}
    text = table(results)
    for result in results:
        if "batch" in result:
            text += f"\n\nThe batch curve on {result['target']['name']} (tokens/s, speedup over plain decoding " \
                    f"at each batch size):\n\n" + result["batch"]["table"]
    if zoo_dir is not None:
        document["zoo"] = _zoo(zoo_dir, setting, device, out / "zoo")
        text += "\n\nThe zoo's drafters on its target:\n\n" + document["zoo"]["table"]
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(document, indent=2, default=str) + "\n")
    (out / "table.md").write_text(text + "\n")
    log(text)
    return document


def _zoo(directory: Path, setting: Setting, device: torch.device, out: Path) -> dict[str, Any]:
    """`specdec bench` on the zoo's target: every drafter, chain and tree, on the setting's engines."""
    from specdec.bench.report import table as bench_table
    from specdec.bench.session import BenchConfig, default_drafters, run_session
    from specdec.checkpoints import load_causal_lm, load_tokenizer

    drafters, _ = default_drafters(directory)
    config = BenchConfig(target=directory / "target", drafters=tuple(drafters), ks=(setting.k,),
                         max_new_tokens=setting.new_tokens, repeats=setting.repeats, warmup=1,
                         engines=setting.engines, peers=setting.peers)
    model = load_causal_lm(directory / "target", dtype=getattr(torch, setting.dtype)).to(device)  # type: ignore[arg-type]
    tokenizer = load_tokenizer(directory / "target")
    records, _ = run_session(config, out, model, tokenizer)
    zoo: dict[str, Any] = {"records": records, "table": bench_table(records)}
    if setting.batches:  # the curve with the zoo's trained drafters: plain, and each batch drafter chain and tree
        from specdec.bench.questions import from_prompts
        from specdec.bench.session import contenders_for
        from specdec.data.corpus import stdlib_corpus
        from specdec.data.prompts import code_prompts

        names = {name.removesuffix("+tree") for name in setting.batch_drafters} | {"eagle3", "mtp"}
        chosen = tuple((name, options) for name, options in drafters if name in names)
        contenders = tuple(c for c in contenders_for(chosen, (setting.k,), False, ("compiled",)) if c.peer is None)
        prompts = [tokenizer(q.turns[0], add_special_tokens=False)["input_ids"]
                   for q in from_prompts(code_prompts(stdlib_corpus()))]
        curve = BatchCurveConfig(batches=setting.batches, contenders=contenders, max_new_tokens=setting.new_tokens,
                                 repeats=setting.repeats, peers=setting.peers)
        batch = run_curve(model, prompts, curve)
        zoo["batch"] = {"records": batch, "stops_paying": stops_paying(batch), "table": curve_table(batch)}
        zoo["table"] += "\n\nThe batch curve on the zoo's target:\n\n" + zoo["batch"]["table"]
    return zoo


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specdec.bench.synthetic", description=__doc__.split("\n\n")[0])
    parser.add_argument("--setting", choices=sorted(SETTINGS), default="gpu")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", default="bench-synthetic", metavar="DIR")
    parser.add_argument("--zoo", metavar="DIR", default=None,
                        help="a zoo family's directory (default: the shipped full zoo, if the setting runs one)")
    parser.add_argument("--drafters", nargs="*", default=None, choices=DRAFTERS, help="override the setting's")
    args = parser.parse_args(argv)
    setting = SETTINGS[args.setting]
    if args.drafters is not None:
        setting = dataclasses.replace(setting, drafters=tuple(args.drafters))
    zoo_dir = Path(args.zoo) if args.zoo else None
    if zoo_dir is None and setting.zoo:
        from specdec import zoo

        if zoo.ships("full"):
            zoo_dir = zoo.ready(zoo.FULL)  # the shipped family, never a 20-minute build
        else:
            print("specdec: no shipped full zoo here; its section is skipped (pass --zoo DIR)")
    run_setting(setting, torch.device(args.device), Path(args.out), zoo_dir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
