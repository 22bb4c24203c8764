"""`draft-model` across tokenizers (TLI and SLEM, Timor et al. 2025): greedy parity on four
architectures with a draft model of another architecture and another tokenizer, a twin on a
permuted vocabulary that the verifier accepts, trees, the compiled engine, batches, the law of
the outputs at temperature 0.8 (chi-square, including target tokens the draft tokenizer cannot
spell), and the errors."""

from __future__ import annotations

import copy
import functools
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedModel, PreTrainedTokenizerFast

import specdec
from specdec import Sampling
from specdec.drafters import DraftModelDrafter
from specdec.verifier import DraftError
from test_lossless_statistical import ALPHA, chi_square_p_value, exact_distribution
from tiny import ARCHITECTURES, assert_greedy_matches_up_to_near_ties, hf_greedy, tiny_model
from tokenizers_for_tests import byte_level_tokenizer, metaspace_tokenizer

NEW_TOKENS = 24
TEXT = "def parse(line):\n    return [int(x) for x in line.split(',')]  # naïve, but fine\n"


@functools.lru_cache(maxsize=None)
def _tokenizers() -> tuple[PreTrainedTokenizerFast, PreTrainedTokenizerFast]:
    """The target's byte-level BPE and the draft model's metaspace BPE with byte fallback: other
    merges, other special tokens (`<|endoftext|>` against `<s>`, `</s>`, `<unk>`)."""
    import tempfile

    directory = Path(tempfile.mkdtemp(prefix="cross-vocab-"))
    return byte_level_tokenizer(directory / "target"), metaspace_tokenizer(directory / "draft")


@functools.lru_cache(maxsize=None)
def _target(arch: str) -> PreTrainedModel:
    target_tokenizer, _ = _tokenizers()
    return tiny_model(arch, vocab_size=len(target_tokenizer) + 3, seed=0)  # three padding rows


@functools.lru_cache(maxsize=None)
def _draft(arch: str) -> PreTrainedModel:
    """A smaller model of the next architecture in the list, on the draft tokenizer."""
    other = ARCHITECTURES[(ARCHITECTURES.index(arch) + 1) % len(ARCHITECTURES)]
    _, draft_tokenizer = _tokenizers()
    return tiny_model(other, vocab_size=len(draft_tokenizer), seed=1, layers=1)


def _prompt() -> list[int]:
    target_tokenizer, _ = _tokenizers()
    return target_tokenizer.encode(TEXT, add_special_tokens=False)


@pytest.mark.parametrize("translate", ["tli", "slem"])
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_greedy_output_equals_transformers_across_tokenizers(arch: str, translate: str) -> None:
    target_tokenizer, draft_tokenizer = _tokenizers()
    drafter = DraftModelDrafter(_draft(arch), tokenizer=draft_tokenizer, translate=translate)
    ours = specdec.generate(_target(arch), _prompt(), drafter=drafter, num_draft_tokens=3, max_new_tokens=NEW_TOKENS,
                            tokenizer=target_tokenizer)
    assert ours.stats.drafted > 0, "the draft model drafted nothing"
    assert_greedy_matches_up_to_near_ties(_target(arch), _prompt(), ours.tokens,
                                          hf_greedy(_target(arch), _prompt(), NEW_TOKENS))


# --- a twin of the target on a permuted vocabulary: the translation is what makes it agree -----

