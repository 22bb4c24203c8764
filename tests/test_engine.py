"""The compiled engine: static caches, fixed-shape steps, and compiled decoding that yields the
tokens of eager decoding.

Compiling is slow on two cores, so the compiled runs here share a few model shapes (graphs are
kept by torch across calls and tests with the same shapes), and only one architecture takes
each path beyond plain and chain decoding.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch._dynamo.utils import counters
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedModel

import specdec
from specdec import CausalLM, Draft, DraftContext, Sampling
from specdec.decoding.adaptive import AdaptiveDraftLength
from specdec.drafters import DraftModelDrafter, NgramDrafter
from specdec.runtime.cache import KV
from specdec.runtime.engine import compile_failures
from specdec.teaching.trace import Trace
from specdec.types import static_capacity
from specdec.verifier import DraftError

from drafters_for_tests import RandomTreeDrafter
from test_lossless_statistical import (ALPHA, MODEL, PLAIN, PROMPT as STAT_PROMPT, chi_square_p_value,
                                       exact_distribution, sample_counts)
from tiny import ARCHITECTURES, assert_greedy_matches_up_to_near_ties, hf_greedy, tiny_model

PROMPT = [5, 9, 14, 22, 5, 9, 14, 22, 5, 9, 14]
VOCAB = 64


def _model(arch: str, dtype: torch.dtype = torch.float32, seed: int = 0, **shape: int) -> PreTrainedModel:
    model = tiny_model(arch, vocab_size=VOCAB, seed=seed, dtype=dtype, **shape)
    model.config._attn_implementation = "sdpa"
    return model


def _graphs() -> int:
    return int(counters["stats"]["unique_graphs"])


# --- static caches ----------------------------------------------------------------------------------

def test_a_static_cache_is_sized_once_in_steps_of_its_capacity_unit() -> None:
    lm = CausalLM(_model("llama"))
    lm.reset(static_capacity(300))
    assert lm.static and lm.kv is not None and lm.kv.capacity == 512
    layers, heads, head_dim = 2, 2, 8  # tiny_model: 2 layers, 2 KV heads of 32 / 4 dims
    lm.forward(torch.tensor(PROMPT), keep=1)
    assert lm.kv.nbytes == layers * 2 * heads * 512 * head_dim * 4  # keys and values, float32
    first = [layer.keys.data_ptr() for layer in lm.cache.layers]
    lm.reset(static_capacity(300))
    assert [layer.keys.data_ptr() for layer in lm.cache.layers] == first, "the same size reuses the buffers"


def test_the_static_cache_size_follows_from_the_config() -> None:
    from transformers import LlamaConfig

    from specdec.runtime.cache import static_cache_bytes

    lm = CausalLM(_model("qwen3"))
    lm.reset(256)
    lm.forward(torch.tensor(PROMPT), keep=1)
    assert lm.kv is not None and lm.kv.nbytes == static_cache_bytes(lm.model.config, 256, torch.float32)
    llama_8b = LlamaConfig(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8)
    assert static_cache_bytes(llama_8b, static_capacity(4096 + 5), torch.bfloat16) == 4352 * 128 * 2**10


def test_rollback_sets_a_length_and_the_stale_entries_stay_unseen() -> None:
    model = _model("qwen3", dtype=torch.float64)
    ids = torch.tensor(PROMPT)
    fresh = model(input_ids=ids[None]).logits[0]
    lm = CausalLM(model)
    lm.reset(256)
    with torch.inference_mode():
        lm.forward(ids[:6], keep=1)
        lm.forward(torch.tensor([1, 2, 3, 4]), keep=4)  # garbage, then rolled back
        buffers = [layer.keys[:, :, 6:10].clone() for layer in lm.cache.layers]
        lm.rollback(6)
        assert all(torch.equal(layer.keys[:, :, 6:10], saved) for layer, saved in zip(lm.cache.layers, buffers)), \
            "a rollback copies nothing"
        logits, _ = lm.forward(ids[6:], keep=len(PROMPT) - 6)
    torch.testing.assert_close(logits, fresh[6:], rtol=0, atol=1e-10)


def test_padded_steps_leave_exactly_the_real_ids_in_the_cache() -> None:
    model = _model("gpt2", dtype=torch.float64)
    ids = torch.tensor(PROMPT)
    fresh = model(input_ids=ids[None]).logits[0]
    lm = CausalLM(model)
    lm.reset(256)
    with torch.inference_mode():
        lm.forward(ids[:5], keep=1)
        logits, hidden = lm.forward(ids[5:7], keep=1, hidden=(lm.num_layers,), rows=5)  # 2 ids padded to 5 rows
        assert lm.cache_length == 7 and hidden is not None and hidden.shape[0] == 2
        torch.testing.assert_close(logits[0], fresh[6], rtol=0, atol=1e-10)
        rest, _ = lm.forward(ids[7:], keep=len(PROMPT) - 7)
    torch.testing.assert_close(rest, fresh[7:], rtol=0, atol=1e-10)


def test_a_static_gather_keeps_the_accepted_path_in_place() -> None:
    model = _model("llama", dtype=torch.float64)
    static, dynamic = KV(model, 64), KV(model)
    lm = CausalLM(model)
    with torch.inference_mode():
        for kv in (static, dynamic):
            lm.kv = kv
            lm.forward(torch.tensor(PROMPT), keep=1)
            kv.gather(4, [0, 2, 5])
        assert static.length == dynamic.length == 7
        for a, b in zip(static.cache.layers, dynamic.cache.layers):
            torch.testing.assert_close(a.keys[:, :, :7], b.keys, rtol=0, atol=0)
            torch.testing.assert_close(a.values[:, :, :7], b.values, rtol=0, atol=0)


def test_an_overflowing_forward_is_refused_before_it_writes() -> None:
    lm = CausalLM(_model("llama"))
    lm.reset(16)
    with pytest.raises(ValueError, match="overflows the static cache of 16 positions"):
        lm.forward(torch.arange(17) % VOCAB, keep=1)
    assert lm.cache_length == 0


def test_models_that_cannot_hold_a_static_cache_say_why() -> None:
    from test_hybrid import tiny_mamba_hybrid

    hybrid = tiny_mamba_hybrid(vocab_size=VOCAB)
    lm = CausalLM(hybrid)
    assert lm.static_obstacle is not None and "snapshot and replay" in lm.static_obstacle
    lm.reset(256)
    assert not lm.static, "a Mamba2 hybrid keeps its dynamic cache"


def test_a_sliding_window_model_holds_every_position_in_its_static_cache() -> None:
    """Sliding layers keep the whole context, like full ones (the window is the mask's), so the
    static cache's size counts them too."""
    from specdec.runtime.cache import static_cache_bytes

    sliding = tiny_model("gemma3", vocab_size=VOCAB, sliding_window=4, dtype=torch.float32)
    lm = CausalLM(sliding)
    assert lm.static_obstacle is None
    lm.reset(256)
    lm.forward(torch.tensor(PROMPT), keep=1)
    assert lm.static and lm.kv is not None and lm.tree_obstacle is None
    assert all(layer.keys.shape[2] == 256 for layer in lm.cache.layers)
    assert lm.kv.nbytes == static_cache_bytes(sliding.config, 256, torch.float32)


# --- compiled decoding equals eager decoding ------------------------------------------------------------

@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.usefixtures("strict_compile")
def test_compiled_greedy_decoding_equals_eager_on_every_architecture(arch: str) -> None:
    model = _model(arch)
    for drafter in (None, NgramDrafter()):
        eager = specdec.generate(model, PROMPT, drafter=drafter, max_new_tokens=40)
        compiled = specdec.generate(model, PROMPT, drafter=drafter, max_new_tokens=40, compile=True)
        assert compiled.tokens == eager.tokens
        assert compiled.stats.steps == eager.stats.steps and compiled.stats.accepted == eager.stats.accepted
    lm = CausalLM(model)
    specdec.generate(lm, PROMPT, max_new_tokens=3, compile=True)
    assert lm.compiled, f"{arch}: the compiled run fell back to eager ({compile_failures()})"


@pytest.mark.usefixtures("strict_compile")
def test_compiled_sampling_is_lossless() -> None:
    target, other = tiny_model(seed=0, **MODEL), tiny_model(seed=1, **MODEL)
    for drafter in (DraftModelDrafter(other), NgramDrafter(max_ngram=3)):
        counts, drafted, accepted, _ = sample_counts(target, drafter, PLAIN, compile=True)
        assert 0 < accepted < drafted
        p_value = chi_square_p_value(counts, exact_distribution(target, STAT_PROMPT, PLAIN))
        assert p_value >= ALPHA, f"{drafter.name}: compiled sampling is not lossless: p = {p_value:.3g}"


@pytest.mark.usefixtures("strict_compile")
def test_a_run_compiles_a_few_graphs_whatever_k_and_wherever_it_stops() -> None:
    """100 tokens, k varying from step to step, an EOS inside an accepted block: one graph per
    shape, not one per step. The draft model is the target itself (every draft accepted, so k
    climbs), with graphs of its own: the verify's k + 1 rows; the draft model's feed and draft
    loop at the largest k, and for k=auto's shorter chains its padded feed (its last logits
    only) and its one-row steps."""
    model = _model("llama", seed=2, layers=3, hidden=48)  # shapes no other test compiles; a varied output

    def drafter() -> AdaptiveDraftLength:
        return AdaptiveDraftLength(DraftModelDrafter(model), start=1)

    trace = Trace()
    reference = specdec.generate(model, PROMPT, drafter=drafter(), num_draft_tokens=6, max_new_tokens=100,
                                 trace=trace).tokens
    eos, start = None, 0
    for step in trace.steps:  # a token first emitted inside a block (neither first nor last), late in the run
        block = step.emitted
        fresh = [j for j in range(1, len(block) - 1) if block[j] not in reference[: start + j] and start + j >= 40]
        if fresh:
            eos = block[fresh[0]]
            break
        start += len(block)
    assert eos is not None, "no fresh token inside a late block: pick another prompt"
    before = _graphs()
    adaptive = drafter()
    result = specdec.generate(model, PROMPT, drafter=adaptive, num_draft_tokens=6, max_new_tokens=100,
                              eos_token_id=eos, compile=True)
    graphs = _graphs() - before
    assert result.tokens == reference[: reference.index(eos) + 1]
    assert len(set(adaptive.requested)) >= 3, f"k barely varied: {adaptive.requested}"
    assert result.stats.steps >= 6 and result.stats.new_tokens < result.stats.steps + result.stats.accepted, \
        "the EOS must cut an accepted block"
    assert 1 <= graphs <= 4, f"{graphs} graphs for {result.stats.steps} steps"


@pytest.mark.usefixtures("strict_compile")
def test_graphs_are_reused_by_later_calls_and_never_serve_another_model() -> None:
    model = _model("llama")
    specdec.generate(model, PROMPT, drafter="ngram", max_new_tokens=30, compile=True)
    before = _graphs()
    again = specdec.generate(model, PROMPT[:-2], drafter="ngram", max_new_tokens=24, compile=True)
    assert _graphs() == before, "a later call on the same model reuses its graphs"
    assert again.tokens == specdec.generate(model, PROMPT[:-2], drafter="ngram", max_new_tokens=24).tokens
    other = _model("llama", seed=5)  # the same class and shapes, other weights and an other norm epsilon
    other.config.rms_norm_eps = 1e-2
    for layer in other.modules():
        if hasattr(layer, "variance_epsilon"):
            layer.variance_epsilon = 1e-2
    result = specdec.generate(other, PROMPT, drafter="ngram", max_new_tokens=24, compile=True)
    assert _graphs() > before, "another model compiles graphs of its own (they skip module guards)"
    assert result.tokens == specdec.generate(other, PROMPT, drafter="ngram", max_new_tokens=24).tokens


@pytest.mark.usefixtures("strict_compile")
def test_a_tree_run_compiles_one_verify_graph_for_its_node_budget() -> None:
    model = _model("qwen3", layers=1, hidden=40)
    reference = hf_greedy(model, PROMPT, 30)
    before = _graphs()
    drafter = RandomTreeDrafter(seed=3, branching=3, max_nodes=10)
    result = specdec.generate(model, PROMPT, drafter=drafter, num_draft_tokens=3, max_new_tokens=30, compile=True)
    assert result.tokens == reference
    assert len({len(d.tokens) for d in drafter.drafts}) >= 4, "the trees' sizes must vary"
    assert _graphs() - before <= 3, "one row, and the tree padded to its budget (the first tree runs eagerly)"


class Undecidable(LlamaForCausalLM):
    """A causal LM whose forward branches on a value computed in it: dynamo cannot compile it whole."""

    def forward(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        out = super().forward(*args, **kwargs)
        if float(out.logits.sum()) > float("inf"):  # never true, but only known at run time
            raise AssertionError
        return out


def test_a_model_dynamo_cannot_compile_decodes_eagerly_with_a_warning() -> None:
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, bos_token_id=None, eos_token_id=None,
                         pad_token_id=None)
    torch.manual_seed(0)
    model = Undecidable(config).eval()
    with pytest.warns(UserWarning, match="cannot compile the Undecidable forward"):
        compiled = specdec.generate(model, PROMPT, drafter="ngram", max_new_tokens=20, compile=True)
    assert compiled.tokens == specdec.generate(model, PROMPT, drafter="ngram", max_new_tokens=20).tokens
    assert len(compiled.tokens) == 20


# --- bfloat16: mismatches only at near-ties ----------------------------------------------------------

@pytest.mark.usefixtures("strict_compile")
def test_bfloat16_compiled_greedy_matches_transformers_up_to_near_ties() -> None:
    model = _model("llama", dtype=torch.bfloat16)
    reference = hf_greedy(model, PROMPT, 40)
    for drafter in (None, "ngram"):
        result = specdec.generate(model, PROMPT, drafter=drafter, max_new_tokens=40, compile=True)
        assert_greedy_matches_up_to_near_ties(model, PROMPT, result.tokens, reference)


def test_the_near_tie_rule_fails_a_mismatch_that_is_no_tie() -> None:
    model = _model("llama", dtype=torch.bfloat16)
    reference = hf_greedy(model, PROMPT, 12)
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([PROMPT + reference])).logits[0, len(PROMPT) - 1 : -1].float()
    top = logits.topk(2, dim=-1).values  # (12, 2)
    clearest = int((top[:, 0] - top[:, 1]).argmax())  # the position furthest from a tie
    wrong = list(reference)
    wrong[clearest] = (wrong[clearest] + 1) % VOCAB
    with pytest.raises(AssertionError, match="not a rounding tie"):
        assert_greedy_matches_up_to_near_ties(model, PROMPT, wrong, reference)


