"""The sampling pipeline (`specdec.processing`): settings checked, each row processed from its own
prefix exactly as transformers' processors process that prefix, and speculative greedy decoding
with penalties, banned words, repeated n-grams and a custom processor equal to transformers'
`generate` with the same settings, for every kind of drafter, chains, trees and batch rows."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import LogitsProcessor, LogitsProcessorList

import specdec
from specdec import Sampling
from specdec.processing import Pipeline, Prefixes, ProcessorError, chain_paths, tree_paths
from reference_sampling import transformers_processors, word_tokenizer
from tiny import ARCHITECTURES, tiny_model

VOCAB = 64
PROMPT = [5, 9, 14, 22, 5, 9, 14, 22, 5, 9, 14]
NEW_TOKENS = 24


class EvenAfterOdd(LogitsProcessor):
    """A history-dependent processor: after an odd id, even ids get +2 (and the reverse)."""

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        last = input_ids[:, -1:] % 2  # (B, 1)
        parity = torch.arange(scores.shape[-1], device=scores.device) % 2  # (V,)
        return scores + 2.0 * (parity[None] != last).to(scores.dtype)


# --- settings --------------------------------------------------------------------------------------

@pytest.mark.parametrize("field, value, words", [
    ("min_p", 1.5, r"min_p must lie in \[0, 1\]"),
    ("repetition_penalty", 0.0, "repetition_penalty must be a finite number > 0"),
    ("presence_penalty", float("nan"), "presence_penalty must be a finite number"),
    ("frequency_penalty", "1", "frequency_penalty must be a finite number"),
    ("logit_bias", {-1: 1.0}, "logit_bias keys must be token ids"),
    ("logit_bias", {3: float("inf")}, r"logit_bias\[3\] must be a finite number or -inf"),
    ("bad_words_ids", [[]], "bad_words_ids must hold non-empty lists"),
    ("bad_words_ids", "abc", "bad_words_ids must be a list of id lists"),
    ("no_repeat_ngram_size", -1, "no_repeat_ngram_size must be an int >= 0"),
    ("logits_processors", [3], "which is not callable"),
    ("json_schema", "{not json", "json_schema must be a JSON schema"),
    ("regex", "", "regex must be a non-empty string"),
])
def test_a_bad_setting_is_an_error_naming_it(field: str, value: object, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        Sampling(**{field: value})


def test_two_constraints_are_refused_and_settings_normalise() -> None:
    with pytest.raises(ValueError, match="at most one constraint, got json_schema and regex"):
        Sampling(json_schema={"type": "string"}, regex="a+")
    a = Sampling(temperature=0.5, logit_bias={7: 1.0, 3: -2}, json_schema={"b": 1, "a": 2})
    b = Sampling(temperature=0.5, logit_bias=[(3, -2.0), (7, 1)], json_schema='{"b": 1,  "a": 2}')
    assert a == b and hash(a) == hash(b)
    assert a.logit_bias == ((3, -2.0), (7, 1.0))
    assert not Sampling(temperature=0.7, top_p=0.9).reads_prefix and Sampling(temperature=0.7, top_p=0.9).plain
    assert Sampling(repetition_penalty=1.2).reads_prefix and not Sampling(min_p=0.1).reads_prefix
    assert Sampling(logits_processors=LogitsProcessorList([EvenAfterOdd()])).walks_prefix


# --- each row from its own prefix, as transformers processes it -----------------------------------------

SETTINGS = {
    "penalties": Sampling(temperature=0.8, repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.3,
                          min_p=0.05),
    "bias-and-bans": Sampling(temperature=1.0, top_k=20, logit_bias={3: 2.5, 4: float("-inf")},
                              bad_words_ids=[[7], [9, 14]], no_repeat_ngram_size=2),
    "processor": Sampling(temperature=0.6, top_p=0.9, logits_processors=[EvenAfterOdd()], repetition_penalty=0.8),
    "greedy-penalised": Sampling(repetition_penalty=1.5, bad_words_ids=[[14, 22]], logits_processors=[EvenAfterOdd()]),
}


@pytest.mark.parametrize("name", list(SETTINGS))
@pytest.mark.parametrize("shape", ["chain", "tree"])
def test_every_row_is_processed_from_its_own_prefix_as_transformers_would(name: str, shape: str) -> None:
    sampling = SETTINGS[name]
    generator = torch.Generator().manual_seed(1)
    committed = torch.tensor(PROMPT + [9, 14, 3, 22])
    draft = torch.tensor([5, 9, 14, 14, 7, 9])
    parents = [-1, 0, 1, -1, 3, 4] if shape == "tree" else None
    paths = chain_paths(6) if parents is None else tree_paths(parents)
    logits = 3 * torch.randn(len(paths), VOCAB, generator=generator, dtype=torch.float64)
    pipeline = Pipeline(sampling, VOCAB, len(PROMPT))
    prefixes = Prefixes.of_draft(committed, len(PROMPT), draft, paths)
    reference = transformers_processors(sampling, len(PROMPT))
    ours = pipeline.probabilities(logits, prefixes)
    for row, path in enumerate(paths):
        ids = torch.cat([committed, draft[path]])[None]
        scores = reference(ids, logits[row : row + 1].clone())
        if sampling.greedy:
            expected = torch.nn.functional.one_hot(scores.argmax(-1), VOCAB).to(torch.float64)[0]
        else:
            expected = scores.softmax(-1)[0]
        torch.testing.assert_close(ours[row], expected, rtol=0, atol=1e-12, msg=f"row {row}, path {path}")


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 9), min_size=1, max_size=12))
def test_a_tree_rows_prefix_is_its_nodes_path(choices: list[int]) -> None:
    """Row j + 1 of a tree's verify is node j's: its suffix is the tokens on the root-to-node path."""
    from specdec.trees import path_to

    parents = [(c % (j + 1)) - 1 for j, c in enumerate(choices)]  # each parent made before its child
    draft = torch.arange(100, 100 + len(parents))
    prefixes = Prefixes.of_draft(torch.tensor([1, 2]), 1, draft, tree_paths(parents))
    assert prefixes.suffix(0) == []
    for node in range(len(parents)):
        assert prefixes.suffix(node + 1) == draft[path_to(parents, node)].tolist()
        assert prefixes.ids(node + 1).tolist() == [[1, 2, *draft[path_to(parents, node)].tolist()]]


def test_a_processor_that_raises_or_returns_a_wrong_shape_is_named() -> None:
    class Broken(LogitsProcessor):
        def __call__(self, input_ids, scores):
            raise KeyError("no such id")

    class Shrinks(LogitsProcessor):
        def __call__(self, input_ids, scores):
            return scores[:, :-1]

    model = tiny_model("llama", vocab_size=VOCAB)
    with pytest.raises(ProcessorError, match="logits processor Broken raised KeyError"):
        specdec.generate(model, PROMPT, max_new_tokens=3, sampling=Sampling(logits_processors=[Broken()]))
    with pytest.raises(ProcessorError, match=r"Shrinks returned \(1, 63\) for scores of shape \(1, 64\)"):
        specdec.generate(model, PROMPT, drafter="ngram", max_new_tokens=3,
                         sampling=Sampling(temperature=0.5, logits_processors=[Shrinks()]))
    with pytest.raises(ValueError, match=r"logit_bias names ids \[64\] outside the target's vocabulary"):
        specdec.generate(model, PROMPT, max_new_tokens=3, sampling=Sampling(logit_bias={64: 1.0}))


# --- greedy parity with transformers' generate ---------------------------------------------------------

GREEDY = dict(repetition_penalty=1.3, no_repeat_ngram_size=3)


@functools.lru_cache(maxsize=None)
def _target(arch: str) -> torch.nn.Module:
    return tiny_model(arch, vocab_size=VOCAB, seed=0)


@functools.lru_cache(maxsize=None)
def _reference(arch: str) -> tuple[int, ...]:
    ids = torch.tensor([PROMPT])
    out = _target(arch).generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
                                 do_sample=False, pad_token_id=0, eos_token_id=None,
                                 logits_processor=LogitsProcessorList([EvenAfterOdd()]), **GREEDY)
    return tuple(out[0, len(PROMPT):].tolist())


def _drafter(name: str, arch: str, directory: Path) -> object:
    """Every drafter family, a chain and its tree mode (`NAME+tree`), on the arch's tiny target;
    learned heads random (greedy parity holds whatever they draft)."""
    from specdec.data.datastore_build import build_datastore_from_ids
    from specdec.drafters.feature_heads.eagle import EagleDrafter
    from specdec.drafters.feature_heads.eagle3 import Eagle3Drafter
    from specdec.drafters.feature_heads.medusa import MedusaDrafter
    from specdec.drafters.feature_heads.mtp import MtpDrafter

    from test_eagle import random_head, save_eagle
    from test_eagle3 import write_head
    from test_medusa import checkpoint, random_heads
    from test_mtp import mtp_tensors, write_target

    from test_greedy_parity import _noisy_copy  # the same target (VOCAB, seed 0) with noisy weights

    family, tree = name.removesuffix("+tree"), name.endswith("+tree")
    options = {"tree": True} if tree else {}
    make = {
        "ngram": lambda: specdec.make_drafter("ngram", max_ngram=3, **({"branches": 4} if tree else {})),
        "suffix": lambda: specdec.make_drafter("suffix", **options),
        "lookahead": lambda: specdec.make_drafter("lookahead", window=3, ngram=3, **options),
        "retrieval": lambda: specdec.make_drafter("retrieval", datastore=build_datastore_from_ids(
            [PROMPT + list(_reference(arch)), PROMPT[2:] + [14, 22, 7]], directory / "datastore", vocab_size=VOCAB),
            tree=tree),
        "draft-model": lambda: specdec.make_drafter("draft-model", model=_noisy_copy(arch), **(
            {"tree": True, "top_k": 2, "total_tokens": 6} if tree else {})),
        "medusa": lambda: MedusaDrafter(checkpoint(directory, random_heads(num_heads=3, seed=2)), **options),
        "eagle": lambda: EagleDrafter(save_eagle(random_head(seed=3), directory), **options),
        "eagle3": lambda: Eagle3Drafter(write_head(directory, seed=4, layers=(0, 1, 2)), **options),
        "mtp": lambda: MtpDrafter(write_target(_target(arch), mtp_tensors(_target(arch), "qwen", seed=4), directory),
                                  **options),
    }
    return make[family]()


GREEDY_SAMPLING = Sampling(logits_processors=[EvenAfterOdd()], **GREEDY)
FAMILIES = ["ngram", "suffix", "lookahead", "retrieval", "draft-model", "medusa", "eagle", "eagle3", "mtp"]
# drafts that agree with the target, so that accepted draft prefixes are processed: a noisy copy of the
# target, a datastore holding the reference output, suffix decoding after one generation of it (the
# lookups of ngram and lookahead propose repeats, which no_repeat_ngram_size bans; learned heads are random)
ACCEPTING = ("suffix", "retrieval", "draft-model")


# MTP modules are decoder layers of the target's own (Llama-style) architecture: GPT-2 has none
PARITY_CASES = [(arch, name + mode) for arch in ARCHITECTURES for name in FAMILIES for mode in ("", "+tree")
                if not (arch == "gpt2" and name == "mtp")]


@pytest.mark.parametrize(("arch", "drafter"), PARITY_CASES)
def test_greedy_with_penalties_and_a_processor_equals_transformers_generate(arch: str, drafter: str,
                                                                            tmp_path: Path) -> None:
    made = _drafter(drafter, arch, tmp_path)
    if drafter.startswith("suffix"):  # it learns from its finished outputs
        specdec.generate(_target(arch), PROMPT, drafter=made, max_new_tokens=NEW_TOKENS, sampling=GREEDY_SAMPLING)
    result = specdec.generate(_target(arch), PROMPT, drafter=made, num_draft_tokens=4, max_new_tokens=NEW_TOKENS,
                              sampling=GREEDY_SAMPLING)
    assert result.tokens == list(_reference(arch)), f"{arch}, {drafter}"
    if drafter.removesuffix("+tree") in ACCEPTING:
        assert result.stats.accepted >= NEW_TOKENS // 4, f"{arch}, {drafter}: {result.stats.accepted} accepted"
    if drafter != "draft-model":
        return
    plain = specdec.generate(_target(arch), PROMPT, max_new_tokens=NEW_TOKENS, sampling=GREEDY_SAMPLING)
    assert plain.tokens == list(_reference(arch))


@pytest.mark.parametrize("drafter", ["ngram", "draft-model+tree", "eagle", "medusa+tree"])
def test_each_batch_row_follows_its_own_history(drafter: str, tmp_path: Path) -> None:
    arch = "llama"
    prompts = [PROMPT, PROMPT[3:], [1, 2, 3, 1, 2, 3, 1]]
    batch = specdec.generate_batch(_target(arch), prompts, drafter=_drafter(drafter, arch, tmp_path), num_draft_tokens=4,
                                   max_new_tokens=NEW_TOKENS, sampling=GREEDY_SAMPLING)
    if drafter == "draft-model+tree":
        assert all(row.stats.accepted > 0 for row in batch), [row.stats.accepted for row in batch]
    for prompt, row in zip(prompts, batch):
        alone = specdec.generate(_target(arch), prompt, max_new_tokens=NEW_TOKENS, sampling=GREEDY_SAMPLING)
        assert row.tokens == alone.tokens, prompt


# --- grammar-constrained output --------------------------------------------------------------------------

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "kind": {"enum": ["alpha", "beta", "gamma"]},
                                           "size": {"enum": [1, 2, 3]}},
          "required": ["ok", "kind", "size"], "additionalProperties": False}


@functools.lru_cache(maxsize=None)
def _zoo_tokenizer() -> object:
    """The shipped zoo's tokenizer (a byte-level BPE of 2,048 ids): a real vocabulary for the grammar."""
    from specdec import zoo
    from specdec.checkpoints import load_tokenizer

    return load_tokenizer(zoo.ready(zoo.FULL, show_progress=False) / "tokenizer")


