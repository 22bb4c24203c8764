"""How every layer reports an error it caught to a person: on one line, with its message."""

from __future__ import annotations

__all__ = ["one_line"]


def one_line(error: BaseException) -> str:
    """The error's message on one line (its type name when it has none)."""
    return " ".join(str(error).split()) or type(error).__name__