def _permuted_twin() -> tuple[PreTrainedModel, PreTrainedModel, PreTrainedTokenizerFast, PreTrainedTokenizerFast]:
    """The llama target, and its copy on a tokenizer whose ids are the target's in another order
    (its merges the same, its special tokens `<s>`/`</s>` in place of `<|endoftext|>`): the same
    distribution over text, so TLI and SLEM should be accepted most of the time."""
    target_tokenizer, _ = _tokenizers()
    target = tiny_model("llama", vocab_size=len(target_tokenizer), seed=3, layers=2)
    full = target_tokenizer.get_vocab()
    pieces = {token: i for token, i in full.items() if token != "<|endoftext|>"}
    order = sorted(pieces, key=lambda token: (len(token), token), reverse=True)  # another id order
    draft_vocab = {"<s>": 0, "</s>": 1, **{token: i + 2 for i, token in enumerate(order)}}
    merges = [tuple(line.split(" ")) for line in _merges(target_tokenizer)]
    backend = Tokenizer(models.BPE(vocab=draft_vocab, merges=merges))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    draft_tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>")
    draft = tiny_model("llama", vocab_size=len(draft_vocab), seed=3, layers=2)
    shared = {name: tensor for name, tensor in target.state_dict().items()
              if name not in ("model.embed_tokens.weight", "lm_head.weight")}
    draft.load_state_dict(shared, strict=False)
    end = full["<|endoftext|>"]
    rows = torch.tensor([end, end, *(pieces[token] for token in order)])  # draft id -> target id
    with torch.no_grad():
        draft.get_input_embeddings().weight.copy_(target.get_input_embeddings().weight[rows])
        draft.get_output_embeddings().weight.copy_(target.get_output_embeddings().weight[rows])
    return target, draft, target_tokenizer, draft_tokenizer


def _merges(tokenizer: PreTrainedTokenizerFast) -> list[str]:
    import json

    merges = json.loads(tokenizer.backend_tokenizer.to_str())["model"]["merges"]
    return [" ".join(m) if isinstance(m, list) else m for m in merges]


@functools.lru_cache(maxsize=None)
def _twin() -> tuple[PreTrainedModel, PreTrainedModel, PreTrainedTokenizerFast, PreTrainedTokenizerFast]:
    return _permuted_twin()


@pytest.mark.parametrize("translate", ["tli", "slem"])
def test_a_twin_on_a_permuted_vocabulary_is_accepted_and_exact(translate: str) -> None:
    target, draft, target_tokenizer, draft_tokenizer = _twin()
    before = {name: tensor.clone() for name, tensor in draft.state_dict().items()}
    vocab_before = draft_tokenizer.get_vocab()
    drafter = DraftModelDrafter(draft, tokenizer=draft_tokenizer, translate=translate)
    ours = specdec.generate(target, _prompt(), drafter=drafter, num_draft_tokens=4, max_new_tokens=NEW_TOKENS,
                            tokenizer=target_tokenizer)
    assert_greedy_matches_up_to_near_ties(target, _prompt(), ours.tokens, hf_greedy(target, _prompt(), NEW_TOKENS))
    # TLI carries the committed ids id by id, so the twin sees what the target saw and agrees with it;
    # SLEM carries text in canonical ids, where a random target's choices are not canonical: it
    # agrees less, but it must agree somewhere
    wanted = ours.stats.drafted // 2 if translate == "tli" else 1
    assert ours.stats.accepted >= wanted, (
        f"{translate}: the twin's drafts were accepted {ours.stats.accepted} times of {ours.stats.drafted}: the "
        "translation loses the draft")
    # neither the draft model nor its tokenizer changed
    assert all(torch.equal(before[name], tensor) for name, tensor in draft.state_dict().items())
    assert draft_tokenizer.get_vocab() == vocab_before and draft.get_output_embeddings().weight.shape[0] == \
        len(draft_tokenizer)


def test_tli_trees_are_exact_and_accepted() -> None:
    target, draft, target_tokenizer, draft_tokenizer = _twin()
    drafter = DraftModelDrafter(draft, tokenizer=draft_tokenizer, translate="tli", tree=True, top_k=3,
                                total_tokens=9)
    ours = specdec.generate(target, _prompt(), drafter=drafter, num_draft_tokens=4, max_new_tokens=NEW_TOKENS,
                            tokenizer=target_tokenizer)
    assert_greedy_matches_up_to_near_ties(target, _prompt(), ours.tokens, hf_greedy(target, _prompt(), NEW_TOKENS))
    assert ours.stats.accepted > 0


def test_slem_refuses_trees() -> None:
    target, draft, target_tokenizer, draft_tokenizer = _twin()
    drafter = DraftModelDrafter(draft, tokenizer=draft_tokenizer, translate="slem", tree=True)
    with pytest.raises(DraftError, match="TLI only"):
        specdec.generate(target, _prompt(), drafter=drafter, max_new_tokens=4, tokenizer=target_tokenizer)


