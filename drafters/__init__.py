"""The builtin drafters, one module each (with the helpers they share), registered through the
same hook as third-party plugins; they may import `specdec.types`, `specdec.trees`,
`specdec.sampling`, `specdec.protocols`, `specdec.hookspecs`, `specdec.checkpoints`,
`specdec.runtime`, `specdec.distributed`, `specdec.data` (the retrieval datastore and the self
drafter's calibration text) and `specdec.vocab` (a draft model with another tokenizer)."""

from __future__ import annotations

from specdec.drafters.draft_model import DraftModelDrafter
from specdec.drafters.eagle import EagleDrafter
from specdec.drafters.eagle3 import Eagle3Drafter
from specdec.drafters.lookahead import LookaheadDrafter
from specdec.drafters.medusa import MedusaDrafter
from specdec.drafters.mtp import MtpDrafter
from specdec.drafters.ngram import NgramDrafter
from specdec.drafters.retrieval import RetrievalDrafter
from specdec.drafters.self_draft import SelfDrafter
from specdec.drafters.suffix import SuffixDrafter
from specdec.hookspecs import hookimpl
from specdec.protocols import Drafter

__all__ = ["DraftModelDrafter", "Eagle3Drafter", "EagleDrafter", "LookaheadDrafter", "MedusaDrafter", "MtpDrafter",
           "NgramDrafter", "RetrievalDrafter", "SelfDrafter", "SuffixDrafter", "specdec_register_drafters"]


@hookimpl
def specdec_register_drafters() -> list[type[Drafter]]:
    return [NgramDrafter, DraftModelDrafter, MedusaDrafter, EagleDrafter, Eagle3Drafter, MtpDrafter, SuffixDrafter,
            RetrievalDrafter, LookaheadDrafter, SelfDrafter]
