"""What every `specdec` subcommand shares: the user-error type and its one-line message."""

from __future__ import annotations

__all__ = ["CLIError", "one_line"]


class CLIError(Exception):
    """A user error: printed as one line, exit status 2."""


def one_line(error: BaseException) -> str:
    """The error's message on one line (its type name when it has none)."""
    return " ".join(str(error).split()) or type(error).__name__
