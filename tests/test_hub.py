"""Hub ids wherever a checkpoint directory is taken, resolved offline from a hub cache that the
tests lay out on disk by hand (refs/main -> a commit, snapshots/<commit>/ linking into blobs/)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

import specdec
from specdec import cli
from specdec.checkpoints import load_causal_lm, resolve_checkpoint
from specdec.drafters.feature_heads.medusa_head import MedusaHeads
from specdec.drafters.feature_heads.medusa_files import load_medusa, save_medusa
from specdec.drafters.feature_heads.mtp import load_mtp
from tiny import tiny_model

WORDS = "the cat sat on a mat and dog ran to park when rain had stopped".split()
PROMPT = "the cat sat on the"


def word_tokenizer() -> PreTrainedTokenizerFast:
    """A word-level tokenizer over WORDS (trained offline), with an EOS token."""
    backend = Tokenizer(models.WordLevel(unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.train_from_iterator([" ".join(WORDS)], trainers.WordLevelTrainer(special_tokens=["<unk>", "</s>"]))
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", eos_token="</s>")


def into_hub_cache(cache: Path, repo: str, source: Path) -> str:
    """Lay `source`'s files out in `cache` as huggingface_hub stores repo `repo` at main; the commit hash."""
    commit = hashlib.sha1(repo.encode()).hexdigest()
    root = cache / f"models--{repo.replace('/', '--')}"
    snapshot = root / "snapshots" / commit
    (root / "blobs").mkdir(parents=True)
    for file in sorted(p for p in source.rglob("*") if p.is_file()):
        data = file.read_bytes()
        blob = root / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        link = snapshot / file.relative_to(source)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(commit)
    return commit


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny target with its tokenizer and Medusa heads for it, each in a directory of its own."""
    root = tmp_path_factory.mktemp("checkpoints")
    tokenizer = word_tokenizer()
    target = tiny_model("llama", vocab_size=len(tokenizer), seed=5, dtype=torch.float64)
    target.save_pretrained(root / "target")
    tokenizer.save_pretrained(root / "target")
    torch.manual_seed(1)
    heads = MedusaHeads(2, 1, target.config.hidden_size, len(tokenizer)).double()
    save_medusa(heads, root / "medusa")
    return {"target": root / "target", "medusa": root / "medusa"}


@pytest.fixture()
def hub(saved: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An offline hub cache holding org/tiny (the target) and org/medusa-x (its heads)."""
    cache = tmp_path / "hub"
    for repo, name in (("org/tiny", "target"), ("org/medusa-x", "medusa")):
        into_hub_cache(cache, repo, saved[name])
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)  # no ./org/tiny directory shadows the id
    return cache


def generated(capsys: pytest.CaptureFixture[str], target: str, *extra: str) -> str:
    argv = ["generate", "--target", target, "--dtype", "float64", "--max-new-tokens", "12", *extra, PROMPT]
    assert cli.main(argv) == 0, capsys.readouterr().err
    return capsys.readouterr().out.splitlines()[0]  # the text; the stats line has timings


def test_hub_id_resolves_to_the_snapshot_of_refs_main(hub: Path, saved: dict[str, Path]):
    snapshot = resolve_checkpoint("org/tiny", "target")
    commit = (hub / "models--org--tiny" / "refs" / "main").read_text()
    assert snapshot == hub / "models--org--tiny" / "snapshots" / commit
    assert resolve_checkpoint(f"org/tiny@{commit}", "target") == snapshot
    assert (snapshot / "config.json").read_bytes() == (saved["target"] / "config.json").read_bytes()
    assert resolve_checkpoint(saved["target"], "target") == saved["target"]  # a directory stays as is


def test_generate_by_hub_id_prints_the_tokens_of_the_directory(hub: Path, saved: dict[str, Path],
                                                             capsys: pytest.CaptureFixture[str]):
    from_directory = generated(capsys, str(saved["target"]))
    assert generated(capsys, "org/tiny") == from_directory
    assert generated(capsys, "org/tiny", "--drafter", "draft-model:model=org/tiny") == from_directory
    assert generated(capsys, "org/tiny", "--drafter", "medusa:path=org/medusa-x") == from_directory


def test_python_loaders_take_hub_ids(hub: Path, saved: dict[str, Path]):
    by_id, by_directory = load_causal_lm("org/tiny").state_dict(), load_causal_lm(saved["target"]).state_dict()
    assert by_id.keys() == by_directory.keys() and all(torch.equal(by_id[k], by_directory[k]) for k in by_id)
    drafter = specdec.make_drafter("medusa", path="org/medusa-x")
    heads, expected = drafter.heads.state_dict(), load_medusa(saved["medusa"]).state_dict()
    assert heads.keys() == expected.keys() and all(torch.equal(heads[k], expected[k]) for k in heads)
    with pytest.raises(ValueError, match=r"models--org--tiny/snapshots/\w+/model\.safetensors holds no MTP"):
        load_mtp("org/tiny")  # resolved to the snapshot, which has no MTP module


