"""Self-contained HTML pages (inline CSS, no scripts, no external references) for the trace and
the verify probe: they work opened from disk, offline."""

from __future__ import annotations

import html

__all__ = ["STYLE", "chip", "escape", "page"]

STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 72em; color: #1d232b; }
h1 { font-size: 1.4em; } h2 { font-size: 1.1em; margin-top: 1.6em; }
table { border-collapse: collapse; } td, th { padding: 0.2em 0.6em; border-bottom: 1px solid #e3e6ea; text-align: left; }
.tok { display: inline-block; font-family: ui-monospace, monospace; white-space: pre; padding: 0 0.25em;
       margin: 1px; border-radius: 3px; border: 1px solid transparent; }
.prompt { background: #eef1f4; color: #555; }
.accepted { background: #d5f0d8; border-color: #7fc38a; }
.rejected { background: #f7d4d4; border-color: #d77; text-decoration: line-through; }
.correction { background: #fde9c4; border-color: #e0a848; }
.bonus { background: #d6e6fb; border-color: #6c9ad6; }
.plain { background: #f1f1f1; }
.notreached { color: #aaa; }
.step { margin: 0.3em 0; display: flex; align-items: center; gap: 0.6em; }
.step .n { width: 3em; color: #888; text-align: right; }
.step .note { margin-left: 1em; color: #666; font-size: smaller; }
.bar { height: 0.8em; display: inline-block; }
.draft { background: #c9a0dc; } .verify { background: #7aa6d6; } .plainbar { background: #b8b8b8; }
.legend span { margin-right: 1em; }
.figures td:first-child { color: #555; }
"""


def escape(text: str) -> str:
    """HTML-escaped text (quotes included)."""
    return html.escape(text, quote=True)


def chip(text: str, kind: str, title: str = "") -> str:
    """One token as a coloured chip; `title` shows on hover."""
    shown = text.replace("\n", "\u21b5\n") if text else "\u2205"
    hover = f' title="{escape(title)}"' if title else ""
    return f'<span class="tok {kind}"{hover}>{escape(shown)}</span>'


def page(title: str, body: str) -> str:
    """A complete HTML document with the inline stylesheet."""
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n<title>{escape(title)}</title>\n'
            f"<style>{STYLE}</style>\n</head>\n<body>\n<h1>{escape(title)}</h1>\n{body}\n</body>\n</html>\n")
