"""GGUF checkpoints (`specdec.gguf`): a tiny random Llama written here as an F32 GGUF file with
its byte-level BPE tokenizer and a chat template in the metadata (no download, no big file) loads
through `load_causal_lm`/`load_tokenizer`, `--target` and the draft-model drafter with the
original's logits and ids, converts to a directory with `specdec convert`, and every way a file
can fail to load is named with the file and the fix before any weight is read."""

from __future__ import annotations

import json
import struct
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from transformers import PreTrainedModel

import specdec
from specdec.checkpoints import load_causal_lm, load_tokenizer, resolve_checkpoint
from specdec.cli import main
from specdec.gguf import (GGUFDependencyError, NotGGUFError, UnsupportedGGUFArchitecture, check_gguf, is_gguf,
                          supported_architectures)
from tiny import tiny_model
from tokenizers_for_tests import byte_level_tokenizer

TEXT = "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1)  # déjà vu"
TEMPLATE = "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"


@dataclass(frozen=True)
class Written:
    """A tiny model, its tokenizer, the GGUF file holding both and a directory holding both."""

    file: Path
    directory: Path
    model: PreTrainedModel
    tokenizer: Any


def _permuted(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's layout of a Llama q or k projection (rotary halves interleaved), which
    transformers undoes on load (convert_hf_to_gguf.py's LlamaModel.permute)."""
    halves = weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:])
    return halves.swapaxes(1, 2).reshape(weight.shape)


def write_gguf(path: Path, model: PreTrainedModel, tokenizer: Any) -> None:
    """`model` (a Llama) and `tokenizer` (a byte-level BPE) as an F32 GGUF file at `path`."""
    gguf = pytest.importorskip("gguf")
    config = model.config
    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    tokens = [""] * len(tokenizer)
    for token, index in {**spec["model"]["vocab"], **{a["content"]: a["id"] for a in spec["added_tokens"]}}.items():
        tokens[index] = token
    special = {added["id"] for added in spec["added_tokens"]}
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_rope_dimension_count(config.head_dim)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(len(tokens))
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]])
    writer.add_token_types([gguf.TokenType.CONTROL if index in special else gguf.TokenType.NORMAL
                            for index in range(len(tokens))])
    writer.add_bos_token_id(tokenizer.bos_token_id)
    writer.add_eos_token_id(tokenizer.eos_token_id)
    writer.add_chat_template(TEMPLATE)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, config.num_hidden_layers)
    for name, tensor in model.state_dict().items():
        module, suffix = name.rsplit(".", 1)
        gguf_name = f"{names.get_name(module)}.{suffix}"
        weight = tensor.detach().float().numpy()
        if gguf_name.endswith("attn_q.weight"):
            weight = _permuted(weight, config.num_attention_heads)
        elif gguf_name.endswith("attn_k.weight"):
            weight = _permuted(weight, config.num_key_value_heads)
        writer.add_tensor(gguf_name, np.ascontiguousarray(weight))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def header_only(path: Path, architecture: str) -> Path:
    """A GGUF file (version 3) with no tensor and one metadata key, general.architecture: enough
    for every check made before loading, written without the `gguf` package."""
    key, value = b"general.architecture", architecture.encode()
    string_type = 8  # GGUF_TYPE_STRING
    path.write_bytes(struct.pack("<4sIQQ", b"GGUF", 3, 0, 1) + struct.pack("<Q", len(key)) + key
                     + struct.pack("<IQ", string_type, len(value)) + value)
    return path


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Written:
    root = tmp_path_factory.mktemp("gguf")
    tokenizer = byte_level_tokenizer(root / "tokenizer", vocab_size=320)
    model = tiny_model("llama", vocab_size=len(tokenizer), seed=5, dtype=torch.float32, hidden=64)
    write_gguf(root / "tiny.gguf", model, tokenizer)
    model.save_pretrained(root / "directory")
    tokenizer.save_pretrained(root / "directory")
    return Written(root / "tiny.gguf", root / "directory", model, tokenizer)


def run(argv: list[str]) -> int:
    """main's exit status, whether it returns it or argparse raises SystemExit."""
    try:
        return main(argv)
    except SystemExit as exit_:
        return int(exit_.code or 0)


