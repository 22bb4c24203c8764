"""Batches of a hybrid target (Qwen3-Next: GatedDeltaNet linear attention beside full attention).

Each batch row keeps its own recurrent state and conv window: a prefill left-pads the prompts
(the padding's inputs zeroed), a step keeps the state after every row of every batch row, and
the commit takes each batch row's own accepted path (`BatchLM.keep`). Float64 kernels as in
`test_hybrid`, so states compare to 1e-10.
"""

from __future__ import annotations

import importlib
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import DynamicCache

import specdec
from specdec import Sampling
from specdec.drafters import DraftModelDrafter
from specdec.runtime.batch_cache import BatchCache
from specdec.runtime.batch_target import BatchLM
from specdec.runtime.linear import LinearStates
from specdec.runtime.target import CausalLM
from specdec.trees import chain_parents, depths, verify_layout

from drafters_for_tests import GarbageDrafter, RandomTreeDrafter
from test_hybrid import float64_kernels, tiny_hybrid, tiny_mamba_hybrid  # noqa: F401 (the autouse fixture)
from test_lossless_statistical import ALPHA, chi_square_p_value, exact_distribution
from tiny import tiny_model

PROMPTS = [[3, 17, 9, 3, 17, 9, 3, 17], [5, 2], [7, 7, 1, 7, 7, 1, 7, 7, 1, 7, 7, 1, 7], [40]]
IDS = [3, 17, 9, 3, 17, 9, 3, 17, 40, 41, 5, 2, 7, 7, 1]


@pytest.fixture(scope="module")
def hybrid():
    return tiny_hybrid()


def _plain_states(model, sequence: list[int]) -> tuple[torch.Tensor, DynamicCache]:
    """The logits of a plain forward over `sequence` [T, V] and the cache it leaves."""
    cache = DynamicCache(config=model.config)
    logits = model(input_ids=torch.tensor([sequence]), cache=cache, use_cache=True).logits[0]
    return logits, cache


def _batch_step(batch: BatchLM, sequences: list[list[int]], tree: bool, rnd: random.Random) -> list[torch.Tensor]:
    """One step of random drafts on every batch row (its own tree, or chain, of its own size),
    padded to one width, each row keeping a random root path, or now and then nothing (an idle
    row, as a compiled batch holds: its state must stay). Returns each row's kept rows' logits
    and extends each sequence by its kept draft tokens and a random next root."""
    width = 6
    rows, ids, positions, visible, paths, drafts = [], [], [], [], [], []
    deepest = 1
    for sequence in sequences:
        size = rnd.randint(0, width - 1)
        tokens = [rnd.randrange(64) for _ in range(size)]
        parents = [rnd.randrange(-1, i) for i in range(size)] if tree else chain_parents(size)
        deepest = max(deepest, max(depths(parents), default=0))
        seen, offsets = verify_layout(parents, width)  # (W, W), (W,)
        node, path = rnd.randrange(-1, size), []
        while node >= 0:
            path.insert(0, node)
            node = parents[node]
        ids.append(torch.tensor(sequence[-1:] + tokens + [0] * (width - size - 1)))
        positions.append(offsets + len(sequence) - 1)
        visible.append(seen)
        idle = rnd.random() < 0.2
        paths.append([] if idle else [0] + [i + 1 for i in path])
        drafts.append(None if idle else [tokens[i] for i in path])
    logits, _ = batch.forward(torch.stack(ids), torch.stack(positions), torch.stack(visible),
                              depth=1 + deepest if tree else None)  # (B, W, V)
    for b, path in enumerate(paths):
        rows += [(b, column) for column in path]
    batch.keep([b for b, _ in rows], [c for _, c in rows])
    shown = [logits[b, path] for b, path in enumerate(paths)]
    for sequence, accepted in zip(sequences, drafts):
        if accepted is not None:
            sequence += accepted + [rnd.randrange(64)]
    return shown


@settings(max_examples=12, deadline=None)
@given(lengths=st.lists(st.integers(1, 9), min_size=1, max_size=3),
       steps=st.lists(st.tuples(st.booleans(), st.randoms(use_true_random=False)), min_size=1, max_size=4))
def test_after_any_batch_steps_each_row_holds_the_state_of_its_plain_forward(hybrid, lengths, steps):
    """Ragged prompts, then random chains and trees of random sizes per batch row with random
    accepted paths: every kept row's logits equal a plain forward's over that batch row's own
    tokens, and every GatedDeltaNet layer holds, per batch row, the recurrent state and conv
    window a plain forward over its committed tokens leaves."""
    sequences = [IDS[i : i + n] for i, n in enumerate(lengths)]
    batch = BatchLM(CausalLM(hybrid), len(sequences), 64)
    with torch.inference_mode():
        batch.prefill([torch.tensor(sequence[:-1], dtype=torch.long) for sequence in sequences])
        for tree, rnd in steps:
            bases = [len(sequence) - 1 for sequence in sequences]
            shown = _batch_step(batch, sequences, tree, rnd)
            for b, (sequence, base) in enumerate(zip(sequences, bases)):
                if len(sequence) == 1:  # an idle row that has committed nothing: its state is still zero
                    assert all(not layer.state[b].any() and not layer.window[b].any()
                               for layer in batch.kv.cache.layers if isinstance(layer, LinearStates))
                    continue
                reference, cache = _plain_states(hybrid, sequence[:-1])
                torch.testing.assert_close(shown[b], reference[base:], rtol=0, atol=1e-10)
                for index, layer in enumerate(batch.kv.cache.layers):
                    if isinstance(layer, LinearStates):
                        theirs = cache.layers[index]
                        torch.testing.assert_close(layer.state[b], theirs.recurrent_states[0][0], rtol=0, atol=1e-10)
                        torch.testing.assert_close(layer.window[b], theirs.conv_states[0][0], rtol=0, atol=1e-12)


