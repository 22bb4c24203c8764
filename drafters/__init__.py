"""The builtin drafters, grouped by family (`model_free`, `draft_models`, `feature_heads`, `parallel`, with
`tree_search` and `shared` helpers beside them), one module per drafter, registered through the
same hook as third-party plugins; they may import `specdec.drafters.model_free`,
`specdec.drafters.draft_models`, `specdec.drafters.feature_heads`, `specdec.drafters.parallel`,
`specdec.drafters.tree_search`,
`specdec.drafters.shared`, `specdec.types`, `specdec.trees`,
`specdec.sampling`, `specdec.protocols`, `specdec.hookspecs`, `specdec.checkpoints`,
`specdec.runtime`, `specdec.distributed`, `specdec.data` (the retrieval datastore and the self
drafter's calibration text) and `specdec.vocab` (a draft model with another tokenizer)."""

from __future__ import annotations

from specdec.drafters.draft_models.draft_model import DraftModelDrafter
from specdec.drafters.feature_heads.eagle import EagleDrafter
from specdec.drafters.feature_heads.eagle3 import Eagle3Drafter
from specdec.drafters.model_free.lookahead import LookaheadDrafter
from specdec.drafters.feature_heads.medusa import MedusaDrafter
from specdec.drafters.feature_heads.mtp import MtpDrafter
from specdec.drafters.parallel.dflash import DFlashDrafter
from specdec.drafters.parallel.pard import PardDrafter
from specdec.drafters.model_free.ngram import NgramDrafter
from specdec.drafters.model_free.retrieval import RetrievalDrafter
from specdec.drafters.draft_models.self_draft import SelfDrafter
from specdec.drafters.model_free.suffix import SuffixDrafter
from specdec.hookspecs import hookimpl
from specdec.protocols import Drafter

__all__ = ["DFlashDrafter", "DraftModelDrafter", "Eagle3Drafter", "EagleDrafter", "LookaheadDrafter", "MedusaDrafter", "MtpDrafter",
           "NgramDrafter", "PardDrafter", "RetrievalDrafter", "SelfDrafter", "SuffixDrafter", "specdec_register_drafters"]


@hookimpl
def specdec_register_drafters() -> list[type[Drafter]]:
    return [NgramDrafter, DraftModelDrafter, MedusaDrafter, EagleDrafter, Eagle3Drafter, MtpDrafter, SuffixDrafter,
            RetrievalDrafter, LookaheadDrafter, SelfDrafter, DFlashDrafter, PardDrafter]
