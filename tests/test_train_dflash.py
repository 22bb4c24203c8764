"""`specdec train dflash`: a DFlash drafter trained on a tiny Qwen3 target lowers its weighted loss,
saves in the published layout and decodes losslessly; each block sees exactly the context before
its anchor and itself; the slot weights are exp(-(j - 1) / γ); the mask id is one the tokenizer
never produces."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from torch.nn import functional as F

import specdec
from specdec import cli
from specdec.data.corpus import stdlib_corpus
from specdec.drafters.parallel.dflash_files import save_dflash
from specdec.training.dflash import (DFlashStudent, anchor_blocks, block_loss, default_gamma, position_weights,
                                     training_layer_ids)
from specdec.training.distill import distill
from specdec.training.mask_token import MASK_TOKEN, NEVER_IN_UTF8, choose_mask_token
from specdec.training.optim import Steps
from specdec.training.teacher import teacher_batch
from specdec.vocab import token_bytes

from tiny import tiny_model
from tokenizers_for_tests import (MULTILINGUAL, byte_level_tokenizer, disjoint_tokenizers, metaspace_tokenizer,
                                  padded_rows)

VOCAB, MASK, BLOCK = 64, 63, 8  # the text never holds the mask id


@pytest.fixture(scope="module")
def target():
    return tiny_model("qwen3", vocab_size=VOCAB, layers=4)


@pytest.fixture(scope="module")
def text() -> torch.Tensor:
    return torch.randint(0, MASK, (2000,), generator=torch.Generator().manual_seed(0))  # (N,)


def fresh(target, seed: int = 0, **options) -> DFlashStudent:
    return DFlashStudent.create(target, seed, 3e-3, mask_token_id=MASK, block_size=BLOCK, **options)


@pytest.fixture(scope="module")
def trained(target, text):
    """(student, its weighted loss on training windows before, after) 40 steps."""
    student = fresh(target)
    windows = text[: 4 * 40].view(4, 40)
    before = student.evaluate(teacher_batch(target, windows, student.hidden_layers))["weighted"]
    distill(target, [student], text, Steps(steps=40, batch=4, seq_len=40, lr=3e-3, seed=1), show_progress=False)
    after = student.evaluate(teacher_batch(target, windows, student.hidden_layers))["weighted"]
    return student, before, after


def test_training_lowers_the_weighted_loss_on_the_training_text(trained):
    _, before, after = trained
    assert after < before - 0.05, (before, after)


def test_the_saved_drafter_loads_and_decodes_losslessly(trained, target, tmp_path):
    student, _, _ = trained
    out = save_dflash(student.module, tmp_path / "dflash")
    config = json.loads((out / "config.json").read_text())
    assert config["dflash_config"] == {"mask_token_id": MASK, "target_layer_ids": [0, 2], "block_size": BLOCK}
    assert config["num_target_layers"] == 4 and config["hidden_size"] == 32
    prompt = [5, 9, 14, 22, 5, 9, 14]
    plain = specdec.generate(target, prompt, max_new_tokens=24).tokens
    drafter = specdec.make_drafter("dflash", path=str(out))
    result = specdec.generate(target, prompt, drafter=drafter, num_draft_tokens=BLOCK - 1, max_new_tokens=24)
    assert result.tokens == plain and result.stats.drafted > 0


# ---- the training mask -------------------------------------------------------------------------

def test_each_block_sees_the_context_before_its_anchor_and_itself_only(target, text):
    student = fresh(target, seed=3)
    head = student.module.eval()
    ids = text[:40]
    batch = teacher_batch(target, ids[None], student.hidden_layers)
    features = torch.cat([batch.layers[i] for i in student.hidden_layers], dim=-1)[0]  # (T, K·H)
    anchors = torch.tensor([3, 11, 20, 29])
    with torch.no_grad():
        batched = anchor_blocks(head, student.embed, features, ids, anchors)  # (R, B, H)
        for row, a in enumerate(anchors.tolist()):
            block_ids = torch.tensor([[ids[a].item()] + [MASK] * (BLOCK - 1)])
            embeds, positions = student.embed(block_ids), torch.arange(a, a + BLOCK)[None]
            every = torch.arange(len(ids))
            context = head.context_kv(features[None], every[None])  # the whole window, masked by visible
            alone = head.block(embeds, positions, [k for k, _ in context], [v for _, v in context], every[None] < a)
            prefix = head.context_kv(features[None, :a], every[None, :a])  # only what precedes a
            truncated = head.block(embeds, positions, [k for k, _ in prefix], [v for _, v in prefix],
                                   torch.ones(1, a, dtype=torch.bool))
            torch.testing.assert_close(batched[row], alone[0], rtol=1e-9, atol=1e-9)
            torch.testing.assert_close(batched[row], truncated[0], rtol=1e-9, atol=1e-9)
        changed = features.clone()
        changed[20:] += 5.0  # positions at and past the third anchor
        again = anchor_blocks(head, student.embed, changed, ids, anchors)
    torch.testing.assert_close(again[:2], batched[:2], rtol=1e-9, atol=1e-9)
    assert not torch.allclose(again[2:], batched[2:])  # the later anchors do see those positions


def test_slot_j_learns_the_targets_distribution_of_the_token_j_places_past_the_anchor(target, text):
    student = fresh(target)
    ids = text[:40]
    batch = teacher_batch(target, ids[None], student.hidden_layers)
    anchors = torch.tensor([1, 17, 32])  # 32 = T - B, the last where a block fits
    with torch.no_grad():
        logits, teacher, labels = student._blocks(batch, [anchors])
    assert logits.shape == (3, BLOCK - 1, VOCAB)
    for row, a in enumerate(anchors.tolist()):
        for j in range(1, BLOCK):
            assert labels[row, j - 1] == ids[a + j]
            torch.testing.assert_close(teacher[row, j - 1], batch.log_probs[0, a + j - 1])  # it predicts x_{a+j}


def test_anchors_are_drawn_where_a_block_fits_and_too_short_windows_are_refused(target, text):
    student = fresh(target, anchors=10)
    batch = teacher_batch(target, text[:80].view(2, 40), student.hidden_layers)
    drawn = student._drawn(batch)
    assert [len(a) for a in drawn] == [10, 10]
    assert all(len(set(a.tolist())) == 10 and a.min() >= 1 and a.max() <= 40 - BLOCK for a in drawn)
    short = teacher_batch(target, text[:16].view(2, 8), student.hidden_layers)
    with pytest.raises(ValueError, match=r"window of 8 tokens holds no block of 8.*--seq-len"):
        student.loss(short)


# ---- the loss's weights ------------------------------------------------------------------------

def test_slot_weights_decay_as_exp_minus_j_minus_one_over_gamma():
    weights = position_weights(16, 7.0)
    assert weights.shape == (15,) and weights[0] == 1.0
    assert all(math.isclose(weights[j - 1].item(), math.exp(-(j - 1) / 7)) for j in range(1, 16))
    assert (default_gamma(16), default_gamma(10), default_gamma(8)) == (7.0, 5.0, 4.0)


def test_the_loss_is_the_weighted_mean_of_each_slots_cross_entropy_from_the_target():
    generator = torch.Generator().manual_seed(2)
    logits = torch.randn(3, 5, 11, generator=generator, dtype=torch.float64)
    teacher = torch.log_softmax(torch.randn(3, 5, 11, generator=generator, dtype=torch.float64), -1)
    weights = position_weights(6, 2.0)
    per_slot = [F.cross_entropy(logits[:, j], teacher[:, j].exp()) for j in range(5)]  # soft targets
    expected = sum(w * ce for w, ce in zip(weights.tolist(), per_slot)) / weights.sum()
    torch.testing.assert_close(block_loss(logits, teacher, weights), expected)


def test_training_layers_are_distinct_and_before_the_last():
    assert training_layer_ids(36, 5) == (1, 9, 17, 25, 33)  # the z-lab Qwen3-8B drafters' layers
    assert training_layer_ids(4, 2) == (0, 2)  # the reference's (1, 1) repeats a layer
    assert training_layer_ids(2, 1) == (0,)  # the reference's middle layer would be the last
    with pytest.raises(ValueError, match="at least 2 layers"):
        training_layer_ids(1, 1)


# ---- the mask id -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("tokenizers")
    return byte_level_tokenizer(root / "byte"), metaspace_tokenizer(root / "meta")


def test_the_mask_is_the_first_padding_row_when_the_table_has_one(tokenizers):
    byte_level, _ = tokenizers
    assert choose_mask_token(byte_level, padded_rows(byte_level), "t") == len(byte_level)


def test_without_padding_rows_the_mask_is_a_byte_token_text_never_produces(tokenizers):
    text = MULTILINGUAL + "".join(chr(c) for c in range(32, 0x3000)) + "😀🎉 \x00\x7f"
    for tokenizer in tokenizers:
        mask = choose_mask_token(tokenizer, len(tokenizer), "t")
        stands_for = token_bytes(tokenizer)[mask]
        assert stands_for is not None and len(stands_for) == 1 and stands_for[0] in NEVER_IN_UTF8
        assert mask not in tokenizer(text, add_special_tokens=False)["input_ids"]


def test_a_tokenizers_own_mask_token_comes_first(tmp_path):
    tokenizer = byte_level_tokenizer(tmp_path / "byte")
    tokenizer.add_special_tokens({"additional_special_tokens": [MASK_TOKEN]})
    assert choose_mask_token(tokenizer, padded_rows(tokenizer), "t") == tokenizer.convert_tokens_to_ids(MASK_TOKEN)


def test_a_table_without_a_free_row_is_refused_naming_the_target_and_the_option(target):
    letters, _ = disjoint_tokenizers()
    with pytest.raises(ValueError, match=r"tiny-letters.*no row its tokenizer.*--mask-token-id"):
        choose_mask_token(letters, len(letters), "tiny-letters")
    with pytest.raises(ValueError, match=r"mask token id 64 is not a row.*0\.\.63.*--mask-token-id"):
        DFlashStudent.create(target, 0, mask_token_id=VOCAB)
    with pytest.raises(ValueError, match="tokenizer.*mask_token_id"):
        DFlashStudent.create(target, 0)


# ---- the command line --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def byte_target(tokenizers, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen3 whose embedding table is exactly its byte-level tokenizer's ids, as the zoo's are."""
    byte_level, _ = tokenizers
    directory = tmp_path_factory.mktemp("byte-target")
    tiny_model("qwen3", vocab_size=len(byte_level), layers=4, dtype=torch.float32).save_pretrained(directory)
    byte_level.save_pretrained(str(directory))
    return directory


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("data")
    small = [p for p in stdlib_corpus().train if 2_000 < p.stat().st_size < 4_000][:17]
    for i, path in enumerate(small):
        shutil.copy(path, directory / f"{i:02d}_{path.name}")
    return directory


