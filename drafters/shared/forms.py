"""How a learned drafter drafts the rows it is given: its batched form, one forward per draft depth
for every row, where that form drafts the generation (several rows, under settings it serves),
else a row form per row, each on a cache of its own (the drafter's one-row steps, compiled as
one graph per chain or tree when the generation compiles).

A row form has `prefill(ctx)`, `propose(ctx, k) -> Draft`, `commit(ctx, num_accepted)` and an int
`cache_length`; a batched form `serves(ctx) -> bool` (judged at prefill from the first row: its
sampling settings, engine and tokenizer are every row's), `prefill(rows)`, `propose(rows, k)`,
`commit(rows, accepted)` and `cache_length(row)`. Row forms are kept across generations, so
their static caches (and the CUDA graphs captured on them) are reused.

Why a batch of one keeps a row form: the two forms draft the same tokens (the zoo's EAGLE, EAGLE-3
and MTP, chains and trees, greedy, T = 0.8 and a repetition penalty give identical outputs through
either), but the batched form pays for its row bookkeeping and padding on every step, and the row
form's fixed-shape static cache compiles one graph per chain. On the zoo, compiled, 2 cores, a batch
of one drafts 20-25% faster through the row form (EAGLE-3 chains 523 against 418 tokens/s, trees
472 against 357), so the row form is the batch-of-one fast path, as the loop's one-read verify is.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from specdec.protocols import Rows
from specdec.types import Draft

__all__ = ["Forms", "DraftsThroughForms"]


class Forms:
    """The forms of one learned drafter: `make_row()` makes a row form, `make_batch()` the batched form
    (None for a drafter without one)."""

    def __init__(self, make_row: Callable[[], Any], make_batch: Callable[[], Any] | None = None) -> None:
        self.make_row, self.make_batch = make_row, make_batch
        self.rows: dict[int, Any] = {}  # row -> its row form (kept across generations)
        self.batch: Any = None  # the batched form drafting this generation, or None

    def prefill(self, rows: Rows) -> None:
        first = rows[min(rows)]
        form = self.make_batch() if self.make_batch is not None and len(rows) > 1 else None
        self.batch = form if form is not None and form.serves(first) else None
        if self.batch is not None:
            self.batch.prefill(rows)
            return
        for row, ctx in rows.items():
            if row not in self.rows:
                self.rows[row] = self.make_row()
            self.rows[row].prefill(ctx)

    def propose(self, rows: Rows, k: Mapping[int, int]) -> Mapping[int, Draft]:
        if self.batch is not None:
            return self.batch.propose(rows, k)
        return {row: self.rows[row].propose(ctx, k[row]) for row, ctx in rows.items()}

    def commit(self, rows: Rows, accepted: Mapping[int, int]) -> None:
        if self.batch is not None:
            self.batch.commit(rows, accepted)
            return
        for row, ctx in rows.items():
            self.rows[row].commit(ctx, accepted[row])

    def cache_length(self, row: int) -> int:
        if self.batch is not None:
            return int(self.batch.cache_length(row))
        return int(self.rows[row].cache_length) if row in self.rows else 0


class DraftsThroughForms:
    """The rows protocol's state methods of a drafter that drafts through its `Forms` (`self._forms`)."""

    _forms: Forms

    def prefill(self, rows: Rows) -> None:
        self._forms.prefill(rows)

    def propose(self, rows: Rows, k: Mapping[int, int]) -> Mapping[int, Draft]:
        return self._forms.propose(rows, k)

    def commit(self, rows: Rows, accepted: Mapping[int, int]) -> None:
        self._forms.commit(rows, accepted)

    def cache_length(self, row: int) -> int:
        return self._forms.cache_length(row)
