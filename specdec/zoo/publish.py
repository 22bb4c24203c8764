"""The docs' figures of the shipped zoo, regenerated from it: `make docs-figures`.

Every figure in the README and `docs/` that the shipped zoo determines (held-out losses,
agreements, mean accepted lengths with their intervals and ranks, acceptance, loop shares) lies
in a generated block,

    <!-- figures:NAME -->
    ...
    <!-- /figures -->

`publish` measures each shipped family from its unpacked, verified files (`specdec.zoo.measure`),
keeps the result as the family's shipped `figures.json`, and rewrites every block from it;
`stale_blocks` says which blocks differ from what the committed figures render (the test runs
it). Timings are not here: they depend on the machine, and the docs give each with the command
that measured it.
"""

from __future__ import annotations

import re
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from specdec.intervals import Interval
from specdec.zoo.measure import FIGURES, measure, read_figures
from specdec.zoo.options import unavailable
from specdec.zoo.settings import family
from specdec.zoo.shipped import SHIPPED, open_shipped, shipped_names
from specdec.zoo.store import manifest

__all__ = ["DOCUMENTS", "blocks", "publish", "render", "rewrite_documents", "stale_blocks"]

ROOT = Path(__file__).resolve().parents[2]  # the source tree: README.md and docs/ beside specdec/
DOCUMENTS = ("README.md", "docs/zoo.md")
BLOCK = re.compile(r"(<!-- figures:(?P<name>[a-z0-9-]+) -->\n)(?P<body>.*?)(<!-- /figures -->)", re.S)
LEARNED_ORDER = ("target", "draft-model", "draft-model-xtok", "medusa", "eagle", "eagle3", "mtp", "dflash", "pard")
DRAFTER_ORDER = ("ngram", "lookahead", "suffix", "retrieval", "self", "draft-model", "draft-model-xtok", "medusa",
                 "eagle", "eagle3", "mtp", "dflash", "pard", "eagle3-k15")


def _interval(value: dict[str, float]) -> str:
    return Interval.from_dict(value).format()


def setting_line(figures: dict[str, Any]) -> str:
    """How the family's accepted lengths were measured, one sentence."""
    setting, text = figures["evaluation"], figures["text"]
    decoding = "greedily" if not setting["temperature"] else \
        f"at temperature {setting['temperature']:g} (prompt i with seed {setting['seed']} + i)"
    return (f"{setting['prompts']} held-out prompts decoded {decoding}, k = {setting['k']}, {setting['new_tokens']} "
            f"new tokens each; 95% bootstrap intervals over prompts; rank: by mean accepted length, `=` where the "
            f"paired intervals cannot order two drafters. Plain decoding's text: {text['loop_share']:.1%} of its "
            f"tokens in loops, {text['degenerate']} of {text['prompts']} outputs degenerate.")


