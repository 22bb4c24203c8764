"""`specdec play`: a local page on which to step through lossless speculative decoding with a
real target and every registered drafter. `playground` answers the page's requests from the
model, `requests` parses them, `app` serves them over HTTP (Starlette), and `static/` holds the
page itself (one HTML file, one script and one style sheet, no network needed). It may import
`specdec.types`, `specdec.protocols`, `specdec.plugins`, `specdec.errors`, `specdec.decoding`,
`specdec.runtime`, `specdec.teaching` and `specdec.verifier`."""

from specdec.play.playground import PLAIN, DrafterChoice, Playground, drafter_choices
from specdec.play.requests import BadRequest, CompareRequest, Limits, ProbeRequest, RunRequest

__all__ = ["PLAIN", "BadRequest", "CompareRequest", "DrafterChoice", "Limits", "Playground", "ProbeRequest",
           "RunRequest", "drafter_choices"]
