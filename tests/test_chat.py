"""Chat templates: multi-turn prompts with earlier answers as assistant turns, raw text without
a template, `generate --chat`, and the bench recording which format it used."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

import specdec
from specdec import cli
from specdec.bench.questions import turn_prompt
from specdec.bench.session import BenchConfig, turn_encoder, used_prompt_format
from specdec.data.chat import CHAT, RAW, chat_ids, conversation, prompt_format
from tiny import tiny_model

WORDS = "the cat sat on a mat and dog ran to park when rain had stopped what did it do then".split()
SPECIALS = ["<unk>", "<s>", "</s>", "<|user|>", "<|assistant|>"]
TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} {% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def word_tokenizer(template: str | None = TEMPLATE) -> PreTrainedTokenizerFast:
    """A word-level tokenizer that prepends <s> when adding special tokens, with `template`."""
    backend = Tokenizer(models.WordLevel(unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.train_from_iterator([" ".join(WORDS)], trainers.WordLevelTrainer(special_tokens=SPECIALS))
    bos = backend.token_to_id("<s>")
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", bos)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", bos_token="<s>",
                                        eos_token="</s>")
    tokenizer.chat_template = template
    return tokenizer


@pytest.fixture(scope="module")
def targets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The same tiny model saved twice: with a chat-template tokenizer and with a plain one."""
    root = tmp_path_factory.mktemp("chat")
    model = tiny_model("llama", vocab_size=len(word_tokenizer()), seed=3, dtype=torch.float64)
    for name, template in (("chat", TEMPLATE), ("plain", None)):
        model.save_pretrained(root / name)
        word_tokenizer(template).save_pretrained(root / name)
    return {"chat": root / "chat", "plain": root / "plain"}


def test_later_turns_carry_earlier_answers_as_assistant_turns():
    turns, answers = ("the cat sat", "what did it do then"), ["it ran to the park"]
    assert conversation(turns, answers, 1) == [{"role": "user", "content": "the cat sat"},
                                               {"role": "assistant", "content": "it ran to the park"},
                                               {"role": "user", "content": "what did it do then"}]
    tokenizer = word_tokenizer()
    ids = chat_ids(tokenizer, conversation(turns, answers, 1))
    expected = ("<s> <|user|> the cat sat <|assistant|> it ran to the park <|user|> what did it do then "
                "<|assistant|>")
    assert tokenizer.decode(ids) == expected
    assert ids.count(tokenizer.bos_token_id) == 1 and ids[0] == tokenizer.bos_token_id  # the template's BOS only
    with pytest.raises(ValueError, match="turn 1 needs turns"):
        conversation(turns, [], 1)


def test_bench_turns_use_the_template_when_there_is_one_and_raw_text_otherwise(tmp_path: Path):
    questions = tmp_path / "question.jsonl"
    questions.write_text('{"question_id": 1, "turns": ["the cat"]}\n')
    with_template, without = word_tokenizer(), word_tokenizer(None)
    spec_bench = BenchConfig(target=tmp_path, drafters=(), prompts=questions)
    assert used_prompt_format(spec_bench, with_template) == CHAT
    assert used_prompt_format(spec_bench, without) == RAW
    assert used_prompt_format(BenchConfig(target=tmp_path, drafters=()), with_template) == RAW  # code completions
    assert prompt_format(with_template, "raw") == RAW
    with pytest.raises(ValueError, match="needs a chat template.*tokenizer.chat_template is None"):
        prompt_format(without, CHAT)
    turns, answers = ("the cat sat", "what did it do then"), [" it ran"]  # a continuation
    raw = turn_encoder(without, RAW)(turns, answers, 1)
    assert raw == without(turn_prompt(turns, answers, 1), add_special_tokens=False)["input_ids"]
    assert without.decode(raw) == "the cat sat it ran what did it do then"
    chat = turn_encoder(with_template, CHAT)(turns, answers, 1)
    assert chat == chat_ids(with_template, conversation(turns, answers, 1)) and chat != raw


def test_generate_chat_feeds_the_templated_prompt(targets: dict[str, Path], capsys: pytest.CaptureFixture[str]):
    argv = ["generate", "--target", str(targets["chat"]), "--dtype", "float64", "--max-new-tokens", "10",
            "--drafter", "ngram", "--chat", "the cat sat"]
    assert cli.main(argv) == 0, capsys.readouterr().err
    text = capsys.readouterr().out.splitlines()[0]
    tokenizer = word_tokenizer()
    model = specdec.checkpoints.load_causal_lm(targets["chat"])
    prompt = chat_ids(tokenizer, [{"role": "user", "content": "the cat sat"}])
    tokens = specdec.generate(model, prompt, max_new_tokens=10, eos_token_id=[tokenizer.eos_token_id]).tokens
    assert text == tokenizer.decode(tokens, skip_special_tokens=True)


def test_generate_chat_without_a_template_names_the_fix(targets: dict[str, Path],
                                                        capsys: pytest.CaptureFixture[str]):
    assert cli.main(["generate", "--target", str(targets["plain"]), "--chat", "the cat"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--chat" in err and "no chat template" in err and "drop --chat" in err


def bench(target: Path, out: Path, questions: Path, *extra: str) -> int:
    return cli.main(["bench", "--target", str(target), "--prompts", str(questions), "--drafter", "ngram",
                     "--k", "2", "--no-peers", "--engine", "eager", "--repeats", "1", "--warmup", "0",
                     "--max-new-tokens", "4", "--dtype", "float64", "--out", str(out), "--no-progress", *extra])


def test_results_json_records_the_prompt_format(targets: dict[str, Path], tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]):
    questions = tmp_path / "question.jsonl"
    questions.write_text('{"question_id": 1, "category": "chat", "turns": ["the cat sat", "what did it do"]}\n')
    for target, extra, expected in (("chat", (), CHAT), ("plain", (), RAW), ("chat", ("--prompt-format", "raw"), RAW)):
        out = tmp_path / f"{target}-{expected}"
        assert bench(targets[target], out, questions, *extra) == 0, capsys.readouterr().err
        assert json.loads((out / "results.json").read_text())["settings"]["prompt_format"] == expected
        assert f"{expected} prompts" in capsys.readouterr().out
    assert bench(targets["plain"], tmp_path / "refused", questions, "--prompt-format", CHAT) == 2
    assert "needs a chat template" in capsys.readouterr().err and not (tmp_path / "refused").exists()
