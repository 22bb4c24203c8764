"""Showing a verify probe (`specdec.teaching.probe`): a text table, one line per continuation
token, and a self-contained page."""

from __future__ import annotations

from typing import Any

from specdec.teaching.html_page import chip, escape, page

__all__ = ["probe_html", "probe_text"]


def _show(tokenizer: Any, token: int) -> str:
    return repr(tokenizer.decode([token]))


def probe_text(result: Any, tokenizer: Any) -> str:
    """The probe as a text table, one line per continuation token."""
    lines = [f"{'pos':>3}  {'token':<16} {'p(token)':>8} {'rank':>5}  {'greedy verifier':<16} target top tokens"]
    for i, position in enumerate(result.positions):
        verdict = position.verdict
        if verdict == "rejected":
            verdict = f"REJECT -> {_show(tokenizer, result.correction)}"
        tops = "  ".join(f"{_show(tokenizer, t)} {p:.2f}" for t, p in position.top)
        lines.append(f"{i:>3}  {_show(tokenizer, position.token):<16} {position.probability:>8.3f} "
                     f"{position.rank:>5}  {verdict:<16} {tops}")
    tail = (f"all {len(result.positions)} accepted; the bonus token is {_show(tokenizer, result.correction)}"
            if result.bonus else f"{result.num_accepted} accepted, then the correction "
            f"{_show(tokenizer, result.correction)}")
    return "\n".join(lines + [tail])


def probe_html(result: Any, tokenizer: Any, prefix: str) -> str:
    """The probe as a self-contained page."""
    kinds = {"accepted": "accepted", "rejected": "rejected", "not reached": "notreached"}
    chips = [chip(prefix, "prompt", "prefix")]
    for position in result.positions:
        chips.append(chip(tokenizer.decode([position.token]), kinds[position.verdict],
                          f"p = {position.probability:.4f}, rank {position.rank}, {position.verdict}"))
        if position.verdict == "rejected":
            chips.append(chip(tokenizer.decode([result.correction]), "correction", "the verifier's correction"))
    if result.bonus:
        chips.append(chip(tokenizer.decode([result.correction]), "bonus", "bonus token: the target's next argmax"))
    rows = "".join(
        f"<tr><td>{i}</td><td>{chip(tokenizer.decode([p.token]), kinds[p.verdict])}</td><td>{p.probability:.3f}</td>"
        f"<td>{p.rank}</td><td>{escape(p.verdict)}</td><td>"
        + " ".join(f"{chip(tokenizer.decode([t]), 'plain')} {q:.2f}" for t, q in p.top) + "</td></tr>"
        for i, p in enumerate(result.positions))
    body = (f"<p>One target forward over the prefix and the continuation; each continuation token is checked "
            f"as the greedy verifier checks a draft token.</p><p>{''.join(chips)}</p>"
            f"<table><tr><th>pos</th><th>token</th><th>p(token)</th><th>rank</th><th>greedy verifier</th>"
            f"<th>target top tokens</th></tr>{rows}</table>")
    return page("specdec verify probe", body)
