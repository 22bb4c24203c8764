"""The zoo's rows that are not registry names, its draft model on a tokenizer of its own
(`specdec.zoo.xtok`), and adding drafters to a built family without building it again
(`specdec.zoo.extend`): on the shipped full family and on the quick family the tests build."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from specdec import cli, zoo
from specdec.checkpoints import load_causal_lm, load_tokenizer
from specdec.plugins import make_drafter
from specdec.runtime.target import CausalLM
from specdec.zoo.extend import added_drafters, extend
from specdec.zoo.measure import decode_prompts, read_evaluation
from specdec.zoo.options import ROWS
from specdec.zoo.packing import sha256
from specdec.zoo.settings import LEARNED, TRAINING_FREE, VARIANTS, XTOK, settings_from_record
from specdec.zoo.shipped import SHIPPED, open_shipped

# the quick family with the two drafters a family gains without a build: a draft model of its own
# tokenizer (640 entries against the target's 512) and the self drafter
QUICK_PLUS = replace(zoo.QUICK, drafters=("draft-model", XTOK, *zoo.QUICK.drafters[1:], "self"), xtok_vocab_size=640)


def _one_line(error: pytest.ExceptionInfo[BaseException], *names: str) -> None:
    text = str(error.value)
    assert "\n" not in text and all(name in text for name in names), text


@pytest.fixture(scope="module")
def full(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return open_shipped(zoo.FULL, root=tmp_path_factory.mktemp("zoo-cache"), say=lambda line: None)


@pytest.fixture(scope="module")
def extended(quick_zoo: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """The quick family extended with QUICK_PLUS's drafters, and its files' SHA-256 before."""
    before = {p.relative_to(quick_zoo).as_posix(): sha256(p) for p in quick_zoo.rglob("*") if p.is_file()}
    said: list[str] = []
    directory = extend(quick_zoo, QUICK_PLUS, root=tmp_path_factory.mktemp("extended"), show_progress=False,
                       say=said.append)
    assert any("extended in" in line for line in said), said
    return directory, before


# --- labels -------------------------------------------------------------------------------

def test_every_zoo_label_resolves_to_a_registered_drafter_and_its_files(full: Path):
    assert set(ROWS) == {*LEARNED, *TRAINING_FREE, *VARIANTS}
    assert zoo.registry_name(XTOK) == "draft-model" and zoo.registry_name("self") == "self"
    assert zoo.registry_name("a-plugin") == "a-plugin"  # a label the zoo does not know is a registered name
    rows = zoo.zoo_drafters(full)
    assert list(rows) == [label for label in ROWS if label in zoo.FULL.drafters]
    assert rows[XTOK] == ("draft-model", {"model": str(full / XTOK)})  # translate left "auto"
    assert rows["self"] == ("self", {})
    assert rows["draft-model"][1]["model"] == str(full / "draft-model")
    assert {label: options for label, (_, options) in rows.items()} == zoo.drafter_options(full)


def test_the_bench_the_demo_and_the_play_page_name_the_row_and_make_its_drafter(full: Path):
    from specdec.bench.session import contenders_for, default_drafters
    from specdec.play import drafter_choices

    chosen, _ = default_drafters(full)
    labels = [label for label, _ in chosen]
    assert labels.count(XTOK) == 2 and labels.count("self") == 1  # its chain and tree rows; self drafts chains
    assert labels.index(XTOK) > labels.index("draft-model")
    contenders = {c.label: c for c in contenders_for(chosen, [4], peers=False)}
    assert contenders[XTOK].drafter == contenders[f"{XTOK}+tree"].drafter == "draft-model"
    assert contenders[XTOK].options["model"] == str(full / XTOK)
    demo = _demo()
    options = demo.drafter_options(full)
    assert options[XTOK] == ("draft-model", zoo.drafter_options(full)[XTOK])
    assert options[f"{XTOK}+tree"][1]["tree"] is True and "self" in options and "self+tree" not in options
    registered = {label: name for label, (name, _) in zoo.zoo_drafters(full).items()}
    (choice,) = drafter_choices({XTOK: zoo.drafter_options(full)[XTOK]}, only_known=True, registered=registered)
    assert (choice.name, choice.registry_name, choice.available, choice.tree_options) == \
        (XTOK, "draft-model", True, {"tree": True})


def _demo():
    path = Path(__file__).resolve().parents[1] / "examples" / "demo.py"
    spec = importlib.util.spec_from_file_location("specdec_demo_xtok", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


# --- the shipped piece --------------------------------------------------------------------

def test_the_shipped_xtok_piece_has_a_tokenizer_of_its_own(full: Path):
    target_tokenizer, own = load_tokenizer(full / "tokenizer"), load_tokenizer(full / XTOK)
    assert len(own) == zoo.FULL.xtok_vocab_size == 3072 != len(target_tokenizer) == zoo.FULL.vocab_size
    assert own.bos_token == "<s>" and own.eos_token == "</s>" and target_tokenizer.eos_token == "<|endoftext|>"
    assert own.convert_ids_to_tokens(own("def f", add_special_tokens=False)["input_ids"])[0].startswith("\u2581")
    drafter = make_drafter(*zoo.zoo_drafters(full)[XTOK][:1], **zoo.zoo_drafters(full)[XTOK][1])
    assert drafter.lm.vocab_size == 3072 and drafter.draft_tokenizer.get_vocab() == own.get_vocab()
    piece = zoo.manifest(full)["pieces"][XTOK]
    assert piece["vocab_size"] == 3072 and piece["parameters"] == sum(
        p.numel() for p in load_causal_lm(full / XTOK).parameters())
    figures = zoo.read_figures(full)
    assert "agreement" not in figures["losses"][XTOK]  # no agreement across vocabularies
    assert figures["losses"][XTOK]["loss"] > figures["losses"][XTOK]["loss_per_own_token"]  # its tokens are shorter


def test_decoding_with_the_shipped_xtok_piece_gives_its_published_first_prompt(full: Path):
    evaluation = read_evaluation(full)
    tokenizer = load_tokenizer(full / "tokenizer")
    prompt = torch.tensor(tokenizer(evaluation.prompts[0].text, add_special_tokens=False)["input_ids"])
    one = replace(evaluation, prompts=evaluation.prompts[:1])
    target = CausalLM(load_causal_lm(full / "target"))
    name, options = zoo.zoo_drafters(full)[XTOK]
    _, runs, _ = decode_prompts(target, [prompt], make_drafter(name, **options), one, tokenizer=tokenizer)
    assert runs[0].row() == zoo.read_figures(full)["drafters"][XTOK]["prompts"][0]
    with pytest.raises(ValueError, match="tokenizer") as error:  # across vocabularies it needs the target's
        decode_prompts(target, [prompt], make_drafter(name, **options), one)
    _one_line(error)


# --- extending a built family -------------------------------------------------------------

def test_extending_keeps_every_file_and_adds_the_piece_and_its_figures(quick_zoo: Path, extended):
    directory, before = extended
    assert directory.name == QUICK_PLUS.directory_name != quick_zoo.name
    after = {p.relative_to(directory).as_posix(): sha256(p) for p in directory.rglob("*") if p.is_file()}
    changed = sorted(name for name, digest in before.items() if after.get(name) != digest)
    assert changed == ["figures.json", "manifest.json"]
    assert {name.split("/")[0] for name in set(after) - set(before)} == {XTOK}
    record = zoo.manifest(directory)
    assert record["key"] == QUICK_PLUS.key() and settings_from_record(record["settings"]) == QUICK_PLUS
    assert record["pieces"][XTOK]["vocab_size"] == 640 and record["pieces"][XTOK]["draft_cost"]["model_steps"] == 4
    assert record["pieces"]["self"]["draft_cost"]["draft_seconds"] > 0
    assert record["extensions"][0]["added"] == [XTOK, "self"] and record["extensions"][0]["from_key"] == \
        zoo.QUICK.key()
    old, new = zoo.read_figures(quick_zoo), zoo.read_figures(directory)
    for label, entry in old["drafters"].items():  # the earlier rows as published, but for their ranks
        assert {k: v for k, v in new["drafters"][label].items() if k != "rank"} == \
            {k: v for k, v in entry.items() if k != "rank"}, label
    assert all(new["losses"][name] == value for name, value in old["losses"].items())
    for label in (XTOK, "self"):
        rows = new["drafters"][label]["prompts"]
        assert len(rows) == 3 and all(r[0] == 24 for r in rows), label
    assert set(zoo.drafter_options(directory)) == set(QUICK_PLUS.drafters)
    assert extend(directory, QUICK_PLUS, root=directory.parent) == directory  # it has them: nothing to do


def test_extending_refuses_what_it_cannot_add_naming_the_value(quick_zoo: Path, tmp_path: Path):
    record = zoo.manifest(quick_zoo)
    with pytest.raises(ValueError) as error:
        added_drafters(record, replace(QUICK_PLUS, seed=7), quick_zoo)
    _one_line(error, "seed", "0", "7")
    with pytest.raises(ValueError) as error:
        added_drafters(record, replace(zoo.QUICK, drafters=tuple(d for d in zoo.QUICK.drafters if d != "eagle")),
                       quick_zoo)
    _one_line(error, "cannot drop eagle")
    with pytest.raises(ValueError) as error:
        added_drafters(record, replace(QUICK_PLUS, name="full"), quick_zoo)
    _one_line(error, "quick family, not full")
    fewer = {**record, "settings": {**record["settings"], "drafters": [d for d in zoo.QUICK.drafters if d != "medusa"]}}
    with pytest.raises(ValueError) as error:
        added_drafters(fewer, zoo.QUICK, quick_zoo)
    _one_line(error, "cannot add medusa")
    bare = tmp_path / "no-evaluation"  # a family without its evaluation (built before ZOO_FORMAT 10)
    bare.mkdir()
    shutil.copyfile(quick_zoo / "manifest.json", bare / "manifest.json")
    with pytest.raises(FileNotFoundError) as error:
        extend(bare, QUICK_PLUS, root=tmp_path / "cache")
    _one_line(error, str(bare), "evaluation")
    with pytest.raises(FileNotFoundError) as error:
        extend(tmp_path / "nowhere", QUICK_PLUS, root=tmp_path / "cache")
    _one_line(error, str(tmp_path / "nowhere"))
    assert not (tmp_path / "cache").exists()


def test_settings_tie_the_piece_to_its_vocabulary_and_keep_earlier_keys():
    with pytest.raises(ValueError) as error:
        replace(zoo.QUICK, drafters=(*zoo.QUICK.drafters, XTOK))
    _one_line(error, "xtok_vocab_size")
    with pytest.raises(ValueError) as error:
        replace(QUICK_PLUS, xtok_vocab_size=512)
    _one_line(error, "512")
    for steps, settings in ((0, QUICK_PLUS), (True, QUICK_PLUS), (40, zoo.QUICK)):  # xtok_steps: >= 1, with the piece
        with pytest.raises(ValueError) as error:
            replace(settings, xtok_steps=steps)
        _one_line(error, "xtok_steps", repr(steps))
    assert "xtok_steps" not in zoo.QUICK.record() and zoo.FULL.record()["xtok_steps"] == 2500
    with pytest.raises(ValueError) as error:
        settings_from_record({**zoo.QUICK.record(), "colour": "blue"})
    _one_line(error, "colour")
    assert "xtok_vocab_size" not in zoo.HYBRID.record()  # absent, so the shipped hybrid family keeps its key
    assert zoo.HYBRID.key() == json.loads((SHIPPED / "hybrid" / "manifest.json").read_text())["key"]
    assert settings_from_record(zoo.FULL.record()) == zoo.FULL


def test_the_cli_extends_one_family_at_a_time(quick_zoo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    def run(argv: list[str]) -> int:
        try:
            return cli.main(argv)
        except SystemExit as exit_:
            return int(exit_.code or 0)

    assert run(["zoo", "extend", "--quick", "--cache-dir", str(tmp_path)]) == 2
    assert "one of --from DIR" in capsys.readouterr().err
    assert run(["zoo", "extend", "--quick", "--ship"]) == 2
    assert "does not ship" in capsys.readouterr().err
    assert run(["zoo", "extend", "--quick", "--cache-dir", str(tmp_path), "--from", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "zoo extend failed" in err and str(tmp_path / "none") in err
    assert run(["zoo", "extend", "--quick", "--cache-dir", str(tmp_path), "--from", str(quick_zoo)]) == 0
    assert capsys.readouterr().out.strip() == str(quick_zoo)  # the code's quick settings add nothing to it