@functools.lru_cache(maxsize=None)
def _constrained_target() -> torch.nn.Module:
    return tiny_model("llama", vocab_size=len(_zoo_tokenizer()), seed=3)


@pytest.mark.parametrize("temperature", [0.0, 0.9])
@pytest.mark.parametrize("drafter", [None, "ngram", "draft-model", "draft-model+tree"])
def test_every_constrained_output_parses_and_ends_at_the_grammars_stop(drafter: str | None, temperature: float) -> None:
    import json

    tokenizer = _zoo_tokenizer()
    model = _constrained_target()
    other = tiny_model("qwen2", vocab_size=len(tokenizer), seed=4, layers=1)
    make = {None: lambda: None, "ngram": lambda: specdec.make_drafter("ngram"),
            "draft-model": lambda: specdec.make_drafter("draft-model", model=other),
            "draft-model+tree": lambda: specdec.make_drafter("draft-model", model=other, tree=True, top_k=2,
                                                             total_tokens=6)}[drafter]
    sampling = Sampling(temperature=temperature, json_schema=SCHEMA)
    prompt = tokenizer("config = ", add_special_tokens=False)["input_ids"]
    for seed in range(3):
        result = specdec.generate(model, prompt, drafter=make(), num_draft_tokens=4, max_new_tokens=64,
                                  sampling=sampling, tokenizer=tokenizer, seed=seed)
        assert result.tokens[-1] == tokenizer.eos_token_id, f"{drafter}: no stop id within the budget"
        value = json.loads(tokenizer.decode(result.tokens[:-1]))
        assert set(value) == {"ok", "kind", "size"} and value["kind"] in SCHEMA["properties"]["kind"]["enum"]
        if temperature == 0.0:
            plain = specdec.generate(model, prompt, max_new_tokens=64, sampling=sampling, tokenizer=tokenizer)
            assert result.tokens == plain.tokens, drafter


