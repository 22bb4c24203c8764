"""MTP drafter: parity, losslessness, its KV cache invariant, both checkpoint layouts and their errors.

Tiny float64 targets (Qwen3 for the Qwen3-Next/Qwen3.5 `mtp.*` layout, DeepseekV3 with MoE for
the `model.layers.{L}.*` layout) are saved with save_pretrained; random (or briefly trained) MTP
tensors are then added to their safetensors, single-file and sharded with an index.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch.nn.functional import cross_entropy
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM, PreTrainedModel

from specdec.protocols import row_view
import specdec
from specdec import Sampling, plugins
from specdec.drafters.shared.chains import chain_length
from specdec.drafters.feature_heads.feature_pairs import PREFILL_HOLD
from specdec.drafters.feature_heads.mtp import MtpDrafter, MtpHead, load_mtp, mtp_checkpoint_keys

from test_lossless_statistical import MODEL, TRUNCATED, chi_square_p_value, exact_distribution, sample_counts
from tiny import hf_greedy, tiny_model

ALPHA = 1e-4
PROMPTS = [[1, 2, 3, 4, 5, 6], [7, 7, 8, 9, 10, 11, 12, 13, 14]]
NEW = 24


def tiny_deepseek(seed: int = 0, nextn: int = 2) -> PreTrainedModel:
    torch.manual_seed(seed)
    config = DeepseekV3Config(vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                              num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1,
                              n_routed_experts=4, num_experts_per_tok=2, n_group=2, topk_group=1,
                              first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=4,
                              qk_nope_head_dim=4, v_head_dim=8, max_position_embeddings=256, bos_token_id=None,
                              eos_token_id=None, pad_token_id=None, tie_word_embeddings=False,
                              num_nextn_predict_layers=nextn)
    model = DeepseekV3ForCausalLM(config).double().eval()
    model.set_experts_implementation("eager")  # grouped_mm has no float64 kernel
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(6.0)
    return model


def mtp_tensors(target: PreTrainedModel, layout: str, seed: int, stages: int = 1) -> dict[str, torch.Tensor]:
    """Random MTP weights for `target`, under the checkpoint's key names (norm weights perturbed)."""
    torch.manual_seed(seed)
    head = MtpHead(target.config, layout, stages).double()
    with torch.no_grad():  # some MoE tensors are created empty: initialise every tensor here
        for name, value in head.state_dict().items():
            if "norm." in name:  # around 1 (plain) or 0 (zero-centred), perturbed
                value.copy_((value == 1).to(value.dtype) + 0.5 * torch.randn_like(value))
            elif value.ndim >= 2:
                value.copy_(torch.randn_like(value) * value.shape[-1] ** -0.5)
            else:
                value.zero_()
    return to_checkpoint(head)


def to_checkpoint(head: MtpHead) -> dict[str, torch.Tensor]:
    """Checkpoint tensors; fused MoE experts split per expert, as save_pretrained and public checkpoints store them."""
    state = head.state_dict()
    out = {}
    for name, stored in mtp_checkpoint_keys(head).items():
        value = state[name].detach()
        if stored.endswith("experts.gate_up_proj"):  # (E, 2I, H) -> gate, up (I, H) each
            for e, rows in enumerate(value):
                gate, up = rows.chunk(2)
                out[f"{stored[:-len('gate_up_proj')]}{e}.gate_proj.weight"] = gate.contiguous()
                out[f"{stored[:-len('gate_up_proj')]}{e}.up_proj.weight"] = up.contiguous()
        elif stored.endswith("experts.down_proj"):  # (E, H, I)
            for e, rows in enumerate(value):
                out[f"{stored[:-len('down_proj')]}{e}.down_proj.weight"] = rows.contiguous()
        else:
            out[stored] = value.contiguous()
    return out


