"""Showing a `specdec.teaching.trace.Trace`: a self-contained HTML page and a coloured terminal view.

The page has summary figures, the prompt, then one row per step: the step's token chips
(accepted, rejected, correction, bonus; hover shows p, q, min(1, p/q) and the uniform draw)
and a timeline strip (drafting, verifying) beside the time plain decoding takes for the same
tokens, so the draft tax and the saved forwards are visible.
"""

from __future__ import annotations

from collections.abc import Callable

from specdec.teaching.html_page import chip, escape, page
from specdec.teaching.trace import Trace, TraceToken

__all__ = ["trace_html", "trace_lines"]

_ANSI = {"accepted": "\033[32m", "rejected": "\033[31;9m", "correction": "\033[33m", "bonus": "\033[34m"}


# what a drafted token's `accept` is under each rule: its own ratio, its prefix's test, its node's weight
_TESTS = {"token": "min(1, p/q)", "block": "h (the test of the prefix ending here)",
          "traversal": "w (this node's test: the path's weight)"}


def _hover(token: TraceToken, rule: str = "token", tree: bool = False) -> str:
    if token.kind == "correction":
        return (f"correction: drawn after the rejection from a residual of p (norm(max(0, p - q)) token-wise); "
                f"the target gave it p = {token.p:.4f}")
    if token.kind == "bonus":
        return f"bonus: every draft accepted, drawn from the next position's p (p = {token.p:.4f})"
    parts = [f"p = {token.p:.4f}", f"q = {token.q:.4f}"]
    if token.accept is not None:
        test = _TESTS["token"] if rule == "token" or (rule == "block" and tree) else \
            _TESTS["traversal"] if tree else _TESTS["block"]
        parts.append(f"{test} = {token.accept:.4f}")
    parts.append(f"u = {token.uniform:.4f}" if token.uniform is not None else "greedy: compared with the argmax")
    return ", ".join(parts) + f" -> {token.kind}"


def _figures(trace: Trace, plain_seconds_per_token: float | None) -> list[tuple[str, str]]:
    steps = len(trace.steps)
    emitted = sum(len(s.emitted) for s in trace.steps)
    drafted = sum(1 for s in trace.steps for t in s.tokens if t.kind in ("accepted", "rejected"))
    accepted = sum(1 for s in trace.steps for t in s.tokens if t.kind == "accepted")
    draft = sum(s.draft_seconds for s in trace.steps)
    verify = sum(s.verify_seconds for s in trace.steps)
    figures = [("target forwards (steps)", str(steps)), ("new tokens", str(emitted)),
               ("mean accepted length", f"{emitted / steps:.2f}" if steps else "-"),
               ("acceptance rate", f"{accepted / drafted:.0%} ({accepted} of {drafted} drafted)" if drafted else "-"),
               ("drafting", f"{draft * 1e3:.1f} ms"), ("verifying", f"{verify * 1e3:.1f} ms")]
    if plain_seconds_per_token:
        plain = plain_seconds_per_token * emitted
        figures += [("plain decoding, same tokens", f"{plain * 1e3:.1f} ms ({emitted} forwards)"),
                    ("speedup", f"{plain / (draft + verify):.2f}x" if draft + verify else "-")]
    return figures


def trace_html(trace: Trace, decode: Callable[[list[int]], str], plain_seconds_per_token: float | None = None,
               title: str = "specdec trace") -> str:
    """The trace as one self-contained page (inline CSS, no scripts, no external references)."""
    figures = "".join(f"<tr><td>{escape(k)}</td><td>{escape(v)}</td></tr>"
                      for k, v in _figures(trace, plain_seconds_per_token))
    longest = max([s.draft_seconds + s.verify_seconds for s in trace.steps]
                  + [(plain_seconds_per_token or 0) * len(s.emitted) for s in trace.steps] + [1e-9])
    scale = 360 / longest  # pixels per second
    rows = []
    for i, step in enumerate(trace.steps, start=1):
        chips = "".join(chip(decode([t.token]), t.kind, _hover(t, trace.verify_rule, step.parents is not None))
                        for t in step.tokens)
        how = " in one forward (a block)" if step.draft_forwards == 1 and len(step.drafted) > 1 else ""
        bars = (f'<span class="bar draft" style="width:{step.draft_seconds * scale:.1f}px" '
                f'title="drafting {len(step.drafted)} tokens{how}: {step.draft_seconds * 1e3:.2f} ms"></span>'
                f'<span class="bar verify" style="width:{step.verify_seconds * scale:.1f}px" '
                f'title="verifying {step.verify_seconds * 1e3:.2f} ms"></span>')
        if plain_seconds_per_token:
            plain = plain_seconds_per_token * len(step.emitted)
            bars += (f'<br><span class="bar plainbar" style="width:{plain * scale:.1f}px" '
                     f'title="plain decoding of the same {len(step.emitted)} token(s): {plain * 1e3:.2f} ms"></span>')
        note = f'<span class="note">{escape(step.note)}</span>' if step.note else ""
        rows.append(f'<div class="step"><span class="n">{i}</span><span>{chips}{note}</span>'
                    f'<span style="margin-left:auto">{bars}</span></div>')
    legend = ('<p class="legend">' + chip("accepted", "accepted") + chip("rejected", "rejected")
              + chip("correction", "correction") + chip("bonus", "bonus") + " timeline: "
              '<span class="bar draft" style="width:1.5em"></span> drafting '
              '<span class="bar verify" style="width:1.5em"></span> verifying '
              '<span class="bar plainbar" style="width:1.5em"></span> plain decoding, same tokens</p>')
    body = (f'<table class="figures">{figures}</table>{legend}<h2>Prompt</h2><p>'
            f'{chip(decode(trace.prompt), "prompt", f"{len(trace.prompt)} tokens")}</p>'
            f"<h2>Steps (one target forward each; hover a token for p, q, min(1, p/q) and the draw)</h2>"
            + "".join(rows))
    return page(title, body)


def trace_lines(trace: Trace, decode: Callable[[list[int]], str], colour: bool = True) -> list[str]:
    """One terminal line per step: its tokens coloured by kind, then the step's timings."""
    reset = "\033[0m" if colour else ""
    lines = []
    for i, step in enumerate(trace.steps, start=1):
        shown = []
        for token in step.tokens:
            text = repr(decode([token.token]))[1:-1]
            shown.append(f"{_ANSI[token.kind]}{text}{reset}" if colour else f"[{token.kind[0]}]{text}")
        block = f" {len(step.drafted)} at once," if step.draft_forwards == 1 and len(step.drafted) > 1 else ""
        note = f"; {step.note}" if step.note else ""
        lines.append(f"{i:>4}  {' '.join(shown)}   (draft{block} {step.draft_seconds * 1e3:.1f} ms, verify "
                     f"{step.verify_seconds * 1e3:.1f} ms{note})")
    return lines
