"""The `self` drafter: the target drafts with a subset of its own layers over its own cache.

Float64 tiny models, so greedy outputs must equal transformers' token for token; a chi-square
test (false-alarm rate ALPHA, fixed seeds) for the law of sampled continuations; the target's
cache and weights after a generation; the layer view's calls; what it refuses; the layer search
on a model whose answer is known, and its cache; the options.
"""

from __future__ import annotations

import functools
import json
from dataclasses import replace

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, LlamaModel, PreTrainedModel
from transformers.masking_utils import create_causal_mask
from transformers.modeling_outputs import BaseModelOutputWithPast

import specdec
from specdec.runtime.batch_target import BatchLM
from specdec import Sampling
from specdec.cli.common import parse_drafter_spec
from specdec.drafters import SelfDrafter
from specdec.drafters.draft_models import layer_search, layer_view as layer_view_module, self_draft
from specdec.drafters.draft_models.layer_search import (Calibration, cached_search, draft_cost, modelled_speedup, search_layers,
                                           stdlib_calibration)
from specdec.drafters.draft_models.layer_view import decoder_layers, layer_view
from specdec.drafters.draft_models.self_draft import RowPlan, parse_layers, self_chain, self_step
from specdec.runtime.target import CausalLM
from specdec.sampling import probabilities
from specdec.teaching.trace import Trace
from specdec.verifier import DraftError

from test_greedy_parity import assert_stats_consistent
from test_lossless_statistical import ALPHA, PROMPT as SHORT_PROMPT, VOCAB, chi_square_p_value, exact_distribution, \
    sample_counts
from tiny import ARCHITECTURES, SLIDING_ARCHITECTURES, hf_greedy, tiny_model

