"""PARD (arXiv 2504.18583): greedy parity (batch 1, batches, compiled), drafts equal an independent
recomputation from scratch, the law of sampled outputs, each row's q under prefix-reading settings,
the cache keeping committed ids only, batch rows drafting their batch-1 drafts, drafting across
tokenizers, a mask row of its own, the errors, and `specdec train pard` (its rows see what drafting
sees, the conditional drop keeps chains whole, a trained checkpoint loads and decodes losslessly)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from specdec.drafters import PardDrafter
from test_cross_vocab import _draft, _prompt, _target, _tokenizers
from test_lossless_statistical import (
    ALPHA,
    MODEL,
    TRUNCATED,
    chi_square_p_value,
    exact_distribution,
    sample_counts,
)
from tiny import assert_greedy_matches_up_to_near_ties, hf_greedy, tiny_model
from transformers import PreTrainedModel

import specdec
from specdec import Sampling
from specdec.runtime.batch_target import BatchLM
from specdec.training.draft_model import DraftSize
from specdec.training.optim import Steps
from specdec.training.pard import (
    PardRecipe,
    PardStudent,
    chain_visible,
    drop_tokens,
    kept_counts,
)
from specdec.training.teacher import teacher_batch

PROMPTS = [[1, 2, 3, 4, 5, 6], [7, 7, 8, 9, 10, 11, 12, 13, 14], [5, 4, 3]]
NEW = 20
MASK = 63  # the tiny models' last id stands for the mask


@pytest.fixture(scope="module")
def target() -> PreTrainedModel:
    return tiny_model("llama", seed=0)


@pytest.fixture(scope="module")
def twin(target: PreTrainedModel) -> PreTrainedModel:
    """A copy of the target: its first draft token is always accepted, deeper ones now and then."""
    return copy.deepcopy(target)


@pytest.fixture(scope="module")
def other() -> PreTrainedModel:
    """Another architecture, with its mask id in its config."""
    model = tiny_model("qwen3", seed=1, layers=1)
    model.config.pard_token = MASK
    return model


def reference_block(model: PreTrainedModel, committed: list[int], mask: int, k: int) -> torch.Tensor:
    """The logits of the last k rows of one forward, from scratch, over [committed, mask x (k - 1)]: (k, V)."""
    ids = torch.tensor([committed + [mask] * (k - 1)])
    with torch.no_grad():
        return model(input_ids=ids).logits[0, -k:]


class Watch:
    """Wraps a drafter's propose and commit: records each row's drafts and checks its cache, and
    runs `check(ctx, draft)` on every draft."""

    def __init__(self, drafter: PardDrafter, check: Any = None) -> None:
        self.drafter, self.check = drafter, check
        self.drafts: dict[int, list[list[int]]] = {}
        self.contexts: dict[int, list[list[int]]] = {}
        self.commits = 0
        self.steps = 0  # proposes where some row drafted
        propose, commit = drafter.propose, drafter.commit

        def proposing(rows, k):  # type: ignore[no-untyped-def]
            drafts = propose(rows, k)
            self.steps += any(draft.tokens.numel() for draft in drafts.values())
            for row, draft in drafts.items():
                ctx = rows[row]
                if draft.tokens.numel():  # the cache then holds every committed id, no mask
                    assert drafter.cache_length(row) == ctx.tokens.shape[0], (row, drafter.cache_length(row))
                    if self.check is not None:
                        self.check(ctx, draft)
                self.drafts.setdefault(row, []).append(draft.tokens.tolist())
                self.contexts.setdefault(row, []).append(ctx.tokens.tolist())
            return drafts

        def committing(rows, accepted):  # type: ignore[no-untyped-def]
            commit(rows, accepted)
            for row, ctx in rows.items():  # the committed ids at propose time: all but the newest and the accepted
                assert drafter.cache_length(row) == ctx.tokens.shape[0] - 1 - accepted[row], (row, accepted[row])
                self.commits += 1

        drafter.propose, drafter.commit = proposing, committing  # type: ignore[method-assign]


def test_greedy_output_equals_plain_decoding_alone_and_in_a_batch(target, twin):
    for prompt in PROMPTS[:2]:
        watch = Watch(PardDrafter(twin, pard_token=MASK))
        result = specdec.generate(target, prompt, drafter=watch.drafter, num_draft_tokens=4, max_new_tokens=NEW)
        assert result.tokens == hf_greedy(target, prompt, NEW)
        assert result.stats.accepted > 0 and watch.commits > 0
    watch = Watch(PardDrafter(twin, pard_token=MASK))
    batch = specdec.generate_batch(target, PROMPTS, drafter=watch.drafter, num_draft_tokens=4, max_new_tokens=NEW)
    assert watch.drafter._forms.batch is not None, "a batch drafts in the batched form"
    for row, prompt in enumerate(PROMPTS):
        assert batch[row].tokens == hf_greedy(target, prompt, NEW), row
    assert len({row.stats.accepted for row in batch}) > 1, "the rows should accept ragged numbers of tokens"


def test_compiled_greedy_output_equals_plain_decoding(target, twin, strict_compile):
    result = specdec.generate(target, PROMPTS[0], drafter=PardDrafter(twin, pard_token=MASK), num_draft_tokens=3,
                              max_new_tokens=10, compile=True)
    assert result.tokens == hf_greedy(target, PROMPTS[0], 10) and result.stats.accepted > 0


def test_drafts_equal_an_independent_recomputation(target, other):
    watch = Watch(PardDrafter(other))
    specdec.generate(target, PROMPTS[1], drafter=watch.drafter, num_draft_tokens=3, max_new_tokens=12)
    assert len(watch.drafts[0]) >= 3
    for context, draft in zip(watch.contexts[0], watch.drafts[0]):
        assert draft == reference_block(other, context, MASK, len(draft)).argmax(-1).tolist(), context


def test_each_row_of_a_batch_drafts_its_batch_1_drafts_in_one_forward(target, twin, monkeypatch):
    forwards: list[int] = []  # the rows of each forward of the draft model
    forward = BatchLM.forward

    def counting(self, ids, *args, **kwargs):  # type: ignore[no-untyped-def]
        if self.lm.model is twin:
            forwards.append(ids.shape[0])
        return forward(self, ids, *args, **kwargs)

    monkeypatch.setattr(BatchLM, "forward", counting)
    watch = Watch(PardDrafter(twin, pard_token=MASK))
    batch = specdec.generate_batch(target, PROMPTS, drafter=watch.drafter, num_draft_tokens=4, max_new_tokens=NEW)
    assert len(forwards) == 1 + watch.steps, "a prefill, then one forward a step for every row"
    assert len({row.stats.accepted for row in batch}) > 1, "the rows should accept ragged numbers of tokens"
    for row, prompt in enumerate(PROMPTS):
        alone = Watch(PardDrafter(twin, pard_token=MASK))
        specdec.generate(target, prompt, drafter=alone.drafter, num_draft_tokens=4, max_new_tokens=NEW)
        assert watch.drafts[row] == alone.drafts[0], f"row {row}'s drafts differ from its batch-1 drafts"


def test_a_sampled_row_draws_its_batch_1_draws(target, other):
    sampling = Sampling(temperature=0.8)
    batch = specdec.generate_batch(target, PROMPTS, drafter=PardDrafter(other), max_new_tokens=NEW,
                                   sampling=sampling, seed=11)
    for row, prompt in enumerate(PROMPTS):
        alone = specdec.generate(target, prompt, drafter=PardDrafter(other), max_new_tokens=NEW, sampling=sampling,
                                 seed=11 + row)
        assert batch[row].tokens == alone.tokens, f"row {row}: its draws should be its batch-1 draws"


def test_sampled_continuations_match_plain_sampling():
    model = tiny_model(seed=0, **MODEL)
    drafter = PardDrafter(tiny_model(seed=1, **MODEL), pard_token=MODEL["vocab_size"] - 1)
    counts, drafted, accepted, deep = sample_counts(model, drafter, TRUNCATED)
    assert drafted > 0 and 0 < accepted < drafted and deep > 0, (drafted, accepted, deep)
    p_value = chi_square_p_value(counts, exact_distribution(model, [1, 2, 3, 1, 2, 3, 1, 2], TRUNCATED))
    assert p_value >= ALPHA, f"pard is not lossless: chi-square p = {p_value:.3g}"


def test_prefix_reading_settings_process_each_row_after_the_drafts_before_it(target, other):
    checked: list[int] = []

    def check(ctx, draft):  # type: ignore[no-untyped-def]
        tokens = draft.tokens.tolist()
        logits = reference_block(other, ctx.tokens.tolist(), MASK, len(tokens))
        assert draft.probs is not None
        for j in range(len(tokens)):
            q = ctx.probabilities(logits[j : j + 1], [tokens[:j]])[0]
            torch.testing.assert_close(draft.probs[j], q, rtol=1e-9, atol=1e-12)
            assert q[tokens[j]] > 0
        checked.append(len(tokens))

    sampling = Sampling(temperature=0.8, repetition_penalty=1.5)
    watch = Watch(PardDrafter(other), check)
    specdec.generate(target, PROMPTS[0], drafter=watch.drafter, max_new_tokens=NEW, sampling=sampling, seed=2)
    assert len(checked) > 2 and max(checked) > 1


def test_a_mask_row_past_the_targets_ids_is_never_drafted(target):
    own = tiny_model("llama", seed=4, vocab_size=65, layers=1)  # row 64 is the mask's
    watch = Watch(PardDrafter(own, pard_token=64))
    result = specdec.generate(target, PROMPTS[1], drafter=watch.drafter, num_draft_tokens=4, max_new_tokens=NEW)
    assert result.tokens == hf_greedy(target, PROMPTS[1], NEW) and result.stats.drafted > 0
    assert all(0 <= token < 64 for draft in watch.drafts[0] for token in draft)


@pytest.mark.parametrize("translate", ["tli", "slem"])
def test_greedy_output_equals_transformers_across_tokenizers(translate):
    target_tokenizer, draft_tokenizer = _tokenizers()
    drafter = PardDrafter(_draft("llama"), pard_token=3, tokenizer=draft_tokenizer, translate=translate)  # <0x00>
    ours = specdec.generate(_target("llama"), _prompt(), drafter=drafter, num_draft_tokens=3, max_new_tokens=NEW,
                            tokenizer=target_tokenizer)
    assert ours.stats.drafted > 0 and drafter.translation is not None and drafter.translation.mode == translate
    assert_greedy_matches_up_to_near_ties(_target("llama"), _prompt(), ours.tokens,
                                          hf_greedy(_target("llama"), _prompt(), NEW))


def test_a_missing_or_foreign_mask_token_and_pard2_are_refused_by_name(target):
    plain = tiny_model("llama", seed=5, layers=1)
    with pytest.raises(ValueError, match=r"'LlamaForCausalLM' names no mask token.*pass pard_token="):
        PardDrafter(plain)
    plain.config.pard_token = -1  # what PARD's trainer writes when it was given none
    with pytest.raises(ValueError, match=r"names no mask token"):
        PardDrafter(plain)
    with pytest.raises(ValueError, match=r"pard_token 64 of .* outside its vocabulary \[0, 64\)"):
        PardDrafter(plain, pard_token=64)
    plain.config.mask_token_id = 70
    with pytest.raises(ValueError, match=r"pard_token 70 .* outside its vocabulary"):
        PardDrafter(plain)
    plain.config.mask_token_id = 2
    assert PardDrafter(plain).pard_token == 2 and PardDrafter(plain, pard_token=5).pard_token == 5
    with pytest.raises(TypeError, match=r"drafter 'pard' rejects options.*unexpected keyword argument 'tree'"):
        specdec.make_drafter("pard", model=plain, tree=True)
    pard2 = tiny_model("llama", seed=6, layers=1)
    pard2.config.pard_token = MASK
    pard2.config.pard2_target_layers = [-1, -8]
    with pytest.raises(ValueError, match=r"PARD-2 checkpoint \(its config sets pard2_target_layers\).*independent=true"):
        PardDrafter(pard2)
    result = specdec.generate(target, PROMPTS[0], drafter=PardDrafter(pard2, independent=True), max_new_tokens=8)
    assert result.tokens == hf_greedy(target, PROMPTS[0], 8)
    pard2.config.pard2_proj_bias = True
    with pytest.raises(ValueError, match="pard2_proj_bias"):
        PardDrafter(pard2, independent=True)


# --- specdec train pard ------------------------------------------------------------------------

def test_training_rows_see_what_drafting_sees(other):
    """Row (block i, index t) of a dropped training layout gives the logits of the last row of
    [x_0..x_{t-i}, mask x i] run alone."""
    student = PardStudent(other, MASK, 64, PardRecipe(), seed=0)
    student.module.eval()
    ids = torch.randint(0, MASK, (2, 16), generator=torch.Generator().manual_seed(0))
    generator = torch.Generator().manual_seed(1)
    layouts = [drop_tokens(16, PardRecipe(), generator) for _ in range(2)]
    blocks, indices = (torch.stack(parts) for parts in zip(*layouts))
    with torch.no_grad():
        logits = student._logits(ids, blocks, indices)  # (2, N, V)
        for w in range(2):
            for n in range(blocks.shape[1]):
                i, t = int(blocks[w, n]), int(indices[w, n])
                alone = reference_block(other, ids[w, : t - i + 1].tolist(), MASK, i + 1)[-1]
                torch.testing.assert_close(logits[w, n], alone, rtol=1e-9, atol=1e-9)


def test_the_conditional_drop_keeps_every_chain_whole_and_the_counts_fixed():
    recipe = PardRecipe()
    assert kept_counts(100, recipe) == [100, 70, 48, 34, 24, 20, 19, 18]  # int(100 * 0.7 ** 2) = 48, as PARD's
    generator = torch.Generator().manual_seed(0)
    for _ in range(5):
        blocks, indices = drop_tokens(100, recipe, generator)
        kept = set(zip(blocks.tolist(), indices.tolist()))
        assert [int((blocks == i).sum()) for i in range(8)] == kept_counts(100, recipe)
        assert all(t >= i and (i == 0 or (i - 1, t - 1) in kept) for i, t in kept)
    visible = chain_visible(torch.tensor([0, 0, 0, 1, 2, 1]), torch.tensor([0, 1, 2, 2, 2, 1]))
    assert visible[4].tolist() == [True, False, False, False, True, True]  # (2, 2): x_0, its masks (1, 1), (2, 2)
    assert visible[3].tolist() == [True, True, False, True, False, False]  # (1, 2): x_0, x_1, itself


def _tiny_target_dir(path: Path) -> Path:
    tokenizer = _tokenizers()[0]
    model = tiny_model("llama", vocab_size=len(tokenizer), seed=0, dtype=torch.float32)
    model.save_pretrained(path)
    tokenizer.save_pretrained(str(path))
    return path


def test_train_pard_saves_a_checkpoint_that_decodes_losslessly(tmp_path):
    from tokenizers_for_tests import training_texts

    from specdec.training.run import TrainSettings, train_drafter

    data = tmp_path / "data"
    data.mkdir()
    for i, text in enumerate(training_texts()):
        (data / f"{i:02d}.py").write_text(text)
    settings = TrainSettings(steps=Steps(steps=3, batch=2, seq_len=32, lr=2e-3), draft=DraftSize(hidden=16, layers=1, heads=2,
                             kv_heads=1), pard=PardRecipe(para_num=4), eval_windows=2, eval_prompts=2,
                             eval_new_tokens=16)
    target_dir = _tiny_target_dir(tmp_path / "target")
    report = train_drafter("pard", target_dir, [data], tmp_path / "out", settings, show_progress=False, log=lambda _: None)
    config = json.loads((report.out / "config.json").read_text())
    assert config["spd_type"] == "pard" and config["vocab_size"] == len(_tokenizers()[0])
    assert {"agreement", "agreement@4", "loss@4"} <= set(report.heldout)
    model = tiny_model("llama", vocab_size=len(_tokenizers()[0]), seed=0)
    drafter = specdec.make_drafter("pard", model=str(report.out))
    assert drafter.pard_token == config["pard_token"]
    result = specdec.generate(model, PROMPTS[1], drafter=drafter, num_draft_tokens=4, max_new_tokens=NEW)
    assert result.tokens == hf_greedy(model, PROMPTS[1], NEW) and result.stats.drafted > 0


def test_a_table_without_a_free_row_gets_a_mask_row_of_its_own(target, monkeypatch):
    import specdec.training.pard as training

    def no_free_row(tokenizer, rows, where):  # type: ignore[no-untyped-def]
        raise ValueError("no free row")

    monkeypatch.setattr(training, "choose_mask_token", no_free_row)
    student = PardStudent.create(DraftSize(hidden=16, layers=1, heads=2, kv_heads=1), target, None, seed=0)
    assert student.mask == 64 and student.module.get_output_embeddings().weight.shape[0] == 65
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    student.module.double()
    loss = student.loss(teacher_batch(target, ids))
    loss.backward()
    assert torch.isfinite(loss) and student.module.get_input_embeddings().weight.grad[64].abs().sum() > 0
