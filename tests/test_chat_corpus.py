"""Training drafters for a real target offline: the chat corpus the target writes itself
(`specdec.training.chat_corpus`), the draft model's embeddings started from the target's
(`specdec.training.draft_model.projected_embeddings`), and `specdec train-real`'s stages and
record (`specdec.bench.real_training`) on a tiny stand-in for SmolLM2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import specdec
from specdec.checkpoints import load_causal_lm
from specdec.bench import real_training
from specdec.data.chat import chat_ids
from specdec.training import chat_corpus
from specdec.training.chat_corpus import Subject, chat_requests, stdlib_subjects, write_chat_corpus
from specdec.training.draft_model import DraftModelStudent, DraftSize, projected_embeddings
from specdec.training.optim import Steps
from specdec.training.run import TrainSettings
from test_chat import word_tokenizer
from tiny import tiny_model

SUBJECTS = [Subject("heapq", "Heap queue algorithm", "Heap queue algorithm. It keeps a list as a heap."),
            Subject("json", "JSON encoder and decoder", "JSON encoder and decoder.")]


def test_subjects_are_public_modules_with_a_docstring_named_by_their_dotted_path(tmp_path: Path) -> None:
    (tmp_path / "heapq.py").write_text('"""Heap queue algorithm. It keeps a list as a heap.\n\nMore."""\n')
    (tmp_path / "_private.py").write_text('"""A private helper module."""\n')
    (tmp_path / "bare.py").write_text("x = 1\n")
    (tmp_path / "broken.py").write_text('"""Not Python at all.\ndef (\n')
    (tmp_path / "xml" / "dom").mkdir(parents=True)
    (tmp_path / "xml" / "dom" / "__init__.py").write_text('"""W3C Document Object Model implementation."""\n')
    (tmp_path / "test").mkdir()
    (tmp_path / "test" / "test_heapq.py").write_text('"""Tests for the heap queue module."""\n')
    subjects = stdlib_subjects(tmp_path)
    assert subjects == [Subject("heapq", "Heap queue algorithm", "Heap queue algorithm. It keeps a list as a heap."),
                        Subject("xml.dom", "W3C Document Object Model implementation",
                                "W3C Document Object Model implementation.")]


def test_the_standard_library_gives_hundreds_of_subjects() -> None:
    names = {subject.name for subject in stdlib_subjects()}
    assert {"heapq", "json", "os"} <= names and len(names) > 200


def test_requests_are_seeded_and_every_visit_of_a_subject_takes_another_template() -> None:
    requests = chat_requests(SUBJECTS, 12, seed=4)
    assert requests == chat_requests(SUBJECTS, 12, seed=4) and requests != chat_requests(SUBJECTS, 12, seed=5)
    assert len(requests) == 12 and len(set(requests)) == 12
    heapq = [r for r in requests if "heapq" in r or "It keeps a list as a heap" in r]
    assert len(heapq) == 6  # two subjects, cycled
    with pytest.raises(ValueError, match="at least one request"):
        chat_requests(SUBJECTS, 0)
    with pytest.raises(ValueError, match="0 subjects"):
        chat_requests([], 3)


@pytest.fixture(scope="module")
def chat_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama with a word-level chat tokenizer, saved as a checkpoint directory."""
    folder = tmp_path_factory.mktemp("chat-target")
    tiny_model("llama", vocab_size=len(word_tokenizer()), seed=2).save_pretrained(folder)
    word_tokenizer().save_pretrained(folder)
    return folder


def test_the_corpus_is_each_requests_conversation_with_the_targets_own_greedy_answer(chat_target: Path,
                                                                                  tmp_path: Path) -> None:
    model, tokenizer = load_causal_lm(chat_target), word_tokenizer()
    requests = ["the cat sat on a mat", "what did the dog do", "when had rain stopped", "the dog ran"]
    files = write_chat_corpus(model, tokenizer, requests, tmp_path / "corpus", max_new_tokens=6, batch=3,
                              per_file=3, log=lambda line: None)
    assert [f.name for f in files] == ["chat-0000.txt", "chat-0001.txt"] and all(f.is_file() for f in files)
    written = "".join(f.read_text() for f in files).splitlines()
    for request, line in zip(requests, written, strict=True):
        prompt = chat_ids(tokenizer, [{"role": "user", "content": request}])
        answer = specdec.generate(model, prompt, max_new_tokens=6, eos_token_id=tokenizer.eos_token_id).tokens
        assert line == tokenizer.decode(prompt + answer, skip_special_tokens=False)
    with pytest.raises(FileExistsError, match="corpus"):
        write_chat_corpus(model, tokenizer, requests, tmp_path / "corpus")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus"]


def test_projected_embeddings_keep_the_best_low_rank_geometry_of_the_rows() -> None:
    weight = torch.randn(200, 24, generator=torch.Generator().manual_seed(0)) * torch.linspace(3, 0.1, 24)
    assert torch.equal(projected_embeddings(weight, 24), weight)
    projected = projected_embeddings(weight, 6).double()
    u, s, _ = torch.linalg.svd(weight.double(), full_matrices=False)
    best = (u[:, :6] * s[:6] ** 2) @ u[:, :6].T  # the best rank-6 approximation of weight @ weight.T
    assert projected.shape == (200, 6)
    assert torch.allclose(projected @ projected.T, best, atol=1e-4)
    assert projected[:, 0].norm() >= projected[:, 5].norm()  # largest direction first
    with pytest.raises(ValueError, match="30 wide cannot start from embeddings 24 wide"):
        projected_embeddings(weight, 30)


def test_a_draft_model_from_the_target_ties_the_projected_rows_and_one_at_random_does_not(chat_target: Path) -> None:
    target = load_causal_lm(chat_target)
    source = target.get_input_embeddings().weight
    for from_target in (True, False):
        model = DraftModelStudent.create(DraftSize(8, 1, 2, 1), target, seed=0, from_target=from_target).module
        embeddings = model.get_input_embeddings().weight
        assert embeddings.data_ptr() == model.get_output_embeddings().weight.data_ptr()
        assert torch.allclose(embeddings, projected_embeddings(source, 8).to(embeddings.dtype)) == from_target


def test_train_real_writes_the_corpus_once_trains_each_kind_once_and_records_every_stage(
        chat_target: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    steps = Steps(steps=2, batch=2, seq_len=16, lr=1e-3)
    budgets = {"eagle3": TrainSettings(steps, draft_vocab=20, eval_prompts=1, eval_new_tokens=4),
               "medusa": TrainSettings(steps, medusa_heads=2, eval_prompts=1, eval_new_tokens=4),
               "draft-model": TrainSettings(steps, draft=DraftSize(8, 1, 2, 1), eval_prompts=1, eval_new_tokens=4)}
    monkeypatch.setattr(real_training, "prepared_target", lambda cache, log: chat_target)
    monkeypatch.setattr(real_training, "_budgets", lambda: budgets)
    monkeypatch.setattr(real_training, "CORPUS", real_training.CorpusBudget(requests=40, max_new_tokens=8, batch=8))
    monkeypatch.setattr(chat_corpus, "stdlib_subjects", lambda: SUBJECTS)
    out, cache, lines = tmp_path / "trained", tmp_path / "cache", []
    with pytest.raises(ValueError, match="no training budget for 'eagle'"):
        real_training.train_for_real(out, ["eagle"], cache, lines.append)
    first = real_training.train_for_real(out, ["draft-model"], cache, lines.append, show_progress=False)
    assert set(first["stages"]) == {"corpus", "draft-model"}
    corpus = Path(first["corpus"])
    assert corpus.parent == cache and len(list(corpus.glob("chat-*.txt"))) == 5
    stage = first["stages"]["draft-model"]
    assert stage["settings"]["draft"]["hidden"] == 8 and 1.0 <= stage["mean_accepted_length"] <= 5.0
    written = (out / "draft-model" / "config.json").stat().st_mtime_ns
    second = real_training.train_for_real(out, ["draft-model", "medusa"], cache, lines.append, show_progress=False)
    assert (out / "draft-model" / "config.json").stat().st_mtime_ns == written
    assert second["stages"]["corpus"] == first["stages"]["corpus"] and second["stages"]["draft-model"] == stage
    assert set(second["stages"]) == {"corpus", "draft-model", "medusa"}
    assert json.loads((out / real_training.RECORD).read_text()) == second
    assert any("kept" in line for line in lines)