@pytest.mark.usefixtures("strict_compile")
def test_the_verifier_works_in_float32_for_a_bfloat16_target(monkeypatch: pytest.MonkeyPatch) -> None:
    import specdec.verifier.rules as loop  # the loop takes its chain verdict from the rule's table

    seen: list[tuple[torch.dtype, torch.dtype | None]] = []
    verdict = loop.chain_verdict

    def recording(p, tokens, q, generator):  # type: ignore[no-untyped-def]
        seen.append((p.dtype, None if q is None else q.dtype))
        return verdict(p, tokens, q, generator)

    monkeypatch.setattr(loop, "chain_verdict", recording)
    monkeypatch.setattr(loop, "block_verdict", recording)  # whichever chain rule the run uses
    model = _model("llama", dtype=torch.bfloat16)
    other = tiny_model("llama", vocab_size=VOCAB, seed=1, layers=1, dtype=torch.bfloat16)
    specdec.generate(model, PROMPT, drafter=DraftModelDrafter(other), max_new_tokens=10,
                     sampling=Sampling(temperature=0.9), seed=0, compile=True)
    assert seen and all(p == torch.float32 and q in (torch.float32, None) for p, q in seen), seen


# --- a drafter that raises is named -----------------------------------------------------------------------

class Raising(NgramDrafter):
    name = "raising"

    def __init__(self, method: str) -> None:
        super().__init__()
        self.method = method

    def prefill(self, ctx: DraftContext) -> None:
        self._maybe("prefill")
        super().prefill(ctx)

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        self._maybe("propose")
        return super().propose(ctx, k)

    def commit(self, ctx: DraftContext, num_accepted: int) -> None:
        self._maybe("commit")
        super().commit(ctx, num_accepted)

    def _maybe(self, method: str) -> None:
        if method == self.method:
            raise RuntimeError(f"boom in {method}")


