"""A tiny tool-calling Qwen2 checkpoint, built locally (no downloads): the tiny model warmed up on the box task.

A random model never writes a well-formed tool call, so RL on tools needs a model that already knows the
protocol. This one has the tiny model's architecture (orchestrator/builtin/models/tiny.py), a BPE trained on the box
task's text (orchestrator/builtin/tasks/boxes.py) with Qwen2's pre-tokenizer, TRL's Qwen2.5 chat template verbatim (so
TRL's tool-calling checks and response parser accept it), and a short deterministic SFT on synthetic episodes:
the user's question, `open_box`, its result, `submit` with the code copied, a short final answer.

The warm-up teaches the protocol and the copy, not which box to open: its episodes open a box at random, so
the warmed-up model succeeds about once per NUM_BOXES episodes and RL has to learn to open the box asked for.

`ensure_tiny_tool_model()` builds it once into rayward's cache (as orchestrator/builtin/models/tiny.py does the tiny
model) and returns the path. Sequences are built as a token-in-token-out rollout builds them (TRL's tool loop,
rayward's): the prompt's ids, then per turn the completion's ids and the ids of the tool messages rendered after it,
never the whole conversation re-tokenized; `episode_ids` is that builder.
"""

from __future__ import annotations

import os
import random
from importlib import resources
from pathlib import Path
from typing import Any

from orchestrator.builtin.models.tiny import (
    IM_END,
    MAX_POSITIONS,
    PAD_TOKEN,
    SPECIAL_TOKENS,
    VOCAB_SIZE,
    ensure_cached,
    fresh_qwen2,
    qwen2_config,
    save_model,
)
from orchestrator.builtin.models.warmup import Gate, gated, record
from orchestrator.builtin.tasks.boxes import NUM_BOXES, BoxEnv, boxes_dataset

# Bump when anything below changes the files written, so stale caches are not reused.
CACHE_NAME = "tiny-tools-v2"  # v2: the portable init and the gate

# Single non-special tokens, as in Qwen2.5: the response parser and `skip_special_tokens` decoding keep them.
TOOL_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
FINAL_ANSWER = "Done."  # the assistant's last turn, after `submit`

# Warm-up (plain torch SFT). Phase 1 trains on short episodes (no tool list in the prompt) until the model copies
# the code from the tool result into `submit`; trained on the ~300-token tool prompt from the start, a model this
# small learns the call format but not the copy. Phase 2 mixes in the real prompt with the tool list: every other
# batch (one kind per batch, so short episodes are not padded to the long ones).
SFT_SEED = 0
SFT_BATCH = 16
SFT_LR = 1e-3
SFT_STEPS_SHORT = 150
SFT_STEPS_MIXED = 150
# One thread: a model this small trains about as fast on one, and a fixed thread count keeps the float sums, hence
# the weights, the same from build to build.
SFT_THREADS = 1
# The gate (`protocol`): greedy episodes on GATE_ROWS fresh rows; most open a box with a well-formed call and submit
# the code it held.
GATE_ROWS = 16
MIN_CALLS = 0.9
MIN_COPIES = 0.75


def chat_template() -> str:
    """TRL's Qwen2.5 template, verbatim: TRL recognises templates by their exact text."""
    return resources.files("trl").joinpath("chat_templates/qwen2_5.jinja").read_text()


def task_tools() -> list[Any]:
    """The box task's tools as TRL sees them: the public methods of a BoxEnv (schemas from their docstrings)."""
    env = BoxEnv()
    return [env.open_box, env.submit]


def _call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": name, "arguments": arguments}}]}


def episode_messages(row: dict[str, Any], opened_box: int) -> list[dict[str, Any]]:
    """The assistant and tool messages of a protocol-following episode that opens `opened_box`."""
    env = BoxEnv()
    env.reset(**row)
    code = env.open_box(opened_box)
    return [
        _call("open_box", {"box": opened_box}),
        {"role": "tool", "name": "open_box", "content": code},
        _call("submit", {"code": int(code)}),
        {"role": "tool", "name": "submit", "content": env.submit(int(code))},
        {"role": "assistant", "content": FINAL_ANSWER},
    ]


def completion_ids(tokenizer: Any, message: dict[str, Any]) -> list[int]:
    """The ids a model samples for one assistant message: the template's rendering after the generation
    prompt, up to and including the end-of-turn token (where sampling stops)."""
    head = [{"role": "user", "content": "x"}]
    prompt = tokenizer.apply_chat_template(head, add_generation_prompt=True, tokenize=False)
    full = tokenizer.apply_chat_template(head + [message], tokenize=False)
    # A call without content renders as "assistant" + "\n<tool_call>...": still after the prompt's "assistant\n".
    if not full.startswith(prompt):
        raise ValueError("completion_ids: the template does not render the assistant turn after its generation prompt")
    text = full[len(prompt):]
    return tokenizer(text[: text.rindex(IM_END) + len(IM_END)], add_special_tokens=False)["input_ids"]


