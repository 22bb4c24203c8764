"""Sharded targets under torch.distributed: two processes (torchrun, gloo on CPU) hold the quick
zoo's target with tensor parallelism (and, once, as two pipeline stages). Their greedy tokens
equal one process's for every drafter family, chains, trees and batches; at temperature > 0 both
ranks emit the same tokens though each is given its own seed, or none; a rank that drafts or
draws differently is named by the check; `specdec generate --tp 2` prints on rank 0 only; and a
two-process `specdec train` trains the drafter one process trains. One torchrun launch runs all
of it (tests/distributed_checks.py); the tests here read what each rank saw."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from distributed_checks import TRAIN_FLAGS, drafters, prompts
from safetensors.torch import load_file
from transformers import LlamaConfig, LlamaForCausalLM

import specdec
from specdec import Draft, ExtraRows, cli
from specdec.checkpoints import load_causal_lm
from specdec.data.corpus import stdlib_corpus
from specdec.distributed.agreement import _pack_draft, _pack_verdict, _unpack_draft
from specdec.distributed.sharding import check_tensor_parallel

NEW = 20
SCRIPT = Path(__file__).with_name("distributed_checks.py")


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A draft model whose heads split in two, a prompts file and a small corpus."""
    root = tmp_path_factory.mktemp("distributed-files")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=1024,
                         tie_word_embeddings=False)
    LlamaForCausalLM(config).eval().save_pretrained(root / "draft")
    from tokenizers_for_tests import metaspace_tokenizer  # a draft model with a tokenizer of its own

    other = metaspace_tokenizer(root / "draft-xtok")
    config = LlamaConfig(vocab_size=len(other), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=1024,
                         tie_word_embeddings=False)
    LlamaForCausalLM(config).eval().save_pretrained(root / "draft-xtok")
    from specdec.drafters.parallel.dflash_files import save_dflash
    from test_dflash import dflash_head  # a DFlash block drafter reading the quick target's two layers

    save_dflash(dflash_head(vocab=512, hidden=64, layers=1, block=5, layer_ids=(0, 1)).float(), root / "dflash")
    (root / "prompts.txt").write_text("def parse(text):\n    return\nimport os\n")
    (root / "corpus").mkdir()
    small = [p for p in stdlib_corpus().train if 2_000 < p.stat().st_size < 6_000][:18]
    for i, path in enumerate(small):
        shutil.copy(path, root / "corpus" / f"{i:02d}_{path.name}")
    return root


@pytest.fixture(scope="module")
def ranks(quick_zoo: Path, files: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], ...]:
    """What rank 0 and rank 1 saw, from one two-process launch."""
    out = tmp_path_factory.mktemp("distributed-out")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(SCRIPT.parent)}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(SCRIPT),
               str(quick_zoo), str(files), str(out)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        lines = [line for line in (done.stdout + done.stderr).splitlines() if "Loading weights" not in line]
        pytest.fail(f"the two-process run failed ({done.returncode}):\n" + "\n".join(lines[-60:]))
    seen = tuple(json.loads((out / f"rank{r}.json").read_text()) for r in range(2))
    return (*seen, {"out": out})  # type: ignore[return-value]


@pytest.fixture(scope="module")
def alone(quick_zoo: Path, files: Path) -> dict[str, Any]:
    """The same decodings in one process, on the whole target."""
    from specdec.checkpoints import load_tokenizer

    target = load_causal_lm(quick_zoo / "target")
    tokenizer = load_tokenizer(quick_zoo / "target")
    ids = prompts(quick_zoo)
    seen: dict[str, Any] = {"ids": ids}
    for name, make in drafters(quick_zoo, files).items():
        if name == "draft-model-sharded":  # alone, the same draft model whole
            make = lambda: specdec.make_drafter("draft-model", model=str(files / "draft"))  # noqa: E731
        seen[name] = [specdec.generate(target, p, drafter=make(), max_new_tokens=NEW, tokenizer=tokenizer).tokens
                      for p in ids]
    return seen


