"""The row-exact attention a quantized model runs (`specdec.runtime.exact_attention`): every query
row is the same bits whatever rows come with it (a verify against one-row steps) and wherever its
visible keys sit (a tree's path among masked siblings against the same path as a chain), eager
and compiled; it is attention (a float64 softmax's values, grouped heads, masks, causal flag, soft
cap, sinks); and a prompt's forward (`whole_prompt`) runs torch's float32 SDPA instead."""

from __future__ import annotations

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from specdec.runtime.exact_attention import exact_rows_attention
from specdec.runtime.whole_prompt import in_whole_prompt, whole_prompt

HEADS, KV_HEADS, KEYS, SIZE = 6, 2, 300, 64
SEEN = 280  # keys the first row sees; later rows see one more each (a static cache's layout)


class Layer(torch.nn.Module):
    num_key_value_groups = HEADS // KV_HEADS
    is_causal = True


def _inputs(rows: int = 5, seed: int = 0, batch: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    query = torch.randn(batch, HEADS, rows, SIZE, generator=generator)
    key = torch.randn(batch, KV_HEADS, KEYS, SIZE, generator=generator) * 2  # wide scores: a sharp softmax
    value = torch.randn(batch, KV_HEADS, KEYS, SIZE, generator=generator)
    return query, key, value


def _chain_mask(rows: int) -> torch.Tensor:
    """(1, 1, rows, KEYS) boolean: row i sees keys 0 .. SEEN + i."""
    return (torch.arange(KEYS)[None] <= SEEN + torch.arange(rows)[:, None])[None, None]


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_a_rows_attention_is_its_own_whatever_rows_come_with_it_and_wherever_its_keys_sit(compiled):
    query, key, value = _inputs()
    mask = _chain_mask(5)
    fn = torch.compile(exact_rows_attention, fullgraph=True, dynamic=False) if compiled else exact_rows_attention
    together = fn(Layer(), query, key, value, mask)[0]  # (1, 5, H, D)
    alone = torch.cat([fn(Layer(), query[:, :, i : i + 1], key, value, mask[:, :, i : i + 1])[0] for i in range(5)], 1)
    assert torch.equal(together, alone)
    # a tree: the path's keys at SEEN + 1, + 4, + 7 among masked siblings, against the same keys laid
    # out as a chain at SEEN + 1, + 2, + 3 (what one-row steps of plain decoding write)
    path = [SEEN + 1, SEEN + 4, SEEN + 7]
    chain_key, chain_value = key.clone(), value.clone()
    for i, column in enumerate(path):
        chain_key[:, :, SEEN + 1 + i], chain_value[:, :, SEEN + 1 + i] = key[:, :, column], value[:, :, column]
    tree = torch.zeros(1, 1, 1, KEYS, dtype=torch.bool)
    tree[..., : SEEN + 1] = True
    tree[..., path] = True
    chain = torch.zeros(1, 1, 1, KEYS, dtype=torch.bool)
    chain[..., : SEEN + 4] = True
    row = query[:, :, :1]
    assert torch.equal(fn(Layer(), row, key, value, tree)[0], fn(Layer(), row, chain_key, chain_value, chain)[0])
    # float32 SDPA, by contrast, gives other bits for 5 rows than for 1 here: the check has power
    sdpa = torch.nn.functional.scaled_dot_product_attention
    grouped = key.repeat_interleave(3, 1), value.repeat_interleave(3, 1)
    five = sdpa(query, *grouped, attn_mask=mask)
    ones = torch.cat([sdpa(query[:, :, i : i + 1], *grouped, attn_mask=mask[:, :, i : i + 1]) for i in range(5)], 2)
    assert not torch.equal(five, ones)


def _reference(query, key, value, seen, scale, softcap=None, sinks=None):
    """Attention in float64 from the definition: (B, Q, H, D)."""
    query, key, value = query.double(), key.double().repeat_interleave(3, 1), value.double().repeat_interleave(3, 1)
    scores = query @ key.transpose(-1, -2) * scale  # (B, H, Q, T)
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~seen, float("-inf"))
    if sinks is not None:
        sink = sinks.double().reshape(1, -1, 1, 1).expand(*scores.shape[:3], 1)
        weights = torch.softmax(torch.cat([scores, sink], -1), -1)[..., :-1]
    else:
        weights = torch.softmax(scores, -1)
    return (weights @ value).transpose(1, 2)


