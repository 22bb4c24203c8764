"""The retrieval datastore: its suffix array and lookup agree with brute force, builds are atomic,
and every broken input or file is refused with a message naming it; `specdec datastore build`."""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from specdec.cli import main
from specdec.data.datastore import DatastoreError, open_datastore, tokenizer_identity
from specdec.data.datastore_build import build_datastore, build_datastore_from_ids, suffix_array

WORDS = [f"w{i}" for i in range(64)]  # the tiny models' vocabulary of 64 ids


def word_tokenizer(words: list[str] = WORDS) -> PreTrainedTokenizerFast:
    """A whitespace word-level tokenizer: word i of `words` is id i (the first doubles as unknown)."""
    backend = Tokenizer(models.WordLevel({word: i for i, word in enumerate(words)}, unk_token=words[0]))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token=words[0])


def brute_suffix_array(keys: list[int]) -> list[int]:
    return sorted(range(len(keys)), key=lambda i: keys[i:])


@given(st.lists(st.integers(0, 3), max_size=120))
def test_suffix_array_sorts_the_suffixes(keys):
    assert suffix_array(np.array(keys, dtype=np.int64)).tolist() == brute_suffix_array(keys)


@pytest.mark.parametrize("pattern", ["constant", "period-3", "two-symbols"])
def test_suffix_array_sorts_long_repeats(pattern):
    n = 1500  # repeats as long as the array: every doubling round runs
    keys = {"constant": [5] * n, "period-3": [i % 3 for i in range(n)],
            "two-symbols": np.random.default_rng(0).integers(0, 2, n).tolist()}[pattern]
    assert suffix_array(np.array(keys, dtype=np.int64)).tolist() == brute_suffix_array(keys)


@pytest.mark.parametrize("pattern", ["period-3", "two-symbols"])
def test_suffix_array_without_packed_keys_sorts_the_same(pattern, monkeypatch):
    # past ~3e9 tokens one int64 cannot hold (rank, next rank): the rounds sort the pair instead
    import specdec.data.datastore_build as datastore

    n = 900
    keys = {"period-3": [i % 3 for i in range(n)],
            "two-symbols": np.random.default_rng(1).integers(0, 2, n).tolist()}[pattern]
    monkeypatch.setattr(datastore, "PACKED_KEY_LIMIT", 0)
    assert suffix_array(np.array(keys, dtype=np.int64)).tolist() == brute_suffix_array(keys)


def brute_lookup(documents: list[list[int]], context: list[int], max_tokens: int, min_length: int,
                 max_length: int) -> tuple[int, Counter]:
    """The longest context suffix (max_length..min_length) with an occurrence that a token follows
    in its document, and the counts of its continuations (up to max_tokens, cut at the document end)."""
    for m in range(min(max_length, len(context)), min_length - 1, -1):
        pattern = context[len(context) - m :]
        found: Counter = Counter()
        for doc in documents:
            for start in range(len(doc) - m + 1):
                if doc[start : start + m] == pattern and start + m < len(doc):
                    found[tuple(doc[start + m : start + m + max_tokens])] += 1
        if found:
            return m, found
    return 0, Counter()


documents_strategy = st.lists(st.lists(st.integers(0, 2), max_size=30), min_size=1, max_size=6).filter(
    lambda docs: any(docs))


@given(documents=documents_strategy, context=st.lists(st.integers(0, 2), max_size=8),
       max_tokens=st.integers(1, 4), lengths=st.tuples(st.integers(1, 3), st.integers(0, 4)))
def test_lookup_matches_brute_force(documents, context, max_tokens, lengths):
    min_length, max_length = lengths[0], lengths[0] + lengths[1]
    with tempfile.TemporaryDirectory() as directory:
        store = open_datastore(build_datastore_from_ids(documents, Path(directory) / "ds", vocab_size=3))
        found = store.continuations(context, max_tokens, 10**6, min_length, max_length)
        _, expected = brute_lookup(documents, context, max_tokens, min_length, max_length)
        assert dict(found) == dict(expected), (documents, context)
        counts = [count for _, count in found]
        assert counts == sorted(counts, reverse=True), "not most frequent first"
        occurs = [m for m in range(min_length, min(max_length, len(context)) + 1)
                  if any(doc[s : s + m] == context[len(context) - m :] for doc in documents for s in range(len(doc)))]
        assert store.longest_match(context, min_length, max_length) == max(occurs, default=0)


