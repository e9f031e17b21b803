"""How a run's generators turn prompts into samples (its `RolloutKind`), chosen once when the run is built
(build.rollout_kind):

    OneTurn   one completion per sample: Generator.generate / generate_stream on the prompts' token ids
    Agentic   multi-turn conversations with tools: Generator.rollout / rollout_stream on the dataset rows themselves
              (the generator renders the prompt with the environment's tools and reset()'s text), one seed per
              row (a GRPO group's environments start from the same state), and the environments' outputs
              (get_reward(), the pickled environments) handed to the reward pool with the completions

The loop and the evaluator call the same four methods on either; nothing downstream asks which it is. Every call
carries min_version, the weights its batch is accounted to: a generator's weight loads run beside generation
(between engine steps, actors/generation/generator.py GENERATOR_GROUPS), so the order of calls no longer says
which weights sample; requests wait for that version instead. The agentic step metrics (turns, tools, stop
reasons, tokens by role) are `agent_metrics`, pure.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Protocol

from actors.runtime.group import Pending, Stream
from actors.types import FinishedOuts, GroupOut, RewardBatch, Rollouts, Sampling, StopReason
from orchestrator.data.sources import Prompt
from orchestrator.run.groups import Generators

# Every stop reason, so each step logs all of their fractions (a reason absent from a step logs 0, and a plot of
# it has no gaps).
STOP_REASONS: tuple[StopReason, ...] = ("stop", "max_turns", "length", "timeout", "env_error")


class RolloutKind(Protocol):
    """Generation as the phases, the pipelined bookkeeping and the evaluator call it."""

    def generate(self, generators: Generators, prompts: list[Prompt], seeds: list[int],
                 sampling: Sampling, min_version: int) -> list[GroupOut]:
        """Every prompt's samples (prompt order), sharded over the generators, waited for."""

    def submit(self, generators: Generators, prompts: list[Prompt], seeds: list[int],
               sampling: Sampling, min_version: int | None) -> list[Pending[list[GroupOut]]]:
        """The same without waiting, for an eval: seeded (every eval draws alike) and pinned to one version (no
        weight load lands until it is done; min_version None: whatever the engines hold), one Pending per shard."""

    def stream(self, generators: Generators, member: int, prompts: list[Prompt], seeds: list[int],
               sampling: Sampling, min_version: int) -> Stream[FinishedOuts]:
        """One generator's groups as they finish."""

    def reward_batch(self, rollouts: Rollouts) -> RewardBatch:
        """What the reward pool scores."""


@dataclass(frozen=True)
class OneTurn:
    """One-turn completions of the prompts' token ids, one seed per prompt (vLLM seeds sample j of a prompt with
    its seed + j). vision: the prompts' images travel with them (a vision-language model). prompt_ids: the reward
    batch carries the prompts' ids (a distillation teacher reads them)."""

    vision: bool = False
    prompt_ids: bool = False

    def _images(self, prompts: list[Prompt]) -> list[tuple] | None:
        return [p.images for p in prompts] if self.vision else None

    def generate(self, generators: Generators, prompts: list[Prompt], seeds: list[int],
                 sampling: Sampling, min_version: int) -> list[GroupOut]:
        return generators.generate([p.prompt_ids for p in prompts], seeds, sampling, min_version=min_version,
                                   images=self._images(prompts))

    def submit(self, generators: Generators, prompts: list[Prompt], seeds: list[int],
               sampling: Sampling, min_version: int | None) -> list[Pending[list[GroupOut]]]:
        return generators.submit_generate([p.prompt_ids for p in prompts], seeds, sampling, min_version=min_version,
                                          pin=True, images=self._images(prompts))

    def stream(self, generators: Generators, member: int, prompts: list[Prompt], seeds: list[int],
               sampling: Sampling, min_version: int) -> Stream[FinishedOuts]:
        return generators.stream_generate(member, [p.prompt_ids for p in prompts], seeds, sampling,
                                          min_version=min_version, images=self._images(prompts))

    def reward_batch(self, rollouts: Rollouts) -> RewardBatch:
        return by_reference(rollouts, with_prompt_ids=self.prompt_ids)


