"""Quantized weights (`specdec.quantize`, `specdec.runtime.quantize`): int8 weights with one scale
per output channel and bfloat16 activations. Speculative decoding of a quantized target must be
exactly plain decoding of that quantized target: an int8 product's rows are what one-row products
give, bit for bit (eager and packed-compiled); greedy speculative decoding equals the quantized
model's own plain decoding on several architectures and drafters; sampling follows its plain
sampling (chi-square); the compiled packed step runs inductor's C++ template on the int8 weights."""

from __future__ import annotations

import pytest
import torch
from tiny import tiny_model
from transformers.pytorch_utils import Conv1D

import specdec
from specdec.checkpoints import load_causal_lm
from specdec.drafters import DraftModelDrafter
from specdec.runtime import packed as packing
from specdec.runtime.quantize import EXACT_TOP, Int8Linear, quantize, quantized_scheme
from specdec.runtime.whole_prompt import in_whole_prompt, whole_prompt
from specdec.runtime.exact_attention import EXACT_ROWS

PROMPT = [3, 9, 4, 3, 9, 4, 3, 9, 11, 2]  # repetitive: prompt lookup drafts
NEW = 16


def _int8(arch: str, seed: int = 0, **kwargs: object) -> torch.nn.Module:
    return quantize(tiny_model(arch, seed=seed, **kwargs), "int8")  # type: ignore[arg-type]


def test_an_int8_products_rows_are_one_row_products_bit_for_bit():
    torch.manual_seed(0)
    layer = Int8Linear.from_linear(torch.nn.Linear(48, 40, bias=True))
    x = torch.randn(7, 48)  # (M, K)
    with torch.no_grad():
        whole = layer(x)  # (M, N)
        for rows in (1, 2, 5):
            for start in range(0, 7 - rows + 1):
                assert torch.equal(layer(x[start : start + rows]), whole[start : start + rows]), (rows, start)
        reference = x.to(torch.bfloat16).float() @ layer.dequantized().T + layer.bias  # the product it stands for
    assert whole.dtype == torch.float32
    assert (whole - reference).abs().max() <= 2**-7 * reference.abs().max()  # its bfloat16 output's rounding


def test_a_prompts_int8_products_run_the_bfloat16_gemm_on_the_dequantized_weights():
    torch.manual_seed(3)
    layer = Int8Linear.from_linear(torch.nn.Linear(576, 64, bias=False))
    x = torch.randn(40, 576)  # (M, K)
    with torch.no_grad():
        with whole_prompt():
            prompt = layer(x)
        gemm = torch.nn.functional.linear(x.to(torch.bfloat16), layer.qweight.to(torch.bfloat16)) * layer.scale
        assert torch.equal(prompt, gemm.float())
        assert not torch.equal(layer(x), prompt)  # a step's kernel gives other bits: the check has power


def test_a_generation_runs_its_prompt_on_the_prompt_kernels_and_its_steps_on_the_row_exact_ones(monkeypatch):
    calls: list[tuple[int, bool]] = []  # (rows of a decoder layer's int8 product, inside a prompt's forward)
    forward = Int8Linear.forward

    def spy(self, x):
        if not self.exact_top:  # the LM head sees the rows whose logits are kept
            calls.append((x.reshape(-1, self.in_features).shape[0], in_whole_prompt()))
        return forward(self, x)

    monkeypatch.setattr(Int8Linear, "forward", spy)
    target = _int8("llama", seed=2, dtype=torch.float32, vocab_size=48)
    specdec.generate(target, PROMPT, drafter="ngram", num_draft_tokens=3, max_new_tokens=8)
    assert {rows for rows, prompt in calls if prompt} == {len(PROMPT) - 1}  # the prefill: the prompt but its last id
    steps = {rows for rows, prompt in calls if not prompt}  # verifies of k + 1 rows, or 1 where nothing was drafted
    assert 4 in steps and steps <= {1, 2, 3, 4}


def test_int8_weights_are_the_nearest_integers_under_a_scale_per_output_row():
    torch.manual_seed(1)
    linear = torch.nn.Linear(64, 12, bias=False)
    layer = Int8Linear.from_linear(linear)
    assert layer.qweight.dtype == torch.int8 and layer.scale.shape == (12,)
    assert int(layer.qweight.abs().max(dim=1).values.min()) >= 126  # every row uses its range
    error = (layer.dequantized() - linear.weight).abs()
    assert bool((error <= layer.scale.float()[:, None] / 2 + 1e-7).all())  # rounding to the nearest step
    conv = Conv1D(12, 64)  # GPT-2's layer stores its weight [in, out]
    conv.weight.data.copy_(linear.weight.T)
    assert torch.equal(Int8Linear.from_linear(conv).qweight, layer.qweight)


