"""The zoo's block drafters: DFlash and PARD as pieces of a family (trained alone from the frozen
target, `specdec.zoo.parallel`), the rows that draft at their own k, and the settings that name them."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import specdec
from specdec import zoo
from specdec.checkpoints import load_causal_lm, load_tokenizer
from specdec.zoo.settings import DFLASH_BLOCK


def test_rows_draft_at_their_own_k_and_the_rest_at_the_familys():
    assert zoo.draft_length("dflash", 4) == DFLASH_BLOCK - 1 == zoo.draft_length("eagle3-k15", 4)
    assert zoo.draft_length("eagle3", 4) == 4 and zoo.draft_length("pard", 6) == 6
    assert zoo.draft_length("a-plugin", 3) == 3
    assert zoo.registry_name("eagle3-k15") == "eagle3"


@pytest.mark.parametrize(("change", "message"), [
    ({"dflash_steps": None}, "dflash's settings"),
    ({"pard_steps": 0}, "pard's settings"),
    ({"drafters": ("mtp", "pard"), "dflash_layers": None, "dflash_steps": None},
     "pard starts from the family's draft model"),
    ({"drafters": ("mtp", "eagle3", "eagle3-k15"), "dflash_layers": None, "dflash_steps": None, "pard_steps": None},
     "eagle3-k15 is EAGLE-3 at DFlash's k"),
])
def test_settings_name_the_block_drafters_fields_exactly_with_them(change, message):
    with pytest.raises(ValueError, match=message):
        replace(zoo.QUICK, **change)


def test_the_quick_familys_block_drafters_load_and_decode_losslessly(quick_zoo: Path):
    record = zoo.manifest(quick_zoo)
    config = json.loads((quick_zoo / "dflash" / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"] and config["block_size"] == DFLASH_BLOCK
    assert json.loads((quick_zoo / "pard" / "config.json").read_text())["spd_type"] == "pard"
    assert record["pieces"]["dflash"]["parameters"] > 0 and record["pieces"]["pard"]["parameters"] > 0
    target = load_causal_lm(quick_zoo / "target")
    tokenizer = load_tokenizer(quick_zoo / "tokenizer")
    prompt = torch.tensor(tokenizer("def parse(text):\n    ", add_special_tokens=False)["input_ids"])
    plain = specdec.generate(target, prompt, max_new_tokens=20).tokens
    rows = zoo.zoo_drafters(quick_zoo)
    for label in ("dflash", "pard"):
        name, options = rows[label]
        result = specdec.generate(target, prompt, drafter=specdec.make_drafter(name, **options), max_new_tokens=20,
                                  num_draft_tokens=zoo.draft_length(label, 4), tokenizer=tokenizer)
        assert result.tokens == plain and result.stats.drafted > 0, label
