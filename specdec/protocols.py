"""The Drafter protocol: the one extension contract, and the context a drafter receives."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

import torch

from specdec.types import Draft, Engine, Sampling

if TYPE_CHECKING:
    from specdec.processing import Pipeline, Prefixes
    from specdec.runtime.target import CausalLM

__all__ = ["DraftContext", "Drafter", "forget"]


@dataclass(frozen=True)
class DraftContext:
    """What a drafter may read at one decode step; nothing in it belongs to the drafter.

    tokens: LongTensor [T] of committed ids (prompt and accepted output) on the target's
        device. The target's KV cache holds all of them but the last.
    sampling: the settings the verifier applies to p; a sampled draft must use them for q.
    generator: the step's random source; draw every random number from it (reproducibility).
    target: the target adapter (embedding, LM head, final norm, config, device).
    vocab_size: V, the width of p and of any q.
    hidden_states: FloatTensor [n, H], the target's last-layer (post-final-norm) hidden states
        of the n positions it processed since the previous step, i.e. tokens[-n-1:-1]; None
        unless the drafter sets `uses_hidden_states = True`. A drafter with a
        `hidden_layers(target)` method gets the layers it names instead, concatenated:
        [n, m * H]. The same value is passed to `commit` and to the next `propose`.
    accepted: the indices, in the previous draft, of its nodes that were just committed, root
        side first (for a chain 0..num_accepted-1); a tree drafter reads its path here.
    engine: how this generation runs its models: whether fixed-shape steps are compiled, the
        longest the committed sequence gets and the loop's k (`specdec.types.Engine`), for a
        drafter that keeps a static cache (`engine.capacity(...)`) or compiles its own step.
    extra_logits: FloatTensor [m, V], the target's raw logits (before any sampling) at the m
        extra rows of the draft just verified (`Draft.extra`), in its order, padding left
        out; None when that draft carried none or the target could not run them. The same
        value is passed to `commit` and to the next `propose`.
    budget: how many tokens this sequence may still emit, this step's included (None when the
        caller does not say); a drafter asked for fewer than the loop's k tokens tells from it
        whether the budget's end cut the draft short.
    pipeline: the generation's sampling pipeline (`specdec.processing.Pipeline`); a drafter
        reaches it through `probabilities` and `greedy_ids`.
    tokenizer: the target's tokenizer when the caller gave one (`specdec.generate(tokenizer=)`),
        else None; a drafter that works on text (a draft model with a vocabulary of its own)
        reads it here.
    """

    tokens: torch.Tensor
    sampling: Sampling
    generator: torch.Generator
    target: CausalLM
    vocab_size: int
    hidden_states: torch.Tensor | None = None
    accepted: tuple[int, ...] = ()
    engine: Engine = Engine()
    extra_logits: torch.Tensor | None = None
    budget: int | None = None
    pipeline: Pipeline | None = None
    tokenizer: Any = None

    def probabilities(self, logits: torch.Tensor, drafted: Sequence[Sequence[int] | torch.Tensor] | None = None
                      ) -> torch.Tensor:
        """q by the pipeline the verifier applies to p: logits [m, V] -> distributions [m, V], row i
        processed as if `drafted[i]` (the draft ids on its path, root side first) followed the
        committed ids (None: every row follows the committed ids alone). One-hot at the processed
        argmax when greedy. A sampled draft token must be drawn from its row. A row the settings
        leave no id (a grammar that allows none of a smaller draft vocabulary's ids) is its raw
        logits, warped: its draws are rejected, and the verifier stays exact."""
        return self._pipeline().probabilities(logits, self._prefixes(logits, drafted), draft=True)

    def greedy_ids(self, logits: torch.Tensor, drafted: Sequence[Sequence[int] | torch.Tensor] | None = None
                   ) -> torch.Tensor:
        """The argmax of each row's processed scores [m], rows as for `probabilities`."""
        return self._pipeline().argmax(logits, self._prefixes(logits, drafted), draft=True)

    def _pipeline(self) -> Pipeline:
        if self.pipeline is None:
            from specdec.processing import Pipeline

            object.__setattr__(self, "pipeline", Pipeline(self.sampling, self.vocab_size, 0))
        assert self.pipeline is not None
        return self.pipeline

    def _prefixes(self, logits: torch.Tensor, drafted: Sequence[Sequence[int] | torch.Tensor] | None) -> Prefixes | None:
        if not self.sampling.reads_prefix:
            return None
        from specdec.processing import Prefixes

        rows = logits.shape[0]
        if drafted is not None and len(drafted) != rows:
            raise ValueError(f"ctx.probabilities: {rows} logits rows but {len(drafted)} drafted prefixes")
        return Prefixes.of(self.tokens, self._pipeline().prompt_length, drafted if drafted is not None else [[]] * rows)


@runtime_checkable
class Drafter(Protocol):
    """Proposes up to k tokens continuing `ctx.tokens`.

    Required: a class attribute `name` (the registry name) and `propose`.
    Optional methods, called when present:
      prefill(ctx) -> None: after the target's prefill, once per generation; reset own state.
      commit(ctx, num_accepted) -> None: after each verify; `num_accepted` of the last draft's
          tokens are now committed (ctx.tokens has the new sequence, ctx.accepted which nodes
          of a tree); roll back own state.
      finish(ctx) -> None: the generation ended; ctx holds its final tokens (a drafter that
          learns from its outputs, like suffix decoding, folds this one in).
      fork() -> Drafter: another instance for one more row of a batch (`specdec.generate_batch`):
          it shares what is read-only (weights, a datastore) or learnt across generations, and
          none of the per-generation state. Without it a batch deep-copies the drafter, sharing
          its torch modules. A drafter may instead draft a whole batch itself
          (`propose_batch`, see `specdec.decoding.batch_drafters`).
      max_draft_nodes(k) -> int: the most nodes a draft of depth at most k holds. A tree drafter
          declares it so the verify forward keeps one shape: the target's cache is sized for it
          and every tree is padded to it. Without it trees hold at most
          `specdec.types.UNDECLARED_NODES` nodes, padded to the next power of two.
      forget() -> None: a drafter that learns across generations (a suffix tree of earlier
          outputs) drops what it learned, as a fresh instance; benchmarks call it before each
          round, so no round drafts from an earlier round's answers to the same prompts.
      hidden_layers(target) -> tuple[int, ...]: with uses_hidden_states, the target layers whose
          hidden states the drafter reads, called once per generation before the target's
          prefill. Indices are those of transformers' `hidden_states`: 0 is the embeddings, i
          the residual stream entering layer i, target.num_layers the post-norm last layer (the
          default). EAGLE-3 reads three.
      extra_rows() -> int: the most rows a draft's `extra` holds (`specdec.types.ExtraRows`).
          A drafter declares it to ride rows of its own in the verify forward (lookahead's
          Jacobi rows): every such forward pads them to this many, and the cache is sized for
          them. Their logits come back in ctx.extra_logits; they never enter the cache or the
          verdict. Targets that cannot run a tree forward drop them, with a warning.
    Optional class attribute: uses_hidden_states = True to receive ctx.hidden_states.
    Optional attribute: cache_length (an int), the positions the drafter's own KV cache holds;
    traces record it before and after each propose and commit (`specdec.teaching.trace.CacheLengths`).

    A draft with `parents` is a tree whose depth is at most k and whose size is at most
    max_draft_nodes(k) (`specdec.types.Draft`); targets that cannot run a tree forward verify
    its first-child path instead, with a warning. An exception raised in prefill, propose or
    commit reaches the caller as a `specdec.verifier.DraftError` naming the drafter and the
    method, the original chained.
    A draft with `probs` promises its tokens were drawn from exactly those rows, after the
    same sampling pipeline (`ctx.probabilities(logits, drafted)`: each row from its own draft
    prefix, as the verifier processes p).
    """

    name: ClassVar[str]

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        """Return a Draft of at most k tokens."""
        ...


def forget(drafter: object) -> None:
    """Call the drafter's optional `forget()` (a drafter that remembers earlier generations
    starts the round as a fresh instance would)."""
    method = getattr(drafter, "forget", None)
    if callable(method):
        method()