@pytest.mark.parametrize("method", ["prefill", "propose", "commit"])
def test_a_drafter_that_raises_is_reported_as_a_draft_error_naming_it(method: str) -> None:
    with pytest.raises(DraftError, match=f"drafter 'raising' raised in {method}: RuntimeError: boom in {method}") \
            as error:
        specdec.generate(_model("llama"), PROMPT, drafter=Raising(method), max_new_tokens=8)
    assert isinstance(error.value.__cause__, RuntimeError)


def test_a_tree_larger_than_the_declared_budget_is_refused_naming_the_drafter() -> None:
    class Overgrown(RandomTreeDrafter):
        name = "overgrown"

        def max_draft_nodes(self, k: int) -> int:
            return 2

    with pytest.raises(DraftError, match="'overgrown' returned a tree of .* max_draft_nodes\\(3\\) is 3"):
        specdec.generate(_model("llama"), PROMPT, drafter=Overgrown(seed=1, branching=4, max_nodes=12),
                         num_draft_tokens=3, max_new_tokens=30)


def test_compile_must_be_a_bool() -> None:
    with pytest.raises(ValueError, match="compile must be True or False, got 'yes'"):
        specdec.generate(_model("llama"), PROMPT, compile="yes")  # type: ignore[arg-type]


@pytest.mark.usefixtures("strict_compile")
def test_warnings_are_not_raised_by_a_clean_compiled_run() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        specdec.generate(_model("llama"), PROMPT, drafter="ngram", max_new_tokens=10, compile=True)


