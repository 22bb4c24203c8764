"""`specdec drafters`: every registered drafter, the plugin it came from, its summary, and the
plugins that were skipped and why."""

from __future__ import annotations

import argparse
from typing import Any

from specdec import plugins
from specdec.cli.common import quiet_registry

__all__ = ["add_drafters_command"]


def _summary(cls: type) -> str:
    doc = (cls.__doc__ or "").strip()
    return doc.splitlines()[0] if doc else "(no docstring)"


def _drafters_command(args: argparse.Namespace) -> int:
    registry = quiet_registry()
    rows = [(name, registry.origins[name], _summary(cls)) for name, cls in sorted(registry.drafters.items())]
    if not rows:
        print(f"no drafters registered (is {plugins.DISABLE_ENV} blocking them?)")
    name_width = max((len(row[0]) for row in rows), default=0)
    origin_width = max((len(row[1]) for row in rows), default=0)
    for name, origin, summary in rows:
        print(f"{name:<{name_width}}  {origin:<{origin_width}}  {summary}")
    for failure in registry.failures:
        print(f"plugin {failure.plugin!r} skipped: {failure.error}")
    return 0



def add_drafters_command(commands: Any) -> None:
    drafters = commands.add_parser("drafters", help="list the registered drafters and their plugins")
    drafters.set_defaults(run=_drafters_command)
