"""EAGLE-3 drafter: both checkpoint layouts, parity, an independent recomputation of its drafts
from the stored tensors, losslessness, cache invariants, round trips and errors.

Tiny float64 heads with a draft vocabulary smaller than the target's and non-default layer ids
are written by `write_head` in the SGLang or the speculators layout.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch.nn import functional as F
from transformers import LlamaConfig, PreTrainedModel

from specdec.protocols import row_view
import specdec
from specdec import Sampling
from specdec.drafters.feature_heads.eagle3 import Eagle3Drafter
from specdec.drafters.feature_heads.eagle3_files import load_eagle3, save_eagle3
from specdec.drafters.feature_heads.eagle3_head import SGLANG, SPECULATORS, Eagle3Head, Eagle3Spec
from specdec.drafters.shared.chains import chain_length
from specdec.drafters.feature_heads.feature_pairs import PREFILL_HOLD
from specdec.runtime.target import CausalLM
from specdec.verifier import DraftError

from test_lossless_statistical import MODEL, TRUNCATED, VOCAB, chi_square_p_value, exact_distribution, sample_counts
from tiny import hf_greedy, tiny_model

ALPHA = 1e-4
PROMPTS = [[1, 2, 3, 4, 5, 6], [7, 7, 8, 9, 10, 11, 12, 13, 14]]
NEW = 24
LAYERS = (1, 2, 3)  # hidden_states indices of a 4-layer target; the default would be (2, 2, 1)


def head_spec(vocab: int = 64, draft_vocab: int = 40, hidden: int = 32, target_hidden: int = 32,
              layers: tuple[int, ...] | None = LAYERS, norm_before_residual: bool = False,
              layout: str = SGLANG) -> Eagle3Spec:
    heads = 4 if hidden % 4 == 0 else 2
    config = LlamaConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=1,
                         num_attention_heads=heads, num_key_value_heads=2, head_dim=hidden // heads,
                         vocab_size=vocab, rope_theta=10000.0)
    return Eagle3Spec(config, draft_vocab, target_hidden, layers, norm_before_residual, layout)


def random_eagle3(seed: int = 0, own_embedding: bool = False, scale: float = 1.0, **spec) -> Eagle3Head:
    """A random head whose draft vocabulary is a random subset of the target's, ids ascending."""
    torch.manual_seed(seed)
    head = Eagle3Head(head_spec(**spec), own_embedding=own_embedding).double()
    vocab, draft = head.config.vocab_size, head.spec.draft_vocab_size
    chosen = torch.randperm(vocab)[:draft].sort().values
    with torch.no_grad():
        for name, parameter in head.named_parameters():
            if name.endswith("norm.weight"):
                parameter.uniform_(0.5, 1.5)
            else:
                parameter.normal_(0.0, 0.3)
        head.lm_head.weight.mul_(scale)
        head.d2t.copy_(chosen - torch.arange(draft))
        head.t2d.zero_()
        head.t2d[chosen] = True
    return head.eval()


def write_head(path: Path, layout: str = SGLANG, seed: int = 0, **options) -> Path:
    return save_eagle3(random_eagle3(seed, **options), path, layout=layout)


@pytest.fixture(scope="module")
def target() -> PreTrainedModel:
    return tiny_model("llama", seed=3, layers=4)


