"""Learner: the policy in torch, the GRPO update, and the weights the generators load after each step.

A plain class (Ray wraps it in `actors.group`). The GRPO math is injected, not imported: the driver hands
over `loss_fn` (rayward's `orchestrator.grpo.grpo_loss` with the run's options bound) and optionally
`is_weights_fn` (`vllm_importance_weights`), so this file depends only on torch and transformers.

One `train_step(batch)` consumes one generation batch: it is split into micro-batches of
`micro_batch_size` completions with gradient accumulation, and trained on `num_iterations` times (one
optimizer step each), with the old, reference and importance-sampling terms frozen at the first pass,
as TRL buffers them.
"""

from __future__ import annotations

import io
import json
import math
import os
import random
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import save as safetensors_save

LossFn = Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]


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


def unique_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """state_dict without tied duplicates (e.g. lm_head tied to embed_tokens), as save_pretrained writes it."""
    seen: set[int] = set()
    out = {}
    for name, t in model.state_dict().items():
        ptr = t.untyped_storage().data_ptr()
        if ptr in seen:
            continue
        seen.add(ptr)
        out[name] = t.detach().contiguous()
    return out


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
        trust_remote_code: bool = False,
        reward_pool: Any = None,
    ):
        from transformers import AutoModelForCausalLM

        torch.manual_seed(seed)
        random.seed(seed)
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        torch_dtype = getattr(torch, dtype)
        load = dict(dtype=torch_dtype, trust_remote_code=trust_remote_code)
        self.model = AutoModelForCausalLM.from_pretrained(model, **load).to(self.device)
        self.model.train()
        for m in self.model.modules():  # GRPO ratios assume the same function at sampling and training time
            if isinstance(m, torch.nn.Dropout):
                m.p = 0.0
        # beta = 0 loads no reference model (as TRL); otherwise a frozen copy lives here, next to the policy.
        self.ref_model = None
        if beta != 0.0:
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
        self._rng = random.Random(seed)
        # Curriculum push: after every optimizer step the new step goes to the reward pool (an actor handle
        # with set_state), which forwards it to every reward worker. Awaited, so the next batch is scored
        # under it.
        self.reward_pool = reward_pool

    def __repr__(self) -> str:
        n = sum(p.numel() for p in self.model.parameters())
        return f"Learner(params={n / 1e6:.2f}M, device={self.device}, step={self.global_step})"

    # --- log-probs ------------------------------------------------------------------------------------

    def _forward_logps(
        self,
        model: torch.nn.Module,
        prompts: list[list[int]],
        completions: list[list[int]],
        with_entropy: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Per-token log-probs of the completion tokens at `temperature`: [B, T] (T = longest completion),
        and per-token entropy [B, T] if asked. Right padding keeps positions 0..len-1 as vLLM sees them."""
        seqs = [p + c for p, c in zip(prompts, completions, strict=True)]
        width = max(len(s) for s in seqs)
        t_max = max(max(len(c) for c in completions), 1)
        ids = torch.full((len(seqs), width), self.pad_id, dtype=torch.long)
        attn = torch.zeros((len(seqs), width), dtype=torch.long)
        pos = torch.zeros(
            (len(seqs), t_max), dtype=torch.long
        )  # logits position predicting each completion token
        tgt = torch.zeros((len(seqs), t_max), dtype=torch.long)
        for b, (p, c) in enumerate(zip(prompts, completions, strict=True)):
            ids[b, : len(p) + len(c)] = torch.tensor(p + c)
            attn[b, : len(p) + len(c)] = 1
            pos[b, : len(c)] = torch.arange(len(p) - 1, len(p) + len(c) - 1)
            tgt[b, : len(c)] = torch.tensor(c, dtype=torch.long) if c else 0
        ids, attn, pos, tgt = (t.to(self.device) for t in (ids, attn, pos, tgt))
        logits = model(input_ids=ids, attention_mask=attn).logits  # [B, L, V]
        sel = logits.gather(1, pos.unsqueeze(-1).expand(-1, -1, logits.size(-1))).float() / self.temperature
        logps_all = F.log_softmax(sel, dim=-1)  # [B, T, V]
        logps = logps_all.gather(-1, tgt.unsqueeze(-1)).squeeze(-1)  # [B, T]
        entropy = None
        if with_entropy:
            with torch.no_grad():
                entropy = -(logps_all.exp() * logps_all).sum(-1)
        return logps, entropy

    @torch.no_grad()
    def sequence_logprobs(self, token_ids: list[int]) -> list[float]:
        """Log-probs of tokens 1..end of a fixed sequence (for the generator-learner parity check)."""
        logps, _ = self._forward_logps(self.model, [token_ids[:1]], [token_ids[1:]], with_entropy=False)
        return logps[0].tolist()

    # --- the update -----------------------------------------------------------------------------------

    def train_step(
        self, batch: dict[str, Any], reward_state: dict[str, Any] | None = None
    ) -> dict[str, float]:
        """batch: prompt_ids, completion_ids, sampling_logprobs (lists per completion), advantages [N],
        truncated [N]. Runs num_iterations optimizer steps; returns metrics averaged over micro-batches.
        reward_state (max_steps, epoch) is pushed to the reward pool with the new global_step."""
        t0 = time.perf_counter()
        n = len(batch["completion_ids"])
        order = list(range(n))
        self._rng.shuffle(order)  # TRL shuffles rows across groups before splitting into micro-batches
        micro = [order[i : i + self.micro_batch_size] for i in range(0, n, self.micro_batch_size)]
        ga = len(micro)
        masks = []
        for idx in micro:
            lens = [len(batch["completion_ids"][i]) for i in idx]
            m = torch.zeros(len(idx), max(max(lens), 1))
            for r, (i, ln) in enumerate(zip(idx, lens, strict=True)):
                if not (self.mask_truncated and batch["truncated"][i]):
                    m[r, :ln] = 1.0
            masks.append(m.to(self.device))
        num_items = sum(m.sum() for m in masks)  # dapo normaliser: loss tokens in the whole generation batch
        frozen: list[dict[str, torch.Tensor | None]] = [{} for _ in micro]
        sums: dict[str, list[float]] = defaultdict(list)
        for it in range(self.num_iterations):
            self.optimizer.zero_grad(set_to_none=True)
            total_loss = 0.0
            for j, idx in enumerate(micro):
                prompts = [batch["prompt_ids"][i] for i in idx]
                comps = [batch["completion_ids"][i] for i in idx]
                logp, entropy = self._forward_logps(self.model, prompts, comps, with_entropy=it == 0)
                mask = masks[j]
                adv = torch.tensor(
                    [batch["advantages"][i] for i in idx], dtype=torch.float32, device=self.device
                )
                if (
                    it == 0
                ):  # freeze old / ref / IS terms at the first pass (no optimizer step has happened yet)
                    frozen[j]["old"] = logp.detach() if self.num_iterations > 1 else None
                    frozen[j]["ref"] = self._ref_logps(prompts, comps)
                    frozen[j]["is"] = self._is_weights(logp.detach(), idx, batch, mask, sums)
                    sums["entropy"].append(((entropy * mask).sum() / mask.sum().clamp(min=1)).item())
                loss, metrics = self.loss_fn(
                    logp,
                    frozen[j]["old"],
                    adv,
                    mask,
                    ref_logp=frozen[j]["ref"],
                    is_weights=frozen[j]["is"],
                    num_items_in_batch=num_items,
                    grad_accum_steps=ga,
                )
                loss.backward()
                total_loss += loss.item()
                for k, v in metrics.items():
                    if not torch.isnan(v):
                        sums[k].append(v.item())
            grad_norm = self._clip()
            self.optimizer.step()
            self.scheduler.step()
            self.global_step += 1
            self._push_state(reward_state)
            sums["loss"].append(total_loss)
            sums["grad_norm"].append(grad_norm)
        out = {k: sum(v) / len(v) for k, v in sums.items() if v and not k.endswith(("_max", "_min"))}
        out.update(
            {
                k: (max if k.endswith("_max") else min)(v)
                for k, v in sums.items()
                if v and k.endswith(("_max", "_min"))
            }
        )
        out["learning_rate"] = self.scheduler.get_last_lr()[0]
        out["global_step"] = self.global_step
        out["num_tokens"] = float(num_items)
        out["time/train_compute"] = time.perf_counter() - t0
        return out

    def _push_state(self, reward_state: dict[str, Any] | None) -> None:
        if self.reward_pool is None:
            return
        import ray

        ray.get(self.reward_pool.set_state.remote({**(reward_state or {}), "global_step": self.global_step}))

    def _ref_logps(self, prompts: list[list[int]], comps: list[list[int]]) -> torch.Tensor | None:
        if self.ref_model is None:
            return None
        with torch.no_grad():
            return self._forward_logps(self.ref_model, prompts, comps, with_entropy=False)[0]

    def _is_weights(self, old, idx, batch, mask, sums) -> torch.Tensor | None:
        """Importance weights for the sampler-learner mismatch, and the logprob-gap metric (the alarm for
        stale or garbage weights after a sync)."""
        samp = torch.full_like(old, float("nan"))
        for r, i in enumerate(idx):
            lp = batch["sampling_logprobs"][i]
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
        if self.max_grad_norm is None:
            return float(torch.norm(torch.stack([p.grad.norm() for p in params])).item()) if params else 0.0
        return float(torch.nn.utils.clip_grad_norm_(params, self.max_grad_norm).item())

    # --- weights and checkpoints ----------------------------------------------------------------------

    def export_weights(self) -> bytes:
        """The policy's weights as safetensors bytes (HF parameter names), for the generators' in-place reload."""
        cpu = {k: v.to("cpu") for k, v in unique_state_dict(self.model).items()}
        return safetensors_save(cpu)

    def save_checkpoint(self, path: str, extra: dict[str, Any] | None = None) -> str:
        """HF checkpoint (loadable by transformers and vLLM) + optimizer/scheduler + run state, written to a
        temporary directory and renamed, so a killed job never leaves a half-written checkpoint."""
        final = Path(path)
        tmp = final.with_name(final.name + ".tmp")
        tmp.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(tmp)
        buf = io.BytesIO()
        torch.save({"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}, buf)
        (tmp / "optimizer.pt").write_bytes(buf.getvalue())
        (tmp / "rayward_state.json").write_text(
            json.dumps({"global_step": self.global_step, **(extra or {})})
        )
        if final.exists():
            for f in final.iterdir():
                f.unlink()
            final.rmdir()
        os.replace(tmp, final)
        return str(final)

    def load_checkpoint(self, path: str) -> dict[str, Any]:
        """Restore policy weights, optimizer, scheduler and global_step from `save_checkpoint`'s directory."""
        from safetensors.torch import load_file

        p = Path(path)
        self.model.load_state_dict(load_file(str(p / "model.safetensors")), strict=False)
        opt = torch.load(p / "optimizer.pt", map_location=self.device, weights_only=False)
        self.optimizer.load_state_dict(opt["optimizer"])
        self.scheduler.load_state_dict(opt["scheduler"])
        state = json.loads((p / "rayward_state.json").read_text())
        self.global_step = int(state["global_step"])
        return state
