"""EAGLE-1 drafter: parity, losslessness, its KV cache invariant, checkpoints and their errors.

Tiny float64 EAGLE heads (a 1-layer Llama config, whatever the target) are written in both
public formats (model.safetensors, pytorch_model.bin) and loaded back through `EagleDrafter`.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.nn.functional import cross_entropy
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig, PreTrainedModel

from specdec.protocols import row_view
import specdec
from specdec import Sampling
from specdec.drafters.feature_heads.eagle import EagleDrafter, EagleHead, load_eagle, save_eagle
from specdec.drafters.shared.chains import chain_length
from specdec.drafters.feature_heads.feature_pairs import PREFILL_HOLD
from specdec.plugins import load_registry

from test_lossless_statistical import MODEL, TRUNCATED, VOCAB, chi_square_p_value, exact_distribution, sample_counts
from tiny import hf_greedy, tiny_model

ALPHA = 1e-4
PROMPTS = [[1, 2, 3, 4, 5, 6], [7, 7, 8, 9, 10, 11, 12, 13, 14]]
NEW = 24


def eagle_config(hidden: int = 32, vocab: int = 64) -> LlamaConfig:
    return LlamaConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=1,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4, vocab_size=vocab,
                       architectures=["LlamaForCausalLM"])


def random_head(seed: int = 0, hidden: int = 32, vocab: int = 64) -> EagleHead:
    torch.manual_seed(seed)
    return EagleHead(eagle_config(hidden, vocab)).double().eval()


def target_features(target: PreTrainedModel, ids: torch.Tensor) -> torch.Tensor:
    """Post-final-norm last hidden states [B, L, H] of ids [B, L] (as the loop's adapter reads them)."""
    with torch.no_grad():
        return target(input_ids=ids, output_hidden_states=True).hidden_states[-1]


def train_head(target: PreTrainedModel, head: EagleHead, steps: int = 100) -> EagleHead:
    """Fit the head to the target's greedy continuations of PROMPTS and two random prompts.

    Loss: cross-entropy of the target LM head on f̂_{j+1} against the target's argmax at j+1,
    plus the feature regression |f̂_{j+1} - f_{j+1}|^2 (EAGLE trains both).
    """
    generator = torch.Generator().manual_seed(0)
    prompts = [p[:6] for p in PROMPTS] + [torch.randint(0, 64, (6,), generator=generator).tolist() for _ in range(2)]
    ids = torch.tensor([p + specdec.generate(target, p, max_new_tokens=NEW + 4).tokens for p in prompts])  # (B, L)
    features = target_features(target, ids)  # (B, L, H)
    lm_head = target.get_output_embeddings().weight.detach()  # (V, H)
    with torch.no_grad():
        embeds = target.get_input_embeddings()(ids)  # (B, L, H)
        goal = (features @ lm_head.T).argmax(-1)  # (B, L)
    positions = torch.arange(ids.shape[1] - 1)
    optimizer = torch.optim.Adam(head.parameters(), lr=3e-3)
    head.train()
    for _ in range(steps):
        optimizer.zero_grad()
        loss = torch.zeros((), dtype=torch.float64)
        for b in range(ids.shape[0]):
            predicted = head(embeds[b, 1:], features[b, :-1], positions)  # (L-1, H): f̂_1 .. f̂_{L-1}
            loss = loss + cross_entropy(predicted @ lm_head.T, goal[b, 1:]) \
                + (predicted - features[b, 1:]).pow(2).mean()
        loss.backward()
        optimizer.step()
    return head.eval()


@pytest.fixture(scope="module")
def llama() -> PreTrainedModel:
    return tiny_model("llama", seed=0)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    """The same random head written as safetensors and as pytorch_model.bin."""
    head = random_head(seed=1)
    root = tmp_path_factory.mktemp("eagle")
    return {"safetensors": save_eagle(head, root / "st", safe=True), "bin": save_eagle(head, root / "bin", safe=False)}


@pytest.fixture(scope="module")
def trained(llama, tmp_path_factory) -> Path:
    return save_eagle(train_head(llama, random_head(seed=2)), tmp_path_factory.mktemp("eagle") / "trained")


def reference_draft(head: EagleHead, target: PreTrainedModel, tokens: torch.Tensor, k: int) -> list[int]:
    """Greedy EAGLE drafts recomputed from scratch (no cache): real pairs, then drafted features."""
    embed, lm_head = target.get_input_embeddings(), target.get_output_embeddings()
    features = target_features(target, tokens[None, :-1])[0]  # (T-1, H) f_0 .. f_{T-2}
    embeds = embed(tokens[1:])  # (T-1, H) x_1 .. x_{T-1}
    drafted = []
    for _ in range(k):
        feature = head(embeds, features, torch.arange(embeds.shape[0]))[-1:]  # (1, H)
        token = lm_head(feature).argmax(-1)  # (1,)
        drafted.append(int(token))
        embeds, features = torch.cat([embeds, embed(token)]), torch.cat([features, feature])
    return drafted


class Spy:
    """Wraps an EagleDrafter; checks the cache invariant after every call and records drafts."""

    name = "eagle-spy"
    uses_hidden_states = True

    def __init__(self, inner: EagleDrafter, reference: PreTrainedModel | None = None) -> None:
        self.inner, self.reference = row_view(inner), reference
        self.drafts: list[list[int]] = []
        self.checks = 0
        self.sampled = 0

    def prefill(self, ctx) -> None:
        self.inner.prefill(ctx)
        assert self.inner.cache_length == max(len(ctx.tokens) - 1 - PREFILL_HOLD, 0), (
            "after prefill every real pair but the last is fed")
        self.checks += 1

    def propose(self, ctx, k):
        draft = self.inner.propose(ctx, k)
        n = draft.tokens.shape[0]
        drafted = chain_length(ctx, k) if n else 0  # a chain the budget's end cuts short is the usual one, cut
        assert self.inner.cache_length == len(ctx.tokens) - 1 + max(drafted - 1, 0), (
            f"after drafting {n}: cache {self.inner.cache_length}, committed {len(ctx.tokens)}")
        self.drafts.append(draft.tokens.tolist())
        if not ctx.sampling.greedy and n:  # sampled drafts report q, normalised rows [n, V]
            assert draft.probs is not None and draft.probs.shape == (n, ctx.vocab_size)
            self.sampled += 1
        if self.reference is not None:
            assert draft.tokens.tolist() == reference_draft(self.inner.head, self.reference, ctx.tokens, n)
        return draft

    def commit(self, ctx, num_accepted) -> None:
        self.inner.commit(ctx, num_accepted)
        pending = ctx.hidden_states.shape[0]
        assert self.inner.cache_length == len(ctx.tokens) - 1 - pending, (
            f"after commit: cache {self.inner.cache_length}, committed {len(ctx.tokens)}, pending {pending}")
        self.checks += 1


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("form", ["safetensors", "bin"])
def test_greedy_output_equals_plain_and_hf_greedy(checkpoints, arch, form):
    target = tiny_model(arch, seed=3)
    spy = Spy(EagleDrafter(checkpoints[form]))
    for prompt in PROMPTS:
        result = specdec.generate(target, prompt, drafter=spy, num_draft_tokens=4, max_new_tokens=NEW)
        assert result.tokens == specdec.generate(target, prompt, max_new_tokens=NEW).tokens
        assert result.tokens == hf_greedy(target, prompt, NEW)
        assert result.stats.drafted > 0
    assert type(spy.inner.head.layers[0]).__name__ == "LlamaDecoderLayer"  # whatever the target


def test_trained_head_is_accepted_and_drafts_match_uncached_recomputation(llama, trained, tmp_path):
    spy = Spy(EagleDrafter(trained), reference=llama)
    lengths = []
    for prompt in PROMPTS:
        result = specdec.generate(llama, prompt, drafter=spy, num_draft_tokens=4, max_new_tokens=NEW)
        assert result.tokens == hf_greedy(llama, prompt, NEW)
        lengths.append(result.stats.mean_accepted_length)
    untrained = specdec.generate(llama, PROMPTS[0], drafter=EagleDrafter(save_eagle(random_head(2), tmp_path)),
                                 num_draft_tokens=4, max_new_tokens=NEW).stats.mean_accepted_length
    print(f"EAGLE mean accepted length: trained {lengths}, untrained {untrained:.2f}")
    assert min(lengths) > 1.5 and min(lengths) > untrained
    assert spy.checks > 2 * len(PROMPTS)


def test_sampled_continuations_match_plain_sampling(tmp_path):
    target = tiny_model(seed=0, **MODEL)
    drafter = EagleDrafter(save_eagle(random_head(seed=4, hidden=MODEL["hidden"], vocab=VOCAB), tmp_path))
    counts, drafted, accepted, deep = sample_counts(target, drafter, TRUNCATED)
    assert drafted > 0 and 0 < accepted < drafted and deep > 0, (drafted, accepted, deep)
    p_value = chi_square_p_value(counts, exact_distribution(target, [1, 2, 3, 1, 2, 3, 1, 2], TRUNCATED))
    assert p_value >= ALPHA, f"eagle is not lossless: chi-square p = {p_value:.3g}"


def test_sampled_run_keeps_cache_invariant_and_reports_q(llama, checkpoints):
    spy = Spy(EagleDrafter(checkpoints["safetensors"]))
    result = specdec.generate(llama, PROMPTS[0], drafter=spy, max_new_tokens=NEW,
                              sampling=Sampling(temperature=0.8, top_k=20), seed=5)
    assert len(result.tokens) == NEW and 0 < result.stats.accepted < result.stats.drafted
    assert spy.checks == 1 + len(spy.drafts) >= result.stats.steps and spy.sampled > 0


@pytest.mark.parametrize("safe", [True, False])
def test_save_load_round_trip_gives_identical_drafts(llama, trained, tmp_path, safe):
    copy = save_eagle(load_eagle(trained), tmp_path / "copy", safe=safe)
    original, reloaded = Spy(EagleDrafter(trained)), Spy(EagleDrafter(copy))
    for spy in (original, reloaded):
        specdec.generate(llama, PROMPTS[1], drafter=spy, max_new_tokens=NEW)
    assert original.drafts == reloaded.drafts and original.drafts
    for key, value in load_eagle(trained).state_dict().items():
        assert torch.equal(value, load_eagle(copy).state_dict()[key]), key


@pytest.mark.parametrize("safe", [True, False])
def test_saved_head_loads_back_bit_for_bit(tmp_path, safe):
    head = random_head(seed=7)
    loaded = load_eagle(save_eagle(head, tmp_path, safe=safe))
    assert loaded.state_dict().keys() == head.state_dict().keys()
    for key, value in head.state_dict().items():
        assert torch.equal(value, loaded.state_dict()[key]), key
    assert loaded.config.to_dict()["architectures"] == ["LlamaForCausalLM"] and loaded.fc.bias is not None
    stored = load_file(str(tmp_path / "model.safetensors")) if safe else \
        torch.load(tmp_path / "pytorch_model.bin", weights_only=True)
    assert "fc.weight" in stored and not any(key.startswith("layers.0.input_layernorm") for key in stored)


def test_one_drafter_serves_two_generate_calls(llama, trained):
    drafter = EagleDrafter(trained)
    first = [specdec.generate(llama, p, drafter=drafter, max_new_tokens=NEW) for p in PROMPTS]
    again = [specdec.generate(llama, p, drafter=drafter, max_new_tokens=NEW) for p in PROMPTS]
    for prompt, a, b in zip(PROMPTS, first, again):
        assert a.tokens == b.tokens == hf_greedy(llama, prompt, NEW)
        assert a.stats.accepted_per_position == b.stats.accepted_per_position


def test_one_token_prompt_drafts_after_the_first_step(llama, checkpoints):
    spy = Spy(EagleDrafter(checkpoints["bin"]))
    result = specdec.generate(llama, [5], drafter=spy, max_new_tokens=8)
    assert result.tokens == hf_greedy(llama, [5], 8)
    assert spy.drafts[0] == [] and any(spy.drafts[1:])


def rewrite(path: Path, change) -> Path:
    weights = load_file(str(path / "model.safetensors"))
    change(weights)
    save_file(weights, str(path / "model.safetensors"))
    return path


def test_published_extras_are_accepted_and_unused(llama, checkpoints, tmp_path):
    """A stored embedding copy, a rotary inv_freq buffer and an unused layer-0 input norm."""
    extras = {"embed_tokens.weight": torch.randn(64, 32, dtype=torch.float64),
              "layers.0.self_attn.rotary_emb.inv_freq": torch.ones(4),
              "layers.0.input_layernorm.weight": torch.full((32,), 5.0, dtype=torch.float64)}
    weights = load_file(str(checkpoints["safetensors"] / "model.safetensors"))
    path = save_eagle(load_eagle(checkpoints["safetensors"]), tmp_path)
    save_file({**weights, **extras}, str(path / "model.safetensors"))
    plain, extra = Spy(EagleDrafter(checkpoints["safetensors"])), Spy(EagleDrafter(path))
    for spy in (plain, extra):
        specdec.generate(llama, PROMPTS[0], drafter=spy, max_new_tokens=NEW)
    assert plain.drafts == extra.drafts


def test_head_without_fc_bias_round_trips(llama, tmp_path):
    config = eagle_config()
    config.bias = False
    torch.manual_seed(8)
    head = EagleHead(config).double()
    loaded = load_eagle(save_eagle(head, tmp_path))
    assert loaded.fc.bias is None and "fc.bias" not in load_file(str(tmp_path / "model.safetensors"))
    result = specdec.generate(llama, PROMPTS[0], drafter=EagleDrafter(tmp_path), max_new_tokens=NEW)
    assert result.tokens == hf_greedy(llama, PROMPTS[0], NEW) and result.stats.drafted > 0


def test_mismatched_hidden_size_names_file_key_and_shapes(tmp_path):
    path = save_eagle(random_head(hidden=16), tmp_path)
    with pytest.raises(ValueError, match=r"model\.safetensors.*'fc\.weight'.*\(16, 32\).*\(32, 64\)"):
        specdec.generate(tiny_model(), [1, 2, 3], drafter=EagleDrafter(path), max_new_tokens=4)
    with pytest.raises(ValueError, match="hidden size 32"):
        load_eagle(path, tiny_model())


def test_mismatched_vocabulary_names_config_and_sizes(tmp_path):
    path = save_eagle(random_head(vocab=50), tmp_path)
    with pytest.raises(ValueError, match=r"config\.json.*'vocab_size' is 50.*64"):
        load_eagle(path, tiny_model())


def test_stored_embedding_of_wrong_shape_is_refused(tmp_path):
    path = rewrite(save_eagle(random_head(), tmp_path), lambda w: w.update({"embed_tokens.weight": torch.zeros(50, 32)}))
    with pytest.raises(ValueError, match=r"'embed_tokens\.weight' has shape \(50, 32\).*\(64, 32\)"):
        load_eagle(path, tiny_model())
    right = rewrite(path, lambda w: w.update({"embed_tokens.weight": torch.zeros(64, 32)}))
    load_eagle(right, tiny_model())  # a matching copy is accepted (and ignored)


def test_missing_key_is_named_with_its_shape(tmp_path):
    path = rewrite(save_eagle(random_head(), tmp_path), lambda w: w.pop("layers.0.mlp.down_proj.weight"))
    with pytest.raises(KeyError, match=r"model\.safetensors lacks 'layers\.0\.mlp\.down_proj\.weight'.*\(32, 64\)"):
        EagleDrafter(path)


def test_wrongly_shaped_tensor_names_both_shapes(tmp_path):
    path = save_eagle(random_head(), tmp_path, safe=False)
    weights = torch.load(path / "pytorch_model.bin", weights_only=True)
    weights["layers.0.self_attn.q_proj.weight"] = torch.zeros(32, 16)
    torch.save(weights, path / "pytorch_model.bin")
    with pytest.raises(ValueError, match=r"pytorch_model\.bin.*'layers\.0\.self_attn\.q_proj\.weight'.*\(32, 16\).*\(32, 32\)"):
        EagleDrafter(path)


def test_foreign_keys_and_missing_files_are_refused(tmp_path):
    path = rewrite(save_eagle(random_head(), tmp_path / "a"), lambda w: w.update({"midlayer.fc.weight": torch.zeros(2)}))
    with pytest.raises(ValueError, match="midlayer.fc.weight"):
        EagleDrafter(path)
    (path / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="neither model.safetensors nor pytorch_model.bin"):
        EagleDrafter(path)
    with pytest.raises(FileNotFoundError, match="no config.json"):
        EagleDrafter(tmp_path / "nowhere")


def test_make_drafter_builds_eagle_from_a_path(llama, trained):
    assert load_registry().origins["eagle"] == "builtin"
    drafter = specdec.make_drafter("eagle", path=trained)
    assert isinstance(drafter, EagleDrafter) and "eagle" in specdec.drafter_names()
    assert specdec.generate(llama, PROMPTS[0], drafter=drafter, max_new_tokens=NEW).tokens == hf_greedy(llama, PROMPTS[0], NEW)
