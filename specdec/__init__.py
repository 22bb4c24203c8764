"""specdec: a drafter zoo for lossless speculative decoding, with one shared verifier.

Importing specdec loads no plugins, models or files; the registry loads on first use.
"""

from __future__ import annotations

from specdec.decoding.generate import generate, generate_batch
from specdec.hookspecs import hookimpl
from specdec.plugins import drafter_names, make_drafter
from specdec.protocols import Capability, DraftContext, Drafter
from specdec.runtime.quantize import quantize
from specdec.runtime.target import CausalLM
from specdec.sampling import probabilities
from specdec.types import BatchGenerations, Draft, ExtraRows, Generation, Sampling, Stats, Verdict
from specdec.versions import __version__


__all__ = [
    "BatchGenerations",
    "Capability",
    "CausalLM",
    "Draft",
    "DraftContext",
    "Drafter",
    "ExtraRows",
    "Generation",
    "Sampling",
    "Stats",
    "Verdict",
    "__version__",
    "drafter_names",
    "generate",
    "generate_batch",
    "hookimpl",
    "make_drafter",
    "probabilities",
    "quantize",
]
