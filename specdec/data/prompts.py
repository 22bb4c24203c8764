"""Code-completion prompts cut from held-out Python files, in three categories:

- `signature`: a function's signature and docstring; the body is left to write;
- `class`: a class header and its docstring; the methods are left to write;
- `block`: a function cut halfway through its body, at a line end.

Prompts are dedented, taken in file order with at most one per file and category before any
file gives a second, so a handful of prompts already spans many modules. The same files give
the same prompts on every run.
"""

from __future__ import annotations

import ast
import textwrap
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from specdec.data.corpus import Corpus, read_text

__all__ = ["CATEGORIES", "Prompt", "code_prompts", "first_per_category"]

CATEGORIES = ("signature", "class", "block")


@dataclass(frozen=True)
class Prompt:
    """One prompt: an id, its category, the text, and where it was cut from (`file:line`)."""

    id: str
    category: str
    text: str
    source: str


def _docstring_end(node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> int | None:
    """The last line of the node's docstring, or None when it has none."""
    if node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant) \
            and isinstance(node.body[0].value.value, str):
        return node.body[0].end_lineno
    return None


def _cut(lines: list[str], first: int, last: int) -> str:
    """Lines first..last (1-based, inclusive), dedented, ending with a newline."""
    return textwrap.dedent("".join(lines[first - 1 : last]))


def _candidates(tree: ast.Module, lines: list[str]) -> Iterator[tuple[str, int, str]]:
    """(category, line, text) for every prompt the module offers, in source order."""
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        first = min([node.lineno] + [d.lineno for d in node.decorator_list])
        doc_end = _docstring_end(node)
        if isinstance(node, ast.ClassDef):
            if doc_end is not None:
                yield "class", first, _cut(lines, first, doc_end)
            continue
        if doc_end is not None and len(node.body) > 1:
            yield "signature", first, _cut(lines, first, doc_end)
        body_start = node.body[1].lineno if doc_end is not None and len(node.body) > 1 else node.body[0].lineno
        end = node.end_lineno or body_start
        if end - body_start >= 5:  # a body long enough to stop halfway
            yield "block", first, _cut(lines, first, body_start + (end - body_start) // 2)


def code_prompts(corpus: Corpus, per_category: int = 8, min_chars: int = 60, max_chars: int = 700,
                 categories: Iterable[str] = CATEGORIES) -> tuple[Prompt, ...]:
    """Up to `per_category` prompts of each category from the corpus's held-out files.

    Prompts are between `min_chars` and `max_chars` long. Files that do not parse, or are not
    UTF-8, are skipped.
    """
    wanted = tuple(categories)
    unknown = [c for c in wanted if c not in CATEGORIES]
    if unknown:
        raise ValueError(f"unknown prompt categories {unknown}; choose from {list(CATEGORIES)}")
    per_file: list[tuple[str, dict[str, list[tuple[int, str]]]]] = []
    for path in corpus.heldout:
        found = _file_candidates(path, min_chars, max_chars)
        if found:
            per_file.append((corpus.relative(path), found))
    prompts: list[Prompt] = []
    for category in wanted:
        chosen: list[Prompt] = []
        depth = 0
        while len(chosen) < per_category and any(len(found.get(category, [])) > depth for _, found in per_file):
            for name, found in per_file:
                options = found.get(category, [])
                if depth < len(options) and len(chosen) < per_category:
                    line, text = options[depth]
                    chosen.append(Prompt(f"{category}-{len(chosen)}", category, text, f"{name}:{line}"))
            depth += 1
        prompts.extend(chosen)
    return tuple(prompts)


def _file_candidates(path: Path, min_chars: int, max_chars: int) -> dict[str, list[tuple[int, str]]]:
    source = read_text(path)
    if source is None:
        return {}
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return {}
    lines = source.splitlines(keepends=True)
    found: dict[str, list[tuple[int, str]]] = {}
    for category, line, text in _candidates(tree, lines):
        if min_chars <= len(text) <= max_chars and text.isascii():
            found.setdefault(category, []).append((line, text))
    for options in found.values():
        options.sort()
    return found


def first_per_category(prompts: Iterable[Prompt], count: int) -> tuple[Prompt, ...]:
    """The first `count` prompts of each category, in their order."""
    seen: dict[str, int] = {}
    chosen = []
    for prompt in prompts:
        seen[prompt.category] = seen.get(prompt.category, 0) + 1
        if seen[prompt.category] <= count:
            chosen.append(prompt)
    return tuple(chosen)
