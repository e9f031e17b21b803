"""A tiny vision-language model (Qwen2.5-VL), built locally like the tiny dense model, for tests and CPU runs.

Its language model is the tiny dense model's shape (orchestrator/builtin/models/tiny.py: 2 layers, 128 wide, 2 heads of
64) and tokenizer, plus Qwen's four vision tokens; its vision tower is a 2-block Qwen2.5-VL ViT (14-pixel patches merged
2 x 2, window attention in block 0, full attention in block 1) whose merger projects into the language model.
Qwen2.5-VL's real chat template (TRL's `qwen2_5_vl.jinja`) and processor (Qwen2VLImageProcessor, with its
min_pixels / max_pixels) are saved with it, so transformers, vLLM and TRL all run their own code on it: its
multimodal rotary positions (mrope), the placeholder expansion, the vision tower's windows.

Warmed up so that GRPO has signal (`warm_up`): a few supervised steps on `colors` rows teach the answer's form (one
letter of abcd, then the end of the turn) and a first, weak link from colour to letter. A random model's 16-token
completions give GRPO groups with almost no reward spread on this task; so does a warm-up on answers drawn
independently of the colour, which teaches the model to ignore the image altogether (its letter probabilities
then agree across images to 1e-6).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchestrator.builtin.models.tiny import (
    HIDDEN_SIZE,
    IM_END,
    INTERMEDIATE_SIZE,
    MAX_POSITIONS,
    NUM_HEADS,
    NUM_KV_HEADS,
    NUM_LAYERS,
    PAD_TOKEN,
    TIE_WORD_EMBEDDINGS,
    _build_tokenizer,
    ensure_cached,
)
from orchestrator.builtin.models.warmup import Gate, gated, portable_normal_, record

# Bump when anything below changes the files written, so stale caches are not reused.
CACHE_NAME = "tiny-vlm-v3"  # v3: the portable init and the gates
VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
# The tokenizer's 512 + 4 vision tokens, rounded up to a multiple of 8.
VOCAB_SIZE = 520
# mrope: the rotary half-dimension (head_dim 64 / 2 = 32) split over (time, height, width), as Qwen's [16, 24, 24]
# splits 64.
MROPE_SECTION = [8, 12, 12]
VISION_DEPTH = 2
VISION_HIDDEN = 64
VISION_HEADS = 2
VISION_INTERMEDIATE = 128
PATCH_SIZE = 14
MERGE_SIZE = 2
# 2 x 2 merged patches per window: block 0 attends within windows of 56 pixels, block 1 over the whole image.
WINDOW_SIZE = 56
FULL_ATTENTION_BLOCKS = [1]
# Images between 56 x 56 (4 vision tokens) and 112 x 112 pixels (16): a CPU budget (Qwen's defaults are 4 to
# 16384 tokens per image).
MIN_PIXELS = 56 * 56
MAX_PIXELS = 112 * 112
# Init scale of the weight matrices: the language model's as the tiny model's (visible logprobs); the vision
# tower's smaller, so its 2 blocks keep the patch colours distinguishable at the output.
LM_INIT_STD = 0.2
VISION_INIT_STD = 0.05
# The warm-up: WARMUP_STEPS supervised steps of WARMUP_BATCH `colors` rows (image -> a letter, <|im_end|>) at
# WARMUP_LR (Adam): the first WARMUP_LINK_STEPS answer with the image's letter (the link), the rest with it
# WARMUP_CORRECT of the time and a random letter otherwise. Deliberately short: the model leaves it answering a letter
# nearly always and the right one about 3 times in 10 (above the blind 1 in 4: some signal in every group), far from
# solved, so GRPO has the rest to learn, from the image. Trained on random answers from the start, the model learns
# to ignore the image altogether; whether it keeps the link is decided by the seed (the gates below).
WARMUP_STEPS = 40
WARMUP_LINK_STEPS = 20
WARMUP_CORRECT = 0.4
WARMUP_BATCH = 16
WARMUP_LR = 3e-3
WARMUP_SEED = 1
# The warm-up's torch threads (2 cores here), restored after.
WARMUP_THREADS = 2
# The gates (orchestrator/builtin/models/warmup.py), on GATE_ROWS fresh rows: the answer's form (a letter is the
# likely next token) and a link from the picture to the letter that is there but weak (above the blind 1 in 4, far
# from solved), so GRPO has signal and room.
GATE_ROWS = 32
LETTER_GATES = {"letter": Gate(0.6), "right": Gate(0.29, 0.8)}
# Whether the tiny VLM links picture to letter in a short warm-up is close to a coin flip per seed (the link
# appears abruptly or not at all): more attempts than the text models need.
VLM_ATTEMPTS = 5


def chat_template() -> str:
    """Qwen2.5-VL's chat template as TRL ships it."""
    import trl

    return (Path(trl.__file__).parent / "chat_templates" / "qwen2_5_vl.jinja").read_text()