@pytest.mark.parametrize("translate", ["tli", "slem"])
@pytest.mark.usefixtures("strict_compile")
def test_compiled_decoding_equals_eager_across_tokenizers(translate: str) -> None:
    target, draft, target_tokenizer, draft_tokenizer = _twin()
    sampling = Sampling(temperature=0.8)
    runs = []
    for compile in (False, True):
        drafter = DraftModelDrafter(draft, tokenizer=draft_tokenizer, translate=translate)
        runs.append(specdec.generate(target, _prompt(), drafter=drafter, num_draft_tokens=4,
                                     max_new_tokens=NEW_TOKENS, sampling=sampling, seed=7, compile=compile,
                                     tokenizer=target_tokenizer))
    assert runs[0].tokens == runs[1].tokens
    assert runs[0].stats.accepted == runs[1].stats.accepted


def test_each_row_of_a_batch_keeps_its_own_alignment() -> None:
    target, draft, target_tokenizer, draft_tokenizer = _twin()
    prompts = [_prompt(), target_tokenizer.encode("class Stack:\n    def push(self, item):", add_special_tokens=False)]
    drafter = DraftModelDrafter(draft, tokenizer=draft_tokenizer, translate="tli")
    batch = specdec.generate_batch(target, prompts, drafter=drafter, num_draft_tokens=3, max_new_tokens=NEW_TOKENS,
                                   tokenizer=target_tokenizer)
    for prompt, row in zip(prompts, batch):
        assert row.tokens == hf_greedy(target, prompt, NEW_TOKENS)
    assert sum(row.stats.accepted for row in batch) > 0


# --- the law at temperature 0.8, on vocabularies small enough to enumerate ----------------------

VOCAB = 5  # the target's ids: a, b, c, ab, </s>
PROMPT_TEXT = "abcab"
LENGTH = 3
RUNS = 800


def _small_tokenizers() -> tuple[PreTrainedTokenizerFast, PreTrainedTokenizerFast]:
    """Target: byte-level BPE over a, b, c with the merge a+b. Draft: metaspace BPE over a, b with
    the merge b+a, `<unk>` for what it cannot spell (c), `<s>`/`</s>`."""
    target = Tokenizer(models.BPE(vocab={"a": 0, "b": 1, "c": 2, "ab": 3, "</s>": 4}, merges=[("a", "b")]))
    target.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    target.decoder = decoders.ByteLevel()
    draft = Tokenizer(models.BPE(vocab={"<unk>": 0, "<s>": 1, "</s>": 2, "a": 3, "b": 4, "ba": 5},
                                 merges=[("b", "a")], unk_token="<unk>"))
    draft.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never")
    draft.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="never")
    return (PreTrainedTokenizerFast(tokenizer_object=target, eos_token="</s>"),
            PreTrainedTokenizerFast(tokenizer_object=draft, bos_token="<s>", eos_token="</s>", unk_token="<unk>"))


@pytest.fixture(scope="module")
def small() -> tuple[PreTrainedModel, PreTrainedModel, PreTrainedTokenizerFast, PreTrainedTokenizerFast]:
    target_tokenizer, draft_tokenizer = _small_tokenizers()
    target = tiny_model(vocab_size=VOCAB, seed=0, layers=1, hidden=16, head_scale=8.0)
    draft = tiny_model("qwen2", vocab_size=len(draft_tokenizer), seed=1, layers=1, hidden=16, head_scale=4.0)
    return target, draft, target_tokenizer, draft_tokenizer