PROMPT = [5, 9, 14, 22, 5, 9, 14, 22, 5, 9, 14]
NEW_TOKENS = 24
LAYERS = 4


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    """Every test searches into a cache of its own (never the user's)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))


@functools.lru_cache(maxsize=None)
def _target(arch: str) -> PreTrainedModel:
    return tiny_model(arch, layers=LAYERS, seed=0)


@functools.lru_cache(maxsize=None)
def _reference(arch: str) -> tuple[int, ...]:
    return tuple(hf_greedy(_target(arch), PROMPT, NEW_TOKENS))


def _dynamic(model: PreTrainedModel) -> CausalLM:
    """An adapter of `model` that keeps a dynamic cache (as models that cannot run on a static one do)."""
    lm = CausalLM(model)
    lm.static_obstacle = "this test keeps the cache dynamic"
    return lm


OPTIONS = {"auto": {}, "explicit": {"layers": [0, 2, 3]}, "cli-form": {"layers": "0+2-3"}, "exit": {"exit_layer": 2},
           "every-layer": {"layers": list(range(LAYERS))}}


@pytest.mark.parametrize("cache", ["static", "dynamic"])
@pytest.mark.parametrize("label", list(OPTIONS))
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_greedy_output_equals_transformers_greedy(arch, label, cache):
    drafter = SelfDrafter(**OPTIONS[label])
    target = _target(arch) if cache == "static" else _dynamic(_target(arch))
    result = specdec.generate(target, PROMPT, drafter=drafter, num_draft_tokens=4, max_new_tokens=NEW_TOKENS, seed=0)
    assert result.tokens == list(_reference(arch)), f"{arch}, {label}, {cache} cache"
    assert_stats_consistent(result.stats, result.tokens, 4)
    assert result.stats.drafted > 0
    assert drafter.view is not None
    expected = {"explicit": (0, 2, 3), "cli-form": (0, 2, 3), "exit": (0, 1), "every-layer": (0, 1, 2, 3)}
    assert drafter.view.kept == expected.get(label, drafter.view.kept)
    if label == "auto":
        assert drafter.choice is not None and drafter.view.kept == drafter.choice.kept
        assert 0 < len(drafter.view.kept) < LAYERS
    if label == "every-layer":  # the whole model over the committed cache drafts exactly what the verify checks
        assert result.stats.accepted == result.stats.drafted


@pytest.mark.parametrize("arch", SLIDING_ARCHITECTURES)
def test_sliding_window_models_decode_greedily_as_transformers(arch):
    model = tiny_model(arch, layers=LAYERS, seed=0, sliding_window=3)
    drafter = SelfDrafter(layers=[0, 1, 3])
    result = specdec.generate(model, PROMPT, drafter=drafter, num_draft_tokens=4, max_new_tokens=NEW_TOKENS, seed=0)
    assert result.tokens == hf_greedy(model, PROMPT, NEW_TOKENS)
    every = specdec.generate(model, PROMPT, drafter=SelfDrafter(layers=list(range(LAYERS))), num_draft_tokens=4,
                             max_new_tokens=NEW_TOKENS, seed=0)
    assert every.stats.accepted == every.stats.drafted, "windows must be measured as the verify measures them"


@pytest.fixture(scope="module")
def small() -> PreTrainedModel:
    return tiny_model(seed=0, vocab_size=VOCAB, layers=3, hidden=16, head_scale=8.0)


@pytest.mark.parametrize("sample", [True, False], ids=["sampled", "argmax"])
def test_sampled_continuations_follow_plain_sampling(small, sample):
    sampling = Sampling(temperature=0.8)
    counts, drafted, accepted, deep = sample_counts(small, SelfDrafter(layers=[0, 2], sample=sample), sampling)
    assert drafted > 0 and deep > 0 and 0 < accepted < drafted, (drafted, accepted, deep)
    p_value = chi_square_p_value(counts, exact_distribution(small, SHORT_PROMPT, sampling))
    assert p_value >= ALPHA, f"self (sample={sample}) is not lossless: chi-square p = {p_value:.3g}"


def test_the_chi_square_test_catches_a_q_the_draft_was_not_drawn_from(small, monkeypatch):
    """Power: q reported at temperature 0.4 for tokens drawn at 0.8 must fail the same test."""
    drawn = self_draft.pick

    def mislabelled(logits, sampling, uniforms):
        token, probs = drawn(logits, sampling, uniforms)
        return token, None if probs is None else probabilities(logits, replace(sampling, temperature=0.4))

    monkeypatch.setattr(self_draft, "pick", mislabelled)
    sampling = Sampling(temperature=0.8)
    counts, drafted, _, _ = sample_counts(small, SelfDrafter(layers=[0, 2]), sampling)
    assert drafted > 0
    p_value = chi_square_p_value(counts, exact_distribution(small, SHORT_PROMPT, sampling))
    assert p_value < ALPHA, f"a mislabelled q went undetected: p = {p_value:.3g}"


def _layer_tensors(lm: CausalLM, length: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(layer.keys[..., :length, :], layer.values[..., :length, :]) for layer in lm.cache.layers]


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_the_targets_cache_and_weights_end_as_plain_decodings(dynamic):
    model = tiny_model("llama", layers=LAYERS, seed=3)
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    modules = dict(model.named_modules())
    ours, plain = (_dynamic(model), _dynamic(model)) if dynamic else (CausalLM(model), CausalLM(model))
    if not dynamic:  # the static cache eagerly, as a sliding or hybrid target keeps it
        ours.static_eagerly = plain.static_eagerly = True
    sampling = Sampling(temperature=0.8)
    drafted = specdec.generate(ours, PROMPT, drafter=SelfDrafter(), max_new_tokens=NEW_TOKENS, sampling=sampling,
                               seed=1)
    reference = specdec.generate(plain, PROMPT, drafter=None, max_new_tokens=NEW_TOKENS, sampling=sampling, seed=1)
    assert drafted.stats.drafted > drafted.stats.accepted > 0
    length = len(PROMPT) + NEW_TOKENS - 1  # every committed id but the last
    assert ours.cache_length == length and ours.static is not dynamic
    if drafted.tokens != reference.tokens:  # the same law, not the same draws: replay ours through plain decoding
        with torch.inference_mode():  # the caches hold inference tensors
            plain.reset(None if dynamic else ours.kv.capacity)
            plain.forward(torch.tensor(PROMPT + drafted.tokens[:-1]), keep=1)
    assert plain.cache_length == length
    for i, ((k1, v1), (k2, v2)) in enumerate(zip(_layer_tensors(ours, length), _layer_tensors(plain, length))):
        assert k1.shape == k2.shape and torch.allclose(k1, k2, rtol=0, atol=1e-12), f"layer {i} keys differ"
        assert torch.allclose(v1, v2, rtol=0, atol=1e-12), f"layer {i} values differ"
    assert dict(model.named_modules()) == modules, "the target's modules were replaced"
    after = model.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[name], before[name]) for name in before)


def test_the_view_runs_only_the_kept_layers():
    model = _target("llama")
    drafter = SelfDrafter(layers=[0, 2, 3])
    specdec.generate(model, PROMPT, drafter=drafter, max_new_tokens=4, seed=0)  # builds and probes the view
    calls = [0] * LAYERS
    handles = [layer.register_forward_pre_hook(lambda module, args, i=i: calls.__setitem__(i, calls[i] + 1))
               for i, layer in enumerate(model.model.layers)]
    try:
        result = specdec.generate(model, PROMPT, drafter=drafter, max_new_tokens=NEW_TOKENS, seed=0)
    finally:
        for handle in handles:
            handle.remove()
    target_forwards = calls[1]  # the skipped layer runs in the target's forwards only: prefill and verifies
    assert target_forwards == 1 + result.stats.steps
    assert calls[0] == calls[2] == calls[3] == target_forwards + result.stats.drafted, calls


def test_the_view_shares_the_models_layers_and_leaves_the_model_alone():
    model = _target("qwen3")
    view = layer_view(model, [3, 0, 1])
    assert view.kept == (0, 1, 3) and view.skipped == (2,) and view.cost == 0.75
    assert decoder_layers(model) == "model.layers" and len(model.model.layers) == LAYERS
    assert [id(layer) for layer in view.model.model.layers] == [id(model.model.layers[i]) for i in (0, 1, 3)]
    assert view.model.lm_head is model.lm_head and view.model.model.embed_tokens is model.model.embed_tokens
    assert model.model.config.num_hidden_layers == LAYERS and view.model.model.config.num_hidden_layers == 3
    assert decoder_layers(_target("gpt2")) == "transformer.h"


class _ListIgnoringModel(LlamaModel):
    """Runs the layers it captured when built, whatever its `layers` list holds (like architectures
    whose forward does not follow the list a truncation edits)."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__(config)
        self.captured = tuple(self.layers)  # a plain tuple: not a submodule

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None, use_cache=None, **kwargs):
        hidden = self.embed_tokens(input_ids)
        if position_ids is None:
            position_ids = torch.arange(hidden.shape[1])[None] + (cache.get_seq_length() if cache is not None else 0)
        mask = create_causal_mask(config=self.config, inputs_embeds=hidden, attention_mask=attention_mask, cache=cache,
                                  position_ids=position_ids)
        rotary = self.rotary_emb(hidden, position_ids=position_ids)
        for layer in self.captured[: self.config.num_hidden_layers]:
            hidden = layer(hidden, attention_mask=mask, position_embeddings=rotary, position_ids=position_ids,
                           cache=cache, use_cache=use_cache)
        return BaseModelOutputWithPast(last_hidden_state=self.norm(hidden), cache=cache)