FAMILIES = ["plain", "ngram", "suffix", "lookahead", "medusa+tree", "draft-model", "draft-model+tree", "draft-model-sharded",
            "draft-model-xtok", "eagle", "eagle+tree", "eagle3", "mtp", "dflash"]


def test_the_target_is_sharded(ranks):
    assert ranks[0]["sharded"] == ranks[1]["sharded"] == "DTensor"


@pytest.mark.parametrize("name", FAMILIES)
def test_greedy_tokens_of_the_sharded_target_equal_one_process(ranks, alone, name):
    assert ranks[0][f"greedy/{name}"] == ranks[1][f"greedy/{name}"] == alone[name]


@pytest.mark.parametrize("name", ["plain", "ngram", "draft-model", "eagle"])
def test_batches_of_the_sharded_target_equal_one_process(ranks, alone, name):
    assert ranks[0][f"batch-greedy/{name}"] == ranks[1][f"batch-greedy/{name}"] == alone[name]


@pytest.mark.parametrize("name", FAMILIES)
def test_ranks_given_different_seeds_or_none_emit_the_same_tokens(ranks, alone, name):
    for kind in ("sampled", "unseeded"):
        assert ranks[0][f"{kind}/{name}"] == ranks[1][f"{kind}/{name}"]
    assert ranks[0][f"sampled/{name}"] != alone[name]  # sampling, not greedy decoding
    if name in ("plain", "ngram", "draft-model", "eagle"):
        assert ranks[0][f"batch-sampled/{name}"] == ranks[1][f"batch-sampled/{name}"]


@pytest.mark.parametrize("name", ["draft-model", "draft-model+tree", "eagle"])
def test_the_leaders_verification_rule_decides_on_every_rank(ranks, name):
    """Rank 0 asks for block or traversal verification, rank 1 for token-wise with another seed:
    the leader's rule and seed hold on both (a tree's walk decides which rows each rank computes),
    so both emit the same tokens, alone and in batches."""
    assert ranks[0][f"rule/{name}"] == ranks[1][f"rule/{name}"]
    assert ranks[0][f"batch-rule/{name}"] == ranks[1][f"batch-rule/{name}"]


def test_a_rank_that_drafts_or_draws_differently_still_emits_rank_zeros_tokens(ranks, alone):
    assert ranks[0]["skewed/draft"] == ranks[1]["skewed/draft"] == alone["ngram"][0]
    assert ranks[0]["skewed/draws"] == ranks[1]["skewed/draws"]


def test_the_check_passes_agreeing_ranks_and_names_the_rank_that_differs(ranks):
    assert ranks[0]["checked/ngram"] == ranks[1]["checked/ngram"]
    drafted, drew = ranks[0]["caught/draft"], ranks[0]["caught/draws"]
    assert drafted is not None and drafted.startswith("rank 1 disagrees with rank 0 on the drafts of step 0")
    assert drew is not None and drew.startswith("rank 1 disagrees with rank 0 on the verdicts of step")
    assert ranks[1]["caught/draft"] == drafted and ranks[1]["caught/draws"] == drew  # every rank raised


@pytest.mark.parametrize("name", ["plain", "ngram", "draft-model", "draft-model+tree"])
def test_pipeline_stages_are_exact_with_explicit_masks_and_positions(ranks, alone, name):
    assert ranks[0][f"pipeline/{name}"] == ranks[1][f"pipeline/{name}"] == alone[name]
    assert ranks[0]["pipeline/batch-ngram"] == alone["ngram"]


def test_a_pipeline_target_refuses_drafters_that_read_hidden_states(ranks):
    message = ranks[0]["pipeline/eagle-refused"]
    assert message is not None and "pipeline-parallel stages" in message and "--tp" in message


def test_the_command_line_prints_on_rank_zero_only(ranks):
    assert ranks[0]["cli/status"] == ranks[1]["cli/status"] == 0
    assert ranks[0]["cli/stdout"].count("--- prompt") == 3 and "--- batch of 3" in ranks[0]["cli/stdout"]
    assert ranks[1]["cli/stdout"] == ""