def tool_suffix_ids(tokenizer: Any, tool_messages: list[dict[str, Any]]) -> list[int]:
    """The ids rendered after an assistant turn's end-of-turn token for its tool results, through the next
    generation prompt (TRL's `_get_tool_suffix_ids`: render a dummy call with and without the results)."""
    head = [{"role": "user", "content": "x"}, _call(tool_messages[0]["name"], {})]
    prefix = tokenizer.apply_chat_template(head, tokenize=True, return_dict=False)
    full = tokenizer.apply_chat_template(head + tool_messages, add_generation_prompt=True, tokenize=True,
                                         return_dict=False)
    eos = tokenizer.convert_tokens_to_ids(IM_END)
    cut = len(prefix) - prefix[::-1].index(eos)
    if full[:cut] != prefix[:cut]:
        raise ValueError("tool_suffix_ids: the chat template is not prefix-preserving")
    return full[cut:]


def episode_ids(
    tokenizer: Any, prompt: list[dict[str, Any]], messages: list[dict[str, Any]], tools: list[Any] | None
) -> tuple[list[int], list[int]]:
    """(ids, mask) of an episode as a token-in-token-out rollout builds it: the prompt rendered with `tools`
    and the generation prompt, then each assistant turn's completion ids (mask 1) and the ids of the tool
    messages after it (mask 0)."""
    ids = tokenizer.apply_chat_template(prompt, tools=tools, add_generation_prompt=True, tokenize=True,
                                        return_dict=False)
    mask = [0] * len(ids)
    i = 0
    while i < len(messages):
        turn = completion_ids(tokenizer, messages[i])
        ids, mask = ids + turn, mask + [1] * len(turn)
        j = i + 1
        while j < len(messages) and messages[j]["role"] == "tool":
            j += 1
        if j > i + 1:
            suffix = tool_suffix_ids(tokenizer, messages[i + 1 : j])
            ids, mask = ids + suffix, mask + [0] * len(suffix)
        i = j
    return ids, mask


def _corpus(tokenizer: Any, rows: list[dict[str, Any]]) -> list[str]:
    """BPE training text: whole episodes as the template renders them, with and without the tool list."""
    tools = task_tools()
    out = []
    for k, row in enumerate(rows):
        conv = row["prompt"] + episode_messages(row, 1 + k % NUM_BOXES)
        out.append(tokenizer.apply_chat_template(conv, tools=tools if k % 2 else None, tokenize=False))
    return out


def train_tokenizer(corpus: list[str]) -> Any:
    """A byte-level BPE of VOCAB_SIZE trained on `corpus`, TOOL_TOKENS added, with `chat_template()`.

    Normalizer, pre-tokenizer and decoder are exactly those `Qwen2Tokenizer` rebuilds when it loads a
    checkpoint whose config says `model_type: qwen2` (NFC, Qwen's split regex, byte level): trained any other
    way, `AutoTokenizer` would tokenize some text (digits first) unlike the `tokenizer.json` it loads, and a
    rollout's ids would depend on which loader encoded its tool results."""
    import re

    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from tokenizers.trainers import BpeTrainer
    from transformers import PreTrainedTokenizerFast
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = BpeTrainer(
        vocab_size=VOCAB_SIZE - len(TOOL_TOKENS),
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # any string is encodable
        show_progress=False,
    )
    # Special and tool tokens are whole tokens at encode time: keep them out of the merges.
    cut = re.compile("|".join(re.escape(t) for t in (*SPECIAL_TOKENS, *TOOL_TOKENS)))
    tok.train_from_iterator([piece for line in corpus for piece in cut.split(line) if piece], trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_TOKENS])
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=IM_END, pad_token=PAD_TOKEN, bos_token=None,
                                   chat_template=chat_template(), model_max_length=MAX_POSITIONS)


