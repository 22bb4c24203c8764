"""DFlash: a block drafter that proposes a whole block in one forward (Chen et al. 2026, "DFlash:
Block Diffusion for Flash Speculative Decoding", arXiv 2602.06036); its stack is
`specdec.drafters.parallel.dflash_head`, its files `specdec.drafters.parallel.dflash_files`.

Each step, every row's context keys and values are brought up to its committed positions (the
target's hidden states of the positions it processed since the last step, fused and projected in
every layer), then one forward of the block [last committed id, mask x (B - 1)] over all rows
gives, at slot j, q_j: the distribution of the token j places past the last committed one, given
the context alone. A draft of k <= B - 1 tokens reads slots 1..k.

Exact under sampling. The reference drafts each slot's argmax at every temperature; here, with
sample=True (the default) and temperature > 0, each token d_j is drawn from its own q_j (processed
as the verifier processes p there, from the committed ids and d_1..d_{j-1}). Given the context,
q_j does not depend on the tokens drawn at the other slots, so q_j is exactly the law d_j was
drawn from given d_1..d_{j-1}: reported as the draft's probs, it makes `min(1, p/q)` and every
chain rule exact. sample=False drafts the argmax (a deterministic draft, verified as one-hot).

DDTree (Ringel and Romano 2026, arXiv 2604.12989): tree=True drafts the `total_tokens` best prefixes
by the product of the slots' probabilities, each depth limited to its `top_k` most likely ids
(`specdec.drafters.tree_search.ddtree`), from the same single forward; its candidates are
deterministic, verified by every rule that serves deterministic trees.

Batches draft every row in one forward. A compiled generation runs that forward over every row
the generation began with and the cache's whole capacity (one shape); eager decoding over the
rows still decoding and the columns they hold.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import torch
from specdec.drafters.parallel.dflash_cache import ContextCache
from specdec.drafters.parallel.dflash_files import load_dflash
from specdec.drafters.parallel.dflash_head import DFlashHead
from specdec.drafters.shared.chains import chain_uniforms
from specdec.drafters.tree_search.ddtree import best_prefixes
from torch import nn

from specdec.protocols import Capability, DraftContext, Rows
from specdec.runtime.engine import Step
from specdec.runtime.target import CausalLM
from specdec.sampling import PrefixPicker, pick
from specdec.types import Draft, static_capacity

__all__ = ["DFlashDrafter", "block_logits", "check_fits"]


def block_logits(head: DFlashHead, lm_head: nn.Module, embeds: torch.Tensor, positions: torch.Tensor,
                 keys: list[torch.Tensor], values: list[torch.Tensor], visible: torch.Tensor) -> torch.Tensor:
    """The block's logits at slots 1 .. B - 1 [R, B - 1, V'] (the target LM head's rows): one step,
    compiled as one graph per shape when the generation compiles."""
    hidden = head.block(embeds, positions, keys, values, visible)  # (R, B, H)
    return lm_head(hidden[:, 1:])


def check_fits(head: DFlashHead, lm: CausalLM) -> tuple[int, ...]:
    """The target's hidden-state indices the drafter reads; raises naming the file and both sizes
    when the drafter does not fit the target."""
    spec = head.spec
    where = head.files[0] if head.files is not None else "the DFlash drafter"
    if spec.layer.hidden_size != lm.hidden_size:
        raise ValueError(f"dflash: {where}: hidden_size is {spec.layer.hidden_size} but the target's is "
                         f"{lm.hidden_size}; the drafter reads the target's embeddings and LM head, so it must "
                         "be trained for this target")
    if spec.mask_token_id >= lm.vocab_size:
        raise ValueError(f"dflash: {where}: mask_token_id {spec.mask_token_id} is outside the target's vocabulary "
                         f"({lm.vocab_size} ids)")
    layers = tuple(i + 1 for i in spec.target_layer_ids)  # layer i's output is hidden_states[i + 1]
    if any(layer > lm.num_layers for layer in layers):
        raise ValueError(f"dflash: {where}: target_layer_ids {list(spec.target_layer_ids)} name layers the target "
                         f"does not have (it has {lm.num_layers}, ids 0..{lm.num_layers - 1})")
    return layers


class DFlashDrafter:
    """Drafts with a DFlash checkpoint at `path` (a directory or a hub id).

    sample: draw each slot's token from its q at temperature > 0 (True, the default) or take its
    argmax. tree, top_k, total_tokens: DDTree's tree of the total_tokens best prefixes, top_k ids
    per depth. A draft holds at most B - 1 tokens per path, whatever k.
    """

    name: ClassVar[str] = "dflash"
    capabilities: ClassVar[frozenset[Capability]] = frozenset({Capability.STATE, Capability.HIDDEN_STATES,
                                                               Capability.TREES, Capability.CACHE_LENGTH})
    tree_options: ClassVar[dict[str, Any]] = {"tree": True}

    def __init__(self, path: str | Path, tree: bool = False, top_k: int = 8, total_tokens: int = 16,
                 sample: bool = True) -> None:
        for option, value in (("tree", tree), ("sample", sample)):
            if not isinstance(value, bool):
                raise ValueError(f"dflash: {option} must be true or false, got {value!r}")
        for option, value in (("top_k", top_k), ("total_tokens", total_tokens)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"dflash: {option} must be a positive integer, got {value!r}")
        self.tree, self.top_k, self.total_tokens, self.sample = tree, top_k, total_tokens, sample
        self.head = load_dflash(path)
        self.block_size = self.head.spec.block_size
        self.cache: ContextCache | None = None
        self.slots: dict[int, int] = {}  # row -> its slot in the cache
        self._step: Step | None = None
        self._step_key: tuple[Any, ...] = ()
        self.last_block: dict[int, torch.Tensor] = {}  # row -> the block's q or argmax ids, for traces

    # -- declarations ------------------------------------------------------------------------------
    def hidden_layers(self, target: CausalLM) -> tuple[int, ...]:
        return check_fits(self.head, target)

    def max_draft_nodes(self, k: int) -> int:
        return self.total_tokens if self.tree else min(k, self.block_size - 1)

    def cache_length(self, row: int) -> int:
        if self.cache is None or row not in self.slots:
            return 0
        return self.cache.lengths[self.slots[row]]

    # -- state -------------------------------------------------------------------------------------
    def prefill(self, rows: Rows) -> None:
        first = rows[min(rows)]
        lm = first.target
        check_fits(self.head, lm)
        self.head.to(device=lm.device, dtype=lm.dtype)
        rotary = self.head.rotary_emb  # its frequencies stay float32 whatever the head's dtype
        rotary.inv_freq = rotary.original_inv_freq.to(device=lm.device, dtype=torch.float32)
        engine = first.engine
        capacity = static_capacity(engine.max_length) if engine.compile and engine.max_length else None
        kv_heads, head_dim = self.head.kv_shape
        self.slots = {row: slot for slot, row in enumerate(sorted(rows))}
        self.cache = ContextCache(len(self.head.layers), len(self.slots), kv_heads, head_dim, lm.dtype, lm.device,
                                  capacity)
        key = (engine.compile and capacity is not None, lm.dtype, str(lm.device))
        if self._step is None or key != self._step_key:
            self._step = Step(block_logits, "the DFlash block", key[0], self.head, uses=(lm.lm_head,))
            self._step_key = key
        for row, ctx in rows.items():  # prompts differ in length: one row at a time, once
            self._catch_up({row: ctx})

    def commit(self, rows: Rows, accepted: Mapping[int, int]) -> None:
        """Nothing to roll back: the cache holds committed positions only; the accepted ones arrive
        with their hidden states at the next step."""

    # -- drafting ----------------------------------------------------------------------------------
    def _catch_up(self, rows: Rows) -> None:
        """Append each row's committed positions not yet cached (their features: the last rows of
        ctx.hidden_states), all rows in one projection."""
        assert self.cache is not None
        slots, counts, features, positions = [], [], [], []
        for row, ctx in rows.items():
            slot = self.slots[row]
            start, end = self.cache.lengths[slot], ctx.tokens.shape[0] - 1
            if end <= start:
                continue
            states = ctx.hidden_states
            if states is None or states.shape[0] < end - start:
                got = None if states is None else states.shape[0]
                raise RuntimeError(f"dflash: row {row}: {end - start} target hidden states needed, got {got}; the "
                                   "loop must pass the hidden states of every processed position")
            slots.append(slot)
            counts.append(end - start)
            features.append(states[states.shape[0] - (end - start):])
            positions.append(torch.arange(start, end, device=states.device))
        if not slots:
            return
        longest = max(counts)
        padded = torch.stack([torch.cat([f, f.new_zeros(longest - f.shape[0], f.shape[1])]) for f in features])
        where = torch.stack([torch.cat([p, p.new_zeros(longest - p.shape[0])]) for p in positions])  # (n, P)
        with torch.no_grad():
            new = self.head.context_kv(padded.to(self.head.fc.weight.dtype), where)
        self.cache.append(slots, counts, new)

    def propose(self, rows: Rows, k: Mapping[int, int]) -> Mapping[int, Draft]:
        assert self.cache is not None and self._step is not None
        self._catch_up(rows)
        first = rows[min(rows)]
        lm = first.target
        compiled = self._step.compiled
        ordered = sorted(self.slots) if compiled else sorted(rows)  # compiled: every row, one shape
        slots = [self.slots[row] for row in ordered]
        columns = self.cache.capacity if compiled else max(max(self.cache.lengths[s] for s in slots), 1)
        every = compiled or slots == list(range(len(self.slots)))  # every row, in slot order: views, no copy
        keys, values, visible = self.cache.view(None if every else slots, columns)
        device = lm.device
        starts = torch.tensor([self.cache.lengths[slot] for slot in slots], device=device)  # (R,) position s
        last = torch.stack([rows[row].tokens[-1] if row in rows else rows[min(rows)].tokens[-1] for row in ordered])
        ids = torch.full((len(ordered), self.block_size), self.head.spec.mask_token_id, device=device)
        ids[:, 0] = last
        positions = starts[:, None] + torch.arange(self.block_size, device=device)  # (R, B)
        with torch.no_grad():
            logits = self._step(lm.lm_head, lm.embed_tokens(ids), positions, keys, values, visible)  # (R, B-1, V')
        drafts: dict[int, Draft] = {}
        for index, row in enumerate(ordered):
            if row in rows:
                drafts[row] = self._draft(rows[row], logits[index, :, : rows[row].vocab_size], k[row])
        return drafts

    def _draft(self, ctx: DraftContext, logits: torch.Tensor, k: int) -> Draft:
        """One row's draft from its block's logits [B - 1, V]."""
        depth = min(k, logits.shape[0])
        if depth <= 0:
            return Draft(ctx.tokens[:0])
        if self.tree:
            tokens, parents = best_prefixes(torch.log_softmax(logits[:depth].float(), dim=-1), self.top_k,
                                            self.total_tokens)
            device = ctx.tokens.device
            return Draft(torch.tensor(tokens, dtype=torch.long, device=device),
                         parents=torch.tensor(parents, dtype=torch.long, device=device), siblings="distinct", forwards=1)
        sampled = self.sample and not ctx.sampling.greedy
        uniforms = chain_uniforms(ctx, depth, sampled)  # as many draws whatever k
        if ctx.sampling.reads_prefix:  # each slot processed from the committed ids and the tokens drawn before it
            picker = PrefixPicker(ctx)
            picked = [picker(logits[j : j + 1], None if uniforms is None else uniforms[j : j + 1]) for j in range(depth)]
            tokens = torch.cat([token for token, _ in picked])
            probs = torch.cat([q for _, q in picked]) if sampled else None
            return Draft(tokens, probs, forwards=1)
        tokens, probs = pick(logits[:depth], ctx.sampling, None if uniforms is None else uniforms[:depth])
        return Draft(tokens, probs, forwards=1)
