"""Batches (`specdec.generate_batch`): every row equals its own batch-1 decoding at temperature 0
(float32, four architectures, ragged prompts, an EOS ending rows early, every drafter, chains
and trees), rows follow plain sampling above it (chi-square per row), broken drafts name their
row, drafters batch natively or through one instance per row, the cache's holes are compacted
exactly, finished rows leave the batch, and compiled batches keep a few shapes."""

from __future__ import annotations

import functools
import importlib
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from drafters_for_tests import GarbageDrafter, RandomQDrafter
from specdec.drafters.feature_heads.eagle import save_eagle
from specdec.verifier import DraftError
from test_eagle import random_head
from test_lossless_statistical import ALPHA, MODEL, PLAIN, TRUNCATED, chi_square_p_value, exact_distribution
from test_lossless_statistical import VOCAB as SMALL_VOCAB
from test_medusa import checkpoint, random_heads
from tiny import ARCHITECTURES, tiny_model
from transformers import PreTrainedModel

import specdec
from specdec import Capability, Draft, DraftContext, Sampling
from specdec.data.datastore_build import build_datastore_from_ids
from specdec.runtime.batch_cache import BatchCache
from specdec.runtime.batch_target import BatchLM
from specdec.runtime.engine import compile_failures

VOCAB = 64
NEW = 24
PROMPTS = [[5, 9, 14, 22, 5, 9, 14, 22, 5, 9, 14], [7], [3, 8, 3, 8, 3], [11, 40, 2, 11, 40, 2, 11, 40]]


@functools.lru_cache(maxsize=None)
def _target(arch: str) -> PreTrainedModel:
    return tiny_model(arch, vocab_size=VOCAB, seed=0, dtype=torch.float32)


@functools.lru_cache(maxsize=None)
def _other(arch: str) -> PreTrainedModel:
    other = ARCHITECTURES[(ARCHITECTURES.index(arch) + 1) % len(ARCHITECTURES)]
    return tiny_model(other, vocab_size=VOCAB, seed=1, layers=1, dtype=torch.float32)


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("batch")
    documents = [np.array((prompt * 4)[:40]) for prompt in PROMPTS] + [np.random.default_rng(0).integers(0, VOCAB, 300)]
    return {"eagle": save_eagle(random_head(seed=1), root / "eagle"),
            "medusa": checkpoint(root / "medusa", random_heads(seed=0)),
            "datastore": build_datastore_from_ids(documents, root / "datastore", vocab_size=VOCAB)}


DRAFTERS: dict[str, Callable[[str, dict[str, Path]], object]] = {
    "plain": lambda arch, f: None,
    "ngram": lambda arch, f: specdec.make_drafter("ngram", max_ngram=3),
    "ngram+tree": lambda arch, f: specdec.make_drafter("ngram", max_ngram=3, branches=3),
    "suffix": lambda arch, f: specdec.make_drafter("suffix"),
    "suffix+tree": lambda arch, f: specdec.make_drafter("suffix", tree=True),
    "lookahead": lambda arch, f: specdec.make_drafter("lookahead"),
    "retrieval+tree": lambda arch, f: specdec.make_drafter("retrieval", datastore=str(f["datastore"]), tree=True),
    "draft-model": lambda arch, f: specdec.make_drafter("draft-model", model=_other(arch)),
    "draft-model+tree": lambda arch, f: specdec.make_drafter("draft-model", model=_other(arch), tree=True),
    "medusa": lambda arch, f: specdec.make_drafter("medusa", path=str(f["medusa"])),
    "medusa+tree": lambda arch, f: specdec.make_drafter("medusa", path=str(f["medusa"]), tree=True),
    "eagle": lambda arch, f: specdec.make_drafter("eagle", path=str(f["eagle"])),
    "eagle+tree": lambda arch, f: specdec.make_drafter("eagle", path=str(f["eagle"]), tree=True),
    "garbage": lambda arch, f: GarbageDrafter(seed=0),
    "random-q": lambda arch, f: RandomQDrafter(seed=0),
}


def _eos(arch: str) -> int:
    """A token row 0 emits early in plain greedy decoding, so that row ends first."""
    plain = specdec.generate(_target(arch), PROMPTS[0], max_new_tokens=NEW).tokens
    return plain[4]


def _alone(model: PreTrainedModel, make: Callable[[], object], eos: int | None, **options) -> list[list[int]]:
    return [specdec.generate(model, prompt, drafter=make(), max_new_tokens=NEW, eos_token_id=eos, **options).tokens
            for prompt in PROMPTS]


