"""The tiny model's tokenizer: the ids AutoTokenizer gives (Qwen2Tokenizer, as vLLM and the learner load it)
are the ids its own tokenizer.json gives, digits and chat markup included."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer
from transformers import AutoTokenizer

from orchestrator.tasks.letters import toy_dataset

TEXTS = ["What is 12 + 345? Answer: 357", "0123456789 007 3.14", "café  naïve\n\n\tx", "It's 5 o'clock; don't!",
         '{"name": "f", "arguments": {"x": 10}}']


def test_both_loaders_agree(tiny_model_path):
    auto = AutoTokenizer.from_pretrained(tiny_model_path)
    raw = Tokenizer.from_file(str(Path(tiny_model_path) / "tokenizer.json"))
    assert type(auto).__name__ == "Qwen2Tokenizer"
    chats = [auto.apply_chat_template([{"role": "user", "content": r["prompt"]}], add_generation_prompt=True,
                                      tokenize=False) for r in toy_dataset(size=8)]
    for text in TEXTS + chats:
        assert auto(text, add_special_tokens=False)["input_ids"] == raw.encode(text, add_special_tokens=False).ids, text
