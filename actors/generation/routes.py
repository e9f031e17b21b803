"""Routing replay's generator side (grpo.router_replay R3), a part chosen once when the generator starts:
which experts the engine's MoE layers chose for each sample's tokens, or none.

    NoRoutes       the samples carry no routes (routing replay off)
    RouteCapture   the engine's workers record every MoE layer's choice per request and position
                   (vllm_compat.py RoutingCapture, started through the weight-sync extension); each finished
                   request's samples, and each agent turn, take theirs

The interface of both: `engine_kwargs` (what the engine is built with), `attach(engine)` once it is built,
`routes(out, prompt_ids, samples)` (one finished request's samples, their routes set) and `turn_routes` (an
agent turn's finished request -> its routes, for actors/agents/loop.py TurnSettings; None: none recorded).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from actors.generation.engine import OpenedEngine
from actors.generation.vllm_compat import decode_routes
from actors.types import Sample


class NoRoutes:
    """Routing replay off: nothing recorded, the samples as they are."""

    engine_kwargs: Mapping[str, Any] = {}
    turn_routes: Callable[[Any], Any] | None = None

    def attach(self, engine: OpenedEngine) -> None:
        """Nothing to start in the engine."""

    def routes(self, out: Any, prompt_ids: list[int], samples: list[Sample]) -> list[Sample]:
        return samples


class RouteCapture:
    """Routing replay (R3): each sample carries the experts the engine chose for its prompt and completion."""

    # Positions served from the prefix cache are not computed, so their routing is not recorded: every
    # prompt is computed whole (docs/moe.md).
    engine_kwargs: Mapping[str, Any] = {"enable_prefix_caching": False}

    def __init__(self, *, eager: bool) -> None:
        """eager: whether the engine runs in eager mode (its enforce_eager, or the run's extra arguments')."""
        if not eager:
            raise ValueError("grpo.router_replay R3 records routing in eager mode only (a CUDA graph replays "
                             "its kernels without the recording hook): drop enforce_eager=False")
        self._engine: OpenedEngine | None = None

    def attach(self, engine: OpenedEngine) -> None:
        """Start the recording in every engine worker."""
        self._engine = engine
        engine.loop.exclusive(lambda: engine.llm.collective_rpc("rayward_capture_routing"))

    def _take(self, keys: list[tuple[str, bool, int]]) -> list[Any]:
        """These completions' recorded routes, encoded (TP ranks route alike: rank 0's); forgotten there."""
        engine = self._engine
        assert engine is not None, "RouteCapture.attach first"
        return engine.loop.exclusive(
            lambda: engine.llm.collective_rpc("rayward_take_routes", args=(keys,)))[0]

    def routes(self, out: Any, prompt_ids: list[int], samples: list[Sample]) -> list[Sample]:
        """The samples of one finished request with the routes the engine's workers recorded for each, cut
        or padded (-1) to prompt + completion tokens."""
        import numpy as np

        keys = [(out.request_id, len(out.outputs) > 1, comp.index) for comp in out.outputs]
        for s, r in zip(samples, map(decode_routes, self._take(keys)), strict=True):
            length = len(prompt_ids) + len(s.completion_ids)
            if r is None:
                continue
            full = np.full((length, *r.shape[1:]), -1, dtype=np.int16)
            full[: min(length, len(r))] = r[:length]
            s.routes = full
        return samples

    def turn_routes(self, request: Any) -> Any:
        """One finished agent turn's routes (its request asked for one sample)."""
        return decode_routes(self._take([(request.request_id, False, 0)])[0])


def route_part(record: bool, *, eager: bool) -> NoRoutes | RouteCapture:
    """The generator's routes part: RouteCapture when the run replays routing (record), else NoRoutes."""
    return RouteCapture(eager=eager) if record else NoRoutes()


__all__ = ["NoRoutes", "RouteCapture", "route_part"]
