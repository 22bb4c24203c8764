"""The plugin manager: builtins through the hook, entry points, blocking, failures, duplicates.

Entry points are faked by replacing `specdec.plugins.entry_points` with a function returning
objects that have `.name` and `.load()`; each plugin is a module built on the fly.
"""

from __future__ import annotations

import os
import subprocess
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

import specdec
from specdec import Draft, hookspecs, plugins
from specdec.drafters import DraftModelDrafter, NgramDrafter

BUILTIN_NAMES = {"ngram", "draft-model", "medusa", "eagle", "eagle3", "mtp", "dflash", "pard", "lookahead", "suffix",
                 "retrieval",
                 "self"}  # the drafters specdec ships


@dataclass
class FakeEntryPoint:
    """Stands in for importlib.metadata.EntryPoint; counts how often it was loaded."""

    name: str
    loader: Callable[[], object]
    loads: list[int] = field(default_factory=list)

    def load(self) -> object:
        self.loads.append(1)
        return self.loader()


def drafter(name: object, cls_name: str = "FakeDrafter", propose: bool = True) -> type:
    """A minimal drafter class (or a broken one: name not a string, no propose)."""
    namespace: dict[str, object] = {"__doc__": f"Fake drafter {name!r}."}
    if name is not None:
        namespace["name"] = name
    if propose:
        namespace["propose"] = lambda self, ctx, k: Draft(ctx.tokens[:0])
    return type(cls_name, (), namespace)


def plugin_module(module_name: str, hook: Callable[[], object],
                  hook_name: str = "specdec_register_drafters") -> types.ModuleType:
    """A module holding `hook` as a @specdec.hookimpl under `hook_name`."""
    module = types.ModuleType(module_name)
    setattr(module, hook_name, specdec.hookimpl(hook))
    return module


def returning(*classes: object) -> Callable[[], list[object]]:
    return lambda: list(classes)


def failing_import(message: str) -> Callable[[], object]:
    def load() -> object:
        raise ImportError(message)
    return load


@pytest.fixture(autouse=True)
def isolated(monkeypatch: pytest.MonkeyPatch) -> None:
    """No installed entry points, no block list, no cached registry (all restored afterwards)."""
    monkeypatch.setattr(plugins, "entry_points", lambda group: [])
    monkeypatch.setattr(plugins, "_registry", None)
    monkeypatch.delenv(plugins.DISABLE_ENV, raising=False)


def install(monkeypatch: pytest.MonkeyPatch, *points: FakeEntryPoint) -> None:
    def entry_points(group: str) -> list[FakeEntryPoint]:
        return list(points) if group == hookspecs.NAME else []
    monkeypatch.setattr(plugins, "entry_points", entry_points)


def good_plugin(name: str = "good", drafter_name: str = "good-drafter") -> FakeEntryPoint:
    module = plugin_module(f"plugin_{name}", returning(drafter(drafter_name)))
    return FakeEntryPoint(name, lambda: module)


def test_builtin_drafters_register_through_the_hook_with_origin_builtin() -> None:
    registry = plugins.load_registry()
    assert registry.drafters["ngram"] is NgramDrafter
    assert registry.drafters["draft-model"] is DraftModelDrafter
    assert {registry.origins[name] for name in BUILTIN_NAMES} == {"builtin"}
    assert registry.failures == ()
    from specdec import drafters as builtin_module

    assert hasattr(builtin_module.specdec_register_drafters, f"{hookspecs.NAME}_impl"), \
        "the builtin drafters must be registered by a @specdec.hookimpl, like any plugin"


def test_drafter_names_lists_builtins_sorted() -> None:
    names = specdec.drafter_names()
    assert BUILTIN_NAMES <= set(names)
    assert names == sorted(names)


def test_import_specdec_loads_no_plugins_until_first_use() -> None:
    code = ("import sys, specdec, specdec.plugins as p\n"
            "print(p._registry is None, 'specdec.drafters' in sys.modules)\n"
            "specdec.drafter_names()\n"
            "print(p._registry is None, 'specdec.drafters' in sys.modules)\n")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop(plugins.DISABLE_ENV, None)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "False", "False", "True"], done.stdout


def test_entry_point_plugin_registers_its_drafters_under_its_name(monkeypatch: pytest.MonkeyPatch) -> None:
    install(monkeypatch, good_plugin("extra", "extra-drafter"))
    registry = plugins.load_registry()
    assert registry.origins["extra-drafter"] == "extra"
    assert BUILTIN_NAMES <= set(registry.drafters)
    assert "extra-drafter" in specdec.drafter_names()
    assert isinstance(specdec.make_drafter("extra-drafter"), registry.drafters["extra-drafter"])