class _ListIgnoringLM(LlamaForCausalLM):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__(config)
        self.model = _ListIgnoringModel(config)


def test_an_architecture_whose_forward_ignores_the_layer_list_is_refused():
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=LAYERS,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8, bos_token_id=None,
                         eos_token_id=None, pad_token_id=None)
    model = _ListIgnoringLM(config).to(torch.float64).eval()
    with pytest.raises(ValueError, match=r"_ListIgnoringLM .* ran layers \[0, 1, 2\]; its forward does not follow"):
        layer_view(model, [0, 2, 3])
    with pytest.raises(DraftError, match="does not follow the layer list"):
        specdec.generate(model, PROMPT, drafter=SelfDrafter(layers=[0, 2, 3]), max_new_tokens=4)


def test_a_view_handing_a_layer_another_kinds_mask_is_refused(monkeypatch):
    model = tiny_model("gemma2", layers=LAYERS, seed=0)
    layer_view(model, [0, 2, 3])  # layer 2 slides: its per-layer config entry follows it
    monkeypatch.setattr(layer_view_module, "_view_config", lambda config, kept, total: config)
    with pytest.raises(ValueError, match="layer 2 receives another 'attention_mask' than in the full forward"):
        layer_view(model, [0, 2, 3])


def test_linear_attention_models_are_refused():
    from test_hybrid import tiny_hybrid

    with pytest.raises(ValueError, match="Qwen3NextForCausalLM cannot draft with a subset of its layers: its "
                                         "linear-attention"):
        layer_view(tiny_hybrid(), [1, 2])