def test_quantize_replaces_every_linear_layer_and_unties_the_head():
    model = tiny_model("llama", dtype=torch.float32)
    model.config.tie_word_embeddings = True
    embed = model.get_input_embeddings().weight.clone()
    before = sum(p.numel() * p.element_size() for p in model.parameters())
    assert quantize(model, "int8") is model
    assert not any(type(m) is torch.nn.Linear for m in model.modules())
    assert isinstance(model.get_output_embeddings(), Int8Linear)
    assert torch.equal(model.get_input_embeddings().weight, embed) and not model.config.tie_word_embeddings
    after = sum(p.numel() * p.element_size() for p in model.parameters())
    assert after < 0.6 * before and quantized_scheme(model) == "int8"
    assert model.get_output_embeddings().exact_top == EXACT_TOP and model.model.layers[0].mlp.up_proj.exact_top == 0
    assert model.config._attn_implementation == EXACT_ROWS
    gpt2 = _int8("gpt2")
    assert not any(isinstance(m, (torch.nn.Linear, Conv1D)) for m in gpt2.modules())


def test_bad_quantization_requests_are_refused_by_name(tmp_path):
    model = tiny_model("llama", dtype=torch.float32)
    with pytest.raises(ValueError, match=r"'int3'.*int8"):
        quantize(model, "int3")
    assert quantized_scheme(model) is None  # nothing half-done
    quantize(model, "int8")
    with pytest.raises(ValueError, match="already quantized"):
        quantize(model, "int8")
    with pytest.raises(ValueError, match=r"quantize='fp4'.*int8"):
        load_causal_lm(tmp_path / "absent", quantize="fp4")  # refused before any file is read
    with pytest.raises(ValueError, match=r"tp=2"):
        load_causal_lm(tmp_path / "absent", quantize="int8", tp=2)
    with pytest.raises(ValueError, match="a model passed in is not modified"):
        DraftModelDrafter(tiny_model("llama", dtype=torch.float32), quantize="int8")


def test_an_int8_heads_largest_logits_are_float32_sums_of_its_int8_products():
    torch.manual_seed(2)
    head = Int8Linear.from_linear(torch.nn.Linear(32, 300, bias=False))
    head.exact_top = 4
    x = torch.randn(3, 32)
    with torch.no_grad():
        logits = head(x)
        rounded = torch.ops.aten._weight_int8pack_mm(x.to(torch.bfloat16), head.qweight, head.scale).float()
    exact = x.to(torch.bfloat16).float() @ head.dequantized().T  # (3, 300) in float32
    top = rounded.topk(4, dim=-1).indices
    assert torch.allclose(logits.gather(-1, top), exact.gather(-1, top), rtol=1e-6, atol=1e-6)
    rest = torch.ones_like(logits, dtype=torch.bool).scatter(-1, top, False)
    assert torch.equal(logits[rest], rounded[rest])  # the others as the kernel rounded them


class Continuation:
    """Drafts the next k tokens of a known greedy decoding: every draft kept, every position verified
    in a k + 1-row forward rather than a one-row step."""

    name = "continuation"

    def __init__(self, tokens: list[int]) -> None:
        self.tokens = tokens

    def propose(self, ctx, k):
        n = ctx.tokens.shape[0]
        return specdec.Draft(torch.tensor(self.tokens[n : n + k], dtype=torch.long))


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_an_eager_int8_verify_row_is_a_one_row_step_bit_for_bit(arch):
    from specdec.teaching.trace import Trace

    # wide enough and long enough that attention in float32 is not the same bits for 4 rows and for 1
    target = _int8(arch, seed=7, dtype=torch.float32, vocab_size=300, hidden=256)
    prompt = list(range(3, 60)) * 2
    plain, verified = Trace(), Trace()
    tokens = specdec.generate(target, prompt, max_new_tokens=24, trace=plain).tokens
    result = specdec.generate(target, prompt, drafter=Continuation(prompt + tokens), num_draft_tokens=3,
                              max_new_tokens=24, trace=verified)
    assert result.tokens == tokens and result.stats.accepted > 12
    probabilities = [[t.p for s in trace.steps for t in s.tokens if t.kind != "rejected"] for trace in (plain, verified)]
    assert probabilities[0] == probabilities[1]  # the target's probability of every token, to the last bit


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "gpt2"])
def test_speculative_decoding_of_an_int8_target_is_its_own_plain_decoding(arch):
    target = _int8(arch, seed=2, dtype=torch.float32, vocab_size=48)
    plain = specdec.generate(target, PROMPT, max_new_tokens=NEW).tokens
    draft = _int8(arch, seed=5, dtype=torch.float32, vocab_size=48, layers=1)
    drafters = {"ngram": "ngram", "draft-model": DraftModelDrafter(draft),
                "draft-model+tree": DraftModelDrafter(draft, tree=True)}
    for name, drafter in drafters.items():
        result = specdec.generate(target, PROMPT, drafter=drafter, num_draft_tokens=3, max_new_tokens=NEW)
        assert result.tokens == plain, f"{arch}, {name}: {result.tokens} against plain {plain}"
        assert result.stats.drafted > 0