def vlm_config(ids: dict[str, int]) -> Any:
    from transformers import Qwen2_5_VLConfig

    return Qwen2_5_VLConfig(
        text_config=dict(
            vocab_size=VOCAB_SIZE, hidden_size=HIDDEN_SIZE, intermediate_size=INTERMEDIATE_SIZE,
            num_hidden_layers=NUM_LAYERS, num_attention_heads=NUM_HEADS, num_key_value_heads=NUM_KV_HEADS,
            max_position_embeddings=MAX_POSITIONS,
            rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": MROPE_SECTION},
            bos_token_id=None, eos_token_id=ids[IM_END], pad_token_id=ids[PAD_TOKEN],
        ),
        vision_config=dict(
            depth=VISION_DEPTH, hidden_size=VISION_HIDDEN, intermediate_size=VISION_INTERMEDIATE,
            num_heads=VISION_HEADS, out_hidden_size=HIDDEN_SIZE, patch_size=PATCH_SIZE,
            spatial_merge_size=MERGE_SIZE, temporal_patch_size=2, window_size=WINDOW_SIZE,
            fullatt_block_indexes=FULL_ATTENTION_BLOCKS,
        ),
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=TIE_WORD_EMBEDDINGS, dtype="float32",
    )


def build_tiny_vlm(path: str | Path, seed: int = 0, warm: bool = True) -> Path:
    """Write the tiny Qwen2_5_VLForConditionalGeneration (float32; warmed up unless `warm` is False), its tokenizer
    and processor to `path`."""
    from transformers import AutoTokenizer

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    _build_tokenizer(out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    tokenizer.add_special_tokens({"additional_special_tokens": VISION_TOKENS})
    template = chat_template()
    tokenizer.chat_template = template
    return _write_vlm(out, tokenizer, template, seed, (warm_up, letter_scores, LETTER_GATES,
                                                           "tiny VLM (colors: a letter, and some link to the colour)")
                      if warm else None)


# A warm-up: train(model, processor, seed=...) in place, score(model, processor) -> scores, their gates, what it is.
WarmUp = tuple[Callable[..., None], Callable[[Any, Any], dict[str, float]], dict[str, Gate], str]


def _write_vlm(out: Path, tokenizer: Any, template: str | None, seed: int, warm: WarmUp | None,
               attempts: int = VLM_ATTEMPTS) -> Path:
    """A tiny Qwen2.5-VL for `tokenizer` (its vision tokens added), its weight matrices drawn from `seed` (the same
    on every CPU), warmed up by `warm` if given (retrained from the next seed while a gate misses: warmup.gated),
    written to `out` with its processor (`template` its chat template) and its build record."""
    import torch
    from transformers import (
        GenerationConfig,
        Qwen2_5_VLForConditionalGeneration,
        Qwen2_5_VLProcessor,
        Qwen2VLImageProcessor,
    )
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor

    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in [*VISION_TOKENS, IM_END, PAD_TOKEN]}
    processor = Qwen2_5_VLProcessor(
        image_processor=Qwen2VLImageProcessor(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS),
        tokenizer=tokenizer, video_processor=Qwen2VLVideoProcessor(), chat_template=template,
    )

    def fresh(s: int) -> Any:
        model = Qwen2_5_VLForConditionalGeneration(vlm_config(ids)).to(torch.float32)
        portable_normal_(model, s, lambda name: VISION_INIT_STD if ".visual." in f".{name}" else LM_INIT_STD)
        return model

    if warm is None:
        model = fresh(seed)
    else:
        train, score, gates, what = warm

        def build(s: int) -> tuple[Any, dict[str, float]]:
            model = fresh(s)
            train(model, processor, seed=WARMUP_SEED + s)
            return model, score(model, processor)

        passed = gated(build, gates, seed=seed, what=what, attempts=attempts)
        model = passed.model
        record(out, passed)
    model.generation_config = GenerationConfig(eos_token_id=ids[IM_END], pad_token_id=ids[PAD_TOKEN])
    model.save_pretrained(out)
    processor.save_pretrained(out)
    return out


