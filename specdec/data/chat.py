"""Prompts for chat models: a conversation through the tokenizer's chat template, or raw text.

A template renders the messages to text (`add_generation_prompt=True`, so the text ends where
the assistant's answer starts); the text is then encoded without adding special tokens, since
a template writes its own BOS where the model expects one.
"""

from __future__ import annotations

from typing import Any

__all__ = ["CHAT", "PROMPT_FORMATS", "RAW", "chat_ids", "conversation", "has_chat_template", "prompt_format"]

CHAT = "chat-template"
RAW = "raw"
PROMPT_FORMATS = ("auto", CHAT, RAW)  # what a user may ask for; auto: the template when there is one


def has_chat_template(tokenizer: Any) -> bool:
    """Whether the tokenizer carries a chat template (`tokenizer.chat_template` is set)."""
    return getattr(tokenizer, "chat_template", None) is not None


def prompt_format(tokenizer: Any, requested: str = "auto") -> str:
    """The format used for `requested`: CHAT or RAW; auto picks CHAT when the tokenizer has a template.

    Raises ValueError for an unknown format, or CHAT for a tokenizer without a template.
    """
    if requested not in PROMPT_FORMATS:
        raise ValueError(f"prompt format {requested!r} is not one of {', '.join(PROMPT_FORMATS)}")
    if requested == CHAT and not has_chat_template(tokenizer):
        raise ValueError(f"prompt format {CHAT!r} needs a chat template, but the tokenizer has none "
                         "(tokenizer.chat_template is None); use raw prompts, or a checkpoint whose "
                         "tokenizer_config.json or chat_template.jinja holds a template")
    if requested == "auto":
        return CHAT if has_chat_template(tokenizer) else RAW
    return requested


def conversation(turns: tuple[str, ...], answers: list[str], index: int) -> list[dict[str, str]]:
    """The messages for turn `index`: each earlier turn as a user message followed by its answer
    as an assistant message, then turn `index` as a user message."""
    if not 0 <= index < len(turns) or len(answers) < index:
        raise ValueError(f"turn {index} needs turns[{index}] and {index} earlier answers; got {len(turns)} "
                         f"turns and {len(answers)} answers")
    messages: list[dict[str, str]] = []
    for turn, answer in zip(turns[:index], answers[:index]):
        messages += [{"role": "user", "content": turn}, {"role": "assistant", "content": answer}]
    return messages + [{"role": "user", "content": turns[index]}]


def chat_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """The token ids of `messages` through the tokenizer's chat template, ready for the answer."""
    from jinja2 import TemplateError

    if not has_chat_template(tokenizer):
        raise ValueError("the tokenizer has no chat template (tokenizer.chat_template is None); use raw text")
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    except TemplateError as error:
        raise ValueError(f"the tokenizer's chat template fails on {len(messages)} messages: {error}; fix "
                         "tokenizer.chat_template or use raw prompts") from None
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])