def test_disable_env_blocks_an_entry_point_plugin_without_importing_it(monkeypatch: pytest.MonkeyPatch) -> None:
    point = good_plugin("extra", "extra-drafter")
    install(monkeypatch, point)
    monkeypatch.setenv(plugins.DISABLE_ENV, "extra")
    registry = plugins.load_registry()
    assert "extra-drafter" not in registry.drafters
    assert point.loads == [], "a blocked plugin must not even be imported"
    assert BUILTIN_NAMES <= set(registry.drafters)


def test_disable_env_blocks_the_builtin_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    install(monkeypatch, good_plugin("extra", "extra-drafter"))
    monkeypatch.setenv(plugins.DISABLE_ENV, " builtin , other ")
    registry = plugins.load_registry()
    assert set(registry.drafters) == {"extra-drafter"}
    monkeypatch.setenv(plugins.DISABLE_ENV, "builtin,extra")
    assert plugins.load_registry().drafters == {}


def test_plugin_failing_to_import_is_reported_by_name_and_others_load(monkeypatch: pytest.MonkeyPatch) -> None:
    install(monkeypatch, FakeEntryPoint("broken", failing_import("No module named 'missing_dep'")),
            good_plugin())
    with pytest.warns(RuntimeWarning, match="'broken'"):
        registry = plugins.load_registry()
    assert [failure.plugin for failure in registry.failures] == ["broken"]
    assert "missing_dep" in registry.failures[0].error
    assert {"good-drafter", *BUILTIN_NAMES} <= set(registry.drafters)


def _raise() -> list[type]:
    raise RuntimeError("hook exploded")


class NoPropose:
    name = "no-propose"


@pytest.mark.parametrize("hook, expected", [
    (_raise, "hook exploded"),
    (lambda: None, "specdec_register_drafters raised"),
    (returning(42), "42 is not a class"),
    (returning(drafter(None, "Nameless")), "Nameless"),
    (returning(drafter("", "EmptyName")), "EmptyName"),
    (returning(drafter(7, "NumberName")), "NumberName"),
    (returning(NoPropose), "NoPropose has no propose"),
], ids=["raises", "returns-none", "non-class", "no-name", "empty-name", "non-string-name", "no-propose"])
def test_bad_hook_result_is_reported_and_skipped(monkeypatch: pytest.MonkeyPatch, hook: Callable[[], object],
                                                 expected: str) -> None:
    install(monkeypatch, FakeEntryPoint("bad", lambda: plugin_module("plugin_bad", hook)), good_plugin())
    with pytest.warns(RuntimeWarning, match="'bad'"):
        registry = plugins.load_registry()
    assert [failure.plugin for failure in registry.failures] == ["bad"]
    assert expected in registry.failures[0].error, registry.failures[0].error
    assert set(registry.drafters) == {"good-drafter", *BUILTIN_NAMES}
    assert "bad" not in registry.origins.values()


def test_good_classes_beside_a_bad_one_still_register(monkeypatch: pytest.MonkeyPatch) -> None:
    hook = returning(drafter("fine"), "not a class")
    install(monkeypatch, FakeEntryPoint("mixed", lambda: plugin_module("plugin_mixed", hook)))
    with pytest.warns(RuntimeWarning, match="'mixed'"):
        registry = plugins.load_registry()
    assert registry.origins["fine"] == "mixed"
    assert len(registry.failures) == 1 and "'not a class'" in registry.failures[0].error


def test_misspelled_hookimpl_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    module = plugin_module("plugin_typo", returning(drafter("typo-drafter")), hook_name="specdec_register_drafter")
    install(monkeypatch, FakeEntryPoint("typo", lambda: module), good_plugin())
    with pytest.warns(RuntimeWarning, match="'typo'"):
        registry = plugins.load_registry()
    assert [failure.plugin for failure in registry.failures] == ["typo"]
    assert "specdec_register_drafter" in registry.failures[0].error
    assert "typo-drafter" not in registry.drafters
    assert {"good-drafter", *BUILTIN_NAMES} <= set(registry.drafters)


