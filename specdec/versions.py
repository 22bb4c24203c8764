"""The software a result was produced with, recorded in zoo manifests and bench results."""

from __future__ import annotations

import platform

__all__ = ["software_versions"]


def software_versions() -> dict[str, str]:
    """specdec, Python, torch, transformers and tokenizers versions, and the machine architecture."""
    import tokenizers
    import torch
    import transformers

    from specdec import __version__

    return {"specdec": __version__, "python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
            "machine": platform.machine()}