@pytest.mark.parametrize("translate", ["tli", "slem"])
def test_outputs_follow_plain_sampling_at_temperature_0_8(small, translate: str) -> None:
    target, draft, target_tokenizer, draft_tokenizer = small
    prompt = target_tokenizer.encode(PROMPT_TEXT, add_special_tokens=False)
    sampling = Sampling(temperature=0.8)
    drafter = DraftModelDrafter(draft, tokenizer=draft_tokenizer, translate=translate)
    outcomes: Counter[tuple[int, ...]] = Counter()
    drafted = accepted = 0
    for seed in range(RUNS):
        result = specdec.generate(target, prompt, drafter=drafter, num_draft_tokens=3, max_new_tokens=LENGTH,
                                  sampling=sampling, seed=seed, tokenizer=target_tokenizer)
        outcomes[tuple(result.tokens)] += 1
        drafted += result.stats.drafted
        accepted += result.stats.accepted
    assert drafted > RUNS and accepted > 0, f"{translate}: {drafted} drafted, {accepted} accepted: nothing tested"
    counts = np.zeros(VOCAB**LENGTH, dtype=np.int64)
    for (x1, x2, x3), count in outcomes.items():
        counts[(x1 * VOCAB + x2) * VOCAB + x3] = count
    p_value = chi_square_p_value(counts, exact_distribution(target, prompt, sampling))
    assert p_value >= ALPHA, f"{translate} deviates from plain sampling: p = {p_value:.3g}"


# --- errors ------------------------------------------------------------------------------------

def test_another_vocabulary_without_tokenizers_is_refused_with_the_reason() -> None:
    target_tokenizer, draft_tokenizer = _tokenizers()
    drafter = DraftModelDrafter(_draft("llama"))
    with pytest.raises(DraftError, match="needs both tokenizers, and the target's"):
        specdec.generate(_target("llama"), _prompt(), drafter=drafter, max_new_tokens=4)


def test_a_bad_translate_option_names_the_value() -> None:
    with pytest.raises(ValueError, match="translate must be one of auto, tli, slem, got 'word'"):
        DraftModelDrafter(_draft("llama"), translate="word")


def test_the_same_tokenizer_drafts_on_the_targets_ids(tmp_path: Path) -> None:
    """A draft model whose tokenizer is the target's drafts as it always did (no translation)."""
    target_tokenizer, _ = _tokenizers()
    drafter = DraftModelDrafter(tiny_model("qwen2", vocab_size=len(target_tokenizer) + 3, seed=2, layers=1),
                                tokenizer=copy.deepcopy(target_tokenizer))
    ours = specdec.generate(_target("llama"), _prompt(), drafter=drafter, max_new_tokens=8, tokenizer=target_tokenizer)
    assert drafter.translation is None
    assert ours.tokens == hf_greedy(_target("llama"), _prompt(), 8)


def test_auto_takes_tli_when_sampling_slem_when_greedy_and_slem_where_no_token_is_shared() -> None:
    """translate="auto" is SLEM greedy and TLI sampled; where the vocabularies share no text token
    (TLI cannot bridge them) it takes SLEM sampled too, while an explicit "tli" says why it cannot."""
    from specdec.drafters.draft_models.translation import resolve_translate
    from specdec.vocab.mapping import NoSharedTokens
    from tokenizers_for_tests import disjoint_tokenizers

    target_tokenizer, draft_tokenizer = _tokenizers()
    for sampling, mode in ((Sampling(), "slem"), (Sampling(temperature=0.8), "tli")):
        drafter = DraftModelDrafter(_draft("llama"), tokenizer=draft_tokenizer)
        specdec.generate(_target("llama"), _prompt(), drafter=drafter, max_new_tokens=4, sampling=sampling, seed=0,
                         tokenizer=target_tokenizer)
        assert drafter.translation is not None and drafter.translation.mode == mode, sampling
    assert resolve_translate("auto", Sampling(), tree=True) == "tli"  # trees cross by TLI alone
    letters, digits = disjoint_tokenizers()
    draft = tiny_model("llama", vocab_size=len(digits), seed=3, layers=1)
    assert DraftModelDrafter(draft)._translation_between("tli", digits, letters, len(letters)).mode == "slem"
    with pytest.raises(NoSharedTokens, match="share no token"):
        DraftModelDrafter(draft, translate="tli")._translation_between("tli", digits, letters, len(letters))
    with pytest.raises(ValueError, match="TLI only.*share no token: drop tree=true"):
        DraftModelDrafter(draft, tree=True)._translation_between("tli", digits, letters, len(letters))
