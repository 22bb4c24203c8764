"""The learned drafters' batched forms (`specdec.drafters.shared.forms`): each row's
drafts, step by step, are those it drafts alone (ragged catch-ups after ragged acceptance
included), the head runs once per depth for the whole batch, its cache keeps each row's real
pairs only, and the settings a form does not serve fall back to one instance per row."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import specdec
from specdec import Sampling
from specdec.drafters.feature_heads.head_batch import BatchHead
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


def _native(drafter: Any) -> bool:
    """Whether the drafter's last generation drafted its rows in its batched form."""
    return drafter._forms.batch is not None


def _recorded(drafter: Any) -> dict[int, list[list[int]]]:
    """Record every draft `drafter.propose` returns, by row."""
    seen: dict[int, list[list[int]]] = {}
    propose = drafter.propose

    def recording(rows, k):  # type: ignore[no-untyped-def]
        drafts = propose(rows, k)
        for row, draft in drafts.items():
            seen.setdefault(row, []).append(draft.tokens.tolist())
        return drafts

    drafter.propose = recording
    return seen


CASES = [*((name, False) for name in ("eagle3", "mtp", "eagle", "draft-model")),
         ("eagle3", True), ("draft-model", True)]


@pytest.mark.parametrize(("name", "compile"), CASES, ids=[f"{'compiled' if c else 'eager'}-{n}" for n, c in CASES])
def test_each_row_drafts_what_it_drafts_alone_in_one_forward_per_depth(zoo_parts, name, compile, monkeypatch):
    model, prompts, options = zoo_parts
    if name not in options:
        pytest.skip(f"the quick zoo has no {name}")
    batched = specdec.make_drafter(name, **options[name])
    drafts = _recorded(batched)
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
    batch = specdec.generate_batch(model, prompts, drafter=batched, max_new_tokens=NEW, compile=compile)
    assert _native(batched), f"{name} should draft the batch natively"
    k = 4
    assert calls and len(calls) <= 1 + batch.totals.steps * k, "one catch-up and k - 1 draft forwards a step for all rows"
    assert all(rows <= len(prompts) for rows, _ in calls)
    for row, prompt in enumerate(prompts):
        drafter = specdec.make_drafter(name, **options[name])
        alone_drafts = _recorded(drafter)
        alone = specdec.generate(model, prompt, drafter=drafter, max_new_tokens=NEW, compile=compile)
        assert batch[row].tokens == alone.tokens, f"{name}: row {row} differs from its batch-1 decoding"
        assert drafts[row] == alone_drafts[0], f"{name}: row {row}'s drafts differ from its batch-1 drafts"
    assert len({row.stats.accepted for row in batch}) > 1, "the rows should accept ragged numbers of tokens"


def test_the_head_cache_keeps_each_rows_real_pairs_only(zoo_parts, monkeypatch):
    model, prompts, options = zoo_parts
    checks: list[tuple[int, int]] = []
    original = specdec.drafters.feature_heads.feature_batch.FeatureBatch.propose

    def checking(self, ctxs, k):  # type: ignore[no-untyped-def]
        out = original(self, ctxs, k)
        kept = self.head.columns.kept().tolist()
        for row, ctx in ctxs.items():
            if self.cached[row]:
                assert kept[self.slots[row]] == self.cached[row] == ctx.tokens.shape[0] - 1
                checks.append((row, self.cached[row]))
        return out

    monkeypatch.setattr(specdec.drafters.feature_heads.feature_batch.FeatureBatch, "propose", checking)
    drafter = specdec.make_drafter("eagle3", **options["eagle3"])
    specdec.generate_batch(model, prompts, drafter=drafter, max_new_tokens=NEW)
    assert _native(drafter) and len(checks) > len(prompts)


def test_settings_a_form_does_not_serve_run_row_by_row(zoo_parts):
    model, prompts, options = zoo_parts
    penalised = Sampling(temperature=0.0, repetition_penalty=1.3)  # reads each row's prefix
    chain = specdec.make_drafter("draft-model", **options["draft-model"])
    batch = specdec.generate_batch(model, prompts[:2], drafter=chain, max_new_tokens=8, sampling=penalised)
    assert not _native(chain), "a draft model's batched form drafts no prefix-reading setting"
    alone = specdec.generate(model, prompts[1], drafter=specdec.make_drafter("draft-model", **options["draft-model"]),
                             max_new_tokens=8, sampling=penalised)
    assert batch[1].tokens == alone.tokens


@pytest.mark.parametrize("tree, sampling", [(True, Sampling(temperature=0.8)),
                                            (False, Sampling(temperature=0.0, repetition_penalty=1.3))],
                         ids=["sampled-tree", "penalised-chain"])
def test_feature_heads_draft_every_setting_in_their_batched_form(zoo_parts, tree, sampling):
    model, prompts, options = zoo_parts
    drafter = specdec.make_drafter("eagle3", **options["eagle3"], tree=tree)
    batch = specdec.generate_batch(model, prompts[:2], drafter=drafter, max_new_tokens=8, sampling=sampling, seed=3)
    assert _native(drafter)
    for row, prompt in enumerate(prompts[:2]):
        alone = specdec.generate(model, prompt, drafter=specdec.make_drafter("eagle3", **options["eagle3"], tree=tree),
                                 max_new_tokens=8, sampling=sampling, seed=3 + row)
        assert batch[row].tokens == alone.tokens, f"row {row}: its tokens should be its batch-1 tokens"


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
    shapes: list[tuple[int, int]] = []
    original = BatchHead.run

    def counting(self, fn, rows, fixed, *args):  # type: ignore[no-untyped-def]
        shapes.append((self.rows, rows))
        return original(self, fn, rows, fixed, *args)

    monkeypatch.setattr(BatchHead, "run", counting)
    settings = {**options[name], "tree": True, "top_k": 3, "total_tokens": 10}
    drafter = specdec.make_drafter(name, **settings)
    batch = specdec.generate_batch(model, prompts, drafter=drafter, max_new_tokens=NEW)
    assert _native(drafter), f"{name}'s top-k tree should draft the batch natively"
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
