"""The zoo: a small model family specdec trains itself, offline, on the standard library's
source, so every drafter can be compared on models that have learned something; it may import
`specdec.protocols`, `specdec.plugins`, `specdec.checkpoints`, `specdec.versions`, `specdec.data`,
`specdec.decoding`, `specdec.drafters`, `specdec.runtime` and `specdec.training`.

    from specdec import zoo
    directory = zoo.build(zoo.QUICK)          # or zoo.FULL, zoo.HYBRID (Qwen3.5 layout); reused once built
    zoo.piece_dir(zoo.FULL, "target")         # a piece's checkpoint directory
"""

from __future__ import annotations

from specdec.zoo.build import build, drafter_options
from specdec.zoo.settings import FULL, HYBRID, HYBRID_QUICK, QUICK, ZooSettings, family
from specdec.zoo.store import PIECES, cache_root, family_dir, finished, manifest, piece_dir

__all__ = ["FULL", "HYBRID", "HYBRID_QUICK", "PIECES", "QUICK", "ZooSettings", "build", "cache_root", "drafter_options", "family",
           "family_dir", "finished", "manifest", "piece_dir"]
