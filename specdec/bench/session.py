"""One bench session end to end: resolve the target, questions and contenders, run them,
summarise, and write results.json, results.csv and the plots into the output directory."""

from __future__ import annotations

import json
import platform
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from specdec import plugins
from specdec.bench.llama_cpp import LLAMA_CPP, llama_cpp_missing
from specdec.bench.peers import hf_missing
from specdec.bench.questions import Question, from_prompts, load_questions, turn_prompt
from specdec.bench.report import NOISE_BOUND, SCHEMA, csv_text, noisy_contenders, summarize, tree_sizes
from specdec.bench.runner import AUTO_MAX, Contender, run_bench
from specdec.data.chat import CHAT, PROMPT_FORMATS, RAW, chat_ids, conversation, prompt_format
from specdec.distributed.sharding import agree_object, is_main_process
from specdec.errors import one_line
from specdec.runtime.timing import forward_costs, tree_forward_costs
from specdec.types import Sampling
from specdec.verifier import DEFAULT_RULE, check_verify_rule
from specdec.versions import software_versions

__all__ = ["ENGINES", "BenchConfig", "contenders_for", "default_drafters", "drafts_trees", "machine_info", "run_session",
           "turn_encoder", "used_prompt_format"]

_PATH_OPTIONS = ("model", "path", "datastore", "tokenizer")  # options that name files, left out of row labels
ENGINES = ("eager", "compiled")


@dataclass(frozen=True)
class BenchConfig:
    """What `specdec bench` runs. Empty `drafters` means every drafter that serves the target."""

    target: Path
    drafters: tuple[tuple[str, dict[str, Any]], ...]
    ks: tuple[int | str, ...] = (4,)
    sampling: Sampling = field(default_factory=Sampling)
    max_new_tokens: int = 128
    repeats: int = 3  # recorded rounds, every contender
    max_repeats: int | None = None  # the most recorded rounds while a row is noisy; None: 3 × repeats
    noise_bound: float = NOISE_BOUND  # a row is noisy when a timed figure's IQR / median exceeds this
    warmup: int = 1
    seed: int = 0
    peers: bool = True
    prompts: Path | None = None  # a Spec-Bench question.jsonl; None: held-out code prompts
    prompts_per_category: int = 4
    zoo: Path | None = None  # the zoo family benchmarked: its evaluation prompts are the held-out code prompts
    engines: tuple[str, ...] = ("compiled",)  # "eager" and/or "compiled": specdec's rows on each
    prompt_format: str = "auto"  # "chat-template", "raw", or auto: the template for Spec-Bench questions if any
    verify_rules: tuple[str, ...] = (DEFAULT_RULE,)  # a row per rule for every drafter (`specdec.verifier.rules`)
    llama_cpp: Path | None = None  # a GGUF file llama.cpp's plain decoding runs as a row (`specdec.bench.llama_cpp`)

    def __post_init__(self) -> None:
        if self.prompt_format not in PROMPT_FORMATS:
            raise ValueError(f"prompt_format must be one of {PROMPT_FORMATS}, got {self.prompt_format!r}")
        engines = self.engines
        if not engines or any(e not in ENGINES for e in engines) or len(set(engines)) != len(engines):
            raise ValueError(f"engines must be distinct values of {ENGINES}, got {self.engines!r}")
        if self.max_repeats is not None and self.max_repeats < self.repeats:
            raise ValueError(f"max_repeats (--max-repeats) must be >= repeats ({self.repeats}), got {self.max_repeats}")
        if not self.verify_rules or len(set(self.verify_rules)) != len(self.verify_rules):
            raise ValueError(f"verify_rules must be distinct rule names, got {self.verify_rules!r}")
        for rule in self.verify_rules:
            check_verify_rule(rule)
        if not self.noise_bound > 0:
            raise ValueError(f"noise_bound (--noise-bound) must be > 0 (a relative spread such as 0.1), got "
                             f"{self.noise_bound}")

    @property
    def repeat_limit(self) -> int:
        """The most recorded rounds: max_repeats, or 3 × repeats when it is None."""
        return 3 * self.repeats if self.max_repeats is None else self.max_repeats