def pieces_table(figures: dict[str, Any], record: dict[str, Any]) -> str:
    """Markdown: every piece's size, held-out loss and agreement, and each drafter's accepted length."""
    lines = ["| piece | parameters | held-out loss | agreement | mean accepted length [95%] | rank | acceptance | "
             "from loops |", "|---|---|---|---|---|---|---|---|"]
    losses, drafters = figures["losses"], figures["drafters"]
    names = [n for n in LEARNED_ORDER if n in record["pieces"]] + [n for n in DRAFTER_ORDER
                                                                  if n in drafters and n not in LEARNED_ORDER]
    for name in names:
        piece, loss, accepted = record["pieces"].get(name, {}), losses.get(name, {}), drafters.get(name)
        parameters = f"{piece['parameters']:,}" if "parameters" in piece else "-"
        cells = [name, parameters, f"{loss['loss']:.3f}" if "loss" in loss else "-",
                 f"{loss['agreement']:.3f}" if "agreement" in loss else "-"]
        if accepted is None:
            cells += ["-"] * 4
        else:
            cells += [_interval(accepted["mean_accepted_length"]), accepted["rank"],
                      f"{accepted['acceptance_rate']:.3f}", f"{accepted['from_loops']:.3f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def drafters_table(figures: dict[str, Any]) -> str:
    """Markdown: the drafters by mean accepted length, with interval and rank."""
    drafters = figures["drafters"]
    order = sorted(drafters, key=lambda n: -drafters[n]["mean_accepted_length"]["estimate"])
    lines = ["| drafter | mean accepted length [95%] | rank |", "|---|---|---|"]
    lines += [f"| {n} | {_interval(drafters[n]['mean_accepted_length'])} | {drafters[n]['rank']} |" for n in order]
    return "\n".join(lines)


def blocks(figures: dict[str, dict[str, Any]], records: dict[str, dict[str, Any]]) -> dict[str, str]:
    """Every generated block's text, by name, from each shipped family's figures and manifest."""
    out: dict[str, str] = {}
    for name in figures:
        out[f"{name}-setting"] = setting_line(figures[name])
        out[f"{name}-pieces"] = pieces_table(figures[name], records[name])
        out[f"{name}-drafters"] = drafters_table(figures[name])
    return out


def _committed(source: Path = SHIPPED) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    figures, records = {}, {}
    for name in shipped_names(source):
        found = read_figures(source / name)
        if found is None:
            raise FileNotFoundError(f"the shipped {name} zoo has no {FIGURES}; run `make docs-figures`")
        figures[name], records[name] = found, manifest(source / name)
    return figures, records


def render(text: str, rendered: dict[str, str]) -> str:
    """`text` with every generated block's body replaced by its rendering (unknown names: an error)."""
    def replace(match: re.Match[str]) -> str:
        name = match.group("name")
        if name not in rendered:
            raise KeyError(f"unknown generated block {name!r}; known: {', '.join(sorted(rendered))}")
        return match.group(1) + rendered[name] + "\n" + match.group(4)

    return BLOCK.sub(replace, text)


def stale_blocks(root: Path = ROOT, source: Path = SHIPPED) -> list[str]:
    """`document:block` for each generated block whose text is not what the shipped figures render."""
    rendered = blocks(*_committed(source))
    stale = []
    for document in DOCUMENTS:
        text = (root / document).read_text()
        for match in BLOCK.finditer(text):
            if match.group("body") != rendered.get(match.group("name"), "") + "\n":
                stale.append(f"{document}:{match.group('name')}")
    return stale


def publish(root: Path = ROOT, source: Path = SHIPPED, say: Callable[[str], None] | None = None,
            families: tuple[str, ...] | None = None) -> list[str]:
    """Measure every shipped family (or those of `families`), keep its figures.json in `source`,
    rewrite the documents' blocks from every family's figures; the documents changed."""
    say = say or (lambda line: print(line, file=sys.stderr, flush=True))
    unknown = sorted(set(families or ()) - set(shipped_names(source)))
    if unknown:
        raise ValueError(f"no shipped family {unknown[0]!r}; the shipped ones: {', '.join(shipped_names(source))}")
    for name in families or shipped_names(source):
        settings = family(name)
        directory = open_shipped(settings, source=source, say=say)
        missing = unavailable(directory)
        if missing:
            raise ValueError(f"cannot publish the {name} zoo's figures from here: "
                             + "; ".join(f"{d}: {why}" for d, why in missing.items()))
        say(f"measuring the shipped {name} zoo")
        measure(directory, settings.drafters, say)
        shutil.copyfile(directory / FIGURES, source / name / FIGURES)
    return rewrite_documents(root, source)


def rewrite_documents(root: Path = ROOT, source: Path = SHIPPED) -> list[str]:
    """Rewrite the documents' generated blocks from every shipped family's committed figures; the
    documents changed."""
    rendered = blocks(*_committed(source))
    changed = []
    for document in DOCUMENTS:
        path = root / document
        text = path.read_text()
        updated = render(text, rendered)
        if updated != text:
            path.write_text(updated)
            changed.append(document)
    return changed
