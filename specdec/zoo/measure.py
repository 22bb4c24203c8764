"""What a zoo family publishes about itself, measured from its files alone.

A family directory holds its evaluation beside its weights (`evaluation/`: the held-out code
prompts as text and the held-out loss windows as token ids), so the figures below depend on the
family's bytes and nothing else: the shipped zoo gives the same figures on every machine, and
`specdec zoo build` measures a fresh build the same way on its own held-out files.

- **losses**: each piece's held-out cross-entropy (nats per token) and, for a drafter, its top-1
  agreement with the target, teacher-forced, over the windows (the draft model of another
  tokenizer: its loss on each window's text in its own ids, per target token, and no agreement,
  which needs one vocabulary; `specdec.zoo.xtok`);
- **accepted lengths**: every drafter decodes every prompt (`Evaluation.k` draft tokens per
  step, `new_tokens` each, greedy or at `temperature` with a per-prompt seed); the mean accepted
  length is tokens emitted over target forwards, with a 95% bootstrap interval over prompts and a
  rank the paired intervals support (`specdec.intervals`);
- **loops**: how much of the decoded text is a degenerate loop and how much of each drafter's
  accepted length it gave (`specdec.data.loops`).

Written as `figures.json`; `specdec.zoo.publish` turns it into the docs' tables.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from specdec.checkpoints import load_causal_lm, load_tokenizer, quiet_transformers
from specdec.data.loops import DEGENERATE_SHARE, LOOP_NGRAM, loop_count
from specdec.data.prompts import Prompt
from specdec.decoding.generate import generate
from specdec.drafters.feature_heads.eagle import load_eagle
from specdec.drafters.feature_heads.eagle3_files import load_eagle3
from specdec.drafters.feature_heads.medusa_files import load_medusa
from specdec.drafters.feature_heads.mtp_files import load_mtp
from specdec.drafters.parallel.dflash_files import load_dflash
from specdec.intervals import LEVEL, RESAMPLES, rank_labels, ranks, ratio_interval
from specdec.plugins import make_drafter
from specdec.runtime.target import CausalLM
from specdec.training.distill import evaluate
from specdec.training.draft_model import DraftModelStudent
from specdec.training.eagle import EagleStudent
from specdec.training.eagle3 import Eagle3Student
from specdec.training.medusa import MedusaStudent
from specdec.training.dflash import DFlashStudent
from specdec.training.mtp import MtpStudent
from specdec.training.pard import PardRecipe, PardStudent
from specdec.training.target import heldout_loss
from specdec.types import Sampling
from specdec.zoo.options import ROWS, draft_length, zoo_drafters
from specdec.zoo.settings import LEARNED, XTOK
from specdec.zoo.xtok import xtok_loss

__all__ = ["EVALUATION", "FIGURES", "Evaluation", "PromptRun", "acceptance_figures", "decode_prompts", "decode_rows",
           "load_students", "measure", "ordered", "piece_losses", "read_evaluation", "read_figures", "write_evaluation",
           "write_figures"]

EVALUATION = "evaluation"  # prompts.json (settings and prompts) + windows.safetensors
FIGURES = "figures.json"
FIGURES_FORMAT = 1


MEASURED_RULE = "token"  # the verification rule of the zoo's figures (`decode_prompts`)


@dataclass(frozen=True)
class Evaluation:
    """What a family is measured on: prompts (text), loss windows LongTensor [n, T], and the decoding."""

    prompts: tuple[Prompt, ...]
    windows: torch.Tensor
    k: int = 4
    new_tokens: int = 128
    temperature: float = 0.0  # 0: greedy
    seed: int = 0  # prompt i decodes with seed + i when sampling

    @property
    def sampling(self) -> Sampling:
        return Sampling(temperature=self.temperature)

    @property
    def verify_rule(self) -> str:
        """The rule the family's figures are measured under (`MEASURED_RULE`)."""
        return MEASURED_RULE

    def settings(self) -> dict[str, Any]:
        return {"prompts": len(self.prompts), "windows": list(self.windows.shape), "k": self.k,
                "new_tokens": self.new_tokens, "temperature": self.temperature, "seed": self.seed}


def write_evaluation(directory: Path, evaluation: Evaluation) -> None:
    """`directory/evaluation/`: prompts.json (the decoding settings and every prompt) and the windows."""
    folder = directory / EVALUATION
    folder.mkdir(parents=True, exist_ok=True)
    record = {key: value for key, value in evaluation.settings().items() if key not in ("prompts", "windows")}
    record["prompts"] = [asdict(p) for p in evaluation.prompts]
    (folder / "prompts.json").write_text(json.dumps(record, indent=1) + "\n")
    save_file({"windows": evaluation.windows.to(torch.int32).contiguous()}, str(folder / "windows.safetensors"))


