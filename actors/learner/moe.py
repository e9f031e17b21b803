"""A mixture-of-experts policy's parts of the train step, chosen when the learner is built: routing replay
(`replay_part`, grpo.router_replay; the mechanism is actors/learner/routing.py) and the load-balancing loss
(`aux_loss_part`, TRL's rule). A dense model, or an MoE trained as it routes, gets the null parts.

Replay parts answer, for one step (its `StepContext`):
- `step_routes(batch, plan, rows)`: the routes each micro-batch replays, as the step starts;
- `first_pass(ctx, slot)`: metrics from the step's first pass, before the slot's forward and backward;
- `around(ctx, slot, first)`: a context around the slot's forward and backward (replay, or record);
- `around_sequence(rows, routes, length)`: the same around `Learner.sequence_logprobs`.

Every slot runs the same forwards on every rank (under FSDP a forward is a collective): a padding slot runs
R3's first-pass forward too, and reports nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import Tensor

from actors.learner.layout import Forward, Packed, Padded
from actors.learner.micro_batches import MicroBatchPlan, Slot
from actors.learner.model import eval_mode
from actors.learner.routing import MODES, Replay, agreement, aux_loss_coef, layout_flags, layout_routes
from actors.learner.sampling import logp_gap, sampler_logps
from actors.learner.step import StepContext
from actors.types import TrainBatch


class NoReplay:
    """Every forward routes its tokens itself."""

    replay: Replay | None = None

    def step_routes(self, batch: TrainBatch, plan: MicroBatchPlan, rows: dict[int, Packed | Padded]
                    ) -> dict[int, Tensor | None]:
        return {}

    def first_pass(self, ctx: StepContext, slot: Slot) -> dict[str, float]:
        return {}

    def around(self, ctx: StepContext, slot: Slot, first: bool) -> AbstractContextManager[None]:
        return contextlib.nullcontext()

    def around_sequence(self, rows: Packed | Padded, routes: Any, length: int
                        ) -> AbstractContextManager[None]:
        return contextlib.nullcontext()


class _Replaying(NoReplay):
    def __init__(self, replay: Replay) -> None:
        self.replay = replay

    def around_sequence(self, rows: Packed | Padded, routes: Any, length: int
                        ) -> AbstractContextManager[None]:
        """Replay the engine's routing of one sequence (routes [length, layers, top_k]; None: its own)."""
        if routes is not None:
            routes = layout_routes(rows.source, [routes], [length], self.replay.num_layers, self.replay.top_k)
        return self.replay.replaying(routes)


class RecordThenReplay(_Replaying):
    """R2: the first pass records each micro-batch's routing, the later passes (num_iterations) replay it."""

    @contextlib.contextmanager
    def around(self, ctx: StepContext, slot: Slot, first: bool) -> Iterator[None]:
        if not first:
            with self.replay.replaying(ctx.routes.get(slot.micro_batch)):
                yield
            return
        with self.replay.recording() as recorded:
            yield
        if not slot.padding:
            ctx.routes[slot.micro_batch] = self.replay.stack(recorded)


