"""Whether a drafter fits the `--target` checkpoint it is exported for, read from its config.json."""

from __future__ import annotations

from pathlib import Path

from transformers import AutoConfig, PretrainedConfig

__all__ = ["check_target_sizes", "target_config"]


def target_config(target: Path) -> PretrainedConfig:
    """The target's text config (its `architectures` filled from the top level)."""
    if not (target / "config.json").is_file():
        raise FileNotFoundError(f"export: --target {str(target)!r} is not a model directory (no config.json)")
    config = AutoConfig.from_pretrained(str(target), local_files_only=True)
    text = config.get_text_config()
    text.architectures = getattr(text, "architectures", None) or config.architectures
    return text


def check_target_sizes(kind: str, src: Path, hidden: int, vocab: int, target: Path) -> None:
    """Raise naming both sizes when the drafter's hidden size or vocabulary differs from the target's."""
    config = target_config(target)
    for name, ours, theirs in (("hidden size", hidden, config.hidden_size), ("vocabulary", vocab, config.vocab_size)):
        if ours != theirs:
            raise ValueError(f"export: the {kind} drafter at {str(src)!r} has {name} {ours} but --target "
                             f"{str(target)!r} has {theirs}; export a drafter trained for this target")
