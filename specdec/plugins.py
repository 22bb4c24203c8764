"""The plugin manager: builtin drafters plus entry points in the group "specdec".

Loaded lazily on first use. `SPECDEC_DISABLE_PLUGINS=a,b` blocks plugins by name (the builtin
one is "builtin"). A plugin that fails to import, to register or to return drafters is
reported with its name and skipped; the others load. Two drafters with one name is an error.
"""

from __future__ import annotations

import inspect
import os
import warnings
from dataclasses import dataclass, field
from importlib import import_module
from importlib.metadata import entry_points
from collections.abc import Iterable
from typing import Any, cast

import pluggy

from specdec import hookspecs
from specdec.protocols import Drafter

__all__ = ["DISABLE_ENV", "DuplicateDrafterError", "PluginFailure", "Registry", "drafter_class",
           "drafter_names", "load_registry", "make_drafter", "registry"]

DISABLE_ENV = "SPECDEC_DISABLE_PLUGINS"
BUILTIN = ("builtin", "specdec.drafters")


class DuplicateDrafterError(RuntimeError):
    """Two plugins registered drafters under one name."""


@dataclass(frozen=True)
class PluginFailure:
    """A plugin that was skipped, and why."""

    plugin: str
    error: str


@dataclass(frozen=True)
class Registry:
    """Drafter classes by name, the plugin each came from, and the plugins that failed."""

    drafters: dict[str, type] = field(default_factory=dict)
    origins: dict[str, str] = field(default_factory=dict)
    failures: tuple[PluginFailure, ...] = ()


def _blocked() -> set[str]:
    return {name.strip() for name in os.environ.get(DISABLE_ENV, "").split(",") if name.strip()}


def _register(manager: pluggy.PluginManager, name: str, load: Any, failures: list[PluginFailure]) -> None:
    try:
        plugin = load()
    except Exception as error:  # a broken plugin must not take the others down
        failures.append(PluginFailure(name, f"failed to import: {type(error).__name__}: {error}"))
        return
    try:
        manager.register(plugin, name=name)
        manager.check_pending()
    except Exception as error:
        if manager.has_plugin(name):
            manager.unregister(name=name)
        failures.append(PluginFailure(name, f"failed to register: {type(error).__name__}: {error}"))


def _problem(candidate: object) -> str | None:
    """Why `candidate` is not a Drafter class, or None."""
    if not inspect.isclass(candidate):
        return f"{candidate!r} is not a class"
    name = getattr(candidate, "name", None)
    if not isinstance(name, str) or not name:
        return f"{candidate.__qualname__} has no string class attribute `name`"
    if not callable(getattr(candidate, "propose", None)):
        return f"{candidate.__qualname__} has no propose(ctx, k) method"
    return None


def load_registry() -> Registry:
    """Build the registry afresh from the builtin plugin and the installed entry points."""
    manager = pluggy.PluginManager(hookspecs.NAME)
    manager.add_hookspecs(hookspecs)
    blocked = _blocked()
    failures: list[PluginFailure] = []
    if BUILTIN[0] not in blocked:
        _register(manager, BUILTIN[0], lambda: import_module(BUILTIN[1]), failures)
    for point in entry_points(group=hookspecs.NAME):
        if point.name in blocked:
            continue
        if manager.has_plugin(point.name):
            failures.append(PluginFailure(point.name, "a second plugin of this name was skipped; rename one"))
            continue
        _register(manager, point.name, point.load, failures)

    drafters: dict[str, type] = {}
    origins: dict[str, str] = {}
    for impl in reversed(manager.hook.specdec_register_drafters.get_hookimpls()):
        try:
            classes = list(cast(Iterable[Any], impl.function()))
        except Exception as error:
            failures.append(PluginFailure(impl.plugin_name, f"specdec_register_drafters raised "
                                                            f"{type(error).__name__}: {error}"))
            continue
        for candidate in classes:
            problem = _problem(candidate)
            if problem:
                failures.append(PluginFailure(impl.plugin_name, f"returned a non-drafter: {problem}"))
                continue
            if candidate.name in drafters:
                raise DuplicateDrafterError(
                    f"drafter name {candidate.name!r} is registered twice: by {drafters[candidate.name].__qualname__} "
                    f"(plugin {origins[candidate.name]!r}) and by {candidate.__qualname__} (plugin "
                    f"{impl.plugin_name!r}); uninstall one or block it with {DISABLE_ENV}={impl.plugin_name}"
                )
            drafters[candidate.name] = candidate
            origins[candidate.name] = impl.plugin_name
    for failure in failures:
        warnings.warn(f"specdec plugin {failure.plugin!r} skipped: {failure.error}", RuntimeWarning,
                      stacklevel=2)
    return Registry(drafters, origins, tuple(failures))


_registry: Registry | None = None


def registry(reload: bool = False) -> Registry:
    """The process-wide registry, loaded on first use (or again with reload=True)."""
    global _registry
    if _registry is None or reload:
        _registry = load_registry()
    return _registry


def drafter_names() -> list[str]:
    """Every registered drafter name, plugins included, sorted."""
    return sorted(registry().drafters)


def drafter_class(name: str) -> type:
    """The class registered as `name`; an unknown name raises listing the known ones (ValueError)."""
    known = registry().drafters
    if name not in known:
        raise ValueError(f"unknown drafter {name!r}; registered drafters: {', '.join(sorted(known)) or 'none'}")
    return known[name]


def make_drafter(name: str, **options: Any) -> Drafter:
    """Instantiate the drafter registered as `name` with its options (constructor keywords)."""
    cls = drafter_class(name)
    try:
        inspect.signature(cls).bind(**options)
    except TypeError as error:
        accepted = [p for p in inspect.signature(cls).parameters if p != "self"]
        raise TypeError(f"drafter {name!r} rejects options {sorted(options)}: {error}; it accepts "
                        f"{accepted or 'no options'}") from None
    return cls(**options)