def test_a_constraint_without_a_tokenizer_or_that_does_not_compile_is_refused() -> None:
    from specdec.processing.constraint import ConstraintError

    model = tiny_model("llama", vocab_size=VOCAB)
    with pytest.raises(ConstraintError, match="needs the target's tokenizer: pass tokenizer="):
        specdec.generate(model, PROMPT, max_new_tokens=3, sampling=Sampling(regex="a+"))
    with pytest.raises(ConstraintError, match="Sampling.regex does not compile"):
        specdec.generate(_constrained_target(), [5, 6], max_new_tokens=3, sampling=Sampling(regex="a(b"),
                         tokenizer=_zoo_tokenizer())


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 2047), min_size=0, max_size=6), st.integers(0, 3), st.booleans())
def test_a_rejected_draft_leaves_the_matcher_as_it_was(draft: list[int], committed: int, tree: bool) -> None:
    """Masking a draft's rows (valid ids or not, a chain or a tree) never moves the committed state."""
    from specdec.processing.constraint import Matcher, compile_constraint

    tokenizer = _zoo_tokenizer()
    vocab = len(tokenizer)
    matcher = Matcher(compile_constraint("json_schema", Sampling(json_schema=SCHEMA).json_schema, tokenizer, vocab),
                      vocab)
    text = tokenizer('{"ok": true, "kind": "beta", "size": 2}', add_special_tokens=False)["input_ids"]
    matcher.advance(text[:committed])
    ids = torch.tensor(text[:committed] or [0])
    before = matcher.masks(Prefixes.of(ids, 0, [[]]))
    valid = text[committed : committed + 3]  # a valid continuation, then the random ids
    tokens = torch.tensor(valid + draft, dtype=torch.long)
    parents = [i - 1 for i in range(len(valid))] + [(i % 2) - 1 if tree else len(valid) + i - 1
                                                    for i in range(len(draft))]
    parents = [min(p, i - 1) for i, p in enumerate(parents)]
    matcher.masks(Prefixes.of_draft(ids, 0, tokens, tree_paths(parents)))
    assert torch.equal(matcher.masks(Prefixes.of(ids, 0, [[]])), before)
    matcher.advance(valid)  # and it still accepts what follows the committed ids


