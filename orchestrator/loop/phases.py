"""The phases of a GRPO step, each one call on the run's named groups. Both loops (loop.py) are made of these.

    prompts   = run.prompts.next_batch(n)                       driver                      -> [Prompt]
    rollouts  = generate(run, prompts)                          generators (vLLM)           -> Rollouts
    scores    = score(run, rollouts)                            reward pool -> workers      -> Scores
    selection = run.select(rollouts, scores, refill(run, t))    keep all / dynamic sampling -> Selection
    step      = to_train_batch(run, selection)                  driver: gates, weights, advantages, step metrics
                                                                                            -> StepBatch
    step, trained = train(run, step, refill(run, t))            learner (pushes TrainerState to the pool)
                                                                                            -> TrainResult
    synced    = sync(run)                                       learner -> every engine     -> SyncStats
    log_step(run, t, step, trained, synced)                     (every request seeded: data.request_seed)
    checkpoints.save_periodic(run); run.evaluate.after_step(global_step)

Phases read the run's progress and never write it: the loop does, from what they return.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from ray.exceptions import RayActorError

from actors.runtime.group import Pending
from actors.types import GroupOut, Rollouts, Scores, TrainBatch, TrainerState, TrainResult
from actors.weights.transfer import SyncStats
from orchestrator.algo import aggregation
from orchestrator.algo.selection import Refill, Selection, replace_groups
from orchestrator.data.sources import Prompt, request_seed, to_rollouts
from orchestrator.loop.rollout import agent_metrics
from orchestrator.run import checkpoints
from orchestrator.run.state import Run
from orchestrator.telemetry.metrics import COMPLETIONS_FILE, PhaseTimer

T = TypeVar("T")

# How long a restarted generator may take to come back (a fresh vLLM engine loads the model) before the run
# gives up on it.
RESTART_WAIT_S = 600.0


# --- generate ---------------------------------------------------------------------------------------------


def rollouts_of(run: Run, prompts: list[Prompt], groups: list[GroupOut], policy_version: int) -> Rollouts:
    """A training batch's generator answers as Rollouts (the training data's prompt column, G per prompt)."""
    return to_rollouts(prompts, groups, policy_version, prompt_column=run.cfg.data.prompt_column,
                       group_size=run.cfg.generation.num_generations)


def recover_generators(run: Run, training: bool = False) -> None:
    """After a generator died: wait for Ray to restart it (where there is room: until then, say what it waits
    for), then re-form the weight-transfer group and bring every engine the current weights, labelled with the
    learner's step when it sends them (training: a train step is in flight, and the learner sends after it).
    Generators lost with their node while others are up are not waited for (`go_on_without`)."""
    if go_on_without(run, training):
        return
    t0 = time.monotonic()
    run.display.message("rayward: a generator died; waiting for Ray to restart it, then re-syncing weights")
    run.generators.recover(RESTART_WAIT_S, on_wait=lambda text: run.display.message(f"rayward: {text}"))
    run.weights.rejoin(run.progress.global_step + (run.cfg.grpo.num_iterations if training else 0))
    seconds = time.monotonic() - t0
    run.faults.record("generator_restarted", f"the generators are back after {seconds:.1f} s", seconds=seconds,
                      step=run.progress.global_step)


def go_on_without(run: Run, training: bool = False) -> bool:
    """Generators down because their node died, while others are up: the run goes on with the others at once
    (the weight group re-formed without them; the loops send the work they had to the others: Stream.member None)
    and as many new engines start, each joining at a step boundary once up and synced (orchestrator/loop/fleet.py
    _join; on a cluster without room, once a node comes). Ray would restart a lost one only where there is room,
    and the others would wait for its model load. False (nothing done): none was lost with its node, or none is
    left; the caller waits for Ray's restart."""
    gens = run.generators
    lost = gens.lost_with_node()
    if not lost or len(lost) >= gens.active:
        return False
    t0 = time.monotonic()
    names = gens.remove(lost)
    for member in sorted(lost, reverse=True):
        run.engines.remove(member)
    run.weights.rejoin(run.progress.global_step + (run.cfg.grpo.num_iterations if training else 0))
    started = gens.start_pending(len(lost)) if not gens.retiring() else []  # a shrinking fleet: not replaced
    then = f"; {', '.join(started)} starting in its place (joins once up and synced)" if started else ""
    seconds = time.monotonic() - t0
    run.faults.record("generator_lost", f"{', '.join(names)} lost with its node: its requests go to the other "
                      f"generators ({gens.active} now){then}", seconds=seconds, step=run.progress.global_step,
                      generators=gens.active)
    return True


