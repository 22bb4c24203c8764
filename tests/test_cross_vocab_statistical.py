"""Sampled drafts across tokenizers follow plain sampling: TLI trees of sampled siblings
(`draft-model`, tree=True) through `specdec.generate`, and TLI chains in ragged batches through
`specdec.generate_batch`, each verified by the default rule (traversal for trees, block for
chains) and compared with the enumerated law of three new tokens at temperature 0.8 by a
chi-square test at a false-alarm rate of at most ALPHA, with fixed seeds (`test_lossless_statistical`).
Each test also checks that what it names ran: branching trees, TLI, accepted drafts.

The models and tokenizers are test_cross_vocab's small ones: the target's ids a, b, c, ab, </s>;
the draft model's <unk>, <s>, </s>, a, b, ba, so TLI drafts only what both spell alike (a, b and
the end), and the target's c and ab are left to the verifier's corrections.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from transformers import PreTrainedModel, PreTrainedTokenizerFast

import specdec
from specdec import Sampling
from specdec.drafters import DraftModelDrafter
from specdec.teaching.trace import Trace
from specdec.trees import children
from test_cross_vocab import LENGTH, PROMPT_TEXT, VOCAB, _small_tokenizers
from test_lossless_statistical import ALPHA, chi_square_p_value, exact_distribution
from tiny import tiny_model

SAMPLING = Sampling(temperature=0.8)
TREE_RUNS = 400  # generations per tree case
BATCH_CALLS = 150  # batches of four rows, two per prompt: 300 generations per prompt
OTHER_PROMPT = "bacba"  # b, a, c, b, a: five ids against PROMPT_TEXT's three (ab, c, ab)

Models = tuple[PreTrainedModel, PreTrainedModel, PreTrainedTokenizerFast, PreTrainedTokenizerFast]


@pytest.fixture(scope="module")
def models() -> Models:
    """test_cross_vocab's small target and draft model, with their tokenizers."""
    target_tokenizer, draft_tokenizer = _small_tokenizers()
    target = tiny_model(vocab_size=VOCAB, seed=0, layers=1, hidden=16, head_scale=8.0)
    draft = tiny_model("qwen2", vocab_size=len(draft_tokenizer), seed=1, layers=1, hidden=16, head_scale=4.0)
    return target, draft, target_tokenizer, draft_tokenizer


def _counts(outcomes: Counter[tuple[int, ...]]) -> np.ndarray:
    """Counts [V**3] of the continuations (index x1*V*V + x2*V + x3)."""
    counts = np.zeros(VOCAB**LENGTH, dtype=np.int64)
    for (x1, x2, x3), count in outcomes.items():
        counts[(x1 * VOCAB + x2) * VOCAB + x3] = count
    return counts


def _branching(trace: Trace) -> int:
    """How many steps of one generation drafted a tree with a node of two children or more."""
    return sum(1 for step in trace.steps
               if step.parents is not None and any(len(kids) > 1 for kids in children(list(step.parents))))


@pytest.mark.parametrize("siblings", ["without_replacement", "iid"])
def test_tli_sampled_trees_follow_plain_sampling(models: Models, siblings: str) -> None:
    target, draft, target_tokenizer, draft_tokenizer = models
    prompt = target_tokenizer.encode(PROMPT_TEXT, add_special_tokens=False)
    drafter = DraftModelDrafter(draft, tokenizer=draft_tokenizer, translate="tli", tree=True, top_k=2,
                                total_tokens=6, siblings=siblings)
    outcomes: Counter[tuple[int, ...]] = Counter()
    accepted = branching = 0
    for seed in range(TREE_RUNS):
        trace = Trace()
        result = specdec.generate(target, prompt, drafter=drafter, num_draft_tokens=3, max_new_tokens=LENGTH,
                                  sampling=SAMPLING, seed=seed, tokenizer=target_tokenizer, trace=trace)
        outcomes[tuple(result.tokens)] += 1
        accepted += result.stats.accepted
        branching += _branching(trace)
    assert drafter.translation is not None and drafter.translation.mode == "tli"
    assert branching > TREE_RUNS // 2 and accepted > TREE_RUNS // 4, (
        f"{siblings}: {branching} branching trees, {accepted} tokens accepted: too few to test trees")
    p_value = chi_square_p_value(_counts(outcomes), exact_distribution(target, prompt, SAMPLING))
    assert p_value >= ALPHA, f"TLI trees ({siblings} siblings) deviate from plain sampling: p = {p_value:.3g}"


def test_tli_chains_in_ragged_batches_follow_plain_sampling(models: Models) -> None:
    """Four rows, two prompts of different lengths twice over; row i of call c is seeded c * 4 + i,
    so every generation has a seed of its own. One test per prompt, each at ALPHA / 2."""
    target, draft, target_tokenizer, draft_tokenizer = models
    prompts = [target_tokenizer.encode(text, add_special_tokens=False) for text in (PROMPT_TEXT, OTHER_PROMPT)]
    assert len(prompts[0]) != len(prompts[1])
    rows = prompts * 2
    drafter = DraftModelDrafter(draft, tokenizer=draft_tokenizer, translate="tli")
    outcomes: list[Counter[tuple[int, ...]]] = [Counter(), Counter()]
    accepted = [0, 0]
    for call in range(BATCH_CALLS):
        batch = specdec.generate_batch(target, rows, drafter=drafter, num_draft_tokens=3, max_new_tokens=LENGTH,
                                       sampling=SAMPLING, seed=call * len(rows), tokenizer=target_tokenizer)
        for i, row in enumerate(batch):
            outcomes[i % 2][tuple(row.tokens)] += 1
            accepted[i % 2] += row.stats.accepted
    for prompt, counted, kept in zip(prompts, outcomes, accepted):
        assert kept > BATCH_CALLS // 2, f"prompt {prompt}: {kept} tokens accepted: the batch barely drafted"
        p_value = chi_square_p_value(_counts(counted), exact_distribution(target, prompt, SAMPLING))
        assert p_value >= ALPHA / 2, (
            f"batched TLI rows of prompt {prompt} deviate from plain sampling: p = {p_value:.3g}")

