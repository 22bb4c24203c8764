"""The compiled engine on the quick zoo: every zoo drafter, chains and trees, decodes the same tokens
compiled as eager, with a budget or an EOS ending inside an accepted block; a compiled step reads
back from the device once; a feature-level head catches up and drafts in one step.

These tests share the quick zoo's target and drafters (`quick_target`, `zoo_drafter`), so a graph
compiled by one serves the others; their shapes (k = 4) are those `make demo` compiles. They are the
compiled engine's check on the zoo: tests/test_demo.py decodes the demo's table eagerly.
"""

from __future__ import annotations

import pytest
import torch

import specdec
from specdec import Sampling

pytestmark = pytest.mark.usefixtures("strict_compile")  # every test here compiles: none may fall back to eager


def _zoo_rows(directory: object) -> list[tuple[str, str, dict[str, object]]]:
    """(label, drafter name, the options beyond the zoo's) of every zoo drafter, chain and tree."""
    from specdec import plugins, zoo

    rows: list[tuple[str, str, dict[str, object]]] = []
    for name in zoo.drafter_options(directory):  # type: ignore[arg-type]
        rows.append((name, name, {}))
        tree = getattr(plugins.drafter_class(name), "tree_options", None)
        if tree:
            rows.append((f"{name}+tree", name, dict(tree)))
    return rows


def test_compiled_decoding_equals_eager_for_every_zoo_drafter_with_eos_and_budget_inside_blocks(
        quick_zoo, quick_target, zoo_drafter) -> None:
    from specdec.checkpoints import load_tokenizer

    model = quick_target
    tokenizer = load_tokenizer(quick_zoo / "target")
    prompt = tokenizer("def parse(self, text):\n    ", add_special_tokens=False)["input_ids"]
    plain = specdec.generate(model, prompt, max_new_tokens=40).tokens
    eos = next(t for t in plain if t != plain[0])  # first seen past the first block (the quick zoo repeats itself)
    for label, name, extra in _zoo_rows(quick_zoo):
        for budget, stop in ((37, None), (40, eos)):  # a budget, then an EOS, ending inside a block
            runs = [specdec.generate(model, prompt, drafter=zoo_drafter(name, compile, **extra), num_draft_tokens=4,
                                     max_new_tokens=budget, eos_token_id=stop, compile=compile)
                    for compile in (False, True)]
            assert runs[1].tokens == runs[0].tokens, f"{label}: compiled {runs[1].tokens} != eager {runs[0].tokens}"
            expected = plain[: plain.index(eos) + 1] if stop is not None else plain[:budget]
            assert runs[0].tokens == expected, f"{label}: not plain greedy decoding"


class HostReads:
    """Counts the tensor methods that read a value back to the host (tolist, item, bool, int,
    float), by wrapping them on torch.Tensor while active. On CUDA each is a device-to-host copy."""

    METHODS = ("tolist", "item", "__bool__", "__int__", "__float__", "__index__")

    def __init__(self) -> None:
        self.count = 0
        self._saved: dict[str, object] = {}

    def __enter__(self) -> HostReads:
        for name in self.METHODS:
            original = getattr(torch.Tensor, name)
            self._saved[name] = original

            def counted(tensor, *args, _original=original):  # type: ignore[no-untyped-def]
                self.count += 1
                return _original(tensor, *args)

            setattr(torch.Tensor, name, counted)
        return self

    def __exit__(self, *exc: object) -> None:
        for name, original in self._saved.items():
            setattr(torch.Tensor, name, original)


def test_a_compiled_chain_step_reads_back_from_the_device_once(quick_target, zoo_drafter) -> None:
    """The target's and the drafter's steps compiled: each step reads back once (the number
    accepted, where a stop id fell, whether the draft was broken), whatever the drafter."""
    model = quick_target
    prompt = list(range(3, 40))
    for name in ("draft-model", "eagle", "mtp", "medusa"):
        for sampling in (Sampling(), Sampling(temperature=0.8)):
            drafter = zoo_drafter(name, True)
            for new_tokens in (20, 40):  # compiles every shape the runs below meet (they repeat these)
                specdec.generate(model, prompt, drafter=drafter, max_new_tokens=new_tokens, sampling=sampling,
                                 seed=0, compile=True)
            reads = []
            for new_tokens in (20, 40):
                with HostReads() as host:
                    result = specdec.generate(model, prompt, drafter=drafter, max_new_tokens=new_tokens,
                                              sampling=sampling, seed=0, compile=True)
                reads.append((host.count, result.stats.steps))
            (short, short_steps), (long, long_steps) = reads
            assert long_steps > short_steps
            assert long - short == long_steps - short_steps, f"{name} {sampling}: host reads {reads}"