def with_generator_restarts(run: Run, call: Callable[[], T]) -> T:
    """Run a call on the generators; if one died and Ray restarted it (cluster.generator_max_restarts), recover
    and run the call once more. One that Ray restarted while it was idle (no call of ours failed) is recovered
    first: it would generate with the initial weights."""
    if run.generators.restarted():
        recover_generators(run)
    try:
        return call()
    except RayActorError:
        if run.cfg.cluster.generator_max_restarts == 0:
            raise
    recover_generators(run)
    return call()


def seeds_of(run: Run, prompts: list[Prompt], policy_version: int) -> list[int]:
    """Each prompt's sampling seed (data.request_seed), from the run's seed, the generating step and its draw:
    a resumed run draws the completions the original would have (agentic: also its group's environment seed)."""
    return [request_seed(run.cfg.seed, policy_version, p.draw) for p in prompts]


def generate(run: Run, prompts: list[Prompt]) -> Rollouts:
    """The prompts' samples (the prompt source's last batch), one-turn or agentic as the run was built."""
    version = run.progress.policy_version
    seeds = seeds_of(run, prompts, version)
    groups = with_generator_restarts(
        run, lambda: run.rollout.generate(run.generators, prompts, seeds, run.sampling, version)
    )
    return rollouts_of(run, prompts, groups, version)


# --- score ------------------------------------------------------------------------------------------------


def submit_score(run: Run, rollouts: Rollouts) -> Pending[Scores]:
    return run.reward_pool.submit_score(run.rollout.reward_batch(rollouts), run.cfg.cluster.reward_chunk_groups)


def score(run: Run, rollouts: Rollouts) -> Scores:
    return submit_score(run, rollouts).result()


def refill(run: Run, timer: PhaseTimer) -> Refill:
    """Dynamic sampling's refill: generate and score that many new prompts, timed as their phases."""

    def more(num_prompts: int) -> tuple[Rollouts, Scores]:
        prompts = run.prompts.next_batch(num_prompts)
        with timer("generate"):
            rollouts = generate(run, prompts)
        with timer("reward"):
            return rollouts, score(run, rollouts)

    return more


# --- to the learner's batch -------------------------------------------------------------------------------


@dataclass
class StepBatch:
    """What a step trains on, and what it logs about it."""

    rollouts: Rollouts  # the selected groups
    scores: Scores
    batch: TrainBatch  # the learner's input: token ids, sampling logprobs, advantages
    metrics: dict[str, float]  # reward, gate, pool, completion and selection metrics
    # per sample, the completions log's columns: each reward raw and gated, total, advantage
    table: dict[str, list[Any]]


def to_train_batch(run: Run, selection: Selection) -> StepBatch:
    """Gates, scheduled weights and GRPO advantages at the step the batch was scored under (orchestrator/
    aggregation.py), with the step's metrics."""
    g = run.cfg.grpo
    rollouts, scores = selection.rollouts, selection.scores
    adv = aggregation.advantage_batch(
        run.aggregator, rollouts, scores, scale_rewards=g.scale_rewards, aggregation=g.multi_objective_aggregation
    )
    metrics = {**adv.metrics, **step_metrics(rollouts, scores), **selection.metrics}
    metrics.update(run.prompts.metrics())  # a curriculum's pools and draws; a stream's skipped rows
    batch = replace(adv.batch, record=run.tokens.picks(len(adv.batch)))  # the learner returns their log-probs
    return StepBatch(rollouts, scores, batch, metrics, adv.table)


def step_metrics(rollouts: Rollouts, scores: Scores) -> dict[str, float]:
    """What scoring and generating the batch logged: per-reward timeouts, errors and latency, the reward
    functions' log_metric means, the reward pool's state, completion lengths, the batch's versions."""
    m: dict[str, Any] = {}
    for name in scores.names:
        m[f"rewards/{name}/timeouts"] = scores.timeouts[name]
        m[f"rewards/{name}/errors"] = scores.errors[name]
        m[f"rewards/{name}/latency_s"] = scores.latency_s[name]
    for name, skipped in scores.skipped.items():  # gate.lazy: the calls its closed gates saved
        m[f"rewards/{name}/skipped"] = sum(skipped)
    m.update({f"reward_fn/{k}": v for k, v in scores.metric_means().items()})  # users' log_metric values
    m.update(scores.pool.step_metrics())
    m["reward_pool/queue_wait_s"] = scores.queue_wait_s
    m["reward_pool/workers_used"] = len(scores.workers)
    for name, stats in scores.judge_pools.items():  # judge rewards: each judge's engines (judge_pool/<reward>/...)
        m.update({k.replace("judge_pool/", f"judge_pool/{name}/", 1): v for k, v in stats.step_metrics().items()})
    if scores.teacher is not None:  # distillation: samples the teacher gave no log-probs (out of its term)
        m["distill/teacher_failures"] = scores.teacher_failures
    if scores.teacher_pool is not None:
        m.update(scores.teacher_pool.step_metrics())
    lengths = rollouts.lengths()  # agentic: the model's tokens only (tool results are not its length)
    m.update({
        "completions/mean_length": sum(lengths) / len(lengths),
        "completions/min_length": min(lengths),
        "completions/max_length": max(lengths),
        "completions/clipped_ratio": sum(rollouts.truncated) / len(rollouts.truncated),
        "batch/groups": rollouts.num_groups,
        "policy_version": rollouts.policy_version,
        "reward_global_step": scores.global_step,
    })
    m.update(agent_metrics(rollouts))
    return m


