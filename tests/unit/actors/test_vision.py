"""Images in prompts (actors/vision.py, orchestrator/data/sources.py PromptEncoder): decoding what datasets hold, the
placeholder expansion against transformers' own processor, TRL's row formats, and the errors named by row."""

import io

import pytest
from PIL import Image

from actors.vision import ImageError, Images, to_image
from orchestrator.builtin.tasks.colors import COLORS, colors_dataset
from orchestrator.data.sources import PromptEncoder, row_images


@pytest.fixture(scope="module")
def images(tiny_vlm_path):
    return Images(tiny_vlm_path)


@pytest.fixture(scope="module")
def tokenizer(tiny_vlm_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_vlm_path)


def _png(image):
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def test_to_image_decodes_what_datasets_hold(tmp_path):
    red = Image.new("RGBA", (30, 20), (255, 0, 0, 255))
    path = tmp_path / "red.png"
    red.save(path)
    for value in (red, _png(red), {"bytes": _png(red), "path": None}, {"bytes": None, "path": str(path)}, str(path)):
        got = to_image(value, "row 3")
        assert got.mode == "RGB" and got.size == (30, 20) and got.getpixel((0, 0)) == (255, 0, 0)


def test_a_broken_image_is_named(tmp_path):
    with pytest.raises(ImageError, match=r"data row 7 column 'image': cannot decode"):
        to_image(b"not a png", "data row 7 column 'image'")
    with pytest.raises(ImageError, match=r"row 2: not an image \(int\)"):
        to_image(5, "row 2")
    with pytest.raises(ImageError, match="cannot decode"):
        to_image(str(tmp_path / "missing.png"), "row 1")


def test_expansion_matches_the_processors_own(images, tiny_vlm_path, tokenizer):
    """The driver's ids (the tokenizer's rendering, each placeholder expanded by the image's size) are exactly what
    transformers' Qwen2.5-VL processor makes of the same messages, for images of several sizes and counts."""
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(tiny_vlm_path)
    encode = PromptEncoder(tokenizer, "prompt", None, images)
    pictures = [Image.new("RGB", (56, 56), "red"), Image.new("RGB", (84, 56), "blue"), Image.new("RGB", (100, 70))]
    for n in (1, 2, 3):
        row = {"prompt": [{"role": "user", "content": "What colours?"}], "images": pictures[:n]}
        got = encode(row)
        want = processor.apply_chat_template(got.messages, add_generation_prompt=True, tokenize=True, return_dict=True)
        assert got.prompt_ids == list(want["input_ids"][0])
        assert got.prompt_ids.count(images.image_token_id) == sum(images.counts(pictures[:n])) > n
        assert images.collapse(got.prompt_ids, got.images).count(images.image_token_id) == n
        assert images.expand(images.collapse(got.prompt_ids, got.images), got.images) == got.prompt_ids


def test_trl_row_formats(images, tokenizer):
    """TRL's `image` column, its `images` list, and image parts inside the messages all give the same prompt; the
    reward functions' `prompts` are the messages holding the images, as TRL passes them."""
    encode = PromptEncoder(tokenizer, "prompt", None, images)
    pic = Image.new("RGB", (56, 56), "green")
    text = [{"role": "user", "content": "Which?"}]
    parts = [{"role": "user", "content": [{"type": "image", "image": _png(pic)}, {"type": "text", "text": "Which?"}]}]
    a = encode({"prompt": text, "image": pic})
    b = encode({"prompt": text, "images": [pic]})
    c = encode({"prompt": parts})
    assert a.prompt_ids == b.prompt_ids == c.prompt_ids
    assert [im.tobytes() for im in c.images] == [pic.tobytes()]  # the part's bytes, decoded
    assert a.messages[0]["content"][0] == {"type": "image", "image": pic}
    assert row_images({"image": None}, "row") == []


def test_bad_rows_are_named(images, tokenizer, tiny_model_path):
    from transformers import AutoTokenizer

    encode = PromptEncoder(tokenizer, "prompt", None, images)
    rows = [{"prompt": [{"role": "user", "content": "x"}], "image": Image.new("RGB", (56, 56))},
            {"prompt": [{"role": "user", "content": "x"}], "image": b"\x89PNG broken"}]
    with pytest.raises(ImageError, match=r"data row 1 column 'image': cannot decode"):
        encode.check(rows, "data")
    with pytest.raises(ImageError, match="row 0: a row with images needs a conversational prompt"):
        encode({"prompt": "plain text", "image": Image.new("RGB", (56, 56))}, where="row 0")
    text_only = PromptEncoder(AutoTokenizer.from_pretrained(tiny_model_path), "prompt")
    with pytest.raises(ImageError, match="no image processor"):
        text_only.check(rows[:1], "data")