# --- what runs on a static cache, and what compiles -------------------------------------------------

def test_models_transformers_runs_on_dynamic_caches_only_keep_them_and_decode_exactly() -> None:
    from transformers import GPTNeoConfig, GPTNeoForCausalLM

    torch.manual_seed(0)
    config = GPTNeoConfig(vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=4, max_position_embeddings=64,
                          attention_types=[[["global", "local"], 1]], window_size=8, bos_token_id=None,
                          eos_token_id=None, pad_token_id=None)
    model = GPTNeoForCausalLM(config).double().eval()
    lm = CausalLM(model)
    assert lm.static_obstacle is not None and "dynamic caches only" in lm.static_obstacle
    result = specdec.generate(model, PROMPT, drafter="ngram", max_new_tokens=30)
    assert result.tokens == hf_greedy(model, PROMPT, 30)


def test_attention_that_would_read_a_static_caches_tail_keeps_a_dynamic_cache() -> None:
    model = _model("llama")
    model.config._attn_implementation = "flash_attention_2"
    obstacle = CausalLM(model).static_obstacle
    assert obstacle is not None and "'flash_attention_2'" in obstacle


def test_draws_invert_the_cdf_exactly_over_a_large_vocabulary() -> None:
    from specdec.sampling import draw

    generator = torch.Generator().manual_seed(0)
    probs = torch.randn(151_936, generator=generator).softmax(-1)  # float32, as a model's q
    probs[::97] = 0.0
    probs /= probs.sum()
    cdf = probs.double().cumsum(0)
    start = torch.cat([torch.zeros(1, dtype=torch.float64), cdf[:-1]])
    bins = torch.randint(0, probs.numel(), (4000,), generator=generator)
    bins = bins[probs[bins] > 0]
    uniforms = ((start[bins] + cdf[bins]) / 2 / cdf[-1])  # the middle of each bin

    def drawn_at(points: torch.Tensor) -> torch.Tensor:  # a row per point, 64 rows per call (a float64 CDF each)
        return torch.cat([draw(probs.expand(chunk.numel(), -1), chunk) for chunk in points.split(64)])

    drawn = drawn_at(uniforms)
    assert torch.equal(drawn, bins), f"{int((drawn != bins).sum())} of {bins.numel()} draws left their bin"
    zero = torch.arange(0, probs.numel(), 97)[:500]  # a uniform at a zero-width bin's place lands past it
    landed = drawn_at((start[zero] / cdf[-1]).clamp(max=1 - 1e-12))
    assert bool((probs[landed] > 0).all())