def _build_tokenizer(out: Path) -> Any:
    """Train the tokenizer on the task's text and save it to `out`, with the response template TRL's
    `add_response_schema` picks for this chat template (so `parse_response` works without TRL too)."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast
    from trl.chat_template_utils import add_response_schema

    # Rendering text needs only the template: an empty tokenizer carries it.
    scratch = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.BPE()), chat_template=chat_template())
    tokenizer = train_tokenizer(_corpus(scratch, boxes_dataset(size=64, seed=SFT_SEED + 1)))
    add_response_schema(tokenizer)
    tokenizer.save_pretrained(out)
    return tokenizer


def _identity_value_output(model: Any) -> None:
    """Start each attention layer as a copier: v_proj passes the first head_dim features of the attended
    token through (v_proj is [kv_heads * head_dim, hidden] = [64, 128]: [I | 0]) and o_proj is the identity
    ([hidden, heads * head_dim] = [128, 128]), so attending to a token brings its embedding along. Copying a
    value from the tool result is the warm-up's hardest part for a model this small."""
    import torch

    with torch.no_grad():
        for layer in model.model.layers:
            attn = layer.self_attn
            attn.v_proj.weight.copy_(torch.eye(*attn.v_proj.weight.shape))
            attn.o_proj.weight.copy_(torch.eye(*attn.o_proj.weight.shape))


def _sft_batch(tokenizer: Any, rng: random.Random, tools: list[Any] | None) -> tuple[Any, Any]:
    """SFT_BATCH episodes, prompts rendered with `tools`, padded to one tensor: (input_ids, labels), labels -100
    off the completions."""
    import torch

    seqs = []
    for _ in range(SFT_BATCH):
        row = boxes_dataset(size=1, seed=rng.randrange(2**31))[0]
        opened = rng.randint(1, NUM_BOXES)  # not the box asked for: that link is left for RL to learn
        seqs.append(episode_ids(tokenizer, row["prompt"], episode_messages(row, opened), tools))
    width = max(len(ids) for ids, _ in seqs)
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([ids + [pad] * (width - len(ids)) for ids, _ in seqs])
    labels = torch.tensor([[t if m else -100 for t, m in zip(ids, mask, strict=True)] + [-100] * (width - len(ids))
                           for ids, mask in seqs])
    return input_ids, labels


