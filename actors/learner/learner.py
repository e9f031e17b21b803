"""Learner: the policy in torch, the GRPO update, and the weights the generators load after each step.

A plain class (Ray wraps it in `actors.runtime.group`), built from frozen specs (actors/learner/specs.py) that the driver
builds once from the run config; the GRPO loss is this package's own (actors/learner/loss.py), configured by the
spec's `LossConfig`, so this file depends on torch and transformers, never on the driver.

One `train_step(batch)` consumes one generation batch: it is split into micro-batches (of `micro_batch_size`
completions, or token-budget bins of `max_tokens_per_microbatch` positions: actors/learner/micro_batches.py) with
gradient accumulation, and trained on `num_iterations` times (one optimizer step each), with the old, reference
and importance-sampling terms frozen at the first pass, as TRL buffers them. Each micro-batch is laid out padded
(TRL's layout) or packed with no pad (`padding_free`: actors/learner/layout.py); the log-probs come back in the
padded [B, T] layout either way, so the loss and its normalisers are the same code for both.

Several ranks (`strategy="fsdp"`, `world_size` > 1; one Ray actor each, or one process each in tests) form
one torch.distributed process group (gloo on CPU, NCCL on CUDA) and shard the policy and the reference
model with FSDP2 (`fully_shard` on every decoder layer and on the root). Data parallelism keeps the
single-rank numbers: every rank receives the whole batch, cuts the single-rank micro-batches and trains on its
share of them (actors/learner/micro_batches.py). Each micro-batch loss keeps the single-rank normalisers
(grad_accum_steps = the micro-batches of the WHOLE step; num_items_in_batch, num_sequences = the whole batch's loss
tokens and sequences), and FSDP sums (does not average) the gradients over ranks, so the summed gradient is the single-rank one for every
loss_type. A rank with fewer micro-batches runs zero-weight padding slots: FSDP's all-gathers and
reduce-scatters need every rank in every forward and backward. Metrics are gathered from all ranks, so
every rank (rank 0 reports) returns the global ones.

Gradient checkpointing (transformers' `gradient_checkpointing_enable`, TRL's default) recomputes each decoder
layer's activations in the backward pass: the same loss and gradients for less memory. LoRA (`lora`, PEFT's
LoraConfig arguments; actors/learner/lora.py) trains adapters only: the optimizer holds them, the KL reference is
the policy with adapters disabled, and the generators receive the merged weights.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import random
import time
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F

from actors.learner import checkpoint
from actors.learner.distributed import gather_metrics, place, sum_over_ranks
from actors.learner.layout import VARLEN_ATTENTION, Packed, Padded, pack, pad
from actors.learner.loss import LossInputs, loss_fn, vllm_importance_weights
from actors.learner.micro_batches import MicroBatchPlan, plan_micro_batches
from actors.learner.model import base_model, engine_view, eval_mode, load_policy, load_reference, pad_token_id
from actors.learner.model import meta_model as meta_model  # re-exported: orchestrator/run/build.py imports it
from actors.learner.optim import clip_gradients, make_optimizer
from actors.learner.packing import choose_packing, probe_gap
from actors.learner.routing import Replay, agreement, aux_loss_coef, layout_flags, layout_routes
from actors.learner.specs import LearnerSpec, ParallelSpec
from actors.runtime.cpus import describe, omp_waits
from actors.types import TrainBatch, TrainerState, TrainResult
from actors.vision import PIXEL_VALUES, PLACEHOLDER_BIAS, Images
from actors.weights.sender import WeightSender

logger = logging.getLogger("rayward.learner")

_eval = eval_mode  # its old name here, which tests/gpu/smoke.py imports


class Learner:
    def __init__(
        self,
        spec: LearnerSpec,
        *,
        reward_pool: Any = None,
        strategy: str = "single",
        rank: int = 0,
        world_size: int = 1,
        init_method: str | None = None,
    ):
        """spec: what to train and how (the same on every rank). strategy, rank, world_size, init_method: this rank's
        place (`ParallelSpec`; LearnerGroup passes them to each rank). reward_pool: a handle with `set_state`, to which
        every new optimizer step goes (TrainerState), awaited so that the next batch is scored under it; rank 0's
        alone, None elsewhere. A CPU learner computes on every core this process may use (actors/runtime/cpus.py), one torch
        thread per PARAMS_PER_THREAD parameters at most."""
        self.spec, self.loss_config = spec, spec.loss
        self.loss = loss_fn(spec.loss)  # picked once (actors/learner/loss.py); a bad setting fails before any load
        self.parallel = ParallelSpec(strategy, rank, world_size, init_method)
        self.rank, self.world_size, self.sharded = rank, world_size, self.parallel.sharded
        torch.manual_seed(spec.seed)
        random.seed(spec.seed)
        self.device, self.cores = place(self.parallel, spec.device)
        self.dtype = getattr(torch, spec.model.dtype)
        self.lora = spec.model.lora
        self.model, self.tied = load_policy(spec.model, self.dtype, self.device, self.sharded, self.cores)
        self.ref_model = load_reference(spec.model, spec.loss.beta, self.dtype, self.device, self.sharded)
        self.optimizer, self.scheduler = make_optimizer(self.model, spec.optim)
        self.pad_id = pad_token_id(self.model.config)
        # A vision-language model: its processor makes each micro-batch's pixel inputs (actors/vision.py).
        self.vision = (Images(spec.model.name_or_path, spec.model.processor_kwargs, spec.model.trust_remote_code)
                       if getattr(self.model.config, "vision_config", None) is not None else None)
        if self.vision is not None:
            self._placeholders = torch.tensor(self.vision.placeholder_ids, device=self.device)
            self._placeholder_bias = torch.tensor([PLACEHOLDER_BIAS] * len(self.vision.placeholder_ids),
                                                  device=self.device)
        self.one_row = self.model.config._attn_implementation in VARLEN_ATTENTION
        probe = functools.partial(probe_gap, self.model, self._forward_logps, self._lay_out, world_size)
        self.packed = choose_packing(spec.step.padding_free, base_model(self.model, self.lora is not None),
                                     self.dtype, probe)
        self.global_step = 0
        self._rng = random.Random(spec.seed)  # the micro-batch shuffle: the same draws on every rank
        self.reward_pool = reward_pool
        view = engine_view(self.model, self.tied, self.lora is not None)
        self.weights = WeightSender(self.model, view=view, dtype=self.dtype, rank=rank, device=self.device)
        # Mixture of experts: routing replay (actors/learner/routing.py) and the load-balancing loss (TRL's rule).
        mode = spec.step.router_replay
        others = [self.ref_model] if self.ref_model is not None else []
        self.replay = Replay(self.model, *others) if mode is not None else None
        self.aux_coef = aux_loss_coef(self.model, spec.step.router_aux_loss_coef)
        self._aux: torch.Tensor | None = None  # the last policy forward's aux_loss

    def ping(self) -> None:
        """The driver's hang check (called in the actor's health concurrency group, so it answers while a train
        step runs; a rank that does not answer is stopped or wedged)."""

    def cpu_threads(self) -> str:
        """How this rank computes, for the start-up log."""
        if self.device.type != "cpu":
            return f"{self.device}, {torch.get_num_threads()} CPU threads"
        return f"{torch.get_num_threads()} torch threads on {describe(self.cores)}{omp_waits()}"

    def __repr__(self) -> str:
        # Ray captures an actor's repr once (the dashboard's Repr column): only what never changes.
        n = sum(p.numel() for p in self.model.parameters())
        ranks = f", rank={self.rank}/{self.world_size} fsdp" if self.sharded else ""
        layout = ", packed" + (" (one row)" if self.one_row else "") if self.packed else ", padded"
        lora = ""
        if self.lora is not None:
            trained = sum(p.numel() for p in self.model.parameters() if p.requires_grad)
            lora = f", lora r={self.lora.get('r', 8)} trains {trained / 1e6:.3f}M"
        return f"Learner(params={n / 1e6:.2f}M, device={self.device}{ranks}{layout}{lora})"

    # --- log-probs ------------------------------------------------------------------------------------

    def _pad(self, prompts: list[list[int]], completions: list[list[int]]) -> Padded:
        return pad(prompts, completions, self.pad_id, self.device)

    def _pack(self, prompts: list[list[int]], completions: list[list[int]]) -> Packed:
        return pack(prompts, completions, self.pad_id, self.device, one_row=self.one_row)

    def _lay_out(self, prompts: list[list[int]], completions: list[list[int]], packed: bool
                 ) -> Packed | Padded:
        return self._pack(prompts, completions) if packed else self._pad(prompts, completions)

    def layout(self, prompts: list[list[int]], completions: list[list[int]],
               images: list[tuple[Any, ...]] | None = None) -> Packed | Padded:
        """A micro-batch of these samples as this learner's forward takes it: packed or padded; with images (a
        vision-language model, always padded), their pixel inputs and the model's own positions."""
        if self.vision is not None:
            return self._with_images(self._pad(prompts, completions), images or [() for _ in prompts])
        return self._pack(prompts, completions) if self.packed else self._pad(prompts, completions)

    def _with_images(self, rows: Padded, images: list[tuple[Any, ...]]) -> Padded:
        """Padded rows with their images' model inputs; positions left to the model (multimodal rotary positions
        need the images: transformers computes them from input_ids, the image grid and the attention mask, and
        marks which tokens are images with mm_token_type_ids [B, L] where the family takes it; without it
        Qwen2.5-VL silently falls back to text positions)."""
        assert self.vision is not None
        extra = {k: v.to(self.device) if isinstance(v, torch.Tensor) else v
                 for k, v in self.vision.model_inputs(images).items()}
        if PIXEL_VALUES in extra and extra[PIXEL_VALUES].is_floating_point():
            extra[PIXEL_VALUES] = extra[PIXEL_VALUES].to(self.dtype)
        if self._takes_token_types:
            extra["mm_token_type_ids"] = (rows.input_ids == self.vision.image_token_id).int()
        return dataclasses.replace(rows, position_ids=None, extra=extra)

    @functools.cached_property
    def _takes_token_types(self) -> bool:
        import inspect

        base = base_model(self.model, self.lora is not None)
        return "mm_token_type_ids" in inspect.signature(base.forward).parameters

    def _forward_logps(
        self, model: torch.nn.Module, rows: Packed | Padded, with_entropy: bool, with_aux: bool = False,
        sampled: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Per-token log-probs of the completion tokens at `temperature`: [B, T] (T = longest completion),
        and per-token entropy [B, T] if asked; 0 at the padded layout's pad positions when packed. with_aux: the
        forward also returns a mixture of experts' load-balancing loss, kept in self._aux. sampled: the
        distribution the engines sample from (a vision-language model's placeholders biased out, as they are);
        False: the model's own, as vLLM's prompt logprobs (the parity check).

        Either layout computes the logits of the positions that predict completion tokens only (the padded one: the
        last T + 1 of each row): the lm_head, a large share of a small model's compute (a 32k x 768 matrix is a
        quarter of a 100M model), never runs on prompt positions."""
        extra = {"output_router_logits": True} if with_aux else {}
        logits, self._aux = rows.logits(model, **extra)  # [B, T, V] padded, [M, V] packed
        # [.., V] tensors are the largest a long completion makes (a 32k vocabulary at T = 512: 64 MB per row),
        # so none is made that is not needed: no copy for float32 at temperature 1, the logits freed once the
        # log-softmax (which autograd keeps) exists, the entropy's product computed in place.
        if logits.dtype != torch.float32:
            logits = logits.float()
        if self.vision is not None and sampled:  # as the engines sample: never a placeholder (actors/vision.py)
            logits = logits.index_add(-1, self._placeholders, self._placeholder_bias.expand(
                *logits.shape[:-1], -1))
        if self.loss_config.temperature != 1.0:
            logits = logits / self.loss_config.temperature
        logps_all = F.log_softmax(logits, dim=-1)
        del logits
        logps = logps_all.gather(-1, rows.targets.unsqueeze(-1)).squeeze(-1)
        entropy = None
        if with_entropy:
            with torch.no_grad():
                entropy = rows.unflatten(-logps_all.exp().mul_(logps_all).sum(-1))
        return rows.unflatten(logps), entropy

    @torch.no_grad()
    def sequence_logprobs(self, token_ids: list[int], routes: Any = None,
                          images: tuple[Any, ...] | None = None) -> list[float]:
        """Log-probs of tokens 1..end of a fixed sequence (for the generator-learner parity check), in this
        learner's layout. routes: the engine's routing of the sequence ([len(token_ids), layers, top_k]), replayed
        where this learner replays routing (grpo.router_replay R3), as its train steps do. images: those the ids'
        placeholders stand for (a vision-language model)."""
        rows = self.layout([token_ids[:1]], [token_ids[1:]], [images or ()])
        replayed = None
        if routes is not None and self.replay is not None:
            replayed = layout_routes(rows.source, [routes], [len(token_ids)], self.replay.num_layers,
                                     self.replay.top_k)
        replaying = self.replay.replaying(replayed) if self.replay is not None else contextlib.nullcontext()
        with _eval(self.model), replaying:
            logps, _ = self._forward_logps(self.model, rows, False, sampled=False)
        return logps[0].tolist()

    # --- the update -----------------------------------------------------------------------------------

    def train_step(self, batch: TrainBatch, reward_state: TrainerState | None = None) -> TrainResult:
        """Runs num_iterations optimizer steps on the batch; returns the new global_step and the step's metrics
        averaged over micro-batches (global over ranks). reward_state (max_steps, epoch) is pushed to the reward pool
        with each new global_step. With several ranks every rank gets the whole batch and trains on its slots."""
        t0 = time.perf_counter()
        step = self.spec.step
        plan = self._plan(batch)
        masks = [self._loss_mask(batch, idx) for idx in plan.micro_batches]
        num_items = sum(m.sum() for m in masks)  # dapo normaliser: loss tokens in the whole generation batch
        rows = {j: self.layout([batch.prompt_ids[i] for i in plan.micro_batches[j]],
                               [batch.completion_ids[i] for i in plan.micro_batches[j]],
                               None if batch.images is None else [batch.images[i] for i in plan.micro_batches[j]])
                for j in {slot.micro_batch for slot in plan.slots}}
        frozen: list[LossInputs | None] = [None] * len(plan.slots)  # each real slot's inputs bar the live logp
        sums: dict[str, list[float]] = defaultdict(list)
        losses, norms = [], []
        routes = self._batch_routes(batch, plan, rows)  # R3: per micro-batch, the engine's; R2: filled at the 1st pass
        for it in range(step.num_iterations):
            self.optimizer.zero_grad(set_to_none=True)
            total_loss = 0.0
            for s, slot in enumerate(plan.slots):
                idx, mb = plan.micro_batches[slot.micro_batch], rows[slot.micro_batch]
                first = it == 0
                if first and step.router_replay == "R3":  # every slot: a forward is a collective under FSDP
                    metrics = self._routing_metrics(batch, idx, mb, masks[slot.micro_batch], routes[slot.micro_batch])
                    for k, v in metrics.items() if not slot.padding else ():
                        sums[k].append(v)
                with self._routing(routes, slot.micro_batch, first) as recorded:
                    total_loss += self._slot(batch, plan, slot, s, idx, mb, first, masks, num_items, frozen, sums)
                if recorded is not None and not slot.padding:
                    routes[slot.micro_batch] = self.replay.stack(recorded)  # R2: replayed by the later passes
            grad_norm = clip_gradients(self.model, self.spec.optim.max_grad_norm, self.sharded)
            self.weights.settle()  # an overlapped weight send reads the parameters until it is done
            self.optimizer.step()
            self.scheduler.step()
            self.global_step += 1
            self._push_state(reward_state)
            losses.append(total_loss)
            norms.append(grad_norm)
        out = self._step_metrics(sums, losses, norms)
        out["learning_rate"] = self.scheduler.get_last_lr()[0]
        compute_s = time.perf_counter() - t0
        out.update(self._throughput_metrics(plan, rows, batch, compute_s))
        return TrainResult(global_step=self.global_step, metrics=out, num_tokens=float(num_items), compute_s=compute_s)

    def _slot(
        self, batch: TrainBatch, plan: MicroBatchPlan, slot: Any, s: int, idx: list[int], mb: Packed | Padded,
        first: bool, masks: list[torch.Tensor], num_items: Any, frozen: list[LossInputs | None],
        sums: dict[str, list[float]],
    ) -> float:
        """One slot's forward and backward; returns its loss. At the first pass (`first`) the old, reference and
        importance-sampling terms are frozen into frozen[s] and the step's per-sample metrics go to `sums`."""
        logp, entropy = self._forward_logps(self.model, mb, with_entropy=first and not slot.padding,
                                            with_aux=bool(self.aux_coef))
        aux = self._aux  # this forward's (the reference forward below sets its own)
        if slot.padding:  # zero gradient through every sharded unit; the ref forward keeps the lockstep too
            if first:
                self._ref_logps(mb)
            loss = (logp * 0.0).sum()
            if aux is not None:
                loss = loss + aux * 0.0
            loss.backward()
            return 0.0
        mask = masks[slot.micro_batch]
        if first:  # old / ref / IS terms frozen at the first pass (no optimizer step has happened yet)
            sampling = [batch.sampling_logprobs[i] for i in idx]
            is_weights, is_metrics = self._is_weights(logp.detach(), sampling, mask,
                                                      by_turn=batch.completion_mask is not None)
            for k, v in is_metrics.items():
                sums[k].append(v)
            sums["entropy"].append(((entropy * mask).sum() / mask.sum().clamp(min=1)).item())
            frozen[s] = LossInputs(
                logp.detach(),  # replaced by the live logp on every pass
                old_logp=logp.detach() if self.spec.step.num_iterations > 1 else None,
                advantages=torch.tensor([batch.advantages[i] for i in idx], dtype=torch.float32,
                                        device=self.device),
                mask=mask,
                ref_logp=self._ref_logps(mb),
                is_weights=is_weights,
                num_items_in_batch=num_items,
                grad_accum_steps=plan.grad_accum_steps,
                num_sequences=len(batch),
                teacher_logp=_teacher_logps(batch, idx, logp) if batch.teacher_logprobs is not None else None,
            )
        result = self.loss(dataclasses.replace(frozen[s], logp=logp))
        loss = result.loss
        if aux is not None:  # TRL: coef x aux_loss / gradient accumulation steps, logged as aux_loss
            loss = loss + self.aux_coef * aux / plan.grad_accum_steps
            sums["aux_loss"].append(aux.item())
        loss.backward()
        for k, v in result.metrics.items():
            if not torch.isnan(v):
                sums[k].append(v.item())
        return result.loss.item()

    # --- routing replay (mixture of experts) -----------------------------------------------------------

    def _batch_routes(self, batch: TrainBatch, plan: MicroBatchPlan, rows: dict[int, Packed | Padded]
                      ) -> dict[int, torch.Tensor | None]:
        """R3: each micro-batch's routes in its layout, from the engine's (TrainBatch.routes). R2 and no replay:
        empty (R2 fills it at the first pass)."""
        if self.replay is None or self.spec.step.router_replay != "R3":
            return {}
        if batch.routes is None:
            raise ValueError("grpo.router_replay R3: the batch carries no routes (the generators did not record "
                             "them)")
        out: dict[int, torch.Tensor | None] = {}
        for j, mb in rows.items():
            idx = plan.micro_batches[j]
            lengths = [len(batch.prompt_ids[i]) + len(batch.completion_ids[i]) for i in idx]
            out[j] = layout_routes(mb.source, [batch.routes[i] for i in idx], lengths, self.replay.num_layers,
                                   self.replay.top_k)
        return out

    @contextlib.contextmanager
    def _routing(self, routes: dict[int, torch.Tensor | None], j: int, first: bool
                 ) -> Iterator[dict[int, torch.Tensor] | None]:
        """Around one slot's forward and backward: replay micro-batch j's routes if there are any; R2's first pass
        records instead (yields the recording; None otherwise)."""
        if self.replay is None:
            yield None
        elif self.spec.step.router_replay == "R2" and first:
            with self.replay.recording() as recorded:
                yield recorded
        else:
            with self.replay.replaying(routes.get(j)):
                yield None

    @torch.no_grad()
    def _routing_metrics(self, batch: TrainBatch, idx: list[int], mb: Packed | Padded, mask: torch.Tensor,
                         routes: torch.Tensor | None) -> dict[str, float]:
        """R3, at the first pass: one forward without replay, recording the learner's own routing: the fraction of
        model tokens' (token, layer) expert sets equal to the engine's, and the logprob gap to the sampler without
        replay (the trained one, with replay, is sampling/sampling_logp_difference)."""
        assert self.replay is not None
        with _eval(self.model), self.replay.recording() as recorded:
            logp, _ = self._forward_logps(self.model, mb, with_entropy=False)
        if routes is None:
            return {}
        own = self.replay.stack(recorded)
        flags = []
        for r, i in enumerate(idx):
            model_tokens = mask[r, : len(batch.completion_ids[i])].bool().tolist()
            flags.append([False] * len(batch.prompt_ids[i]) + model_tokens)
        where = layout_flags(mb.source, flags)
        agree, pairs = agreement(own, routes, where)
        out = {"routing/agreement": agree} if pairs else {}
        _, gap = self._is_weights(logp, [batch.sampling_logprobs[i] for i in idx], mask, apply=False)
        if "sampling/sampling_logp_difference/mean" in gap:
            out["routing/logp_difference_without_replay/mean"] = gap["sampling/sampling_logp_difference/mean"]
            out["routing/logp_difference_without_replay/max"] = gap["sampling/sampling_logp_difference/max"]
        return out

    def _plan(self, batch: TrainBatch) -> MicroBatchPlan:
        """This step's micro-batches and this rank's slots; warns about samples longer than the token budget."""
        step = self.spec.step
        sizes = [(len(p), len(c)) for p, c in zip(batch.prompt_ids, batch.completion_ids, strict=True)]
        plan = plan_micro_batches(sizes, step.micro_batch_size, self.rank, self.world_size, self._rng,
                                  max_tokens=step.max_tokens_per_microbatch, padded=not self.packed)
        if plan.oversized and self.rank == 0:
            logger.warning(
                "grpo.max_tokens_per_microbatch %d: %d sample(s) of %s tokens are longer; each trains in a "
                "micro-batch of its own", step.max_tokens_per_microbatch, len(plan.oversized),
                sorted((sum(sizes[i]) for i in plan.oversized), reverse=True),
            )
        return plan

    def _throughput_metrics(
        self, plan: MicroBatchPlan, rows: dict[int, Packed | Padded], batch: TrainBatch, compute_s: float
    ) -> dict[str, float]:
        """learner/tokens_per_s: the batch's prompt + completion tokens, once per optimizer step, per second of
        train_step; learner/padding_frac: the pad share of the positions the policy forwards computed (every
        rank's real micro-batches); learner/micro_batches: micro-batches in the step (all ranks)."""
        real = sum(len(p) + len(c) for p, c in zip(batch.prompt_ids, batch.completion_ids, strict=True))
        mine = [rows[slot.micro_batch] for slot in plan.slots if not slot.padding]
        counted, positions = sum_over_ranks(
            [float(sum(r.real_tokens for r in mine)), float(sum(r.positions for r in mine))], self.world_size
        )
        return {
            "learner/tokens_per_s": real * self.spec.step.num_iterations / compute_s,
            "learner/padding_frac": 1.0 - counted / positions if positions else 0.0,
            "learner/micro_batches": float(plan.grad_accum_steps),
        }

    def _loss_mask(self, batch: TrainBatch, idx: list[int]) -> torch.Tensor:
        """[B, T] for the rows `idx` (T = their longest completion): 1 on each completion's tokens the model sampled
        (TrainBatch.completion_mask; every token without one), 0 on the rest; all 0 for a truncated completion
        with mask_truncated_completions."""
        lens = [len(batch.completion_ids[i]) for i in idx]
        m = torch.zeros(len(idx), max(max(lens), 1))
        for r, (i, ln) in enumerate(zip(idx, lens, strict=True)):
            if self.spec.step.mask_truncated_completions and batch.truncated[i]:
                continue
            m[r, :ln] = 1.0 if batch.completion_mask is None else torch.tensor(batch.completion_mask[i])
        return m.to(self.device)

    def _step_metrics(
        self, sums: dict[str, list[float]], losses: list[float], norms: list[float]
    ) -> dict[str, float]:
        """The step's metrics from every rank's per-micro-batch values: means, and the extremes of `_max` / `_min`
        names. loss: per optimizer step, the sum of its micro-batch losses (over ranks); grad_norm: already global
        (the norm of the full gradient)."""
        sums = gather_metrics(sums, self.world_size)
        sums["loss"] = sum_over_ranks(losses, self.world_size)
        sums["grad_norm"] = norms
        out = {k: sum(v) / len(v) for k, v in sums.items() if v and not k.endswith(("_max", "_min"))}
        out.update(
            {
                k: (max if k.endswith("_max") else min)(v)
                for k, v in sums.items()
                if v and k.endswith(("_max", "_min"))
            }
        )
        return out

    def _push_state(self, reward_state: TrainerState | None) -> None:
        if self.reward_pool is None:
            return
        import ray

        state = dataclasses.replace(reward_state or TrainerState(), global_step=self.global_step)
        ray.get(self.reward_pool.set_state.remote(state))

    def _ref_logps(self, rows: Packed | Padded) -> torch.Tensor | None:
        if self.loss_config.beta == 0.0:
            return None
        with torch.no_grad():
            if self.ref_model is not None:
                return self._forward_logps(self.ref_model, rows, with_entropy=False)[0]
            with self.model.disable_adapter(), _eval(self.model):  # LoRA: the base model, as TRL's reference
                return self._forward_logps(self.model, rows, with_entropy=False)[0]

    def _is_weights(
        self, old: torch.Tensor, sampling: list[list[float]], mask: torch.Tensor, by_turn: bool = False,
        apply: bool = True,
    ) -> tuple[torch.Tensor | None, dict[str, float]]:
        """Importance weights for the sampler-learner mismatch ([B, T] or [B, 1]; None without the correction), and
        their metrics with the logprob gap (the alarm for stale or garbage weights after a sync). old: [B, T] the
        learner's log-probs at the first pass; sampling: each row's vLLM log-probs; mask: [B, T] loss tokens.
        by_turn (multi-turn completions): the gap's max also per model turn (`.../max/turn_<k>`): a gap that grows
        with the turn is the sign of ids that drifted from what the engine saw. apply False: the gap's metrics
        only."""
        samp = torch.full_like(old, float("nan"))
        for r, lp in enumerate(sampling):
            samp[r, : len(lp)] = torch.tensor(lp, dtype=samp.dtype)
        metrics: dict[str, float] = {}
        valid = (mask > 0) & ~torch.isnan(samp)
        if valid.any():
            gaps = (old - samp).abs()
            gap = gaps[valid]
            metrics["sampling/sampling_logp_difference/mean"] = gap.mean().item()
            metrics["sampling/sampling_logp_difference/max"] = gap.max().item()
            if by_turn:
                turns = mask_turns(mask)
                for k in range(int(turns.max().item()) + 1):
                    here = valid & (turns == k)
                    if here.any():
                        metrics[f"sampling/sampling_logp_difference/max/turn_{k}"] = gaps[here].max().item()
        correction = self.loss_config.vllm_importance_sampling
        if correction is None or not apply:
            return None, metrics
        w = vllm_importance_weights(old, samp, mask, correction)
        wv = w[mask > 0] if w.shape == mask.shape else w.flatten()
        if wv.numel():
            metrics["sampling/importance_sampling_ratio/min"] = wv.min().item()
            metrics["sampling/importance_sampling_ratio/mean"] = wv.mean().item()
            metrics["sampling/importance_sampling_ratio/max"] = wv.max().item()
        return w, metrics

    # --- weights and checkpoints ----------------------------------------------------------------------

    def export_weights(self) -> bytes:
        """The policy's weights as safetensors bytes (the object-store weight-transfer backend)."""
        return self.weights.export_bytes()

    def weight_plan(self, bucket_mb: float) -> list[Any]:
        """The bucket plan of the collective weight transfer (the same on every rank)."""
        return self.weights.plan(bucket_mb)

    def open_weight_group(self, world_size: int, timeout_s: float) -> tuple[str, int]:
        """Rank 0 listens for the weight-transfer group's members; returns (host, port)."""
        return self.weights.open(world_size, timeout_s)

    def join_weight_group(self, generation: int) -> int:
        return self.weights.join(generation)

    def send_weights(self) -> dict[str, float]:
        """Broadcast the policy to every engine worker, bucket by bucket (every rank gathers; rank 0 sends)."""
        return self.weights.send()

    def start_send_weights(self, seq: int) -> None:
        """One rank: start weight sync `seq` in the background and return, so the next train step's forward and
        backward overlap it (the optimizer step waits for it). Its numbers: `send_result(seq)`."""
        self.weights.start(seq)

    def send_result(self, seq: int, timeout_s: float | None = None) -> dict[str, float]:
        """Weight sync `seq`'s numbers (send_weights's), once it has finished; its error if it failed. Called in
        the actor's concurrency group for it (actors/weights/transfer.py, SEND_GROUP), so it answers while a train
        step runs."""
        return self.weights.result(seq, timeout_s)

    def train_state(self) -> checkpoint.TrainState:
        """What a checkpoint saves and restores."""
        m = self.spec.model
        return checkpoint.TrainState(
            model=self.model, optimizer=self.optimizer, scheduler=self.scheduler, global_step=self.global_step,
            rank=self.rank, sharded=self.sharded, tied=self.tied, lora=self.lora is not None,
            model_path=m.name_or_path, trust_remote_code=m.trust_remote_code, shuffle=self._rng,
        )

    def save_checkpoint(self, path: str, extra: dict[str, Any] | None = None) -> str:
        return checkpoint.save(self.train_state(), path, extra)

    def load_checkpoint(self, path: str) -> dict[str, Any]:
        """Restores the policy, optimizer, scheduler and global_step; returns the checkpoint's run state."""
        self.weights.settle()
        state = checkpoint.load(self.train_state(), path)
        self.global_step = int(state["global_step"])
        return state

    def save_merged(self, path: str) -> str:
        """LoRA: the base with the adapter merged in (the generators' weights) and the tokenizer, as a plain HF model
        directory, written atomically by rank 0 (a collective under FSDP)."""
        if self.lora is None:
            raise ValueError("save_merged needs a LoRA learner: a full fine-tune's checkpoints are whole models already")
        return checkpoint.save_merged(self.train_state(), path, self.weights.full_state())


def mask_turns(mask: torch.Tensor) -> torch.Tensor:
    """[B, T] loss mask -> [B, T] model turn of each loss token, -1 elsewhere. A multi-turn completion's model
    turns are the runs of 1s in its mask (a tool result, never empty, separates two turns), counted from 0."""
    on = (mask > 0).long()
    starts = on.clone()
    starts[:, 1:] = on[:, 1:] * (1 - on[:, :-1])
    return torch.where(on > 0, starts.cumsum(-1) - 1, torch.full_like(on, -1))


def _teacher_logps(batch: TrainBatch, idx: list[int], like: torch.Tensor) -> torch.Tensor:
    """[B, T] the teacher's log-probs of micro-batch rows `idx` (on-policy distillation), laid out as the policy's
    (`like`): NaN past a row's completion and on a row the teacher gave none."""
    out = torch.full_like(like, float("nan"), requires_grad=False)
    for r, i in enumerate(idx):
        lp = batch.teacher_logprobs[i]
        if lp:
            out[r, : len(lp)] = torch.tensor(lp, dtype=out.dtype)
    return out
