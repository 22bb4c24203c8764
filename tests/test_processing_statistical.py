"""Every drafter family stays lossless with the settings users set, by a chi-square test.

Two settings: temperature 0.8 with a repetition penalty of 1.3, a presence penalty of 0.5 and
min-p 0.05 together (each step's p, and each drafter's q, depend on the draft prefix), and
temperature 0.8 constrained to a JSON schema (an array of 1, 2 or 12, over a word-level vocabulary
of its seven tokens, so the grammar leaves the model real choices). For each family,
`specdec.generate` with fixed seeds gives the counts of short continuations, compared with plain
sampling's law enumerated without specdec (`reference_sampling.plain_law`: transformers'
processors, a fresh grammar matcher per prefix). The false-alarm rate is ALPHA = 1e-4 and the
seeds are fixed, so a red run means a bug. A pipeline that processes every draft row from the
committed ids alone must fail the same test (it has power); `test_processing_law` catches that
fault exactly.
"""

from __future__ import annotations

import functools
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
from specdec.drafters.model_free.lookahead import LookaheadDrafter
from specdec.drafters.feature_heads.medusa import MedusaDrafter
from specdec.drafters.feature_heads.mtp import MtpDrafter
from specdec.drafters.model_free.retrieval import RetrievalDrafter
from specdec.drafters.parallel.dflash import DFlashDrafter
from specdec.processing import Prefixes

from reference_sampling import plain_law, word_tokenizer
from test_eagle import random_head, save_eagle
from test_dflash import write_dflash
from test_eagle3 import write_head
from test_lossless_statistical import ALPHA, chi_square_p_value
from test_medusa import checkpoint, random_heads
from test_mtp import mtp_tensors, write_target
from tiny import tiny_model

RUNS = 400  # generations per case, fixed seeds (a draft prefix ignored needs twice as many: see the power test)
NUM_DRAFT = 3
HIDDEN = 16

PENALISED = Sampling(temperature=0.8, repetition_penalty=1.3, presence_penalty=0.5, min_p=0.05)
PENALISED_VOCAB, PENALISED_LENGTH = 5, 3
PENALISED_PROMPT = [1, 2, 3, 1, 2, 3, 1, 2]  # repetitive: prompt lookup and suffixes find matches

WORDS = ["[", "1", "2", "12", ", ", "]", "</s>"]  # the engine writes JSON on one line as json.dumps does
SCHEMA = {"type": "array", "items": {"enum": [1, 2, 12]}}
CONSTRAINED = Sampling(temperature=0.8, json_schema=SCHEMA)
JSON_LENGTH = 4  # new ids, or fewer ending at the end id
JSON_PROMPT = [0, 1, 4, 2, 5, 0, 3, 4, 1, 5, 0, 2, 4, 3, 5]  # [1, 2][12, 1][2, 12]


@functools.lru_cache(maxsize=None)
def _tokenizer() -> object:
    return word_tokenizer(WORDS)


def _target(vocab: int, arch: str = "llama") -> torch.nn.Module:
    return tiny_model(arch, seed=0, vocab_size=vocab, layers=1, hidden=HIDDEN, head_scale=8.0)


def _retrieval(directory: Path, vocab: int, prompt: list[int]) -> RetrievalDrafter:
    from specdec.data.datastore_build import build_datastore_from_ids

    rng = np.random.default_rng(3)
    documents = [prompt + rng.integers(0, vocab, 3).tolist() for _ in range(12)]
    documents += [rng.integers(0, vocab, 150) for _ in range(4)]
    return RetrievalDrafter(build_datastore_from_ids(documents, directory / "datastore", vocab_size=vocab),
                            tree=True, nodes=12, occurrences=32)


# family -> (target, drafter) for a vocabulary, a prompt and a scratch directory
Build = Callable[[int, list[int], Path], tuple[torch.nn.Module, object]]
FAMILIES: dict[str, Build] = {
    "ngram": lambda v, prompt, d: (_target(v), NgramDrafter(max_ngram=3)),
    "suffix": lambda v, prompt, d: (_target(v), specdec.make_drafter("suffix", tree=True)),
    "lookahead": lambda v, prompt, d: (_target(v), LookaheadDrafter(window=5, ngram=2, tree=True)),
    "retrieval": lambda v, prompt, d: (_target(v), _retrieval(d, v, prompt)),
    "draft-model": lambda v, prompt, d: (_target(v), DraftModelDrafter(tiny_model(seed=1, vocab_size=v, layers=1,
                                                                                 hidden=HIDDEN, head_scale=8.0))),
    "draft-model+tree": lambda v, prompt, d: (_target(v), specdec.make_drafter(
        "draft-model", model=tiny_model(seed=1, vocab_size=v, layers=1, hidden=HIDDEN, head_scale=8.0), tree=True,
        top_k=2, total_tokens=5)),
    "medusa": lambda v, prompt, d: (_target(v), MedusaDrafter(checkpoint(d, random_heads(
        num_heads=2, hidden=HIDDEN, vocab=v, seed=3)), sample=True)),
    "eagle": lambda v, prompt, d: (_target(v), EagleDrafter(save_eagle(random_head(seed=4, hidden=HIDDEN, vocab=v),
                                                                       d))),
    "eagle3": lambda v, prompt, d: (_target(v), Eagle3Drafter(write_head(
        d, seed=4, vocab=v, draft_vocab=v - 1, hidden=HIDDEN, target_hidden=HIDDEN, layers=(0, 1, 1)))),
    "mtp": lambda v, prompt, d: _mtp(v, d),
    "dflash": lambda v, prompt, d: (_target(v), DFlashDrafter(write_dflash(
        d / "dflash", vocab=v, hidden=HIDDEN, layers=1, block=4, layer_ids=(0,), seed=5))),
}


