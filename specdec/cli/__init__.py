"""The command line, one module per `specdec` command and `parser` that gathers them into `main`;
it may import any part of specdec, and only `specdec.__main__` imports it."""

from __future__ import annotations

from specdec.cli.parser import main

__all__ = ["main"]
