"""The Medusa drafter: the public checkpoint format, greedy parity, losslessness, the head
offset convention (head i proposes the token i+1 places after the last committed one) and
clear errors on checkpoints that do not fit the target."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import PreTrainedModel

from specdec.protocols import row_view
import specdec
from specdec import Draft, DraftContext, Sampling
from specdec.drafters.feature_heads.medusa import MedusaDrafter
from specdec.drafters.feature_heads.medusa_head import MedusaHeads
from specdec.drafters.feature_heads.medusa_files import load_medusa, save_medusa
from specdec.plugins import load_registry
from specdec.runtime.target import CausalLM
from test_lossless_statistical import (ALPHA, MODEL, PLAIN, PROMPT as SHORT_PROMPT, TRUNCATED,
                                       chi_square_p_value, exact_distribution, sample_counts)
from tiny import hf_greedy, tiny_model

VOCAB, HIDDEN = 64, 32
PROMPT = [5, 9, 14, 22, 5, 9, 14, 22, 5, 9, 14]
NEW_TOKENS = 24
FORMATS = {"safetensors": True, "pt": False}  # format -> save_medusa(safe=...)


@functools.lru_cache(maxsize=None)
def _target(arch: str) -> PreTrainedModel:
    return tiny_model(arch, vocab_size=VOCAB, hidden=HIDDEN, seed=0)


def random_heads(num_heads: int = 3, num_layers: int = 1, hidden: int = HIDDEN, vocab: int = VOCAB,
                 seed: int = 0, dtype: torch.dtype = torch.float64) -> MedusaHeads:
    torch.manual_seed(seed)
    heads = MedusaHeads(num_heads, num_layers, hidden, vocab).to(dtype)
    with torch.no_grad():
        for parameter in heads.parameters():
            parameter.normal_(0.0, 0.5)
    return heads


def checkpoint(directory: Path, heads: MedusaHeads, fmt: str = "safetensors") -> Path:
    save_medusa(heads, directory, safe=FORMATS[fmt])
    return directory


class Recorder:
    """Wraps a drafter and keeps every draft it proposed."""

    name = "recorder"
    uses_hidden_states = True

    def __init__(self, inner: MedusaDrafter) -> None:
        self.inner, self.drafts = row_view(inner), []

    def prefill(self, ctx: DraftContext) -> None:
        self.inner.prefill(ctx)

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        draft = self.inner.propose(ctx, k)
        self.drafts.append(draft)
        return draft

    def commit(self, ctx: DraftContext, num_accepted: int) -> None:
        self.inner.commit(ctx, num_accepted)


def test_heads_compute_residual_blocks_then_a_bias_free_projection():
    heads = random_heads(num_heads=2, num_layers=2)
    x = torch.randn(3, HIDDEN, dtype=torch.float64)  # (n, H)
    state = heads.state_dict()
    for h in range(2):
        y = x
        for layer in range(2):
            w, b = state[f"{h}.{layer}.linear.weight"], state[f"{h}.{layer}.linear.bias"]
            y = y + torch.nn.functional.silu(y @ w.T + b)
        expected = y @ state[f"{h}.2.weight"].T  # (n, V)
        torch.testing.assert_close(heads(x)[h], expected, rtol=0, atol=1e-12)
    assert "0.2.bias" not in state


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_greedy_output_equals_plain_decoding_and_transformers(tmp_path, arch, fmt):
    target = _target(arch)
    drafter = MedusaDrafter(checkpoint(tmp_path, random_heads(dtype=torch.float32), fmt))
    result = specdec.generate(target, PROMPT, drafter=drafter, num_draft_tokens=4, max_new_tokens=NEW_TOKENS)
    plain = specdec.generate(target, PROMPT, max_new_tokens=NEW_TOKENS)
    assert result.tokens == plain.tokens == hf_greedy(target, PROMPT, NEW_TOKENS)
    assert result.stats.drafted > 0
    assert result.stats.drafted_per_position[3] == 0, "k' = min(k, K) = 3: nothing at position 4"
    parameter = next(drafter.heads.parameters())
    assert parameter.dtype == torch.float64, "heads follow the target's dtype"


def test_one_token_prompt_drafts_nothing_first_even_after_a_previous_generation(tmp_path):
    target = _target("llama")
    drafter = Recorder(MedusaDrafter(checkpoint(tmp_path, random_heads())))
    for prompt in (PROMPT, [7], PROMPT[:4]):  # one drafter reused across generations
        drafter.drafts.clear()
        result = specdec.generate(target, prompt, drafter=drafter, num_draft_tokens=2, max_new_tokens=12)
        assert result.tokens == specdec.generate(target, prompt, max_new_tokens=12).tokens
        lengths = [draft.tokens.shape[0] for draft in drafter.drafts]
        first = 0 if len(prompt) == 1 else 2  # no hidden state yet: nothing to draft from
        assert lengths[0] == first and 2 in lengths[1:], f"prompt {prompt}: draft lengths {lengths}"
        assert all(n >= 1 for n in lengths[1:]), f"prompt {prompt}: draft lengths {lengths}"


def fitted_heads(target: PreTrainedModel, prompt: list[int], num_heads: int) -> MedusaHeads:
    """Heads fitted by least squares to the target's own greedy run on `prompt`: head i maps
    the hidden state of position j to a logit 10 on token j+2+i (identity residual blocks)."""
    sequence = prompt + specdec.generate(target, prompt, max_new_tokens=NEW_TOKENS).tokens
    lm = CausalLM(target)
    lm.reset()
    with torch.inference_mode():
        _, hidden = lm.forward(torch.tensor(sequence[:-1]), keep=1, hidden=(lm.num_layers,))  # (T-1, H)
    heads = MedusaHeads(num_heads, 1, HIDDEN, VOCAB).to(torch.float64)
    with torch.no_grad():
        for h in range(num_heads):
            rows = range(len(prompt) - 2, len(sequence) - 2 - h)
            x = hidden[list(rows)].clone()  # (N, H)
            y = 10.0 * torch.nn.functional.one_hot(torch.tensor([sequence[j + 2 + h] for j in rows]),
                                                   VOCAB).double()  # (N, V)
            getattr(heads, str(h))[0].linear.weight.zero_()
            getattr(heads, str(h))[0].linear.bias.zero_()
            getattr(heads, str(h))[1].weight.copy_(torch.linalg.lstsq(x, y).solution.T)  # (V, H)
    return heads


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_heads_that_predict_the_target_are_accepted_at_their_offsets(tmp_path, arch):
    target = _target(arch)
    drafter = MedusaDrafter(checkpoint(tmp_path, fitted_heads(target, PROMPT, num_heads=3)))
    result = specdec.generate(target, PROMPT, drafter=drafter, num_draft_tokens=3, max_new_tokens=NEW_TOKENS)
    assert result.tokens == specdec.generate(target, PROMPT, max_new_tokens=NEW_TOKENS).tokens
    # An off-by-one in the head offsets would draft the wrong positions and accept ~nothing.
    assert result.stats.mean_accepted_length > 3.0, result.stats
    random_result = specdec.generate(target, PROMPT, drafter=MedusaDrafter(checkpoint(
        tmp_path / "random", random_heads())), num_draft_tokens=3, max_new_tokens=NEW_TOKENS)
    print(f"{arch}: mean accepted length fitted {result.stats.mean_accepted_length:.2f}, "
          f"random {random_result.stats.mean_accepted_length:.2f}")


@pytest.mark.parametrize(("sample", "sampling"), [(False, TRUNCATED), (True, PLAIN), (True, TRUNCATED)],
                         ids=["top1-t0.7-k4-p0.9", "sampled-t1", "sampled-t0.7-k4-p0.9"])
def test_continuations_match_plain_sampling(tmp_path, sample, sampling):
    target = tiny_model(seed=0, **MODEL)
    heads = random_heads(num_heads=2, hidden=MODEL["hidden"], vocab=MODEL["vocab_size"], seed=3)
    drafter = MedusaDrafter(checkpoint(tmp_path, heads), sample=sample)
    counts, drafted, accepted, deep = sample_counts(target, drafter, sampling)
    assert drafted > 0 and accepted > 0 and deep > 0, f"vacuous: drafted {drafted}, accepted {accepted}"
    assert accepted < drafted, f"no draft token was ever rejected ({drafted} drafted)"
    p_value = chi_square_p_value(counts, exact_distribution(target, SHORT_PROMPT, sampling))
    assert p_value >= ALPHA, f"medusa (sample={sample}, {sampling}) is not lossless: p = {p_value:.3g}"


@pytest.mark.parametrize(("sample", "sampling", "has_q"), [
    (False, PLAIN, False), (True, PLAIN, True), (True, Sampling(), False)])
def test_drafts_report_q_only_when_sampled(tmp_path, sample, sampling, has_q):
    drafter = Recorder(MedusaDrafter(checkpoint(tmp_path, random_heads()), sample=sample))
    specdec.generate(_target("llama"), PROMPT, drafter=drafter, max_new_tokens=6, sampling=sampling, seed=0)
    assert drafter.drafts and all((d.probs is not None) == has_q for d in drafter.drafts)


def test_save_load_round_trip_keeps_tensors_and_drafts(tmp_path):
    heads = random_heads(num_heads=2, num_layers=2)
    first = load_medusa(checkpoint(tmp_path / "a", heads, "safetensors"))
    second = load_medusa(checkpoint(tmp_path / "b", first, "pt"))
    for loaded in (first, second):
        assert loaded.state_dict().keys() == heads.state_dict().keys()
        for key, tensor in heads.state_dict().items():
            assert loaded.state_dict()[key].dtype == tensor.dtype and torch.equal(loaded.state_dict()[key], tensor)
    config = json.loads((tmp_path / "b" / "config.json").read_text())
    assert (config["medusa_num_heads"], config["medusa_num_layers"]) == (2, 2)
    runs = []
    for directory in ("a", "b"):
        recorder = Recorder(MedusaDrafter(tmp_path / directory, sample=True))
        result = specdec.generate(_target("llama"), PROMPT, drafter=recorder, max_new_tokens=12,
                                  sampling=PLAIN, seed=7)
        runs.append((result.tokens, [(d.tokens.tolist(), d.probs.tolist()) for d in recorder.drafts]))
    assert runs[0] == runs[1]


def test_make_drafter_builds_medusa_by_name(tmp_path):
    assert load_registry().origins["medusa"] == "builtin"
    drafter = specdec.make_drafter("medusa", path=checkpoint(tmp_path, random_heads()))
    assert isinstance(drafter, MedusaDrafter) and drafter.name == "medusa"


def rewrite(directory: Path, edit: Callable[[dict[str, torch.Tensor]], None]) -> Path:
    """Apply `edit` to the tensors of the checkpoint in `directory`, in its own format."""
    safetensors, pt = directory / "medusa_lm_head.safetensors", directory / "medusa_lm_head.pt"
    if safetensors.exists():
        tensors = load_file(str(safetensors))
        edit(tensors)
        save_file(tensors, str(safetensors))
        return safetensors
    tensors = torch.load(pt, weights_only=True)
    edit(tensors)
    torch.save(tensors, pt)
    return pt


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_wrongly_shaped_tensor_is_named_with_both_shapes(tmp_path, fmt):
    directory = checkpoint(tmp_path, random_heads(), fmt)
    file = rewrite(directory, lambda t: t.update({"1.0.linear.weight": torch.zeros(HIDDEN, 16, dtype=torch.float64)}))
    with pytest.raises(ValueError) as error:
        MedusaDrafter(directory)
    assert f"medusa: {file}: key '1.0.linear.weight' has shape (32, 16), expected (32, 32)" in str(error.value)


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_missing_key_is_named(tmp_path, fmt):
    directory = checkpoint(tmp_path, random_heads(), fmt)
    file = rewrite(directory, lambda t: t.pop("2.1.weight"))
    with pytest.raises(KeyError, match=rf"{file}.*'2\.1\.weight' is missing \(expected shape \(64, 32\)\)"):
        MedusaDrafter(directory)


def test_an_unexpected_key_is_named(tmp_path):
    directory = checkpoint(tmp_path, random_heads())
    rewrite(directory, lambda t: t.update({"3.1.weight": torch.zeros(VOCAB, HIDDEN, dtype=torch.float64)}))
    with pytest.raises(ValueError, match=r"unexpected keys \['3\.1\.weight'\]"):
        MedusaDrafter(directory)


@pytest.mark.parametrize(("hidden", "vocab", "key", "shapes"), [
    (16, VOCAB, "0.0.linear.weight", "has shape (16, 16), expected (32, 32)"),
    (HIDDEN, 96, "0.1.weight", "has shape (96, 32), expected (64, 32)"),
], ids=["hidden-size", "vocabulary"])
def test_heads_that_do_not_fit_the_target_are_refused(tmp_path, hidden, vocab, key, shapes):
    directory = checkpoint(tmp_path, random_heads(hidden=hidden, vocab=vocab))
    with pytest.raises(ValueError) as error:
        specdec.generate(_target("llama"), PROMPT, drafter=MedusaDrafter(directory), max_new_tokens=4)
    assert f"{directory / 'medusa_lm_head.safetensors'}: key '{key}' {shapes}" in str(error.value)


def test_missing_directory_config_field_or_weights_are_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="is not a directory"):
        MedusaDrafter(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="config.json not found"):
        MedusaDrafter(tmp_path)
    directory = checkpoint(tmp_path / "ckpt", random_heads())
    config = json.loads((directory / "config.json").read_text())
    del config["medusa_num_layers"]
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="has no 'medusa_num_layers'"):
        MedusaDrafter(directory)
    (directory / "config.json").write_text(json.dumps({"medusa_num_heads": 3, "medusa_num_layers": 1}))
    assert load_medusa(directory).hidden_size == HIDDEN  # sizes inferred when the config omits them
    (directory / "medusa_lm_head.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="neither medusa_lm_head.safetensors nor medusa_lm_head.pt"):
        MedusaDrafter(directory)


def test_saving_over_a_checkpoint_in_the_other_format_replaces_it(tmp_path):
    old, new = random_heads(seed=1), random_heads(seed=2)
    for first, second in (("safetensors", "pt"), ("pt", "safetensors")):
        checkpoint(tmp_path / first, old, first)
        loaded = load_medusa(checkpoint(tmp_path / first, new, second))
        assert all(torch.equal(loaded.state_dict()[key], tensor) for key, tensor in new.state_dict().items())


class MisreportingDrafter(MedusaDrafter):
    """Lossy on purpose: draws from each head's q but reports a flatter one."""

    def propose(self, rows: dict[int, DraftContext], k: dict[int, int]) -> dict[int, Draft]:
        return {row: draft if draft.probs is None else Draft(draft.tokens, 0.5 * draft.probs + 0.5 / draft.probs.shape[-1])
                for row, draft in super().propose(rows, k).items()}


def test_chi_square_detects_drafts_whose_reported_q_is_not_the_one_sampled(tmp_path):
    target = tiny_model(seed=0, **MODEL)
    heads = random_heads(num_heads=2, hidden=MODEL["hidden"], vocab=MODEL["vocab_size"], seed=3)
    counts, drafted, _, _ = sample_counts(target, MisreportingDrafter(checkpoint(tmp_path, heads), sample=True),
                                          PLAIN)
    assert drafted > 0
    p_value = chi_square_p_value(counts, exact_distribution(target, SHORT_PROMPT, PLAIN))
    assert p_value < ALPHA, f"a misreported q went undetected: p = {p_value:.3g}"
