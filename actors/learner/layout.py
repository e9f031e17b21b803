"""How one micro-batch is laid out for the policy's forward: padded (TRL's layout, the reference) or packed
(padding-free, grpo.padding_free). Either way the forward yields each completion token's logits, and the
log-probs come back in the padded [B, T] layout the loss takes (B = samples, T = their longest completion).

Padded: prompts left-padded to the longest prompt P, completions right-padded to T, an attention mask, positions
counted from each row's first real token; the model computes the logits of the last T + 1 positions only.

Packed: samples (prompt + completion) concatenated into rows with no pad between them, position_ids restarting
at 0 at each sample, `attention_mask=None` and `use_cache=False`. transformers 5.19 then computes every sample as
if alone:

* mask-based attention (eager, sdpa, flex_attention) builds a block-diagonal causal mask from the position_ids
  resets, but only with no attention mask and no cache (masking_utils `_preprocess_mask_arguments`); a model's
  forward makes a cache from `config.use_cache` unless told not to, and its tokens then attend across samples,
  silently;
* flash attention reads the samples' bounds from position_ids only in a batch of ONE row
  (modeling_flash_attention_utils `_is_packed_sequence`): its micro-batches are packed into one row.

Mask-based attention computes dense scores over a whole row (O(row length^2)), so those rows are capped at the
padded layout's row length P + T (longest prompt + longest completion): with at most B rows, rows x (P + T)^2 is
at most the padded layout's B x (P + T)^2, and packing never does more attention work than padding. Rows shorter than
the longest end in pad positions (a sample of their own: their position_ids restart too), so the pad left is the rows'
ragged ends, not every sample's. The output head computes the positions that predict completion tokens only
(`head_only`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from actors.learner.micro_batches import token_bins

# Attention implementations whose packed rows transformers 5.19 computes as separate samples, and how.
MASK_ATTENTION = ("eager", "sdpa", "flex_attention")  # block-diagonal mask from position_ids, any number of rows
VARLEN_ATTENTION = ("flash_attention_2", "flash_attention_3")  # cu_seqlens from position_ids, one row only
# config.layer_types of a stack of attention layers only. Linear-attention, state-space and convolution layers
# (Qwen3-Next, Qwen3.5's gated delta net, LFM2, Jamba) carry state along the row across position_ids resets.
ATTENTION_LAYERS = ("full_attention", "sliding_attention")


# The learner's log-prob forward of a micro-batch: (model, rows, with_entropy) -> ([B, T] log-probs, [B, T]
# entropy or None); its parts (the packing probe, routing replay's first pass) run it on rows of their own.
Forward = Callable[..., tuple[Tensor, Tensor | None]]


def packing_refusal(model: torch.nn.Module) -> str | None:
    """Why packed rows of this model (its architecture and attention implementation, as built) would not be
    computed as separate samples, or None where they are. Works on a meta-device model (no weights)."""
    config = model.config
    kind = type(model).__name__
    if getattr(config, "vision_config", None) is not None:
        return (f"{kind} is a vision-language model: its rotary positions come from its images (multimodal "
                "positions, computed from each padded row), which packed rows' per-sample position_ids do not carry")
    impl = config._attn_implementation
    if impl not in MASK_ATTENTION + VARLEN_ATTENTION:
        return (f"{kind} runs attention implementation {impl!r}; packed rows need one of "
                f"{list(MASK_ATTENTION + VARLEN_ATTENTION)}")
    other = sorted(set(getattr(config, "layer_types", None) or ()) - set(ATTENTION_LAYERS))
    if other:
        return f"{kind} has {other} layers, which carry state across the samples of a packed row"
    if not getattr(model, "_supports_attention_backend", False):
        return (f"{kind} does not build its attention masks with transformers' attention interface "
                "(_supports_attention_backend is False), which is what reads the samples' bounds from position_ids")
    if model.get_output_embeddings() is None:
        return f"{kind} has no output embeddings (get_output_embeddings() is None)"
    return None


def _ids(tokens: list[list[int]], device: torch.device) -> Tensor:
    return torch.tensor(tokens, dtype=torch.long, device=device)


@dataclass(frozen=True)
class Padded:
    """One micro-batch in TRL's padded layout."""

    input_ids: Tensor  # [B, P + T]
    attention_mask: Tensor  # [B, P + T]: 1 on real tokens
    position_ids: Tensor | None  # [B, P + T]: counted from each row's first real token; None: the model computes
    # its own (a vision-language model's multimodal rotary positions, from the ids, the images and the mask)
    targets: Tensor  # [B, T]: each completion, right-padded
    real_tokens: int  # prompt + completion tokens of its samples
    # [B, P + T]: each position's index into its samples' sequences (prompt + completion) laid end to end, -1 at
    # pad: where per-token records of the samples (routing replay's routes) go in this layout
    source: Tensor | None = None
    # The forward's other inputs for these rows: a vision-language model's image inputs (actors/vision.py
    # Images.model_inputs: pixel_values, image_grid_thw, ...; and mm_token_type_ids [B, P + T] where the model
    # takes it). Empty for text.
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.targets.shape)  # type: ignore[return-value]

    @property
    def positions(self) -> int:
        """Positions the forward computes, pad included."""
        return self.input_ids.numel()

    def logits(self, model: torch.nn.Module, **extra: Any) -> tuple[Tensor, Tensor | None]:
        """[B, T, V]: position P - 1 + j predicts completion token j; and the model's aux_loss (MoE, with
        output_router_logits in `extra`) or None."""
        t = self.targets.shape[1]
        out = model(input_ids=self.input_ids, attention_mask=self.attention_mask, position_ids=self.position_ids,
                    logits_to_keep=t + 1, use_cache=False, **self.extra, **extra)
        return out.logits[:, :-1], getattr(out, "aux_loss", None)

    def unflatten(self, values: Tensor) -> Tensor:
        return values  # already [B, T]