@given(continuations=st.lists(st.tuples(st.integers(0, 1), st.integers(0, 2)), min_size=8, max_size=80),
       picks=st.integers(1, 80))
def test_sampled_occurrences_count_each_continuation_in_proportion(continuations, picks):
    """With more occurrences than picks, a continuation filling b of R occurrences is counted
    b * picks / R times, give or take less than one (a stratified sample of the range)."""
    documents = [[4, 5, a, b] for a, b in continuations]  # the pattern [4, 5] R times
    with tempfile.TemporaryDirectory() as directory:
        store = open_datastore(build_datastore_from_ids(documents, Path(directory) / "ds", vocab_size=6))
        found = dict(store.continuations([4, 5], 2, picks, 2, 2))
    true = Counter(continuations)
    total = len(continuations)
    assert sum(found.values()) == min(picks, total)
    for continuation, count in true.items():
        assert abs(found.get(continuation, 0) - count * min(picks, total) / total) < 1, (continuation, found, true)


def test_matches_never_cross_a_document_boundary(tmp_path):
    store = open_datastore(build_datastore_from_ids([[1, 2], [3, 4, 1, 2, 5]], tmp_path / "ds", vocab_size=8))
    assert store.longest_match([1, 2, 3], 1, 3) == 1  # "2 3" spans the boundary: only "3" matches
    assert store.continuations([0, 2], 3, 8, 1, 2) == [((5,), 1)]  # the first document's "2" ends it


def test_build_from_files_and_texts_records_ids_and_identity(tmp_path):
    tokenizer = word_tokenizer()
    first = tmp_path / "a.txt"
    first.write_text("w1 w2 w3\nw4 w1 w2")
    out = build_datastore([first, "w9 w8 w1 w2 w7"], tokenizer, tmp_path / "ds")
    store = open_datastore(out)
    separator = store.separator
    assert store.tokens.tolist() == [1, 2, 3, 4, 1, 2, separator, 9, 8, 1, 2, 7, separator]
    assert store.tokens.dtype == np.dtype("<u2") and store.suffixes.dtype == np.dtype("<i4")
    manifest = json.loads((out / "datastore.json").read_text())
    assert manifest["tokenizer"] == tokenizer_identity(tokenizer)
    assert manifest["sources"] == [str(first)] and manifest["num_documents"] == 2
    assert manifest["num_suffixes"] == 11 and isinstance(store.tokens, np.ndarray)
    assert isinstance(store.tokens.base, np.memmap), "tokens are memory-mapped"
    assert store.continuations([5, 1, 2], 2, 8, 1, 2) == [((3, 4), 1), ((7,), 1)]