def write_target(target: PreTrainedModel, extra: dict[str, torch.Tensor], path: Path, sharded: bool = False) -> Path:
    """save_pretrained, then add `extra` to the safetensors (or split everything into two shards)."""
    target.save_pretrained(path)
    weights = {**load_file(str(path / "model.safetensors")), **extra}
    if not sharded:
        save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})
        return path
    (path / "model.safetensors").unlink()
    keys = sorted(weights)
    shards = {"model-00001-of-00002.safetensors": keys[: len(keys) // 2],
              "model-00002-of-00002.safetensors": keys[len(keys) // 2 :]}
    for name, part in shards.items():
        save_file({key: weights[key] for key in part}, str(path / name), metadata={"format": "pt"})
    weight_map = {key: name for name, part in shards.items() for key in part}
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return path


def target_features(target: PreTrainedModel, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return target(input_ids=ids, output_hidden_states=True).hidden_states[-1]  # (B, L, H)


class Spy:
    """Wraps an MtpDrafter; checks the cache invariant after every call and records drafts."""

    name = "mtp-spy"
    uses_hidden_states = True

    def __init__(self, inner: MtpDrafter) -> None:
        self.inner = row_view(inner)
        self.drafts: list[list[int]] = []
        self.checks = self.sampled = 0

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
        if self.inner.sample and not ctx.sampling.greedy and n:
            assert draft.probs is not None and draft.probs.shape == (n, ctx.vocab_size)
            self.sampled += 1
        elif not self.inner.sample:
            assert draft.probs is None
        return draft

    def commit(self, ctx, num_accepted) -> None:
        self.inner.commit(ctx, num_accepted)
        pending = ctx.hidden_states.shape[0]
        assert self.inner.cache_length == len(ctx.tokens) - 1 - pending, (
            f"after commit: cache {self.inner.cache_length}, committed {len(ctx.tokens)}, pending {pending}")
        self.checks += 1


@pytest.fixture(scope="module")
def qwen3() -> PreTrainedModel:
    return tiny_model("qwen3", seed=0)


@pytest.fixture(scope="module")
def deepseek() -> PreTrainedModel:
    return tiny_deepseek(seed=0)


@pytest.fixture(scope="module")
def qwen_paths(qwen3, tmp_path_factory) -> dict[str, Path]:
    extra = mtp_tensors(qwen3, "qwen", seed=1)
    root = tmp_path_factory.mktemp("mtp-qwen")
    return {"single": write_target(qwen3, extra, root / "single"),
            "sharded": write_target(qwen3, extra, root / "sharded", sharded=True)}


@pytest.fixture(scope="module")
def deepseek_paths(deepseek, tmp_path_factory) -> dict[str, Path]:
    extra = mtp_tensors(deepseek, "deepseek", seed=2, stages=2)
    root = tmp_path_factory.mktemp("mtp-deepseek")
    return {"single": write_target(deepseek, extra, root / "single"),
            "sharded": write_target(deepseek, extra, root / "sharded", sharded=True)}


@pytest.mark.parametrize("form", ["single", "sharded"])
def test_qwen_layout_greedy_output_equals_plain_and_hf_greedy(qwen3, qwen_paths, form):
    spy = Spy(MtpDrafter(qwen_paths[form]))
    for prompt in PROMPTS:
        result = specdec.generate(qwen3, prompt, drafter=spy, num_draft_tokens=4, max_new_tokens=NEW)
        assert result.tokens == specdec.generate(qwen3, prompt, max_new_tokens=NEW).tokens
        assert result.tokens == hf_greedy(qwen3, prompt, NEW)
        assert result.stats.drafted > 0
    assert type(spy.inner.head.stages[0].layers[0]).__name__ == "Qwen3DecoderLayer"
    assert spy.checks > 2 * len(PROMPTS)


def test_deepseek_layout_greedy_output_equals_plain_and_hf_greedy(deepseek, deepseek_paths):
    spy = Spy(MtpDrafter(deepseek_paths["single"]))
    result = specdec.generate(deepseek, PROMPTS[0], drafter=spy, num_draft_tokens=4, max_new_tokens=16)
    assert result.tokens == specdec.generate(deepseek, PROMPTS[0], max_new_tokens=16).tokens
    assert result.tokens == hf_greedy(deepseek, PROMPTS[0], 16)
    assert result.stats.drafted > 0 and spy.checks > 2
    stages = spy.inner.head.stages
    assert len(stages) == 2 and type(stages[1].layers[0].mlp).__name__ == "DeepseekV3MoE"


@pytest.mark.parametrize("layout", ["qwen", "deepseek"])
def test_sharded_and_single_file_give_identical_drafts(qwen3, deepseek, qwen_paths, deepseek_paths, layout):
    target, paths = (qwen3, qwen_paths) if layout == "qwen" else (deepseek, deepseek_paths)
    spies = [Spy(MtpDrafter(paths[form])) for form in ("single", "sharded")]
    for spy in spies:
        specdec.generate(target, PROMPTS[1], drafter=spy, max_new_tokens=12)
    assert spies[0].drafts == spies[1].drafts and any(spies[0].drafts)


def test_per_expert_moe_weights_fuse_as_transformers_fuses_them(deepseek, tmp_path):
    """Layer 1's stored (per-expert) weights copied to the MTP slots load as transformers loaded layer 1."""
    deepseek.save_pretrained(tmp_path)
    stored = load_file(str(tmp_path / "model.safetensors"))
    extra = {key: value for key, value in mtp_tensors(deepseek, "deepseek", seed=2, stages=2).items()
             if not key.split(".", 3)[3].startswith(("self_attn", "mlp", "input_layernorm", "post_attention"))}
    for slot in (2, 3):
        extra.update({key.replace("model.layers.1.", f"model.layers.{slot}."): value.clone()
                      for key, value in stored.items() if key.startswith("model.layers.1.")})
    head = load_mtp(write_target(deepseek, extra, tmp_path))
    layer_one = deepseek.model.layers[1].state_dict()
    for stage in head.stages:
        loaded = stage.layers[0].state_dict()
        assert loaded.keys() == layer_one.keys()
        for key, value in layer_one.items():
            assert torch.equal(loaded[key], value), key


def test_deepseek_stage_i_drafts_depth_i_plus_1(deepseek, tmp_path):
    """Replacing stage 1 (model.layers.3.*) keeps every first draft token and changes deeper ones."""
    base = mtp_tensors(deepseek, "deepseek", seed=2, stages=2)
    other = mtp_tensors(deepseek, "deepseek", seed=9, stages=2)
    swapped = {**base, **{key: value for key, value in other.items() if key.startswith("model.layers.3.")}}
    spies = [Spy(MtpDrafter(write_target(deepseek, extra, tmp_path / name)))
             for name, extra in (("base", base), ("swapped", swapped))]
    for spy in spies:
        specdec.generate(deepseek, PROMPTS[1], drafter=spy, num_draft_tokens=4, max_new_tokens=6)
    first, second = spies[0].drafts[0], spies[1].drafts[0]
    assert len(first) == 4 and first[0] == second[0] and first[1:] != second[1:]


@pytest.mark.parametrize("layout", ["qwen", "deepseek"])
def test_norms_follow_the_layout_convention(qwen_paths, deepseek_paths, layout):
    """Qwen stores zero-centred norm weights (scale 1 + w), DeepSeek plain ones (scale w)."""
    path = (qwen_paths if layout == "qwen" else deepseek_paths)["single"]
    head = load_mtp(path)
    key = "mtp.pre_fc_norm_embedding.weight" if layout == "qwen" else "model.layers.2.enorm.weight"
    weight = load_file(str(path / "model.safetensors"))[key]
    x = torch.randn(3, 32, dtype=torch.float64)
    unit = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + head.stages[0].emb_norm.eps)
    scale = 1 + weight if layout == "qwen" else weight
    assert torch.allclose(head.stages[0].emb_norm(x), unit * scale)


def test_sharded_load_reads_only_the_shards_holding_mtp_keys(qwen_paths, monkeypatch, tmp_path):
    path = qwen_paths["sharded"]
    index = json.loads((path / "model.safetensors.index.json").read_text())
    mtp_shards = {name for key, name in index["weight_map"].items() if key.startswith("mtp.")}
    other = sorted(set(index["weight_map"].values()) - mtp_shards)
    if not other:
        pytest.skip("every shard holds MTP keys")
    import shutil

    copy = Path(shutil.copytree(path, tmp_path / "copy"))
    for name in other:  # a shard without MTP keys is never opened
        (copy / name).write_bytes(b"not safetensors")
    assert load_mtp(copy).state_dict().keys() == load_mtp(path).state_dict().keys()


def hand_drafts(target: PreTrainedModel, path: Path, layout: str, tokens: list[int], k: int,
                layer: torch.nn.Module | None = None) -> list[int]:
    """Greedy drafts recomputed from the stored tensors alone, without cache or specdec code.

    Stage 0 only (the Qwen layout; DeepSeek with one module). Per the public layouts:
    logits = lm_head(norm_o(layer(fc(cat(norm_e(embed(x_{j+1})), norm_h(h_j)))))); the fed-back
    feature is the normed output (qwen) or the output before the norm (deepseek).
    """
    stored = load_file(str(path / "model.safetensors"))
    base = target.config.num_hidden_layers
    if layout == "qwen":
        prefix, names = "mtp.", ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "fc", "norm")
        layer_prefix = "mtp.layers.0."
    else:
        prefix, names = f"model.layers.{base}.", ("enorm", "hnorm", "eh_proj", "shared_head.norm")
        layer_prefix = prefix
    e_w, h_w, fc_w, o_w = (stored[f"{prefix}{name}.weight"] for name in names)

    def norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        eps = target.config.rms_norm_eps
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * ((1 + w) if layout == "qwen" else w)

    if layer is None:  # load the stored decoder layer into the target's own class
        layer = type(target.model.layers[-1])(target.config, base - 1).double().eval()
        layer.load_state_dict({key[len(layer_prefix):]: value for key, value in stored.items()
                               if key.startswith(layer_prefix)})
    rotary = target.model.rotary_emb
    embed, lm_head = target.get_input_embeddings(), target.get_output_embeddings()
    ids = torch.tensor(tokens)
    with torch.no_grad():
        features = target_features(target, ids[None, :-1])[0]  # (T-1, H)
        embeds = embed(ids[1:])  # (T-1, H)
        drafted = []
        for _ in range(k):
            x = torch.cat([norm(embeds, e_w), norm(features, h_w)], -1) @ fc_w.T  # (n, H)
            positions = torch.arange(x.shape[0])[None]
            mask = torch.full((x.shape[0], x.shape[0]), float("-inf"), dtype=x.dtype).triu(1)[None, None]
            out = layer(x[None], attention_mask=mask, position_ids=positions,
                        position_embeddings=rotary(x[None], position_ids=positions))
            out = (out[0] if isinstance(out, tuple) else out)[0]  # (n, H)
            normed = norm(out, o_w)
            token = lm_head(normed[-1:]).argmax(-1)  # (1,)
            drafted.append(int(token))
            fed = normed if layout == "qwen" else out
            embeds, features = torch.cat([embeds, embed(token)]), torch.cat([features, fed[-1:]])
    return drafted


@pytest.mark.parametrize("layout", ["qwen", "deepseek"])
def test_drafts_match_a_recomputation_from_the_stored_tensors(qwen3, qwen_paths, deepseek, tmp_path, layout):
    if layout == "qwen":
        target, path = qwen3, qwen_paths["single"]
    else:  # one module, its decoder layer a copy of the target's (MoE) layer 1 as stored on disk
        target = tiny_deepseek(seed=0, nextn=1)
        target.save_pretrained(tmp_path / "plain")
        stored = load_file(str(tmp_path / "plain" / "model.safetensors"))
        extra = {key: value for key, value in mtp_tensors(target, "deepseek", seed=6).items()
                 if key.split(".", 3)[3].startswith(("enorm", "hnorm", "eh_proj", "shared_head"))}
        extra.update({key.replace("model.layers.1.", "model.layers.2."): value.clone()
                      for key, value in stored.items() if key.startswith("model.layers.1.")})
        path = write_target(target, extra, tmp_path / "mtp")
    layer = copy.deepcopy(target.model.layers[1]) if layout == "deepseek" else None
    for prompt in PROMPTS:
        spy = Spy(MtpDrafter(path))
        specdec.generate(target, prompt, drafter=spy, num_draft_tokens=3, max_new_tokens=8)
        assert spy.drafts[0] == hand_drafts(target, path, layout, prompt, 3, layer)


def train_head(target: PreTrainedModel, head: MtpHead, steps: int = 60) -> MtpHead:
    """Fit stage 0 to the target's greedy token two ahead, on the target's own continuations."""
    generator = torch.Generator().manual_seed(0)
    prompts = [p[:6] for p in PROMPTS] + [torch.randint(0, 64, (6,), generator=generator).tolist() for _ in range(2)]
    ids = torch.tensor([p + specdec.generate(target, p, max_new_tokens=NEW + 4).tokens for p in prompts])  # (B, L)
    features = target_features(target, ids)  # (B, L, H)
    lm_head = target.get_output_embeddings().weight.detach()  # (V, H)
    with torch.no_grad():
        embeds = target.get_input_embeddings()(ids)  # (B, L, H)
        goal = (features @ lm_head.T).argmax(-1)  # (B, L): the target's next token after each position
    positions = torch.arange(ids.shape[1] - 1)
    optimizer = torch.optim.Adam(head.parameters(), lr=3e-3)
    head.train()
    for _ in range(steps):
        optimizer.zero_grad()
        loss = torch.zeros((), dtype=torch.float64)
        for b in range(ids.shape[0]):
            fed, logit_input = head(0, embeds[b, 1:], features[b, :-1], positions)  # (L-1, H)
            loss = loss + cross_entropy(logit_input @ lm_head.T, goal[b, 1:]) + (fed - features[b, 1:]).pow(2).mean()
        loss.backward()
        optimizer.step()
    return head.eval()


def test_trained_head_is_accepted(qwen3, tmp_path):
    torch.manual_seed(3)
    trained = train_head(qwen3, MtpHead(qwen3.config, "qwen", 1).double())
    path = write_target(qwen3, to_checkpoint(trained), tmp_path / "trained")
    untrained = write_target(qwen3, mtp_tensors(qwen3, "qwen", seed=3), tmp_path / "untrained")
    lengths = []
    for prompt in PROMPTS:
        result = specdec.generate(qwen3, prompt, drafter=Spy(MtpDrafter(path)), num_draft_tokens=4, max_new_tokens=NEW)
        assert result.tokens == hf_greedy(qwen3, prompt, NEW)
        lengths.append(result.stats.mean_accepted_length)
    baseline = specdec.generate(qwen3, PROMPTS[0], drafter=MtpDrafter(untrained), num_draft_tokens=4,
                                max_new_tokens=NEW).stats.mean_accepted_length
    print(f"MTP mean accepted length: trained {lengths}, untrained {baseline:.2f}")
    assert min(lengths) > 1.5 and min(lengths) > baseline


@pytest.mark.parametrize("draw", [True, False], ids=["sampled-q", "top1"])
def test_sampled_continuations_match_plain_sampling(tmp_path, draw):
    target = tiny_model("qwen3", seed=0, **MODEL)
    drafter = MtpDrafter(write_target(target, mtp_tensors(target, "qwen", seed=4), tmp_path), sample=draw)
    counts, drafted, accepted, deep = sample_counts(target, drafter, TRUNCATED)
    assert drafted > 0 and 0 < accepted < drafted and deep > 0, (drafted, accepted, deep)
    p_value = chi_square_p_value(counts, exact_distribution(target, [1, 2, 3, 1, 2, 3, 1, 2], TRUNCATED))
    assert p_value >= ALPHA, f"mtp is not lossless: chi-square p = {p_value:.3g}"


def test_sampled_run_keeps_cache_invariant_and_reports_q(deepseek, deepseek_paths):
    spy = Spy(MtpDrafter(deepseek_paths["sharded"], sample=True))
    result = specdec.generate(deepseek, PROMPTS[0], drafter=spy, max_new_tokens=12,
                              sampling=Sampling(temperature=0.8, top_k=20), seed=5)
    assert len(result.tokens) == 12 and result.stats.drafted > 0
    assert spy.checks == 1 + len(spy.drafts) >= result.stats.steps and spy.sampled > 0


def test_one_drafter_serves_two_generate_calls(qwen3, qwen_paths):
    drafter = MtpDrafter(qwen_paths["single"])
    first = [specdec.generate(qwen3, p, drafter=drafter, max_new_tokens=NEW) for p in PROMPTS]
    again = [specdec.generate(qwen3, p, drafter=drafter, max_new_tokens=NEW) for p in PROMPTS]
    for prompt, a, b in zip(PROMPTS, first, again):
        assert a.tokens == b.tokens == hf_greedy(qwen3, prompt, NEW)
        assert a.stats.accepted_per_position == b.stats.accepted_per_position


def test_one_token_prompt_drafts_after_the_first_step(qwen3, qwen_paths):
    spy = Spy(MtpDrafter(qwen_paths["single"]))
    result = specdec.generate(qwen3, [5], drafter=spy, max_new_tokens=8)
    assert result.tokens == hf_greedy(qwen3, [5], 8)
    assert spy.drafts[0] == [] and any(spy.drafts[1:])


def rewrite(path: Path, change) -> Path:
    weights = load_file(str(path / "model.safetensors"))
    change(weights)
    save_file(weights, str(path / "model.safetensors"))
    return path


def test_checkpoint_without_mtp_keys_is_refused(qwen3, tmp_path):
    qwen3.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"model\.safetensors holds no MTP weights"):
        MtpDrafter(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="neither model.safetensors nor"):
        MtpDrafter(tmp_path)
    with pytest.raises(FileNotFoundError, match="no config.json"):
        MtpDrafter(tmp_path / "nowhere")


def test_missing_key_is_named_with_its_shape(qwen3, tmp_path):
    path = write_target(qwen3, mtp_tensors(qwen3, "qwen", seed=1), tmp_path)
    rewrite(path, lambda w: w.pop("mtp.layers.0.mlp.down_proj.weight"))
    expected = r"model\.safetensors lacks 'mtp\.layers\.0\.mlp\.down_proj\.weight'.*\(32, 64\)"
    with pytest.raises(KeyError, match=expected):
        MtpDrafter(path)


def test_wrongly_shaped_tensor_names_file_key_and_both_shapes(qwen3, deepseek, tmp_path):
    path = write_target(qwen3, mtp_tensors(qwen3, "qwen", seed=1), tmp_path / "q")
    rewrite(path, lambda w: w.update({"mtp.fc.weight": torch.zeros(32, 32, dtype=torch.float64)}))
    with pytest.raises(ValueError, match=r"model\.safetensors.*'mtp\.fc\.weight'.*\(32, 32\).*\(32, 64\)"):
        MtpDrafter(path)
    path = write_target(deepseek, mtp_tensors(deepseek, "deepseek", seed=2, stages=2), tmp_path / "d")
    rewrite(path, lambda w: w.update({"model.layers.3.eh_proj.weight": torch.zeros(32, 16, dtype=torch.float64)}))
    with pytest.raises(ValueError, match=r"'model\.layers\.3\.eh_proj\.weight'.*\(32, 16\).*\(32, 64\)"):
        MtpDrafter(path)


def test_head_of_another_target_is_refused_at_prefill(qwen_paths):
    other = tiny_model("qwen3", seed=0, hidden=16)
    with pytest.raises(ValueError, match=r"'mtp\.fc\.weight' has shape \(32, 64\).*\(16, 32\)"):
        specdec.generate(other, [1, 2, 3], drafter=MtpDrafter(qwen_paths["single"]), max_new_tokens=4)


def test_foreign_mtp_keys_are_refused(qwen3, tmp_path):
    path = write_target(qwen3, mtp_tensors(qwen3, "qwen", seed=1), tmp_path)
    rewrite(path, lambda w: w.update({"mtp.midlayer.weight": torch.zeros(2)}))
    with pytest.raises(ValueError, match="mtp.midlayer.weight"):
        MtpDrafter(path)


def test_make_drafter_builds_mtp_from_a_target_path(qwen3, qwen_paths):
    assert plugins.load_registry().origins["mtp"] == "builtin"
    drafter = specdec.make_drafter("mtp", path=qwen_paths["single"])
    assert isinstance(drafter, MtpDrafter) and "mtp" in specdec.drafter_names()
    result = specdec.generate(qwen3, PROMPTS[0], drafter=drafter, max_new_tokens=NEW)
    assert result.tokens == hf_greedy(qwen3, PROMPTS[0], NEW)