# One supervised batch of a warm-up, from its random generator: input_ids [B, L] and labels [B, L] (-100 off the
# answer), every row the same length (no padding), and the image processor's output for the batch's images.
Batch = Callable[[Any], tuple[Any, Any, dict[str, Any]]]


def _supervised(model: Any, processor: Any, batch: Batch, steps: int, lr: float, seed: int) -> None:
    """`steps` Adam steps at `lr` on `batch(rng)`, at WARMUP_THREADS torch threads (restored after), in place."""
    import random

    import torch

    rng = random.Random(seed)
    threads = torch.get_num_threads()
    torch.set_num_threads(WARMUP_THREADS)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    image_token = processor.tokenizer.convert_tokens_to_ids(processor.image_token)
    model.train()
    try:
        for _ in range(steps):
            input_ids, labels, pixels = batch(rng)
            loss = model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), labels=labels,
                         pixel_values=pixels["pixel_values"], image_grid_thw=pixels["image_grid_thw"],
                         mm_token_type_ids=(input_ids == image_token).int()).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
    finally:
        torch.set_num_threads(threads)
    model.eval()


def warm_up(model: Any, processor: Any, *, steps: int = WARMUP_STEPS, seed: int = WARMUP_SEED) -> None:
    """Teach the answer's form on `colors` images with random answers (see the module docstring)."""
    import torch

    from orchestrator.builtin.tasks.colors import PROMPT, color_image
    from orchestrator.builtin.tasks.letters import LETTERS

    end = processor.tokenizer.convert_tokens_to_ids(IM_END)
    step = itertools.count()

    def batch(rng: Any) -> tuple[Any, Any, dict[str, Any]]:
        correct = 1.0 if next(step) < WARMUP_LINK_STEPS else WARMUP_CORRECT
        letters = [rng.choice(LETTERS) for _ in range(WARMUP_BATCH)]
        pictures = [color_image(a, rng) for a in letters]
        answers = [a if rng.random() < correct else rng.choice(LETTERS) for a in letters]
        chats = [[{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": PROMPT}]}]] * len(answers)
        texts = processor.apply_chat_template(chats, add_generation_prompt=True, tokenize=False)
        inputs = processor(text=texts, images=pictures, return_tensors="pt")
        prompt = inputs["input_ids"]  # [B, P]: every image the same size, so no padding
        answer = torch.tensor([processor.tokenizer.encode(a, add_special_tokens=False) + [end] for a in answers])
        labels = torch.cat([torch.full_like(prompt, -100), answer], dim=1)
        return torch.cat([prompt, answer], dim=1), labels, inputs

    _supervised(model, processor, batch, steps, WARMUP_LR, seed)


def _logits(model: Any, processor: Any, ids: Any, pixels: dict[str, Any]) -> Any:
    """[L, V] logits of `ids` ([1, L], image placeholders expanded) with the images' pixel inputs."""
    import torch

    image_token = processor.tokenizer.convert_tokens_to_ids(processor.image_token)
    with torch.inference_mode():
        return model(input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values=pixels["pixel_values"],
                     image_grid_thw=pixels["image_grid_thw"], mm_token_type_ids=(ids == image_token).int()).logits[0]


def letter_probabilities(model: Any, processor: Any, inputs: list[tuple[Any, dict[str, Any]]], answers: list[str]
                         ) -> tuple[float, float]:
    """(mean P(a letter of LETTERS) as the next token, mean P(the row's letter) among the letters) after each
    (ids, pixel inputs): the warm-up's form and its link from picture to letter."""
    from orchestrator.builtin.tasks.letters import LETTERS

    letter_ids = [processor.tokenizer.encode(c, add_special_tokens=False)[0] for c in LETTERS]
    form = right = 0.0
    for (ids, pixels), answer in zip(inputs, answers, strict=True):
        p = _logits(model, processor, ids, pixels)[-1].softmax(-1)[letter_ids]
        form += p.sum().item()
        right += (p[LETTERS.index(answer)] / p.sum()).item()
    return form / len(inputs), right / len(inputs)


def letter_scores(model: Any, processor: Any, rows: int = GATE_ROWS, seed: int = WARMUP_SEED + 7) -> dict[str, float]:
    """The colors warm-up's gate scores on `rows` fresh rows (`letter_probabilities`)."""
    from orchestrator.builtin.tasks.colors import PROMPT, colors_dataset

    data = colors_dataset(rows, seed=seed)
    chat = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": PROMPT}]}]
    text = processor.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    inputs = []
    for r in data:
        encoded = processor(text=[text], images=[r["image"]], return_tensors="pt")
        inputs.append((encoded["input_ids"], encoded))
    form, right = letter_probabilities(model, processor, inputs, [r["letter"] for r in data])
    return {"letter": form, "right": right}


def ensure_tiny_vlm(cache_dir: str | Path | None = None) -> Path:
    """Build the tiny VLM once into the cache dir (as orchestrator/builtin/models/tiny.py: ensure_tiny_model)."""
    return ensure_cached(CACHE_NAME, build_tiny_vlm, cache_dir)


# --- the tiny tool-calling VLM: the cards task (orchestrator/builtin/tasks/cards.py) ---------------------------------

# Bump when anything below changes the files written, so stale caches are not reused.
TOOLS_CACHE_NAME = "tiny-vlm-tools-v3"  # v3: the link steps, a stricter link gate
# Its warm-up: whole episodes (the prompt with the tool list, the `look` call, the card's picture as the tool's
# result, one letter) at TOOLS_WARMUP_LR. The call is always the same, so it is learned exactly; the letter is the
# card's for the first TOOLS_WARMUP_LINK_STEPS (the link, as the one-turn warm-up above), then TOOLS_WARMUP_CORRECT of
# the time, else a random one: a partial link from the picture to the letter, for GRPO to strengthen. Without the link
# steps the link appears abruptly per seed and, where it does, weakly: GRPO then collapses each picture onto one
# letter (the groups' rewards all equal) before it has learned the colours.
TOOLS_WARMUP_STEPS = 60
TOOLS_WARMUP_LINK_STEPS = 20
TOOLS_WARMUP_CORRECT = 0.4
TOOLS_WARMUP_BATCH = 16
TOOLS_WARMUP_LR = 3e-3
TOOLS_CORPUS_ROWS = 64
# The link gate is stricter than the one-turn model's: builds under 0.38 learn configs/vlm-tools.yaml's run slowly.
# About half the seeds pass it, hence more attempts (each build is seconds).
CARD_GATES = {"call": Gate(0.9), "letter": Gate(0.6), "right": Gate(0.38, 0.8)}
TOOLS_ATTEMPTS = 8


def tool_chat_template() -> str:
    """Qwen3-VL's chat template as TRL ships it: tool calls, and images in tool messages (Qwen2.5-VL's has
    neither)."""
    import trl

    return (Path(trl.__file__).parent / "chat_templates" / "qwen3_vl.jinja").read_text()


def card_tools() -> list[Any]:
    """The cards task's tools as TRL sees them: the public methods of a CardEnv."""
    from orchestrator.builtin.tasks.cards import CardEnv

    return [CardEnv().look]


def card_episode(row: dict[str, Any], answer: str) -> list[dict[str, Any]]:
    """The assistant and tool messages of an episode that looks at the card and answers `answer`."""
    from orchestrator.builtin.tasks.cards import CardEnv

    env = CardEnv()
    env.reset(**row)
    return [
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "look", "arguments": {}}}]},
        {"role": "tool", "name": "look", "content": env.look()},
        {"role": "assistant", "content": answer},
    ]