def test_missing_hub_id_says_where_it_looked_and_what_to_do(hub: Path, capsys: pytest.CaptureFixture[str]):
    with pytest.raises(FileNotFoundError) as error:
        resolve_checkpoint("org/absent", "medusa heads")
    message = str(error.value)
    assert message.startswith("medusa heads 'org/absent'") and repr(str(hub)) in message
    assert str(Path.cwd() / "org" / "absent") in message and "offline mode on" in message
    assert "hf download org/absent" in message and "unset HF_HUB_OFFLINE" in message
    assert cli.main(["generate", "--target", "org/absent", PROMPT]) == 2
    err = capsys.readouterr().err
    assert err.startswith("specdec: error: --target 'org/absent'") and str(hub) in err and err.count("\n") == 1


def test_a_path_that_is_no_directory_nor_hub_id_is_refused(hub: Path, tmp_path: Path):
    with pytest.raises(FileNotFoundError, match=r"'/no/such/dir' is not a directory .* not a hub id"):
        resolve_checkpoint("/no/such/dir", "target")
    (tmp_path / "file").write_text("not a checkpoint")
    with pytest.raises(FileNotFoundError, match="is not a directory"):
        resolve_checkpoint(tmp_path / "file", "target")


def test_unreachable_hub_falls_back_to_the_cache(hub: Path, monkeypatch: pytest.MonkeyPatch):
    from huggingface_hub import constants

    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # refused at once
    assert resolve_checkpoint("org/tiny", "target").parent == hub / "models--org--tiny" / "snapshots"
    with pytest.raises(FileNotFoundError, match="offline mode off; the hub answered: .*ConnectError"):
        resolve_checkpoint("org/absent", "target")


# --- what a hub repository is asked for: only the files the checkpoint's loader reads ---------------


class FakeHub:
    """`snapshot_download` over repositories given as lists of file names: each call is recorded
    with its patterns, and the files they match (huggingface_hub's own matching) are laid out in
    the repository's snapshot directory, as a download would."""

    def __init__(self, root: Path, repos: dict[str, list[str]]) -> None:
        self.root, self.repos = root, repos
        self.calls: list[tuple[str, tuple[str, ...] | None]] = []

    def __call__(self, repo_id: str, *, revision=None, cache_dir=None, local_files_only=False,
                 allow_patterns=None) -> str:
        from huggingface_hub.utils import filter_repo_objects

        self.calls.append((repo_id, None if allow_patterns is None else tuple(allow_patterns)))
        snapshot = self.root / repo_id.replace("/", "--")
        snapshot.mkdir(parents=True, exist_ok=True)
        for name in filter_repo_objects(self.repos[repo_id], allow_patterns=allow_patterns):
            (snapshot / name).parent.mkdir(parents=True, exist_ok=True)
            (snapshot / name).write_text("not really weights")
        return str(snapshot)

    def fetched(self, repo: str) -> set[str]:
        snapshot = self.root / repo.replace("/", "--")
        return {str(p.relative_to(snapshot)) for p in snapshot.rglob("*") if p.is_file()}


TOKENIZER = ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
             "chat_template.jinja"]
NEVER = ["README.md", ".gitattributes", "tf_model.h5", "flax_model.msgpack", "rust_model.ot", "onnx/model.onnx",
         "onnx/model_q4.onnx", "model.Q4_K_M.gguf", "original/consolidated.00.pth", "consolidated.safetensors",
         "runs/events.out.tfevents", "training_args.bin"]


