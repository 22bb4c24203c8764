"""The page's requests: JSON bodies parsed into frozen dataclasses, every bad value refused with
a `BadRequest` that names the field, the value and what to send instead.

Pure parsing: nothing here touches a model. The model-dependent checks (how many tokens a
prompt makes, which drafters exist) are in `specdec.play.playground`.
"""

from __future__ import annotations

import json
from dataclasses import MISSING, dataclass, fields
from typing import Any, TypeVar

__all__ = ["BadRequest", "CompareRequest", "Limits", "ProbeRequest", "RunRequest", "check_request",
           "parse_request"]

SHAPES = ("chain", "tree")
DRAFT_LENGTHS = ("fixed", "auto")  # a run's k, or `num_draft_tokens="auto"`


class BadRequest(Exception):
    """A request the page must fix: `status` is the HTTP status (4xx), the message says why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Limits:
    """What one request may ask of the server (a teaching page on a small model, served to one
    user at a time): the body, the prompt, the budget, k, the probe's top-k and the queue."""

    max_body_bytes: int = 64 * 1024
    max_prompt_chars: int = 4000
    max_prompt_tokens: int = 512
    max_new_tokens: int = 256  # the most a run, or a compare, may ask for
    max_compare_tokens: int = 128  # the most compare decodes per drafter (its answer says when it cut)
    max_k: int = 16
    max_top: int = 20
    max_temperature: float = 10.0
    queue: int = 4  # requests waiting for the model beyond the one it is serving


@dataclass(frozen=True)
class RunRequest:
    """One generation, traced step by step (the step view and the timeline)."""

    prompt: str
    drafter: str = "ngram"  # a registered drafter, or "plain" for plain decoding
    k: int = 4
    draft_length: str = "fixed"  # "fixed": k every step; "auto": up to k, only when drafting pays (auto_draft)
    shape: str = "chain"  # "chain" or "tree" (the drafter's tree mode)
    temperature: float = 0.0
    top_p: float = 1.0
    max_new_tokens: int = 48
    seed: int = 0


@dataclass(frozen=True)
class CompareRequest:
    """The same prompt and settings under every drafter the page offers (each decodes at most
    `Limits.max_compare_tokens` of `max_new_tokens`)."""

    prompt: str
    k: int = 4
    draft_length: str = "fixed"
    shape: str = "chain"
    temperature: float = 0.0
    top_p: float = 1.0
    max_new_tokens: int = 32
    seed: int = 0


@dataclass(frozen=True)
class ProbeRequest:
    """One forward over a prefix and a continuation (`specdec.teaching.probe`)."""

    prefix: str
    continuation: str
    top: int = 5


Request = TypeVar("Request", RunRequest, CompareRequest, ProbeRequest)


def parse_request(body: bytes, kind: type[Request], limits: Limits) -> Request:
    """The request of type `kind` in the JSON `body`; a BadRequest naming the first bad part."""
    if len(body) > limits.max_body_bytes:
        raise BadRequest(413, f"the request body has {len(body)} bytes; the most it may have is "
                              f"{limits.max_body_bytes}")
    try:
        data = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
        raise BadRequest(400, f"the request body is not JSON ({error}); send a JSON object such as "
                              '{"prompt": "def add(a, b):"}') from None
    if not isinstance(data, dict):
        raise BadRequest(400, f"the request body must be a JSON object, got {type(data).__name__}")
    known = {f.name: f for f in fields(kind)}
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise BadRequest(400, f"unknown field {unknown[0]!r}; this request takes {', '.join(known)}")
    values: dict[str, Any] = {}
    for name, field in known.items():
        if name in data:
            values[name] = _typed(name, data[name], field.type)
        elif field.default is MISSING:
            raise BadRequest(400, f"the field {name!r} is missing")
    request = kind(**values)
    check_request(request, limits)
    return request


def _typed(name: str, value: Any, annotation: Any) -> Any:
    """`value` as the field's type (an int is a float too; a bool is neither)."""
    if annotation in ("str", str):
        if not isinstance(value, str):
            raise BadRequest(400, f"{name} must be a string, got {json.dumps(value)}")
        return value
    if annotation in ("int", int):
        if isinstance(value, bool) or not isinstance(value, int):
            raise BadRequest(400, f"{name} must be an integer, got {json.dumps(value)}")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadRequest(400, f"{name} must be a number, got {json.dumps(value)}")
    return float(value)


def check_request(request: RunRequest | CompareRequest | ProbeRequest, limits: Limits) -> None:
    """A BadRequest unless `request` respects the ranges of its kind (the playground checks again
    what a caller built without `parse_request`; the model's own checks come later)."""
    texts = ("prefix", "continuation") if isinstance(request, ProbeRequest) else ("prompt",)
    for name in texts:
        text = getattr(request, name)
        if not text:
            raise BadRequest(400, f"{name} is empty; type some text")
        if len(text) > limits.max_prompt_chars:
            raise BadRequest(413, f"{name} has {len(text)} characters; the most this page takes is "
                                  f"{limits.max_prompt_chars}")
    if isinstance(request, ProbeRequest):
        _within("top", request.top, 1, limits.max_top)
        return
    budget = limits.max_new_tokens  # compare takes as much, and decodes at most max_compare_tokens of it
    if request.max_new_tokens > budget:
        raise BadRequest(413, f"max_new_tokens {request.max_new_tokens} is over this page's budget of {budget}")
    _within("max_new_tokens", request.max_new_tokens, 1, budget)
    _within("k", request.k, 1, limits.max_k)
    if request.draft_length not in DRAFT_LENGTHS:
        raise BadRequest(400, f"draft_length must be one of {', '.join(DRAFT_LENGTHS)}, got {request.draft_length!r}")
    if request.shape not in SHAPES:
        raise BadRequest(400, f"shape must be one of {', '.join(SHAPES)}, got {request.shape!r}")
    if not 0.0 <= request.temperature <= limits.max_temperature:
        raise BadRequest(400, f"temperature must be in [0, {limits.max_temperature:g}] (0 = greedy), "
                              f"got {request.temperature:g}")
    if not 0.0 < request.top_p <= 1.0:
        raise BadRequest(400, f"top_p must be in (0, 1] (1 disables it), got {request.top_p:g}")
    _within("seed", request.seed, 0, 2**62)


def _within(name: str, value: int, low: int, high: int) -> None:
    if not low <= value <= high:
        raise BadRequest(400, f"{name} must be in [{low}, {high}], got {value}")
