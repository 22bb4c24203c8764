"""`python -m specdec`: the same command line as the `specdec` script."""

from __future__ import annotations

from specdec.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