@pytest.fixture()
def fake_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeHub:
    import huggingface_hub

    hub = FakeHub(tmp_path / "hub", {
        "org/both-formats": ["config.json", "generation_config.json", "model.safetensors", "pytorch_model.bin",
                             *TOKENIZER, *NEVER],
        "org/sharded": ["config.json", "model.safetensors.index.json", "model-00001-of-00002.safetensors",
                        "model-00002-of-00002.safetensors", "pytorch_model.bin.index.json",
                        "pytorch_model-00001-of-00002.bin", "pytorch_model-00002-of-00002.bin", *TOKENIZER, *NEVER],
        "org/pickled": ["config.json", "pytorch_model-00001-of-00002.bin", "pytorch_model-00002-of-00002.bin",
                        "pytorch_model.bin.index.json", "tokenizer.model", "tokenizer_config.json", *NEVER],
        "org/medusa": ["config.json", "medusa_lm_head.pt", *NEVER],
        "org/eagle": ["config.json", "pytorch_model.bin", *NEVER],
        "org/eagle3": ["config.json", "model.safetensors", "pytorch_model.bin", *NEVER],
        "org/mtp": ["config.json", "model.safetensors.index.json", "model-00001-of-00002.safetensors",
                    "model-00002-of-00002.safetensors", *TOKENIZER, *NEVER],
    })
    monkeypatch.setattr(huggingface_hub, "snapshot_download", hub)
    monkeypatch.chdir(tmp_path)  # no ./org/... directory shadows an id
    return hub


@pytest.mark.parametrize("repo, weights", [
    ("org/both-formats", {"generation_config.json", "model.safetensors"}),  # never the pickle beside them
    ("org/sharded", {"model.safetensors.index.json", "model-00001-of-00002.safetensors",
                     "model-00002-of-00002.safetensors"}),
])
def test_a_model_repository_gives_its_config_weights_and_tokenizer_only(fake_hub: FakeHub, repo: str, weights):
    snapshot = resolve_checkpoint(repo, "target")
    assert fake_hub.fetched(repo) == {"config.json", *weights, *TOKENIZER}
    assert snapshot == fake_hub.root / repo.replace("/", "--")
    assert len(fake_hub.calls) == 1 and None not in (patterns for _, patterns in fake_hub.calls)


def test_a_repository_with_pytorch_weights_only_gives_those(fake_hub: FakeHub):
    from specdec.checkpoints import MODEL_FILES

    resolve_checkpoint("org/pickled", "target")
    assert fake_hub.fetched("org/pickled") == {"config.json", "pytorch_model-00001-of-00002.bin",
                                               "pytorch_model-00002-of-00002.bin", "pytorch_model.bin.index.json",
                                               "tokenizer.model", "tokenizer_config.json"}
    asked = [set(patterns or ()) for _, patterns in fake_hub.calls]
    assert len(asked) == 2 and asked[0] | asked[1] == set(MODEL_FILES) and not asked[0] & asked[1]
    assert all(pattern.endswith(".bin") or pattern.endswith(".bin.index.json") for pattern in asked[1])


def test_a_tokenizer_repository_gives_no_weights(fake_hub: FakeHub):
    from specdec.checkpoints import load_tokenizer

    with pytest.raises(Exception):  # the fake files are no tokenizer; what was fetched is the point
        load_tokenizer("org/both-formats")
    assert fake_hub.fetched("org/both-formats") == {"config.json", *TOKENIZER}


def _export_medusa(tmp: Path) -> None:
    from specdec.export import export

    export("medusa", "org/medusa", "vllm", tmp / "out")


@pytest.mark.parametrize("repo, load, wanted", [
    ("org/medusa", lambda tmp: load_medusa("org/medusa"), {"config.json", "medusa_lm_head.pt"}),
    ("org/medusa", _export_medusa, {"config.json", "medusa_lm_head.pt"}),
    ("org/eagle", lambda tmp: specdec.make_drafter("eagle", path="org/eagle"), {"config.json", "pytorch_model.bin"}),
    ("org/eagle3", lambda tmp: specdec.make_drafter("eagle3", path="org/eagle3"), {"config.json", "model.safetensors"}),
    ("org/mtp", lambda tmp: load_mtp("org/mtp"), {"config.json", "model.safetensors.index.json",
                                                  "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}),
    ("org/both-formats", lambda tmp: specdec.make_drafter("draft-model", model="org/both-formats"),
     {"config.json", "generation_config.json", "model.safetensors", *TOKENIZER}),
    ("org/both-formats", lambda tmp: cli.main(["generate", "--target", "org/both-formats", PROMPT]),
     {"config.json", "generation_config.json", "model.safetensors", *TOKENIZER}),
])
def test_each_loader_asks_a_hub_repository_for_its_own_files_only(fake_hub: FakeHub, tmp_path: Path, repo: str, load,
                                                                  wanted: set[str]):
    try:
        load(tmp_path)
    except Exception:  # the fake files hold no tensors; what was fetched is the point
        pass
    assert fake_hub.fetched(repo) == wanted
    assert fake_hub.calls and all(patterns for _, patterns in fake_hub.calls)


def test_files_must_be_patterns():
    with pytest.raises(ValueError, match="glob patterns"):
        resolve_checkpoint("org/tiny", "target", files="config.json")
