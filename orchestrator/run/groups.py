"""The actor groups a run holds, as the driver calls them: one Protocol per group, naming exactly the methods the
loop, the phases, the evaluator, checkpoints and the supervisor use.

    Generators    actors/runtime/group.py GeneratorGroup      sample (one-turn or agentic, waited for, submitted or
                                                      streamed), restarts, health, the engines' compute for the log
    LearnerView   actors/runtime/group.py LearnerGroup        train steps, checkpoints, the merged model, losses, health
    RewardScorer  actors/runtime/group.py RewardPoolGroup     scoring, the trainer_state the rewards see, its size
    EnvPoolView   actors/runtime/group.py EnvPoolGroup        the environment pool's stats
    Control       actors/runtime/group.py ControlGroup        requests left for the loop (`rayward scale --generators`)

`Run` (orchestrator/run/state.py) is typed with them. The real groups and the fakes the loop tests run on
(tests/fixtures/fakes.py) both are them; tests/unit/orchestrator/run/test_groups.py holds each fake's public
methods to its Protocol and to the real group's signatures, so a fake cannot drift from the group it stands for.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from actors.runtime.group import Loss, Member, Pending, Stream
from actors.types import (
    EnvPoolStats,
    FinishedOuts,
    GroupOut,
    RewardBatch,
    Sampling,
    Scores,
    TrainBatch,
    TrainerState,
    TrainResult,
)


class Generators(Protocol):
    """The run's vLLM generators (GeneratorGroup)."""

    restarts: int  # deaths the group has come back from: a stream submitted before the last one was cut by it
    active: int  # members that take new work; those after them are retiring (`rayward scale --generators`)

    def __len__(self) -> int: ...

    def shards(self, num_items: int, parts: int | None = None) -> list[tuple[int, slice]]: ...

    def submit_generate(self, prompt_ids: list[list[int]], seeds: list[int], sampling: Sampling, *,
                        min_version: int | None, pin: bool = False, images: list[tuple[Any, ...]] | None = None,
                        ) -> list[Pending[list[GroupOut]]]: ...

    def generate(self, prompt_ids: list[list[int]], seeds: list[int], sampling: Sampling, *,
                 min_version: int | None, pin: bool = False, images: list[tuple[Any, ...]] | None = None,
                 ) -> list[GroupOut]: ...

    def stream_generate(self, member: int, prompt_ids: list[list[int]], seeds: list[int], sampling: Sampling,
                        *, min_version: int | None, images: list[tuple[Any, ...]] | None = None,
                        ) -> Stream[FinishedOuts]: ...

    def submit_rollout(self, rows: list[dict[str, Any]], seeds: list[int], sampling: Sampling, *,
                       min_version: int | None, pin: bool = False) -> list[Pending[list[GroupOut]]]: ...

    def rollout(self, rows: list[dict[str, Any]], seeds: list[int], sampling: Sampling, *,
                min_version: int | None, pin: bool = False) -> list[GroupOut]: ...

    def stream_rollout(self, member: int, rows: list[dict[str, Any]], seeds: list[int], sampling: Sampling,
                       *, min_version: int | None) -> Stream[FinishedOuts]: ...

    def next_ready(self, streams: list[Stream[Any]], until: Pending[Any] | None = None) -> Stream[Any] | None: ...

    def recover(self, timeout_s: float, on_wait: Callable[[str], None] | None = None) -> None: ...

    def restarted(self) -> bool: ...

    def lost_with_node(self) -> list[int]: ...

    def remove(self, members: list[int]) -> list[str]: ...

    def substitute(self) -> int: ...

    def members(self) -> list[Member]: ...

    def cpu_threads(self) -> list[str]: ...

    def kill(self) -> None: ...

    def room(self, num: int) -> str | None: ...

    def grow(self, num: int, timeout_s: float, on_wait: Callable[[str], None] | None = None) -> list[str]: ...

    def start_pending(self, num: int) -> list[str]: ...

    def pending(self) -> list[str]: ...

    def pending_ready(self, timeout_s: float) -> bool: ...

    def poll_pending(self, timeout_s: float) -> tuple[list[str], list[str]]: ...

    def cancel_pending(self) -> list[str]: ...

    def retire(self, num: int) -> list[str]: ...

    def retiring(self) -> list[int]: ...

    def drop_retired(self) -> list[str]: ...


class Control(Protocol):
    """The run's control mailbox (ControlGroup): requests a client left for the driver's loop."""

    def take_generators(self) -> int | None: ...

    def report(self, generators: int, retiring: int) -> None: ...

    def kill(self) -> None: ...


class LearnerView(Protocol):
    """The learner, one member whatever its number of ranks (LearnerGroup)."""

    def submit_train_step(self, batch: TrainBatch, reward_state: TrainerState | None = None
                          ) -> Pending[TrainResult]: ...

    def train_step(self, batch: TrainBatch, reward_state: TrainerState | None = None) -> TrainResult: ...

    def submit_save_checkpoint(self, path: str, extra: dict[str, Any]) -> Pending[str]: ...

    def save_checkpoint(self, path: str, extra: dict[str, Any]) -> str: ...

    def load_checkpoint(self, path: str) -> dict[str, Any]: ...

    def save_merged(self, path: str) -> str: ...

    def cpu_threads(self) -> str: ...

    def lost(self, err: BaseException | None, timeout_s: float) -> Loss | None: ...

    def members(self) -> list[Member]: ...

    def kill(self) -> None: ...


class RewardScorer(Protocol):
    """A reward pool: the run's, or the eval's own (RewardPoolGroup)."""

    def submit_score(self, batch: RewardBatch, chunk_groups: int, state: TrainerState | None = None
                     ) -> Pending[Scores]: ...

    def score(self, batch: RewardBatch, chunk_groups: int, state: TrainerState | None = None) -> Scores: ...

    def set_state(self, state: TrainerState) -> None: ...

    def scaling(self) -> dict[str, Any]: ...

    def restore_scaling(self, state: dict[str, Any]) -> None: ...

    def kill(self) -> None: ...


class EnvPoolView(Protocol):
    """The environment pool, as the driver sees it (EnvPoolGroup): the generators reach the pool itself."""

    def stats(self) -> EnvPoolStats: ...

    def kill(self) -> None: ...
