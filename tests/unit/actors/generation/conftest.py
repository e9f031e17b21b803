"""The tiny tool model's tokenizer (orchestrator/builtin/models/tools.py: TRL's Qwen2.5 template and response template),
built once for the module's tests, loaded as a checkpoint loads it (AutoTokenizer: Qwen2Tokenizer)."""

from __future__ import annotations

import json

import pytest


@pytest.fixture(scope="session")
def tool_tokenizer(tmp_path_factory):
    from transformers import AutoTokenizer

    from orchestrator.builtin.models.tools import _build_tokenizer

    out = tmp_path_factory.mktemp("tool-tokenizer")
    _build_tokenizer(out)
    (out / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    return AutoTokenizer.from_pretrained(out)