def pad(prompts: list[list[int]], completions: list[list[int]], pad_id: int, device: torch.device) -> Padded:
    p_max = max(len(p) for p in prompts)
    t_max = max(max(len(c) for c in completions), 1)
    ids, attn, tgt, src = [], [], [], []
    start = 0
    for p, c in zip(prompts, completions, strict=True):
        n = len(p) + len(c)
        src.append([-1] * (p_max - len(p)) + list(range(start, start + n)) + [-1] * (t_max - len(c)))
        start += n
        ids.append([pad_id] * (p_max - len(p)) + p + c + [pad_id] * (t_max - len(c)))
        attn.append([0] * (p_max - len(p)) + [1] * (len(p) + len(c)) + [0] * (t_max - len(c)))
        tgt.append(c + [0] * (t_max - len(c)))
    attention_mask = _ids(attn, device)
    positions = (attention_mask.cumsum(1) - 1).clamp(min=0)
    real = sum(len(p) + len(c) for p, c in zip(prompts, completions, strict=True))
    return Padded(_ids(ids, device), attention_mask, positions, _ids(tgt, device), real, _ids(src, device))


@dataclass(frozen=True)
class Packed:
    """One micro-batch packed into R rows of N positions. M = its completion tokens."""

    input_ids: Tensor  # [R, N]
    position_ids: Tensor  # [R, N]: 0, 1, ... from each sample's first token (and from a row's pad end)
    keep: Tensor  # [M]: flat indices into the R * N positions of those predicting a completion token
    targets: Tensor  # [M]: the completion tokens they predict
    sample: Tensor  # [M]: the sample (row of the padded [B, T] layout) each belongs to
    offset: Tensor  # [M]: its index in that sample's completion (column of [B, T])
    shape: tuple[int, int]  # (B, T) of the padded layout
    real_tokens: int
    source: Tensor | None = None  # [R, N]: as Padded.source

    @property
    def positions(self) -> int:
        return self.input_ids.numel()

    def logits(self, model: torch.nn.Module, **extra: Any) -> tuple[Tensor, Tensor | None]:
        """[M, V]: the output head run on the `keep` positions only; and the model's aux_loss, as Padded's."""
        with head_only(model, self.keep):
            out = model(input_ids=self.input_ids, position_ids=self.position_ids, attention_mask=None,
                        logits_to_keep=0, use_cache=False, **extra)
        return out.logits[0], getattr(out, "aux_loss", None)

    def unflatten(self, values: Tensor) -> Tensor:
        """[M] per completion token -> [B, T] (0 at the padded layout's pad), differentiably."""
        return values.new_zeros(self.shape).index_put((self.sample, self.offset), values)


def pack(
    prompts: list[list[int]], completions: list[list[int]], pad_id: int, device: torch.device, *, one_row: bool
) -> Packed:
    """Samples into rows: one row (`one_row`: flash attention), or first-fit-decreasing rows of at most the
    padded layout's row length (mask-based attention, see the module docstring); rows end-padded to the longest."""
    lens = [len(p) + len(c) for p, c in zip(prompts, completions, strict=True)]
    cap = sum(lens) if one_row else max(len(p) for p in prompts) + max(len(c) for c in completions)
    bins, _ = token_bins([(len(p), len(c)) for p, c in zip(prompts, completions, strict=True)],
                         list(range(len(lens))), cap, padded=False)
    width = max(b.tokens for b in bins)
    ids: list[list[int]] = []
    pos: list[list[int]] = []
    src: list[list[int]] = []
    starts = [sum(lens[:i]) for i in range(len(lens))]  # each sample's first index in the samples laid end to end
    keep, targets, sample, offset = [], [], [], []
    for r, b in enumerate(bins):
        row: list[int] = []
        for i in b.rows:
            p, c = prompts[i], completions[i]
            start = r * width + len(row) + len(p) - 1  # the last prompt token predicts completion token 0
            keep += range(start, start + len(c))
            targets += c
            sample += [i] * len(c)
            offset += range(len(c))
            row += p + c
        src.append([j for i in b.rows for j in range(starts[i], starts[i] + lens[i])] + [-1] * (width - len(row)))
        ids.append(row + [pad_id] * (width - len(row)))
        pos.append([j for i in b.rows for j in range(lens[i])] + list(range(width - len(row))))
    t_max = max(max(len(c) for c in completions), 1)
    return Packed(_ids(ids, device), _ids(pos, device), _ids(keep, device), _ids(targets, device),
                  _ids(sample, device), _ids(offset, device), (len(prompts), t_max), sum(lens), _ids(src, device))


@contextlib.contextmanager
def head_only(model: torch.nn.Module, keep: Tensor) -> Iterator[None]:
    """While in this context, the model's output head computes only the positions `keep` ([M] flat indices into the
    [R, N] positions), as one [1, M, V] row. transformers' `logits_to_keep` index applies to every row alike, so
    with several rows holding different samples it would compute the union of their positions (prompts
    included); this gathers the exact ones before the head. A pre-hook on the head module runs inside the model's
    forward, where FSDP has gathered the head's weight."""
    head = model.get_output_embeddings()

    def gather(_module: torch.nn.Module, args: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
        hidden = args[0]
        return (hidden.reshape(-1, hidden.shape[-1])[keep].unsqueeze(0), *args[1:])

    handle = head.register_forward_pre_hook(gather)
    try:
        yield
    finally:
        handle.remove()