def test_two_process_training_matches_one_process(ranks, quick_zoo, files, tmp_path):
    out = ranks[2]["out"]
    assert ranks[0]["train/status"] == ranks[1]["train/status"] == 0
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]  # no staging directory left
    assert cli.main(["train", "draft-model", "--target", str(quick_zoo / "target"), "--data", str(files / "corpus"),
                     "--out", str(tmp_path / "alone"), *TRAIN_FLAGS]) == 0
    two, one = load_file(out / "trained" / "model.safetensors"), load_file(tmp_path / "alone" / "model.safetensors")
    assert two.keys() == one.keys()
    for key in one:
        torch.testing.assert_close(two[key], one[key], rtol=1e-4, atol=1e-5, msg=key)


def test_tp_without_a_process_group_or_with_heads_it_cannot_split_is_refused(quick_zoo, monkeypatch, capsys):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert cli.main(["generate", "--target", str(quick_zoo / "target"), "--tp", "2", "x"]) == 2
    assert "--tp 2 needs a process group of 2 processes; launch with torchrun --nproc_per_node 2" in \
        capsys.readouterr().err
    assert cli.main(["generate", "--target", str(quick_zoo / "target"), "--check-ranks", "x"]) == 2
    assert "--check-ranks compares the ranks holding a sharded target; give --tp N" in capsys.readouterr().err
    config = load_causal_lm(quick_zoo / "target").config
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(ValueError, match=r"--tp 3 does not divide the model's num_attention_heads \(4\)"):
        check_tensor_parallel(config, 3)
    with pytest.raises(ValueError, match="torchrun started 3; launch with --nproc_per_node 2"):
        check_tensor_parallel(config, 2)


def test_a_draft_and_a_verdict_survive_their_packing():
    extra = ExtraRows(torch.tensor([7, 8]), torch.tensor([1, 2]), torch.tensor([[True, False], [True, True]]))
    tree = Draft(torch.tensor([4, 5, 6]), parents=torch.tensor([-1, 0, 0]), extra=extra)
    packed = _pack_draft(tree, [-1, 0, 0], nodes=5, extra_rows=3)
    draft, parents, own = _unpack_draft(packed, 5, 3, torch.device("cpu"))
    assert parents == [-1, 0, 0] and not own and draft.tokens.tolist() == [4, 5, 6] and draft.probs is None
    assert draft.extra is not None and draft.extra.tokens.tolist() == [7, 8]
    assert draft.extra.visible.tolist() == [[True, False], [True, True]] and draft.extra.positions.tolist() == [1, 2]
    chain = _unpack_draft(_pack_draft(Draft(torch.tensor([9])), None, 5, 0), 5, 0, torch.device("cpu"))
    assert chain[0].tokens.tolist() == [9] and chain[1] is None and chain[0].extra is None
    verdict = specdec.Verdict(torch.tensor([4, 6, 2]), 2, path=(0, 2))
    assert _pack_verdict(verdict, 3, 5, torch.device("cpu")).tolist() == [2, 3, 4, 6, 2, -1, -1, -1, 0, 2, -1, -1, -1]


def test_explicit_masks_and_positions_leave_a_whole_model_exact(quick_zoo):
    """The forwards a pipelined model gets (a 4D causal mask and position ids on every forward)
    decode what the model's own causal forwards decode."""
    from specdec.runtime.forward import is_pipelined
    from specdec.runtime.target import CausalLM

    model = load_causal_lm(quick_zoo / "target")
    ids = prompts(quick_zoo)[0]
    expected = specdec.generate(model, ids, drafter="ngram", max_new_tokens=NEW).tokens
    lm = CausalLM(model)
    assert not is_pipelined(model) and not lm.pipelined
    lm.pipelined = True
    assert specdec.generate(lm, ids, drafter="ngram", max_new_tokens=NEW).tokens == expected
    model.hf_device_map = {"model.embed_tokens": "cpu", "model.layers": 0, "lm_head": "disk"}
    try:
        assert is_pipelined(model)
    finally:
        del model.hf_device_map
