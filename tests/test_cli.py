"""The `specdec` command line, run in-process through `main([...])` on a tiny local checkpoint."""

from __future__ import annotations

import os
import runpy
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import PreTrainedModel, PreTrainedTokenizerFast

import specdec
from specdec import Sampling, hookspecs, plugins
from specdec.cli.common import parse_drafter_spec, parse_value
from specdec.cli import main
from tiny import tiny_model

SENTENCES = [
    "the cat sat on the mat and the dog sat on the rug",
    "a small bird sang a song in the old tree",
    "we read a book about the sea and the ships on it",
    "they ran to the park when the rain had stopped",
]
PROMPT = "the cat sat on the"


@dataclass(frozen=True)
class Checkpoint:
    directory: Path
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerFast


def _tokenizer() -> PreTrainedTokenizerFast:
    """A word-level tokenizer trained offline on SENTENCES, with an EOS token."""
    backend = Tokenizer(models.WordLevel(unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.train_from_iterator(SENTENCES, trainers.WordLevelTrainer(special_tokens=["<unk>", "</s>"]))
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", eos_token="</s>")


def _save(directory: Path, eos_token_id: int | None = None) -> Checkpoint:
    tokenizer = _tokenizer()
    model = tiny_model("llama", vocab_size=len(tokenizer), seed=11, dtype=torch.float64)
    model.generation_config.eos_token_id = eos_token_id
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return Checkpoint(directory, model, tokenizer)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Checkpoint:
    return _save(tmp_path_factory.mktemp("tiny-target"))


@pytest.fixture(autouse=True)
def fresh_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plugins, "_registry", None)
    monkeypatch.delenv(plugins.DISABLE_ENV, raising=False)


def run(argv: list[str]) -> int:
    """main's exit status, whether it returns it or argparse raises SystemExit."""
    try:
        return main(argv)
    except SystemExit as exit_:
        return int(exit_.code or 0)


def generate_args(checkpoint: Checkpoint, *extra: str) -> list[str]:
    return ["generate", "--target", str(checkpoint.directory), "--dtype", "float64", "--max-new-tokens", "24",
            *extra, PROMPT]


def api_text(checkpoint: Checkpoint, drafter: object = None, sampling: Sampling = Sampling(),
             seed: int | None = None, eos: list[int] | None = None) -> tuple[str, list[int]]:
    ids = checkpoint.tokenizer.encode(PROMPT)
    eos = [checkpoint.tokenizer.eos_token_id] if eos is None else eos
    tokens = specdec.generate(checkpoint.model, ids, drafter=drafter, num_draft_tokens=4, max_new_tokens=24,
                              sampling=sampling, eos_token_id=eos, seed=seed).tokens
    return checkpoint.tokenizer.decode(tokens, skip_special_tokens=True), tokens


def parse_output(out: str) -> tuple[str, dict[str, float]]:
    """(generated text, stats as numbers) from the generate command's stdout."""
    *text, last = out.rstrip("\n").split("\n")
    assert last.startswith("stats: "), f"the last line should be the stats line, got {last!r}"
    stats = {key: float(value) for key, value in (pair.split("=") for pair in last.removeprefix("stats: ").split())}
    return "\n".join(text), stats


# ---- drafters -------------------------------------------------------------------------------

def test_drafters_lists_each_drafter_with_its_plugin_and_summary(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["drafters"]) == 0
    lines = capsys.readouterr().out.splitlines()
    registry = plugins.registry()
    assert len(lines) == len(registry.drafters)
    for line, name in zip(lines, sorted(registry.drafters)):
        summary = registry.drafters[name].__doc__.strip().splitlines()[0]
        assert line.split()[:2] == [name, registry.origins[name]], line
        assert line.endswith(summary), line


def test_drafters_reports_plugin_failures_after_the_list(monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    class Broken:
        name = "broken-plugin"

        def load(self) -> object:
            raise ImportError("No module named 'not_installed'")

    monkeypatch.setattr(plugins, "entry_points", lambda group: [Broken()] if group == hookspecs.NAME else [])
    assert run(["drafters"]) == 0
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert lines[0].startswith("dflash") and any(line.startswith("ngram") for line in lines)  # sorted by name
    assert "broken-plugin" in lines[-1] and "not_installed" in lines[-1]
    assert "Warning" not in captured.err


def test_drafters_with_duplicate_names_is_a_one_line_error(monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    import types

    module = types.ModuleType("dup_plugin")
    clone = type("CloneNgram", (), {"name": "ngram", "propose": lambda self, ctx, k: None})
    module.specdec_register_drafters = specdec.hookimpl(lambda: [clone])
    point = type("Point", (), {"name": "dup", "load": lambda self: module})()
    monkeypatch.setattr(plugins, "entry_points", lambda group: [point] if group == hookspecs.NAME else [])
    assert run(["drafters"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("specdec: error: ") and "CloneNgram" in err


# ---- generate -------------------------------------------------------------------------------

def test_generate_prints_text_then_stats(checkpoint: Checkpoint, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(generate_args(checkpoint, "--drafter", "ngram")) == 0
    text, stats = parse_output(capsys.readouterr().out)
    assert text.strip()
    assert {"steps", "new_tokens", "mean_accepted_length", "acceptance_rate", "tokens_per_second",
            "draft_seconds", "verify_seconds"} <= set(stats)
    assert 1 <= stats["steps"] <= stats["new_tokens"] <= 24
    assert stats["mean_accepted_length"] == pytest.approx(stats["new_tokens"] / stats["steps"], abs=0.01)
    assert 0 <= stats["acceptance_rate"] <= 1


@pytest.mark.parametrize("spec", [None, "ngram", "ngram:max_ngram=2,min_ngram=1", "draft-model:model={dir}"])
def test_greedy_cli_output_equals_the_api_output(checkpoint: Checkpoint, capsys: pytest.CaptureFixture[str],
                                                 spec: str | None) -> None:
    extra = [] if spec is None else ["--drafter", spec.format(dir=checkpoint.directory)]
    assert run(generate_args(checkpoint, *extra)) == 0
    text, stats = parse_output(capsys.readouterr().out)
    expected_text, expected_tokens = api_text(checkpoint)
    assert text == expected_text
    assert stats["new_tokens"] == len(expected_tokens)
    if spec is None:
        assert stats["steps"] == len(expected_tokens), "plain decoding emits one token per step"


def test_sampled_cli_output_equals_the_api_output_for_a_seed(checkpoint: Checkpoint,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    settings = ["--temperature", "0.9", "--top-k", "10", "--top-p", "0.95", "--seed", "5", "--drafter", "ngram"]
    assert run(generate_args(checkpoint, *settings)) == 0
    text, _ = parse_output(capsys.readouterr().out)
    expected, _ = api_text(checkpoint, specdec.make_drafter("ngram"), Sampling(0.9, 10, 0.95), seed=5)
    assert text == expected


def test_generation_config_eos_ends_the_output(tmp_path: Path, checkpoint: Checkpoint,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    _, tokens = api_text(checkpoint)
    candidates = [t for t in tokens[1:-1] if t != tokens[0]]
    assert candidates, f"the tiny model's greedy output {tokens} has no token to use as EOS"
    eos = candidates[0]
    stop = tokens.index(eos) + 1  # < len(tokens): the EOS cuts the output short
    with_eos = _save(tmp_path, eos_token_id=eos)
    assert run(generate_args(with_eos, "--drafter", "ngram")) == 0
    text, stats = parse_output(capsys.readouterr().out)
    assert stats["new_tokens"] == stop
    assert text == checkpoint.tokenizer.decode(tokens[:stop], skip_special_tokens=True)


# ---- drafter option parsing -----------------------------------------------------------------

def test_drafter_spec_splits_name_and_typed_options() -> None:
    assert parse_drafter_spec("ngram") == ("ngram", {})
    assert parse_drafter_spec("ngram:max_ngram=3,min_ngram=1") == ("ngram", {"max_ngram": 3, "min_ngram": 1})
    name, options = parse_drafter_spec("x:a=0.5,b=true,c=False,d=hello,e=1e-3,f=-2")
    assert name == "x" and options == {"a": 0.5, "b": True, "c": False, "d": "hello", "e": 1e-3, "f": -2}
    assert [type(options[key]) for key in "abcdef"] == [float, bool, bool, str, float, int]
    assert parse_drafter_spec("draft-model:model=/models/a:b=c") == ("draft-model", {"model": "/models/a:b=c"})


@pytest.mark.parametrize("spec, named", [
    ("", "''"), (":a=1", "':a=1'"), ("ngram:", "'ngram:'"), ("ngram:max_ngram", "'max_ngram'"),
    ("ngram:=3", "'=3'"), ("ngram:a=1,a=2", "'a'"), ("ngram:1x=3", "'1x=3'"), ("ngram:a=1,", "''"),
])
def test_malformed_drafter_spec_raises_naming_the_bad_part(spec: str, named: str) -> None:
    with pytest.raises(ValueError) as raised:
        parse_drafter_spec(spec)
    assert named in str(raised.value), str(raised.value)


_keys = st.from_regex(r"[a-z_][a-z0-9_]{0,8}", fullmatch=True)
_values = st.one_of(
    st.integers(-10**6, 10**6), st.booleans(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(st.characters(blacklist_characters=",", blacklist_categories=("Cs",)), max_size=12)
    .filter(lambda s: isinstance(parse_value(s), str)),
)


def _format(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else repr(value) if isinstance(value, float) else str(value)


@given(name=st.from_regex(r"[a-z][a-z0-9-]{0,10}", fullmatch=True), options=st.dictionaries(_keys, _values, max_size=4))
def test_drafter_spec_round_trips_typed_options(name: str, options: dict[str, object]) -> None:
    spec = name + (":" + ",".join(f"{key}={_format(value)}" for key, value in options.items()) if options else "")
    parsed_name, parsed = parse_drafter_spec(spec)
    assert parsed_name == name
    assert parsed == options and [type(v) for v in parsed.values()] == [type(v) for v in options.values()]


# ---- errors ---------------------------------------------------------------------------------

@pytest.mark.parametrize("change, named", [
    ({"--target": "{tmp}/no-such-dir"}, "no-such-dir"),
    ({"--drafter": "no-such-drafter"}, "no-such-drafter"),
    ({"--drafter": "ngram:max_ngram=0"}, "max_ngram"),
    ({"--drafter": "ngram:bogus_option=1"}, "bogus_option"),
    ({"--drafter": "ngram:max_ngram"}, "max_ngram"),
    ({"--drafter": "draft-model:model={tmp}/missing-draft"}, "missing-draft"),
    ({"--temperature": "-1"}, "-1"),
    ({"--top-p": "1.5"}, "1.5"),
    ({"--k": "-2"}, "-2"),
    ({"--max-new-tokens": "-5"}, "-5"),
    ({"--device": "warp-drive"}, "warp-drive"),
])
def test_user_errors_exit_2_with_one_line_naming_the_value(checkpoint: Checkpoint, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str],
                                                          change: dict[str, str], named: str) -> None:
    options = {"--target": str(checkpoint.directory), "--dtype": "float64"}
    options.update({key: value.format(tmp=tmp_path) for key, value in change.items()})
    argv = ["generate", *[part for pair in options.items() for part in pair], PROMPT]
    assert run(argv) == 2
    captured = capsys.readouterr()
    errors = [line for line in captured.err.splitlines() if "error" in line.lower()]
    assert errors == [captured.err.splitlines()[-1]], captured.err  # one error line, the last one
    assert errors[0].startswith("specdec: error: ") and named in errors[0], errors[0]
    assert "Traceback" not in captured.err and captured.out == ""


# ---- entry points of the command ------------------------------------------------------------

def test_python_dash_m_specdec_runs_the_cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys, "argv", ["specdec", "drafters"])
    with pytest.raises(SystemExit) as exited:
        runpy.run_module("specdec", run_name="__main__", alter_sys=False)
    assert exited.value.code == 0
    assert "ngram" in capsys.readouterr().out


def test_installed_console_script_lists_drafters() -> None:
    script = Path(sys.executable).parent / "specdec"
    assert script.is_file(), f"no console script at {script}; reinstall specdec (pip install -e .)"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([str(script), "drafters"], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    names = [line.split()[0] for line in done.stdout.splitlines() if line.strip()]
    assert {"ngram", "draft-model"} <= set(names)


# ---- the engine's options -------------------------------------------------------------------

@pytest.mark.usefixtures("strict_compile")
def test_generate_compiled_prints_the_eager_text(checkpoint: Checkpoint, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(generate_args(checkpoint, "--drafter", "ngram", "--compile")) == 0
    text, stats = parse_output(capsys.readouterr().out)
    assert text == api_text(checkpoint, drafter="ngram")[0]
    assert stats["steps"] >= 1


@pytest.mark.parametrize("command", ["verify", "trace"])
def test_every_model_command_takes_device_and_dtype(checkpoint: Checkpoint, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str], command: str) -> None:
    common = ["--target", str(checkpoint.directory), "--device", "cpu", "--dtype", "bfloat16"]
    if command == "verify":
        argv = ["verify", *common, PROMPT, "the cat"]
    else:
        argv = ["trace", *common, "--drafter", "ngram", "--max-new-tokens", "8", "--quiet",
                "--out", str(tmp_path / "trace.html"), PROMPT]
    assert run(argv) == 0, capsys.readouterr().err
    assert run([command, *common[:2], "--dtype", "float8"] + argv[len(common) + 1:]) == 2
    assert "float8" in capsys.readouterr().err


def test_generate_takes_the_penalties_and_min_p_as_the_api_does(checkpoint: Checkpoint,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    flags = ["--temperature", "0.8", "--repetition-penalty", "1.3", "--presence-penalty", "0.5",
             "--frequency-penalty", "0.2", "--min-p", "0.05", "--seed", "3"]
    assert run(generate_args(checkpoint, "--drafter", "ngram", *flags)) == 0
    text, _ = parse_output(capsys.readouterr().out)
    sampling = Sampling(temperature=0.8, repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.2,
                        min_p=0.05)
    assert text == api_text(checkpoint, drafter=specdec.make_drafter("ngram"), sampling=sampling, seed=3)[0]


def test_bad_sampling_flags_are_named(checkpoint: Checkpoint, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert run(generate_args(checkpoint, "--repetition-penalty", "0")) != 0
    assert "repetition_penalty must be a finite number > 0" in capsys.readouterr().err
    assert run(generate_args(checkpoint, "--json-schema", str(tmp_path / "missing.json"))) != 0
    assert "missing.json' does not exist" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text("{nope")
    assert run(generate_args(checkpoint, "--json-schema", str(tmp_path / "bad.json"))) != 0
    assert "bad.json' is not JSON" in capsys.readouterr().err
