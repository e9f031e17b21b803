"""The tiny tool model: its tokenizer loads the same through every path, TRL accepts its chat template and
parses its calls, rollouts built token by token equal the template's rendering, and the warmed-up model
writes well-formed calls and sometimes, not always, solves the box task."""

from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer
from transformers import AutoTokenizer, PreTrainedTokenizerFast
from trl.chat_template_utils import (
    add_response_schema,
    is_chat_template_prefix_preserving,
    parse_response,
    supports_tool_calling,
)

from orchestrator.builtin.models.tools import (
    FINAL_ANSWER,
    TOOL_TOKENS,
    _build_tokenizer,
    chat_template,
    completion_ids,
    ensure_tiny_tool_model,
    episode_ids,
    episode_messages,
    play,
    task_tools,
)
from orchestrator.builtin.tasks.boxes import boxes_dataset

# Floors well below what the warmed-up model reaches at T=1 (bench/README.md, "Tool calls"), so a
# broken build (no calls, or a template the parser cannot read) fails and sampling noise does not.
MIN_CALL_RATE = 0.5
SAMPLES = 16


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    """The tool model's tokenizer files next to a qwen2 config.json, as in the checkpoint (that config is what
    makes AutoTokenizer load Qwen2Tokenizer)."""
    out = tmp_path_factory.mktemp("tok")
    _build_tokenizer(out)
    (out / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    return out


@pytest.fixture(scope="module")
def tok(tok_dir):
    return AutoTokenizer.from_pretrained(tok_dir)


def task_texts(tok) -> list[str]:
    rows = boxes_dataset(size=8, seed=5)
    texts = [tok.apply_chat_template(r["prompt"] + episode_messages(r, 1 + k % 4), tools=task_tools(), tokenize=False)
             for k, r in enumerate(rows)]
    return texts + ["0123456789 10 007 3.14 -42 1e9 ９", '{"name": "open_box", "arguments": {"box": 12}}',
                    "café  naïve\n\n\tx  y", "It's 5 o'clock; don't   stop!"]


def test_every_loader_tokenizes_alike(tok, tok_dir):
    assert type(tok).__name__ == "Qwen2Tokenizer"  # rebuilt from Qwen's regex + NFC, not read from tokenizer.json
    raw = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    fast = PreTrainedTokenizerFast.from_pretrained(tok_dir)
    for text in task_texts(tok):
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert (ids == raw.encode(text, add_special_tokens=False).ids
                == fast(text, add_special_tokens=False)["input_ids"])
        assert tok.decode(ids) == raw.decode(ids, skip_special_tokens=False) == fast.decode(ids)


def test_digits_are_single_tokens(tok):
    assert [tok.decode([i]) for i in tok("code 583", add_special_tokens=False)["input_ids"]][-3:] == ["5", "8", "3"]


def test_tool_tags_are_single_non_special_tokens(tok):
    for tag in TOOL_TOKENS:
        ids = tok(tag, add_special_tokens=False)["input_ids"]
        assert len(ids) == 1 and ids[0] not in tok.all_special_ids
    assert tok.decode(tok("<tool_call>x</tool_call><|im_end|>")["input_ids"], skip_special_tokens=True) == (
        "<tool_call>x</tool_call>")


def test_trl_accepts_the_chat_template(tok_dir):
    fresh = AutoTokenizer.from_pretrained(tok_dir)
    assert fresh.chat_template == chat_template()
    assert supports_tool_calling(fresh)
    assert is_chat_template_prefix_preserving(fresh)
    saved = fresh.response_template
    fresh.response_template = None
    add_response_schema(fresh)  # raises for a template TRL does not know
    assert fresh.response_template == saved  # the checkpoint ships the one TRL would set


def test_parse_response_reads_a_call_as_sampled(tok):
    row = boxes_dataset(size=1, seed=0)[0]
    prompt = tok.apply_chat_template(row["prompt"], tools=task_tools(), add_generation_prompt=True, tokenize=True,
                                     return_dict=False)
    call = episode_messages(row, 2)[0]
    parsed = parse_response(tok, completion_ids(tok, call), prefix=prompt, tools=task_tools())
    assert parsed["tool_calls"] == call["tool_calls"]  # {"box": 2}: an int, as the schema types it
    done = parse_response(tok, completion_ids(tok, {"role": "assistant", "content": FINAL_ANSWER}), prefix=prompt)
    assert done == {"role": "assistant", "content": FINAL_ANSWER}


@pytest.mark.parametrize("with_tools", [False, True])
def test_rollout_ids_equal_the_rendered_conversation(tok, with_tools):
    """Prompt ids + sampled ids + rendered tool deltas (how TRL's loop and the warm-up build sequences) are
    the template's own tokenization of the whole conversation: no seam drifts."""
    tools = task_tools() if with_tools else None
    for k, row in enumerate(boxes_dataset(size=4, seed=7)):
        messages = episode_messages(row, 1 + k)
        ids, mask = episode_ids(tok, row["prompt"], messages, tools)
        full = tok.apply_chat_template(row["prompt"] + messages, tools=tools, tokenize=True, return_dict=False)
        assert full[: len(ids)] == ids and tok.decode(full[len(ids):]) == "\n"  # the template's newline after the end
        trained = tok.decode([t for t, m in zip(ids, mask, strict=True) if m])
        assert trained.count("<tool_call>") == 2 and trained.endswith(FINAL_ANSWER + "<|im_end|>")
        assert "<tool_response>" not in trained


@pytest.fixture(scope="module")
def model_and_tok():
    from transformers import AutoModelForCausalLM

    path = ensure_tiny_tool_model()  # cached; the first build takes tens of seconds
    return AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)


@pytest.mark.slow
def test_checkpoint_is_the_tiny_architecture(model_and_tok):
    model, tok = model_and_tok
    c = model.config
    head_dim = c.hidden_size // c.num_attention_heads  # vLLM CPU attention needs 64
    assert (c.model_type, c.hidden_size, c.num_hidden_layers, head_dim, c.vocab_size) == ("qwen2", 128, 2, 64, 512)
    assert len(tok) == c.vocab_size and type(tok).__name__ == "Qwen2Tokenizer"


@pytest.mark.slow
def test_warmed_up_model_calls_tools_and_sometimes_succeeds(model_and_tok):
    model, tok = model_and_tok
    eps = play(model, tok, boxes_dataset(size=SAMPLES // 4, seed=11), num_samples=4, seed=0)
    first = [e["turns"][0].get("tool_calls") or [] for e in eps]
    well_formed = [c for c in first if c and c[0]["function"]["name"] == "open_box"]
    assert len(well_formed) >= MIN_CALL_RATE * len(eps), [e["turns"][0] for e in eps]
    assert all(isinstance(c[0]["function"]["arguments"].get("box"), int) for c in well_formed)
    solved = sum(e["reward"] for e in eps)
    assert 0 < solved < len(eps)  # GRPO has a signal and room
