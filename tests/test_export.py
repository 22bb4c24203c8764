"""`specdec export`: each drafter written in the layout vLLM or SGLang loads reads back through
specdec's loaders with identical drafts, holds the layout written in `specdec.export.layouts`,
never overwrites a non-empty --out and never leaves a half-written export.

Tiny float64 checkpoints: Medusa heads and EAGLE-1 heads on a Llama target, a Qwen3-Next-layout
MTP module in a tiny Qwen3-Next (hybrid) target's safetensors.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open
from transformers import LlamaConfig, PreTrainedModel, Qwen3Config

from specdec.protocols import row_view
import specdec
from specdec.checkpoints import load_causal_lm
from specdec.cli import main
from specdec.drafters.feature_heads.eagle import EagleDrafter, EagleHead, save_eagle
from specdec.drafters.feature_heads.eagle3 import Eagle3Drafter
from specdec.drafters.feature_heads.eagle3_files import save_eagle3
from specdec.drafters.feature_heads.medusa import MedusaDrafter
from specdec.drafters.feature_heads.medusa_head import MedusaHeads
from specdec.drafters.feature_heads.medusa_files import save_medusa
from specdec.drafters.feature_heads.mtp import INDEX, MtpDrafter
from specdec.export import LAYOUTS, export, layout_for, mismatches, read_back

from test_eagle3 import random_eagle3
from test_hybrid import float64_kernels, tiny_hybrid  # noqa: F401  (the fixture makes the hybrid exact)
from test_mtp import mtp_tensors, tiny_deepseek, write_target
from tiny import tiny_model

VOCAB, HIDDEN = 64, 32
PROMPT = [5, 9, 14, 22, 5, 9, 14, 22, 5, 9, 14]
NEW = 16
DRAFTERS = {"medusa": MedusaDrafter, "eagle": EagleDrafter, "eagle3": Eagle3Drafter, "mtp": MtpDrafter}


class Recorder:
    """Wraps a drafter and keeps the tokens of every draft it proposed."""

    name = "recorder"
    uses_hidden_states = True

    def __init__(self, inner: Any) -> None:
        self.inner, self.drafts = row_view(inner), []

    def max_draft_nodes(self, k: int) -> int:
        return self.inner.max_draft_nodes(k)

    def prefill(self, ctx) -> None:
        self.inner.prefill(ctx)

    def propose(self, ctx, k):
        draft = self.inner.propose(ctx, k)
        self.drafts.append(draft.tokens.tolist())
        return draft

    def commit(self, ctx, num_accepted) -> None:
        self.inner.commit(ctx, num_accepted)

    def __getattr__(self, name: str) -> Any:  # hidden_layers, when the inner drafter declares it
        return getattr(self.inner, name)


def drafts_of(kind: str, path: Path, target: PreTrainedModel) -> tuple[list[int], list[list[int]]]:
    recorder = Recorder(DRAFTERS[kind](path))
    result = specdec.generate(target, PROMPT, drafter=recorder, num_draft_tokens=3, max_new_tokens=NEW)
    assert result.stats.drafted > 0
    return result.tokens, recorder.drafts


def medusa_checkpoint(directory: Path, seed: int = 0) -> Path:
    torch.manual_seed(seed)
    heads = MedusaHeads(3, 1, HIDDEN, VOCAB).double()
    with torch.no_grad():
        for parameter in heads.parameters():
            parameter.normal_(0.0, 0.5)
    save_medusa(heads, directory)
    return directory


def eagle_checkpoint(directory: Path, bias: bool, seed: int = 0, hidden: int = HIDDEN) -> Path:
    torch.manual_seed(seed)
    config = LlamaConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=1, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=hidden // 4, vocab_size=VOCAB,
                         architectures=["LlamaForCausalLM"], bias=bias)
    head = EagleHead(config).double()
    if bias:
        with torch.no_grad():
            head.fc.bias.normal_(0.0, 0.3)
    save_eagle(head, directory)
    return directory


@pytest.fixture(scope="module")
def llama() -> PreTrainedModel:
    return tiny_model("llama", vocab_size=VOCAB, hidden=HIDDEN, seed=0)


@pytest.fixture(scope="module")
def hybrid() -> PreTrainedModel:
    return tiny_hybrid(vocab_size=VOCAB, hidden=HIDDEN)


@pytest.fixture(scope="module")
def sources(hybrid: PreTrainedModel, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sources")
    return {"medusa": medusa_checkpoint(root / "medusa"),
            "eagle": eagle_checkpoint(root / "eagle", bias=True),
            "eagle-bias-free": eagle_checkpoint(root / "eagle-bias-free", bias=False, seed=1),
            "mtp": write_target(hybrid, mtp_tensors(hybrid, "qwen", seed=6), root / "mtp"),
            "eagle3": save_eagle3(random_eagle3(seed=2, scale=4.0, layers=(1, 2, 3)), root / "eagle3"),
            "eagle3-normed": save_eagle3(random_eagle3(seed=3, scale=4.0, layers=(1, 2, 4), draft_vocab=64,
                                                       norm_before_residual=True), root / "eagle3-normed")}


EXPORTS = [("medusa", "medusa", "vllm"), ("eagle", "eagle-bias-free", "vllm"), ("eagle", "eagle", "sglang"),
           ("eagle", "eagle-bias-free", "sglang"), ("mtp", "mtp", "vllm"), ("mtp", "mtp", "sglang"),
           ("eagle3", "eagle3", "vllm"), ("eagle3", "eagle3", "sglang"), ("eagle3", "eagle3-normed", "vllm")]


@pytest.fixture(scope="module")
def deep_llama() -> PreTrainedModel:
    """Four layers: an EAGLE-3 head fuses three of them."""
    return tiny_model("llama", vocab_size=VOCAB, hidden=HIDDEN, seed=0, layers=4)


def target_for(kind: str, llama: PreTrainedModel, hybrid: PreTrainedModel, deep: PreTrainedModel) -> PreTrainedModel:
    return {"mtp": hybrid, "eagle3": deep}.get(kind, llama)


def stored(directory: Path, file: str) -> dict[str, torch.Tensor]:
    with safe_open(str(directory / file), framework="pt") as handle:
        return {key: handle.get_tensor(key) for key in handle.keys()}


# ---- round trips ------------------------------------------------------------------------------

@pytest.mark.parametrize(("kind", "source", "engine"), EXPORTS)
def test_export_reads_back_through_specdec_with_identical_drafts(kind, source, engine, sources, llama, hybrid,
                                                                 deep_llama, tmp_path):
    out = export(kind, sources[source], engine, tmp_path / "out")
    assert out == tmp_path / "out" and out.is_dir()
    target = target_for(kind, llama, hybrid, deep_llama)
    tokens, drafts = drafts_of(kind, sources[source], target)
    back_tokens, back_drafts = drafts_of(kind, read_back(kind, out, engine, tmp_path / "scratch"), target)
    assert back_drafts == drafts and back_tokens == tokens
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == [], "no staging left"


@pytest.mark.parametrize(("kind", "source", "engine"), EXPORTS)
def test_export_holds_the_key_names_and_config_fields_written_for_its_engine(kind, source, engine, sources,
                                                                              tmp_path):
    out = export(kind, sources[source], engine, tmp_path / "out")
    layout = layout_for(kind, engine)
    config = json.loads((out / "config.json").read_text())
    assert mismatches(layout, stored(out, layout.weights), config) == []


def test_a_departure_from_the_layout_is_named(sources, tmp_path):
    out = export("eagle", sources["eagle"], "sglang", tmp_path / "out")
    layout = LAYOUTS["eagle", "sglang"]
    keys = set(stored(out, layout.weights)) - {"fc.bias"} | {"layers.0.input_layernorm.weight"}
    config = {**json.loads((out / "config.json").read_text()), "architectures": ["LlamaForCausalLM"], "bias": True}
    del config["head_dim"]
    problems = mismatches(layout, keys, config)
    assert any("'layers.0.input_layernorm.weight' matches no" in p for p in problems), problems
    assert any("'fc.bias'" in p for p in problems), problems
    assert any("'architectures'" in p and "LlamaForCausalLMEagle" in p for p in problems), problems
    assert any("lacks 'head_dim'" in p for p in problems) and any("has 'bias'" in p for p in problems), problems


def test_medusa_tensors_are_copied_unchanged_under_vllm_names(sources, tmp_path):
    out = export("medusa", sources["medusa"], "vllm", tmp_path / "out")
    ours, theirs = stored(sources["medusa"], "medusa_lm_head.safetensors"), stored(out, "model.safetensors")
    assert torch.equal(theirs["blocks.2.layers.0.weight"], ours["2.0.linear.weight"])
    assert torch.equal(theirs["blocks.0.layers.0.bias"], ours["0.0.linear.bias"])
    assert torch.equal(theirs["lm_heads.1.weight"], ours["1.1.weight"])
    assert json.loads((out / "config.json").read_text())["num_heads"] == 3


def test_sglang_eagle_of_a_bias_free_head_stores_a_zero_fc_bias(sources, tmp_path):
    out = export("eagle", sources["eagle-bias-free"], "sglang", tmp_path / "out")
    bias = stored(out, "model.safetensors")["fc.bias"]
    assert bias.shape == (HIDDEN,) and not bias.any()


# ---- MTP: a copy of the target ----------------------------------------------------------------

def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("sharded", [False, True])
def test_mtp_export_is_the_target_unchanged_plus_one_module(sources, hybrid, tmp_path, sharded):
    target = write_target(hybrid, mtp_tensors(hybrid, "qwen", seed=9), tmp_path / "target", sharded=sharded)
    out = export("mtp", sources["mtp"], "vllm", tmp_path / "out", target=target)
    index = json.loads((out / INDEX).read_text())["weight_map"]
    files = sorted(set(index.values()))
    keys = [key for name in files for key in stored(out, name)]
    assert sorted(keys) == sorted(index) and len(keys) == len(set(keys)), "each key in exactly one file"
    assert {name for key, name in index.items() if key.startswith("mtp.")} == {"model-mtp.safetensors"}
    source_mtp = {k: v for k, v in stored(sources["mtp"], "model.safetensors").items() if k.startswith("mtp.")}
    exported_mtp = stored(out, "model-mtp.safetensors")
    assert exported_mtp.keys() == source_mtp.keys()  # the module of SRC, not the target's old one
    assert all(torch.equal(exported_mtp[key], source_mtp[key]) for key in source_mtp)
    copies = [p.name for p in target.iterdir() if p.suffix != ".safetensors" and p.name not in ("config.json", INDEX)]
    assert copies and all(digest(out / name) == digest(target / name) for name in copies)
    config, original = json.loads((out / "config.json").read_text()), json.loads((target / "config.json").read_text())
    assert {k: v for k, v in config.items() if k not in LAYOUTS["mtp", "vllm"].config} == original
    reloaded = load_causal_lm(out, dtype=torch.float64)
    assert all(torch.equal(value, hybrid.state_dict()[key]) for key, value in reloaded.state_dict().items())


def test_mtp_export_of_a_deepseek_layout_is_refused_as_already_served(tmp_path):
    deepseek = tiny_deepseek()
    src = write_target(deepseek, mtp_tensors(deepseek, "deepseek", seed=3, stages=2), tmp_path / "deepseek")
    with pytest.raises(ValueError, match="DeepSeek-V3 layout.*serve it directly"):
        export("mtp", src, "vllm", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_mtp_export_for_a_target_the_engines_serve_no_mtp_for_is_refused(tmp_path):
    qwen3 = tiny_model("qwen3", vocab_size=VOCAB, hidden=HIDDEN)
    src = write_target(qwen3, mtp_tensors(qwen3, "qwen", seed=2), tmp_path / "qwen3")
    with pytest.raises(ValueError, match="Qwen3ForCausalLM.*Qwen3NextForCausalLM"):
        export("mtp", src, "sglang", tmp_path / "out")


def test_mtp_export_into_a_target_of_other_shapes_names_the_key_and_both_shapes(sources, tmp_path):
    other = write_target(tiny_hybrid(vocab_size=VOCAB, hidden=16), {}, tmp_path / "small")
    shapes = r"'mtp\.pre_fc_norm_embedding\.weight'.* shape \(32,\) but --target .* needs \(16,\)"
    with pytest.raises(ValueError, match=shapes):
        export("mtp", sources["mtp"], "vllm", tmp_path / "out", target=other)


# ---- refusals ---------------------------------------------------------------------------------

def test_medusa_to_sglang_is_refused_naming_what_sglang_loads(sources, tmp_path):
    with pytest.raises(ValueError, match="SGLang has no Medusa.*EAGLE.*--to vllm"):
        export("medusa", sources["medusa"], "sglang", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_vllm_eagle_refuses_a_head_whose_fc_bias_it_would_drop(sources, tmp_path):
    with pytest.raises(ValueError, match=r"non-zero fc\.bias.*--to sglang"):
        export("eagle", sources["eagle"], "vllm", tmp_path / "out")


def test_an_eagle_head_of_another_architecture_is_refused(tmp_path):
    config = Qwen3Config(hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=1, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=HIDDEN // 4, vocab_size=VOCAB,
                         architectures=["Qwen3ForCausalLM"])
    src = save_eagle(EagleHead(config).double(), tmp_path / "head")
    with pytest.raises(ValueError, match="qwen3 layer.*Llama decoder layer only"):
        export("eagle", src, "sglang", tmp_path / "out")


def test_a_drafter_of_another_target_is_refused_naming_both_sizes(sources, tmp_path):
    small = tmp_path / "small-target"
    tiny_model("llama", vocab_size=VOCAB, hidden=16).save_pretrained(small)
    with pytest.raises(ValueError, match="hidden size 32 but --target .* has 16"):
        export("medusa", sources["medusa"], "vllm", tmp_path / "out", target=small)


def test_unknown_kind_and_engine_are_named(sources, tmp_path):
    with pytest.raises(ValueError, match="'hydra'.*exportable kinds"):
        export("hydra", sources["medusa"], "vllm", tmp_path / "out")
    with pytest.raises(ValueError, match="'tgi'.*vllm"):
        export("medusa", sources["medusa"], "tgi", tmp_path / "out")


# ---- never overwrite, never half-written ------------------------------------------------------

def test_a_non_empty_out_is_refused_and_left_as_it_was(sources, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not empty; refusing to overwrite"):
        export("medusa", sources["medusa"], "vllm", out)
    assert [p.name for p in out.iterdir()] == ["keep.txt"] and (out / "keep.txt").read_text() == "mine"


def test_an_empty_out_directory_is_filled(sources, tmp_path):
    (tmp_path / "out").mkdir()
    export("medusa", sources["medusa"], "vllm", tmp_path / "out")
    assert {p.name for p in (tmp_path / "out").iterdir()} == {"config.json", "model.safetensors"}


def test_the_export_directory_is_made_like_any_new_directory(sources, tmp_path):
    out = export("medusa", sources["medusa"], "vllm", tmp_path / "out")
    (tmp_path / "plain").mkdir()
    assert out.stat().st_mode == (tmp_path / "plain").stat().st_mode, "readable by whoever serves it"


@pytest.mark.parametrize("kind", ["medusa", "eagle", "eagle3", "mtp"])
def test_a_failure_midway_leaves_nothing_behind(kind, sources, tmp_path, monkeypatch):
    module = __import__(f"specdec.export.{kind}", fromlist=["write_json"])

    def fail(path: Path, data: dict[str, Any]) -> None:  # the config comes after the weights
        assert any(path.parent.iterdir()), "the weights were written before the failure"
        raise OSError(f"disk full writing {path.name}")

    monkeypatch.setattr(module, "write_json", fail)
    parent = tmp_path / "exports"
    parent.mkdir()
    with pytest.raises(OSError, match="disk full"):
        export(kind, sources["eagle-bias-free" if kind == "eagle" else kind], "sglang" if kind != "medusa" else "vllm",
               parent / "out")
    assert list(parent.iterdir()) == []


# ---- the command line -------------------------------------------------------------------------

def test_cli_export_writes_the_directory_and_says_where(sources, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["export", "mtp", str(sources["mtp"]), "--to", "sglang", "--out", str(out)]) == 0
    assert str(out) in capsys.readouterr().out
    assert (out / "model-mtp.safetensors").is_file() and (out / "config.json").is_file()


@pytest.mark.parametrize(("argv", "named"), [
    (["medusa", "{medusa}", "--to", "sglang", "--out", "{tmp}/out"], "SGLang has no Medusa"),
    (["medusa", "{tmp}/missing", "--to", "vllm", "--out", "{tmp}/out"], "missing"),
    (["medusa", "{medusa}", "--to", "vllm", "--out", "{medusa}"], "refusing to overwrite"),
    (["eagle", "{eagle}", "--to", "vllm", "--out", "{tmp}/out"], "fc.bias"),
    (["mtp", "{medusa}", "--to", "vllm", "--out", "{tmp}/out"], "config.json"),
])
def test_cli_errors_are_one_line_exit_2(argv, named, sources, tmp_path, capsys):
    values = {"medusa": sources["medusa"], "eagle": sources["eagle"], "tmp": tmp_path}
    assert main(["export", *[part.format(**values) for part in argv]]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("specdec: error: ") and named in lines[0], captured.err
    assert captured.out == "" and not (tmp_path / "out").exists()


# ---- EAGLE-3 -----------------------------------------------------------------------------------

def test_eagle3_layer_ids_and_residual_are_written_in_each_engines_convention(sources, tmp_path):
    vllm = json.loads((export("eagle3", sources["eagle3"], "vllm", tmp_path / "v") / "config.json").read_text())
    sglang = json.loads((export("eagle3", sources["eagle3"], "sglang", tmp_path / "s") / "config.json").read_text())
    assert vllm["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]  # hidden_states indices
    assert sglang["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 1, 2]  # layer outputs
    assert vllm["norm_before_residual"] is False and sglang["norm_before_residual"] is False  # written explicitly
    assert vllm["transformer_layer_config"]["num_hidden_layers"] == 1
    assert "verifier" in vllm["speculators_config"] and vllm["speculators_config"]["proposal_methods"]


def test_eagle3_with_a_target_stores_its_embedding_and_names_the_verifier(sources, deep_llama, tmp_path):
    llama = deep_llama
    target = tmp_path / "target"
    llama.save_pretrained(target)
    out = export("eagle3", sources["eagle3"], "vllm", tmp_path / "out", target=target)
    tensors = stored(out, "model.safetensors")
    assert torch.equal(tensors["embed_tokens.weight"], llama.get_input_embeddings().weight.detach())
    config = json.loads((out / "config.json").read_text())
    assert config["speculators_config"]["verifier"]["name_or_path"] == str(target)
    tokens, drafts = drafts_of("eagle3", sources["eagle3"], llama)
    assert drafts_of("eagle3", out, llama) == (tokens, drafts)  # the stored copy embeds as the target does


def test_eagle3_the_engines_cannot_serve_is_refused(sources, deep_llama, tmp_path):
    with pytest.raises(ValueError, match="norm_before_residual.*--to vllm"):
        export("eagle3", sources["eagle3-normed"], "sglang", tmp_path / "a")
    target = tmp_path / "target"
    deep_llama.save_pretrained(target)  # 4 layers: the engines capture indices 0..3, not 4 (post-norm)
    with pytest.raises(ValueError, match=r"\(1, 2, 4\).*layers 0\.\.3"):
        export("eagle3", sources["eagle3-normed"], "vllm", tmp_path / "b", target=target)
    for layers, engine, named in (((1, 1, 2), "vllm", "three distinct ascending"), ((2, 1, 3), "sglang", "ascending"),
                                  ((1, 2), "vllm", "exactly three"), ((0, 1, 2), "vllm", "embeddings")):
        source = save_eagle3(random_eagle3(layers=layers), tmp_path / f"src-{engine}-{len(layers)}-{layers[0]}")
        with pytest.raises(ValueError, match=named):
            export("eagle3", source, engine, tmp_path / "c")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists() and not (tmp_path / "c").exists()