def _tool_tokenizer(out: Path) -> Any:
    """A BPE trained on the cards task's episodes (the tool list, the call, the tool's text) as tiny_tools trains
    the box task's, plus Qwen's vision tokens, with Qwen3-VL's template and TRL's response template for it."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast
    from trl.chat_template_utils import add_response_schema

    from orchestrator.builtin.models.tools import train_tokenizer
    from orchestrator.builtin.tasks.cards import cards_dataset

    template = tool_chat_template()
    scratch = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.BPE()), chat_template=template)
    tools = card_tools()
    corpus = []
    for k, row in enumerate(cards_dataset(TOOLS_CORPUS_ROWS, seed=WARMUP_SEED + 1)):
        episode = card_episode(row, row["letter"])
        episode[1] = {**episode[1], "content": episode[1]["content"][1]["text"]}  # text only: no vision tokens
        corpus.append(scratch.apply_chat_template(row["prompt"] + episode, tools=tools if k % 2 else None,
                                                  tokenize=False))
    tokenizer = train_tokenizer(corpus)
    tokenizer.add_special_tokens({"additional_special_tokens": VISION_TOKENS})
    tokenizer.chat_template = template
    add_response_schema(tokenizer)
    tokenizer.save_pretrained(out)
    return tokenizer


def build_tiny_tool_vlm(path: str | Path, seed: int = 0, warm: bool = True) -> Path:
    """Write the tiny VLM warmed up on the cards task (float32), its tokenizer and processor, to `path`."""
    from transformers import AutoTokenizer

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    _tool_tokenizer(out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    return _write_vlm(out, tokenizer, tool_chat_template(), seed, (warm_up_tools, card_scores, CARD_GATES,
                      "tiny tool VLM (cards: the call, a letter, some link to the card)") if warm else None,
                      TOOLS_ATTEMPTS)


def tool_episode_ids(processor: Any, row: dict[str, Any], answer: str) -> tuple[list[int], list[int], Any]:
    """(ids, mask, picture) of a cards episode as a token-in-token-out rollout builds it (the prompt with the tool
    list, the call, the tool result's suffix with the picture's placeholders expanded, the answer): mask 1 on the
    model's two turns."""
    from actors.agents.chat import tool_suffix_ids
    from orchestrator.builtin.models.tools import completion_ids

    tokenizer = processor.tokenizer
    call, result, reply = card_episode(row, answer)
    prompt = tokenizer.apply_chat_template(row["prompt"], tools=card_tools(), add_generation_prompt=True,
                                           tokenize=True, return_dict=False)
    picture = result["content"][0]["image"]
    count = processor._get_num_multimodal_tokens(image_sizes=[(picture.height, picture.width)]).num_image_tokens[0]
    image_token = tokenizer.convert_tokens_to_ids(processor.image_token)
    suffix = []
    for t in tool_suffix_ids(tokenizer, [result]):
        suffix += [t] * (count if t == image_token else 1)
    first, last = completion_ids(tokenizer, call), completion_ids(tokenizer, reply)
    ids = prompt + first + suffix + last
    mask = [0] * len(prompt) + [1] * len(first) + [0] * len(suffix) + [1] * len(last)
    return ids, mask, picture


