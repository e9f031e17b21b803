"""Learner: the policy in torch, the GRPO update, and the weights the generators load after each step.

A plain class (Ray wraps it in `actors.group`). The GRPO math is injected, not imported: the driver hands
over `loss_fn` (rayward's `orchestrator.grpo.grpo_loss` with the run's options bound) and optionally
`is_weights_fn` (`vllm_importance_weights`), so this file depends on torch and transformers, not on the driver.

One `train_step(batch)` consumes one generation batch: it is split into micro-batches of
`micro_batch_size` completions with gradient accumulation, and trained on `num_iterations` times (one
optimizer step each), with the old, reference and importance-sampling terms frozen at the first pass,
as TRL buffers them.

Several ranks (`strategy="fsdp"`, `world_size` > 1; one Ray actor each, or one process each in tests) form
one torch.distributed process group (gloo on CPU, NCCL on CUDA) and shard the policy and the reference
model with FSDP2 (`fully_shard` on every decoder layer and on the root). Data parallelism keeps the
single-rank numbers: every rank receives the whole batch, draws the same shuffle and cuts the same
micro-batches as one rank would, and takes a contiguous run of them (rank r: micro-batches
[ga*r/W, ga*(r+1)/W)). Each micro-batch loss keeps the single-rank normalisers (grad_accum_steps = ga, the
micro-batches of the WHOLE step; num_items_in_batch = the whole batch's loss tokens), and FSDP sums (does
not average) the gradients over ranks, so the summed gradient is the single-rank one for every loss_type.
A rank with fewer micro-batches runs zero-weight padding micro-batches: FSDP's all-gathers and
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
import math
import random
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F

from actors.cpus import describe, omp_waits, pick_cores
from actors.learner import checkpoint
from actors.learner.distributed import init_process_group, shard, tied_names
from actors.learner.lora import apply_lora, merged_view
from actors.types import TrainBatch, TrainerState, TrainResult
from actors.weights.sender import WeightSender, plain_view

LossFn = Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]

STRATEGIES = ("single", "fsdp")


def _lr_lambda(kind: str, warmup_steps: int, max_steps: int) -> Callable[[int], float]:
    def f(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / (warmup_steps + 1)
        if kind == "constant":
            return 1.0
        progress = (step - warmup_steps) / max(1, max_steps - warmup_steps)
        if kind == "linear":
            return max(0.0, 1.0 - progress)
        return 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))  # cosine

    return f


# CPU learners: one torch thread per this many parameters, up to the cores the learner may use. A thread's share of
# a small model's matrices is too small to pay for the OpenMP barriers, which on a busy machine stall whenever one
# thread is descheduled (tiny model, 2 threads: train step 2-7x slower than 1 thread under load); a 100M model
# trains 1.7x faster on 2 threads than on 1 (3.3 vs 5.7 s per step here).
PARAMS_PER_THREAD = 20_000_000


def threads_for(num_params: int, cores: int) -> int:
    return max(1, min(cores, num_params // PARAMS_PER_THREAD))


def meta_model(model: str, trust_remote_code: bool = False) -> torch.nn.Module:
    """The model's architecture on the meta device (no weights, no memory): for checks before anything loads."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model, trust_remote_code=trust_remote_code)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)


def enable_gradient_checkpointing(model: torch.nn.Module, kwargs: dict[str, Any] | None) -> None:
    """transformers' gradient checkpointing (every decoder layer recomputed in the backward pass), or a clear
    error for an architecture without it."""
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise ValueError(f"{type(model).__name__} does not support gradient checkpointing")
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


@contextlib.contextmanager
def _eval(model: torch.nn.Module) -> Iterator[None]:
    """Eval mode for a no-grad forward of the policy: no (LoRA) dropout and no checkpointing, which only
    matters for a backward (reentrant checkpointing warns without inputs that require grad)."""
    model.eval()
    try:
        yield
    finally:
        model.train()


