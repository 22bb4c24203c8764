"""The package's shape: `import specdec` stays light, imports run one way (no circle between
modules or between the folders that group them), each folder says what it may import and keeps
to it, and every name the README, docs and examples mention imports."""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import specdec

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "specdec"
SOURCES = {"specdec": PACKAGE, "specdec.drafters": ROOT / "drafters", "specdec.verifier": ROOT / "verifier"}
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "examples").rglob("*.py"))]
PUBLIC = ("generate", "generate_batch", "make_drafter", "drafter_names", "Sampling", "hookimpl", "Draft", "DraftContext",
          "Drafter", "CausalLM", "Generation", "BatchGenerations", "Stats", "Verdict", "ExtraRows", "probabilities")


def _modules() -> dict[str, Path]:
    """Every module of the package, by dotted name (`drafters/` and `verifier/` under their installed names)."""
    found = {}
    for package, folder in SOURCES.items():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            found[".".join((package, *parts))] = path
    return found


MODULES = _modules()


def _imports(name: str, path: Path) -> Iterator[str]:
    """The package modules `name` imports: at the top, inside functions and under TYPE_CHECKING
    alike (a lazy import is still an arrow)."""
    package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = name.split(".") if package else name.split(".")[:-1]
            module = node.module or ""
            if node.level:
                module = ".".join(base[: len(base) - node.level + 1] + ([module] if module else []))
            targets = [f"{module}.{alias.name}" if f"{module}.{alias.name}" in MODULES else module for alias in node.names]
        else:
            continue
        yield from (target for target in targets if target in MODULES and target != name)


GRAPH = {name: set(_imports(name, path)) for name, path in MODULES.items()}


def _room(module: str) -> str:
    """The folder a module belongs to (`specdec.runtime`; a drafter family's own,
    `specdec.drafters.feature_heads`), or the module itself at the top."""
    parts = module.split(".")
    family = ".".join(parts[:3])
    if parts[:2] == ["specdec", "drafters"] and len(parts) > 2 and MODULES.get(family, Path()).name == "__init__.py":
        return family
    folder = ".".join(parts[:2])
    return folder if len(parts) > 1 and MODULES.get(folder, Path()).name == "__init__.py" else module