@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("label", list(DRAFTERS))
def test_every_row_equals_its_own_batch_1_decoding(arch, label, files):
    model, eos = _target(arch), _eos(arch)
    make = functools.partial(DRAFTERS[label], arch, files)
    batch = specdec.generate_batch(model, PROMPTS, drafter=make(), max_new_tokens=NEW, eos_token_id=eos)
    alone = _alone(model, make, eos)
    assert [row.tokens for row in batch] == alone, f"{arch} {label}"
    assert batch[0].tokens[-1] == eos and len(batch[0].tokens) < NEW, "row 0 should end early at its EOS"
    totals = batch.totals
    assert totals.new_tokens == sum(len(row.tokens) for row in batch)
    assert totals.steps == max(row.stats.steps for row in batch)
    for row in batch:
        assert row.stats.new_tokens == len(row.tokens)
        assert row.stats.accepted <= row.stats.drafted


def test_every_zoo_drafter_batches_chains_and_trees_as_it_decodes_alone(quick_zoo):
    from specdec import plugins, zoo
    from specdec.checkpoints import load_causal_lm, load_tokenizer

    model = load_causal_lm(quick_zoo / "target")
    tokenizer = load_tokenizer(quick_zoo / "target")
    prompts = [tokenizer(text, add_special_tokens=False)["input_ids"]
               for text in ("def parse(self, text):\n    ", "class Stack:\n    def push(self, x):")]
    plain = specdec.generate(model, prompts[0], max_new_tokens=24).tokens
    eos = next(t for t in plain[3:] if t != plain[0])
    for name, options in zoo.drafter_options(quick_zoo).items():
        tree = getattr(plugins.drafter_class(name), "tree_options", None) or {}
        for label, settings in ((name, options), (f"{name}+tree", {**options, **tree})):
            batch = specdec.generate_batch(model, prompts, drafter=specdec.make_drafter(name, **settings),
                                           max_new_tokens=24, eos_token_id=eos)
            for prompt, row in zip(prompts, batch):
                alone = specdec.generate(model, prompt, drafter=specdec.make_drafter(name, **settings),
                                         max_new_tokens=24, eos_token_id=eos)
                assert row.tokens == alone.tokens, f"{label}: a row differs from its batch-1 decoding"


# --- exact above temperature 0 ------------------------------------------------------------

SHORT = [[1, 2, 3, 1, 2, 3, 1, 2], [4, 0]]  # ragged: two prompts in every batch
COPIES = 300  # rows per prompt and batch
BATCHES = 2


@pytest.fixture(scope="module")
def small() -> tuple[PreTrainedModel, PreTrainedModel]:
    return tiny_model(seed=0, **MODEL), tiny_model(seed=1, **MODEL)


SAMPLED: dict[str, Callable[[PreTrainedModel], object]] = {
    "plain": lambda other: None,
    "ngram": lambda other: specdec.make_drafter("ngram", max_ngram=3),
    "draft-model": lambda other: specdec.make_drafter("draft-model", model=other),
    "draft-model+tree": lambda other: specdec.make_drafter("draft-model", model=other, tree=True, top_k=2,
                                                           total_tokens=4),
    "random-q": lambda other: RandomQDrafter(seed=3),
}


@pytest.mark.parametrize(("label", "sampling"), [
    *((label, TRUNCATED) for label in SAMPLED), ("plain", PLAIN), ("random-q", PLAIN),
], ids=lambda value: value if isinstance(value, str) else "t1" if value == PLAIN else "t0.7-k4-p0.9")
def test_each_row_of_a_sampled_batch_follows_plain_sampling(small, label, sampling):
    target, other = small
    counts = [Counter(), Counter()]
    for batch in range(BATCHES):
        prompts = [SHORT[i % 2] for i in range(2 * COPIES)]
        out = specdec.generate_batch(target, prompts, drafter=SAMPLED[label](other), num_draft_tokens=3,
                                     max_new_tokens=3, sampling=sampling, seed=batch * len(prompts))
        for i, row in enumerate(out):
            counts[i % 2][tuple(row.tokens)] += 1
    for prompt, seen in zip(SHORT, counts):
        observed = np.zeros(SMALL_VOCAB**3, dtype=np.int64)
        for (x1, x2, x3), count in seen.items():
            observed[(x1 * SMALL_VOCAB + x2) * SMALL_VOCAB + x3] = count
        p_value = chi_square_p_value(observed, exact_distribution(target, prompt, sampling))
        assert p_value >= ALPHA, f"{label}, prompt {prompt}: rows deviate from plain sampling, p = {p_value:.3g}"


