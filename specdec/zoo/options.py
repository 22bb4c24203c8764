"""The `make_drafter` options of a zoo family's drafters: where each finds its files in the
family's directory, and the value temperature the build fitted for its dynamic trees."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from specdec.zoo.store import CALIBRATION, MANIFEST

__all__ = ["UNAVAILABLE", "drafter_options", "unavailable"]

UNAVAILABLE = "unavailable.json"  # drafters a family directory cannot serve on this machine, and why


def unavailable(directory: Path) -> dict[str, str]:
    """Drafters the family at `directory` cannot serve here, each with the reason (a shipped
    family's retrieval datastore, say, where this Python's standard library differs)."""
    file = directory / UNAVAILABLE
    return json.loads(file.read_text()) if file.is_file() else {}


def drafter_options(directory: Path, drafters: tuple[str, ...] | None = None) -> dict[str, dict[str, Any]]:
    """`make_drafter` options of every drafter that serves a family's target (`drafters`, else
    those its manifest names, else every drafter) and can serve it here (see `unavailable`), with
    the value temperature the build fitted for each learned drafter's dynamic trees."""
    options: dict[str, dict[str, Any]] = {
        "ngram": {}, "lookahead": {}, "suffix": {},
        "retrieval": {"datastore": str(directory / "datastore"), "tree": False},  # chains; its tree row adds tree
        "draft-model": {"model": str(directory / "draft-model")},
        "medusa": {"path": str(directory / "medusa")}, "eagle": {"path": str(directory / "eagle")},
        "eagle3": {"path": str(directory / "eagle3")},
        "mtp": {"path": str(directory / "target")}}
    if drafters is None and (directory / MANIFEST).is_file():
        named = json.loads((directory / MANIFEST).read_text())["settings"].get("drafters")  # None: built before
        drafters = tuple(named) if named is not None else None
    if drafters is not None:
        options = {name: value for name, value in options.items() if name in drafters}
    for name in unavailable(directory):
        options.pop(name, None)
    calibration = directory / CALIBRATION
    if calibration.is_file():
        for name, tau in json.loads(calibration.read_text()).items():
            if name in options:
                options[name]["value_temperature"] = float(tau)
    return options
