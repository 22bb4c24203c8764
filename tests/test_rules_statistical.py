"""Each verification rule stays lossless on real drafters, by a chi-square test: block
verification for the sampled chains of every learned drafter, traversal verification and the
sibling rule for their sampled trees, with siblings drawn i.i.d. or without replacement, token-wise
chains, and deterministic drafts (n-grams, suffix trees) under block and traversal; in
batches too. At temperature 0 every rule gives plain greedy decoding's tokens, and the compiled
engine decodes what the eager one does under each rule.

The setting is temperature 0.8 with top-p 0.95; the tiny target and the drafters are those of
`test_processing_statistical` (whose plain-sampling law is enumerated without specdec). Seeds are
fixed and the false-alarm rate is ALPHA = 1e-4, so a red run means a bug. The exact proofs, with
their planted bugs, are `test_verification_rules`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

import specdec
from specdec import Sampling
from specdec.drafters import DraftModelDrafter, NgramDrafter
from specdec.drafters.feature_heads.eagle import EagleDrafter
from specdec.drafters.feature_heads.eagle3 import Eagle3Drafter
from specdec.drafters.feature_heads.medusa import MedusaDrafter
from specdec.drafters.feature_heads.mtp import MtpDrafter
from specdec.drafters.parallel.dflash import DFlashDrafter

from test_eagle import random_head, save_eagle
from test_dflash import write_dflash
from test_eagle3 import write_head
from test_lossless_statistical import ALPHA, chi_square_p_value
from test_medusa import checkpoint, random_heads
from test_mtp import mtp_tensors, write_target
from test_processing_statistical import HIDDEN, _law, _target
from tiny import tiny_model

RUNS = 400
NUM_DRAFT = 3
VOCAB, LENGTH = 5, 3
PROMPT = [1, 2, 3, 1, 2, 3, 1, 2]
NUCLEUS = Sampling(temperature=0.8, top_p=0.95)
TREE = {"tree": True, "top_k": 2, "total_tokens": 5}

Build = Callable[[Path], tuple[torch.nn.Module, object]]


def _draft_model(**options: object) -> Build:
    return lambda d: (_target(VOCAB), DraftModelDrafter(tiny_model(seed=1, vocab_size=VOCAB, layers=1, hidden=HIDDEN,
                                                                   head_scale=8.0), **options))


def _eagle(**options: object) -> Build:
    return lambda d: (_target(VOCAB), EagleDrafter(save_eagle(random_head(seed=4, hidden=HIDDEN, vocab=VOCAB), d),
                                                   **options))


def _eagle3(**options: object) -> Build:
    return lambda d: (_target(VOCAB), Eagle3Drafter(write_head(d, seed=4, vocab=VOCAB, draft_vocab=VOCAB - 1,
                                                               hidden=HIDDEN, target_hidden=HIDDEN, layers=(0, 1, 1)),
                                                    **options))


def _medusa(**options: object) -> Build:
    return lambda d: (_target(VOCAB), MedusaDrafter(checkpoint(d, random_heads(num_heads=2, hidden=HIDDEN, vocab=VOCAB,
                                                                               seed=3)), sample=True, **options))


def _mtp(**options: object) -> Build:
    def build(d: Path) -> tuple[torch.nn.Module, object]:
        target = _target(VOCAB, "qwen3")
        return target, MtpDrafter(write_target(target, mtp_tensors(target, "qwen", seed=4), d), sample=True, **options)
    return build


def _dflash(**options: object) -> Build:
    return lambda d: (_target(VOCAB), DFlashDrafter(write_dflash(d / "dflash", vocab=VOCAB, hidden=HIDDEN, layers=1,
                                                                 block=4, layer_ids=(0,), seed=5), **options))


WITHOUT = {"siblings": "without_replacement"}
# (drafter, rule) -> the target and drafter
CASES: dict[tuple[str, str], Build] = {
    ("draft-model", "token"): _draft_model(),
    ("eagle", "token"): _eagle(),
    ("ngram", "block"): lambda d: (_target(VOCAB), NgramDrafter(max_ngram=3)),
    ("suffix+tree", "traversal"): lambda d: (_target(VOCAB), specdec.make_drafter("suffix", tree=True)),
    ("draft-model", "block"): _draft_model(),
    ("eagle", "block"): _eagle(),
    ("eagle3", "block"): _eagle3(),
    ("medusa", "block"): _medusa(),
    ("mtp", "block"): _mtp(),
    ("draft-model+tree", "traversal"): _draft_model(**TREE),
    ("draft-model+tree-without-replacement", "traversal"): _draft_model(**TREE, **WITHOUT),
    ("draft-model+tree-without-replacement", "token"): _draft_model(**TREE, **WITHOUT),
    ("eagle+tree-without-replacement", "traversal"): _eagle(**TREE, **WITHOUT),
    ("eagle3+tree", "traversal"): _eagle3(**TREE),
    ("medusa+tree-without-replacement", "traversal"): _medusa(medusa_choices=[(0,), (1,), (0, 0), (0, 1), (1, 0)],
                                                              **WITHOUT),
    ("medusa+tree", "token"): _medusa(medusa_choices=[(0,), (1,), (0, 0), (0, 1), (1, 0)]),
    ("mtp+tree-without-replacement", "traversal"): _mtp(**TREE, **WITHOUT),
    ("dflash", "token"): _dflash(),
    ("dflash", "block"): _dflash(),
    ("dflash+ddtree", "traversal"): _dflash(tree=True, top_k=2, total_tokens=5),
    ("dflash+ddtree", "token"): _dflash(tree=True, top_k=2, total_tokens=5),
}


def counts(target: torch.nn.Module, drafter: object, rule: str, cells: list[tuple[int, ...]]
           ) -> tuple[np.ndarray, int, int, int]:
    """Counts over `cells` of RUNS generations (seeds 0, 1, ...), the outputs outside them, and
    the drafted / accepted totals."""
    outcomes: Counter[tuple[int, ...]] = Counter()
    drafted = accepted = 0
    for seed in range(RUNS):
        result = specdec.generate(target, PROMPT, drafter=drafter, num_draft_tokens=NUM_DRAFT, max_new_tokens=LENGTH,
                                  sampling=NUCLEUS, seed=seed, verify_rule=rule)
        outcomes[tuple(result.tokens)] += 1
        drafted += result.stats.drafted
        accepted += result.stats.accepted
    outside = sum(count for outcome, count in outcomes.items() if outcome not in set(cells))
    return np.array([outcomes[cell] for cell in cells]), outside, drafted, accepted


@pytest.mark.parametrize(("family", "rule"), list(CASES), ids=[f"{f}-{r}" for f, r in CASES])
def test_each_rule_samples_plain_samplings_law(family: str, rule: str, tmp_path: Path) -> None:
    target, drafter = CASES[family, rule](tmp_path)
    law = _law(target, PROMPT, NUCLEUS, LENGTH)
    cells = sorted(law)
    observed, outside, drafted, accepted = counts(target, drafter, rule, cells)
    assert drafted > 0 and 0 < accepted < drafted, f"{family}: drafted {drafted}, accepted {accepted}: vacuous"
    assert outside == 0, f"{family} under {rule}: {outside} outputs that plain sampling never gives"
    p_value = chi_square_p_value(observed, np.array([law[cell] for cell in cells]))
    assert p_value >= ALPHA, f"{family} under {rule} is not lossless: chi-square p = {p_value:.3g}"


def test_the_test_catches_siblings_verified_as_drawn_independently(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Power: siblings drawn without replacement but each tested against the shared row, as if
    drawn i.i.d. (the wrong declaration), fail the test."""
    loop = __import__("specdec.decoding.verdicts", fromlist=["sibling_rows"])
    monkeypatch.setattr(loop, "sibling_rows", lambda probs, tokens, parents, siblings: probs)
    target, drafter = CASES["medusa+tree-without-replacement", "traversal"](tmp_path)
    law = _law(target, PROMPT, NUCLEUS, LENGTH)
    cells = sorted(law)
    observed, outside, _, _ = counts(target, drafter, "token", cells)
    p_value = chi_square_p_value(observed, np.array([law[cell] for cell in cells]))
    assert outside > 0 or p_value < ALPHA, f"the wrong declaration went unnoticed: p = {p_value:.3g}"


