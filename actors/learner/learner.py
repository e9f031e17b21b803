"""Learner: the policy in torch, the GRPO update, and the weights the generators load after each step.

A plain class (Ray wraps it in `actors.runtime.group`), built from frozen specs (actors/learner/specs.py) that
the driver builds once from the run config; the GRPO loss is this package's own (actors/learner/loss.py),
configured by the spec's `LossConfig`, so this file depends on torch and transformers, never on the driver.

One `train_step(batch)` consumes one generation batch: it is split into micro-batches (of `micro_batch_size`
completions, or token-budget bins of `max_tokens_per_microbatch` positions: actors/learner/micro_batches.py)
with gradient accumulation, and trained on `num_iterations` times (one optimizer step each), with the old,
reference and importance-sampling terms frozen at the first pass, as TRL buffers them. Each micro-batch is
laid out padded (TRL's layout) or packed with no pad (`padding_free`: actors/learner/layout.py, chosen by
actors/learner/packing.py); the log-probs come back in the padded [B, T] layout either way, so the loss and
its normalisers are the same code for both.

What a feature adds to the step comes from a part chosen once, from the spec and the model, when the learner
is built; each has a null implementation, so the step reads the same for every run:
- `inputs` (actors/learner/inputs.py): a vision-language model's image inputs and placeholder bias, or text;
- `routing` and `aux_loss` (actors/learner/moe.py): mixture-of-experts routing replay (R2, R3) and the
  load-balancing loss (TRL's rule);
- `correction` (actors/learner/sampling.py): the vLLM importance-sampling correction, and the sampler-learner
  log-prob gap it is measured by;
- `teacher` (actors/learner/teacher.py): on-policy distillation's teacher log-probs.

Loading the policy and its reference (LoRA, gradient checkpointing, FSDP) is actors/learner/model.py's, the
optimizer actors/learner/optim.py's, checkpoints actors/learner/checkpoint.py's and the weights the engines
load actors/weights/sender.py's.

Several ranks (`strategy="fsdp"`, `world_size` > 1; one Ray actor each, or one process each in tests) form one
torch.distributed process group (gloo on CPU, NCCL on CUDA) and shard the policy and the reference model with
FSDP2 (`fully_shard` on every decoder layer and on the root). Data parallelism keeps the single-rank numbers:
every rank receives the whole batch, cuts the single-rank micro-batches and trains on its share of them
(actors/learner/micro_batches.py). Each micro-batch loss keeps the single-rank normalisers (grad_accum_steps =
the micro-batches of the WHOLE step; num_items_in_batch, num_sequences = the whole batch's loss tokens and
sequences), and FSDP sums (does not average) the gradients over ranks, so the summed gradient is the
single-rank one for every loss_type. A rank with fewer micro-batches runs zero-weight padding slots: FSDP's
all-gathers and reduce-scatters need every rank in every forward and backward. Metrics are gathered from all
ranks, so every rank (rank 0 reports) returns the global ones.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import random
import time
from typing import Any

import torch
import torch.nn.functional as F

from actors.learner import checkpoint
from actors.learner.distributed import gather_records, place
from actors.learner.inputs import model_inputs
from actors.learner.layout import VARLEN_ATTENTION, Packed, Padded, pack, pad
from actors.learner.loss import LossInputs, loss_fn
from actors.learner.micro_batches import MicroBatchPlan, plan_micro_batches
from actors.learner.model import base_model, engine_view, eval_mode, load_policy, load_reference, pad_token_id
from actors.learner.moe import aux_loss_part, replay_part
from actors.learner.optim import clip_gradients, make_optimizer
from actors.learner.packing import choose_packing, probe_gap
from actors.learner.routing import Replay
from actors.learner.sampling import sampling_correction
from actors.learner.specs import LearnerSpec, ParallelSpec
from actors.learner.step import StepContext, loss_mask, step_metrics, throughput_metrics
from actors.learner.teacher import teacher_part
from actors.payloads import PayloadLost, resolve_training, token_record
from actors.runtime.cpus import describe, omp_waits
from actors.types import TrainBatch, TrainerState, TrainResult
from actors.vision import Images
from actors.weights.sender import WeightSender

logger = logging.getLogger("rayward.learner")


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
        """spec: what to train and how (the same on every rank). strategy, rank, world_size, init_method: this
        rank's place (`ParallelSpec`; LearnerGroup passes them to each rank). reward_pool: a handle with
        `set_state`, to which every new optimizer step goes (TrainerState), awaited so that the next batch is
        scored under it; rank 0's alone, None elsewhere. A CPU learner computes on every core this process may
        use (actors/runtime/cpus.py), one torch thread per model.PARAMS_PER_THREAD parameters at most."""
        self.spec = spec
        self.loss = loss_fn(spec.loss)  # picked once (actors/learner/loss.py); a bad setting fails before any load
        self.correction = sampling_correction(spec.loss)
        self.teacher = teacher_part(spec.loss)
        parallel = ParallelSpec(strategy, rank, world_size, init_method)
        self.rank, self.world_size, self.sharded = rank, world_size, parallel.sharded
        torch.manual_seed(spec.seed)
        random.seed(spec.seed)
        self.device, self.cores = place(parallel, spec.device)
        self.dtype = getattr(torch, spec.model.dtype)
        self.lora = spec.model.lora
        self.model, self.tied = load_policy(spec.model, self.dtype, self.device, self.sharded, self.cores)
        self.ref_model = load_reference(spec.model, spec.loss.beta, self.dtype, self.device, self.sharded)
        self.optimizer, self.scheduler = make_optimizer(self.model, spec.optim)
        self.pad_id = pad_token_id(self.model.config)
        hf = base_model(self.model, self.lora is not None)
        self.inputs = model_inputs(spec.model, hf, self.device, self.dtype)
        self.one_row = self.model.config._attn_implementation in VARLEN_ATTENTION
        probe = functools.partial(probe_gap, self.model, self._forward_logps, self._lay_out, world_size)
        self.packed = choose_packing(spec.step.padding_free, hf, self.dtype, probe)
        self.global_step = 0
        self._rng = random.Random(spec.seed)  # the micro-batch shuffle: the same draws on every rank
        self.reward_pool = reward_pool
        view = engine_view(self.model, self.tied, self.lora is not None)
        self.weights = WeightSender(self.model, view=view, dtype=self.dtype, rank=rank, device=self.device)
        self.routing = replay_part(spec.step.router_replay, self.model, self.ref_model, self._forward_logps)
        self.aux_loss = aux_loss_part(self.model, spec.step.router_aux_loss_coef)

    @property
    def vision(self) -> Images | None:
        """A vision-language model's image processor (actors/vision.py); None for text."""
        return self.inputs.vision

    @property
    def replay(self) -> Replay | None:
        """The MoE routers' replay (actors/learner/routing.py) where the run replays routing; None
        otherwise."""
        return self.routing.replay

    @property
    def aux_coef(self) -> float:
        """The load-balancing loss's weight (0.0: none)."""
        return self.aux_loss.coef

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

    def layout(self, prompts: list[list[int]], completions: list[list[int]],
               images: list[tuple[Any, ...]] | None = None) -> Packed | Padded:
        """A micro-batch of these samples as this learner's forward takes it: packed or padded; with images (a
        vision-language model, always padded), their pixel inputs and the model's own positions."""
        return self.inputs.with_images(self._lay_out(prompts, completions, self.packed), images)

    def _lay_out(self, prompts: list[list[int]], completions: list[list[int]], packed: bool
                 ) -> Packed | Padded:
        if packed:
            return pack(prompts, completions, self.pad_id, self.device, one_row=self.one_row)
        return pad(prompts, completions, self.pad_id, self.device)

    def _forward_logps(
        self, model: torch.nn.Module, rows: Packed | Padded, with_entropy: bool, sampled: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Per-token log-probs of the completion tokens at `temperature`: [B, T] (T = longest completion), and
        per-token entropy [B, T] if asked (`_forward`'s, without the aux_loss)."""
        logps, entropy, _ = self._forward(model, rows, with_entropy, sampled)
        return logps, entropy

    def _forward(
        self, model: torch.nn.Module, rows: Packed | Padded, with_entropy: bool, sampled: bool = True,
        extra: dict[str, Any] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """Per-token log-probs of the completion tokens at `temperature`: [B, T] (T = longest completion),
        per-token entropy [B, T] if asked (0 at the padded layout's pad positions when packed), and the
        forward's aux_loss (a mixture of experts' load-balancing loss, with output_router_logits in `extra`;
        else None). sampled: the distribution the engines sample from (`inputs.as_sampled`: a vision-language
        model's placeholders biased out, as they are); False: the model's own, as vLLM's prompt logprobs (the
        parity check).

        Either layout computes the logits of the positions that predict completion tokens only (the padded one: the
        last T + 1 of each row): the lm_head, a large share of a small model's compute (a 32k x 768 matrix is a
        quarter of a 100M model), never runs on prompt positions."""
        logits, aux = rows.logits(model, **(extra or {}))  # [B, T, V] padded, [M, V] packed
        # [.., V] tensors are the largest a long completion makes (a 32k vocabulary at T = 512: 64 MB per row),
        # so none is made that is not needed: no copy for float32 at temperature 1, the logits freed once the
        # log-softmax (which autograd keeps) exists, the entropy's product computed in place.
        if logits.dtype != torch.float32:
            logits = logits.float()
        if sampled:
            logits = self.inputs.as_sampled(logits)
        temperature = self.spec.loss.temperature
        if temperature != 1.0:
            logits = logits / temperature
        logps_all = F.log_softmax(logits, dim=-1)
        del logits
        logps = logps_all.gather(-1, rows.targets.unsqueeze(-1)).squeeze(-1)
        entropy = None
        if with_entropy:
            with torch.no_grad():
                entropy = rows.unflatten(-logps_all.exp().mul_(logps_all).sum(-1))
        return rows.unflatten(logps), entropy, aux

    def _ref_logps(self, rows: Packed | Padded) -> torch.Tensor | None:
        """The KL reference's log-probs: a frozen copy, or (LoRA) the policy with its adapters disabled, as
        TRL's reference; None with beta = 0 (no KL term, no forward)."""
        if self.spec.loss.beta == 0.0:
            return None
        with torch.no_grad():
            if self.ref_model is not None:
                return self._forward_logps(self.ref_model, rows, with_entropy=False)[0]
            with self.model.disable_adapter(), eval_mode(self.model):
                return self._forward_logps(self.model, rows, with_entropy=False)[0]

    @torch.no_grad()
    def sequence_logprobs(self, token_ids: list[int], routes: Any = None,
                          images: tuple[Any, ...] | None = None) -> list[float]:
        """Log-probs of tokens 1..end of a fixed sequence (for the generator-learner parity check), in this
        learner's layout. routes: the engine's routing of the sequence ([len(token_ids), layers, top_k]), replayed
        where this learner replays routing (grpo.router_replay), as its train steps do. images: those the ids'
        placeholders stand for (a vision-language model)."""
        rows = self.layout([token_ids[:1]], [token_ids[1:]], [images or ()])
        with eval_mode(self.model), self.routing.around_sequence(rows, routes, len(token_ids)):
            logps, _ = self._forward_logps(self.model, rows, False, sampled=False)
        return logps[0].tolist()

    # --- the update -----------------------------------------------------------------------------------

    def train_step(self, batch: TrainBatch, reward_state: TrainerState | None = None) -> TrainResult:
        """Runs num_iterations optimizer steps on the batch; returns the new global_step and the step's
        metrics averaged over micro-batches (global over ranks). reward_state (max_steps, epoch) is pushed to
        the reward pool with each new global_step. With several ranks every rank gets the whole batch and
        trains on its slots. A batch by reference is fetched first (actors/payloads.py: each group's token data from
        the object store); if a group's payload is gone, nothing is trained and the result names the lost groups
        (TrainResult.lost), for the driver to replace."""
        t0 = time.perf_counter()
        try:
            batch = resolve_training(batch)
        except PayloadLost as err:
            return TrainResult(global_step=self.global_step, metrics={}, num_tokens=0.0, compute_s=0.0, lost=err.lost)
        ctx = self._start(batch)
        losses, norms = [], []
        for it in range(self.spec.step.num_iterations):
            self.optimizer.zero_grad(set_to_none=True)
            total_loss = 0.0
            for s in range(len(ctx.plan.slots)):
                total_loss += self._slot(ctx, s, first=it == 0)
            grad_norm = clip_gradients(self.model, self.spec.optim.max_grad_norm, self.sharded)
            self.weights.settle()  # an overlapped weight send reads the parameters until it is done
            self.optimizer.step()
            self.scheduler.step()
            self.global_step += 1
            self._push_state(reward_state)
            losses.append(total_loss)
            norms.append(grad_norm)
        out = step_metrics(ctx.sums, losses, norms, self.world_size)
        out["learning_rate"] = self.scheduler.get_last_lr()[0]
        compute_s = time.perf_counter() - t0
        out.update(throughput_metrics(ctx, self.spec.step.num_iterations, self.world_size, compute_s))
        records = gather_records(ctx.recorded, self.world_size)
        return TrainResult(global_step=self.global_step, metrics=out, num_tokens=float(ctx.num_items),
                           compute_s=compute_s,
                           token_records={i: token_record(batch, i, lp) for i, lp in records.items()})

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

    def _start(self, batch: TrainBatch) -> StepContext:
        """The step's context: its plan, every micro-batch's loss mask, this rank's micro-batches laid out,
        and the routes they replay (R3: the engine's; R2: filled at the first pass)."""
        plan = self._plan(batch)
        masks = [loss_mask(batch, idx, self.spec.step.mask_truncated_completions, self.device)
                 for idx in plan.micro_batches]
        num_items = sum(m.sum() for m in masks)  # dapo normaliser: loss tokens in the whole generation batch
        rows: dict[int, Packed | Padded] = {}
        for j in {slot.micro_batch for slot in plan.slots}:
            idx = plan.micro_batches[j]
            images = None if batch.images is None else [batch.images[i] for i in idx]
            rows[j] = self.layout([batch.prompt_ids[i] for i in idx], [batch.completion_ids[i] for i in idx],
                                  images)
        return StepContext(batch, plan, rows, masks, num_items, frozen=[None] * len(plan.slots),
                           routes=self.routing.step_routes(batch, plan, rows))

    def _slot(self, ctx: StepContext, s: int, first: bool) -> float:
        """Slot s's forward and backward; returns its loss. At the first pass (`first`) its old, reference and
        importance-sampling terms are frozen into ctx.frozen[s] and its per-sample metrics go to ctx.sums. A
        padding slot runs the same forwards and a zero-weight backward (FSDP's collectives need every
        rank)."""
        slot = ctx.plan.slots[s]
        if first:  # R3's forward without replay runs on every slot: a forward is a collective under FSDP
            ctx.add(self.routing.first_pass(ctx, slot))
        with self.routing.around(ctx, slot, first):
            mb = ctx.rows[slot.micro_batch]
            logp, entropy, aux = self._forward(self.model, mb, with_entropy=first and not slot.padding,
                                               extra=self.aux_loss.forward_kwargs())
            if slot.padding:  # zero gradient through every sharded unit; the ref forward keeps the lockstep
                if first:
                    self._ref_logps(mb)
                self.aux_loss.added_zero((logp * 0.0).sum(), aux).backward()
                return 0.0
            if first:  # old / ref / IS terms frozen at the first pass (no optimizer step has happened yet)
                ctx.frozen[s] = self._freeze(ctx, s, logp.detach(), entropy)
            result = self.loss(dataclasses.replace(ctx.frozen[s], logp=logp))
            self.aux_loss.added(result.loss, aux, ctx.plan.grad_accum_steps, ctx).backward()
            ctx.add_tensors(result.metrics)
            return result.loss.item()

    def _freeze(self, ctx: StepContext, s: int, logp: torch.Tensor, entropy: torch.Tensor | None
                ) -> LossInputs:
        """Slot s's loss inputs bar the live log-probs, from its first-pass log-probs `logp` (detached): the
        old log-probs, the reference's, the importance weights and the teacher's; its entropy and the sampler
        gap go to the step's metrics."""
        batch, j = ctx.batch, ctx.plan.slots[s].micro_batch
        idx, mask = ctx.plan.micro_batches[j], ctx.masks[j]
        sampling = [batch.sampling_logprobs[i] for i in idx]
        multi_turn = batch.completion_mask is not None
        is_weights, metrics = self.correction.first_pass(logp, sampling, mask, by_turn=multi_turn)
        ctx.add(metrics)
        for r, i in enumerate(idx):
            if i in batch.record:
                ctx.recorded[i] = logp[r, : len(batch.completion_ids[i])].tolist()
        ctx.sums["entropy"].append(((entropy * mask).sum() / mask.sum().clamp(min=1)).item())
        return LossInputs(
            logp,  # replaced by the live logp on every pass
            old_logp=logp if self.spec.step.num_iterations > 1 else None,
            advantages=torch.tensor([batch.advantages[i] for i in idx], dtype=torch.float32,
                                    device=self.device),
            mask=mask,
            ref_logp=self._ref_logps(ctx.rows[j]),
            is_weights=is_weights,
            num_items_in_batch=ctx.num_items,
            grad_accum_steps=ctx.plan.grad_accum_steps,
            num_sequences=len(batch),
            teacher_logp=self.teacher.logps(batch, idx, logp),
        )

    def _push_state(self, reward_state: TrainerState | None) -> None:
        if self.reward_pool is None:
            return
        import ray

        state = dataclasses.replace(reward_state or TrainerState(), global_step=self.global_step)
        ray.get(self.reward_pool.set_state.remote(state))

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
        """LoRA: the base with the adapter merged in (the generators' weights) and the tokenizer, as a plain
        HF model directory, written atomically by rank 0 (a collective under FSDP)."""
        if self.lora is None:
            raise ValueError("save_merged needs a LoRA learner: a full fine-tune's checkpoints are whole "
                             "models already")
        return checkpoint.save_merged(self.train_state(), path, self.weights.full_state())