def test_a_feature_level_chain_draft_is_one_drafter_step_per_verify(quick_target, zoo_drafter, monkeypatch) -> None:
    """EAGLE, EAGLE-3 and MTP catch up on the accepted tokens and draft their chain, or their
    greedy top-k tree (`specdec.drafters.tree_search.graph`), in one step (`HeadSteps.fed_chain`),
    compiled or not: every draft of the loop's k tokens after the first (which follows the
    prefill, with nothing to catch up on) is one drafter call, and the tokens are plain greedy
    decoding's."""
    from specdec.runtime import engine

    model = quick_target
    prompt = list(range(3, 40))
    plain = specdec.generate(model, prompt, max_new_tokens=40).tokens
    calls: list[str] = []
    original = engine.Step.__call__

    def counted(self, *args):
        calls.append(self.name)
        return original(self, *args)

    monkeypatch.setattr(engine.Step, "__call__", counted)
    for name, tree in [(name, tree) for name in ("eagle", "eagle3", "mtp") for tree in (False, True)]:
        for compile in (False, True):
            drafter = zoo_drafter(name, compile, **({"tree": True} if tree else {}))  # the other tests' drafters
            drafts: list[tuple[int, list[str]]] = []  # (k asked, the drafter's step calls)

            def watched(rows, k, _propose=drafter.propose, _drafts=drafts):
                before = len(calls)
                draft = _propose(rows, k)
                _drafts.append((k[0], calls[before:]))
                return draft

            drafter.propose = watched
            try:
                result = specdec.generate(model, prompt, drafter=drafter, max_new_tokens=40, compile=compile)
            finally:
                del drafter.propose  # the shared drafter's own method again
            assert result.tokens == plain, f"{name}, tree={tree}, compile={compile}"
            full = [made for k, made in drafts[1:] if k == 4]
            assert len(full) >= 5, f"{name}, tree={tree}: too few full drafts to judge: {drafts}"
            assert all(len(made) == 1 and made[0].endswith("catch-up and draft loop") for made in full), \
                f"{name}, tree={tree}, compile={compile}: {full}"


def test_settings_that_read_the_prefix_decode_compiled_as_eager(quick_target, zoo_drafter) -> None:
    """Penalties and min-p run outside the compiled graphs (each verify row from its own prefix, the
    drafters' chains step by step on the host): the compiled engine gives the eager tokens."""
    model = quick_target
    prompt = list(range(3, 40))
    sampling = Sampling(temperature=0.8, repetition_penalty=1.3, presence_penalty=0.4, min_p=0.05)
    for name in ("draft-model", "eagle", "mtp"):
        runs = [specdec.generate(model, prompt, drafter=zoo_drafter(name, compile), num_draft_tokens=4,
                                 max_new_tokens=30, sampling=sampling, seed=5, compile=compile).tokens
                for compile in (False, True)]
        assert runs[1] == runs[0], name


def test_a_fresh_drafter_instance_compiles_nothing_once_one_of_its_structure_has_run(quick_zoo, quick_target) -> None:
    """Compiled graphs outlive the drafter object: made per request (`make_drafter` per call, as
    the play server does), a drafter runs the graphs of the first instance of its structure."""
    from torch._dynamo.utils import counters

    from specdec import make_drafter, zoo
    from specdec.checkpoints import load_tokenizer

    tokenizer = load_tokenizer(quick_zoo / "target")
    prompt = tokenizer("def parse(self, text):\n    ", add_special_tokens=False)["input_ids"]
    for name, options in zoo.drafter_options(quick_zoo).items():
        runs = []
        for _ in range(2):
            before = counters["stats"]["unique_graphs"]
            tokens = specdec.generate(quick_target, prompt, drafter=make_drafter(name, **options), num_draft_tokens=4,
                                      max_new_tokens=24, compile=True).tokens
            runs.append((counters["stats"]["unique_graphs"] - before, tokens))
        assert runs[1] == (0, runs[0][1]), f"{name}: a second fresh instance compiled {runs[1][0]} graphs"