@pytest.mark.parametrize(("family", "rule"), list(CASES), ids=[f"{f}-{r}" for f, r in CASES])
def test_every_rule_gives_greedy_decodings_tokens_at_temperature_0(family: str, rule: str, tmp_path: Path) -> None:
    target, drafter = CASES[family, rule](tmp_path)
    plain = specdec.generate(target, PROMPT, max_new_tokens=12)
    result = specdec.generate(target, PROMPT, drafter=drafter, num_draft_tokens=NUM_DRAFT, max_new_tokens=12,
                              verify_rule=rule)
    assert result.tokens == plain.tokens, f"{family} under {rule} left greedy decoding"
    assert result.stats.drafted > 0


@pytest.mark.parametrize(("family", "rule"), [("draft-model", "block"),
                                              ("draft-model+tree-without-replacement", "traversal"),
                                              ("dflash", "block")])
def test_batch_rows_sample_plain_samplings_law_under_each_rule(family: str, rule: str, tmp_path: Path) -> None:
    """RUNS rows of one prompt in one batch (row i seeded apart): their outputs follow plain sampling."""
    target, drafter = CASES[family, rule](tmp_path)
    law = _law(target, PROMPT, NUCLEUS, LENGTH)
    cells = sorted(law)
    out = specdec.generate_batch(target, [PROMPT] * RUNS, drafter=drafter, num_draft_tokens=NUM_DRAFT,
                                 max_new_tokens=LENGTH, sampling=NUCLEUS, seed=0, verify_rule=rule)
    outcomes = Counter(tuple(row.tokens) for row in out)
    assert 0 < out.totals.accepted < out.totals.drafted
    assert sum(count for outcome, count in outcomes.items() if outcome not in set(cells)) == 0
    p_value = chi_square_p_value(np.array([outcomes[cell] for cell in cells]), np.array([law[cell] for cell in cells]))
    assert p_value >= ALPHA, f"batched {family} under {rule} is not lossless: chi-square p = {p_value:.3g}"