ROOMS = {room: {_room(t) for m in MODULES if _room(m) == room for t in GRAPH[m]} - {room}
         for room in {_room(m) for m in MODULES}}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph`, as the nodes along it (first = last), or None."""
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = 2
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_walk_sees_the_whole_package():
    assert {"specdec", "specdec.decoding.loop", "specdec.runtime.target", "specdec.verifier.chain",
            "specdec.drafters.feature_heads.eagle", "specdec.cli.parser"} <= set(MODULES)
    assert "specdec.runtime.rows" in GRAPH["specdec.decoding.loop"], "the walk misses a plain import"


def test_no_module_imports_itself_round_a_circle():
    assert _cycle(GRAPH) is None, f"import circle: {' -> '.join(_cycle(GRAPH) or [])}"


def test_no_folder_imports_itself_round_a_circle():
    assert _cycle(ROOMS) is None, f"folder circle: {' -> '.join(_cycle(ROOMS) or [])}"


def test_the_drafters_are_grouped_by_family_and_each_family_is_a_folder():
    families = {room.rsplit(".", 1)[1] for room in ROOMS if room.startswith("specdec.drafters.")}
    assert families == {"model_free", "draft_models", "feature_heads", "parallel", "tree_search", "shared"}, families
    loose = [name for name in MODULES if name.count(".") == 2 and name.startswith("specdec.drafters.")
             and MODULES[name].name != "__init__.py"]
    assert not loose, f"drafter modules outside a family folder: {loose}"


def test_the_cycle_finder_finds_a_planted_circle():
    planted = {name: set(arrows) for name, arrows in ROOMS.items()}
    planted["specdec.types"] = {"specdec.decoding"}  # decoding uses types: this closes a circle
    assert _cycle(planted) is not None


def _declared(folder: str) -> set[str]:
    """What a folder's docstring says it may import: the `specdec.*` names in its "may import" clause."""
    doc = ast.get_docstring(ast.parse(MODULES[folder].read_text())) or ""
    clause = doc.partition("may import")[2]
    assert clause, f"{folder}'s docstring does not say what it may import"
    if clause.lstrip().startswith("any part of specdec"):
        return set(ROOMS)
    return set(re.findall(r"`(specdec(?:\.\w+)*)`", clause))


@pytest.mark.parametrize("folder", sorted(room for room in ROOMS if MODULES[room].name == "__init__.py"
                                          and room != "specdec"))
def test_each_folder_says_what_it_owns_and_imports_only_what_it_says(folder):
    doc = ast.get_docstring(ast.parse(MODULES[folder].read_text())) or ""
    assert len(doc.split()) >= 8, f"{folder} has no docstring saying what it owns"
    declared = _declared(folder)  # a folder declared covers the folders inside it (`specdec.drafters`)
    undeclared = {room for room in ROOMS[folder] if not any(room == d or room.startswith(d + ".") for d in declared)}
    assert not undeclared, f"{folder} imports {sorted(undeclared)}, which its docstring does not list"


def test_importing_specdec_loads_no_model_plugin_or_side_package():
    script = (  # transformers makes its activation modules on import: count only those specdec adds
        "import gc, sys, torch, transformers.modeling_utils\n"
        "count = lambda: sum(isinstance(o, torch.nn.Module) for o in gc.get_objects())\n"
        "before = count()\n"
        "import specdec, specdec.plugins\n"
        "models = count() - before\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[:2] in (['specdec', 'drafters'], ['specdec', 'zoo'],"
        " ['specdec', 'bench'], ['specdec', 'cli'], ['specdec', 'play'], ['specdec', 'training'], ['specdec', 'export']))\n"
        "print(models, specdec.plugins._registry is None, loaded)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout.strip().split(maxsplit=2)
    assert out == ["0", "True", "[]"], f"import specdec: {out[0]} torch modules made, plugin registry empty: {out[1]}, " \
                                       f"side packages loaded: {out[2]}"


def _documented() -> set[str]:
    """Every `specdec.x.y` the README, docs and examples name, and every name they import from specdec."""
    names = set()
    for path in DOCUMENTS:
        text = path.read_text()
        for module, grouped, listed in re.findall(r"from (specdec(?:\.\w+)*) import (?:\(([^)]*)\)|([\w, ]+))", text):
            names.update(f"{module}.{name.strip()}" for name in (grouped or listed).split(",") if name.strip())
        names.update(re.findall(r"(?<![\w./-])(specdec(?:\.[A-Za-z_]\w*)+)", text))
    return names


def _resolve(dotted: str) -> object:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            value: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[cut:]:
            value = getattr(value, attribute)
        return value
    raise ModuleNotFoundError(dotted)


def test_every_name_the_docs_and_examples_mention_imports():
    names = _documented()
    assert {"specdec.generate", "specdec.checkpoints.load_causal_lm", "specdec.teaching.trace.Trace"} <= names
    missing = []
    for dotted in sorted(names):
        try:
            _resolve(dotted)
        except (ImportError, AttributeError) as error:
            missing.append(f"{dotted} ({type(error).__name__}: {error})")
    assert not missing, "documented but not importable:\n" + "\n".join(missing)


def test_the_readmes_speed_claim_gives_the_real_model_beside_the_zoo():
    """The compiled engine's plain-decoding speedup over transformers is the zoo's and the real
    model's (docs/bench.md, "On a real model": SmolLM2-135M-Instruct), not the zoo's alone."""
    paragraph = next(part for part in (ROOT / "README.md").read_text().split("\n\n")
                     if "`compile=True` runs the same decoding" in part)
    real = (ROOT / "docs" / "bench.md").read_text().partition("## On a real model")[2].partition("\n## ")[0]
    assert "SmolLM2-135M-Instruct" in paragraph and "4.5x" in paragraph
    for figure in ("1.19x", "1.12x"):  # over transformers' `generate`, over its static compiled `generate`
        assert figure in real, f"docs/bench.md's real-model section no longer says {figure}: update both"
        assert figure in paragraph, f"the README's speed claim omits the real model's {figure}"


@pytest.mark.parametrize("name", PUBLIC)
def test_the_public_api_keeps_its_names(name):
    assert name in specdec.__all__ and getattr(specdec, name) is not None


def test_the_command_line_entry_points_resolve():
    from specdec.cli import main

    text = (ROOT / "pyproject.toml").read_text()
    assert 'specdec = "specdec.cli:main"' in text
    assert callable(main) and main is importlib.import_module("specdec.__main__").main


def test_the_wheel_builds_quietly_and_ships_every_module_and_the_page(tmp_path):
    """`pip install` builds this wheel: no setuptools warning, every module and the page's files in it."""
    import shutil
    import zipfile

    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for name in ("specdec", "drafters", "verifier"):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                            str(tmp_path / "dist"), str(source)], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    assert "warning" not in (built.stdout + built.stderr).lower(), built.stdout + built.stderr
    (wheel,) = (tmp_path / "dist").glob("specdec-*.whl")
    shipped = set(zipfile.ZipFile(wheel).namelist())
    modules = {name.replace(".", "/") + ("/__init__" if path.name == "__init__.py" else "") + ".py"
               for name, path in MODULES.items()}
    assert not modules - shipped, f"the wheel lacks {sorted(modules - shipped)}"
    page = {f"specdec/play/static/{name}" for name in ("index.html", "play.js", "play.css")}
    assert page <= shipped, f"the wheel lacks {sorted(page - shipped)}"
