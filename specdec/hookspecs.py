"""Hook specifications: what a specdec plugin may implement."""

from __future__ import annotations

import pluggy

from specdec.protocols import Drafter

NAME = "specdec"
hookspec = pluggy.HookspecMarker(NAME)
hookimpl = pluggy.HookimplMarker(NAME)

__all__ = ["NAME", "hookimpl", "hookspec", "specdec_register_drafters"]


@hookspec
def specdec_register_drafters() -> list[type[Drafter]]:  # type: ignore[empty-body]
    """Return the Drafter classes this plugin provides.

    Each class has a unique class attribute `name` (the name users pass to
    `specdec.make_drafter`) and a `propose(ctx, k)` method; options are constructor keywords.
    """