def drafts_trees(name: str, options: dict[str, Any]) -> bool:
    """Whether the drafter drafts token trees with `options`: its class's `drafts_trees(options)`
    when it has one, else whether `options` hold every entry of its `tree_options` class
    attribute (the options the bench's NAME+tree row adds, e.g. eagle's {"tree": True}). `name` may
    be a zoo label (`specdec.zoo.options.registry_name`)."""
    from specdec.zoo.options import registry_name

    try:
        cls = plugins.drafter_class(registry_name(name))
    except (KeyError, ValueError):
        return False
    decide = getattr(cls, "drafts_trees", None)
    if callable(decide):
        return bool(decide(options))
    declared = getattr(cls, "tree_options", None) or {}
    return bool(declared) and all(options.get(key) == value for key, value in declared.items())


def contenders_for(drafters: Sequence[tuple[str, dict[str, Any]]], ks: Sequence[int | str], peers: bool,
                   engines: Sequence[str] = ("eager",), rules: Sequence[str] = (DEFAULT_RULE,),
                   llama_cpp: Path | None = None) -> list[Contender]:
    """Plain decoding, each drafter at each k (a drafter's own `k` option wins) under each
    verification rule, then the peers, then llama.cpp's plain decoding of the GGUF file
    `llama_cpp` when given. A drafter is named by its registered name or by a zoo
    label (`specdec.zoo.options.registry_name`: draft-model-xtok is the draft-model drafter), and
    its rows are labelled by that name.

    A drafter in tree mode is labelled NAME+tree; rows that would share a label get their
    options appended. With several rules each drafter row comes once per rule, labelled
    NAME/RULE: every rule's row decodes the same prompts with the same seeds, so the drafter's
    first draft and the verifier's first uniforms are the same for each (matched draws until
    the verdicts differ). With both engines every specdec row comes twice, eager then compiled
    (labelled NAME@compiled), each compared with plain decoding on its own engine.
    """
    from specdec.zoo.options import registry_name

    out: list[Contender] = []
    rows: list[tuple[str, str, dict[str, Any], int | str, bool]] = []
    for name, options in drafters:
        own = dict(options)
        values: Sequence[int | str] = [own.pop("k")] if "k" in own else ks
        registered = registry_name(name)
        tree = drafts_trees(name, own)
        for k in values:
            base = f"{name}+tree" if tree else name
            rows.append((f"{base}:k={k}" if len(ks) > 1 or k == "auto" else base, registered, own, k, tree))
    labels = [label for label, *_ in rows]
    named: list[tuple[str, str | None, dict[str, Any], int | str, bool]] = []
    for label, drafter, own, k, tree in rows:
        if labels.count(label) > 1:
            shown = ",".join(f"{key}={value}" for key, value in own.items() if key not in _PATH_OPTIONS)
            label = f"{label}[{shown}]"
        named.append((label, drafter, own, k, tree))
    for label, drafter_name, own, k, tree in [("plain", None, {}, 0, False), *named]:
        for rule in rules if drafter_name is not None else (DEFAULT_RULE,):
            ruled = f"{label}/{rule}" if drafter_name is not None and len(rules) > 1 else label
            for engine in engines:
                suffix = "@compiled" if engine == "compiled" and len(engines) > 1 else ""
                out.append(Contender(ruled + suffix, drafter_name, own, k, tree=tree, compile=engine == "compiled",
                                     baseline="plain" + suffix, verify_rule=rule))
    if peers:
        int_ks = [k for k in ks if isinstance(k, int)] or [4]
        out.append(Contender("hf-plain", peer="hf-plain", k=0))
        out.append(Contender("hf-static", peer="hf-static", k=0))
        for k in int_ks:
            suffix = f":k={k}" if len(int_ks) > 1 else ""
            out.append(Contender(f"hf-prompt-lookup{suffix}", peer="hf-prompt-lookup", k=k))
            if any(name == "draft-model" for name, _ in drafters):
                out.append(Contender(f"hf-assisted{suffix}", peer="hf-assisted", k=k))
    if llama_cpp is not None:
        out.append(Contender("llama.cpp", peer=LLAMA_CPP, options={"file": str(llama_cpp)}))
    return out


