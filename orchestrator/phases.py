"""The phases of a GRPO step, each one call on the run's named groups. Both loops (loop.py) are made of these.

    rows     = run.prompts.next_batch(n)                    driver
    rollouts = generate(run, rows)                          generators (vLLM)          -> Rollouts
    scores   = score(run, rollouts)                         reward pool -> workers     -> Scores
    rollouts, scores, _ = run.select(rollouts, scores, ...) keep all / dynamic sampling
    batch, m, table = advantages(run, rollouts, scores)     driver: gates, weights, advantages -> TrainBatch
    stats    = train(run, batch)                            learner (pushes TrainerState to the pool)
    sync(run)                                               learner -> every engine (actors.weights)
    log_step(...); maybe_checkpoint(run)
    run.evaluate.after_step(step)                           held-out eval (orchestrator/evaluator.py)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ray
from ray.exceptions import RayActorError

from actors.types import Rollouts, Sample, Scores, TrainBatch, TrainerState
from orchestrator.aggregation import to_train_batch
from orchestrator.build import Run
from orchestrator.config import RunConfig
from orchestrator.data import to_rollouts
from orchestrator.selection import Refill
from orchestrator.telemetry.metrics import PhaseTimer

# How long a restarted generator may take to come back (a fresh vLLM engine loads the model) before the run
# gives up on it.
RESTART_WAIT_S = 600.0


# --- generate ---------------------------------------------------------------------------------------------


def sampling_kwargs(cfg: RunConfig) -> dict[str, Any]:
    g = cfg.generation
    return dict(n=g.num_generations, max_tokens=g.max_completion_length, temperature=g.temperature,
                top_p=g.top_p, top_k=g.top_k)


def rollouts_of(cfg: RunConfig, rows: list[dict[str, Any]], groups: list[list[Sample]], policy_version: int) -> Rollouts:
    """A training batch's generator output as Rollouts (the training data's prompt column, G per prompt)."""
    return to_rollouts(rows, groups, policy_version, prompt_column=cfg.data.prompt_column,
                       group_size=cfg.generation.num_generations)


def with_generator_restarts(run: Run, call: Callable[[], Any]) -> Any:
    """Run a call on the generators; if one died and Ray restarted it (cluster.generator_max_restarts), wait
    for it, bring it the current weights (the weight-transfer group re-forms), and run the call once more."""
    try:
        return call()
    except RayActorError:
        if run.cfg.cluster.generator_max_restarts == 0:
            raise
    restart_generators(run)
    return call()


def restart_generators(run: Run) -> None:
    """After a generator died: wait for Ray to restart it, re-form the weight-transfer group and bring every engine
    the current weights."""
    print("rayward: a generator died; waiting for Ray to restart it, then re-syncing weights", flush=True)
    run.generators.wait_alive(RESTART_WAIT_S)
    run.weights.rejoin()
    run.policy_version = run.global_step
    run.generator_restarts += 1


def generate(run: Run, rows: list[dict[str, Any]]) -> Rollouts:
    ids = [r["prompt_ids"] for r in rows]
    groups = with_generator_restarts(
        run, lambda: run.generators.call_sharded("generate", ids, **sampling_kwargs(run.cfg))
    )
    return rollouts_of(run.cfg, rows, groups, run.policy_version)


# --- score ------------------------------------------------------------------------------------------------


def score_request(run: Run, rollouts: Rollouts) -> Any:
    """Submit a batch to the reward pool; returns the ObjectRef of its Scores."""
    return run.reward_pool.score.remote(rollouts.reward_batch(), run.cfg.cluster.reward_chunk_groups)


def score(run: Run, rollouts: Rollouts) -> Scores:
    return ray.get(score_request(run, rollouts))


def refill(run: Run, timer: PhaseTimer) -> Refill:
    """Dynamic sampling's refill: generate and score that many new prompts, timed as their phases."""

    def more(num_prompts: int) -> tuple[Rollouts, Scores]:
        rows = run.prompts.next_batch(num_prompts)
        with timer("generate"):
            rollouts = generate(run, rows)
        with timer("reward"):
            return rollouts, score(run, rollouts)

    return more


# --- advantages -------------------------------------------------------------------------------------------

def advantages(run: Run, rollouts: Rollouts, scores: Scores) -> tuple[TrainBatch, dict[str, Any], dict[str, list]]:
    """Gates, scheduled weights and GRPO advantages at the step the batch was scored under, with the step's
    reward, pool and completion metrics, and the per-sample table of the completions log."""
    g = run.cfg.grpo
    batch, metrics, table = to_train_batch(
        run.aggregator, rollouts, scores, scale_rewards=g.scale_rewards, aggregation=g.multi_objective_aggregation
    )
    for name in scores.names:
        metrics[f"rewards/{name}/timeouts"] = scores.timeouts[name]
        metrics[f"rewards/{name}/errors"] = scores.errors[name]
        metrics[f"rewards/{name}/latency_s"] = scores.latency_s[name]
    metrics.update({f"reward_fn/{k}": v for k, v in scores.metric_means().items()})  # users' log_metric values
    metrics["roles/reward/busy_s"] = scores.busy_s
    metrics.update(scores.pool.step_metrics())  # reward_pool/...: the pool's state after this batch
    metrics["reward_pool/queue_wait_s"] = scores.queue_wait_s
    metrics["reward_pool/workers_used"] = len(scores.workers)
    lengths = [len(c) for c in rollouts.completion_ids]
    metrics.update({
        "completions/mean_length": sum(lengths) / len(lengths),
        "completions/min_length": min(lengths),
        "completions/max_length": max(lengths),
        "completions/clipped_ratio": sum(rollouts.truncated) / len(rollouts.truncated),
        "batch/groups": rollouts.num_groups,
        "policy_version": rollouts.policy_version,
        "reward_global_step": scores.global_step,
    })
    return batch, metrics, table


