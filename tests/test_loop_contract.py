"""What the loop promises drafters and users beyond parity: hidden-state wiring, when prefill
and commit are called, sliding-window caches, refusals of unsafe models and arguments."""

from __future__ import annotations

import pytest
import torch

import specdec
from specdec import CausalLM, Draft, DraftContext, Sampling
from specdec.verifier import DraftError, verify_chain
from drafters_for_tests import GarbageDrafter
from tiny import hf_greedy, tiny_model

PROMPT = [3, 7, 1, 3, 7, 1, 3, 7, 2, 5]


class HiddenStateSpy:
    """Checks every context's hidden states against a fresh full forward of the committed ids."""

    name = "hidden-spy"
    uses_hidden_states = True

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.calls: list[tuple[str, int]] = []
        self.last_commit_hidden: torch.Tensor | None = None

    def _check(self, ctx: DraftContext, where: str) -> None:
        hidden = ctx.hidden_states
        assert hidden is not None and hidden.dim() == 2, f"{where}: hidden states {hidden!r}"
        n = hidden.shape[0]
        self.calls.append((where, n))
        if ctx.tokens.shape[0] < 2:
            assert n == 0
            return
        full = self.model(input_ids=ctx.tokens[None, :-1], output_hidden_states=True).hidden_states[-1][0]
        assert n >= 1 and torch.allclose(hidden, full[-n:], atol=1e-10), f"{where}: rows are not tokens[-n-1:-1]"

    def prefill(self, ctx: DraftContext) -> None:
        self._check(ctx, "prefill")

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        self._check(ctx, "propose")
        if self.last_commit_hidden is not None:
            assert ctx.hidden_states is self.last_commit_hidden, "commit and the next propose differ"
        return Draft(torch.randint(0, 32, (k,), generator=torch.Generator().manual_seed(len(ctx.tokens))))

    def commit(self, ctx: DraftContext, num_accepted: int) -> None:
        self._check(ctx, "commit")
        self.last_commit_hidden = ctx.hidden_states


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_hidden_states_are_the_positions_processed_since_the_last_step(arch: str) -> None:
    model = tiny_model(arch, vocab_size=32)
    spy = HiddenStateSpy(model)
    result = specdec.generate(model, PROMPT, drafter=spy, num_draft_tokens=3, max_new_tokens=20)
    assert result.tokens == hf_greedy(model, PROMPT, 20)
    assert spy.calls[0] == ("prefill", len(PROMPT) - 1)
    assert [n for where, n in spy.calls if where == "commit"] and all(n >= 1 for _, n in spy.calls[1:])


def test_a_one_token_prompt_gives_an_empty_hidden_state_block() -> None:
    model = tiny_model("llama", vocab_size=32)
    spy = HiddenStateSpy(model)
    specdec.generate(model, [4], drafter=spy, num_draft_tokens=2, max_new_tokens=6)
    assert spy.calls[0] == ("prefill", 0)


class CallLog:
    name = "call-log"

    def __init__(self) -> None:
        self.calls: list[str] = []

    def prefill(self, ctx: DraftContext) -> None:
        self.calls.append("prefill")

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        self.calls.append("propose")
        return Draft(ctx.tokens[-1:].repeat(k))

    def commit(self, ctx: DraftContext, num_accepted: int) -> None:
        self.calls.append("commit")


def test_commit_follows_each_proposal_and_nothing_else() -> None:
    log = CallLog()
    specdec.generate(tiny_model("llama", vocab_size=32), PROMPT, drafter=log, num_draft_tokens=2, max_new_tokens=7)
    assert log.calls[0] == "prefill"
    body = log.calls[1:]
    assert body[0::2] == ["propose"] * len(body[0::2]) and body[1::2] == ["commit"] * len(body[0::2])


def test_no_draft_tokens_means_plain_decoding_without_touching_the_drafter() -> None:
    log = CallLog()
    model = tiny_model("llama", vocab_size=32)
    result = specdec.generate(model, PROMPT, drafter=log, num_draft_tokens=0, max_new_tokens=5)
    assert log.calls == [] and result.tokens == hf_greedy(model, PROMPT, 5)


class CacheMeddler:
    name = "meddler"

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        ctx.target.forward(ctx.tokens[-1:], keep=1)  # runs the loop's own target: forbidden
        return Draft(ctx.tokens[:0])


def test_a_drafter_that_runs_the_target_is_caught_by_name() -> None:
    with pytest.raises(DraftError, match="meddler"):
        specdec.generate(tiny_model("llama", vocab_size=32), PROMPT, drafter=CacheMeddler(), max_new_tokens=4)


@pytest.mark.parametrize("drafter", ["ngram", "garbage", "self"])
def test_sliding_window_models_keep_greedy_parity_past_the_window(drafter: str) -> None:
    model = tiny_model("mistral", vocab_size=32, sliding_window=6)
    choice = {"ngram": lambda: specdec.make_drafter("ngram"), "garbage": lambda: GarbageDrafter(seed=1),
              "self": lambda: specdec.make_drafter("draft-model", model=model)}[drafter]()
    result = specdec.generate(model, PROMPT, drafter=choice, num_draft_tokens=3, max_new_tokens=30)
    assert result.tokens == hf_greedy(model, PROMPT, 30)
    assert result.stats.drafted > 0


def test_a_model_in_training_mode_is_refused() -> None:
    model = tiny_model("gpt2", vocab_size=32).train()
    with pytest.raises(ValueError, match="model.eval"):
        specdec.generate(model, PROMPT, max_new_tokens=3)


@pytest.mark.parametrize("arguments, pattern", [
    ({"eos_token_id": 32}, "eos_token_id.*32"), ({"eos_token_id": [-1, 3]}, "eos_token_id.*-1"),
    ({"seed": "7"}, "seed"), ({"seed": 1.5}, "seed"),
])
def test_bad_eos_ids_and_seeds_are_refused_by_name(arguments: dict, pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        specdec.generate(tiny_model("llama", vocab_size=32), PROMPT, max_new_tokens=3, **arguments)


def test_q_rows_off_by_rounding_are_used_normalised() -> None:
    torch.manual_seed(0)
    p = torch.softmax(torch.randn(4, 9, dtype=torch.float64) * 2, -1)
    q = torch.softmax(torch.randn(3, 9, dtype=torch.float64) * 2, -1)
    tokens = torch.multinomial(q, 1).squeeze(-1)
    for seed in range(200):
        exact = verify_chain(p, tokens, q, torch.Generator().manual_seed(seed))
        scaled = verify_chain(p, tokens, q * 0.9993, torch.Generator().manual_seed(seed))
        assert exact.tokens.tolist() == scaled.tokens.tolist()


def test_a_draft_model_with_fewer_positions_drafts_less_instead_of_failing() -> None:
    target = tiny_model("llama", vocab_size=32, max_positions=64)
    short = tiny_model("gpt2", vocab_size=32, max_positions=14)
    drafter = specdec.make_drafter("draft-model", model=short)
    result = specdec.generate(target, PROMPT, drafter=drafter, num_draft_tokens=4, max_new_tokens=20)
    assert result.tokens == hf_greedy(target, PROMPT, 20)


def test_the_loop_accepts_its_own_adapter_and_leaves_it_consistent() -> None:
    lm = CausalLM(tiny_model("qwen3", vocab_size=32))
    result = specdec.generate(lm, PROMPT, drafter="ngram", max_new_tokens=9, sampling=Sampling(0.7), seed=2)
    assert lm.cache_length == len(PROMPT) + len(result.tokens) - 1
