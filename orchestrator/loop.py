"""The training loop: one call per phase on the run's named groups, each phase timed.

    rows     = run.prompts.next_batch(...)          driver
    rollouts = generate(run, rows)                  GeneratorGroup (vLLM)
    scored   = score(run, rollouts)                 RewardPool -> RewardWorkers
    batch    = advantages(run, rollouts, scored)    driver: gates, weights, schedules, GRPO advantages
    stats    = train(run, batch)                    Learner (pushes global_step to the reward pool)
    sync(run)                                       Learner -> generators, weights in place
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ray
import torch

from orchestrator.build import Run
from orchestrator.data import is_conversational
from orchestrator.grpo import compute_advantages, nanstd
from orchestrator.ops.metrics import PhaseTimer, reward_metrics

# A group whose total-reward std is at or below this is "zero spread" (identical rewards up to float noise).
STD_ZERO_TOL = 1e-6


@dataclass
class Rollouts:
    """One generation batch, flat in completion order (rows of one prompt contiguous, G per group)."""

    prompts: list[Any]  # raw prompt per completion (text or messages), repeated G times
    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    completions: list[Any]  # text, or [{"role": "assistant", "content": text}] for conversational prompts
    sampling_logprobs: list[list[float]]
    truncated: list[bool]
    columns: dict[str, list[Any]]  # every dataset column except the prompt, per completion
    policy_version: int  # learner step whose weights generated the batch
    group_size: int


def generate(run: Run, rows: list[dict[str, Any]]) -> Rollouts:
    groups = run.generators.call_sharded("generate", [r["prompt_ids"] for r in rows], **sampling_kwargs(run))
    return to_rollouts(run, rows, groups, run.policy_version)


def sampling_kwargs(run: Run) -> dict[str, Any]:
    g = run.cfg.generation
    return dict(n=g.num_generations, max_tokens=g.max_completion_length, temperature=g.temperature,
                top_p=g.top_p, top_k=g.top_k)


def to_rollouts(run: Run, rows: list[dict[str, Any]], groups: list[list[dict]], policy_version: int) -> Rollouts:
    """Flatten generator output (per prompt, G samples each) into one Rollouts batch."""
    pcol = run.cfg.data.prompt_column
    cols = [c for c in rows[0] if c not in (pcol, "prompt_ids")]
    out = Rollouts([], [], [], [], [], [], {c: [] for c in cols}, policy_version, run.cfg.generation.num_generations)
    for row, samples in zip(rows, groups, strict=True):
        chat = is_conversational(row[pcol])
        for s in samples:
            out.prompts.append(row[pcol])
            out.prompt_ids.append(row["prompt_ids"])
            out.completion_ids.append(s["completion_ids"])
            out.completions.append([{"role": "assistant", "content": s["text"]}] if chat else s["text"])
            out.sampling_logprobs.append(s["logprobs"])
            out.truncated.append(s["finish_reason"] == "length")
            for c in cols:
                out.columns[c].append(row[c])
    return out


def score_request(run: Run, rollouts: Rollouts) -> Any:
    """Submit a batch to the reward pool; returns the ObjectRef of its scores."""
    batch = {
        "prompts": rollouts.prompts, "completions": rollouts.completions, "completion_ids": rollouts.completion_ids,
        "columns": rollouts.columns, "group_size": rollouts.group_size,
    }
    return run.reward_pool.score.remote(batch, run.cfg.cluster.reward_chunk_groups)


def score(run: Run, rollouts: Rollouts) -> dict[str, Any]:
    return ray.get(score_request(run, rollouts))


def _totals(run: Run, scored: dict[str, Any], group_size: int) -> torch.Tensor:
    """The weighted, gated total per sample [N] (NaN if every reward had no opinion)."""
    raw = torch.tensor(scored["scores"], dtype=torch.float32).T
    agg = run.aggregator(raw, scored["global_step"])
    return compute_advantages(agg.gated, agg.weights, group_size, "none", "sum_then_normalize").total


def take_groups(r: Rollouts, scored: dict[str, Any], groups: list[int]) -> tuple[Rollouts, dict[str, Any]]:
    """The given groups (by index) of a batch and of its scores."""
    g = r.group_size
    idx = [gi * g + j for gi in groups for j in range(g)]
    pick = lambda xs: [xs[i] for i in idx]  # noqa: E731
    sub = Rollouts(
        pick(r.prompts), pick(r.prompt_ids), pick(r.completion_ids), pick(r.completions), pick(r.sampling_logprobs),
        pick(r.truncated), {c: pick(v) for c, v in r.columns.items()}, r.policy_version, g,
    )
    return sub, {**scored, "scores": [pick(col) for col in scored["scores"]]}


def join(a: tuple[Rollouts, dict[str, Any]], b: tuple[Rollouts, dict[str, Any]]) -> tuple[Rollouts, dict[str, Any]]:
    (ra, sa), (rb, sb) = a, b
    r = Rollouts(
        ra.prompts + rb.prompts, ra.prompt_ids + rb.prompt_ids, ra.completion_ids + rb.completion_ids,
        ra.completions + rb.completions, ra.sampling_logprobs + rb.sampling_logprobs, ra.truncated + rb.truncated,
        {c: ra.columns[c] + rb.columns[c] for c in ra.columns}, ra.policy_version, ra.group_size,
    )
    s = {**sb, "scores": [x + y for x, y in zip(sa["scores"], sb["scores"], strict=True)],
         "workers": sorted(set(sa["workers"]) | set(sb["workers"])), "busy_s": sa["busy_s"] + sb["busy_s"]}
    for key in ("timeouts", "errors"):
        s[key] = {n: sa[key][n] + sb[key][n] for n in sa[key]}
    return r, s


def keep_all(run: Run, rollouts: Rollouts, scored: dict, timer: PhaseTimer) -> tuple[Rollouts, dict, dict]:
    return rollouts, scored, {}


def dynamic_sampling(run: Run, rollouts: Rollouts, scored: dict, timer: PhaseTimer) -> tuple[Rollouts, dict, dict]:
    """DAPO: keep groups whose total reward has non-zero std; refill with new prompts for at most
    max_refill_rounds extra rounds; never drop an accepted group; train on what there is if still short."""
    g, target = rollouts.group_size, run.cfg.generation.generation_batch_size // rollouts.group_size
    kept: tuple[Rollouts, dict] | None = None
    seen = accepted = rounds = 0
    while True:
        std = nanstd(_totals(run, scored, g).view(-1, g), dim=1)  # [groups]; NaN if < 2 scorable samples
        good = [i for i, s in enumerate(std.tolist()) if s == s and s > STD_ZERO_TOL][: target - accepted]
        seen, accepted = seen + len(std), accepted + len(good)
        if good:
            part = take_groups(rollouts, scored, good)
            kept = part if kept is None else join(kept, part)
        if accepted >= target or rounds >= run.cfg.grpo.max_refill_rounds:
            break
        rounds += 1
        rows = run.prompts.next_batch(target - accepted)
        with timer("generate"):
            rollouts = generate(run, rows)
        with timer("reward"):
            scored = score(run, rollouts)
    if kept is None:  # nothing had spread: train on the last batch (all advantages 0) so the run moves on
        kept = (rollouts, scored)
    info = {"dynamic_sampling/pass_rate": accepted / seen, "dynamic_sampling/accepted_groups": accepted,
            "dynamic_sampling/refill_rounds": rounds, "dynamic_sampling/filled": float(accepted >= target)}
    return kept[0], kept[1], info


def advantages(run: Run, rollouts: Rollouts, scored: dict[str, Any]) -> tuple[dict[str, Any], dict[str, float]]:
    """Gates, scheduled weights and GRPO advantages at the step the batch was scored under."""
    g = run.cfg.grpo
    raw = torch.tensor(scored["scores"], dtype=torch.float32).T  # [N, K], NaN = None
    agg = run.aggregator(raw, scored["global_step"])
    adv = compute_advantages(
        agg.gated, agg.weights, rollouts.group_size, g.scale_rewards, g.multi_objective_aggregation
    )
    metrics = reward_metrics(
        run.aggregator.names, raw, agg.gated, agg.weights, adv.total, adv.advantages, adv.zero_std
    )
    metrics.update({f"gates/{k}/closed_frac": v for k, v in agg.gate_closed.items()})
    for name in run.aggregator.names:
        metrics[f"rewards/{name}/timeouts"] = scored["timeouts"][name]
        metrics[f"rewards/{name}/errors"] = scored["errors"][name]
        metrics[f"rewards/{name}/latency_s"] = scored["latency_s"][name]
    metrics.update({f"reward_fn/{k}": v for k, v in scored["metrics"].items()})  # users' log_metric values
    metrics["roles/reward/busy_s"] = scored["busy_s"]
    pool = scored["pool"]
    metrics.update({f"reward_pool/{k}": pool[k] for k in ("workers", "retries", "replaced", "queue_depth")})
    metrics["reward_pool/workers_used"] = len(scored["workers"])
    lengths = torch.tensor([len(c) for c in rollouts.completion_ids], dtype=torch.float32)
    metrics.update({
        "completions/mean_length": lengths.mean().item(),
        "completions/min_length": lengths.min().item(),
        "completions/max_length": lengths.max().item(),
        "completions/clipped_ratio": sum(rollouts.truncated) / len(rollouts.truncated),
        "batch/groups": len(rollouts.completion_ids) // rollouts.group_size,
        "policy_version": rollouts.policy_version,
        "reward_global_step": scored["global_step"],
    })
    batch = {
        "prompt_ids": rollouts.prompt_ids, "completion_ids": rollouts.completion_ids,
        "sampling_logprobs": rollouts.sampling_logprobs, "advantages": adv.advantages.tolist(),
        "truncated": rollouts.truncated,
    }
    return batch, metrics


def reward_state(run: Run) -> dict[str, Any]:
    """What the learner pushes to the reward pool with each new global_step (TRL's trainer_state fields)."""
    return {"max_steps": run.cfg.grpo.max_steps, "epoch": run.prompts.epoch_progress}


def train(run: Run, batch: dict[str, Any]) -> dict[str, float]:
    (stats,) = run.learner.call("train_step", batch, reward_state=reward_state(run))
    run.global_step = int(stats["global_step"])
    return stats


def sync(run: Run) -> None:
    (learner,) = run.learner.handles
    blob = learner.export_weights.remote()  # an ObjectRef: each generator pulls it from the object store
    run.generators.call("load_weights", blob)
    run.policy_version = run.global_step


def log_step(run: Run, timer: PhaseTimer, rollouts: Rollouts, reward_m: dict, train_m: dict) -> None:
    tokens = sum(len(c) for c in rollouts.completion_ids)
    gen_s = timer.seconds.get("generate", reward_m.get("time/generate_busy", 0.0))
    m = {**reward_m, **train_m, **timer.metrics(), "tokens_per_s": tokens / gen_s if gen_s else 0.0}
    # Per role: busy seconds in this step, and idle = step wall time - busy (who is the bottleneck?).
    busy = {"generator": gen_s, "reward": m["roles/reward/busy_s"], "learner": train_m["time/train_compute"]}
    for role, b in busy.items():
        m[f"roles/{role}/busy_s"], m[f"roles/{role}/idle_s"] = b, max(m["time/step"] - b, 0.0)
    m["roles/bottleneck"] = max(busy, key=busy.get)
    run.logger.log(run.global_step, m)


def save_checkpoint(run: Run) -> str:
    """Policy (HF format), optimizer, global_step and data position, written atomically by the learner."""
    path = run.run_dir / f"checkpoint-{run.global_step}"
    (out,) = run.learner.call("save_checkpoint", str(path), extra={"data": run.prompts.state()})
    return out


def maybe_checkpoint(run: Run, final: bool = False) -> None:
    every = run.cfg.grpo.save_steps
    if every is not None and (final or run.global_step % every == 0):
        save_checkpoint(run)


def run_sync(run: Run) -> list[dict[str, Any]]:
    """Synchronous GRPO: generate -> score -> advantages -> train -> sync, one step at a time."""
    g = run.cfg.generation
    prompts_per_step = g.generation_batch_size // g.num_generations
    while run.global_step < run.cfg.grpo.max_steps and not run.stop_requested:
        timer = PhaseTimer()
        rows = run.prompts.next_batch(prompts_per_step)
        with timer("generate"):
            rollouts = generate(run, rows)
        with timer("reward"):
            scored = score(run, rollouts)
        rollouts, scored, filter_m = run.select_groups(run, rollouts, scored, timer)
        batch, reward_m = advantages(run, rollouts, scored)
        reward_m.update(filter_m)
        with timer("train"):
            train_m = train(run, batch)
        with timer("sync"):
            sync(run)
        log_step(run, timer, rollouts, reward_m, train_m)
        maybe_checkpoint(run)
    if not run.stop_requested:
        maybe_checkpoint(run, final=True)
    return run.logger.history