def test_it_is_attention_with_masks_grouped_heads_the_causal_flag_a_soft_cap_and_sinks():
    query, key, value = _inputs(rows=5, seed=1)
    layer, scale = Layer(), SIZE**-0.5
    seen = _chain_mask(5)
    additive = torch.zeros(seen.shape).masked_fill(~seen, torch.finfo(torch.float32).min)
    expected = _reference(query, key, value, seen, scale)
    for mask in (seen, additive, seen.expand(1, HEADS, 5, KEYS)):
        out = exact_rows_attention(layer, query, key, value, mask)[0]
        assert out.dtype == torch.float32 and out.shape == (1, 5, HEADS, SIZE)
        torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-6)
    causal = torch.ones(5, KEYS, dtype=torch.bool).tril()[None, None]  # no mask, several rows: row i sees 0..i
    torch.testing.assert_close(exact_rows_attention(layer, query, key, value, None)[0].double(),
                               _reference(query, key, value, causal, scale), rtol=1e-5, atol=1e-6)
    capped = exact_rows_attention(layer, query, key, value, seen, scaling=0.3, softcap=5.0)[0]
    torch.testing.assert_close(capped.double(), _reference(query, key, value, seen, 0.3, softcap=5.0),
                               rtol=1e-5, atol=1e-6)
    sinks = torch.linspace(-2.0, 6.0, HEADS)
    sunk = exact_rows_attention(layer, query, key, value, seen, s_aux=sinks)[0]
    torch.testing.assert_close(sunk.double(), _reference(query, key, value, seen, scale, sinks=sinks),
                               rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="dropout=0.1"):
        exact_rows_attention(layer, query, key, value, seen, dropout=0.1)


def test_masks_per_batch_row_and_per_head_and_a_float64_model():
    query, key, value = _inputs(rows=3, seed=4, batch=2)
    layer = Layer()
    # each batch row and each head its own visible keys: a wrong head-to-group order or batch broadcast shows
    ends = torch.arange(2 * HEADS).reshape(2, HEADS, 1, 1) * 7 + 150 + torch.arange(3).reshape(1, 1, 3, 1)
    seen = torch.arange(KEYS).reshape(1, 1, 1, KEYS) <= ends  # (2, H, 3, T)
    out = exact_rows_attention(layer, query, key, value, seen)[0]
    torch.testing.assert_close(out.double(), _reference(query, key, value, seen, SIZE**-0.5), rtol=1e-5, atol=1e-6)
    per_row = seen[:, :1]  # (2, 1, 3, T): one mask per batch row, shared by the heads
    out = exact_rows_attention(layer, query, key, value, per_row)[0]
    torch.testing.assert_close(out.double(), _reference(query, key, value, per_row, SIZE**-0.5), rtol=1e-5, atol=1e-6)
    wide = exact_rows_attention(layer, query.double(), key.double(), value.double(), seen)[0]
    assert wide.dtype == torch.float64  # a float64 model keeps float64 throughout
    torch.testing.assert_close(wide, _reference(query, key, value, seen, SIZE**-0.5), rtol=1e-12, atol=1e-13)


def test_eager_chunks_of_rows_give_the_whole_forwards_bits(monkeypatch):
    import specdec.runtime.exact_attention as exact

    query, key, value = _inputs(rows=7, seed=5)
    whole = exact_rows_attention(Layer(), query, key, value, _chain_mask(7))[0]
    shared = exact_rows_attention(Layer(), query, key, value, _chain_mask(1))[0]  # (1, 1, 1, T): every row's mask
    monkeypatch.setattr(exact, "EAGER_CHUNK_BYTES", 2 * 4 * HEADS * KEYS * SIZE)  # two rows a chunk
    chunks: list[int] = []
    rows = exact._rows

    def counted(query, *args):
        chunks.append(query.shape[2])
        return rows(query, *args)

    monkeypatch.setattr(exact, "_rows", counted)
    assert torch.equal(exact_rows_attention(Layer(), query, key, value, _chain_mask(7))[0], whole)
    assert torch.equal(exact_rows_attention(Layer(), query, key, value, _chain_mask(1))[0], shared)
    assert chunks == [2, 2, 2, 1] * 2  # the rows did run in chunks


def test_a_prompts_forward_runs_float32_sdpa():
    query, key, value = _inputs(rows=40, seed=2)
    mask = (torch.arange(KEYS)[None] <= torch.arange(40)[:, None] + SEEN - 40)[None, None]
    assert not in_whole_prompt()
    with whole_prompt():
        assert in_whole_prompt()
        prompt = exact_rows_attention(Layer(), query, key, value, mask)[0]
    assert not in_whole_prompt()
    sdpa = sdpa_attention_forward(Layer(), query, key, value, mask)[0]
    assert torch.equal(prompt, sdpa)
    assert not torch.equal(exact_rows_attention(Layer(), query, key, value, mask)[0], sdpa)  # the check has power