def warm_up(model: Any, tokenizer: Any, seed: int = SFT_SEED) -> None:
    """The deterministic SFT (see the module doc), in place. Right padding: causal attention never lets a
    real token see the pads after it, so no attention mask is needed."""
    import torch

    rng = random.Random(seed)
    tools = task_tools()
    threads = torch.get_num_threads()
    torch.set_num_threads(SFT_THREADS)
    opt = torch.optim.Adam(model.parameters(), lr=SFT_LR)
    model.train()
    for step in range(SFT_STEPS_SHORT + SFT_STEPS_MIXED):
        with_tools = step >= SFT_STEPS_SHORT and step % 2 == 1
        input_ids, labels = _sft_batch(tokenizer, rng, tools if with_tools else None)
        loss = model(input_ids=input_ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    torch.set_num_threads(threads)


def build_tiny_tool_model(path: str | Path, seed: int = SFT_SEED) -> Path:
    """Write the warmed-up tiny tool model (float32) plus tokenizer to `path`; returns the path. RuntimeError when
    no build passes its gates (`protocol`: well-formed calls, the code copied)."""
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = _build_tokenizer(out)

    def build(s: int) -> tuple[Any, dict[str, float]]:
        model = fresh_qwen2(qwen2_config(), s)
        _identity_value_output(model)
        warm_up(model, tokenizer, s)
        return model, protocol(model, tokenizer)

    passed = gated(build, {"calls": Gate(MIN_CALLS), "copies": Gate(MIN_COPIES)}, seed=seed,
                   what="tiny tool model (greedy box episodes: well-formed calls, the code copied)")
    save_model(passed.model, out)
    record(out, passed)
    return out


def ensure_tiny_tool_model(cache_dir: str | Path | None = None) -> Path:
    """Build the tiny tool model once into the cache dir (as orchestrator/builtin/models/tiny.py: ensure_tiny_model)."""
    return ensure_cached(CACHE_NAME, build_tiny_tool_model, cache_dir)


def without_response_template(model_dir: str | Path, out: str | Path) -> Path:
    """A copy of the checkpoint at `model_dir` whose tokenizer files set no `response_template`: a model as the
    hub ships one whose chat template is TRL's (the tiny tool model's is TRL's qwen2_5.jinja verbatim), which TRL
    and rayward prepare at run time (`add_response_schema`). Reused if `out` already holds it."""
    import json
    import shutil

    out = Path(out)
    if out.exists():
        return out
    staging = Path(shutil.copytree(model_dir, out.with_name(f".{out.name}.{os.getpid()}")))
    config = staging / "tokenizer_config.json"
    fields = json.loads(config.read_text())
    fields.pop("response_template", None)
    config.write_text(json.dumps(fields, indent=2))
    try:
        staging.rename(out)  # whole or not at all: a process building it beside this one loses the race cleanly
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def ensure_stock_tool_model(cache_dir: str | Path | None = None) -> Path:
    """The tiny tool model as the hub would ship it: TRL's stock qwen2_5 template, no saved response schema."""
    tool_model = ensure_tiny_tool_model(cache_dir)
    return without_response_template(tool_model, tool_model.parent / f"{tool_model.name}-stock-template")


def protocol(model: Any, tokenizer: Any, rows: int = GATE_ROWS, seed: int = SFT_SEED + 2) -> dict[str, float]:
    """The gate's scores, from greedy episodes on `rows` fresh rows: `calls`, the share whose first turn is a
    well-formed `open_box` call (an int box), and `copies`, the share whose second turn submits the code that box
    held (which box it opens is left to RL: the warm-up opens one at random)."""
    eps = play(model, tokenizer, boxes_dataset(size=rows, seed=seed), temperature=0.0)
    calls = copies = 0
    for e in eps:
        first = (e["turns"][0].get("tool_calls") or [{}])[0].get("function", {})
        box = first.get("arguments", {}).get("box") if first.get("name") == "open_box" else None
        if not isinstance(box, int) or not 1 <= box <= NUM_BOXES:
            continue
        calls += 1
        env = BoxEnv()
        env.reset(**e["row"])
        second = (e["turns"][1].get("tool_calls") or [{}])[0].get("function", {}) if len(e["turns"]) > 1 else {}
        copies += second.get("name") == "submit" and str(second.get("arguments", {}).get("code")) == env.open_box(box)
    return {"calls": calls / len(eps), "copies": copies / len(eps)}


def play(
    model: Any, tokenizer: Any, rows: list[dict[str, Any]], *, num_samples: int = 1, max_turns: int = 3,
    temperature: float = 1.0, max_new_tokens: int = 40, seed: int = 0,
) -> list[dict[str, Any]]:
    """Run box episodes with transformers generation, token in token out as TRL's tool loop does; per sample
    {"row", "turns" (parsed assistant messages), "calls", "reward"}. For tests and reports on the model."""
    import torch
    from trl.chat_template_utils import add_response_schema, parse_response

    if getattr(tokenizer, "response_template", None) is None:
        add_response_schema(tokenizer)
    torch.manual_seed(seed)
    eps = []
    for row in rows:
        for _ in range(num_samples):
            env = BoxEnv()
            env.reset(**row)
            ids = tokenizer.apply_chat_template(row["prompt"], tools=[env.open_box, env.submit],
                                                add_generation_prompt=True, tokenize=True, return_dict=False)
            eps.append({"row": row, "env": env, "ids": ids, "turns": [], "calls": 0, "open": True})
    for _ in range(max_turns):
        live = [e for e in eps if e["open"]]
        if not live:
            break
        for e, new in zip(live, _generate(model, tokenizer, [e["ids"] for e in live], temperature,
                                           max_new_tokens), strict=True):
            msg = parse_response(tokenizer, new, prefix=e["ids"], tools=[e["env"].open_box, e["env"].submit])
            e["ids"] = e["ids"] + new
            e["turns"].append(msg)
            calls = msg.get("tool_calls") or []
            e["open"] = bool(calls)
            results = [_run_tool(e["env"], c) for c in calls]
            e["calls"] += len(calls)
            if results:
                e["ids"] = e["ids"] + tool_suffix_ids(tokenizer, results)
    for e in eps:
        e["reward"] = e.pop("env").get_reward()
        del e["ids"], e["open"]
    return eps


def _run_tool(env: BoxEnv, call: dict[str, Any]) -> dict[str, Any]:
    """A tool message for `call`, errors as TRL reports them."""
    fn = call["function"]
    try:
        if fn["name"] not in ("open_box", "submit"):
            raise ValueError(f"Tool {fn['name']} not found.")
        content = str(getattr(env, fn["name"])(**fn["arguments"]))
    except Exception as err:  # noqa: BLE001 - a bad call is an observation, as in TRL's loop
        content = str({"error": str(err)})
    return {"role": "tool", "name": fn["name"], "content": content}


def _generate(model: Any, tokenizer: Any, prompts: list[list[int]], temperature: float,
              max_new_tokens: int) -> list[list[int]]:
    """Sample one completion per prompt (left-padded batch); each cut after its end-of-turn token."""
    import torch

    width = max(len(p) for p in prompts)
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        sampling = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if temperature > 0 else dict(
            do_sample=False)  # temperature 0: greedy
        out = model.generate(input_ids=input_ids, attention_mask=attention, max_new_tokens=max_new_tokens,
                             pad_token_id=pad, **sampling)
    eos = tokenizer.convert_tokens_to_ids(IM_END)
    news = []
    for seq in out[:, width:].tolist():
        news.append(seq[: seq.index(eos) + 1] if eos in seq else seq)
    return news