def test_a_step_is_kept_per_function_and_per_structure_of_the_modules_it_takes() -> None:
    from torch import nn

    from specdec.runtime.engine import step_for

    owner = nn.Linear(4, 4)

    def first(module, x):  # type: ignore[no-untyped-def]
        return x + 1

    def second(module, x):  # type: ignore[no-untyped-def]
        return x + 2

    steps: dict = {}
    plain, biased = nn.Linear(4, 8, bias=False), nn.Linear(4, 8)
    a = step_for(steps, first, "loop", False, owner, (plain, torch.zeros(1)))
    assert step_for(steps, first, "loop", False, owner, (nn.Linear(4, 8, bias=False), torch.ones(1))) is a
    assert step_for(steps, second, "loop", False, owner, (plain, torch.zeros(1))) is not a
    assert step_for(steps, first, "loop", False, owner, (biased, torch.zeros(1))) is not a


class _Scaled(torch.nn.Module):
    """A module whose graph reads a plain attribute (`scale`) besides its weights."""

    def __init__(self, scale: float) -> None:
        super().__init__()
        self.linear, self.scale = torch.nn.Linear(4, 4), scale


def _scaled(module: _Scaled, x: torch.Tensor) -> torch.Tensor:
    return module.linear(x) * module.scale


@pytest.mark.usefixtures("strict_compile")
def test_modules_of_one_structure_share_compiled_graphs_and_others_do_not() -> None:
    from torch._dynamo.utils import counters

    from specdec.runtime.engine import Step, structure

    x = torch.randn(3, 4)
    first, twin, other = _Scaled(2.0), _Scaled(2.0), _Scaled(3.0)  # twin: other weights; other: another scale
    other.load_state_dict(first.state_dict())
    assert structure(first) == structure(twin) != structure(other)
    graphs = []
    for module in (first, twin, other):
        before = counters["stats"]["unique_graphs"]
        out = Step(_scaled, "scaled", True, module)(x)
        graphs.append(counters["stats"]["unique_graphs"] - before)
        torch.testing.assert_close(out, _scaled(module, x))  # its own weights and its own scale
    assert graphs == [1, 0, 1], f"graphs compiled per module: {graphs}"


