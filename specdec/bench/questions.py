"""Benchmark questions: Spec-Bench's `question.jsonl` format, or the zoo's held-out code prompts.

Spec-Bench (Xia et al. 2024, "Unlocking Efficiency in Large Language Model Inference: A
Comprehensive Survey of Speculative Decoding") stores one JSON object per line with
`question_id`, `category` and `turns` (a list of user turns). A multi-turn question is answered
turn after turn, each turn's prompt holding the previous turns and answers: as raw text here
(`turn_prompt`), or as user and assistant messages through a chat template (`specdec.data.chat`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from specdec.data.prompts import Prompt

__all__ = ["Question", "from_prompts", "load_questions", "turn_prompt"]


@dataclass(frozen=True)
class Question:
    """One benchmark question: an id, a category and one or more turns; `number`, when given,
    its place in a larger set, which seeds its sampling (a zoo family's evaluation prompt decodes
    with the same seed in the bench as in the family's figures)."""

    id: str
    category: str
    turns: tuple[str, ...]
    number: int | None = None


def load_questions(path: str | Path) -> tuple[Question, ...]:
    """Read a Spec-Bench `question.jsonl`; raises ValueError naming the line and field at fault."""
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"--prompts {str(file)!r} does not exist; pass a Spec-Bench question.jsonl")
    questions: list[Question] = []
    for number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{file}:{number} is not JSON ({error.msg}); each line must be one question") from None
        if not isinstance(record, dict):
            raise ValueError(f"{file}:{number} is not a JSON object")
        turns = record.get("turns")
        if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t for t in turns):
            raise ValueError(f"{file}:{number}: 'turns' must be a non-empty list of non-empty strings, got {turns!r}")
        if "question_id" not in record:
            raise ValueError(f"{file}:{number} has no 'question_id'")
        category = record.get("category", "all")
        questions.append(Question(str(record["question_id"]), str(category), tuple(turns)))
    if not questions:
        raise ValueError(f"{file} holds no questions")
    ids = [q.id for q in questions]
    duplicated = sorted({i for i in ids if ids.count(i) > 1})
    if duplicated:
        raise ValueError(f"{file}: question_id {duplicated[0]!r} appears more than once")
    return tuple(questions)


def from_prompts(prompts: tuple[Prompt, ...], numbers: tuple[int, ...] | None = None) -> tuple[Question, ...]:
    """Single-turn questions from code-completion prompts, their category kept (and their
    `numbers` in a larger set, when given)."""
    places = numbers if numbers is not None else (None,) * len(prompts)
    return tuple(Question(p.id, p.category, (p.text,), n) for p, n in zip(prompts, places))


def turn_prompt(turns: tuple[str, ...], answers: list[str], index: int, separator: str = "\n\n") -> str:
    """The text given to the model for turn `index`: each earlier turn followed by its answer, then
    this turn, joined by `separator`.

    Raw text, for tokenizers without a chat template (the zoo's models are plain language
    models): a continuation prompt ends where the answer starts.
    """
    return separator.join([turns[i] + answers[i] for i in range(index)] + [turns[index]])
