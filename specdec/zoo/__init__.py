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
    zoo.zoo_drafters(directory)               # each row's label -> (registered drafter, make_drafter options)
    zoo.extend(directory, settings)           # a built family with the drafters new settings add (`specdec.zoo.extend`)
"""

from __future__ import annotations

from specdec.zoo.build import build
from specdec.zoo.extend import extend, extend_shipped
from specdec.zoo.measure import measure, read_figures
from specdec.zoo.options import draft_length, drafter_options, registry_name, unavailable, zoo_drafters
from specdec.zoo.settings import FULL, HYBRID, HYBRID_QUICK, QUICK, XTOK, ZooSettings, family, settings_from_record
from specdec.zoo.shipped import ZooIntegrityError, open_shipped, piece_dir, ready, shipped_names
from specdec.zoo.store import PIECES, cache_root, family_dir, finished, manifest, ships

__all__ = ["FULL", "HYBRID", "HYBRID_QUICK", "PIECES", "QUICK", "XTOK", "ZooIntegrityError", "ZooSettings", "build",
           "cache_root", "draft_length", "drafter_options", "extend", "extend_shipped", "family", "family_dir",
           "finished", "manifest", "measure", "open_shipped", "piece_dir", "read_figures", "ready", "registry_name", "settings_from_record",
           "shipped_names", "ships", "unavailable", "zoo_drafters"]