@pytest.mark.parametrize("arch", ["llama", "gemma2"])
@pytest.mark.parametrize("sampling", [Sampling(), Sampling(temperature=0.9)], ids=["greedy", "t0.9"])
def test_each_row_of_a_batch_self_drafts_what_it_drafts_alone(arch, sampling):
    """A batch drafts every row over the batch's own cache, one forward of the kept layers per depth
    (`BatchLM.draft_step`): each row's tokens, drafts accepted and draws are its batch-1 decoding's
    (sliding windows measured in each row's own positions too)."""
    model = _target(arch)
    prompts = [PROMPT, PROMPT[:5], PROMPT[3:] + [7, 7]]
    drafter = SelfDrafter(layers=[0, 1, 3])
    steps: list[int] = []
    original = BatchLM.draft_step

    def counted(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        steps.append(self.rows)
        return original(self, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(BatchLM, "draft_step", counted)
        batch = specdec.generate_batch(model, prompts, drafter=drafter, max_new_tokens=16, sampling=sampling, seed=4)
    assert steps and max(steps) == len(prompts), "one draft forward for every row at once"
    assert len(steps) <= batch.totals.steps * 4
    for i, prompt in enumerate(prompts):
        alone = specdec.generate(model, prompt, drafter=SelfDrafter(layers=[0, 1, 3]), max_new_tokens=16,
                                 sampling=sampling, seed=4 + i)
        assert batch[i].tokens == alone.tokens, f"row {i}"
        assert (batch[i].stats.drafted, batch[i].stats.accepted) == (alone.stats.drafted, alone.stats.accepted)
    assert batch.totals.accepted > 0


def _identity_layers_model(seed: int) -> PreTrainedModel:
    """5 layers; layers 1 and 3 add nothing (output projections zeroed), the others weigh 8x."""
    model = tiny_model("llama", layers=5, seed=seed)
    with torch.no_grad():
        for i, layer in enumerate(model.model.layers):
            scale = 0.0 if i in (1, 3) else 8.0
            layer.self_attn.o_proj.weight.mul_(scale)
            layer.mlp.down_proj.weight.mul_(scale)
    return model


CALIBRATION = torch.randint(0, 64, (48,), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("seed", [1, 3])  # models whose other layers all weigh enough to be kept
def test_the_search_skips_the_layers_that_do_nothing_first(seed):
    choice = search_layers(_identity_layers_model(seed), CALIBRATION, k=4)
    assert set(choice.ranking[:2]) == {1, 3}
    assert choice.single_agreement[1] == choice.single_agreement[3] == 1.0
    assert max(choice.single_agreement[i] for i in (0, 2, 4)) < 1.0
    assert choice.kept == (0, 2, 4) and choice.agreement == 1.0
    model = _identity_layers_model(seed)
    cost = draft_cost(model, choice.kept)
    layer = sum(p.numel() for p in model.model.layers[0].parameters())
    head = model.lm_head.weight.numel()
    assert cost == pytest.approx((3 * layer + head) / (5 * layer + head))  # three of five layers, and the head
    assert choice.speedup == pytest.approx(modelled_speedup(1.0, 4, cost)) == pytest.approx(5 / (1 + 4 * cost))


def test_the_search_measures_a_view_as_it_drafts():
    """Its first draft after each calibration prefix is the drafter's first draft after that prefix."""
    model = _target("llama")
    ids = torch.tensor(PROMPT * 3)
    with torch.inference_mode():
        calibration = Calibration(model, ids)
        drafts = calibration.first_drafts([0, 2, 3]).argmax(-1)  # (T,)
        assert torch.equal(calibration.reference.argmax(-1), calibration.first_drafts([0, 1, 2, 3]).argmax(-1))
    for t in (0, 4, 13, 30):
        trace = Trace()
        specdec.generate(model, ids[: t + 1], drafter=SelfDrafter(layers=[0, 2, 3]), num_draft_tokens=2,
                         max_new_tokens=3, trace=trace)
        assert trace.steps[0].drafted[0] == int(drafts[t]), f"position {t}"


def test_the_modelled_speedup():
    assert modelled_speedup(1.0, 4, 0.5) == pytest.approx(5 / 3)
    assert modelled_speedup(0.0, 4, 0.5) == pytest.approx(1 / 3)
    assert modelled_speedup(0.5, 2, 0.25) == pytest.approx((1 - 0.5**3) / 0.5 / 1.5)


def test_the_search_is_cached_per_model_calibration_and_k(tmp_path, monkeypatch):
    model = _identity_layers_model(1)
    first = cached_search(model, CALIBRATION, 4, "test ids", directory=tmp_path)
    files = list(tmp_path.iterdir())
    assert len(files) == 1 and files[0].name.startswith("LlamaForCausalLM-") and files[0].suffix == ".json"
    entry = json.loads(files[0].read_text())
    assert entry["kept"] == [0, 2, 4] and entry["k"] == 4 and entry["calibration_source"] == "test ids"
    searched = []
    monkeypatch.setattr(layer_search, "search_layers",
                        lambda *args: searched.append(args) or search_layers(*args))
    assert cached_search(model, CALIBRATION, 4, directory=tmp_path) == first and not searched
    cached_search(model, CALIBRATION, 2, directory=tmp_path)
    cached_search(model, CALIBRATION[:20], 4, directory=tmp_path)
    with torch.no_grad():
        model.model.layers[3].mlp.down_proj.weight.add_(1.0)  # another model now: searched again
    cached_search(model, CALIBRATION, 4, directory=tmp_path)
    assert len(searched) == 3 and len(list(tmp_path.glob("*.json"))) == 4
    files[0].write_text("{not json")
    model2 = _identity_layers_model(1)
    assert cached_search(model2, CALIBRATION, 4, directory=tmp_path) == first and len(searched) == 4
    assert not list(tmp_path.glob(".*.tmp")), "a temporary file was left behind"


def test_the_drafter_calibrates_on_held_out_stdlib_text_with_a_tokenizer():
    class Bytes:
        """Byte-level ids folded into a 64-token vocabulary."""

        def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
            return [byte % 64 for byte in text.encode()]

    ids = stdlib_calibration(Bytes(), 40)
    assert ids.shape == (40,) and torch.equal(ids, stdlib_calibration(Bytes(), 40))
    drafter = SelfDrafter(tokenizer=Bytes(), calibration_tokens=40)
    result = specdec.generate(_target("llama"), PROMPT, drafter=drafter, max_new_tokens=8, seed=0)
    assert result.tokens == list(_reference("llama"))[:8]
    entries = [json.loads(path.read_text()) for path in layer_search.cache_directory().glob("*.json")]
    assert [entry["calibration_source"].startswith("stdlib held-out") for entry in entries] == [True]


def test_a_draft_row_traces_as_one_graph():
    """The step a compiled generation runs for each draft row traces whole (dynamo, fullgraph) and
    drafts what the eager step drafts."""
    model = _target("llama")
    lm = CausalLM(model)
    lm.reset(64)
    lm.forward(torch.tensor(PROMPT[:-1]), keep=1)
    view = layer_view(model, [0, 2, 3]).model
    plan = RowPlan(64, lm.kv.attention, None, lm.dtype)
    base, first = torch.tensor(len(PROMPT) - 1), torch.tensor(PROMPT[-1:])
    uniforms = torch.rand(4, generator=torch.Generator().manual_seed(0))
    sampling = Sampling(temperature=0.8)
    traced = torch.compile(self_step, fullgraph=True, dynamic=False, backend="eager")
    chains = []
    for step in (self_step, traced):
        chains.append(self_chain(lambda column, token, uniform: step(view, lm.cache, column, token, uniform, sampling,
                                                                     plan), base, first, uniforms, 4, lambda: None))
        lm.discard(len(PROMPT) - 1)
    (tokens, q), (traced_tokens, traced_q) = chains
    assert torch.equal(tokens, traced_tokens) and torch.allclose(q, traced_q, rtol=0, atol=1e-12)


@pytest.mark.usefixtures("strict_compile")
def test_compiled_decoding_equals_eager():
    """On the CPU inductor's kernels, on CUDA its CUDA graphs too."""
    from specdec.runtime.engine import compile_failures

    model = tiny_model("llama", layers=LAYERS, seed=0).to("cuda" if torch.cuda.is_available() else "cpu")
    for sampling in (Sampling(), Sampling(temperature=0.8)):
        outputs = [specdec.generate(model, PROMPT, drafter=SelfDrafter(layers=[0, 2, 3]), max_new_tokens=40,
                                    sampling=sampling, seed=2, compile=compile).tokens for compile in (False, True)]
        assert outputs[0] == outputs[1], sampling
    assert not [key for key in compile_failures() if "self-draft" in key[0]], compile_failures()


@pytest.mark.parametrize(("value", "expected"), [
    (None, None), ("auto", None), ([3, 0, 1], (0, 1, 3)), (2, (2,)), ("0-2+5", (0, 1, 2, 5)), ("7", (7,)),
    (" 1 + 3-4 ", (1, 3, 4))])
def test_layer_options_parse(value, expected):
    assert parse_layers(value) == expected


def test_the_cli_form_survives_the_drafter_spec_parser():
    name, options = parse_drafter_spec("self:layers=0-1+3,sample=false")
    drafter = specdec.make_drafter(name, **options)
    assert isinstance(drafter, SelfDrafter) and drafter.layers == (0, 1, 3) and drafter.sample is False
    assert "self" in specdec.drafter_names()


@pytest.mark.parametrize(("options", "named"), [
    ({"layers": "0-"}, "'0-'"), ({"layers": "a"}, "'a'"), ({"layers": "5-3"}, "'5-3'"), ({"layers": [1, 1]}, "[1, 1]"),
    ({"layers": [-1]}, "[-1]"), ({"layers": True}, "True"), ({"layers": 1.5}, "1.5"), ({"layers": ""}, "''"),
    ({"exit_layer": 0}, "0"), ({"exit_layer": 2, "layers": [0]}, "exit_layer=2"), ({"sample": "yes"}, "'yes'"),
    ({"calibration_tokens": 1}, "1")])
def test_bad_options_give_one_line_errors_naming_the_value(options, named):
    with pytest.raises(ValueError) as error:
        SelfDrafter(**options)
    message = str(error.value)
    assert "\n" not in message and message.startswith("self: ") and named in message, message


@pytest.mark.parametrize(("options", "named"), [({"layers": [0, 4]}, "[4]"), ({"exit_layer": 5}, "exit_layer=5")])
def test_layers_the_model_lacks_are_named(options, named):
    with pytest.raises(DraftError, match=rf"self: .*{named.replace('[', '.').replace(']', '.')}.* has 4 layers"):
        specdec.generate(_target("llama"), PROMPT, drafter=SelfDrafter(**options), max_new_tokens=4)