def test_a_compiled_int8_target_runs_the_template_on_its_int8_weights(monkeypatch, strict_compile):
    from torch._dynamo.utils import counters

    monkeypatch.setenv(packing.PACKED_ENV, "1")  # pack a tiny model's steps, as a real model's are
    target = _int8("llama", seed=6, dtype=torch.float32, vocab_size=48, layers=1)
    eager = specdec.generate(target, PROMPT, max_new_tokens=NEW).tokens
    before = counters["inductor"]["cpp_templated_kernel_counter"]
    spec = specdec.generate(target, PROMPT, max_new_tokens=NEW, compile=True, drafter="ngram", num_draft_tokens=3)
    assert counters["inductor"]["cpp_templated_kernel_counter"] > before, "no int8 product ran the C++ template"
    assert vars(target)[packing.PACKED_ATTRIBUTE], "the int8 target's steps did not pack"
    assert spec.tokens == eager and spec.stats.drafted > 0


def test_sampling_from_an_int8_target_follows_its_plain_sampling():
    from test_lossless_statistical import (ALPHA, MODEL, PROMPT as STAT_PROMPT, TRUNCATED, chi_square_p_value,
                                           exact_distribution, sample_counts)

    target = quantize(tiny_model(seed=0, **MODEL), "int8")  # type: ignore[arg-type]
    other = tiny_model(seed=1, **MODEL)
    counts, drafted, accepted, _ = sample_counts(target, DraftModelDrafter(other), TRUNCATED)
    assert 0 < accepted < drafted  # drafts were both kept and rejected
    p_value = chi_square_p_value(counts, exact_distribution(target, STAT_PROMPT, TRUNCATED))
    assert p_value >= ALPHA, f"speculative sampling of an int8 target deviates from its plain sampling: p = {p_value:.3g}"


def test_load_and_the_command_line_quantize(tmp_path, capsys):
    from specdec.cli import main

    from test_cli import PROMPT as TEXT, _save

    saved = _save(tmp_path / "target")
    loaded = load_causal_lm(saved.directory, quantize="int8")
    assert isinstance(loaded.get_output_embeddings(), Int8Linear)
    ids = saved.tokenizer.encode(TEXT)
    expected = specdec.generate(loaded, ids, max_new_tokens=8).tokens
    assert main(["generate", "--target", str(saved.directory), "--quantize", "int8", "--max-new-tokens", "8",
                 "--drafter", f"draft-model:model={saved.directory},quantize=int8", TEXT]) == 0
    text = capsys.readouterr().out.rstrip("\n").split("\n")[0]
    assert text == saved.tokenizer.decode(expected, skip_special_tokens=True)


def test_the_quantization_error_is_measured_on_held_out_windows(tmp_path, capsys):
    import json

    from specdec.bench.quantization import main, stdlib_windows
    from specdec.training.target import heldout_loss

    from test_cli import _save

    saved = _save(tmp_path / "target")
    out = tmp_path / "error.json"
    assert main(["--target", str(saved.directory), "--windows", "2", "--length", "24", "--prompts", "2",
                 "--prompt-length", "8", "--new-tokens", "6", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert (result["windows"], result["tokens_per_window"], result["prompts"]) == (2, 24, 2)
    windows = stdlib_windows(saved.tokenizer, 2, 24)
    with torch.inference_mode():
        assert result["float_loss"] == pytest.approx(heldout_loss(saved.model, windows), rel=1e-6)
        assert result["quantized_loss"] == pytest.approx(heldout_loss(quantize(saved.model, "int8"), windows), rel=1e-6)
    assert 0 <= result["next_token_agreement"] <= 1 and "held-out loss" in capsys.readouterr().out
