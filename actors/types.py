"""The records handed from one stage of the data path to the next, in the order data flows:

    Sampling            driver -> generators      how to sample a call's prompts: n, max_tokens, temperature, ...
    Sample / Rollouts   generators -> driver      completions, sampling logprobs, policy_version
    Trajectory          (in a Sample) a multi-turn conversation: messages, token roles, stop reason, env outputs
    EnvRequest ... EnvClosed   generators <-> environment pool (actors/envs): sessions, tool calls
    RewardBatch         driver -> reward pool -> reward workers (a chunk is a RewardBatch with an offset)
    Scores              reward workers -> pool -> driver   raw scores [K][N], counters, log_metric/log_extra
    TrainBatch          driver -> learner          token ids, sampling logprobs, advantages
    TrainResult         learner -> driver          the new global_step and the step's metrics
    TrainerState        learner -> reward pool -> reward workers   (TRL's trainer_state fields)
    PoolStats           a pool -> driver: RewardPoolStats (with every Scores), EnvPoolStats; either to `rayward scale`

They live in `actors/` because both sides import them and `actors/` never imports the driver
(`orchestrator/`). Plain dataclasses: Ray pickles them as they are, and the pure driver code builds and
slices them without Ray. Shapes: N completions in a batch, G completions per prompt (a group, contiguous),
K reward functions.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Literal

# The dataset column that picks a row's environment when environment_factory maps names to classes (TRL's name);
# TRL's reset(**row) does not receive it.
ENVIRONMENT_COLUMN = "environment"
# TRL's prompt for a row that has none (an environment's reset() supplies it, appended to this empty user message):
# the placeholder rows of a run whose environment owns its data, and rows with only an `environment` column.
EMPTY_PROMPT = ({"role": "user", "content": ""},)


@dataclass(frozen=True)
class Sampling:
    """How the generators sample one call's prompts: the training batches' (generation.*), or an eval's (eval.*
    over them). Both generator entry points take it alike, one-turn (`Generator.generate`, `generate_stream`) and
    agentic (`rollout`, `rollout_stream`); the seeds travel beside it, one per prompt or row."""

    n: int  # completions per prompt: a GRPO group's size G
    max_tokens: int  # per completion; agentic: the model-token budget of each whole trajectory
    temperature: float
    top_p: float = 1.0
    top_k: int = 0  # 0: no top-k cut


@dataclass
class Sample:
    """One completion as a generator returns it: one model turn, or (agentic) a whole conversation after its first
    prompt, tool results included (`trajectory`)."""

    completion_ids: list[int]
    logprobs: list[float]  # sampling logprob of each completion token, after temperature/top-k/top-p; NaN where
    # the model did not sample the token (tool results, template scaffold)
    text: str
    finish_reason: str  # "stop" or "length"; agentic: the trajectory's StopReason
    versions: list[int] | None = None  # per completion token: the policy version that sampled it (-1 where the
    # model did not sample it); None: all of it the version the call was made under
    trajectory: Trajectory | None = None  # agentic rollouts only
    routes: Any = None  # routing replay (grpo.router_replay R3): numpy int16 [prompt + completion tokens, layers,
    # top_k], the experts the engine's MoE layers chose at each position (-1: not recorded, e.g. the last token,
    # which the engine never computes); None: not recorded

    @property
    def policy_version(self) -> int | None:
        """The oldest policy version among the tokens the model sampled: the sample's version for the staleness
        rule (a trajectory that spans a weight load is as old as its oldest token). None: no versions recorded,
        or no model token."""
        return min((v for v in self.versions or () if v >= 0), default=None)


# Why a trajectory ended. stop: the model answered without a tool call; max_turns: it still called tools after
# generation.max_tool_calling_iterations; length: the model-token budget or the context ran out; timeout: the
# trajectory's deadline passed; env_error: the environment failed (reset raised, its worker died or hung).
StopReason = Literal["stop", "max_turns", "length", "timeout", "env_error"]


@dataclass
class Trajectory:
    """What a multi-turn, tool-using sample adds to a Sample. Token in, token out: `Sample.completion_ids` are
    exactly the ids the engine sampled, plus the tool results and template scaffold rendered between turns; the
    first prompt is `prompt_ids`. Per completion token, `turn_ids` says which model turn sampled it (0, 1, ...)
    or -1 (a tool result or scaffold token: in the sequence, out of the loss)."""

    prompt_ids: list[int]  # the first prompt as the engine saw it: chat template, tool schemas, reset's text
    prompt: list[dict[str, Any]]  # its messages (reset's text appended to the last user message, as TRL does)
    messages: list[dict[str, Any]]  # the completion as chat messages: assistant (content, tool_calls), tool, ...
    turn_ids: list[int]  # [len(completion_ids)]: model turn per token, -1 where the model did not sample it
    stop_reason: StopReason
    env: str | None = None  # the environment's name (dict environment_factory), None for the only one
    tool_calls: int = 0  # calls the model wrote (well-formed or not)
    tool_failures: int = 0  # calls that raised, timed out, named an unknown tool or were malformed
    tool_tokens: int = 0  # completion tokens that are tool results (the tool-result token budget counts these)
    truncated_tool_results: int = 0  # tool results cut to fit the tool-result token budget
    env_s: float = 0.0  # seconds waiting on the environment: reset, tools, close
    env_reward: float | None = None  # the environment's get_reward() at the end (None: it has none, or failed)
    env_state: bytes | None = None  # the environment pickled at the end, for reward functions that declare
    # `environments` (None unless one does)
    template_match: bool | None = None  # the ids trained on agree with the chat template's rendering of the
    # conversation at every special-token boundary (chat.template_check); None: not checked
    images: tuple[Any, ...] = ()  # vision-language models: every image its ids hold (RGB PIL), in placeholder
    # order: the first prompt's, then each tool result's (TRL's multimodal tool responses)
    # An agent function's trajectory (agent_function: the OpenAI-compatible endpoint): the chat requests it made,
    # the branches they formed (a request that does not extend the trajectory's previous request and response
    # starts one; the sample is the last branch's, actors/agents/endpoint.py), the model turns of earlier
    # branches (sampled, not trained), and the seconds the endpoint added to the requests beyond the engine's.
    requests: int = 0
    branches: int = 0
    untrained_turns: int = 0
    endpoint_s: float = 0.0

    @property
    def mask(self) -> list[int]:
        """1 where the model sampled the token (in the loss), 0 elsewhere: TrainBatch.completion_mask."""
        return [int(t >= 0) for t in self.turn_ids]

    @property
    def turns(self) -> int:
        return max(self.turn_ids, default=-1) + 1


@dataclass
class EnvRequest:
    """Open one environment session (generator -> environment pool): an environment instance (a free one of the
    worker's, or a new one from environment_factory), reset."""

    env: str | None  # which environment_factory entry (the row's `environment` column); None: the only one
    row: dict[str, Any]  # the dataset row: reset's keyword arguments, as TRL passes them
    seed: int  # the GRPO group's seed: the G sessions of a group start from the same state


@dataclass
class EnvOpened:
    session: int  # the pool's id for the session, until it is closed
    observation: str | None  # what reset returned: appended to the last user message
    seconds: float = 0.0
    error: str | None = None  # reset raised (the trajectory ends env_error): "ValueError: ..."
    created: bool = False  # environment_factory() was called for it (False: it took a free instance an earlier
    # session had used; or the run has tools only; or it failed before either)


@dataclass
class ToolCall:
    """One call the model wrote, parsed from its turn."""

    name: str
    arguments: dict[str, Any]


@dataclass
class ToolResult:
    # The tool message the model reads next: the result, or what went wrong. A tool that returns TRL's multimodal
    # content blocks ([{"type": "image", "image": ...}, {"type": "text", "text": ...}]) keeps them as a list, its
    # images RGB PIL (actors/envs/worker.py tool_content).
    content: str | list[dict[str, Any]]
    status: Literal["ok", "error", "timeout", "unknown_tool"]  # error: the tool raised
    seconds: float = 0.0


@dataclass
class EnvClosed:
    reward: float | None  # get_reward(), if the environment has one (None: it has none, or it raised)
    state: bytes | None  # the environment pickled, when asked for (reward functions declaring `environments`)
    seconds: float = 0.0
    error: str | None = None


@dataclass
class AgentRun:
    """Run the user's agent function for one trajectory (generator -> environment pool): an OpenAI client pointed
    at the trajectory's own endpoint, and the dataset row."""

    row: dict[str, Any]  # the dataset row, as the dataset has it
    seed: int  # the GRPO group's seed (the agent function receives it when it declares `seed`)
    base_url: str  # the trajectory's endpoint: http://<generator's node>:<port>/<trajectory>/v1
    api_key: str  # the trajectory's key (requests without it are refused)
    model: str  # the served model's name (/v1/models)
    timeout_s: float  # the run's time bound (agent.trajectory_timeout_s); the endpoint refuses the trajectory's
    # requests from its own deadline on (counted from the rollout's start), which may come first


@dataclass
class AgentDone:
    """What an agent function's run returned."""

    reward: float | None  # its return value: a number; NaN where it returned None (reward functions score the
    # conversation); None where it raised, timed out or its worker was lost (`error` says which)
    seconds: float = 0.0
    error: str | None = None
    function: str | None = None  # the agent function (`module:function`) that ran, for messages; None: none ran


@dataclass
class FinishedGroups:
    """What a generator streams while one engine batch decodes: the groups that finished at the last step."""

    groups: list[tuple[int, list[Sample]]]  # (prompt index within the call, its G samples)
    seconds: float  # generator-busy seconds since the call started


@dataclass(frozen=True)
class SampleInfo:
    """What the driver knows of one sample: enough for lengths, staleness, metrics and the reward batch's
    environment outputs, nothing per token."""

    length: int  # completion tokens (an agentic completion: its tool results and scaffold too)
    model_tokens: int  # the tokens the model sampled (a one-turn completion: all of them)
    finish_reason: str  # "stop" or "length"; agentic: the trajectory's stop reason
    version: int | None = None  # the oldest policy version among its model tokens (None: not recorded)
    # An agentic sample's trajectory, its scalars (actors/types.py Trajectory); None for a one-turn sample.
    turns: int | None = None
    tool_calls: int = 0
    tool_failures: int = 0
    tool_tokens: int = 0
    truncated_tool_results: int = 0
    env_s: float = 0.0
    env: str | None = None
    env_reward: float | None = None
    template_match: bool | None = None
    requests: int = 0
    branches: int = 0
    untrained_turns: int = 0
    endpoint_s: float = 0.0
    tool_errors: tuple[str, ...] = ()  # the failed calls' results (the terminal's "tool calls mostly fail" line)

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"

    @property
    def agentic(self) -> bool:
        return self.turns is not None


@dataclass
class GroupPayload:
    """One group's token data, in the object store. prompt_ids and images: the prompt as the engine took it (a
    one-turn group's; an agentic sample's own are in its trajectory)."""

    samples: list[Sample]
    prompt_ids: Any = None  # numpy int32 [prompt tokens], or None (agentic: per sample, Trajectory.prompt_ids)
    images: tuple[Any, ...] = ()

    def sample_prompt_ids(self, j: int) -> Any:
        t = self.samples[j].trajectory
        return self.prompt_ids if t is None else t.prompt_ids

    def sample_images(self, j: int) -> tuple[Any, ...]:
        t = self.samples[j].trajectory
        return self.images if t is None else t.images


@dataclass
class GroupOut:
    """What a generator answers per finished group: its index among the call's prompts (or rows), its samples'
    SampleInfo, and its payload (an ObjectRef of a GroupPayload; the GroupPayload itself where no object store is
    at hand: a generator used in-process, the tests' fakes)."""

    index: int
    infos: list[SampleInfo]
    payload: Any


@dataclass(frozen=True)
class EngineCounters:
    """A generator's engine since it started: what the driver's per-step engine metrics are the differences of."""

    steps: int  # engine steps taken
    running: int  # sequences in the engine summed over those steps (a request of n samples: n; each running
    # one decodes a token a step: about the tokens sampled)
    busy_s: float  # seconds spent in engine steps


@dataclass
class FinishedOuts:
    """A generator's stream item: the groups that finished at its last engine step, its busy seconds, and its
    engine's counters then (None: a generator that keeps none, as the tests' fakes)."""

    groups: list[GroupOut]
    seconds: float
    engine: EngineCounters | None = None


@dataclass
class Rollouts:
    """One generation batch as the driver holds it, flat in completion order (G contiguous completions per
    prompt): per sample its prompt, dataset columns and SampleInfo; per group the payload reference its token data
    is behind (actors/payloads.py). Nothing per token."""

    prompts: list[Any]  # the dataset's prompt per completion (text or messages), repeated G times
    infos: list[SampleInfo]
    payloads: list[Any]  # per group: its GroupPayload's ObjectRef (the GroupPayload itself in-process)
    columns: dict[str, list[Any]]  # every dataset column except the prompt, per completion
    policy_version: int  # learner step whose weights generated the batch (of its oldest model token)
    group_size: int
    # per completion: its prompt's draw index in the run's prompt stream (-1: not a training prompt); with the
    # completion's place in its group, the sample's id. None: not tracked (records built by hand)
    prompt_index: list[int] | None = None

    def __len__(self) -> int:
        return len(self.infos)

    @property
    def num_groups(self) -> int:
        return len(self) // self.group_size

    @property
    def truncated(self) -> list[bool]:
        return [i.truncated for i in self.infos]

    @property
    def agentic(self) -> bool:
        return bool(self.infos) and self.infos[0].agentic

    def lengths(self) -> list[int]:
        """Per completion, the tokens the model sampled (an agentic completion's tool results are not its)."""
        return [i.model_tokens for i in self.infos]

    def take_groups(self, groups: list[int]) -> Rollouts:
        """The given groups (by index), in that order."""
        idx = group_rows(groups, self.group_size)
        return Rollouts(
            prompts=[self.prompts[i] for i in idx], infos=[self.infos[i] for i in idx],
            payloads=[self.payloads[g] for g in groups],
            columns={c: [v[i] for i in idx] for c, v in self.columns.items()},
            policy_version=self.policy_version, group_size=self.group_size,
            prompt_index=None if self.prompt_index is None else [self.prompt_index[i] for i in idx],
        )

    def concat(self, other: Rollouts) -> Rollouts:
        """This batch followed by `other`; the policy version is the older of the two (the staleness rule)."""
        return Rollouts(
            prompts=self.prompts + other.prompts, infos=self.infos + other.infos,
            payloads=self.payloads + other.payloads,
            columns={c: self.columns[c] + other.columns[c] for c in self.columns},
            policy_version=min(self.policy_version, other.policy_version), group_size=self.group_size,
            prompt_index=None if self.prompt_index is None or other.prompt_index is None
            else self.prompt_index + other.prompt_index,
        )


def group_rows(groups: list[int], group_size: int) -> list[int]:
    """Row indices of the given groups: group g holds rows [g*G, (g+1)*G)."""
    return [g * group_size + j for g in groups for j in range(group_size)]


@dataclass
class RewardBatch:
    """Completions to score: the whole batch (driver -> pool) or one chunk of whole groups (pool -> worker).

    From the driver it comes by reference: `payloads` (one per group) and, per completion, the prompt, the dataset
    columns and the environments' outputs the driver holds (`env_rewards`, `env_classes`: from the samples'
    SampleInfos); whoever reads tokens resolves it (actors/payloads.py resolve_rewards: the workers, a judge or
    teacher stage), which fills `completions` and `completion_ids` (and `environments` when `keep_state`, the
    prompts' ids when `with_prompt_ids`) and drops the references. Built by hand (tests), it comes resolved.

    `env_rewards` and `env_classes` feed the environments' get_reward() rewards (a reward named after the class
    scores its own samples, NaN elsewhere), `environments` reaches the reward functions that declare an
    `environments` parameter (unpickled by the worker; None where the state was lost)."""

    prompts: list[Any]
    completions: list[Any]  # resolved: text, chat messages (conversational prompts), or a conversation (agentic)
    completion_ids: list[list[int]]
    columns: dict[str, list[Any]]  # dataset columns, per completion: the reward functions' keyword arguments
    group_size: int
    offset: int = 0  # index of the first completion in the whole batch (names samples in error messages)
    env_rewards: list[float | None] | None = None  # per completion: Trajectory.env_reward (NaN: get_reward() returned
    # None; None: there is none, it failed or the session was lost); None: a run without environments
    env_classes: list[str | None] | None = None  # per completion: the class name of its environment (the reward
    # named after it scores it); None where it ran without one (tools only)
    environments: list[bytes | None] | None = None  # per completion: Trajectory.env_state (the environment pickled
    # at close; None where it was lost or could not be pickled); None unless a reward declares `environments`
    prompt_ids: list[list[int]] | None = None  # per completion: the ids the engine saw, for the distillation
    # teacher (which reads prompt + completion ids); None: not carried (a run without a teacher)
    payloads: list[Any] | None = None  # per group, by reference (None: resolved)
    keep_state: bool = False  # resolving keeps the environments' pickled states (a reward declares `environments`)
    with_prompt_ids: bool = False  # resolving keeps the prompts' ids (a distillation teacher reads them)

    def __len__(self) -> int:
        return len(self.prompts)

    def chunks(self, size: int) -> list[RewardBatch]:
        """Consecutive slices of `size` completions (a multiple of group_size keeps groups whole)."""

        def cut(xs: list[Any] | None, lo: int) -> list[Any] | None:
            return None if xs is None else xs[lo : lo + size]

        g = self.group_size
        return [
            replace(self, prompts=self.prompts[lo : lo + size], completions=self.completions[lo : lo + size],
                    completion_ids=self.completion_ids[lo : lo + size],
                    columns={c: v[lo : lo + size] for c, v in self.columns.items()}, offset=self.offset + lo,
                    env_rewards=cut(self.env_rewards, lo), env_classes=cut(self.env_classes, lo),
                    environments=cut(self.environments, lo), prompt_ids=cut(self.prompt_ids, lo),
                    payloads=None if self.payloads is None else self.payloads[lo // g : (lo + size) // g])
            for lo in range(0, len(self), size)
        ]


@dataclass
class Scores:
    """Raw reward scores of N completions under K reward functions, with what scoring them logged.
    NaN = the function had no opinion (returned None). A worker returns one per chunk; the pool concatenates
    them in batch order."""

    names: list[str]  # the K reward names, in config order
    scores: list[list[float]]  # [K][N]
    timeouts: dict[str, int]  # per reward: calls past their timeout (scored `fallback`)
    errors: dict[str, int]  # per reward: calls that raised or returned garbage under on_error=fallback
    latency_s: dict[str, float]  # per reward: the longest chunk's wall time
    metrics: dict[str, list[float]]  # log_metric(name, value) calls, in arrival order
    extra: dict[str, list[Any]]  # log_extra(column, values): one value per completion (None where not logged)
    global_step: int  # the learner step the rewards saw (trainer_state.global_step)
    workers: list[int]  # reward workers that scored some of it
    busy_s: float = 0.0  # the pool's wall time on it
    queue_wait_s: float = 0.0  # mean seconds its chunks waited for a worker (in the pool or behind another chunk)
    pool: RewardPoolStats | None = None  # the pool's state after it (workers, retries, ...)
    # Lazily gated rewards (gate.lazy), per completion: not called, its gate closed (its score NaN here, `fill`
    # once gated). Rewards that are not lazily gated have no entry.
    skipped: dict[str, list[bool]] = field(default_factory=dict)
    judge_pools: dict[str, JudgePoolStats] = field(default_factory=dict)  # per judge reward: its pool after it
    # On-policy distillation, per group: the teacher's log-prob of each completion token of its samples, by
    # reference (the pool puts a list of G float32 arrays, None where the teacher gave none: a timeout or error,
    # counted in teacher_failures); None: a run without a teacher
    teacher: list[Any] | None = None
    teacher_failures: int = 0  # samples without the teacher's log-probs (out of the distillation term)
    # Per completion: its group's payload was lost before scoring (the generator or node that held it is gone; its
    # scores NaN); the driver replaces such groups. Empty: none lost.
    lost: list[bool] = field(default_factory=list)
    teacher_pool: TeacherPoolStats | None = None  # the teacher's pool after it

    def __len__(self) -> int:
        return len(self.scores[0]) if self.scores else 0

    def take_groups(self, groups: list[int], group_size: int) -> Scores:
        idx = group_rows(groups, group_size)
        return replace(
            self,
            scores=[[col[i] for i in idx] for col in self.scores],
            extra={c: [v[i] for i in idx] for c, v in self.extra.items()},
            skipped={r: [v[i] for i in idx] for r, v in self.skipped.items()},
            teacher=None if self.teacher is None else [self.teacher[g] for g in groups],
            lost=[self.lost[i] for i in idx] if self.lost else [],
        )

    def concat(self, other: Scores) -> Scores:
        """This batch's scores followed by `other`'s: counters add, latencies take the max, queue waits average
        (per sample), `pool` is the later one's; global_step stays this one's (the earlier part was scored first)."""
        n, m = len(self), len(other)
        return Scores(
            names=self.names,
            scores=[a + b for a, b in zip(self.scores, other.scores, strict=True)],
            timeouts={k: self.timeouts[k] + other.timeouts[k] for k in self.names},
            errors={k: self.errors[k] + other.errors[k] for k in self.names},
            latency_s={k: max(self.latency_s[k], other.latency_s[k]) for k in self.names},
            metrics={k: self.metrics.get(k, []) + other.metrics.get(k, []) for k in {*self.metrics, *other.metrics}},
            extra={
                c: self.extra.get(c, [None] * n) + other.extra.get(c, [None] * m) for c in {*self.extra, *other.extra}
            },
            global_step=self.global_step,
            workers=sorted({*self.workers, *other.workers}),
            busy_s=self.busy_s + other.busy_s,
            queue_wait_s=(self.queue_wait_s * n + other.queue_wait_s * m) / (n + m) if n + m else 0.0,
            pool=other.pool or self.pool,
            skipped={r: self.skipped.get(r, [False] * n) + other.skipped.get(r, [False] * m)
                     for r in {*self.skipped, *other.skipped}},
            judge_pools={**self.judge_pools, **other.judge_pools},
            teacher=None if self.teacher is None or other.teacher is None else self.teacher + other.teacher,
            lost=(self.lost or [False] * n) + (other.lost or [False] * m) if self.lost or other.lost else [],
            teacher_failures=self.teacher_failures + other.teacher_failures,
            teacher_pool=other.teacher_pool or self.teacher_pool,
        )

    def lost_groups(self, group_size: int) -> list[int]:
        """The groups whose payload was lost (`lost`), by index."""
        return [g for g in range(len(self) // group_size) if self.lost and self.lost[g * group_size]]

    def metric_means(self) -> dict[str, float]:
        """Each log_metric name's mean over the batch (TRL logs the mean of a step's values)."""
        return {k: sum(v) / len(v) for k, v in self.metrics.items() if v}


@dataclass
class TrainBatch:
    """One generation batch as the learner trains on it (N completions). A completion may be a whole multi-turn
    exchange: the model's turns and, between them, tool results and chat-template tokens it did not sample.

    From the driver it comes by reference: `payloads` (and `teacher`) one per group, beside the advantages and
    truncation flags the driver holds; the learner resolves it (actors/payloads.py resolve_training), fetching each
    group's token data from the object store, which fills the token fields below. Built by hand (tests), it comes
    resolved."""

    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    sampling_logprobs: list[list[float]]  # per completion token; NaN where the model did not sample it
    advantages: list[float]  # [N]
    truncated: list[bool]  # [N]: hit max_completion_length
    # Per completion token: 1 = the model sampled it (in the loss), 0 = a tool result or template token (in the
    # sequence, so later tokens see it, but out of the loss, the entropy, the vLLM IS correction and the loss-token
    # counts). None: every completion token is the model's.
    completion_mask: list[list[int]] | None = None
    # Routing replay (grpo.router_replay R3), per completion: numpy int16 [prompt + completion tokens, layers,
    # top_k], the experts the engine chose at each position (-1: none recorded). None: not recorded.
    routes: list[Any] | None = None
    # Vision-language models, per completion: the images its ids hold (Rollouts.images), which the learner's
    # processor turns into the forward's pixel inputs. None: text only.
    images: list[tuple[Any, ...]] | None = None
    # On-policy distillation, per completion: the teacher's log-prob of each completion token (Scores'; [] where
    # the teacher gave none: the sample is out of the distillation term). None: no teacher.
    teacher_logprobs: list[list[float]] | None = None
    # Rows whose tokens come back in TrainResult.token_records with the learner's first-pass log-probs (the token
    # record that `rayward view` shows).
    record: tuple[int, ...] = ()
    payloads: list[Any] | None = None  # per group, by reference (None: resolved)
    teacher: list[Any] | None = None  # per group, by reference: Scores.teacher (None: resolved, or no teacher)
    group_size: int = 1
    # Per completion token, the policy version that sampled it (-1: not the model's; actors/types.py Sample); None:
    # not recorded. Only the token record reads it.
    versions: list[Any] | None = None

    def __post_init__(self) -> None:
        if self.teacher_logprobs is not None:
            for i, (t, c) in enumerate(zip(self.teacher_logprobs, self.completion_ids, strict=True)):
                if t and len(t) != len(c):
                    raise ValueError(f"TrainBatch.teacher_logprobs[{i}]: {len(t)} log-probs for {len(c)} completion "
                                     "tokens")
        if self.routes is not None:
            for i, (r, p, c) in enumerate(zip(self.routes, self.prompt_ids, self.completion_ids, strict=True)):
                if r is not None and len(r) != len(p) + len(c):
                    raise ValueError(f"TrainBatch.routes[{i}]: {len(r)} positions for {len(p)} prompt + {len(c)} "
                                     "completion tokens")
        if self.completion_mask is None:
            return
        if len(self.completion_mask) != len(self.completion_ids):
            raise ValueError(f"TrainBatch.completion_mask: {len(self.completion_mask)} rows for "
                             f"{len(self.completion_ids)} completions")
        for i, (m, c) in enumerate(zip(self.completion_mask, self.completion_ids, strict=True)):
            if len(m) != len(c) or not set(m) <= {0, 1}:
                raise ValueError(
                    f"TrainBatch.completion_mask[{i}]: needs one 0 or 1 per completion token ({len(c)}), got {m}"
                )

    def __len__(self) -> int:
        return len(self.advantages)


@dataclass
class TrainerState:
    """What the reward functions see as `trainer_state` (TRL passes a transformers.TrainerState with these
    fields). The learner pushes it after every optimizer step."""

    global_step: int = 0
    max_steps: int = 0
    epoch: float = 0.0

    def to_transformers(self) -> Any:
        """A real transformers.TrainerState, as TRL passes it, so `trainer_state.global_step` code runs unchanged."""
        from transformers import TrainerState as HFTrainerState

        return HFTrainerState(global_step=self.global_step, max_steps=self.max_steps, epoch=self.epoch)


@dataclass
class TrainResult:
    """What one `Learner.train_step` returns: the optimizer step it reached and the step's metrics (TRL's names:
    loss, grad_norm, learning_rate, kl, entropy, clip_ratio/..., sampling/...), global over learner ranks."""

    global_step: int  # optimizer steps done after this batch (num_iterations per batch)
    metrics: dict[str, float]
    num_tokens: float  # loss tokens in the batch (TRL's num_tokens)
    compute_s: float  # the learner's wall time on the batch (time/train_compute)
    # TrainBatch.record's rows, token by token: ids, the sampler's log-probs, the learner's at the step's first pass
    # (the distribution the engines sample from: temperature and placeholder bias applied), the loss mask and the
    # policy versions (actors/payloads.py token_record)
    token_records: dict[int, dict[str, Any]] = field(default_factory=dict)
    # Groups whose payload was lost before the step (their generator or node gone): nothing was trained; the
    # driver replaces them and sends the step again
    lost: list[int] = field(default_factory=list)


@dataclass
class PoolStats:
    """A worker pool's state (`stats()` of every pool: reward, environment, a judge's or the teacher's engines;
    what `rayward scale` returns): the fields every pool keeps. Each pool's record adds its own and names the ones
    copied into every step's metrics (STEP_METRICS, as <PREFIX>/<name>)."""

    workers: int  # live workers taking work
    target_workers: int  # alive or starting, not retiring: the size the pool is heading to
    starting: int  # waiting for a node or importing
    retiring: int
    calls_inflight: int  # worker calls in flight (a call may carry several units of work)
    queue_depth: int  # units of work waiting for a worker (chunks; session opens)
    worker_s: float  # live worker-seconds so far
    utilization: float  # busy fraction over the autoscaler's window (NaN before one, or with autoscaling off)
    decisions: int  # scaling decisions so far
    autoscale: str  # "off", "min..max", or "pinned (bounds min..max)"
    retries: int = 0  # work sent again after its worker died or hung
    replaced: int = 0
    timeouts: int = 0  # the reward pool: reward calls cut at their timeout; the environment pool: hung worker calls
    start_failures: int = 0
    scale_ups: int = 0
    scale_downs: int = 0

    STEP_METRICS: ClassVar[tuple[str, ...]]
    PREFIX: ClassVar[str]

    def step_metrics(self) -> dict[str, float]:
        """<PREFIX>/<name> for each of STEP_METRICS (counts stay ints, as the metrics log always had them)."""
        return {f"{self.PREFIX}/{k}": getattr(self, k) for k in self.STEP_METRICS}


@dataclass
class RewardPoolStats(PoolStats):
    """The reward pool's state (`RewardPool.stats`), with every Scores: PoolStats' fields (queue_depth: chunks
    waiting for a worker) and the scoring's."""

    global_step: int = 0  # the trainer_state the pool holds
    chunks: int = 0  # chunks scored
    errors: int = 0  # reward calls that raised or returned garbage under on_error=fallback

    # Copied into every step's metrics as reward_pool/<name>.
    STEP_METRICS = (
        "workers", "target_workers", "starting", "retries", "replaced", "queue_depth", "decisions", "worker_s",
        "utilization",
    )
    PREFIX = "reward_pool"


@dataclass
class JudgePoolStats(PoolStats):
    """A judge pool's state (`JudgePool.stats`): PoolStats' fields, its workers being judge engines (queue_depth:
    requests waiting for an engine; retries: engine calls whose requests were re-sent after the engine died or
    hung; timeouts: requests past the judge's timeout_s), and the requests'."""

    requests: int = 0  # samples judged (answered, whatever the answer)
    errors: int = 0  # answers that could not be parsed, or a prompt the judge could not take
    requests_inflight: int = 0

    # Copied into every step's metrics as judge_pool/<name> (one pool per judge model).
    STEP_METRICS = (
        "workers", "target_workers", "starting", "retries", "replaced", "queue_depth", "decisions", "worker_s",
        "utilization", "timeouts", "errors",
    )
    PREFIX = "judge_pool"


@dataclass
class TeacherPoolStats(JudgePoolStats):
    """The distillation teacher's pool (`TeacherPool.stats`): a judge pool's fields, its requests being samples
    scored (errors: a sequence the teacher could not take, or an engine failure)."""

    PREFIX = "teacher_pool"


@dataclass
class EnvPoolStats(PoolStats):
    """The environment pool's state (`EnvPool.stats`): PoolStats' fields (queue_depth: session opens waiting for
    room; retries: opens re-sent after their worker died) and the sessions'."""

    sessions: int = 0  # open now
    sessions_opened: int = 0
    sessions_closed: int = 0
    sessions_lost: int = 0  # their worker died, hung or was retired past its drain deadline
    tool_calls: int = 0
    tool_errors: int = 0  # raised, or bad arguments
    tool_timeouts: int = 0
    unknown_tools: int = 0
    reset_errors: int = 0  # the factory or reset() raised or timed out
    reward_errors: int = 0  # get_reward() raised, timed out or returned a non-number; or pickling failed
    instances_created: int = 0  # environment_factory() calls: opens that found no free instance on their worker
    instances_reused: int = 0  # sessions opened on a free instance an earlier session had used (reset again)
    agent_runs: int = 0  # agent function runs (agent_function), one per trajectory
    agent_errors: int = 0  # runs that raised, returned a non-number, or whose worker was lost
    agent_timeouts: int = 0  # runs cut at their trajectory's deadline

    # Copied into every step's metrics as env_pool/<name>.
    STEP_METRICS = (
        "workers", "target_workers", "starting", "sessions", "sessions_lost", "replaced", "queue_depth",
        "decisions", "worker_s", "utilization", "instances_created", "instances_reused", "agent_errors",
        "agent_timeouts",
    )
    PREFIX = "env_pool"