def test_an_output_at_a_dead_end_of_the_grammar_is_refused_with_the_reason() -> None:
    """"ab" may start "abd", which no id of this vocabulary finishes: plain sampling and speculation
    both stop there with a ConstraintError that says so."""
    from specdec.processing.constraint import ConstraintError

    tokenizer = word_tokenizer(["ab", "c", "</s>"])
    model = tiny_model("llama", vocab_size=3, seed=0)
    sampling = Sampling(regex="abd|c", logit_bias={0: 50.0})  # greedy, "ab" first
    for drafter in (None, "ngram"):
        with pytest.raises(ConstraintError, match="allows no id of the tokenizer's vocabulary after the output"):
            specdec.generate(model, [0, 1, 0, 1], drafter=drafter, max_new_tokens=4, sampling=sampling,
                             tokenizer=tokenizer)


def test_a_drafter_row_the_grammar_leaves_no_id_is_its_raw_row() -> None:
    """A drafter whose vocabulary holds none of the ids the grammar allows gets its raw distribution
    (any q is exact; its draws meet p = 0), never a row of NaN; the target's row keeps its mask."""
    from specdec.processing.constraint import Matcher, compile_constraint

    tokenizer = word_tokenizer(["[", "1", "]", "</s>"])
    sampling = Sampling(temperature=1.0, regex=r"\[1\]")
    matcher = Matcher(compile_constraint("regex", sampling.regex, tokenizer, 4), 4)
    pipeline = Pipeline(sampling, 4, 2, matcher)
    ctx = specdec.DraftContext(torch.tensor([1, 2]), sampling, torch.Generator(), None, 4, pipeline=pipeline)
    logits = torch.tensor([[float("-inf"), 1.0, 2.0, 0.0]], dtype=torch.float64)  # "[" outside the drafter's ids
    torch.testing.assert_close(ctx.probabilities(logits), logits.softmax(-1))
    assert int(ctx.greedy_ids(logits)[0]) == 2
    target = pipeline.probabilities(logits.nan_to_num(neginf=-1.0), Prefixes.of(torch.tensor([1, 2]), 2, [[]]))
    assert target[0].tolist() == [1.0, 0.0, 0.0, 0.0]


