"""A zoo family's rows and the drafters they make: each label (a row of the figures, the demo,
the bench, the play page) resolves here, and only here, to a registered drafter and the
`make_drafter` options that point it at the family's files, with the value temperature the
build fitted for its dynamic trees.

Most labels are their drafter's registered name. A label that is not names another piece the
same drafter can serve: `draft-model-xtok` is the `draft-model` drafter on the family's draft
model of another tokenizer (`{"model": <family>/draft-model-xtok}`, translating with its default
`translate="auto"`), so a family can hold two rows of one drafter.

A row may draft another k than the family's (`draft_length`): DFlash drafts its block, k = 15
(`specdec.zoo.settings.DFLASH_BLOCK` - 1), and `eagle3-k15` is the EAGLE-3 head at that same k, so
the figures compare DFlash with every drafter at the family's k and with EAGLE-3 at its own."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specdec.zoo.settings import DFLASH_BLOCK, XTOK
from specdec.zoo.store import CALIBRATION, MANIFEST

__all__ = ["ROWS", "UNAVAILABLE", "Row", "draft_length", "drafter_options", "registry_name", "unavailable",
           "zoo_drafters"]

UNAVAILABLE = "unavailable.json"  # drafters a family directory cannot serve on this machine, and why


@dataclass(frozen=True)
class Row:
    """What a zoo label makes: the registered `drafter`, the option naming its piece's directory
    in the family (`piece`: (option, directory); None: it needs no file) and fixed options."""

    drafter: str
    piece: tuple[str, str] | None = None
    fixed: tuple[tuple[str, Any], ...] = ()
    k: int | None = None  # the draft length it is measured at; None: the family's

    def options(self, directory: Path) -> dict[str, Any]:
        named = {self.piece[0]: str(directory / self.piece[1])} if self.piece is not None else {}
        return {**named, **dict(self.fixed)}


ROWS: dict[str, Row] = {  # label -> what it makes, in the order the options list them
    "ngram": Row("ngram"), "lookahead": Row("lookahead"), "suffix": Row("suffix"),
    "retrieval": Row("retrieval", ("datastore", "datastore"), (("tree", False),)),  # chains; its tree row adds tree
    "self": Row("self"),  # searches the layers it keeps itself (`docs/drafters.md`)
    "draft-model": Row("draft-model", ("model", "draft-model")),
    XTOK: Row("draft-model", ("model", XTOK)),  # its tokenizer lies beside it; the target's comes from generate
    "medusa": Row("medusa", ("path", "medusa")), "eagle": Row("eagle", ("path", "eagle")),
    "eagle3": Row("eagle3", ("path", "eagle3")),
    "mtp": Row("mtp", ("path", "target")),
    "dflash": Row("dflash", ("path", "dflash"), k=DFLASH_BLOCK - 1),  # its whole block, one forward
    "eagle3-k15": Row("eagle3", ("path", "eagle3"), k=DFLASH_BLOCK - 1),  # EAGLE-3 at DFlash's k
    "pard": Row("pard", ("model", "pard"))}


def draft_length(label: str, k: int) -> int:
    """The k a zoo label drafts when its family's is `k` (a label the zoo does not know: `k`)."""
    row = ROWS.get(label)
    return k if row is None or row.k is None else row.k


def registry_name(label: str) -> str:
    """The registered drafter a zoo label makes (a label the zoo does not know is taken as one:
    a plugin's drafter, say)."""
    row = ROWS.get(label)
    return row.drafter if row is not None else label


def unavailable(directory: Path) -> dict[str, str]:
    """Drafters the family at `directory` cannot serve here, each with the reason (a shipped
    family's retrieval datastore, say, where this Python's standard library differs)."""
    file = directory / UNAVAILABLE
    return json.loads(file.read_text()) if file.is_file() else {}


def drafter_options(directory: Path, drafters: tuple[str, ...] | None = None) -> dict[str, dict[str, Any]]:
    """The `make_drafter` options of each zoo label that serves a family's target (`drafters`, else
    those its manifest names, else every label) and can serve it here (see `unavailable`), with the
    value temperature the build fitted for each learned drafter's dynamic trees. The keys are
    labels: make each with `registry_name(label)`, or take both from `zoo_drafters`."""
    options = {label: row.options(directory) for label, row in ROWS.items()}
    if drafters is None and (directory / MANIFEST).is_file():
        named = json.loads((directory / MANIFEST).read_text())["settings"].get("drafters")  # None: built before
        drafters = tuple(named) if named is not None else None
    if drafters is not None:
        options = {label: value for label, value in options.items() if label in drafters}
    for label in unavailable(directory):
        options.pop(label, None)
    calibration = directory / CALIBRATION
    if calibration.is_file():
        for label, tau in json.loads(calibration.read_text()).items():
            if label in options:
                options[label]["value_temperature"] = float(tau)
    return options


def zoo_drafters(directory: Path, drafters: tuple[str, ...] | None = None) -> dict[str, tuple[str, dict[str, Any]]]:
    """label -> (registered drafter, `make_drafter` options) for each label `drafter_options` gives."""
    return {label: (registry_name(label), options) for label, options in drafter_options(directory, drafters).items()}