class Learner:
    def __init__(
        self,
        model: str,
        *,
        loss_fn: LossFn,
        is_weights_fn: LossFn | None = None,
        temperature: float = 1.0,
        dtype: str = "float32",
        seed: int = 0,
        learning_rate: float = 1e-6,
        optim: str = "adamw_torch",
        weight_decay: float = 0.0,
        adam_betas: tuple[float, float] = (0.9, 0.999),
        lr_scheduler_type: str = "constant",
        warmup_steps: int = 0,
        max_steps: int = 1,
        max_grad_norm: float | None = 1.0,
        micro_batch_size: int = 8,
        num_iterations: int = 1,
        beta: float = 0.0,
        mask_truncated_completions: bool = False,
        gradient_checkpointing: bool = True,
        gradient_checkpointing_kwargs: dict[str, Any] | None = None,
        lora: dict[str, Any] | None = None,
        trust_remote_code: bool = False,
        reward_pool: Any = None,
        strategy: str = "single",
        rank: int = 0,
        world_size: int = 1,
        init_method: str | None = None,
        device: str | None = None,
    ):
        """strategy "single": one device, no process group. "fsdp": rank `rank` of `world_size` joins the
        process group at `init_method` (tcp://host:port of rank 0; optional for world_size 1) and the
        models are FSDP2-sharded. With dtype bfloat16/float16 FSDP keeps float32 master weights and
        optimizer state and computes in `dtype` (MixedPrecisionPolicy, gradients reduced in float32).
        device: "cpu" or "cuda"; default CUDA when there is one. A CPU learner computes on every core this process
        may use (actors/cpus.py), one torch thread per PARAMS_PER_THREAD parameters at most.
        gradient_checkpointing(_kwargs): TRL's names and meaning. lora: PEFT LoraConfig keyword arguments (r,
        lora_alpha, lora_dropout, target_modules, bias, use_rslora), or None to train every weight."""
        from transformers import AutoModelForCausalLM

        if strategy not in STRATEGIES:
            raise ValueError(f"unknown strategy {strategy!r} (have {STRATEGIES})")
        if strategy == "single" and world_size != 1:
            raise ValueError(f"strategy 'single' runs one rank, not world_size={world_size}")
        self.sharded = strategy == "fsdp"
        self.rank, self.world_size = rank, world_size
        torch.manual_seed(seed)
        random.seed(seed)
        kind = device or ("cuda" if torch.cuda.is_available() else "cpu")
        if kind == "cpu":
            self.cores = pick_cores(None)
        if self.sharded:
            self.device = init_process_group(rank, world_size, init_method, kind)
        else:
            self.device = torch.device(kind)
        torch_dtype = getattr(torch, dtype)
        self.dtype = torch_dtype
        load_dtype = torch.float32 if self.sharded else torch_dtype  # FSDP: fp32 masters, compute in dtype
        load = dict(dtype=load_dtype, trust_remote_code=trust_remote_code)
        if self.sharded:  # loaded on the CPU; fully_shard moves each rank's shard to its device
            self.model = AutoModelForCausalLM.from_pretrained(model, **load)
        else:
            self.model = AutoModelForCausalLM.from_pretrained(model, **load).to(self.device)
        self.tied = tied_names(self.model)  # HF names, taken before any wrapping or sharding
        if self.device.type == "cpu":  # not Ray's OMP_NUM_THREADS=1 for a fractional num_cpus
            torch.set_num_threads(threads_for(sum(p.numel() for p in self.model.parameters()), len(self.cores)))
        self.model.train()
        for m in self.model.modules():  # GRPO ratios assume the same function at sampling and training time
            if isinstance(m, torch.nn.Dropout):
                m.p = 0.0
        if gradient_checkpointing:
            enable_gradient_checkpointing(self.model, gradient_checkpointing_kwargs)
        self.lora = lora
        if lora is not None:  # after the dropout reset: lora_dropout is the user's choice
            self.model = apply_lora(self.model, lora)
        if self.sharded:
            shard(self.model, torch_dtype, self.device)
        # beta = 0 loads no reference model (as TRL); with LoRA the reference is the policy with its adapters
        # disabled (the base, as TRL); otherwise a frozen copy lives here, next to the policy.
        self.ref_model = None
        if beta != 0.0 and lora is None:
            if self.sharded:
                self.ref_model = AutoModelForCausalLM.from_pretrained(model, **load).eval()
                self.ref_model.requires_grad_(False)
                shard(self.ref_model, torch_dtype, self.device)
            else:
                self.ref_model = AutoModelForCausalLM.from_pretrained(model, **load).to(self.device).eval()
                self.ref_model.requires_grad_(False)
        params = [p for p in self.model.parameters() if p.requires_grad]
        if optim == "adamw_torch":
            self.optimizer = torch.optim.AdamW(
                params, lr=learning_rate, betas=adam_betas, weight_decay=weight_decay
            )
        elif optim == "sgd":
            self.optimizer = torch.optim.SGD(params, lr=learning_rate, weight_decay=weight_decay)
        else:
            raise ValueError(f"unknown optim {optim!r}")
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, _lr_lambda(lr_scheduler_type, warmup_steps, max_steps)
        )
        self.loss_fn, self.is_weights_fn = loss_fn, is_weights_fn
        self.temperature, self.beta = temperature, beta
        self.max_grad_norm = max_grad_norm
        self.micro_batch_size, self.num_iterations = micro_batch_size, num_iterations
        self.mask_truncated = mask_truncated_completions
        self.pad_id = self.model.config.pad_token_id or 0
        self.global_step = 0
        self.model_path, self.trust_remote_code = model, trust_remote_code  # checkpoints copy its tokenizer
        self._rng = random.Random(seed)
        # Curriculum push: after every optimizer step the new step goes to the reward pool (an actor handle
        # with set_state), which forwards it to every reward worker. Awaited, so the next batch is scored
        # under it.
        self.reward_pool = reward_pool
        view = merged_view(self.model, self.tied) if lora is not None else plain_view(self.model, self.tied)
        self.weights = WeightSender(self.model, view=view, dtype=torch_dtype, rank=rank, device=self.device)

    def cpu_threads(self) -> str:
        """How this rank computes, for the start-up log."""
        if self.device.type != "cpu":
            return f"{self.device}, {torch.get_num_threads()} CPU threads"
        return f"{torch.get_num_threads()} torch threads on {describe(self.cores)}{omp_waits()}"

    def __repr__(self) -> str:
        # Ray captures an actor's repr once (the dashboard's Repr column): only what never changes.
        n = sum(p.numel() for p in self.model.parameters())
        ranks = f", rank={self.rank}/{self.world_size} fsdp" if self.sharded else ""
        lora = ""
        if self.lora is not None:
            trained = sum(p.numel() for p in self.model.parameters() if p.requires_grad)
            lora = f", lora r={self.lora.get('r', 8)} trains {trained / 1e6:.3f}M"
        return f"Learner(params={n / 1e6:.2f}M, device={self.device}{ranks}{lora})"

    # --- log-probs ------------------------------------------------------------------------------------

    def _forward_logps(
        self,
        model: torch.nn.Module,
        prompts: list[list[int]],
        completions: list[list[int]],
        with_entropy: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Per-token log-probs of the completion tokens at `temperature`: [B, T] (T = longest completion),
        and per-token entropy [B, T] if asked.

        As TRL lays out a batch: prompts left-padded to the longest prompt P, completions right-padded to T,
        positions counted from each row's first real token (so every token sits at the position vLLM gave it),
        and the model asked for the logits of the last T+1 positions only (`logits_to_keep`): the lm_head, a
        large share of a small model's compute (a 32k x 768 matrix is a quarter of a 100M model), never runs on
        prompt positions."""
        p_max = max(len(p) for p in prompts)
        t_max = max(max(len(c) for c in completions), 1)
        ids = torch.full((len(prompts), p_max + t_max), self.pad_id, dtype=torch.long)
        attn = torch.zeros_like(ids)
        tgt = torch.zeros((len(prompts), t_max), dtype=torch.long)
        for b, (p, c) in enumerate(zip(prompts, completions, strict=True)):
            ids[b, p_max - len(p) : p_max + len(c)] = torch.tensor(p + c)
            attn[b, p_max - len(p) : p_max + len(c)] = 1
            if c:
                tgt[b, : len(c)] = torch.tensor(c, dtype=torch.long)
        positions = (attn.cumsum(1) - 1).clamp(min=0)
        ids, attn, positions, tgt = (t.to(self.device) for t in (ids, attn, positions, tgt))
        logits = model(
            input_ids=ids, attention_mask=attn, position_ids=positions, logits_to_keep=t_max + 1, use_cache=False
        ).logits[:, :-1]  # [B, T+1, V] computed: position P-1+j predicts completion token j
        # [B, T, V] tensors are the largest a long completion makes (a 32k vocabulary at T = 512: 64 MB per row),
        # so none is made that is not needed: no copy for float32 at temperature 1, the logits freed once the
        # log-softmax (which autograd keeps) exists, the entropy's product computed in place.
        if logits.dtype != torch.float32:
            logits = logits.float()
        if self.temperature != 1.0:
            logits = logits / self.temperature
        logps_all = F.log_softmax(logits, dim=-1)  # [B, T, V]
        del logits
        logps = logps_all.gather(-1, tgt.unsqueeze(-1)).squeeze(-1)  # [B, T]
        entropy = None
        if with_entropy:
            with torch.no_grad():
                entropy = -logps_all.exp().mul_(logps_all).sum(-1)
        return logps, entropy

    @torch.no_grad()
    def sequence_logprobs(self, token_ids: list[int]) -> list[float]:
        """Log-probs of tokens 1..end of a fixed sequence (for the generator-learner parity check)."""
        with _eval(self.model):
            logps, _ = self._forward_logps(self.model, [token_ids[:1]], [token_ids[1:]], with_entropy=False)
        return logps[0].tolist()

    # --- the update -----------------------------------------------------------------------------------

    def train_step(self, batch: TrainBatch, reward_state: TrainerState | None = None) -> TrainResult:
        """Runs num_iterations optimizer steps on the batch; returns metrics averaged over micro-batches.
        reward_state (max_steps, epoch) is pushed to the reward pool with each new global_step.
        With several ranks every rank gets the whole batch and trains on its share of the micro-batches."""
        t0 = time.perf_counter()
        n = len(batch.completion_ids)
        order = list(range(n))
        self._rng.shuffle(order)  # TRL shuffles rows across groups before splitting into micro-batches
        micro = [order[i : i + self.micro_batch_size] for i in range(0, n, self.micro_batch_size)]
        ga = len(micro)
        masks = []
        for idx in micro:
            lens = [len(batch.completion_ids[i]) for i in idx]
            m = torch.zeros(len(idx), max(max(lens), 1))
            for r, (i, ln) in enumerate(zip(idx, lens, strict=True)):
                if not (self.mask_truncated and batch.truncated[i]):
                    m[r, :ln] = 1.0
            masks.append(m.to(self.device))
        num_items = sum(m.sum() for m in masks)  # dapo normaliser: loss tokens in the whole generation batch
        # This rank's micro-batches (all of them on one rank); None = a zero-weight padding slot, so that
        # every rank runs ceil(ga / world_size) forwards and backwards (FSDP's collectives run in lockstep).
        lo, hi = ga * self.rank // self.world_size, ga * (self.rank + 1) // self.world_size
        slots: list[int | None] = list(range(lo, hi)) + [None] * (-(-ga // self.world_size) - (hi - lo))
        frozen: list[dict[str, torch.Tensor | None]] = [{} for _ in slots]
        sums: dict[str, list[float]] = defaultdict(list)
        losses, norms = [], []
        for it in range(self.num_iterations):
            self.optimizer.zero_grad(set_to_none=True)
            total_loss = 0.0
            for s, j in enumerate(slots):
                pad = j is None
                idx = micro[lo if pad else j]  # lo < ga always: a padding slot reruns a real micro-batch
                prompts = [batch.prompt_ids[i] for i in idx]
                comps = [batch.completion_ids[i] for i in idx]
                logp, entropy = self._forward_logps(self.model, prompts, comps, with_entropy=it == 0 and not pad)
                if pad:  # zero gradient through every sharded unit; the ref forward keeps the lockstep too
                    if it == 0:
                        self._ref_logps(prompts, comps)
                    (logp * 0.0).sum().backward()
                    continue
                mask = masks[j]
                adv = torch.tensor(
                    [batch.advantages[i] for i in idx], dtype=torch.float32, device=self.device
                )
                # Freeze old / ref / IS terms at the first pass (no optimizer step has happened yet).
                if it == 0:
                    frozen[s]["old"] = logp.detach() if self.num_iterations > 1 else None
                    frozen[s]["ref"] = self._ref_logps(prompts, comps)
                    frozen[s]["is"] = self._is_weights(logp.detach(), idx, batch, mask, sums)
                    sums["entropy"].append(((entropy * mask).sum() / mask.sum().clamp(min=1)).item())
                loss, metrics = self.loss_fn(
                    logp,
                    frozen[s]["old"],
                    adv,
                    mask,
                    ref_logp=frozen[s]["ref"],
                    is_weights=frozen[s]["is"],
                    num_items_in_batch=num_items,
                    grad_accum_steps=ga,
                )
                loss.backward()
                total_loss += loss.item()
                for k, v in metrics.items():
                    if not torch.isnan(v):
                        sums[k].append(v.item())
            grad_norm = self._clip()
            self.weights.settle()  # an overlapped weight send reads the parameters until it is done
            self.optimizer.step()
            self.scheduler.step()
            self.global_step += 1
            self._push_state(reward_state)
            losses.append(total_loss)
            norms.append(grad_norm)
        sums = self._gather_metrics(sums)
        sums["loss"] = self._sum_over_ranks(losses)  # per optimizer step: the sum of its micro-batch losses
        sums["grad_norm"] = norms  # already global (the norm of the full gradient)
        out = {k: sum(v) / len(v) for k, v in sums.items() if v and not k.endswith(("_max", "_min"))}
        out.update(
            {
                k: (max if k.endswith("_max") else min)(v)
                for k, v in sums.items()
                if v and k.endswith(("_max", "_min"))
            }
        )
        out["learning_rate"] = self.scheduler.get_last_lr()[0]
        return TrainResult(global_step=self.global_step, metrics=out, num_tokens=float(num_items),
                           compute_s=time.perf_counter() - t0)

    def _gather_metrics(self, sums: dict[str, list[float]]) -> dict[str, list[float]]:
        """Every rank's per-micro-batch metric values, concatenated (identity on one rank)."""
        if self.world_size == 1:
            return sums
        import torch.distributed as dist

        parts: list[Any] = [None] * self.world_size
        dist.all_gather_object(parts, dict(sums))
        merged: dict[str, list[float]] = defaultdict(list)
        for part in parts:
            for k, v in part.items():
                merged[k].extend(v)
        return merged

    def _sum_over_ranks(self, values: list[float]) -> list[float]:
        if self.world_size == 1:
            return values
        import torch.distributed as dist

        t = torch.tensor(values, dtype=torch.float64)  # a CPU tensor: gloo carries it, also next to NCCL
        dist.all_reduce(t)
        return t.tolist()

    def _push_state(self, reward_state: TrainerState | None) -> None:
        if self.reward_pool is None:
            return
        import ray

        state = dataclasses.replace(reward_state or TrainerState(), global_step=self.global_step)
        ray.get(self.reward_pool.set_state.remote(state))

    def _ref_logps(self, prompts: list[list[int]], comps: list[list[int]]) -> torch.Tensor | None:
        if self.beta == 0.0:
            return None
        with torch.no_grad():
            if self.ref_model is not None:
                return self._forward_logps(self.ref_model, prompts, comps, with_entropy=False)[0]
            with self.model.disable_adapter(), _eval(self.model):  # LoRA: the base model, as TRL's reference
                return self._forward_logps(self.model, prompts, comps, with_entropy=False)[0]

    def _is_weights(self, old, idx, batch, mask, sums) -> torch.Tensor | None:
        """Importance weights for the sampler-learner mismatch, and the logprob-gap metric (the alarm for
        stale or garbage weights after a sync)."""
        samp = torch.full_like(old, float("nan"))
        for r, i in enumerate(idx):
            lp = batch.sampling_logprobs[i]
            samp[r, : len(lp)] = torch.tensor(lp, dtype=samp.dtype)
        valid = (mask > 0) & ~torch.isnan(samp)
        if valid.any():
            gap = (old - samp).abs()[valid]
            sums["sampling/sampling_logp_difference/mean"].append(gap.mean().item())
            sums["sampling/sampling_logp_difference/max"].append(gap.max().item())
        if self.is_weights_fn is None:
            return None
        w = self.is_weights_fn(old, samp, mask)
        wv = w[mask > 0] if w.shape == mask.shape else w.flatten()
        if wv.numel():
            sums["sampling/importance_sampling_ratio/min"].append(wv.min().item())
            sums["sampling/importance_sampling_ratio/mean"].append(wv.mean().item())
            sums["sampling/importance_sampling_ratio/max"].append(wv.max().item())
        return w

    def _clip(self) -> float:
        params = [p for p in self.model.parameters() if p.grad is not None]
        if self.sharded:  # DTensor shards: clip_grad_norm_ reduces the norm over ranks (max_norm inf: no clip)
            norm = torch.nn.utils.clip_grad_norm_(params, self.max_grad_norm or math.inf)
            return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
        if self.max_grad_norm is None:
            return float(torch.norm(torch.stack([p.grad.norm() for p in params])).item()) if params else 0.0
        return float(torch.nn.utils.clip_grad_norm_(params, self.max_grad_norm).item())

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

    def save_checkpoint(self, path: str, extra: dict[str, Any] | None = None) -> str:
        return checkpoint.save(self, path, extra)

    def load_checkpoint(self, path: str) -> dict[str, Any]:
        self.weights.settle()
        return checkpoint.load(self, path)

    def save_merged(self, path: str) -> str:
        """LoRA: the base with the adapter merged in (the generators' weights) and the tokenizer, as a plain HF model
        directory, written atomically by rank 0 (a collective under FSDP)."""
        if self.lora is None:
            raise ValueError("save_merged needs a LoRA learner: a full fine-tune's checkpoints are whole models already")
        return checkpoint.save_merged(self, path)
