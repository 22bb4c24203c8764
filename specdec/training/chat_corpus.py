"""A chat corpus a target writes itself, for training its drafters offline.

A drafter learns the target's distributions over whatever text it is shown, so the text should be
what the drafter will see at decode time: the target's own answers, through its chat template
(Cai et al. 2024, "Medusa", §3.2.1, self-distillation; EAGLE's recipes regenerate chat datasets'
answers with the target for the same reason, though Li et al. 2024 found EAGLE-1 tolerant of a
fixed ShareGPT set). Without a hub, the
requests are made here: the summary line of each standard-library module (its docstring's first
line) put into instruction templates that span the kinds of request a chat benchmark asks
(writing, explaining, role play, reasoning, code, summarising a passage, arithmetic), and the
target answers each one greedily, many rows per forward (`specdec.decoding.generate_batch`).

The corpus is a folder of text files, each several whole conversations (request and answer,
special tokens included), ready for `specdec train --data`.
"""

from __future__ import annotations

import ast
import random
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specdec.data.chat import chat_ids
from specdec.data.corpus import read_text, stdlib_corpus

__all__ = ["Subject", "TEMPLATES", "chat_requests", "stdlib_subjects", "write_chat_corpus"]

# {name}: a module's name; {summary}: its docstring's first line; {passage}: its docstring's first
# paragraph; {a}, {b}: small numbers.
TEMPLATES = (
    "Write a short blog post about Python's {name} module ({summary}).",
    "Explain to a beginner what Python's {name} module is for: {summary}. Give one example.",
    "Imagine you are a patient teacher. Describe the {name} module ({summary}) to your class.",
    "Draft a brief, friendly email to a colleague recommending the {name} module for a project.",
    "What are three advantages and one drawback of using Python's {name} module?",
    "Write a small Python function that uses the {name} module, then explain how it works.",
    "Summarise the following passage in two sentences:\n\n{passage}",
    "Extract the key terms from this text and list them with one line each:\n\n{passage}",
    "A script calls a function from the {name} module {a} times a minute. How many calls does it make in "
    "{b} hours? Reason step by step.",
    "Give a step-by-step plan for learning the {name} module in a week.",
)


@dataclass(frozen=True)
class Subject:
    """One standard-library module: its dotted name, its docstring's first line and first paragraph."""

    name: str
    summary: str
    passage: str


def _module_name(relative: Path) -> str:
    parts = list(relative.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def stdlib_subjects(root: Path | None = None) -> list[Subject]:
    """The public standard-library modules whose source has a docstring, by name (the modules of
    `specdec.data.corpus.stdlib_corpus`, every file, held-out ones included: these are requests,
    not training text)."""
    corpus = stdlib_corpus(root)
    subjects = []
    for path in sorted({*corpus.train, *corpus.heldout}):
        name = _module_name(path.relative_to(corpus.root))
        if not name or any(part.startswith("_") for part in name.split(".")):
            continue
        try:
            doc = ast.get_docstring(ast.parse(read_text(path)))
        except (SyntaxError, ValueError):
            continue
        paragraph = " ".join((doc or "").strip().split("\n\n")[0].split())
        summary = paragraph.split(". ")[0].rstrip(".")
        if len(summary) >= 8:  # a line that says something
            subjects.append(Subject(name, summary, paragraph[:1200]))
    return subjects


def chat_requests(subjects: Sequence[Subject], count: int, seed: int = 0) -> list[str]:
    """`count` user requests: subjects in a seeded shuffle (cycled), each with the next template in turn."""
    if count < 1 or not subjects:
        raise ValueError(f"a chat corpus needs at least one request and one subject, got count={count} and "
                         f"{len(subjects)} subjects")
    rng = random.Random(seed)
    order = list(subjects)
    rng.shuffle(order)
    requests = []
    for i in range(count):
        subject = order[i % len(order)]
        template = TEMPLATES[(i + i // len(order)) % len(TEMPLATES)]  # a subject's next visit takes another one
        requests.append(template.format(name=subject.name, summary=subject.summary, passage=subject.passage,
                                        a=rng.randint(2, 60), b=rng.randint(2, 12)))
    return requests


def write_chat_corpus(target: Any, tokenizer: Any, requests: Sequence[str], out: Path, max_new_tokens: int = 160,
                      batch: int = 16, per_file: int = 8, compile: bool = False,
                      log: Callable[[str], None] = print) -> list[Path]:
    """The target's greedy answer to each request, written as whole conversations (template text,
    special tokens included) into `out`, `per_file` to a file; `out` appears only when complete.

    Raises FileExistsError when `out` exists.
    """
    from specdec.decoding.generate import generate_batch

    if out.exists():
        raise FileExistsError(f"{out} exists; remove it or choose another folder for the chat corpus")
    if batch < 1 or per_file < 1:
        raise ValueError(f"batch and per_file must be >= 1, got {batch} and {per_file}")
    prompts = [chat_ids(tokenizer, [{"role": "user", "content": request}]) for request in requests]
    eos = tokenizer.eos_token_id
    texts: list[str] = []
    for start in range(0, len(prompts), batch):
        rows = prompts[start : start + batch]
        answers = generate_batch(target, rows, max_new_tokens=max_new_tokens, eos_token_id=eos, compile=compile)
        texts += [tokenizer.decode(list(prompt) + list(answer.tokens), skip_special_tokens=False)
                  for prompt, answer in zip(rows, answers)]
        log(f"chat corpus: {len(texts)}/{len(prompts)} answers, {answers.totals.wall_seconds:.0f} s for the last "
            f"{len(rows)}")
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.partial-"))
    try:
        files = []
        for number, first in enumerate(range(0, len(texts), per_file)):
            file = staging / f"chat-{number:04d}.txt"
            file.write_text("\n".join(texts[first : first + per_file]) + "\n")
            files.append(out / file.name)
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return files