# --- train and sync ---------------------------------------------------------------------------------------


def trainer_state(run: Run) -> TrainerState:
    """What the learner pushes to the reward pool with each new global_step (it fills in global_step)."""
    return TrainerState(max_steps=run.cfg.grpo.max_steps, epoch=run.prompts.epoch_progress)


def train(run: Run, step: StepBatch, refill: Refill) -> tuple[StepBatch, TrainResult]:
    """The step trained (`retrained`: as it was, or with its lost groups replaced)."""
    return retrained(run, step, run.learner.train_step(step.batch, trainer_state(run)), refill)


def retrained(run: Run, step: StepBatch, trained: TrainResult, refill: Refill) -> tuple[StepBatch, TrainResult]:
    """`trained` when the learner could fetch the whole batch. Where a group's token data was lost after it was
    scored (its generator or node gone: TrainResult.lost, nothing trained), those groups are replaced by new
    prompts' groups, generated and scored (`refill`), and the step is sent again; `data_plane/lost_groups`
    counts them with the ones lost before scoring (selection.without_lost)."""
    lost = 0
    while trained.lost:
        lost += len(trained.lost)
        rollouts, scores = replace_groups(step.rollouts, step.scores, trained.lost, refill)
        again = to_train_batch(run, Selection(rollouts, scores))
        step = replace(again, metrics={**step.metrics, **again.metrics})
        trained = run.learner.train_step(step.batch, trainer_state(run))
    if lost:
        step.metrics["data_plane/lost_groups"] = step.metrics.get("data_plane/lost_groups", 0) + lost
    return step, trained


def submit_train(run: Run, batch: TrainBatch) -> Pending[TrainResult]:
    """Pipelined: start the train step without waiting."""
    return run.learner.submit_train_step(batch, trainer_state(run))


def sync(run: Run) -> SyncStats:
    """New weights into every engine, waited for; the engines label what they sample with them by the step."""
    return with_generator_restarts(run, lambda: run.weights.push(run.progress.global_step))


def sync_async(run: Run) -> SyncStats | None:
    """Pipelined: submit the sync without waiting (it queues on each generator behind generation already
    submitted, so every later generation uses the new weights); returns the last finished sync (None before
    one). A generator that died since the last one is restarted and brought the current weights first."""
    with_generator_restarts(run, lambda: run.weights.submit_async(run.progress.global_step))
    return run.weights.last


def async_metrics(lags: list[int], dropped: int, in_flight: int, loads_in_flight: int) -> dict[str, float]:
    """The async loop's step: how many optimizer steps behind the learner its samples' oldest tokens were, groups
    dropped as too stale, prompts in flight after it was taken, and whether its weight sync landed while calls
    were still sampling (an in-flight update)."""
    return {"async/version_lag/mean": sum(lags) / len(lags), "async/version_lag/max": max(lags),
            "async/dropped_stale": dropped, "async/in_flight_prompts": in_flight,
            "async/loads_in_flight": loads_in_flight}


# --- log and finish ---------------------------------------------------------------------------------------


