"""The zoo: a small model family specdec trains itself, offline, on the standard library's
source, so every drafter can be compared on models that have learned something. The full and
hybrid families ship with the code (`specdec.zoo.shipped`), so every machine decodes with the
same bytes; `build` trains any family from scratch. It may import `specdec.protocols`,
`specdec.plugins`, `specdec.checkpoints`, `specdec.versions`, `specdec.intervals`, `specdec.types`,
`specdec.data`, `specdec.decoding`, `specdec.drafters`, `specdec.runtime` and `specdec.training`.

    from specdec import zoo
    directory = zoo.ready(zoo.FULL)           # the shipped full family (or zoo.HYBRID), unpacked and verified
    directory = zoo.ready(zoo.QUICK)          # a family that does not ship: built here on first use
    directory = zoo.build(zoo.FULL)           # the full family trained here, from scratch
    zoo.piece_dir(zoo.FULL, "target")         # a piece's checkpoint directory
"""

from __future__ import annotations

from specdec.zoo.build import build
from specdec.zoo.measure import measure, read_figures
from specdec.zoo.options import drafter_options, unavailable
from specdec.zoo.settings import FULL, HYBRID, HYBRID_QUICK, QUICK, ZooSettings, family
from specdec.zoo.shipped import ZooIntegrityError, open_shipped, piece_dir, ready, shipped_names
from specdec.zoo.store import PIECES, cache_root, family_dir, finished, manifest, ships

__all__ = ["FULL", "HYBRID", "HYBRID_QUICK", "PIECES", "QUICK", "ZooIntegrityError", "ZooSettings", "build",
           "cache_root", "drafter_options", "family", "family_dir", "finished", "manifest", "measure", "open_shipped",
           "piece_dir", "read_figures", "ready", "shipped_names", "ships", "unavailable"]