def used_prompt_format(config: BenchConfig, tokenizer: Any) -> str:
    """CHAT or RAW: auto applies the tokenizer's chat template, when it has one, to Spec-Bench
    questions; the held-out code prompts are completions, so auto keeps them raw."""
    if config.prompt_format == "auto" and config.prompts is None:
        return RAW
    return prompt_format(tokenizer, config.prompt_format)


def turn_encoder(tokenizer: Any, used: str) -> Callable[[tuple[str, ...], list[str], int], list[int]]:
    """`(turns, answers, index) -> ids` of turn `index` in the format `used` (CHAT or RAW)."""
    def encode(turns: tuple[str, ...], answers: list[str], index: int) -> list[int]:
        if used == CHAT:
            return chat_ids(tokenizer, conversation(turns, answers, index))
        return list(tokenizer(turn_prompt(turns, answers, index), add_special_tokens=False)["input_ids"])

    return encode


def machine_info(device: torch.device) -> dict[str, Any]:
    import os

    machine = {"platform": platform.platform(), "processor": platform.machine(), "cpus": os.cpu_count(),
               "torch_threads": torch.get_num_threads(), "device": str(device)}
    if device.type == "cuda":
        machine["gpu"] = torch.cuda.get_device_name(device)
    return machine


def run_session(config: BenchConfig, out: Path, model: Any, tokenizer: Any,
                advance_factory: Callable[[int], Callable[[], None]] = lambda total: (lambda: None)
                ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Run the bench and write its files into `out`; returns (records, the JSON document)."""
    used = used_prompt_format(config, tokenizer)  # fails before any run
    questions = load_questions(config.prompts) if config.prompts is not None else _code_questions(config)
    peers = config.peers and not hf_missing(config.sampling)
    llama_cpp = config.llama_cpp if config.llama_cpp is not None and not llama_cpp_missing(config.sampling) else None
    contenders = contenders_for(config.drafters, config.ks, peers, config.engines, config.verify_rules, llama_cpp)
    assistant = None
    # transformers' assisted generation takes the draft-model row's model (of the target's vocabulary)
    source = next((options.get("model") for name, options in config.drafters if name == "draft-model"), None)
    if source is not None and peers:
        from specdec.checkpoints import load_causal_lm

        assistant = (load_causal_lm(source).to(device=model.device, dtype=model.dtype)  # type: ignore[call-arg]
                     if isinstance(source, (str, Path)) else source)
    turns = sum(len(q.turns) for q in questions)
    advance = advance_factory((config.warmup + config.repeats) * turns * len(contenders))

    prompt_ids = turn_encoder(tokenizer, used)

    def decode(ids: list[int]) -> str:
        return str(tokenizer.decode(ids, skip_special_tokens=True))

    runs, compiled = run_bench(model, prompt_ids, decode, questions, contenders, config.sampling, config.max_new_tokens,
                               config.repeats, config.warmup, config.seed, assistant, advance,
                               max_repeats=config.repeat_limit,
                               noisy=lambda so_far: agree_object(noisy_contenders(so_far, contenders,
                                                                                  config.noise_bound)),
                               tokenizer=tokenizer)
    from specdec.runtime.target import CausalLM

    sizes = [1] + [k + 1 for k in config.ks if isinstance(k, int)]
    sizes += list(range(2, AUTO_MAX + 2)) if any(c.k == "auto" for c in contenders) else []
    # T(n) at the mean context length of the runs: the mean prompt plus half the new tokens
    prompts = [torch.tensor(prompt_ids(q.turns, [], 0), dtype=torch.long) for q in questions]
    length = int(sum(p.numel() for p in prompts) / len(prompts)) + config.max_new_tokens // 2
    prefix = prompts[0].repeat(length // prompts[0].numel() + 1)[:length]
    target = CausalLM(model)
    needed = tree_sizes(runs, contenders)
    costs, tree_costs = {}, {}
    for engine in config.engines:  # T(n) on each engine, for its rows' ideal speedups
        costs[engine] = forward_costs(target, prefix, sizes, compile=engine == "compiled")
        tree_costs[engine] = tree_forward_costs(target, prefix, needed, compile=engine == "compiled") \
            if needed and target.tree_obstacle is None else {}
    records = summarize(runs, contenders, costs, config.sampling.greedy, tree_costs, compiled, config.noise_bound)
    document = {"schema": SCHEMA, "machine": machine_info(model.device), "versions": software_versions(),
                "settings": {**{k: v for k, v in asdict(config).items() if k not in ("sampling", "drafters")},
                             "target": str(config.target), "prompts": None if config.prompts is None
                             else str(config.prompts), "sampling": asdict(config.sampling),
                             "drafters": [[name, {k: str(v) for k, v in options.items()}]
                                          for name, options in config.drafters],
                             "peers_left_out_for": hf_missing(config.sampling) if config.peers else [],
                             "llama_cpp": None if config.llama_cpp is None else str(config.llama_cpp),
                             "llama_cpp_left_out_for": llama_cpp_missing(config.sampling) if config.llama_cpp else [],
                             "questions": len(questions), "turns": turns, "prompt_format": used,
                             "repeat_limit": config.repeat_limit},
                "rounds": len({r.repeat for r in runs}),  # recorded rounds run (noisy rows' extra ones included)
                "forward_costs": {e: {str(n): t for n, t in c.items()} for e, c in costs.items()},
                "tree_forward_costs": {e: {str(n): t for n, t in c.items()} for e, c in tree_costs.items()},
                "compile_seconds": sum(compiled.values()), "records": records}
    if is_main_process():  # under torchrun, rank 0 writes the results
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps(document, indent=2, default=str) + "\n")
        (out / "results.csv").write_text(csv_text(records))
    return records, document


def _code_questions(config: BenchConfig) -> tuple[Question, ...]:
    """The first `prompts_per_category` held-out code prompts of each category: of the zoo
    family's evaluation prompts (the same on every machine, each numbered, and so seeded, as in
    the family's figures) when the bench runs on the zoo, else cut from this interpreter's
    standard library."""
    from specdec.data.corpus import stdlib_corpus
    from specdec.data.prompts import code_prompts, first_per_category

    if config.zoo is None:
        return from_prompts(code_prompts(stdlib_corpus(), per_category=config.prompts_per_category))
    from specdec.zoo.measure import read_evaluation

    every = read_evaluation(config.zoo).prompts
    chosen = first_per_category(every, config.prompts_per_category)
    return from_prompts(chosen, tuple(every.index(p) for p in chosen))


def default_drafters(zoo_dir: Path | None) -> tuple[list[tuple[str, dict[str, Any]]], list[str]]:
    """Every registered drafter that can serve the target (chain, then tree mode when it has one),
    and a line for each that cannot. On a zoo each drafter comes once per zoo row it makes
    (`specdec.zoo.zoo_drafters`: draft-model, then draft-model-xtok), named by the row's label."""
    from specdec.zoo import zoo_drafters

    known = zoo_drafters(zoo_dir) if zoo_dir is not None else {"ngram": ("ngram", {})}
    chosen, skipped = [], []
    for name in plugins.drafter_names():
        rows: list[tuple[str, dict[str, Any] | None]] = [
            (label, options) for label, (registered, options) in known.items() if registered == name] or [(name, None)]
        for label, options in rows:
            if options is None:
                try:
                    plugins.make_drafter(name)
                    options = {}
                except (TypeError, ValueError, OSError) as error:
                    skipped.append(f"{name} (needs options: {one_line(error)})")
                    continue
            chosen.append((label, options))
            tree = getattr(plugins.drafter_class(name), "tree_options", None)
            if tree:  # the drafter's tree mode as a row of its own, beside its chain
                chosen.append((label, {**options, **tree}))
    return chosen, skipped