class EngineReplay(_Replaying):
    """R3: every forward of the step replays the engine's routes (TrainBatch.routes); the first pass also
    measures the learner's own routing against them."""

    def __init__(self, replay: Replay, model: torch.nn.Module, forward: Forward) -> None:
        """model, forward: the policy and the learner's log-prob forward, for the first pass's own routing."""
        super().__init__(replay)
        self.model, self.forward = model, forward

    def step_routes(self, batch: TrainBatch, plan: MicroBatchPlan, rows: dict[int, Packed | Padded]
                    ) -> dict[int, Tensor | None]:
        """Each micro-batch's routes in its layout, from the engine's."""
        if batch.routes is None:
            raise ValueError("grpo.router_replay R3: the batch carries no routes (the generators did not "
                             "record them)")
        out: dict[int, Tensor | None] = {}
        for j, mb in rows.items():
            idx = plan.micro_batches[j]
            lengths = [len(batch.prompt_ids[i]) + len(batch.completion_ids[i]) for i in idx]
            out[j] = layout_routes(mb.source, [batch.routes[i] for i in idx], lengths, self.replay.num_layers,
                                   self.replay.top_k)
        return out

    def around(self, ctx: StepContext, slot: Slot, first: bool) -> AbstractContextManager[None]:
        return self.replay.replaying(ctx.routes.get(slot.micro_batch))

    @torch.no_grad()
    def first_pass(self, ctx: StepContext, slot: Slot) -> dict[str, float]:
        """One forward without replay, recording the learner's own routing: the fraction of model tokens'
        (token, layer) expert sets equal to the engine's, and the logprob gap to the sampler without replay
        (the trained one, with replay, is sampling/sampling_logp_difference)."""
        rows, routes = ctx.rows[slot.micro_batch], ctx.routes[slot.micro_batch]
        with eval_mode(self.model), self.replay.recording() as recorded:
            logp, _ = self.forward(self.model, rows, with_entropy=False)
        if slot.padding or routes is None:
            return {}
        batch, idx, mask = ctx.batch, ctx.samples(slot), ctx.masks[slot.micro_batch]
        flags = []
        for r, i in enumerate(idx):
            model_tokens = mask[r, : len(batch.completion_ids[i])].bool().tolist()
            flags.append([False] * len(batch.prompt_ids[i]) + model_tokens)
        agree, pairs = agreement(self.replay.stack(recorded), routes, layout_flags(rows.source, flags))
        out = {"routing/agreement": agree} if pairs else {}
        gap = logp_gap(logp, sampler_logps(logp, [batch.sampling_logprobs[i] for i in idx]), mask)
        if "sampling/sampling_logp_difference/mean" in gap:
            out["routing/logp_difference_without_replay/mean"] = gap["sampling/sampling_logp_difference/mean"]
            out["routing/logp_difference_without_replay/max"] = gap["sampling/sampling_logp_difference/max"]
        return out


def replay_part(mode: str | None, model: torch.nn.Module, ref_model: torch.nn.Module | None, forward: Forward
                ) -> NoReplay | RecordThenReplay | EngineReplay:
    """The part for grpo.router_replay: None, "R2" or "R3". A separate reference model replays the same
    routes."""
    if mode is None:
        return NoReplay()
    if mode not in MODES:
        raise ValueError(f"grpo.router_replay {mode!r}: one of {MODES} or None")
    replay = Replay(model, *([ref_model] if ref_model is not None else []))
    return RecordThenReplay(replay) if mode == "R2" else EngineReplay(replay, model, forward)


class NoAuxLoss:
    """No load-balancing loss: a dense model, or its weight 0 (TRL's rule: off)."""

    coef = 0.0

    def forward_kwargs(self) -> dict[str, Any]:
        return {}

    def added(self, loss: Tensor, aux: Tensor | None, grad_accum_steps: int, ctx: StepContext) -> Tensor:
        return loss

    def added_zero(self, loss: Tensor, aux: Tensor | None) -> Tensor:
        return loss


class RouterAuxLoss:
    """The routers' load-balancing loss (the model's aux_loss), weighted as TRL weights it."""

    def __init__(self, coef: float) -> None:
        self.coef = coef

    def forward_kwargs(self) -> dict[str, Any]:
        """The policy forward's arguments that make it return its aux_loss."""
        return {"output_router_logits": True}

    def added(self, loss: Tensor, aux: Tensor | None, grad_accum_steps: int, ctx: StepContext) -> Tensor:
        """TRL: loss + coef x aux_loss / gradient accumulation steps, aux_loss logged. A model whose forward
        makes no aux_loss (`aux` None: Llama 4's, for one) adds nothing."""
        if aux is None:
            return loss
        ctx.sums["aux_loss"].append(aux.item())
        return loss + self.coef * aux / grad_accum_steps

    def added_zero(self, loss: Tensor, aux: Tensor | None) -> Tensor:
        """A padding slot's: aux_loss with weight 0, so its backward runs through the routers as the
        others'."""
        return loss if aux is None else loss + aux * 0.0


def aux_loss_part(model: torch.nn.Module, coef: float | None) -> NoAuxLoss | RouterAuxLoss:
    """The part for grpo.router_aux_loss_coef by TRL's rule (routing.aux_loss_coef: None = the model
    config's)."""
    weight = aux_loss_coef(model, coef)
    return RouterAuxLoss(weight) if weight else NoAuxLoss()