# --- an independent EAGLE-3 forward from the stored tensors (no cache, no specdec modules) ---


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rotate(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Llama's rotary embedding of x [heads, n, d] at positions [n]."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = positions.double()[:, None] * inv[None]  # (n, d/2)
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()
    half = torch.cat([-x[..., d // 2 :], x[..., : d // 2]], -1)
    return x * cos + half * sin


def reference_layer(w: dict[str, torch.Tensor], config: dict, embeds: torch.Tensor, g: torch.Tensor,
                    positions: torch.Tensor, norm_before_residual: bool) -> torch.Tensor:
    """The decoder layer over n rows with causal attention: outputs [n, H] before the final norm."""
    eps, heads, kv = config["rms_norm_eps"], config["num_attention_heads"], config["num_key_value_heads"]
    d = config["head_dim"]
    normed = _rms(g, w["midlayer.hidden_norm.weight"], eps)
    residual = normed if norm_before_residual else g
    x = torch.cat([_rms(embeds, w["midlayer.input_layernorm.weight"], eps), normed], -1)
    n = x.shape[0]
    q = (x @ w["midlayer.self_attn.q_proj.weight"].T).view(n, heads, d).transpose(0, 1)
    k = (x @ w["midlayer.self_attn.k_proj.weight"].T).view(n, kv, d).transpose(0, 1)
    v = (x @ w["midlayer.self_attn.v_proj.weight"].T).view(n, kv, d).transpose(0, 1)
    q, k = _rotate(q, positions, config["rope_theta"]), _rotate(k, positions, config["rope_theta"])
    k, v = k.repeat_interleave(heads // kv, 0), v.repeat_interleave(heads // kv, 0)
    scores = q @ k.transpose(1, 2) / math.sqrt(d) + torch.full((n, n), float("-inf"), dtype=q.dtype).triu(1)
    attended = (scores.softmax(-1) @ v).transpose(0, 1).reshape(n, heads * d) @ w["midlayer.self_attn.o_proj.weight"].T
    h = residual + attended
    m = _rms(h, w["midlayer.post_attention_layernorm.weight"], eps)
    mlp = (F.silu(m @ w["midlayer.mlp.gate_proj.weight"].T) * (m @ w["midlayer.mlp.up_proj.weight"].T))
    return h + mlp @ w["midlayer.mlp.down_proj.weight"].T


def reference_draft(path: Path, target: PreTrainedModel, tokens: list[int], k: int) -> list[int]:
    """Greedy EAGLE-3 drafts after `tokens`, recomputed from the SGLang-layout files alone."""
    w = load_file(str(path / "model.safetensors"))
    config = json.loads((path / "config.json").read_text())
    layers = [i + 1 for i in config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]]
    ids = torch.tensor(tokens)
    with torch.no_grad():
        states = target(input_ids=ids[None, :-1], output_hidden_states=True).hidden_states
    fused = torch.cat([states[i][0] for i in layers], -1) @ w["fc.weight"].T  # (T-1, H)
    embed = w.get("embed_tokens.weight", target.get_input_embeddings().weight.detach())
    embeds, feeds, drafted = embed[ids[1:]], fused, []
    for depth in range(k):
        out = reference_layer(w, config, embeds, feeds, torch.arange(feeds.shape[0]), config["norm_before_residual"])
        logits = _rms(out[-1], w["norm.weight"], config["rms_norm_eps"]) @ w["lm_head.weight"].T  # (V_draft,)
        best = int(logits.argmax())
        token = best + int(w["d2t"][best])
        drafted.append(token)
        embeds, feeds = torch.cat([embeds, embed[token][None]]), torch.cat([feeds, out[-1:]])
    return drafted


class Spy:
    """Wraps an Eagle3Drafter; checks the cache invariant after every call and records drafts."""

    name = "eagle3-spy"
    uses_hidden_states = True

    def __init__(self, inner: Eagle3Drafter) -> None:
        self.inner = row_view(inner)
        self.drafts: list[list[int]] = []
        self.contexts: list[list[int]] = []
        self.sampled = 0

    def hidden_layers(self, target):
        return self.inner.hidden_layers(target)

    def max_draft_nodes(self, k):
        return self.inner.max_draft_nodes(k)

    def prefill(self, ctx) -> None:
        self.inner.prefill(ctx)
        assert self.inner.cache_length == max(len(ctx.tokens) - 1 - PREFILL_HOLD, 0)  # every pair but the last

    def propose(self, ctx, k):
        draft = self.inner.propose(ctx, k)
        n = draft.tokens.shape[0]
        if draft.parents is None:
            drafted = chain_length(ctx, k) if n else 0  # a chain the budget's end cuts short is the usual one, cut
            assert self.inner.cache_length == len(ctx.tokens) - 1 + max(drafted - 1, 0)
        if not ctx.sampling.greedy and n:
            assert draft.probs is not None and draft.probs.shape == (n, ctx.vocab_size)
            outside = ~self.inner.head.t2d.to(draft.probs.device)
            assert float(draft.probs[:, outside].abs().max()) == 0.0, "q must be zero outside the draft vocabulary"
            self.sampled += 1
        self.drafts.append(draft.tokens.tolist())
        self.contexts.append(ctx.tokens.tolist())
        return draft

    def commit(self, ctx, num_accepted) -> None:
        self.inner.commit(ctx, num_accepted)
        assert self.inner.cache_length == len(ctx.tokens) - 1 - ctx.hidden_states.shape[0]


@pytest.mark.parametrize("layout", [SGLANG, SPECULATORS])
@pytest.mark.parametrize("tree", [False, True])
def test_greedy_output_equals_plain_decoding(target, tmp_path, layout, tree):
    spy = Spy(Eagle3Drafter(write_head(tmp_path, layout, scale=4.0), tree=tree, total_tokens=10))
    for prompt in PROMPTS:
        result = specdec.generate(target, prompt, drafter=spy, num_draft_tokens=4, max_new_tokens=NEW)
        assert result.tokens == hf_greedy(target, prompt, NEW)
        assert result.stats.drafted > 0
    drafted = {token for draft in spy.drafts for token in draft}
    assert drafted <= set(spy.inner.head.t2d.nonzero().flatten().tolist()), "drafts stay in the draft vocabulary"


@pytest.mark.parametrize("norm_before_residual", [False, True])
def test_drafts_equal_an_independent_recomputation_from_the_stored_tensors(target, tmp_path, norm_before_residual):
    path = write_head(tmp_path, seed=5, scale=4.0, norm_before_residual=norm_before_residual)
    spy = Spy(Eagle3Drafter(path))
    specdec.generate(target, PROMPTS[1], drafter=spy, num_draft_tokens=3, max_new_tokens=12)
    assert len(spy.drafts) >= 3
    for context, draft in zip(spy.contexts, spy.drafts):
        assert draft == reference_draft(path, target, context, len(draft)), context


def test_a_head_of_its_own_width_and_embedding_recomputes_and_keeps_parity(target, tmp_path):
    path = write_head(tmp_path, SGLANG, seed=6, hidden=16, own_embedding=True, scale=4.0)
    assert "embed_tokens.weight" in load_file(str(path / "model.safetensors"))
    spy = Spy(Eagle3Drafter(path))
    result = specdec.generate(target, PROMPTS[0], drafter=spy, num_draft_tokens=3, max_new_tokens=NEW)
    assert result.tokens == hf_greedy(target, PROMPTS[0], NEW)
    for context, draft in list(zip(spy.contexts, spy.drafts))[:3]:
        assert draft == reference_draft(path, target, context, len(draft))


def test_sampled_continuations_match_plain_sampling(tmp_path):
    model = tiny_model(seed=0, **MODEL)  # one layer: hidden states 0 (embeddings) and 1 (post-norm)
    path = write_head(tmp_path, seed=4, vocab=VOCAB, draft_vocab=VOCAB - 1, hidden=MODEL["hidden"],
                      target_hidden=MODEL["hidden"], layers=(0, 1, 1))
    drafter = Eagle3Drafter(path)
    counts, drafted, accepted, deep = sample_counts(model, drafter, TRUNCATED)
    assert drafted > 0 and 0 < accepted < drafted and deep > 0, (drafted, accepted, deep)
    p_value = chi_square_p_value(counts, exact_distribution(model, [1, 2, 3, 1, 2, 3, 1, 2], TRUNCATED))
    assert p_value >= ALPHA, f"eagle3 is not lossless: chi-square p = {p_value:.3g}"


@pytest.mark.parametrize("tree", [False, True])
def test_sampled_run_keeps_the_cache_invariant_and_q_inside_the_draft_vocabulary(target, tmp_path, tree):
    spy = Spy(Eagle3Drafter(write_head(tmp_path, scale=2.0), tree=tree, total_tokens=10))
    result = specdec.generate(target, PROMPTS[0], drafter=spy, max_new_tokens=NEW,
                              sampling=Sampling(temperature=0.8, top_k=20), seed=5)
    assert len(result.tokens) == NEW and result.stats.drafted > 0 and spy.sampled > 0


def test_layouts_round_trip_with_identical_tensors_and_drafts(target, tmp_path):
    first = write_head(tmp_path / "sglang", SGLANG, seed=7, scale=4.0)
    second = save_eagle3(load_eagle3(first), tmp_path / "speculators", layout=SPECULATORS)
    third = save_eagle3(load_eagle3(second), tmp_path / "back", layout=SGLANG, safe=False)
    heads = [load_eagle3(path) for path in (first, second, third)]
    for head in heads[1:]:
        assert head.spec.layers == LAYERS and head.spec.draft_vocab_size == 40
        for key, value in heads[0].state_dict().items():
            assert torch.equal(value, head.state_dict()[key]), key
    drafts = []
    for path in (first, second, third):
        spy = Spy(Eagle3Drafter(path))
        specdec.generate(target, PROMPTS[1], drafter=spy, max_new_tokens=NEW)
        drafts.append(spy.drafts)
    assert drafts[0] == drafts[1] == drafts[2] and drafts[0]


def test_layer_ids_are_stored_in_each_engines_convention(tmp_path):
    sglang = json.loads((write_head(tmp_path / "a", SGLANG) / "config.json").read_text())
    speculators = json.loads((write_head(tmp_path / "b", SPECULATORS) / "config.json").read_text())
    assert sglang["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 1, 2]  # layer outputs
    assert speculators["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]  # hidden_states indices
    assert sglang["architectures"] == ["LlamaForCausalLMEagle3"]
    assert speculators["architectures"] == ["Eagle3Speculator"] and speculators["speculators_model_type"] == "eagle3"
    assert speculators["norm_before_residual"] is False and "transformer_layer_config" in speculators
    keys = load_file(str(tmp_path / "b" / "model.safetensors")).keys()
    assert "layers.0.hidden_norm.weight" in keys and not any(key.startswith("midlayer.") for key in keys)


def test_absent_norm_before_residual_reads_as_each_engine_does(tmp_path):
    for layout, expected in ((SPECULATORS, True), (SGLANG, False)):
        path = write_head(tmp_path / layout, layout)
        config = json.loads((path / "config.json").read_text())
        del config["norm_before_residual"]
        (path / "config.json").write_text(json.dumps(config))
        assert load_eagle3(path).spec.norm_before_residual is expected, layout


def test_default_layers_follow_the_target_and_absent_ones_are_refused(tmp_path):
    path = write_head(tmp_path / "default", layers=None)
    drafter = Eagle3Drafter(path)
    assert drafter.hidden_layers(CausalLM(tiny_model("llama", layers=8))) == (2, 4, 5)
    with pytest.raises(DraftError, match=r"eagle3.*\(2, 1, -1\).*2 layers"):
        specdec.generate(tiny_model("llama", layers=2), PROMPTS[0], drafter=drafter, max_new_tokens=4)
    bad = write_head(tmp_path / "far", layers=(1, 2, 9))
    with pytest.raises(DraftError, match=r"\(1, 2, 9\).*4 layers"):
        specdec.generate(tiny_model("llama", layers=4), PROMPTS[0], drafter=Eagle3Drafter(bad), max_new_tokens=4)


def rewrite(path: Path, change) -> Path:
    weights = load_file(str(path / "model.safetensors"))
    change(weights)
    save_file(weights, str(path / "model.safetensors"))
    return path


def test_wrong_fc_weight_names_file_key_and_both_shapes(target, tmp_path):
    path = rewrite(write_head(tmp_path), lambda w: w.update({"fc.weight": torch.zeros(32, 64, dtype=torch.float64)}))
    with pytest.raises(ValueError, match=r"model\.safetensors: 'fc\.weight' has shape \(32, 64\), expected \(32, 96\)"):
        Eagle3Drafter(path)
    narrow = write_head(tmp_path / "narrow", target_hidden=16)  # fc [32, 48]: made for a 16-wide target
    with pytest.raises(DraftError, match=r"'fc\.weight' has shape \(32, 48\).*\(32, 96\).*hidden size 32"):
        specdec.generate(target, PROMPTS[0], drafter=Eagle3Drafter(narrow), max_new_tokens=4)


def test_d2t_longer_than_the_draft_vocabulary_is_refused(tmp_path):
    path = rewrite(write_head(tmp_path), lambda w: w.update({"d2t": torch.zeros(41, dtype=torch.long)}))
    with pytest.raises(ValueError, match=r"'d2t' has shape \(41,\), expected \(40,\)"):
        load_eagle3(path)


def test_id_outside_the_target_vocabulary_is_refused(tmp_path):
    def push(weights):
        weights["d2t"][-1] = 100

    with pytest.raises(ValueError, match=r"'d2t' maps draft id 39 to 139, outside the target vocabulary \[0, 64\)"):
        load_eagle3(rewrite(write_head(tmp_path), push))


def test_missing_key_and_foreign_checkpoints_are_named(tmp_path):
    path = rewrite(write_head(tmp_path / "a"), lambda w: w.pop("midlayer.hidden_norm.weight"))
    with pytest.raises(KeyError, match=r"lacks 'midlayer\.hidden_norm\.weight' \(expected shape \(32,\)\)"):
        load_eagle3(path)
    eagle1 = rewrite(write_head(tmp_path / "b"), lambda w: w.update({"layers.1.mlp.up_proj.weight": torch.zeros(2)}))
    with pytest.raises(ValueError, match="keys an EAGLE-3 head does not have"):
        load_eagle3(eagle1)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_eagle3(tmp_path / "empty")
    config = json.loads((tmp_path / "a" / "config.json").read_text())
    (tmp_path / "a" / "config.json").write_text(json.dumps({**config, "fc_norm": True}))
    with pytest.raises(ValueError, match="'fc_norm' is set"):
        load_eagle3(tmp_path / "a")


def test_a_full_vocabulary_head_may_omit_the_mapping(target, tmp_path):
    path = write_head(tmp_path, draft_vocab=64, scale=4.0)
    rewrite(path, lambda w: (w.pop("d2t"), w.pop("t2d")))
    result = specdec.generate(target, PROMPTS[0], drafter=Eagle3Drafter(path), max_new_tokens=NEW)
    assert result.tokens == hf_greedy(target, PROMPTS[0], NEW) and result.stats.drafted > 0


def test_training_time_test_sees_what_drafting_sees(target):
    """Each unrolled training step at position j gives the logits the head computes when it drafts
    that deep after j, on a cache of the real pairs (teacher-forced tokens)."""
    from transformers import DynamicCache

    from specdec.training.eagle3 import Eagle3Student
    from specdec.training.teacher import teacher_batch

    ids = torch.randint(0, 64, (1, 12), generator=torch.Generator().manual_seed(0))
    student = Eagle3Student.create(target, ids.flatten(), seed=1, draft_vocab=40, layers=LAYERS, steps=4)
    head = student.module.double().eval()
    batch = teacher_batch(target, ids, student.hidden_layers)
    embed = target.get_input_embeddings()
    with torch.no_grad():
        unrolled = student._unroll(batch, 4)  # step i: [1, 11 - i, V_draft]
        fused = torch.cat([batch.layers[i][0] for i in LAYERS], dim=-1)  # (12, 3H)
        for j in (0, 4, 7):
            cache = DynamicCache(config=head.config)
            out = head(embed(ids[0, 1 : j + 2]), fused[: j + 1], torch.arange(j + 1), cache)[-1:]  # pairs 0..j
            for i in range(4):
                if i:  # drafting depth i + 1: the previous output and the (teacher-forced) token x_{j+1+i}
                    out = head(embed(ids[0, j + 1 + i : j + 2 + i]), out, torch.tensor([j + i]), cache)
                torch.testing.assert_close(head.draft_logits(out)[0], unrolled[i][0, j], rtol=1e-9, atol=1e-9)


def test_training_layers_are_three_ascending_served_layers_where_the_target_has_them():
    from specdec.training.eagle3 import training_layers

    assert training_layers(32) == (2, 16, 29)  # EAGLE-3's default
    assert training_layers(4) == (1, 2, 3) and training_layers(6) == (1, 3, 5)
    assert training_layers(2) == (1, 1, 1)  # too few layers: repeats
    assert all(1 <= i <= L - 1 for L in range(4, 40) for i in training_layers(L))
    assert all(len(set(training_layers(L))) == 3 for L in range(4, 40))