@pytest.mark.parametrize(("family", "rule"), [("draft-model", "block"),
                                              ("draft-model+tree-without-replacement", "traversal"),
                                              ("dflash", "block")])
@pytest.mark.usefixtures("strict_compile")
def test_the_compiled_engine_decodes_what_the_eager_one_does_under_each_rule(family: str, rule: str,
                                                                            tmp_path: Path) -> None:
    """The same draws in both engines (`docs/engine.md`), so the same tokens: a sampled chain under
    block verification, a sampled tree under traversal verification."""
    target, drafter = CASES[family, rule](tmp_path)
    for seed in range(2):
        eager = specdec.generate(target, PROMPT, drafter=drafter, num_draft_tokens=NUM_DRAFT, max_new_tokens=16,
                                 sampling=NUCLEUS, seed=seed, verify_rule=rule)
        compiled = specdec.generate(target, PROMPT, drafter=drafter, num_draft_tokens=NUM_DRAFT, max_new_tokens=16,
                                    sampling=NUCLEUS, seed=seed, verify_rule=rule, compile=True)
        assert compiled.tokens == eager.tokens, f"{family}, seed {seed}: compiled and eager differ under {rule}"


def test_a_traced_traversal_step_shows_each_nodes_own_test(tmp_path: Path) -> None:
    """Traversal tests nodes leaves first, off the accepted path too (`Verdict.tested`): the trace
    pairs each shown node with its own test. A rejected node shown with a test failed it; an
    accepted one shown with a test is the deepest kept node, which passed it."""
    from specdec.teaching.trace import Trace

    target, drafter = CASES["draft-model+tree-without-replacement", "traversal"](tmp_path)
    shown = 0
    for seed in range(4):
        trace = Trace()
        specdec.generate(target, PROMPT, drafter=drafter, num_draft_tokens=NUM_DRAFT, max_new_tokens=12,
                         sampling=NUCLEUS, seed=seed, verify_rule="traversal", trace=trace)
        for step in trace.steps:
            drafted = [t for t in step.tokens if t.kind in ("accepted", "rejected")]
            accepted = [t for t in drafted if t.kind == "accepted"]
            for token in drafted:
                if token.accept is None:
                    continue
                shown += 1
                assert token.uniform is not None
                if token.kind == "rejected":
                    assert token.uniform >= token.accept
                else:
                    assert token is accepted[-1] and token.uniform < token.accept
    assert shown > 0