def read_evaluation(directory: Path) -> Evaluation:
    folder = directory / EVALUATION
    if not (folder / "prompts.json").is_file():
        raise FileNotFoundError(f"{directory} holds no evaluation ({EVALUATION}/prompts.json); a family built "
                                "before ZOO_FORMAT 10 does not: build it again")
    record = json.loads((folder / "prompts.json").read_text())
    prompts = tuple(Prompt(**p) for p in record["prompts"])
    windows = load_file(str(folder / "windows.safetensors"))["windows"].long()
    return Evaluation(prompts, windows, int(record["k"]), int(record["new_tokens"]), float(record["temperature"]),
                      int(record["seed"]))


def read_figures(directory: Path) -> dict[str, Any] | None:
    """The family's figures.json, or None when it has none."""
    file = directory / FIGURES
    return json.loads(file.read_text()) if file.is_file() else None


def load_students(directory: Path, target: Any, names: Sequence[str]) -> list[Any]:
    """The learned drafters of `names` (and the target's MTP module), read from the family's files
    and wrapped as the students `specdec.training.distill.evaluate` measures."""
    embed, lm_head = target.get_input_embeddings(), target.get_output_embeddings()
    load: dict[str, Callable[[], Any]] = {
        "draft-model": lambda: DraftModelStudent(load_causal_lm(directory / "draft-model")),
        "medusa": lambda: MedusaStudent(load_medusa(directory / "medusa")),
        "eagle": lambda: EagleStudent(load_eagle(directory / "eagle"), embed, lm_head),
        "eagle3": lambda: Eagle3Student(load_eagle3(directory / "eagle3"), embed),
        "mtp": lambda: MtpStudent(load_mtp(directory / "target"), embed, lm_head),
        "dflash": lambda: DFlashStudent(load_dflash(directory / "dflash"), embed, lm_head),
        "pard": lambda: _pard_student(directory / "pard", lm_head)}
    students = [load[name]() for name in load if name in names]
    for student in students:
        student.module.eval()
    return students


def _pard_student(directory: Path, lm_head: Any) -> PardStudent:
    model = load_causal_lm(directory)
    return PardStudent(model, int(model.config.pard_token), int(lm_head.weight.shape[0]), PardRecipe())


@dataclass(frozen=True)
class PromptRun:
    """One prompt decoded: tokens emitted, target forwards, drafted and accepted draft tokens,
    the accepted ones that were loop tokens, and the output's loop tokens."""

    new_tokens: int
    steps: int
    drafted: int
    accepted: int
    loop_accepted: int
    loop_tokens: int

    @property
    def degenerate(self) -> bool:
        """Whether the output is mostly loop (`specdec.data.loops.DEGENERATE_SHARE`)."""
        return self.new_tokens > 0 and self.loop_tokens >= DEGENERATE_SHARE * self.new_tokens

    def row(self) -> list[int]:
        return [self.new_tokens, self.steps, self.drafted, self.accepted, self.loop_accepted, self.loop_tokens]


def decode_prompts(target: CausalLM, prompts: Sequence[torch.Tensor], drafter: Any, evaluation: Evaluation,
                   compile: bool = False, on_prompt: Callable[[], None] | None = None, tokenizer: Any = None,
                   k: int | None = None) -> tuple[list[list[int]], list[PromptRun], list[float]]:
    """Every prompt decoded with `drafter` (None: plain decoding): the tokens, the counts and the
    seconds of each. A drafter that remembers earlier outputs forgets them first. Verified
    token-wise (`MEASURED_RULE`): the zoo's figures keep the rule every engine shares, so they
    compare with published ones; `docs/verification.md` gives what the other rules add.
    `tokenizer` is the target's, which a drafter may need (a draft model of another tokenizer,
    the self drafter's calibration text). `k`: the draft length (None: the evaluation's)."""
    from specdec.protocols import forget

    forget(drafter)
    outputs, runs, seconds = [], [], []
    for i, prompt in enumerate(prompts):
        length = (evaluation.k if k is None else k) if drafter is not None else 0
        result = generate(target, prompt, drafter=drafter, num_draft_tokens=length,
                          max_new_tokens=evaluation.new_tokens, sampling=evaluation.sampling,
                          seed=evaluation.seed + i, compile=compile, verify_rule=evaluation.verify_rule,
                          tokenizer=tokenizer)
        stats = result.stats
        loops = loop_count(result.tokens, stats.accepted_per_step if drafter is not None else [0] * stats.steps)
        outputs.append(result.tokens)
        runs.append(PromptRun(stats.new_tokens, stats.steps, stats.drafted, loops.accepted, loops.loop_accepted,
                              loops.loop_tokens))
        seconds.append(stats.wall_seconds)
        if on_prompt is not None:
            on_prompt()
    return outputs, runs, seconds