# --- train and sync ---------------------------------------------------------------------------------------


def trainer_state(run: Run) -> TrainerState:
    """What the learner pushes to the reward pool with each new global_step (it fills in global_step)."""
    return TrainerState(max_steps=run.cfg.grpo.max_steps, epoch=run.prompts.epoch_progress)


def train(run: Run, batch: TrainBatch) -> dict[str, float]:
    (stats,) = run.learner.call("train_step", batch, reward_state=trainer_state(run))
    run.global_step = int(stats["global_step"])
    return stats


def submit_train(run: Run, batch: TrainBatch) -> Any:
    """Pipelined: start the train step; returns rank 0's ObjectRef of its metrics."""
    (learner,) = run.learner.handles
    return learner.train_step.remote(batch, reward_state=trainer_state(run))


def sync(run: Run) -> dict[str, float]:
    """New weights into every engine, waited for; returns the sync's metrics (gather/transfer/load, GB/s)."""
    stats = with_generator_restarts(run, run.weights.push)
    run.policy_version = run.global_step
    return stats.metrics()


def sync_async(run: Run) -> dict[str, float]:
    """Pipelined: submit the sync without waiting (it queues on each generator behind generation already
    submitted, so every later generation uses the new weights); returns the metrics of the last finished sync. A
    generator that died since the last one is restarted and brought the current weights first."""
    with_generator_restarts(run, run.weights.submit_async)
    run.policy_version = run.global_step
    return run.weights.last.metrics() if run.weights.last is not None else {}


# --- log and checkpoint -----------------------------------------------------------------------------------


def log_step(
    run: Run, timer: PhaseTimer, rollouts: Rollouts, scores: Scores, table: dict[str, list], m: dict[str, Any]
) -> None:
    tokens = sum(len(c) for c in rollouts.completion_ids)
    gen_s = timer.seconds.get("generate", m.get("time/generate_busy", 0.0))
    m = {**m, **timer.metrics(), "tokens_per_s": tokens / gen_s if gen_s else 0.0}
    # Per role: busy seconds in this step, and idle = step wall time - busy (who is the bottleneck?).
    busy = {"generator": gen_s, "reward": m["roles/reward/busy_s"], "learner": m["time/train_compute"]}
    for role, b in busy.items():
        m[f"roles/{role}/busy_s"], m[f"roles/{role}/idle_s"] = b, max(m["time/step"] - b, 0.0)
    m["roles/bottleneck"] = max(busy, key=busy.get)
    run.logger.log(run.global_step, m)
    if run.cfg.logging.log_completions:
        log_completions(run, rollouts, scores, table)


def log_completions(run: Run, rollouts: Rollouts, scores: Scores, table: dict[str, list]) -> None:
    """One row per trained sample to the run's completions log (<run dir>/completions.jsonl, and a W&B table
    where W&B is on): step, prompt, completion, each reward raw and gated, total, advantage, and the reward
    functions' log_extra columns."""
    rows = []
    for i in range(len(rollouts)):
        row = {"step": run.global_step, "policy_version": rollouts.policy_version,
               "prompt": rollouts.prompts[i], "completion": rollouts.completions[i]}
        row.update({k: v[i] for k, v in table.items()})
        row.update({c: v[i] for c, v in scores.extra.items()})
        rows.append(row)
    run.logger.log_completions(run.global_step, rows)


def save_checkpoint(run: Run) -> str:
    """Policy (HF format), optimizer, global_step and data position, written atomically by the learner."""
    path = run.run_dir / f"checkpoint-{run.global_step}"
    (out,) = run.learner.call("save_checkpoint", str(path), extra={"data": run.prompts.state()})
    return out


def maybe_checkpoint(run: Run) -> None:
    every = run.cfg.grpo.save_steps
    if every is not None and run.global_step % every == 0:
        save_checkpoint(run)


def save_merged(run: Run) -> str:
    """LoRA: the base with the adapter merged in, and the tokenizer, as an HF model directory `<run dir>/merged`."""
    (out,) = run.learner.call("save_merged", str(run.run_dir / "merged"))
    return out


def finish(run: Run) -> list[dict[str, Any]]:
    """The end of either loop: the last weight sync lands, an eval still on its way is recorded, the final
    checkpoint (unless stopping on SIGTERM, where train() writes it), and with model.lora.save_merged the merged
    model of a finished run."""
    with_generator_restarts(run, run.weights.drain)
    run.evaluate.drain()
    if not run.stop_requested and run.cfg.grpo.save_steps is not None:
        save_checkpoint(run)
    lora = run.cfg.model.lora
    if not run.stop_requested and lora is not None and lora.save_merged:
        print(f"rayward: merged model (base + adapter) in {save_merged(run)}", flush=True)
    return run.logger.history


def done(run: Run) -> bool:
    return run.global_step >= run.cfg.grpo.max_steps or run.stop_requested