def test_empty_corpus_is_refused_naming_the_file(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n")
    with pytest.raises(DatastoreError, match=r"empty\.txt.*no tokens"):
        build_datastore([empty], word_tokenizer(), tmp_path / "ds")
    with pytest.raises(DatastoreError, match="no tokens"):
        build_datastore_from_ids([[], []], tmp_path / "ds", vocab_size=4)
    assert not (tmp_path / "ds").exists()


def test_missing_input_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        build_datastore([tmp_path / "missing.txt"], word_tokenizer(), tmp_path / "ds")


def test_ids_outside_the_vocabulary_are_refused(tmp_path):
    with pytest.raises(DatastoreError, match="document 1 .* id 9"):
        build_datastore_from_ids([[1, 2], [3, 9]], tmp_path / "ds", vocab_size=8)


@pytest.fixture
def built(tmp_path: Path) -> Path:
    return build_datastore_from_ids([[1, 2, 3, 1, 2, 4], [2, 3]], tmp_path / "ds", vocab_size=8)


@pytest.mark.parametrize("damage", ["not json", "format", "version", "counts", "separator", "no files"])
def test_a_corrupt_manifest_is_refused_naming_it(built, damage):
    path = built / "datastore.json"
    manifest = json.loads(path.read_text())
    if damage == "not json":
        path.write_text("{ truncated")
    else:
        manifest.update({"format": {"format": "other"}, "version": {"version": 99}, "counts": {"num_suffixes": 3},
                         "separator": {"separator": 7}, "no files": {"files": {}}}[damage])
        path.write_text(json.dumps(manifest))
    with pytest.raises(DatastoreError, match=r"datastore\.json"):
        open_datastore(built)


def test_a_checksum_mismatch_names_the_file(built):
    path = built / "suffixes.bin"
    data = bytearray(path.read_bytes())
    data[0] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(DatastoreError, match=r"suffixes\.bin.*SHA-256"):
        open_datastore(built)
    open_datastore(built, verify=False)  # sizes still agree


def test_a_truncated_file_names_it(built):
    path = built / "tokens.bin"
    path.write_bytes(path.read_bytes()[:-2])
    with pytest.raises(DatastoreError, match=r"tokens\.bin.*truncated"):
        open_datastore(built, verify=False)


def test_a_missing_datastore_says_how_to_build_one(tmp_path):
    with pytest.raises(FileNotFoundError, match="specdec datastore build"):
        open_datastore(tmp_path / "nowhere")


def test_another_tokenizer_is_refused_naming_the_datastore(tmp_path):
    store = open_datastore(build_datastore(["w1 w2"], word_tokenizer(), tmp_path / "ds"))
    store.check_tokenizer(word_tokenizer())
    with pytest.raises(DatastoreError, match=r"datastore\.json.*64 ids.*60 ids"):
        store.check_tokenizer(word_tokenizer(WORDS[:60]))
    with pytest.raises(DatastoreError, match="fingerprint"):  # same size, other vocabulary
        store.check_tokenizer(word_tokenizer(WORDS[::-1]))


def test_vocabulary_sizes_are_checked_against_the_target(tmp_path):
    store = open_datastore(build_datastore_from_ids([[1, 2]], tmp_path / "ds", vocab_size=32000))
    store.check_vocab(32000)
    store.check_vocab(32064)  # an LM head padded past the tokenizer
    with pytest.raises(DatastoreError, match=r"datastore\.json.*32000 ids.*LM head has 30000"):
        store.check_vocab(30000)
    with pytest.raises(DatastoreError, match="far fewer than the target's 151936"):
        store.check_vocab(151936)
    store.check_vocab(60000, tokenizer_checked=True)  # a matching fingerprint vouches for a padded head
    with pytest.raises(DatastoreError, match="uint16 ids with separator 65535, but the target's LM head has 151936"):
        store.check_vocab(151936, tokenizer_checked=True)  # its ids could reach the separator


def test_a_failing_build_leaves_nothing_behind(tmp_path, monkeypatch):
    from specdec.data import datastore_build

    def broken(path: Path, data: dict) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(datastore_build, "write_json", broken)
    with pytest.raises(OSError, match="disk full"):
        build_datastore(["w1 w2 w3"], word_tokenizer(), tmp_path / "ds")
    assert list(tmp_path.iterdir()) == [], "a half-written datastore or staging directory remains"


def test_a_non_empty_out_is_refused_and_left_alone(tmp_path):
    out = tmp_path / "ds"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not empty"):
        build_datastore(["w1 w2"], word_tokenizer(), out)
    assert [p.name for p in out.iterdir()] == ["keep.txt"]


def test_cli_builds_a_datastore_and_reports_it(tmp_path, capsys):
    tokenizer_dir = tmp_path / "tokenizer"
    word_tokenizer().save_pretrained(tokenizer_dir)
    files = [tmp_path / "a.txt", tmp_path / "b.txt"]
    files[0].write_text("w1 w2 w3 w4")
    files[1].write_text("w5 w1 w2 w6")
    out = tmp_path / "ds"
    assert main(["datastore", "build", *map(str, files), "--tokenizer", str(tokenizer_dir), "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert f"wrote datastore {out}: 8 tokens in 2 documents from 2 files, vocab 64" in captured.out
    assert "tokenised 2 of 2 documents" in captured.err and "sorted 8 suffixes" in captured.err
    store = open_datastore(out)
    assert store.continuations([1, 2], 2, 8, 1, 2) == [((3, 4), 1), ((6,), 1)]
    assert main(["datastore", "build", str(files[0]), "--tokenizer", str(tokenizer_dir), "--out", str(out)]) == 2
    assert "not empty" in capsys.readouterr().err
    assert main(["datastore", "build", str(tmp_path / "gone.txt"), "--tokenizer", str(tokenizer_dir),
                 "--out", str(tmp_path / "other")]) == 2
    assert "gone.txt" in capsys.readouterr().err and not (tmp_path / "other").exists()