def test_a_chat_template_without_image_parts_is_refused(images, tokenizer):
    """A text model's template on an image prompt: TRL's stock qwen2_5 template cannot render list contents (named,
    with what it means); a template that renders only the text parts would train on prompts without their image
    (refused: no placeholder for the row's image)."""
    import copy
    from pathlib import Path

    import trl

    row = {"prompt": [{"role": "user", "content": "x"}], "image": Image.new("RGB", (56, 56))}
    text_tokenizer = copy.deepcopy(tokenizer)
    text_tokenizer.chat_template = (Path(trl.__file__).parent / "chat_templates" / "qwen2_5.jinja").read_text()
    with pytest.raises(ImageError, match="row 4: the chat template cannot render a message with image parts"):
        PromptEncoder(text_tokenizer, "prompt", None, images)(row, where="row 4")
    text_tokenizer.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% for p in m['content'] %}{% if p['type'] == 'text' %}"
        "{{ p['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endfor %}<|im_start|>assistant\n")
    with pytest.raises(ImageError, match="row 5: the prompt has 0 image placeholder.*dropped image parts"):
        PromptEncoder(text_tokenizer, "prompt", None, images)(row, where="row 5")


def test_colors_task_balanced_and_the_colour_is_the_answer():
    rows = colors_dataset(64, seed=3)
    assert {r["letter"] for r in rows} == set(COLORS)
    assert all(sum(r["letter"] == c for r in rows) == 16 for c in COLORS)
    for r in rows[:8]:
        pixels = r["image"].getcolors(maxcolors=4096)
        assert COLORS[r["letter"]] in {rgb for _, rgb in pixels}
    assert len({r["prompt"][0]["content"] for r in rows}) == 1  # only the image tells the answer


def test_a_broken_image_past_the_checked_rows_is_named_or_skipped_when_drawn(images, tokenizer):
    """In memory, only the first CHECKED_IMAGE_ROWS rows' images are decoded before the run; a later broken one is
    known when drawn: data.on_bad_row raise stops the run naming the row, skip leaves it out and counts it (the
    batch still full), under the uniform sampler and the difficulty curriculum alike."""
    from orchestrator.config import DataConfig
    from orchestrator.data.sources import CHECKED_IMAGE_ROWS, DataError, PromptSource

    good = {"prompt": [{"role": "user", "content": "x"}], "image": Image.new("RGB", (56, 56))}
    bad_at = CHECKED_IMAGE_ROWS + 2
    rows = [good] * bad_at + [{**good, "image": b"\x89PNG broken"}] + [good] * 3
    PromptEncoder(tokenizer, "prompt", None, images).check(rows, "data")  # passes: the bad row is past the check
    raising = PromptSource(rows, tokenizer, DataConfig(shuffle_dataset=False), images=images)
    raising.next_batch(bad_at)
    with pytest.raises(DataError, match=rf"data row {bad_at} column 'image': cannot decode.*on_bad_row: skip"):
        raising.next_batch(2)
    for sampler in ("uniform", "difficulty"):
        said = []
        source = PromptSource(rows, tokenizer, DataConfig(shuffle_dataset=False, on_bad_row="skip", sampler=sampler),
                              images=images, curriculum=None if sampler == "uniform" else _always(bad_at))
        source.log = said.append
        served = [p for _ in range(2) for p in source.next_batch(len(rows) // 2)]
        assert len(served) == len(rows) // 2 * 2 and source.metrics()["data/skipped_rows"] >= 1, sampler
        assert all(p.images for p in served) and f"data row {bad_at}" in said[0], (sampler, said)


def _always(row: int):
    """A curriculum that chooses `row` first, then row 0 (as orchestrator/data/curriculum.py's choose/observe)."""
    class Always:
        first = True

        def choose(self, k: int) -> list[int]:
            out = ([row] if self.first else []) + [0] * (k - self.first)
            self.first = False
            return out

        def observe(self, *_) -> None: ...

        def metrics(self) -> dict[str, float]:
            return {}
    return Always()