def acceptance_figures(runs: dict[str, list[PromptRun]]) -> dict[str, dict[str, Any]]:
    """Each drafter's mean accepted length with its interval and rank, acceptance, and loop shares."""
    counts = {name: ([r.new_tokens for r in rows], [r.steps for r in rows]) for name, rows in runs.items()}
    labels = rank_labels(ranks(counts))
    out: dict[str, dict[str, Any]] = {}
    for name, rows in runs.items():
        steps = sum(r.steps for r in rows)
        accepted = sum(r.accepted for r in rows)
        looped = sum(r.loop_accepted for r in rows)
        drafted = sum(r.drafted for r in rows)
        out[name] = {"mean_accepted_length": ratio_interval(*counts[name]).as_dict(),
                     "rank": labels[name], "acceptance_rate": accepted / drafted if drafted else 0.0,
                     "from_loops": looped / steps if steps else 0.0,
                     "loop_share": looped / accepted if accepted else 0.0,
                     "text_loop_share": sum(r.loop_tokens for r in rows) / max(1, sum(r.new_tokens for r in rows)),
                     "degenerate": sum(r.degenerate for r in rows),
                     "prompts": [r.row() for r in rows]}
    return out


def ordered(labels: Iterable[str]) -> list[str]:
    """Zoo labels in the order the figures list them (`specdec.zoo.options.ROWS`)."""
    chosen = set(labels)
    return [label for label in ROWS if label in chosen]


def piece_losses(directory: Path, model: Any, evaluation: Evaluation,
                 names: Sequence[str]) -> dict[str, dict[str, float]]:
    """The held-out figures of each piece of `names` ("target" and the learned drafters), in the
    figures' order (target, then `LEARNED`'s): loss, and a distilled drafter's agreement."""
    found: dict[str, dict[str, float]] = {}
    with torch.no_grad():
        if "target" in names:
            found["target"] = {"loss": heldout_loss(model, evaluation.windows)}
        students = load_students(directory, model, names)
        if students:
            found |= evaluate(model, students, evaluation.windows)
        if XTOK in names:
            with quiet_transformers():
                draft = load_causal_lm(directory / XTOK).eval()
            found[XTOK] = xtok_loss(draft, load_tokenizer(directory / XTOK), load_tokenizer(directory / "tokenizer"),
                                    evaluation.windows)
    order = ["target", *LEARNED]
    return {name: {key: round(value, 4) for key, value in found[name].items()}
            for name in sorted(found, key=order.index)}


def decode_rows(directory: Path, model: Any, evaluation: Evaluation, labels: Sequence[str],
                say: Callable[[str], None], plain: bool = True) -> tuple[list[PromptRun], dict[str, list[PromptRun]]]:
    """Plain decoding's runs (none unless `plain`) and each zoo label's of `labels` (those the
    family can serve here, in the figures' order) on the family's evaluation prompts."""
    tokenizer = load_tokenizer(directory / "tokenizer")
    ids = [torch.tensor(tokenizer(p.text, add_special_tokens=False)["input_ids"]) for p in evaluation.prompts]
    target = CausalLM(model)
    drafters = zoo_drafters(directory, tuple(labels))
    say(f"decoding {len(ids)} prompts{' plainly and' if plain else ''} with {', '.join(drafters)}")
    plain_runs = decode_prompts(target, ids, None, evaluation)[1] if plain else []
    runs = {label: decode_prompts(target, ids, make_drafter(name, **options), evaluation, tokenizer=tokenizer,
                                  k=draft_length(label, evaluation.k))[1]
            for label, (name, options) in drafters.items()}
    return plain_runs, runs


def measure(directory: Path, drafters: Sequence[str], log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Every figure of the family at `directory` (see the module docstring), written to figures.json."""
    say = log or (lambda line: print(line, file=sys.stderr, flush=True))
    evaluation = read_evaluation(directory)
    with quiet_transformers():
        model = load_causal_lm(directory / "target")
    model.eval()
    say(f"held-out losses over {evaluation.windows.shape[0]} windows")
    losses = piece_losses(directory, model, evaluation, ["target", *drafters])
    plain, runs = decode_rows(directory, model, evaluation, ordered(drafters), say)
    document = {"format": FIGURES_FORMAT, "evaluation": evaluation.settings(),
                "loops": {"ngram": LOOP_NGRAM, "degenerate_share": DEGENERATE_SHARE},
                "intervals": {"level": LEVEL, "resamples": RESAMPLES, "unit": "prompt"},
                "losses": losses,
                "text": {"loop_share": sum(r.loop_tokens for r in plain) / max(1, sum(r.new_tokens for r in plain)),
                         "degenerate": sum(r.degenerate for r in plain),
                         "prompts": len(plain)},
                "drafters": acceptance_figures(runs)}
    write_figures(directory, document)
    return document


def write_figures(directory: Path, document: dict[str, Any]) -> None:
    (directory / FIGURES).write_text(json.dumps(document, indent=1) + "\n")
