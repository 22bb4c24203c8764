"""The learned drafters' batched forms (`batch_form`, `specdec.decoding.batch_drafters`): each row's
drafts, step by step, are those it drafts alone (ragged catch-ups after ragged acceptance
included), the head runs once per depth for the whole batch, its cache keeps each row's real
pairs only, and the settings a form does not serve fall back to one instance per row."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import specdec
from specdec import Sampling
from specdec.decoding import batch_drafters
from specdec.drafters.head_batch import BatchHead
from specdec.runtime.batch_target import BatchLM

NEW = 20
TEXTS = ("def parse(self, text):\n    ", "class Stack:\n    def push(self, x):", "import os\n", "x = [")


@pytest.fixture(scope="module")
def zoo_parts(quick_zoo: Path) -> tuple[Any, list[list[int]], dict[str, dict[str, Any]]]:
    from specdec import zoo
    from specdec.checkpoints import load_causal_lm, load_tokenizer

    model = load_causal_lm(quick_zoo / "target")
    tokenizer = load_tokenizer(quick_zoo / "target")
    prompts = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in TEXTS]
    return model, prompts, zoo.drafter_options(quick_zoo)


def _forms(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The batched drafters `generate_batch` makes from now on, in order."""
    forms: list[Any] = []
    made = batch_drafters.batched
    monkeypatch.setattr("specdec.decoding.generate_batch.batched",
                        lambda *args: forms.append(made(*args)) or forms[-1])
    return forms


def _recorded(drafter: Any) -> list[list[int]]:
    """Record every draft `drafter.propose` returns (batch 1)."""
    seen: list[list[int]] = []
    propose = drafter.propose

    def recording(ctx, k):  # type: ignore[no-untyped-def]
        draft = propose(ctx, k)
        seen.append(draft.tokens.tolist())
        return draft

    drafter.propose = recording
    return seen