def test_eager_decoding_takes_a_dynamic_cache_unless_the_model_needs_the_static_one() -> None:
    """Static caches serve compiled graphs; eagerly a full-attention model decodes on a dynamic
    cache (no attention over unwritten columns, no padding rows), a sliding one keeps the static
    cache it needs, and the tokens are the same either way."""
    from specdec.types import Engine

    engine = Engine(compile=False, max_length=100, max_draft=4)
    assert engine.cache_capacity() is None and engine.cache_capacity(static=True) == engine.capacity()
    assert Engine(compile=True, max_length=100, max_draft=4).cache_capacity() == engine.capacity()
    full, sliding = CausalLM(_model("llama")), CausalLM(tiny_model("mistral", vocab_size=VOCAB, sliding_window=4))
    assert not full.static_eagerly and sliding.static_eagerly
    for lm, static in ((full, False), (sliding, True)):
        eager = specdec.generate(lm, PROMPT, drafter="ngram", max_new_tokens=12).tokens
        assert lm.static is static
        lm.static_eagerly = not static  # the other kind of cache, for the same tokens
        assert specdec.generate(lm, PROMPT, drafter="ngram", max_new_tokens=12).tokens == eager
        assert lm.static is not static


def test_preparing_a_model_run_eagerly_before_keeps_its_hidden_states_once_per_layer() -> None:
    """An eager forward installs transformers' output hooks on the inner model; preparing the model
    for compilation afterwards must not install them again (every layer would be recorded twice, and
    a drafter reading hidden_states[i] would read another layer)."""
    from specdec.runtime.forward import prepare_for_compile

    model = tiny_model("qwen3", layers=4)
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():
        before = model(input_ids=ids, output_hidden_states=True).hidden_states
        prepare_for_compile(model)
        after = model(input_ids=ids, output_hidden_states=True).hidden_states
    assert len(after) == len(before) == 5
    assert all(torch.equal(a, b) for a, b in zip(after, before))