def by_reference(rollouts: Rollouts, **kw: object) -> RewardBatch:
    """The batch's reward batch as the driver sends it: its prompts and columns, and its groups' token data by
    reference (the workers resolve it)."""
    return RewardBatch(rollouts.prompts, [], [], rollouts.columns, rollouts.group_size,
                       payloads=rollouts.payloads, **kw)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Agentic:
    """Multi-turn rollouts with tools (see the module docstring). env_classes: environment_factory name (None:
    the only one) -> class name, for the environments' own rewards; keep_state: a reward function declares
    `environments` (the pickled environments travel to the pool only then); prompt_column: data.prompt_column
    (a prompt with images travels as its messages with image parts); prompt_ids: as OneTurn's."""

    env_classes: dict[str | None, str] = field(default_factory=dict)
    keep_state: bool = False
    prompt_column: str = "prompt"
    prompt_ids: bool = False

    def _rows(self, prompts: list[Prompt]) -> list[dict]:
        """The rows the generators render: as the dataset has them, but a prompt with images as its messages with
        image parts holding them (Prompt.messages, TRL's prepare_multimodal_messages)."""
        return [p.row if p.messages is None else {**p.row, self.prompt_column: p.messages} for p in prompts]

    def generate(self, generators: Generators, prompts: list[Prompt], seeds: list[int],
                 sampling: Sampling, min_version: int) -> list[GroupOut]:
        return generators.rollout(self._rows(prompts), seeds, sampling, min_version=min_version)

    def submit(self, generators: Generators, prompts: list[Prompt], seeds: list[int],
               sampling: Sampling, min_version: int | None) -> list[Pending[list[GroupOut]]]:
        return generators.submit_rollout(self._rows(prompts), seeds, sampling, min_version=min_version, pin=True)

    def stream(self, generators: Generators, member: int, prompts: list[Prompt], seeds: list[int],
               sampling: Sampling, min_version: int) -> Stream[FinishedOuts]:
        return generators.stream_rollout(member, self._rows(prompts), seeds, sampling, min_version=min_version)

    def reward_batch(self, rollouts: Rollouts) -> RewardBatch:
        """With the environments' outputs the driver holds (get_reward()'s value, the environment's class) and, when
        a reward declares `environments`, their pickled states, which the workers resolve with the rest."""
        if not rollouts.agentic:
            raise ValueError("Agentic.reward_batch: the rollouts have no trajectories (a one-turn generator?)")
        return by_reference(rollouts, with_prompt_ids=self.prompt_ids, keep_state=self.keep_state,
                            env_rewards=[i.env_reward for i in rollouts.infos],
                            env_classes=[self.env_classes.get(i.env) for i in rollouts.infos])


def agent_metrics(rollouts: Rollouts) -> dict[str, float]:
    """A batch's conversations, per sample means: turns, tool calls and failures, seconds on the environment,
    tokens by role (model: sampled; tool: tool results and template scaffold), tool results cut to the budget;
    the share whose ids disagree with the chat template's rendering; stop-reason fractions; TRL's two tool metrics.
    {} for a one-turn batch. From the samples' SampleInfos: nothing per token."""
    ts = rollouts.infos
    if not rollouts.agentic:
        return {}
    n = len(ts)
    mean = lambda xs: sum(xs) / n  # noqa: E731
    m = {
        "multiturn/turns": mean([t.turns for t in ts]),
        "multiturn/tool_calls": mean([t.tool_calls for t in ts]),
        "multiturn/tool_failures": mean([t.tool_failures for t in ts]),
        "multiturn/truncated_tool_results": mean([t.truncated_tool_results for t in ts]),
        "multiturn/env_s": mean([t.env_s for t in ts]),
        "multiturn/env_s_max": max(t.env_s for t in ts),
        "multiturn/tokens/model": mean([t.model_tokens for t in ts]),
        "multiturn/tokens/tool": mean([t.length - t.model_tokens for t in ts]),
        "multiturn/env_reward_missing_frac": mean([t.env_reward is None for t in ts]),
        # ids trained on that disagree with the chat template's rendering at a special-token boundary
        "multiturn/template_mismatch_frac": mean([t.template_match is False for t in ts]),
    }
    stops = Counter(t.finish_reason for t in ts)
    m.update({f"multiturn/stop_reason/{r}": stops[r] / n for r in STOP_REASONS})
    # TRL's own names (GRPOTrainer logs them with tools), for scripts and dashboards written against TRL: calls per
    # sample, and failed calls per call
    calls, failures = sum(t.tool_calls for t in ts), sum(t.tool_failures for t in ts)
    m["tools/call_frequency"] = calls / n
    m["tools/failure_frequency"] = failures / calls if calls else 0.0
    requests = sum(t.requests for t in ts)
    if requests:  # an agent function's trajectories (actors/agents/endpoint.py)
        m.update({
            "agent/requests": requests / n,
            "agent/branches": mean([t.branches for t in ts]),
            "agent/branched_frac": mean([t.branches > 1 for t in ts]),
            "agent/untrained_turns": mean([t.untrained_turns for t in ts]),
            # what the endpoint added to a request beyond the engine: reading, rendering, parsing, answering
            "agent/endpoint_ms_per_request": 1000 * sum(t.endpoint_s for t in ts) / requests,
        })
    return m


def row_seeds(base: int, first: int, count: int, group_size: int) -> list[int]:
    """Seeds of `count` rows, the first being the `first`-th row the run has served: `group_size` apart (a
    generator seeds sample j of a row with its seed + j) and fixed by the row's place in the run, so a resumed
    run draws what the original would have."""
    return [base + (first + i) * group_size for i in range(count)]
