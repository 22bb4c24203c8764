"""The corpus split and the held-out code prompts."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from specdec.data.corpus import HELDOUT_FRACTION, files_corpus, split_by_file, stdlib_corpus
from specdec.data.prompts import CATEGORIES, code_prompts


@pytest.fixture(scope="module")
def corpus():
    return stdlib_corpus()


def test_stdlib_split_is_disjoint_sorted_and_holds_out_at_least_five_percent(corpus):
    train, heldout = set(corpus.train), set(corpus.heldout)
    assert not train & heldout
    assert list(corpus.train) == sorted(corpus.train) and list(corpus.heldout) == sorted(corpus.heldout)
    assert len(heldout) >= 0.05 * (len(train) + len(heldout))
    assert all(path.suffix == ".py" for path in train | heldout)
    skipped = {"test", "tests", "site-packages", "idle_test"}
    assert not any(skipped & set(corpus.relative(p).split("/")[:-1]) for p in train | heldout)


def test_split_is_the_same_on_every_call(corpus):
    again = stdlib_corpus()
    assert (again.train, again.heldout) == (corpus.train, corpus.heldout)


def test_adding_a_file_moves_no_other_file_across_the_split():
    names = [f"pkg/module_{i}.py" for i in range(200)]
    train, heldout = split_by_file(names)
    train2, heldout2 = split_by_file(names + ["pkg/new.py"])
    assert len(heldout) == 13  # ceil(200 / 16)
    moved = (heldout - heldout2) | (heldout2 - heldout - {"pkg/new.py"})
    assert len(moved) <= 1  # the count may grow by one; no other name changes side
    assert train2 | heldout2 == set(names) | {"pkg/new.py"}


@pytest.mark.parametrize("fraction", [0, 1, -0.1, 1.5])
def test_bad_fraction_is_refused(fraction):
    with pytest.raises(ValueError, match="heldout_fraction"):
        split_by_file(["a", "b"], fraction)


def test_files_corpus_reads_directories_and_names_a_missing_path(tmp_path: Path):
    for i in range(20):
        (tmp_path / f"f{i}.txt").write_text(f"text {i}\n")
    (tmp_path / "skip.bin").write_bytes(b"\0\1")
    corpus = files_corpus([tmp_path])
    assert len(corpus.train) + len(corpus.heldout) == 20 and len(corpus.heldout) == 2
    with pytest.raises(FileNotFoundError, match="nowhere"):
        files_corpus([tmp_path / "nowhere"])
    single = files_corpus([tmp_path / "f0.txt"])
    assert single.train == ((tmp_path / "f0.txt").resolve(),) and single.heldout == ()


def test_prompts_come_from_held_out_files_in_every_category(corpus):
    prompts = code_prompts(corpus, per_category=4)
    assert [p.category for p in prompts] == [c for c in CATEGORIES for _ in range(4)]
    heldout = {corpus.relative(p) for p in corpus.heldout}
    assert all(p.source.rsplit(":", 1)[0] in heldout for p in prompts)
    assert len({p.id for p in prompts}) == len(prompts)
    assert code_prompts(corpus, per_category=4) == prompts  # deterministic
    for prompt in prompts:
        assert 60 <= len(prompt.text) <= 700 and not prompt.text[0].isspace()
        first = prompt.text.lstrip("@").split()[0]
        assert first in (("class",) if prompt.category == "class" else ("def", "async")) or prompt.text.startswith("@")


def test_signature_and_class_prompts_end_with_their_docstring(corpus):
    for prompt in code_prompts(corpus, per_category=4, categories=("signature", "class")):
        body = prompt.text + "    pass\n"  # the docstring closes the prompt: adding a body parses
        assert isinstance(ast.parse(body).body[0], (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))


def test_unknown_category_is_refused(corpus):
    with pytest.raises(ValueError, match="'method'"):
        code_prompts(corpus, categories=("method",))


def test_held_out_fraction_constant_is_at_least_five_percent():
    assert HELDOUT_FRACTION >= 0.05