def warm_up_tools(model: Any, processor: Any, *, steps: int = TOOLS_WARMUP_STEPS, seed: int = WARMUP_SEED) -> None:
    """Teach the cards episode's form (see TOOLS_WARMUP_STEPS), in place."""
    import torch

    from orchestrator.builtin.tasks.cards import cards_dataset
    from orchestrator.builtin.tasks.letters import LETTERS

    step = itertools.count()

    def batch(rng: Any) -> tuple[Any, Any, dict[str, Any]]:
        correct = 1.0 if next(step) < TOOLS_WARMUP_LINK_STEPS else TOOLS_WARMUP_CORRECT
        rows = cards_dataset(TOOLS_WARMUP_BATCH, seed=rng.randrange(2**31))
        episodes = [tool_episode_ids(processor, r, r["letter"] if rng.random() < correct
                                     else rng.choice(LETTERS)) for r in rows]
        input_ids = torch.tensor([ids for ids, _, _ in episodes])  # every episode the same length
        labels = torch.tensor([[t if m else -100 for t, m in zip(ids, mask, strict=True)] for ids, mask, _ in episodes])
        return input_ids, labels, processor.image_processor(images=[p for _, _, p in episodes], return_tensors="pt")

    _supervised(model, processor, batch, steps, TOOLS_WARMUP_LR, seed)


def card_scores(model: Any, processor: Any, rows: int = GATE_ROWS, seed: int = WARMUP_SEED + 7) -> dict[str, float]:
    """The cards warm-up's gate scores on `rows` fresh rows: `call`, the mean probability of the `look` call's tokens
    (teacher-forced), and after the card's picture `letter_probabilities`' form and link."""
    import torch

    from orchestrator.builtin.tasks.cards import cards_dataset

    call = 0.0
    inputs, answers = [], []
    for r in cards_dataset(rows, seed=seed):
        ids, mask, picture = tool_episode_ids(processor, r, r["letter"])
        pixels = processor.image_processor(images=[picture], return_tensors="pt")
        first = mask.index(1)
        end = first + mask[first:].index(0)  # the call's tokens: the first run of model tokens
        seq = torch.tensor([ids])
        logp = _logits(model, processor, seq, pixels)[first - 1: end - 1].log_softmax(-1)
        call += logp.gather(-1, seq[0, first:end, None]).squeeze(-1).mean().exp().item()
        answer = len(ids) - list(reversed(mask)).index(0)  # the answer's first position
        inputs.append((seq[:, :answer], pixels))
        answers.append(r["letter"])
    form, right = letter_probabilities(model, processor, inputs, answers)
    return {"call": call / rows, "letter": form, "right": right}


def ensure_tiny_tool_vlm(cache_dir: str | Path | None = None) -> Path:
    """Build the tiny tool-calling VLM once into the cache dir (as ensure_tiny_vlm)."""
    return ensure_cached(TOOLS_CACHE_NAME, build_tiny_tool_vlm, cache_dir)