def test_duplicate_drafter_names_raise_naming_both_classes_and_plugins(monkeypatch: pytest.MonkeyPatch) -> None:
    install(monkeypatch,
            FakeEntryPoint("alpha", lambda: plugin_module("plugin_alpha", returning(drafter("same", "AlphaDrafter")))),
            FakeEntryPoint("beta", lambda: plugin_module("plugin_beta", returning(drafter("same", "BetaDrafter")))))
    with pytest.raises(plugins.DuplicateDrafterError) as raised:
        plugins.load_registry()
    message = str(raised.value)
    for part in ("'same'", "AlphaDrafter", "BetaDrafter", "'alpha'", "'beta'"):
        assert part in message, message


def test_plugin_reusing_a_builtin_name_is_a_duplicate(monkeypatch: pytest.MonkeyPatch) -> None:
    install(monkeypatch, FakeEntryPoint("rogue", lambda: plugin_module("plugin_rogue",
                                                                        returning(drafter("ngram", "RogueNgram")))))
    with pytest.raises(plugins.DuplicateDrafterError) as raised:
        plugins.load_registry()
    for part in ("NgramDrafter", "RogueNgram", "'builtin'", "'rogue'"):
        assert part in str(raised.value), str(raised.value)
    monkeypatch.setenv(plugins.DISABLE_ENV, "rogue")
    assert plugins.load_registry().drafters["ngram"] is NgramDrafter


def test_make_drafter_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(ValueError) as raised:
        specdec.make_drafter("no-such-drafter")
    message = str(raised.value)
    assert "'no-such-drafter'" in message
    for name in specdec.drafter_names():
        assert name in message, message


def test_make_drafter_bad_option_names_it_and_the_accepted_ones() -> None:
    with pytest.raises(TypeError) as raised:
        specdec.make_drafter("ngram", max_gram=3)
    message = str(raised.value)
    assert "max_gram" in message and "max_ngram" in message and "min_ngram" in message, message


# --- the one-row protocol of earlier plugins, through the adapter ------------------------------------

class EchoRowDrafter:
    """A plugin written against the one-row protocol: propose(ctx, k), prefill(ctx), commit(ctx, n),
    uses_hidden_states, no capabilities; it drafts the last token k times and counts its calls."""

    name = "echo-row"
    uses_hidden_states = True

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.hidden_rows = 0

    def prefill(self, ctx: specdec.DraftContext) -> None:
        self.calls.append("prefill")

    def propose(self, ctx: specdec.DraftContext, k: int) -> Draft:
        self.calls.append("propose")
        assert ctx.hidden_states is not None, "the adapter declares the hidden states it reads"
        self.hidden_rows += ctx.hidden_states.shape[0]
        return Draft(ctx.tokens[-1:].repeat(k))

    def commit(self, ctx: specdec.DraftContext, num_accepted: int) -> None:
        self.calls.append("commit")


def test_a_plugin_of_the_one_row_protocol_decodes_alone_and_in_batches_through_the_adapter(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from tiny import tiny_model

    module = plugin_module("plugin_rows", returning(EchoRowDrafter))
    install(monkeypatch, FakeEntryPoint("old-style", lambda: module))
    model = tiny_model("llama", vocab_size=64, seed=0)
    prompts = [[3, 3, 3, 3, 5], [7, 8, 7, 8]]
    plain = [specdec.generate(model, prompt, max_new_tokens=12).tokens for prompt in prompts]
    alone = specdec.make_drafter("echo-row")
    one = specdec.generate(model, prompts[0], drafter=alone, max_new_tokens=12)
    assert one.tokens == plain[0] and one.stats.drafted > 0
    assert alone.calls[0] == "prefill" and {"propose", "commit"} <= set(alone.calls)
    assert alone.hidden_rows > 0, "its hidden states reached it"
    batched = specdec.make_drafter("echo-row")
    batch = specdec.generate_batch(model, prompts, drafter=batched, max_new_tokens=12)
    assert [row.tokens for row in batch] == plain and batch.totals.drafted > 0
    assert batched.calls[0] == "prefill", "row 0 is the drafter itself; row 1 a copy of it"


def test_a_drafter_declaring_a_capability_without_its_method_is_named() -> None:
    class Forgetful:
        name = "forgetful"
        capabilities = frozenset({specdec.Capability.STATE})

        def propose(self, rows, k):  # type: ignore[no-untyped-def]
            return {row: Draft(ctx.tokens[:0]) for row, ctx in rows.items()}

        def prefill(self, rows):  # type: ignore[no-untyped-def]
            pass

    from tiny import tiny_model

    with pytest.raises(TypeError, match=r"drafter 'forgetful' declares Capability\.STATE but has no commit\(\)"):
        specdec.generate(tiny_model("llama", vocab_size=64, seed=0), [1, 2, 3], drafter=Forgetful(), max_new_tokens=2)