def _mtp(vocab: int, directory: Path) -> tuple[torch.nn.Module, object]:
    target = _target(vocab, "qwen3")
    return target, MtpDrafter(write_target(target, mtp_tensors(target, "qwen", seed=4), directory), sample=True)


def counts_of(target: torch.nn.Module, drafter: object, prompt: list[int], sampling: Sampling, length: int,
              cells: list[tuple[int, ...]], tokenizer: object = None, runs: int = RUNS
              ) -> tuple[np.ndarray, int, int, int]:
    """Counts over `cells` of `runs` generations (seeds 0, 1, ...), how many outputs fell outside
    them (outputs plain sampling never gives), and the drafted / accepted totals."""
    outcomes: Counter[tuple[int, ...]] = Counter()
    drafted = accepted = 0
    for seed in range(runs):
        result = specdec.generate(target, prompt, drafter=drafter, num_draft_tokens=NUM_DRAFT, max_new_tokens=length,
                                  sampling=sampling, seed=seed, tokenizer=tokenizer)
        outcomes[tuple(result.tokens)] += 1
        drafted += result.stats.drafted
        accepted += result.stats.accepted
    outside = sum(count for outcome, count in outcomes.items() if outcome not in set(cells))
    return np.array([outcomes[cell] for cell in cells]), outside, drafted, accepted


def _law(target: torch.nn.Module, prompt: list[int], sampling: Sampling, length: int, compiled: object = None,
         stop: int | None = None) -> dict[tuple[int, ...], float]:
    @functools.lru_cache(maxsize=None)
    def logits(ids: tuple[int, ...]) -> torch.Tensor:
        tensor = torch.tensor([ids])
        with torch.inference_mode():
            return target(input_ids=tensor, attention_mask=torch.ones_like(tensor)).logits[0, -1]

    return plain_law(logits, prompt, sampling, length, compiled, stop)


def check(family: str, constrained: bool, directory: Path, runs: int = RUNS) -> tuple[float, int, int, int]:
    """(chi-square p-value, outputs plain sampling never gives, drafted, accepted) of the family
    under one of the two settings."""
    if constrained:
        from specdec.processing.constraint import compile_constraint

        vocab, prompt, length, sampling, tokenizer = len(WORDS), JSON_PROMPT, JSON_LENGTH, CONSTRAINED, _tokenizer()
        compiled = compile_constraint("json_schema", CONSTRAINED.json_schema, tokenizer, vocab)
        stop = WORDS.index("</s>")
    else:
        vocab, prompt, length, sampling, tokenizer = (PENALISED_VOCAB, PENALISED_PROMPT, PENALISED_LENGTH, PENALISED,
                                                      None)
        compiled = stop = None
    target, drafter = FAMILIES[family](vocab, prompt, directory)
    law = _law(target, prompt, sampling, length, compiled, stop)
    cells = sorted(law)
    counts, outside, drafted, accepted = counts_of(target, drafter, prompt, sampling, length, cells, tokenizer, runs)
    return chi_square_p_value(counts, np.array([law[cell] for cell in cells])), outside, drafted, accepted


@pytest.mark.parametrize("constrained", [False, True], ids=["penalties-min-p", "json-schema"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_each_family_samples_plain_samplings_law(family: str, constrained: bool, tmp_path: Path) -> None:
    p_value, outside, drafted, accepted = check(family, constrained, tmp_path)
    assert drafted > 0 and 0 < accepted < drafted, f"{family}: drafted {drafted}, accepted {accepted}: vacuous"
    setting = "a JSON schema" if constrained else "penalties and min-p"
    assert outside == 0, f"{family} with {setting}: {outside} outputs that plain sampling never gives"
    assert p_value >= ALPHA, f"{family} with {setting} is not lossless: chi-square p = {p_value:.3g}"


def test_the_test_catches_draft_rows_processed_from_the_committed_ids(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Power: every verify row processed as if it followed the committed ids alone (the draft prefix
    forgotten, as engines that ignore penalties under speculation do) fails the test, with twice
    the runs of the tests above (at their runs it sits near ALPHA: the law it gives is close). (Under the
    grammar the same fault makes outputs leave the grammar: `test_processing_law` catches it.)"""
    original = Prefixes.of_verify

    def committed_only(committed, prompt_length, draft, parents):  # type: ignore[no-untyped-def]
        rows = original(committed, prompt_length, draft, parents)
        return Prefixes(rows.committed, rows.prompt_length, torch.full_like(rows.suffixes, -1))

    monkeypatch.setattr(Prefixes, "of_verify", committed_only)
    p_value, outside, drafted, _ = check("draft-model+tree", False, tmp_path, runs=2 * RUNS)
    assert drafted > 0 and (outside > 0 or p_value < ALPHA), (
        f"a pipeline blind to the draft prefix went undetected: p = {p_value:.3g}")
