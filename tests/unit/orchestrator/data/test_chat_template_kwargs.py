"""generation.chat_template_kwargs (TRL's GRPOConfig.chat_template_kwargs) reaches every render: the training and
eval prompts, an agentic run's first prompt and tool-result suffix, and a reward model's inputs. TRL's own
environment examples pass {"enable_thinking": False} for Qwen3: its template then opens the assistant turn with an
empty think block; without the key a Qwen3 policy rendered in thinking mode in rayward and not in TRL."""

from __future__ import annotations

from importlib import resources

import pytest
from transformers import AutoTokenizer

from actors.agents import chat
from orchestrator.config import load_config
from orchestrator.data.sources import Prompt, PromptSource, eval_prompts
from tests.conftest import ROOT

NO_THINK = "<think>\n\n</think>\n\n"
KW = {"enable_thinking": False}
MESSAGES = [{"role": "user", "content": "Open box 2 and submit its code."}]


@pytest.fixture(scope="module")
def qwen3(tiny_model_path):
    """The tiny model's tokenizer with TRL's Qwen3 chat template, verbatim."""
    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    tok.chat_template = resources.files("trl").joinpath("chat_templates/qwen3.jinja").read_text()
    return tok


def test_the_config_key_has_trls_name_and_shape():
    cfg = load_config(ROOT / "configs" / "demo.yaml", ['generation.chat_template_kwargs={"enable_thinking": false}'])
    assert cfg.generation.chat_template_kwargs == KW
    assert load_config(ROOT / "configs" / "demo.yaml").generation.chat_template_kwargs == {}


def test_training_and_eval_prompts_render_with_them(qwen3, tmp_path):
    rows = [{"prompt": MESSAGES}]
    cfg = load_config(ROOT / "configs" / "demo.yaml")
    thinking = PromptSource(rows, qwen3, cfg.data).next_batch(1)[0]
    plain = PromptSource(rows, qwen3, cfg.data, template_kwargs=KW).next_batch(1)[0]
    assert qwen3.decode(plain.prompt_ids).endswith("assistant\n" + NO_THINK)
    assert not qwen3.decode(thinking.prompt_ids).endswith(NO_THINK)
    f = tmp_path / "eval.jsonl"
    f.write_text('{"prompt": [{"role": "user", "content": "Open box 2 and submit its code."}]}\n')
    from orchestrator.config import DataSource

    (held_out,) = eval_prompts(DataSource(path=str(f)), qwen3, max_samples=None, template_kwargs=KW)
    assert isinstance(held_out, Prompt) and held_out.prompt_ids == plain.prompt_ids


def test_an_agentic_runs_renders_carry_them(qwen3):
    """prepare_tokenizer keeps them on the tokenizer (the driver's, each generator's), and every render of chat.py
    passes them: the first prompt, the tool-result suffix (TRL's _get_tool_suffix_ids passes them too)."""
    tok = AutoTokenizer.from_pretrained(qwen3.name_or_path)
    tok.chat_template = qwen3.chat_template
    chat.prepare_tokenizer(tok, KW)
    assert chat.template_kwargs(tok) == KW
    first = chat.render_prompt(tok, MESSAGES, [])
    assert tok.decode(first).endswith("assistant\n" + NO_THINK)
    suffix = tok.decode(chat.tool_suffix_ids(tok, [{"role": "tool", "name": "open_box", "content": "123"}]))
    assert suffix.endswith("assistant\n" + NO_THINK)
    chat.prepare_tokenizer(tok)  # a run without them: none
    assert not tok.decode(chat.render_prompt(tok, MESSAGES, [])).endswith(NO_THINK)


def test_reward_models_render_prompt_and_completion_with_them(qwen3, tmp_path):
    """A sequence-classification reward model's tokenizer renders prompt + completion (TRL passes its
    chat_template_kwargs there too). The template here writes a mark when it is given one."""
    from transformers import Qwen2Config, Qwen2ForSequenceClassification

    from actors.rewards.worker import _RewardModel

    path = tmp_path / "rm"
    Qwen2ForSequenceClassification(Qwen2Config(
        vocab_size=len(qwen3), hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, num_labels=1, pad_token_id=0,
    )).save_pretrained(path)
    marking = AutoTokenizer.from_pretrained(qwen3.name_or_path)
    marking.chat_template = ("{% if mark is defined %}MARK {% endif %}"
                             "{% for m in messages %}{{ m.content }} {% endfor %}")
    marking.save_pretrained(path)
    for kwargs, want in (({"mark": True}, "MARK Open box"), ({}, "Open box")):
        rm = _RewardModel(str(path), kwargs)
        rendered: list[str] = []
        real = rm.tokenizer.apply_chat_template
        rm.tokenizer.apply_chat_template = lambda *a, real=real, out=rendered, **k: out.append(real(*a, **k)) or out[-1]
        rm([MESSAGES], [[{"role": "assistant", "content": "done"}]])
        assert rendered[0].startswith(want), rendered
