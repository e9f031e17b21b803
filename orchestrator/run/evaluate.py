"""`evaluate(cfg, checkpoint)`: what `rayward eval` does, inside or outside an existing Ray session: an eval-only run
built as a training run is (orchestrator/run/build: `prepare_evaluation` -> `start_groups` -> an `EvalSet`), once.

    evaluate(cfg)   check (before Ray)  ->  start Ray  ->  the scoring pool, environments, generators  ->  one eval
                    ->  tear down  ->  the report (eval.json, images beside it) and the metrics table
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from actors.runtime.completions import image_files, with_completions
from orchestrator.config import DataSource, EvalConfig, RunConfig
from orchestrator.eval.evaluator import EvalResult, finish_eval, submit_eval
from orchestrator.run.build import eval_set, prepare_evaluation, rollout_kind, start_groups
from orchestrator.run.cluster import init_ray, new_run_name


def with_eval_block(cfg: RunConfig, say: Any) -> RunConfig:
    """The config itself, or (no eval block) one evaluating on its `data` with the eval defaults, said so."""
    if cfg.eval is not None:
        return cfg
    say("rayward eval: the config has no eval block: evaluating on its `data` with the eval defaults", flush=True)
    held_out = DataSource(**cfg.data.model_dump(include=set(DataSource.model_fields)))
    return cfg.model_copy(update={"eval": EvalConfig(data=held_out)})


def evaluate(
    cfg: RunConfig, checkpoint: str | Path | None = None, *, name: str | None = None, verbose: bool = True,
    output: str | Path | None = None,
) -> dict[str, Any]:
    """Evaluate a checkpoint (an HF model directory), or the config's model, on the eval block's data with its
    rewards, as an eval during training would (the config's `data` and the eval defaults when it has no eval
    block). Prints the metrics and writes a JSON report (default `<logging.dir>/<name>/eval.json`); returns the
    report."""
    import ray

    say = print if verbose else (lambda *a, **k: None)
    cfg = with_eval_block(cfg, say)
    name = name or cfg.name or new_run_name("eval")
    p = prepare_evaluation(cfg, name, checkpoint)
    owns_ray = not ray.is_initialized()
    if owns_ray:
        init_ray(cfg.cluster, name)
    groups = None
    try:
        groups = start_groups(p)
        es = eval_set(cfg, p.eval_prompts, groups.reward_pool, p.rewards, rollout_kind(p.agent, p.vision))
        result = finish_eval(es, submit_eval(es, groups.generators, p.step))
        # the completions from their payloads, while the generators that hold them are up
        samples = with_completions(result.rows(), result.rollouts.payloads, result.rollouts.group_size)
    finally:
        if groups is not None:
            groups.kill()
        if owns_ray:
            ray.shutdown()
    out = Path(output) if output is not None else Path(cfg.logging.dir) / name / "eval.json"
    report = {
        "model": p.policy, "checkpoint": None if checkpoint is None else str(checkpoint), "step": p.step,
        "eval": cfg.eval.model_dump(mode="json"), "metrics": result.metrics,
        "samples": image_files(samples, out.parent),  # images: files beside the report
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1, default=str))
    _print_metrics(say, p.policy, p.step, cfg, len(p.eval_prompts or []), result, out)
    return report


def _print_metrics(say: Any, policy: str | None, step: int, cfg: RunConfig, prompts: int, result: EvalResult,
                   out: Path) -> None:
    e = cfg.eval
    assert e is not None
    say(f"rayward eval: {policy} (step {step}) on {e.data.path!r}: {prompts} prompts x {e.num_generations} "
        f"completions", flush=True)
    width = max(len(k) for k in result.metrics)
    say(f"{'metric':<{width}}  value")
    for k, v in result.metrics.items():
        say(f"{k:<{width}}  {v:.4g}")
    say(f"rayward eval: report {out}", flush=True)
