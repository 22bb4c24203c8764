"""specdec's version, and the software a result was produced with (recorded in zoo manifests and
bench results)."""

from __future__ import annotations

import platform

__all__ = ["__version__", "software_versions"]

__version__ = "0.1.0"  # specdec's own (pyproject.toml says the same)


def software_versions() -> dict[str, str]:
    """specdec, Python, torch, transformers and tokenizers versions, and the machine architecture."""
    import tokenizers
    import torch
    import transformers

    return {"specdec": __version__, "python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
            "machine": platform.machine()}
