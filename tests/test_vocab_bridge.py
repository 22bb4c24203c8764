"""specdec.vocab: token bytes, the token intersection map (TLI) and re-tokenisation (SLEM) between a
byte-level and a metaspace tokenizer trained in-process (tests/tokenizers_for_tests.py)."""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from specdec.training.tokenizer import save_metaspace_tokenizer, train_metaspace_tokenizer
from specdec.vocab import (Retokenizer, build_map, byte_vocab, encode_bytes, mapping, retokenize_draft, token_bytes,
                           vocab_map)
from specdec.vocab.mapping import VocabMap, shareable_bytes
from specdec.vocab.retokenize import complete_text
from tokenizers_for_tests import (MULTILINGUAL, byte_level_tokenizer, disjoint_tokenizers, legacy_metaspace_tokenizer,
                                  metaspace_tokenizer, padded_rows, training_texts, wordpiece_tokenizer)

TEXTS = ["def add(a, b):\n    return a + b\n", "naïve café — 日本語 😀 €5", "  leading spaces\tand\ttabs  ",
         "Ελληνικά ǅ ﬁ 𝔘 \u200b zero-width", "x", " "]


@pytest.fixture(scope="module")
def byte_level(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return byte_level_tokenizer(tmp_path_factory.mktemp("byte-level"))


@pytest.fixture(scope="module")
def metaspace(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return metaspace_tokenizer(tmp_path_factory.mktemp("metaspace"))


@pytest.fixture(scope="module")
def legacy(metaspace: Any) -> Any:
    return legacy_metaspace_tokenizer(metaspace)


@pytest.fixture(params=["byte-level", "metaspace", "legacy-metaspace"])
def tokenizer(request: pytest.FixtureRequest, byte_level: Any, metaspace: Any, legacy: Any) -> Any:
    return {"byte-level": byte_level, "metaspace": metaspace, "legacy-metaspace": legacy}[request.param]


@pytest.fixture(params=["byte-level -> metaspace", "metaspace -> byte-level", "byte-level -> legacy-metaspace"])
def pair(request: pytest.FixtureRequest, byte_level: Any, metaspace: Any, legacy: Any) -> tuple[Any, Any]:
    named = {"byte-level": byte_level, "metaspace": metaspace, "legacy-metaspace": legacy}
    source, dest = request.param.split(" -> ")
    return named[source], named[dest]


def decoded_bytes(tokenizer: Any, ids: list[int]) -> bytes:
    """The text `ids` decode to, from token bytes: joined, less the dummy prefix decoding strips."""
    vocab = byte_vocab(tokenizer)
    data = vocab.text_bytes(ids)
    return data[1:] if vocab.stripped_spaces and data[:1] == b" " else data


# token bytes


@pytest.mark.parametrize("text", TEXTS + [MULTILINGUAL])
def test_token_bytes_of_an_encoding_spell_the_text(tokenizer: Any, text: str):
    ids = tokenizer.encode(text, add_special_tokens=False)
    table = token_bytes(tokenizer)
    joined, data = b"".join(table[i] for i in ids), text.encode("utf-8")
    prefix = joined[:len(joined) - len(data)]  # the dummy prefix: a space, always or unless one is there
    dummy = byte_vocab(tokenizer).stripped_spaces * b" "
    allowed = (b"", dummy) if text.startswith(" ") else (dummy,)
    assert joined.endswith(data) and prefix in allowed, (text, tokenizer.convert_ids_to_tokens(ids))
    assert decoded_bytes(tokenizer, ids).decode("utf-8") == tokenizer.decode(ids)


def test_byte_fallback_text_uses_byte_tokens(metaspace: Any):
    ids = metaspace.encode("ǅ𝔘", add_special_tokens=False)  # characters the tokenizer never saw
    tokens = metaspace.convert_ids_to_tokens(ids)
    assert tokens[1:] == [f"<0x{byte:02X}>" for byte in "ǅ𝔘".encode("utf-8")], tokens
    assert [token_bytes(metaspace)[i] for i in ids[1:]] == [bytes([byte]) for byte in "ǅ𝔘".encode("utf-8")]


def test_every_id_decodes_to_its_bytes(tokenizer: Any):
    vocab = byte_vocab(tokenizer)
    for i, data in enumerate(token_bytes(tokenizer)):
        if data is None:
            assert i in vocab.special_ids
            continue
        shown = data[vocab.stripped_spaces:] if data.startswith(b" ") else data  # a lone id starts a text
        assert tokenizer.decode([i]) == shown.decode("utf-8", errors="replace"), (i, tokenizer.convert_ids_to_tokens(i))


def test_specials_carry_no_text_and_added_tokens_their_content(tmp_path: Path):
    tokenizer = byte_level_tokenizer(tmp_path)
    tokenizer.add_tokens(["hello world", "<ctrl>"])
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|tool|>"]})
    table = token_bytes(tokenizer)
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in ("hello world", "<ctrl>", "<|tool|>")}
    assert table[ids["hello world"]] == b"hello world" and table[ids["<ctrl>"]] == b"<ctrl>"
    assert table[ids["<|tool|>"]] is None and table[tokenizer.eos_token_id] is None
    assert len(table) == len(tokenizer)


def test_unsupported_tokenizers_are_refused_with_the_reason():
    wordpiece = wordpiece_tokenizer()
    with pytest.raises(ValueError, match=rf"{type(wordpiece).__name__}.*decoder WordPiece.*byte-level.*metaspace"):
        token_bytes(wordpiece)

    class SlowTokenizer:
        def __len__(self) -> int:
            return 3

    with pytest.raises(ValueError, match=r"SlowTokenizer.*not a fast tokenizer.*byte-level.*metaspace"):
        token_bytes(SlowTokenizer())


# the map


def test_map_is_one_to_one_and_joins_equal_bytes(pair: tuple[Any, Any]):
    draft, target = pair
    found = build_map(draft, target, len(draft), len(target))
    draft_table, target_table = token_bytes(draft), token_bytes(target)
    assert found.shared > 150
    assert len(set(found.target_ids.tolist())) == found.shared == len(set(found.draft_ids.tolist()))
    assert torch.equal(found.draft_to_target[found.target_to_draft[found.target_ids]], found.target_ids)
    assert torch.equal(found.to_draft(found.target_ids), found.draft_ids)
    for d, t in zip(found.draft_ids.tolist(), found.target_ids.tolist()):
        if d == draft.eos_token_id:
            assert t == target.eos_token_id
        else:
            assert draft_table[d] == target_table[t] and draft_table[d]
    unshared = (found.draft_to_target < 0).nonzero().flatten().tolist()  # nothing shareable was left out
    draft_kept, target_kept = shareable_bytes(byte_vocab(draft)), set(shareable_bytes(byte_vocab(target)))
    assert not [d for d in unshared if d < len(draft_kept) and draft_kept[d] and draft_kept[d] in target_kept]


def test_specials_other_than_eos_stay_unshared(byte_level: Any, metaspace: Any):
    found = build_map(metaspace, byte_level, len(metaspace), len(byte_level))
    assert found.draft_to_target[metaspace.eos_token_id] == byte_level.eos_token_id
    assert found.draft_to_target[metaspace.bos_token_id] == -1 and found.draft_to_target[metaspace.unk_token_id] == -1


def test_byte_fallback_duplicates_keep_the_canonical_id(byte_level: Any, metaspace: Any):
    found = build_map(metaspace, byte_level, len(metaspace), len(byte_level))
    letter, fallback = metaspace.convert_tokens_to_ids(["e", "<0x65>"])  # both spell b"e"
    assert found.draft_to_target[letter] == byte_level.convert_tokens_to_ids("e")
    assert found.draft_to_target[fallback] == -1
    space, space_byte = metaspace.convert_tokens_to_ids(["\u2581", "<0x20>"])
    assert found.draft_to_target[space] == byte_level.convert_tokens_to_ids("\u0120")  # "Ġ": b" "
    assert found.draft_to_target[space_byte] == -1
    lone = metaspace.convert_tokens_to_ids("<0xE6>")  # no character token spells the byte alone: shared
    assert token_bytes(byte_level)[found.draft_to_target[lone]] == b"\xe6"


def test_a_duplicated_added_token_keeps_the_id_the_tokenizer_encodes(tmp_path: Path, metaspace: Any):
    tokenizer = byte_level_tokenizer(tmp_path)
    model_id, data = next((i, data) for i, data in enumerate(token_bytes(tokenizer))
                          if data and len(data) > 3 and data.startswith(b" ") and data.isascii())  # "Ġself"
    tokenizer.add_tokens([data.decode()])  # an added " self" spells the same bytes, and encoding prefers it
    added_id = len(tokenizer) - 1
    assert tokenizer.encode(data.decode(), add_special_tokens=False) == [added_id] and model_id != added_id
    kept = shareable_bytes(byte_vocab(tokenizer))
    assert kept[added_id] == data and kept[model_id] is None
    found = build_map(tokenizer, metaspace, len(tokenizer), len(metaspace))
    assert found.draft_to_target[model_id] == -1


def test_padded_vocabularies_have_unshared_padding_rows(byte_level: Any, metaspace: Any):
    draft_rows, target_rows = padded_rows(byte_level), padded_rows(metaspace)
    found = build_map(byte_level, metaspace, draft_rows, target_rows)
    assert found.draft_to_target.shape == (draft_rows,) and found.target_to_draft.shape == (target_rows,)
    assert bool((found.draft_to_target[len(byte_level):] == -1).all())
    assert bool((found.target_to_draft[len(metaspace):] == -1).all())
    assert found.logits_to_target(torch.zeros(2, draft_rows)).shape == (2, target_rows)


def test_a_vocabulary_smaller_than_its_tokenizer_is_refused(byte_level: Any, metaspace: Any):
    with pytest.raises(ValueError, match=rf"draft model has 300 output rows .* has {len(byte_level)} ids"):
        build_map(byte_level, metaspace, 300, len(metaspace))
    with pytest.raises(ValueError, match=rf"target model has 10 output rows .* has {len(metaspace)} ids"):
        vocab_map(byte_level, metaspace, len(byte_level), 10)


def test_an_empty_intersection_is_refused_with_the_alternative():
    letters, digits = disjoint_tokenizers()
    assert {data for data in token_bytes(letters) if data} and {data for data in token_bytes(digits) if data}
    name = type(letters).__name__
    with pytest.raises(ValueError, match=rf"{name}.*{name}.*share no token.*TLI.*translate='slem'"):
        build_map(letters, digits, len(letters), len(digits))


def test_a_map_that_is_not_one_to_one_is_refused(byte_level: Any, metaspace: Any, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(mapping, "shareable_bytes", lambda vocab: vocab.table)  # planted bug: keep duplicates
    with pytest.raises(ValueError, match=r"not one-to-one: draft ids \[\d+, \d+\] all pair with target id") as error:
        build_map(metaspace, byte_level, len(metaspace), len(byte_level))
    found = re.search(r"\[(\d+), (\d+)\] all pair with target id (\d+)", str(error.value))
    first, second, target = map(int, found.groups())
    assert token_bytes(metaspace)[first] == token_bytes(metaspace)[second] == token_bytes(byte_level)[target]
    assert {"<0x" in token for token in metaspace.convert_ids_to_tokens([first, second])} == {True, False}
    forged = VocabMap(torch.tensor([0, 0, -1]), torch.tensor([1, -1]), torch.tensor([0, 1]), torch.tensor([0, 0]))
    with pytest.raises(ValueError, match=r"draft ids \[0, 1\] all pair with target id 0"):
        forged.check()


def test_logits_to_target_is_the_restricted_renormalised_distribution(byte_level: Any, metaspace: Any):
    found = build_map(byte_level, metaspace, padded_rows(byte_level), padded_rows(metaspace))
    logits = torch.randn(2, 3, found.draft_vocab, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    q = torch.softmax(found.logits_to_target(logits), dim=-1)  # (2, 3, Vt)
    restricted = torch.softmax(logits[..., found.draft_ids], dim=-1)  # (2, 3, S)
    expected = torch.zeros(2, 3, found.target_vocab, dtype=torch.float64)
    expected[..., found.target_ids] = restricted
    assert torch.allclose(q, expected, atol=1e-12) and bool((q[..., found.target_to_draft < 0] == 0).all())
    compiled = torch.compile(found.logits_to_target, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(logits), found.logits_to_target(logits))


def test_the_map_moves_between_devices_unchanged(byte_level: Any, metaspace: Any):
    found = build_map(byte_level, metaspace, len(byte_level), len(metaspace))
    moved = found.to("cpu")
    assert all(torch.equal(getattr(found, name), getattr(moved, name))
               for name in ("draft_to_target", "target_to_draft", "draft_ids", "target_ids"))


# the cache


def test_the_cache_reuses_its_file_and_rebuilds_a_corrupt_one(byte_level: Any, metaspace: Any, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch):
    rows = (padded_rows(byte_level), padded_rows(metaspace))
    mapping.clear_memory_cache()
    built = vocab_map(byte_level, metaspace, *rows, cache_dir=tmp_path)
    [stored] = list(tmp_path.iterdir())
    assert stored.suffix == ".safetensors"
    assert vocab_map(byte_level, metaspace, *rows, cache_dir=tmp_path) is built  # from memory

    mapping.clear_memory_cache()
    monkeypatch.setattr(mapping, "_build", lambda *args: pytest.fail("rebuilt although the file was valid"))
    read = vocab_map(byte_level, metaspace, *rows, cache_dir=tmp_path)
    assert torch.equal(read.draft_to_target, built.draft_to_target) and torch.equal(read.target_ids, built.target_ids)
    monkeypatch.undo()

    for damage in (b"not a safetensors file", stored.read_bytes()[:-40]):
        stored.write_bytes(damage)
        mapping.clear_memory_cache()
        rebuilt = vocab_map(byte_level, metaspace, *rows, cache_dir=tmp_path)
        assert torch.equal(rebuilt.draft_to_target, built.draft_to_target)
        assert [p.name for p in tmp_path.iterdir()] == [stored.name]  # rewritten, no temporary file left
        assert mapping._read(stored, stored.stem, *rows) is not None


def test_a_consistent_looking_but_wrong_cache_file_is_rebuilt(byte_level: Any, metaspace: Any, tmp_path: Path):
    from safetensors.torch import load_file, save_file

    mapping.clear_memory_cache()
    built = vocab_map(byte_level, metaspace, len(byte_level), len(metaspace), cache_dir=tmp_path)
    [stored] = list(tmp_path.iterdir())
    tensors = load_file(stored)
    tensors["target_to_draft"][built.target_ids[0]] = -1  # one pair half gone
    save_file(tensors, stored, metadata={"format": mapping.FORMAT, "fingerprint": stored.stem})
    assert mapping._read(stored, stored.stem, len(byte_level), len(metaspace)) is None
    mapping.clear_memory_cache()
    rebuilt = vocab_map(byte_level, metaspace, len(byte_level), len(metaspace), cache_dir=tmp_path)
    assert torch.equal(rebuilt.target_to_draft, built.target_to_draft)


def test_the_default_cache_lives_under_xdg_cache_home(byte_level: Any, metaspace: Any, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    mapping.clear_memory_cache()
    vocab_map(metaspace, byte_level, len(metaspace), len(byte_level))
    assert len(list((tmp_path / "specdec" / "vocab-maps").glob("*.safetensors"))) == 1


# re-tokenisation

WORDS = ["def", "return", "self", "value", "x", "naïve", "café", "日本語", "😀", "€", "Grüße", "κείμενα", "(",
         ")", ":", ",", ".", "==", "0", "42", "1234567", "_name", "'s", "don't", "self.value", "[1]", "#", "<b>", "a<s"]
GAPS = [" "] * 8 + ["  ", "\n", "\n    ", "\t", "   ", "\n\n", " \n", ""]


def random_text(rng: random.Random) -> str:
    """Words and code tokens (multi-byte ones too) between single spaces, whitespace runs or nothing."""
    parts = [rng.choice(["", " ", "\n", "  "])]
    for _ in range(rng.randint(1, 40)):
        parts += [rng.choice(WORDS), rng.choice(GAPS)]
    return "".join(parts)


def expected_ids(source: Any, dest: Any, source_ids: list[int]) -> list[int]:
    """The destination's own encoding of the complete text of `source_ids` (a BOS for a BOS)."""
    with_bos = bool(source_ids) and source_ids[0] == source.bos_token_id
    text, _ = complete_text(decoded_bytes(source, source_ids[1:] if with_bos else source_ids))
    bos = [dest.bos_token_id] if with_bos and byte_vocab(dest).adds_bos else []
    return bos + dest.encode(text, add_special_tokens=False)


def test_retokenizer_equals_the_whole_text_encoding_at_every_step(pair: tuple[Any, Any]):
    source, dest = pair
    for seed in range(150):
        rng = random.Random(seed)
        text = random_text(rng)
        ids = source.encode(text)  # the metaspace source starts with <s>
        retokenizer = Retokenizer(source, dest, window=rng.choice([1, 3, 8]))
        done = rng.randint(0, len(ids))
        retokenizer.reset(ids[:done])
        assert retokenizer.ids == expected_ids(source, dest, ids[:done]), (seed, text, done)
        while done < len(ids):
            before, step = retokenizer.ids, rng.randint(1, 4)
            changed = retokenizer.extend(ids[done:done + step])
            done += step
            after = retokenizer.ids
            assert after == expected_ids(source, dest, ids[:done]), (seed, text, done)
            assert before[:changed] == after[:changed] and (changed == len(after) or changed == len(before)
                                                            or before[changed] != after[changed]), (seed, text)


def test_retokenizer_spells_the_text_even_without_restart_points(byte_level: Any, metaspace: Any):
    text = "".join(random.Random(1).choice("日本語のテキストabc") for _ in range(400))  # no space anywhere
    ids = metaspace.encode(text, add_special_tokens=False)
    retokenizer = Retokenizer(metaspace, byte_level, window=4, lookback=16)
    for start in range(0, len(ids), 3):
        retokenizer.extend(ids[start:start + 3])
    assert byte_vocab(byte_level).text_bytes(retokenizer.ids) + retokenizer.pending_bytes == text.encode("utf-8")


def test_incomplete_utf8_waits_for_its_last_byte(byte_level: Any, metaspace: Any):
    single = {data: i for i, data in enumerate(token_bytes(byte_level)) if data is not None and len(data) == 1}
    first, second, third = (single[bytes([byte])] for byte in "日".encode("utf-8"))
    retokenizer = Retokenizer(byte_level, metaspace)
    retokenizer.reset(byte_level.encode("abc", add_special_tokens=False))
    held = retokenizer.ids
    assert retokenizer.extend([first, second]) == len(held) and retokenizer.ids == held
    assert retokenizer.pending_bytes == "日".encode("utf-8")[:2]
    retokenizer.extend([third])
    assert retokenizer.pending_bytes == b"" and retokenizer.ids == metaspace.encode("abc日", add_special_tokens=False)
    retokenizer.extend([single[b"\xff"], single[b"!"]])  # invalid, not incomplete: replaced, never stuck
    assert retokenizer.ids == metaspace.encode("abc日\ufffd!", add_special_tokens=False)


def test_bos_maps_to_bos_once_and_specials_never_become_text_or_unk(byte_level: Any, metaspace: Any):
    source_eos = byte_level.eos_token_id  # "<|endoftext|>" is bos and eos of the byte-level tokenizer
    retokenizer = Retokenizer(byte_level, metaspace)
    retokenizer.reset([source_eos] + byte_level.encode("one two", add_special_tokens=False))
    for word in (" three", " four", " five"):
        retokenizer.extend(byte_level.encode(word, add_special_tokens=False))
    assert retokenizer.ids == metaspace.encode("one two three four five")  # one <s>, at the start
    assert retokenizer.ids.count(metaspace.bos_token_id) == 1
    retokenizer.extend([source_eos])
    assert retokenizer.ids[-1] == metaspace.eos_token_id

    back = Retokenizer(metaspace, byte_level)
    unk, bos, eos = metaspace.unk_token_id, metaspace.bos_token_id, metaspace.eos_token_id
    back.reset(metaspace.encode("one"))  # <s> at 0: the byte-level tokenizer adds no BOS, so nothing
    back.extend([unk, bos] + metaspace.encode(" two", add_special_tokens=False) + [eos])
    assert back.ids == byte_level.encode("one two", add_special_tokens=False) + [byte_level.eos_token_id]
    assert byte_vocab(byte_level).text_bytes(back.ids) == b"one two"


def test_encode_bytes_holds_back_an_incomplete_tail_and_adds_no_specials(metaspace: Any):
    data = "ab 日".encode("utf-8")
    ids, used = encode_bytes(metaspace, data[:-1])
    assert used == 3 and ids == metaspace.encode("ab ", add_special_tokens=False)
    assert metaspace.bos_token_id not in ids
    ids, used = encode_bytes(metaspace, b"a\xffb</s>")
    assert used == 7  # invalid, not incomplete: replaced, and "</s>" in a text is text
    assert byte_vocab(metaspace).text_bytes(ids) == " a\ufffdb</s>".encode("utf-8")
    assert not set(ids) & byte_vocab(metaspace).special_ids


def test_retokenize_draft_returns_the_ids_after_the_tail(pair: tuple[Any, Any]):
    _, target = pair
    committed_text, draft_text = "def value(self):\n    return self.value", " + 42 # café"
    committed = target.encode(committed_text)
    whole = target.encode(committed_text + draft_text)
    assert retokenize_draft(target, committed[-6:], draft_text.encode("utf-8")) == whole[len(committed):]


def test_retokenize_draft_continues_a_word_without_a_dummy_prefix(pair: tuple[Any, Any]):
    _, target = pair
    committed = target.encode("result = compute_val", add_special_tokens=False)
    ids = retokenize_draft(target, committed[-4:], "ue(x)".encode("utf-8"))
    assert byte_vocab(target).text_bytes(ids) == b"ue(x)"  # never " ue(x)"


def test_retokenize_draft_drops_an_incomplete_tail_and_never_emits_specials(metaspace: Any):
    committed = metaspace.encode("say hello")
    vocab = byte_vocab(metaspace)
    ids = retokenize_draft(metaspace, committed[-3:], " </s> and 日".encode("utf-8")[:-1])
    assert vocab.text_bytes(ids) == b" </s> and " and not set(ids) & vocab.special_ids
    assert retokenize_draft(metaspace, committed[-3:], "日".encode("utf-8")[:2]) == []


# the metaspace tokenizer


def test_metaspace_training_is_deterministic_and_loads_with_bos(tmp_path: Path):
    from transformers import AutoTokenizer

    texts = [*training_texts()[:2], MULTILINGUAL]
    first, second = train_metaspace_tokenizer(texts, 400), train_metaspace_tokenizer(texts, 400)
    assert first.to_str() == second.to_str()
    save_metaspace_tokenizer(first, tmp_path, max_length=128)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert loaded.convert_ids_to_tokens([0, 1, 2, 3, 258]) == ["<unk>", "<s>", "</s>", "<0x00>", "<0xFF>"]
    ids = loaded.encode("naïve ǅ text")
    assert ids[0] == loaded.bos_token_id and loaded.eos_token_id not in ids
    assert loaded.decode(ids, skip_special_tokens=True) == "naïve ǅ text"
    with pytest.raises(ValueError, match="vocab_size"):
        train_metaspace_tokenizer(texts, 260)