def test_one_seed_gives_one_batch_and_rows_draw_apart():
    model = _target("llama")
    sampling = Sampling(temperature=1.0)
    first = specdec.generate_batch(model, [PROMPTS[1]] * 4, max_new_tokens=8, sampling=sampling, seed=5)
    again = specdec.generate_batch(model, [PROMPTS[1]] * 4, max_new_tokens=8, sampling=sampling, seed=5)
    assert [row.tokens for row in first] == [row.tokens for row in again]
    assert len({tuple(row.tokens) for row in first}) > 1, "rows of one prompt should draw different samples"


# --- drafters in batches --------------------------------------------------------------------

class BrokenForOneRow:
    """Drafts one in-vocabulary token, except for the row whose prompt starts with 3: an id outside."""

    name = "broken-row"

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        bad = int(ctx.tokens[0]) == 3
        return Draft(torch.tensor([VOCAB + 5 if bad else 1], device=ctx.tokens.device))


def test_a_broken_draft_names_its_row_and_the_drafter():
    with pytest.raises(DraftError, match=r"'broken-row'.*outside the vocabulary.*row 2 of the batch"):
        specdec.generate_batch(_target("llama"), PROMPTS, drafter=BrokenForOneRow(), max_new_tokens=4)


class RaisesForOneRow(BrokenForOneRow):
    name = "raises-row"

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        if int(ctx.tokens[0]) == 3:
            raise RuntimeError("no draft today")
        return super().propose(ctx, k)


def test_a_drafter_that_raises_names_the_method_and_the_row():
    with pytest.raises(DraftError, match=r"'raises-row' raised in propose for row 2: RuntimeError: no draft today"):
        specdec.generate_batch(_target("llama"), PROMPTS, drafter=RaisesForOneRow(), max_new_tokens=4)


class Uncopyable(BrokenForOneRow):
    name = "uncopyable"

    def __deepcopy__(self, memo):  # type: ignore[no-untyped-def]
        raise TypeError("holds an open socket")


def test_a_drafter_that_can_be_neither_forked_nor_copied_says_so_by_name():
    with pytest.raises(DraftError, match=r"drafter 'uncopyable' cannot decode a batch: .*holds an open socket.*fork\(\)"):
        specdec.generate_batch(_target("llama"), PROMPTS, drafter=Uncopyable(), max_new_tokens=4)
    one = specdec.generate_batch(_target("llama"), PROMPTS[:1], drafter=Uncopyable(), max_new_tokens=4)
    assert len(one) == 1, "one row needs no copy"


class NativeBatchNgram:
    """The rows protocol: one call drafts every live row (prompt lookup of the last two ids)."""

    name = "native-batch"
    capabilities = frozenset({Capability.STATE})

    def __init__(self) -> None:
        self.calls: list[list[int]] = []
        self.commits: list[dict[int, int]] = []

    def prefill(self, ctxs: dict[int, DraftContext]) -> None:
        self.commits = []

    def propose(self, ctxs: dict[int, DraftContext], k: dict[int, int]) -> dict[int, Draft]:
        self.calls.append(sorted(ctxs))
        drafts = {}
        for row, ctx in ctxs.items():
            ids = ctx.tokens.tolist()
            found: list[int] = []
            for start in range(len(ids) - 3, -1, -1):
                if ids[start : start + 2] == ids[-2:]:
                    found = ids[start + 2 : start + 2 + k[row]]
                    break
            drafts[row] = Draft(torch.tensor(found, dtype=torch.long, device=ctx.tokens.device))
        return drafts

    def commit(self, ctxs: dict[int, DraftContext], num_accepted: dict[int, int]) -> None:
        assert set(num_accepted) == set(ctxs)
        self.commits.append(dict(num_accepted))


def test_a_natively_batched_drafter_is_called_once_per_step_for_the_live_rows():
    model, eos = _target("qwen3"), _eos("qwen3")
    drafter = NativeBatchNgram()
    batch = specdec.generate_batch(model, PROMPTS, drafter=drafter, max_new_tokens=NEW, eos_token_id=eos)
    assert [row.tokens for row in batch] == _alone(model, lambda: None, eos)
    assert len(drafter.calls) <= batch.totals.steps and drafter.commits
    assert drafter.calls[0] == [0, 1, 2, 3]
    finished = [row for row, out in enumerate(batch) if len(out.tokens) < NEW]
    assert finished and finished[0] not in drafter.calls[-1], "a finished row is drafted for no more"


