"""The pieces of `specdec.training`: losses, schedule, windows, the tokenizer, and writing an
MTP module into single-file and sharded checkpoints."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.nn import functional as F

from specdec.drafters.feature_heads.mtp import load_mtp
from specdec.training.data import WindowSampler, encode_texts, evaluation_windows
from specdec.training.losses import soft_cross_entropy, top1_agreement
from specdec.training.mtp import create_mtp_head, write_mtp
from specdec.training.optim import Steps, learning_rate
from specdec.training.target import mtp_weight
from specdec.training.tokenizer import END_OF_TEXT, save_tokenizer, train_tokenizer


@given(st.integers(0, 2**31 - 1))
def test_soft_cross_entropy_is_kl_plus_teacher_entropy(seed: int):
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(3, 5, 7, generator=generator, dtype=torch.float64)
    teacher = F.log_softmax(torch.randn(3, 5, 7, generator=generator, dtype=torch.float64) * 3, dim=-1)
    kl = (teacher.exp() * (teacher - F.log_softmax(logits, -1))).sum(-1).mean()
    entropy = -(teacher.exp() * teacher).sum(-1).mean()
    assert torch.allclose(soft_cross_entropy(logits, teacher).double(), kl + entropy, atol=1e-5)
    assert soft_cross_entropy(teacher, teacher).item() == pytest.approx(entropy.item(), abs=1e-5)  # minimum at q = p


def test_top1_agreement_counts_equal_argmaxes():
    a = torch.tensor([[0.0, 1.0, 0.0], [2.0, 0.0, 0.0], [0.0, 0.0, 3.0], [1.0, 0.0, 0.0]])
    b = torch.tensor([[0.0, 5.0, 0.0], [0.0, 2.0, 0.0], [0.0, 0.0, 1.0], [0.0, 0.0, 9.0]])
    assert top1_agreement(a, b) == 0.5


def test_learning_rate_warms_up_then_decays_to_a_tenth():
    rates = [learning_rate(step, 100, 1.0) for step in range(100)]
    assert rates[0] == pytest.approx(0.1) and rates[9] == pytest.approx(1.0)
    assert all(b <= a + 1e-12 for a, b in zip(rates[9:], rates[10:]))
    assert rates[-1] == pytest.approx(0.1, abs=0.01) and min(rates) >= 0.1 - 1e-12


def test_mtp_weight_follows_the_deepseek_schedule():
    weights = [mtp_weight(step, 90) for step in range(90)]
    assert weights[:60] == [0.3] * 60 and weights[60:] == [0.1] * 30


@pytest.mark.parametrize("field, value", [("steps", 0), ("batch", -1), ("seq_len", 2), ("lr", 0.0)])
def test_steps_refuse_bad_values(field: str, value: float):
    kwargs = {"steps": 1, "batch": 1, "seq_len": 8, "lr": 1e-3, field: value}
    with pytest.raises(ValueError, match=field):
        Steps(**kwargs)


def test_window_sampler_is_reproducible_and_in_range():
    ids = torch.arange(1000)
    a, b = WindowSampler(ids, 16, seed=3), WindowSampler(ids, 16, seed=3)
    first, second = a(4), b(4)
    assert torch.equal(first, second) and first.shape == (4, 16)
    assert torch.equal(first[:, 1:] - first[:, :-1], torch.ones(4, 15, dtype=torch.long))  # contiguous windows
    with pytest.raises(ValueError, match="fewer than one window"):
        WindowSampler(torch.arange(10), 16, seed=0)


def test_evaluation_windows_are_disjoint_and_spread():
    windows = evaluation_windows(torch.arange(100), 10, 4)
    assert windows.shape == (4, 10) and len(set(windows.flatten().tolist())) == 40
    assert windows[-1, 0] >= 60


def test_tokenizer_is_deterministic_and_loads_with_autotokenizer(tmp_path: Path):
    from transformers import AutoTokenizer

    texts = ["def add(a, b):\n    return a + b\n" * 20, "class Point:\n    x: int = 0\n" * 20]
    first, second = train_tokenizer(texts, 300), train_tokenizer(texts, 300)
    assert first.to_str() == second.to_str()
    save_tokenizer(first, tmp_path, max_length=256)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    text = "def mul(a, b):\n    return a * b  # ünicode\n"
    assert loaded.decode(encode_texts(loaded, [text])[0]) == text
    assert loaded.eos_token == END_OF_TEXT and 257 < len(loaded) <= 300  # merges stop when pairs run out
    with pytest.raises(ValueError, match="vocab_size"):
        train_tokenizer(texts, 100)


def _tiny_qwen3(directory: Path, shards: bool) -> torch.nn.Module:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    model = Qwen3ForCausalLM(config)
    model.save_pretrained(directory, max_shard_size="20KB" if shards else "1GB")
    return model


def _files(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("shards", [False, True])
def test_write_mtp_adds_a_loadable_module_to_a_copy_and_leaves_the_model(tmp_path: Path, shards: bool):
    from specdec.checkpoints import load_causal_lm

    model = _tiny_qwen3(tmp_path / "target", shards)
    assert (tmp_path / "target" / "model.safetensors.index.json").is_file() == shards
    original = _files(tmp_path / "target")
    head = create_mtp_head(model.config, seed=1)
    assert write_mtp(head, tmp_path / "target", tmp_path / "once") == tmp_path / "once"
    write_mtp(head, tmp_path / "once", tmp_path / "twice")  # writing again replaces, never duplicates
    out = tmp_path / "twice"
    loaded = load_mtp(out)
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), head.state_dict().values()))
    reloaded = load_causal_lm(out)
    assert all(torch.equal(reloaded.state_dict()[k], v) for k, v in model.state_dict().items())
    assert json.loads((out / "config.json").read_text())["mtp_num_hidden_layers"] == 1
    if shards:
        weight_map = json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
        assert {name for key, name in weight_map.items() if key.startswith("mtp.")} == {"model-mtp.safetensors"}
    assert _files(tmp_path / "target") == original  # only read
    assert sorted(p.name for p in tmp_path.iterdir()) == ["once", "target", "twice"]  # no staging left behind
    with pytest.raises(FileExistsError, match="not empty"):
        write_mtp(head, tmp_path / "target", tmp_path / "target")  # never in place


@pytest.mark.parametrize("shards", [False, True])
def test_a_write_mtp_failing_midway_leaves_no_checkpoint_and_no_staging(tmp_path: Path, shards: bool,
                                                                        monkeypatch: pytest.MonkeyPatch):
    import specdec.training.mtp as mtp

    model = _tiny_qwen3(tmp_path / "target", shards)
    original = _files(tmp_path / "target")

    def full_disk(path: Path, data: dict) -> None:  # the weights are written by now, the index or config fails
        raise OSError(f"no space left to write {path.name}")

    monkeypatch.setattr(mtp, "write_json", full_disk)
    with pytest.raises(OSError, match="no space left"):
        write_mtp(create_mtp_head(model.config, seed=1), tmp_path / "target", tmp_path / "out")
    assert _files(tmp_path / "target") == original
    assert sorted(p.name for p in tmp_path.iterdir()) == ["target"]


def test_batched_feature_heads_match_their_one_row_calls():
    from transformers import Qwen3Config

    config = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    head = create_mtp_head(config, seed=2).double().eval()
    embeds, features = torch.randn(3, 6, 32, dtype=torch.float64), torch.randn(3, 6, 32, dtype=torch.float64)
    positions = torch.arange(6)
    batched = head(0, embeds, features, positions)[1]
    for b in range(3):
        assert torch.allclose(batched[b], head(0, embeds[b], features[b], positions)[1], atol=1e-10)
    assert not math.isnan(batched.sum().item())
