"""The one sampling pipeline: logits -> each row's processed distribution, from the row's own prefix.

Every row (a verify position, a tree node, a batch row's position, a drafter's next draft
position) is processed from its own prefix: the committed ids, then that row's draft path. The
steps, in this order (transformers' order for the settings it shares, `GenerationMixin.
_get_logits_processor`; the OpenAI penalties beside its repetition penalty):

1. `logit_bias` (transformers' `sequence_bias` for one-id sequences);
2. `repetition_penalty` over every id of the prefix (transformers);
3. `presence_penalty`, `frequency_penalty` over the generated ids of the prefix (OpenAI);
4. `no_repeat_ngram_size` (transformers);
5. `bad_words_ids` (transformers);
6. `logits_processors`, the user's, in their order (transformers runs a user's processors after
   its own);
7. a constraint's mask (`json_schema`, `regex`, `grammar`): only ids the grammar allows after
   the prefix;
8. greedy: the argmax; sampling: temperature, top-k, top-p, min-p (transformers' warpers), softmax.

Steps 1-3 and 5 (one-id words) and 8 are tensor operations over all rows at once; steps 4-7 run
on the host, row by row (`specdec.processing.pipeline`). Settings that read no prefix (steps 1,
5 for one-id words, 8) are `specdec.sampling`'s stateless functions, which compiled steps may run.

This folder may import `specdec.sampling` and `specdec.types`.
"""

from __future__ import annotations

from typing import Any

from specdec.processing.prefixes import Prefixes, chain_paths, tree_paths

__all__ = ["Pipeline", "Prefixes", "ProcessorError", "chain_paths", "tree_paths"]


def __getattr__(name: str) -> Any:  # the pipeline imports specdec.sampling, which imports this package's math
    if name in ("Pipeline", "ProcessorError"):
        from specdec.processing import pipeline

        return getattr(pipeline, name)
    raise AttributeError(f"module 'specdec.processing' has no attribute {name!r}")
