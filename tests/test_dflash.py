"""DFlash drafter: its drafts against an independent recomputation of the whole context from the
stored tensors (no cache), parity with plain decoding for chains and DDTree trees, batches and the
compiled engine, the cache's invariant, DDTree's best prefixes against brute force, and the
checkpoint layout's round trip and errors.

Tiny float64 drafters are written by `write_dflash` in the published layout (unprefixed keys, no
embedding or LM head) for a 4-layer Qwen3 target; their layer ids are not the default's.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from specdec.drafters.parallel.dflash import DFlashDrafter
from specdec.drafters.parallel.dflash_files import (
    default_layer_ids,
    load_dflash,
    save_dflash,
)
from specdec.drafters.parallel.dflash_head import DFlashHead, DFlashSpec
from specdec.drafters.tree_search.ddtree import best_prefixes
from tiny import hf_greedy, tiny_model
from transformers import PreTrainedModel, Qwen3Config

import specdec
from specdec import Sampling
from specdec.protocols import row_view

PROMPTS = [[1, 2, 3, 4, 5, 6], [7, 7, 8, 9, 10, 11, 12, 13, 14], [3, 1]]
NEW = 20
LAYER_IDS = (0, 2)  # decoder-layer outputs of a 4-layer target (hidden_states 1 and 3)


def dflash_head(vocab: int = 64, hidden: int = 32, layers: int = 2, block: int = 5, mask: int | None = None,
                layer_ids: tuple[int, ...] = LAYER_IDS, seed: int = 0, window: int | None = None) -> DFlashHead:
    """A random float64 DFlash stack whose norms are not ones (so a missing norm shows)."""
    heads = 4
    extra = {} if window is None else {"layer_types": ["sliding_attention"] + ["full_attention"] * (layers - 1),
                                       "sliding_window": window, "use_sliding_window": True}
    config = Qwen3Config(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=2, head_dim=hidden // heads, vocab_size=vocab,
                         rope_theta=10000.0, max_position_embeddings=256, **extra)
    torch.manual_seed(seed)
    head = DFlashHead(DFlashSpec(config, block, vocab - 1 if mask is None else mask, layer_ids, 4)).double()
    with torch.no_grad():
        for name, parameter in head.named_parameters():
            if name.endswith("norm.weight"):
                parameter.uniform_(0.5, 1.5)
            else:
                parameter.normal_(0.0, 0.3)
    return head


def write_dflash(directory: Path, **options) -> Path:
    save_dflash(dflash_head(**options), directory)
    return directory


@pytest.fixture(scope="module")
def target() -> PreTrainedModel:
    return tiny_model("qwen3", layers=4)


# -- an independent recomputation, from the paper and the stored tensors ---------------------------
def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return weight * x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)


def _rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """x [n, heads, D] rotated at positions [n] (half-split pairs (i, i + D/2))."""
    d = x.shape[-1]
    inverse = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)  # (D/2,)
    angles = positions[:, None].double() * inverse[None]  # (n, D/2)
    cos, sin = angles.cos()[:, None], angles.sin()[:, None]  # (n, 1, D/2)
    first, second = x[..., : d // 2], x[..., d // 2 :]
    return torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)


def reference_block_logits(directory: Path, target: PreTrainedModel, tokens: list[int]) -> torch.Tensor:
    """Logits [B - 1, V] of the block after `tokens`, recomputed from scratch: the target runs the
    whole committed sequence, the context is every position but the last, and each draft layer's
    attention is written out head by head over [context; block] with no mask."""
    weights = load_file(str(directory / "model.safetensors"))
    config = json.loads((directory / "config.json").read_text())
    block, mask = config["block_size"], config["dflash_config"]["mask_token_id"]
    ids = config["dflash_config"]["target_layer_ids"]
    heads, kv_heads, d = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
    theta = config["rope_theta"]
    with torch.no_grad():
        out = target(input_ids=torch.tensor([tokens]), output_hidden_states=True)
        features = torch.cat([out.hidden_states[i + 1][0, :-1] for i in ids], dim=-1)  # (s, K*H)
        s = len(tokens) - 1
        context = _rms(features @ weights["fc.weight"].T, weights["hidden_norm.weight"])  # (s, H)
        embed = target.get_input_embeddings().weight
        h = embed[torch.tensor([tokens[-1]] + [mask] * (block - 1))]  # (B, H)
        ctx_pos, blk_pos = torch.arange(s), torch.arange(s, s + block)
        for layer in range(config["num_hidden_layers"]):
            w = {key.split(f"layers.{layer}.", 1)[1]: value for key, value in weights.items()
                 if key.startswith(f"layers.{layer}.")}
            x = _rms(h, w["input_layernorm.weight"])
            q = _rope(_rms((x @ w["self_attn.q_proj.weight"].T).view(block, heads, d), w["self_attn.q_norm.weight"]),
                      blk_pos, theta)

            def kv(source: torch.Tensor, positions: torch.Tensor, w: dict = w) -> tuple[torch.Tensor, torch.Tensor]:
                n = source.shape[0]
                k = _rms((source @ w["self_attn.k_proj.weight"].T).view(n, kv_heads, d), w["self_attn.k_norm.weight"])
                return _rope(k, positions, theta), (source @ w["self_attn.v_proj.weight"].T).view(n, kv_heads, d)

            (kc, vc), (kb, vb) = kv(context, ctx_pos), kv(x, blk_pos)
            k, v = torch.cat([kc, kb]), torch.cat([vc, vb])  # (s + B, kv_heads, D)
            attended = torch.empty(block, heads, d, dtype=h.dtype)
            for head in range(heads):
                group = head // (heads // kv_heads)
                scores = q[:, head] @ k[:, group].T / math.sqrt(d)  # (B, s + B)
                attended[:, head] = scores.softmax(-1) @ v[:, group]
            h = h + attended.reshape(block, heads * d) @ w["self_attn.o_proj.weight"].T
            y = _rms(h, w["post_attention_layernorm.weight"])
            gate, up = y @ w["mlp.gate_proj.weight"].T, y @ w["mlp.up_proj.weight"].T
            h = h + (torch.nn.functional.silu(gate) * up) @ w["mlp.down_proj.weight"].T
        h = _rms(h, weights["norm.weight"])
        return target.get_output_embeddings()(h[1:])  # (B - 1, V)


class Recorder:
    """Records each proposed chain and the committed ids it continued (row 0)."""

    name = DFlashDrafter.name
    capabilities = DFlashDrafter.capabilities

    def __init__(self, inner: DFlashDrafter) -> None:
        self.inner = inner
        self.seen: list[tuple[list[int], torch.Tensor, torch.Tensor | None]] = []

    def __getattr__(self, name: str):  # hidden_layers, max_draft_nodes, prefill, commit, cache_length
        return getattr(self.inner, name)

    def propose(self, rows, k):
        drafts = self.inner.propose(rows, k)
        for row, draft in drafts.items():
            if row == 0:
                self.seen.append((rows[row].tokens.tolist(), draft.tokens.clone(),
                                  None if draft.probs is None else draft.probs.clone()))
        return drafts


def test_drafts_equal_an_independent_recomputation_of_the_whole_context(target, tmp_path):
    path = write_dflash(tmp_path / "d")
    greedy = Recorder(DFlashDrafter(path, sample=False))
    specdec.generate(target, PROMPTS[1], drafter=greedy, num_draft_tokens=4, max_new_tokens=NEW)
    sampled = Recorder(DFlashDrafter(path))
    specdec.generate(target, PROMPTS[0], drafter=sampled, num_draft_tokens=4, max_new_tokens=NEW,
                     sampling=Sampling(temperature=1.0), seed=3)
    assert len(greedy.seen) > 3 and len(sampled.seen) > 3
    for tokens, drafted, _ in greedy.seen:
        reference = reference_block_logits(path, target, tokens)
        assert drafted.tolist() == reference[: drafted.shape[0]].argmax(-1).tolist(), f"after {tokens}"
    for tokens, drafted, probs in sampled.seen:
        reference = reference_block_logits(path, target, tokens)[: drafted.shape[0]].softmax(-1)
        assert probs is not None
        # (transformers computes RoPE's angles in float32, as for the target: ~1e-8 in float64)
        torch.testing.assert_close(probs, reference, rtol=1e-6, atol=1e-7, msg=f"q after {tokens}")


@pytest.mark.parametrize("tree", [False, True], ids=["chain", "ddtree"])
def test_greedy_output_equals_plain_decoding_alone_and_in_batches(target, tmp_path, tree):
    drafter = DFlashDrafter(write_dflash(tmp_path / "d"), tree=tree, top_k=3, total_tokens=10)
    expected = [hf_greedy(target, prompt, NEW) for prompt in PROMPTS]
    alone = specdec.generate(target, PROMPTS[0], drafter=drafter, num_draft_tokens=4, max_new_tokens=NEW)
    assert alone.tokens == expected[0] and alone.stats.drafted > 0
    batch = specdec.generate_batch(target, PROMPTS, drafter=drafter, num_draft_tokens=4, max_new_tokens=NEW)
    assert [row.tokens for row in batch] == expected


def test_an_accepting_drafter_drafts_a_whole_block_per_step_and_keeps_parity(tmp_path):
    """A drafter whose block repeats the target's argmax is accepted whole: the target itself as the
    block's reader (one draft layer whose output is its input's embedding read by the LM head,
    zeroed attention and MLP), on a target that repeats its last token."""
    target = tiny_model("qwen3", layers=4)
    with torch.no_grad():  # a target whose argmax after x is x: the LM head reads the embedding
        target.lm_head.weight.copy_(target.model.embed_tokens.weight * 20)
        for layer in target.model.layers:
            layer.mlp.down_proj.weight.zero_()
            layer.self_attn.o_proj.weight.zero_()
        target.model.norm.weight.fill_(1.0)
    head = dflash_head(layers=1)
    with torch.no_grad():
        layer = head.layers[0]
        layer.self_attn.o_proj.weight.zero_()
        layer.mlp.down_proj.weight.zero_()
        head.norm.weight.fill_(1.0)
    path = save_dflash(head, tmp_path / "d")
    # the block's masks read the mask's embedding: point the mask at the prompt's repeated id
    config = json.loads((path / "config.json").read_text())
    config["dflash_config"]["mask_token_id"] = 5
    (path / "config.json").write_text(json.dumps(config))
    result = specdec.generate(target, [5, 5, 5], drafter=DFlashDrafter(path, sample=False), num_draft_tokens=4,
                              max_new_tokens=12)
    assert result.tokens == hf_greedy(target, [5, 5, 5], 12) == [5] * 12
    assert result.stats.accepted == result.stats.drafted > 0 and result.stats.steps <= 3


def test_compiled_block_equals_eager(target, tmp_path, strict_compile):
    drafter = DFlashDrafter(write_dflash(tmp_path / "d"))
    sampling = Sampling(temperature=0.8)
    eager = specdec.generate_batch(target, PROMPTS[:2], drafter=drafter, num_draft_tokens=3, max_new_tokens=12,
                                   sampling=sampling, seed=1)
    compiled = specdec.generate_batch(target, PROMPTS[:2], drafter=drafter, num_draft_tokens=3, max_new_tokens=12,
                                      sampling=sampling, seed=1, compile=True)
    assert drafter._step is not None and drafter._step.compiled, "the block did not run compiled"
    assert [row.tokens for row in compiled] == [row.tokens for row in eager]


def test_batch_rows_draft_what_they_draft_alone(target, tmp_path):
    path = write_dflash(tmp_path / "d")
    alone = [Recorder(DFlashDrafter(path)) for _ in PROMPTS]
    for recorder, prompt in zip(alone, PROMPTS):
        specdec.generate(target, prompt, drafter=recorder, num_draft_tokens=3, max_new_tokens=10)
    batch = DFlashDrafter(path)
    first: list[tuple[list[int], list[int]]] = []
    original = batch.propose

    def spy(rows, k):
        drafts = original(rows, k)
        first.extend((rows[row].tokens.tolist(), drafts[row].tokens.tolist()) for row in rows)
        return drafts

    batch.propose = spy  # type: ignore[method-assign]
    specdec.generate_batch(target, PROMPTS, drafter=batch, num_draft_tokens=3, max_new_tokens=10)
    single = {tuple(tokens): drafted.tolist() for recorder in alone for tokens, drafted, _ in recorder.seen}
    for tokens, drafted in first:
        assert drafted == single[tuple(tokens)], f"row after {tokens}"


def test_the_cache_holds_the_committed_positions_and_nothing_else(target, tmp_path):
    drafter = DFlashDrafter(write_dflash(tmp_path / "d"))
    lengths: list[tuple[int, int]] = []
    original = drafter.propose

    def spy(rows, k):
        drafts = original(rows, k)
        lengths.extend((drafter.cache_length(row), rows[row].tokens.shape[0]) for row in rows)
        return drafts

    drafter.propose = spy  # type: ignore[method-assign]
    specdec.generate_batch(target, PROMPTS, drafter=drafter, num_draft_tokens=4, max_new_tokens=NEW,
                           sampling=Sampling(temperature=0.9), seed=2)
    assert lengths and all(cached == committed - 1 for cached, committed in lengths), lengths


def test_sliding_window_layers_see_the_block_causally_and_the_context_in_their_window(target, tmp_path):
    """A window of 3: the first layer's block row j sees block rows 0..j and context positions
    within 3 of its own; the drafter runs and its drafts follow that mask (one row's logits change
    when a context position outside every row's window changes... in the full layer only)."""
    head = dflash_head(window=3)
    positions = torch.arange(6, 11)[None]  # (1, B) a block at s = 6
    full = torch.ones(1, 1, 5, 11, dtype=torch.bool)
    mask = head._window(full, positions, 3, 6)[0, 0]
    assert mask[:, :6].tolist() == [[c > p - 3 for c in range(6)] for p in range(6, 11)]
    assert mask[:, 6:].tolist() == torch.ones(5, 5, dtype=torch.bool).tril().tolist()
    path = save_dflash(head, tmp_path / "d")
    result = specdec.generate(target, PROMPTS[1], drafter=DFlashDrafter(path), num_draft_tokens=4, max_new_tokens=NEW)
    assert result.tokens == hf_greedy(target, PROMPTS[1], NEW)


# -- DDTree ------------------------------------------------------------------------------------------
def _brute_force(log_probs: torch.Tensor, top_k: int, budget: int) -> list[tuple[int, ...]]:
    """Every prefix of depth <= D over each depth's top_k ids, the `budget` best by summed log-prob."""
    depths = log_probs.shape[0]
    choices = [log_probs[d].topk(top_k).indices.tolist() for d in range(depths)]
    prefixes = [p for n in range(1, depths + 1) for p in itertools.product(*choices[:n])]
    score = {p: sum(float(log_probs[d, t]) for d, t in enumerate(p)) for p in prefixes}
    return sorted(prefixes, key=lambda p: -score[p])[:budget]


@pytest.mark.parametrize(("depths", "top_k", "budget", "seed"), [(3, 2, 5, 0), (4, 3, 12, 1), (5, 4, 30, 2),
                                                                 (2, 3, 20, 3), (1, 2, 4, 4)])
def test_ddtree_keeps_the_best_prefixes_parents_first(depths, top_k, budget, seed):
    torch.manual_seed(seed)
    log_probs = torch.log_softmax(torch.randn(depths, 7, dtype=torch.float64) * 2, dim=-1)
    tokens, parents = best_prefixes(log_probs, top_k, budget)
    paths: list[tuple[int, ...]] = []
    for token, parent in zip(tokens, parents):
        assert parent < len(paths), "a parent after its child"
        paths.append((paths[parent] if parent >= 0 else ()) + (token,))
    assert len(set(paths)) == len(paths), "a path twice"
    assert sorted(paths) == sorted(_brute_force(log_probs, top_k, budget))


def test_ddtree_drafts_a_tree_from_one_block_forward_per_step(target, tmp_path):
    drafter = DFlashDrafter(write_dflash(tmp_path / "d"), tree=True, top_k=2, total_tokens=7)
    assert row_view(drafter).max_draft_nodes(4) == 7
    forwards, trees = [], []
    original = drafter.propose

    def spy(rows, k):
        step = drafter._step
        calls = [0]
        inner = step.fn

        def counted(*args):
            calls[0] += 1
            return inner(*args)

        step.fn = counted
        drafts = original(rows, k)
        step.fn = inner
        forwards.append(calls[0])
        trees.extend(drafts.values())
        return drafts

    drafter.propose = spy  # type: ignore[method-assign]
    result = specdec.generate(target, PROMPTS[0], drafter=drafter, num_draft_tokens=3, max_new_tokens=NEW,
                              sampling=Sampling(temperature=0.7), seed=0)
    assert result.tokens and forwards and set(forwards) == {1}
    assert all(tree.parents is not None and tree.probs is None for tree in trees)
    assert max(tree.tokens.shape[0] for tree in trees) == 7


# -- files -------------------------------------------------------------------------------------------
def test_the_layout_round_trips_and_accepts_prefixes_and_nested_block_size(target, tmp_path):
    path = write_dflash(tmp_path / "d")
    config = json.loads((path / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"] and config["block_size"] == 5
    assert config["dflash_config"]["target_layer_ids"] == list(LAYER_IDS) and "auto_map" not in config
    assert not any(key.startswith(("embed_tokens", "lm_head", "model.")) for key in load_file(str(path / "model.safetensors")))
    other = tmp_path / "prefixed"
    other.mkdir()
    save_file({f"model.{key}": value for key, value in load_file(str(path / "model.safetensors")).items()},
              str(other / "model.safetensors"))
    del config["block_size"]
    config["dflash_config"]["block_size"] = 5
    (other / "config.json").write_text(json.dumps(config))
    first = specdec.generate(target, PROMPTS[0], drafter=DFlashDrafter(path), max_new_tokens=10,
                             sampling=Sampling(temperature=0.9), seed=4)
    second = specdec.generate(target, PROMPTS[0], drafter=DFlashDrafter(other), max_new_tokens=10,
                              sampling=Sampling(temperature=0.9), seed=4)
    assert first.tokens == second.tokens
    assert (first.stats.drafted, first.stats.accepted) == (second.stats.drafted, second.stats.accepted)


def test_default_layer_ids_spread_from_one_to_three_before_the_end():
    assert default_layer_ids(36, 5) == (1, 9, 17, 25, 33)
    assert default_layer_ids(36, 1) == (18,)


@pytest.mark.parametrize(("edit", "message"), [
    (lambda c: c.update(architectures=["Qwen3ForCausalLM"]), "not \\['DFlashDraftModel'\\]"),
    (lambda c: c.pop("block_size"), "no 'block_size'"),
    (lambda c: c["dflash_config"].pop("mask_token_id"), "mask_token_id"),
    (lambda c: c["dflash_config"].update(mask_token_id=999), "outside the vocabulary"),
    (lambda c: c.update(block_size=1), "at least 2"),
])
def test_bad_configs_are_named(tmp_path, edit, message):
    path = write_dflash(tmp_path / "d")
    config = json.loads((path / "config.json").read_text())
    config["dflash_config"].pop("block_size", None)
    edit(config)
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=message):
        load_dflash(path)


def test_missing_and_misshapen_tensors_name_the_key(tmp_path):
    path = write_dflash(tmp_path / "d")
    weights = load_file(str(path / "model.safetensors"))
    del weights["layers.1.mlp.up_proj.weight"]
    save_file(weights, str(path / "model.safetensors"))
    with pytest.raises(KeyError, match="layers.1.mlp.up_proj.weight"):
        load_dflash(path)
    weights["layers.1.mlp.up_proj.weight"] = torch.zeros(3, 3, dtype=torch.float64)
    save_file(weights, str(path / "model.safetensors"))
    with pytest.raises(ValueError, match="up_proj.*shape \\(3, 3\\)"):
        load_dflash(path)


def test_a_drafter_for_another_target_is_refused_naming_both_sizes(tmp_path):
    path = write_dflash(tmp_path / "d", hidden=16)
    with pytest.raises(Exception, match="hidden_size is 16 but the target's is 32"):
        specdec.generate(tiny_model("qwen3", layers=4), PROMPTS[0], drafter=DFlashDrafter(path), max_new_tokens=4)
    deep = write_dflash(tmp_path / "e", layer_ids=(0, 7))
    with pytest.raises(Exception, match="target_layer_ids \\[0, 7\\]"):
        specdec.generate(tiny_model("qwen3", layers=4), PROMPTS[0], drafter=DFlashDrafter(deep), max_new_tokens=4)


@pytest.mark.parametrize(("option", "value"), [("tree", "yes"), ("sample", 1), ("top_k", 0), ("total_tokens", -2)])
def test_bad_options_are_named(tmp_path, option, value):
    with pytest.raises(ValueError, match=f"dflash: {option}"):
        DFlashDrafter(write_dflash(tmp_path / "d"), **{option: value})


def test_traces_show_the_block_drafted_in_one_forward(target, tmp_path):
    from specdec.teaching.trace import Trace
    from specdec.teaching.trace_view import trace_lines

    trace = Trace()
    specdec.generate(target, PROMPTS[0], drafter=DFlashDrafter(write_dflash(tmp_path / "d")), num_draft_tokens=4,
                     max_new_tokens=8, trace=trace)
    assert trace.steps and all(step.draft_forwards == 1 for step in trace.steps if step.drafted)
    assert "4 at once" in trace_lines(trace, lambda ids: str(ids), colour=False)[0]
    plain = Trace()
    specdec.generate(target, PROMPTS[0], drafter="ngram", max_new_tokens=8, trace=plain)
    assert all(step.draft_forwards is None for step in plain.steps)