DRAFTERS = {
    "plain": lambda target: None,
    "ngram": lambda target: specdec.make_drafter("ngram", max_ngram=2),
    "garbage": lambda target: GarbageDrafter(seed=3),  # a rejection almost every step
    "self-draft": lambda target: DraftModelDrafter(target),
    "tree": lambda target: RandomTreeDrafter(seed=3),  # each row its own tree, each node from its parent
}


@pytest.mark.parametrize("key", list(DRAFTERS))
def test_every_row_of_a_hybrid_batch_equals_its_own_decoding(hybrid, key, monkeypatch):
    """Ragged prompts, an EOS inside a block for one row, and no room for holes (so the batch
    compacts its columns mid-decode): every row's tokens are its batch-1 decoding's, which are
    transformers' (`test_hybrid`)."""
    module = importlib.import_module("specdec.decoding.generate")
    monkeypatch.setattr(module, "HOLE_ROOM", 0)
    monkeypatch.setattr(specdec.types, "CAPACITY_STEP", 8)  # caches sized to the generation, little more
    compactions = []
    original = BatchCache.compact
    monkeypatch.setattr(BatchCache, "compact", lambda self: (compactions.append(self.width), original(self)))
    alone = [specdec.generate(hybrid, prompt, max_new_tokens=32).tokens for prompt in PROMPTS]
    eos = alone[0][5]
    expected = [tokens[: tokens.index(eos) + 1] if eos in tokens else tokens for tokens in alone]
    batch = specdec.generate_batch(hybrid, PROMPTS, drafter=DRAFTERS[key](hybrid), num_draft_tokens=3,
                                   max_new_tokens=32, eos_token_id=eos)
    assert [row.tokens for row in batch] == expected
    if key != "plain":
        assert batch.totals.drafted > 0
    if key == "garbage":
        assert compactions, "garbage drafts leave holes every step: the columns should have run out"


def test_each_row_of_a_sampled_hybrid_batch_follows_plain_sampling():
    """Many copies of one prompt in a batch, drafted by a small Llama (rejections every few
    tokens): the rows' three tokens follow the target's own distribution."""
    import numpy as np

    from test_lossless_statistical import PROMPT, VOCAB

    target = tiny_hybrid(vocab_size=VOCAB, hidden=16, head_scale=8.0)
    draft = tiny_model("llama", vocab_size=VOCAB, seed=1, layers=1, hidden=16, head_scale=8.0)
    sampling = Sampling(temperature=1.0)
    observed = np.zeros(VOCAB**3, dtype=np.int64)
    drafted = accepted = 0
    for run in range(10):
        out = specdec.generate_batch(target, [PROMPT] * 40, drafter=DraftModelDrafter(draft), num_draft_tokens=3,
                                     max_new_tokens=3, sampling=sampling, seed=run * 40)
        for row in out:
            x1, x2, x3 = row.tokens
            observed[(x1 * VOCAB + x2) * VOCAB + x3] += 1
        drafted, accepted = drafted + out.totals.drafted, accepted + out.totals.accepted
    assert 0 < accepted < drafted, (drafted, accepted)
    p_value = chi_square_p_value(observed, exact_distribution(target, PROMPT, sampling))
    assert p_value >= ALPHA, f"hybrid batch rows deviate from plain sampling: chi-square p = {p_value:.3g}"


def test_a_drafters_extra_rows_leave_a_hybrid_batch_with_one_warning_naming_them(hybrid):
    """Linear-attention layers continue one row from one earlier row, and an extra row sees several:
    the loop drops them, as at batch 1, and every row is still its own plain decoding."""
    with pytest.warns(UserWarning) as caught:
        batch = specdec.generate_batch(hybrid, PROMPTS, drafter="lookahead", max_new_tokens=8)
    dropped = [w for w in caught if "cannot run the extra rows of drafter 'lookahead'" in str(w.message)]
    assert len(dropped) == 1, [str(w.message) for w in caught]
    assert [row.tokens for row in batch] == [specdec.generate(hybrid, prompt, max_new_tokens=8).tokens
                                             for prompt in PROMPTS]


def test_a_mamba2_hybrid_cannot_batch_and_says_why():
    model = tiny_mamba_hybrid()
    with pytest.raises(ValueError, match="BambaForCausalLM cannot decode a batch: .*snapshot and replay"):
        specdec.generate_batch(model, PROMPTS, max_new_tokens=4)