def test_transformers_rows_of_the_bench_decode_under_the_same_settings() -> None:
    """The bench's transformers rows get every setting specdec applies, and neutral values for the
    rest, whatever the checkpoint's generation_config holds; settings transformers lacks are named."""
    from specdec.bench.peers import hf_generate, hf_missing

    model = tiny_model("llama", vocab_size=VOCAB, seed=0)
    model.generation_config.repetition_penalty = 1.5  # a checkpoint's own default, which specdec never applies
    model.generation_config.no_repeat_ngram_size = 2
    for sampling in (Sampling(), Sampling(repetition_penalty=2, logit_bias={3: 1.5}, bad_words_ids=[[9, 14], [7]],
                                          no_repeat_ngram_size=3, logits_processors=[EvenAfterOdd()])):
        tokens, _ = hf_generate(model, torch.tensor(PROMPT), "hf-plain", 4, 12, sampling)
        assert tokens == specdec.generate(model, PROMPT, max_new_tokens=12, sampling=sampling).tokens, sampling
    assert hf_missing(Sampling(presence_penalty=0.5, json_schema={"type": "string"})) == ["presence_penalty",
                                                                                         "json_schema"]
    assert hf_missing(Sampling(repetition_penalty=1.2), batch=True) == ["repetition_penalty"]
    assert hf_missing(Sampling(temperature=0.7, top_p=0.9, min_p=0.1), batch=True) == []