def test_cli_trains_saves_and_the_drafter_decodes_losslessly(byte_target, data_dir, tokenizers, tmp_path, capsys):
    out = tmp_path / "dflash"
    argv = ["train", "dflash", "--target", str(byte_target), "--data", str(data_dir), "--out", str(out), "--steps",
            "3", "--batch-size", "2", "--seq-len", "24", "--block-size", "6", "--dflash-layers", "1", "--k", "5",
            "--dflash-heads", "3", "--no-progress"]
    assert cli.main(argv) == 0, capsys.readouterr()
    assert f"saved dflash to {out}" in capsys.readouterr().out
    config = json.loads((out / "config.json").read_text())
    byte_level, _ = tokenizers
    assert config["dflash_config"]["mask_token_id"] == choose_mask_token(byte_level, len(byte_level), "t")
    assert config["block_size"] == 6 and config["num_hidden_layers"] == 1
    # three heads, each with keys and values of its own, at the target's head size
    target_config = json.loads((byte_target / "config.json").read_text())
    assert config["num_attention_heads"] == config["num_key_value_heads"] == 3
    assert config["head_dim"] == target_config.get("head_dim", target_config["hidden_size"]
                                                   // target_config["num_attention_heads"])
    report = json.loads((out / "specdec_training.json").read_text())
    assert report["kind"] == "dflash" and 1.0 <= report["mean_accepted_length"] <= 6.0
    model = specdec.checkpoints.load_causal_lm(byte_target, dtype=torch.float64)
    prompt = byte_level("def parse(text):\n    ", add_special_tokens=False)["input_ids"]
    plain = specdec.generate(model, prompt, max_new_tokens=12).tokens
    drafter = specdec.make_drafter("dflash", path=str(out))
    assert specdec.generate(model, prompt, drafter=drafter, num_draft_tokens=5, max_new_tokens=12).tokens == plain


def test_cli_refuses_windows_shorter_than_a_block_in_one_line(byte_target, data_dir, tmp_path, capsys):
    argv = ["train", "dflash", "--target", str(byte_target), "--data", str(data_dir), "--out", str(tmp_path / "o"),
            "--steps", "1", "--seq-len", "8", "--no-progress"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--seq-len" in err and "block of 16" in err, err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("heads", [0, -2, True, 2.5])
def test_a_head_count_that_is_not_a_positive_integer_is_refused_naming_it(target, heads):
    with pytest.raises(ValueError, match=rf"dflash: heads must be a positive integer, got {heads!r}"):
        DFlashStudent.create(target, 0, mask_token_id=1, heads=heads)