def log_step(
    run: Run, timer: PhaseTimer, step: StepBatch, trained: TrainResult, synced: SyncStats | None, *,
    staleness: int | None = None, generate_busy_s: float | None = None,
) -> None:
    """The step's metrics row (and its completions). Pipelined: the batch's staleness (steps its weights were
    behind the learner's) and the generators' busy seconds on it, generated while earlier steps trained."""
    m: dict[str, Any] = {**step.metrics, **trained.metrics, "global_step": trained.global_step,
                         "num_tokens": trained.num_tokens, "time/train_compute": trained.compute_s,
                         "epoch": run.prompts.epoch_progress}  # TRL's rows carry it: fractional epochs served
    m.update(synced.metrics() if synced is not None else {})
    if run.env_pool is not None:  # the environment pool's state (workers, sessions, lost sessions, ...)
        m.update(run.env_pool.stats().step_metrics())
    # the fleet (`rayward scale --generators`): engines taking work, and those finishing theirs before they leave
    m["generators/count"], m["generators/retiring"] = run.generators.active, len(run.generators.retiring())
    if staleness is not None:
        m["policy_staleness"] = staleness
    if generate_busy_s is not None:
        m["time/generate_busy"] = generate_busy_s
    m.update(timer.metrics())
    m.update(run.engines.step_metrics(m["time/step"], run.generators.active))  # occupancy, busy, tokens/s
    gen_s = timer.seconds.get("generate", generate_busy_s or 0.0)
    m["tokens_per_s"] = sum(i.length for i in step.rollouts.infos) / gen_s if gen_s else 0.0
    # Per role: busy seconds in this step, and idle = step wall time - busy (who is the bottleneck?).
    busy = {"generator": gen_s, "reward": step.scores.busy_s, "learner": trained.compute_s}
    for role, b in busy.items():
        m[f"roles/{role}/busy_s"], m[f"roles/{role}/idle_s"] = b, max(m["time/step"] - b, 0.0)
    m["roles/bottleneck"] = max(busy, key=busy.get)
    run.logger.log(run.progress.global_step, m)
    if run.tool_watch is not None and step.rollouts.agentic:
        run.tool_watch.observe(run.progress.global_step, step.rollouts.infos)
    if run.cfg.logging.log_completions:
        log_completions(run, step)
        run.tokens.record(run.progress.global_step, trained.token_records, step.rollouts.prompt_index)


def log_completions(run: Run, step: StepBatch) -> None:
    """One row per trained sample to the run's completions log (<run dir>/completions.jsonl, and a W&B table
    where W&B is on): step, prompt, completion, each reward raw and gated, total, advantage, the reward
    functions' log_extra columns, and prompt_index (the prompt's draw in the run's prompt stream: with the
    sample's place in its group, its id). With tools the completion is the whole conversation (assistant messages
    with their tool_calls, tool messages with the results), with its stop reason, turns, tool calls and failures."""
    r, rows = step.rollouts, []
    for i, info in enumerate(r.infos):
        # the completion (and an agentic sample's prompt as the engine rendered it): filled where the log is
        # written, from the group's payload (actors/runtime/completions.py)
        row = {"step": run.progress.global_step, "policy_version": r.policy_version, "prompt_index": r.prompt_index[i],
               "prompt": r.prompts[i], "completion": None, "completion_length": info.model_tokens}
        if info.agentic:  # the completion is the conversation: assistant and tool messages
            row.update(stop_reason=info.finish_reason, turns=info.turns, tool_calls=info.tool_calls,
                       tool_failures=info.tool_failures)
        row.update({k: v[i] for k, v in step.table.items()})
        row.update({c: v[i] for c, v in step.scores.extra.items()})
        rows.append(row)
    table = run.completions.write(COMPLETIONS_FILE, rows, r.payloads, r.group_size, run.logger.table_rows)
    run.logger.log_table(run.progress.global_step, table)


def finish(run: Run) -> list[dict[str, Any]]:
    """The end of either loop: the last weight sync lands, an eval still on its way is recorded, the final (or
    SIGTERM) checkpoint, and with model.lora.save_merged the merged model of a finished run."""
    with_generator_restarts(run, run.weights.drain)
    run.evaluate.drain()
    run.completions.drain()  # the last step's rows are in completions.jsonl when the run returns
    checkpoints.save_final(run)
    if run.tool_watch is not None and (line := run.tool_watch.summary()) is not None:
        run.display.message(line)
    lora = run.cfg.model.lora
    if finished(run) and lora is not None and lora.save_merged:
        merged = run.learner.save_merged(str(run.run_dir / "merged"))
        run.display.message(f"rayward: merged model (base + adapter) in {merged}")
    return run.logger.history


def finished(run: Run) -> bool:
    """The run trained its max_steps (not stopped by SIGTERM, nor paused to move the learner)."""
    p = run.progress
    return p.global_step >= run.cfg.grpo.max_steps and not p.stop_requested and p.move_learner is None


def done(run: Run) -> bool:
    """Whether the loop stops at this step boundary: max_steps, SIGTERM, or a preemption notice for the learner."""
    p = run.progress
    return p.global_step >= run.cfg.grpo.max_steps or p.stop_requested or p.move_learner is not None