def test_suffix_rows_share_what_they_learn_with_the_drafter_they_came_from():
    drafter = specdec.make_drafter("suffix")
    specdec.generate_batch(_target("llama"), PROMPTS, drafter=drafter, max_new_tokens=NEW)
    assert drafter.memory.tokens == len(PROMPTS) * NEW, "every row's output is remembered"


# --- the cache with holes, the batch's shapes ---------------------------------------------

def test_holes_are_compacted_exactly_when_the_columns_run_out(monkeypatch):
    module = importlib.import_module("specdec.decoding.generate")  # the module, not the function of its name
    monkeypatch.setattr(module, "HOLE_ROOM", 0)
    compactions = []
    original = BatchCache.compact
    monkeypatch.setattr(BatchCache, "compact", lambda self: (compactions.append(self.width), original(self)))
    model = tiny_model("llama", vocab_size=VOCAB, seed=0, dtype=torch.float32, max_positions=512)
    prompts = [PROMPTS[0] * 6, PROMPTS[1]]
    batch = specdec.generate_batch(model, prompts, drafter=GarbageDrafter(seed=1), max_new_tokens=150)
    assert compactions, "garbage drafts leave four holes a step: the columns should run out"
    alone = [specdec.generate(model, prompt, max_new_tokens=150).tokens for prompt in prompts]
    assert [row.tokens for row in batch] == alone


def test_finished_rows_leave_the_batch_forward(monkeypatch):
    shapes = []
    original = BatchLM.forward

    def recording(self, ids, *args, **kwargs):  # type: ignore[no-untyped-def]
        shapes.append(ids.shape[0])
        return original(self, ids, *args, **kwargs)

    monkeypatch.setattr(BatchLM, "forward", recording)
    model = _target("llama")
    plain = [specdec.generate(model, prompt, max_new_tokens=NEW).tokens for prompt in PROMPTS]
    eos = plain[0][2]
    specdec.generate_batch(model, PROMPTS, max_new_tokens=NEW, eos_token_id=eos)
    ended = sum(1 for tokens in plain if eos in tokens)
    assert shapes[0] == len(PROMPTS) and shapes[-1] == len(PROMPTS) - ended < len(PROMPTS)


@pytest.mark.usefixtures("strict_compile")
def test_compiled_batches_equal_eager_on_a_few_shapes(monkeypatch):
    shapes = set()
    original = BatchLM.forward

    def recording(self, ids, *args, **kwargs):  # type: ignore[no-untyped-def]
        if kwargs.get("fixed", True):
            shapes.add(tuple(ids.shape))
        return original(self, ids, *args, **kwargs)

    monkeypatch.setattr(BatchLM, "forward", recording)
    model = _target("llama")
    prompts = PROMPTS + [PROMPTS[0][3:]]  # five rows: the batch shrinks to 4, 2, 1 when compiled
    plain = [specdec.generate(model, prompt, max_new_tokens=NEW).tokens for prompt in prompts]
    eos = plain[0][2]
    drafter = specdec.make_drafter("ngram", max_ngram=3)
    eager = specdec.generate_batch(model, prompts, drafter=drafter, max_new_tokens=NEW, eos_token_id=eos)
    shapes.clear()
    failed = compile_failures()  # those of earlier tests in this process (one decodes a model dynamo cannot compile)
    compiled = specdec.generate_batch(model, prompts, drafter=drafter, max_new_tokens=NEW, eos_token_id=eos,
                                      compile=True)
    assert compile_failures() == failed, compile_failures()
    assert [row.tokens for row in compiled] == [row.tokens for row in eager]
    assert {rows for rows, _ in shapes} <= {5, 4, 2, 1}, f"batch shapes {sorted(shapes)}"
    assert {width for _, width in shapes} <= {1, 5}, "a chain's verify keeps k + 1 rows, plain decoding one"


# --- bad input ------------------------------------------------------------------------------

def test_bad_prompts_are_named_by_their_index():
    model = _target("llama")
    with pytest.raises(ValueError, match="non-empty list of prompts"):
        specdec.generate_batch(model, [])
    with pytest.raises(ValueError, match=r"prompts\[1\]: input_ids is empty"):
        specdec.generate_batch(model, [[1, 2], []])
    with pytest.raises(ValueError, match=r"prompts\[0\]: .*outside the vocabulary"):
        specdec.generate_batch(model, [[1, VOCAB]])