def logits(model: PreTrainedModel, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()  # (T, V)


# ---- loading -----------------------------------------------------------------------------------

def test_a_gguf_file_loads_with_the_logits_and_ids_of_the_model_it_was_written_from(written: Written) -> None:
    tokenizer = load_tokenizer(written.file)
    model = load_causal_lm(written.file)
    ids = written.tokenizer.encode(TEXT)
    assert tokenizer.encode(TEXT) == ids
    assert tokenizer.decode(ids) == written.tokenizer.decode(ids)
    assert tokenizer.chat_template == TEMPLATE, "the chat template comes from the GGUF metadata"
    assert model.dtype == torch.float32 and not model.training
    assert getattr(model, "hf_quantizer", None) is None, "the weights are dequantised: a plain float model"
    torch.testing.assert_close(logits(model, ids), logits(written.model, ids), rtol=0, atol=1e-5)


def test_a_gguf_file_loads_in_the_dtype_asked(written: Written) -> None:
    model = load_causal_lm(written.file, dtype=torch.bfloat16)
    assert {parameter.dtype for parameter in model.parameters()} == {torch.bfloat16}


def test_a_gguf_file_is_recognised_by_name_or_by_magic_and_resolves_to_itself(written: Written,
                                                                                tmp_path: Path) -> None:
    unnamed = tmp_path / "weights.bin"
    unnamed.write_bytes(written.file.read_bytes()[:4096])
    assert is_gguf(written.file) and is_gguf(unnamed) and is_gguf(tmp_path / "absent.gguf")
    assert not is_gguf(written.directory) and not is_gguf(written.directory / "config.json")
    assert resolve_checkpoint(written.file, "target") == written.file


def test_the_draft_model_drafter_loads_a_gguf_file_with_its_tokenizer(written: Written) -> None:
    drafter = specdec.make_drafter("draft-model", model=str(written.file))
    assert drafter.draft_tokenizer is not None
    assert drafter.draft_tokenizer.get_vocab() == written.tokenizer.get_vocab()
    ids = written.tokenizer.encode(TEXT)
    plain = specdec.generate(written.model, ids, max_new_tokens=12).tokens
    drafted = specdec.generate(written.model, ids, drafter=drafter, num_draft_tokens=3, max_new_tokens=12,
                               tokenizer=written.tokenizer)
    assert drafted.tokens == plain
    assert drafted.stats.acceptance_rate == 1.0, "the draft model is the target, so every draft is accepted"


# ---- the command line --------------------------------------------------------------------------

def test_generate_with_a_gguf_target_and_drafter_prints_what_the_directory_does(
        written: Written, capsys: pytest.CaptureFixture[str]) -> None:
    common = ["generate", "--max-new-tokens", "12", TEXT]
    assert run([*common, "--target", str(written.directory)]) == 0
    expected = capsys.readouterr().out.rsplit("stats:", 1)[0]
    assert run([*common, "--target", str(written.file), "--drafter", f"draft-model:model={written.file}"]) == 0
    assert capsys.readouterr().out.rsplit("stats:", 1)[0] == expected
    assert run([*common, "--target", str(written.file), "--chat"]) == 0, "the GGUF's chat template serves --chat"


def test_convert_writes_a_directory_with_the_same_logits_ids_and_chat_template(
        written: Written, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "converted"
    assert run(["convert", str(written.file), "--out", str(out)]) == 0
    line = capsys.readouterr().out.strip()
    parameters = sum(parameter.numel() for parameter in written.model.parameters())
    assert str(out) in line and f"{parameters:,} parameters in float32" in line
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {path.name for path in out.iterdir()}
    assert [path.name for path in tmp_path.iterdir()] == ["converted"], "no temporary directory is left behind"
    model, tokenizer = load_causal_lm(out), load_tokenizer(out)
    ids = written.tokenizer.encode(TEXT)
    assert tokenizer.encode(TEXT) == ids and tokenizer.chat_template == TEMPLATE
    torch.testing.assert_close(logits(model, ids), logits(written.model, ids), rtol=0, atol=1e-5)


def test_convert_writes_the_dtype_asked(written: Written, tmp_path: Path) -> None:
    assert run(["convert", str(written.file), "--out", str(tmp_path / "half"), "--dtype", "bfloat16"]) == 0
    assert load_causal_lm(tmp_path / "half").dtype == torch.bfloat16


def test_convert_refuses_a_directory_that_is_not_empty(written: Written, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "kept.txt").write_text("mine")
    assert run(["convert", str(written.file), "--out", str(tmp_path)]) == 2
    assert str(tmp_path) in capsys.readouterr().err
    assert [path.name for path in tmp_path.iterdir()] == ["kept.txt"]


# ---- errors --------------------------------------------------------------------------------------

def test_a_missing_gguf_file_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "absent.gguf"
    with pytest.raises(FileNotFoundError, match="absent.gguf"):
        load_causal_lm(missing)
    assert run(["generate", "--target", str(missing), "hello"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "absent.gguf" in err and "no GGUF file" in err
    assert run(["convert", str(missing), "--out", str(tmp_path / "out")]) == 2
    assert "absent.gguf" in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_a_file_without_the_gguf_magic_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fake = tmp_path / "fake.gguf"
    fake.write_text("not a model")
    with pytest.raises(NotGGUFError, match=r"fake\.gguf.*is not a GGUF file.*b'not '.*llama\.cpp"):
        load_tokenizer(fake)
    assert run(["generate", "--target", str(fake), "hello"]) == 2
    assert "fake.gguf' is not a GGUF file" in capsys.readouterr().err


def test_an_architecture_transformers_cannot_read_is_named_with_the_ones_it_can(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    file = header_only(tmp_path / "odd.gguf", "nosucharch")
    with pytest.raises(UnsupportedGGUFArchitecture, match=r"odd\.gguf.*'nosucharch'.*it reads .*llama"):
        load_causal_lm(file)
    assert "llama" in supported_architectures() and "general" not in supported_architectures()
    assert run(["generate", "--target", str(file), "hello"]) == 2
    assert "'nosucharch'" in capsys.readouterr().err


@pytest.mark.parametrize("package", ["gguf", "accelerate"])
def test_a_missing_package_is_named_with_the_pip_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str], package: str) -> None:
    file = header_only(tmp_path / "llama.gguf", "llama")
    monkeypatch.setitem(sys.modules, package, None)  # `import package` raises ImportError
    with pytest.raises(GGUFDependencyError, match=rf"llama\.gguf.*`{package}`.*pip install '{package}") as caught:
        check_gguf(file)
    assert isinstance(caught.value, ImportError) and isinstance(caught.value, ValueError)
    assert run(["generate", "--target", str(file), "hello"]) == 2
    assert f"pip install '{package}" in capsys.readouterr().err


def test_a_gguf_file_cannot_be_sharded_and_the_error_says_to_convert(written: Written,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match=r"tiny\.gguf.*tp=2.*specdec convert"):
        load_causal_lm(written.file, tp=2)
    assert run(["generate", "--target", str(written.file), "--tp", "2", "hello"]) == 2
    assert f"specdec convert {written.file} --out DIR" in capsys.readouterr().err