@pytest.mark.parametrize("name", ["eagle3", "mtp", "eagle", "draft-model"])
@pytest.mark.parametrize("compile", [False, True], ids=["eager", "compiled"])
def test_each_row_drafts_what_it_drafts_alone_in_one_forward_per_depth(zoo_parts, name, compile, monkeypatch):
    model, prompts, options = zoo_parts
    if name not in options:
        pytest.skip(f"the quick zoo has no {name}")
    if compile and name not in ("eagle3", "draft-model"):
        pytest.skip("one compiled case is enough")
    forms: list[Any] = []
    drafts: dict[int, list[list[int]]] = {}
    made = batch_drafters.batched

    def spying(drafter, label, rows):  # type: ignore[no-untyped-def]
        form = made(drafter, label, rows)
        forms.append(form)
        propose = form.propose_batch

        def recording(ctxs, k):  # type: ignore[no-untyped-def]
            out = propose(ctxs, k)
            for row, draft in out.items():
                drafts.setdefault(row, []).append(draft.tokens.tolist())
            return out

        form.propose_batch = recording
        return form

    monkeypatch.setattr("specdec.decoding.generate_batch.batched", spying)
    calls: list[tuple[int, int]] = []
    original = BatchHead.__call__

    def counting(self, stage, embeds, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(tuple(embeds.shape[:2]))
        return original(self, stage, embeds, *args, **kwargs)

    monkeypatch.setattr(BatchHead, "__call__", counting)
    forward = BatchLM.forward

    def counting_lm(self, ids, *args, **kwargs):  # type: ignore[no-untyped-def]
        if self.lm.model is not model:  # the draft model's
            calls.append(tuple(ids.shape[:2]))
        return forward(self, ids, *args, **kwargs)

    monkeypatch.setattr(BatchLM, "forward", counting_lm)
    batch = specdec.generate_batch(model, prompts, drafter=specdec.make_drafter(name, **options[name]),
                                   max_new_tokens=NEW, compile=compile)
    assert forms and forms[0].native, f"{name} should draft the batch natively"
    k = 4
    assert calls and len(calls) <= 1 + batch.totals.steps * k, "one catch-up and k - 1 draft forwards a step for all rows"
    assert all(rows <= len(prompts) for rows, _ in calls)
    for row, prompt in enumerate(prompts):
        drafter = specdec.make_drafter(name, **options[name])
        alone_drafts = _recorded(drafter)
        alone = specdec.generate(model, prompt, drafter=drafter, max_new_tokens=NEW, compile=compile)
        assert batch[row].tokens == alone.tokens, f"{name}: row {row} differs from its batch-1 decoding"
        assert drafts[row] == alone_drafts, f"{name}: row {row}'s drafts differ from its batch-1 drafts"
    assert len({row.stats.accepted for row in batch}) > 1, "the rows should accept ragged numbers of tokens"


def test_the_head_cache_keeps_each_rows_real_pairs_only(zoo_parts, monkeypatch):
    model, prompts, options = zoo_parts
    forms = _forms(monkeypatch)
    checks: list[tuple[int, int]] = []
    original = specdec.drafters.feature_batch.FeatureBatch.propose_batch

    def checking(self, ctxs, k):  # type: ignore[no-untyped-def]
        out = original(self, ctxs, k)
        kept = self.head.columns.kept().tolist()
        for row, ctx in ctxs.items():
            if self.cached[row]:
                assert kept[self.slots[row]] == self.cached[row] == ctx.tokens.shape[0] - 1
                checks.append((row, self.cached[row]))
        return out

    monkeypatch.setattr(specdec.drafters.feature_batch.FeatureBatch, "propose_batch", checking)
    specdec.generate_batch(model, prompts, drafter=specdec.make_drafter("eagle3", **options["eagle3"]),
                           max_new_tokens=NEW)
    assert forms[0].native and len(checks) > len(prompts)


def test_settings_a_form_does_not_serve_run_row_by_row(zoo_parts, monkeypatch):
    model, prompts, options = zoo_parts
    forms = _forms(monkeypatch)
    tree = specdec.make_drafter("eagle3", **options["eagle3"], tree=True)
    sampled = Sampling(temperature=0.8)
    batch = specdec.generate_batch(model, prompts[:2], drafter=tree, max_new_tokens=8, sampling=sampled)
    assert not forms[-1].native and len(batch) == 2, "a tree of sampled siblings drafts row by row"
    penalised = Sampling(temperature=0.0, repetition_penalty=1.3)
    batch = specdec.generate_batch(model, prompts[:2], drafter=specdec.make_drafter("eagle3", **options["eagle3"]),
                                   max_new_tokens=8, sampling=penalised)
    assert not forms[-1].native
    alone = specdec.generate(model, prompts[1], drafter=specdec.make_drafter("eagle3", **options["eagle3"]),
                             max_new_tokens=8, sampling=penalised)
    assert batch[1].tokens == alone.tokens


@pytest.mark.parametrize("name", ["eagle3", "draft-model"])
def test_a_sampled_row_draws_its_batch_1_draft(zoo_parts, name):
    model, prompts, options = zoo_parts
    sampling = Sampling(temperature=0.8)
    batch = specdec.generate_batch(model, prompts, drafter=specdec.make_drafter(name, **options[name]),
                                   max_new_tokens=NEW, sampling=sampling, seed=11)
    for row, prompt in enumerate(prompts):
        alone = specdec.generate(model, prompt, drafter=specdec.make_drafter(name, **options[name]),
                                 max_new_tokens=NEW, sampling=sampling, seed=11 + row)
        assert batch[row].tokens == alone.tokens, f"row {row}: its draws should be its batch-1 draws"


@pytest.mark.parametrize("name", ["eagle3", "mtp", "eagle"])
def test_top_k_trees_draft_every_row_in_one_forward_per_depth(zoo_parts, name, monkeypatch):
    """Eager: a compiled tree expansion runs the head's batched forward, the step the compiled
    chain cases above compile (a new graph per shape costs the suite 35 s)."""
    model, prompts, options = zoo_parts
    if name not in options:
        pytest.skip(f"the quick zoo has no {name}")
    forms = _forms(monkeypatch)
    shapes: list[tuple[int, int]] = []
    original = BatchHead.run

    def counting(self, fn, rows, fixed, *args):  # type: ignore[no-untyped-def]
        shapes.append((self.rows, rows))
        return original(self, fn, rows, fixed, *args)

    monkeypatch.setattr(BatchHead, "run", counting)
    settings = {**options[name], "tree": True, "top_k": 3, "total_tokens": 10}
    batch = specdec.generate_batch(model, prompts, drafter=specdec.make_drafter(name, **settings),
                                   max_new_tokens=NEW)
    assert forms[0].native, f"{name}'s top-k tree should draft the batch natively"
    depth = 4  # the loop's k
    assert shapes and len(shapes) <= 1 + batch.totals.steps * depth, "a catch-up and k - 1 expansions a step"
    assert any(rows == 3 for _, rows in shapes), "an expansion runs top_k rows for every batch row at once"
    assert max(batch_rows for batch_rows, _ in shapes) == len(prompts)
    for row, prompt in enumerate(prompts):
        alone = specdec.generate(model, prompt, drafter=specdec.make_drafter(name, **settings), max_new_tokens=NEW)
        assert batch[row].tokens == alone.tokens, f"{name}: row {row} differs from its batch-1 decoding"
        # the same trees: the same nodes accepted (a row's last, budget-cut tree keeps the nodes within its depth)
        assert batch[row].stats.accepted == alone.stats.accepted, f"{name}: row {row} accepts other nodes"
    assert batch.totals.accepted > 0
