"""Routing replay for mixture-of-experts policies: the learner's MoE layers send chosen tokens to given experts.

A router's top-k is a discontinuous function of its logits: two kernels that add in another order (vLLM's and
torch's) flip the choice of near-tied experts, and one flipped expert changes the token's hidden state, every
later position's, and so the log-prob the importance ratio divides by. Replay removes that source of mismatch:

- R3 (rollout routing replay): the engine records the experts each layer chose for every token it computed
  (actors/generation/vllm_compat.py `RoutingCapture` on CPU, vLLM's own on GPU); every learner forward of the step
  (old log-probs, policy, reference) routes those tokens to those experts.
- R2 (routing replay): the learner records its own choices in the step's first forward and replays them in the
  later ones (num_iterations > 1), so the policy's optimizer steps do not move a token to other experts.

Only the choice is replayed: the chosen experts' weights are recomputed from the learner's router logits (softmax
over all experts, gathered at the replayed ones, renormalised where the model renormalises its top-k), so the
router still gets its gradient. Positions with no recorded route (-1) keep the learner's own choice.

Routes have the shape [tokens, layers, top_k] int16: the rows of the forward's input in order (a padded [B, S]
micro-batch flattened row by row, or a packed one's positions), one row of top_k expert ids per decoder layer
(the decoder layer's index, as vLLM's `layer_id`; a dense layer's row is unused).

Routers supported: transformers' softmax top-k routers, which return (router_logits, top-k weights, top-k indices)
from the flattened [tokens, hidden] states (Qwen2-MoE, Qwen3-MoE, Qwen3.5-MoE, Mixtral, OLMoE...). Others are named
when the learner is built.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F

MODES = ("R2", "R3")
NO_ROUTE = -1  # a position with no recorded choice: the learner routes it itself

_LAYER = re.compile(r"layers\.(\d+)\.")


def find_routers(model: torch.nn.Module) -> dict[int, torch.nn.Module]:
    """{decoder layer index: its MoE router} of a transformers MoE (empty for a dense model)."""
    out = {}
    for name, module in model.named_modules():
        if type(module).__name__.endswith("TopKRouter") or (name.endswith("mlp.gate") and hasattr(module, "top_k")):
            m = _LAYER.search(name)
            if m is not None and hasattr(module, "top_k"):
                out[int(m.group(1))] = module
    return out


def is_moe(model: torch.nn.Module) -> bool:
    return bool(find_routers(model))


class Replay:
    """Patches a model's routers (once) so that, inside `replaying(routes)`, they take the given experts, and inside
    `recording()`, they report the experts they chose. Works on a PEFT-wrapped or FSDP-sharded model: the routers are
    found by name, and the patch is on the module instances."""

    def __init__(self, model: torch.nn.Module, *others: torch.nn.Module) -> None:
        """model: the policy; others: models that replay the same routes (a separate reference model)."""
        self.routers = find_routers(model)
        if not self.routers:
            raise ValueError(f"grpo.router_replay: {type(model).__name__} has no mixture-of-experts router")
        for m in (model, *others):
            for layer, router in find_routers(m).items():
                _check_router(router)
                _patch(router, layer, self)
        self.routes: torch.Tensor | None = None  # [tokens, layers, top_k] while replaying
        self.recorded: dict[int, torch.Tensor] | None = None  # layer -> [tokens, top_k] while recording

    @property
    def num_layers(self) -> int:
        return max(self.routers) + 1

    @property
    def top_k(self) -> int:
        return int(next(iter(self.routers.values())).top_k)

    @contextlib.contextmanager
    def replaying(self, routes: torch.Tensor | None) -> Iterator[None]:
        """Route by `routes` ([tokens, layers, top_k]; None: as the model would) inside: forward AND backward,
        since gradient checkpointing runs the routers again in the backward pass."""
        previous, self.routes = self.routes, routes
        try:
            yield
        finally:
            self.routes = previous

    @contextlib.contextmanager
    def recording(self) -> Iterator[dict[int, torch.Tensor]]:
        """Inside, every router's choice is kept: {layer: [tokens, top_k]} (of the first forward inside)."""
        previous, self.recorded = self.recorded, {}
        try:
            yield self.recorded
        finally:
            self.recorded = previous

    def stack(self, recorded: dict[int, torch.Tensor]) -> torch.Tensor:
        """A recording as routes [tokens, layers, top_k] (NO_ROUTE for the layers that have no router)."""
        tokens = next(iter(recorded.values())).shape[0]
        out = torch.full((tokens, self.num_layers, self.top_k), NO_ROUTE, dtype=torch.int16)
        for layer, ids in recorded.items():
            out[:, layer] = ids.to("cpu", torch.int16)
        return out


def _check_router(router: torch.nn.Module) -> None:
    if not (hasattr(router, "weight") and hasattr(router, "top_k") and hasattr(router, "num_experts")):
        raise ValueError(
            f"grpo.router_replay: {type(router).__name__} is not a softmax top-k router (weight, top_k, num_experts); "
            "routing replay supports transformers' Qwen2-MoE / Qwen3-MoE style routers"
        )


def _patch(router: torch.nn.Module, layer: int, replay: Replay) -> None:
    if getattr(router, "_rayward_replay", None) is replay:
        return
    original = router.forward

    def forward(hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        out = original(hidden_states, *args, **kwargs)
        logits, scores, indices = out
        if replay.routes is not None:
            indices, scores = _replayed(router, logits, indices, scores, replay.routes[:, layer])
        if replay.recorded is not None and layer not in replay.recorded:
            # The first forward's (the policy's): a reference forward or a checkpointed recompute may follow.
            replay.recorded[layer] = indices.detach()
        return logits, scores, indices

    router.forward = forward  # type: ignore[method-assign]
    router._rayward_replay = replay  # type: ignore[attr-defined]


def _replayed(
    router: torch.nn.Module, logits: torch.Tensor, indices: torch.Tensor, scores: torch.Tensor, routes: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The top-k indices with the replayed ones where a route is given, and their weights from these logits.
    logits: [tokens, experts]; indices, scores, routes: [tokens, top_k]."""
    routes = routes.to(indices.device)
    if routes.shape[0] != indices.shape[0]:
        raise ValueError(f"routing replay: {routes.shape[0]} routes for a forward of {indices.shape[0]} tokens")
    given = (routes >= 0).all(-1, keepdim=True)  # [tokens, 1]
    chosen = torch.where(given, routes.long(), indices.long()).to(indices.dtype)
    probs = F.softmax(logits, dim=-1, dtype=torch.float)
    weights = probs.gather(-1, chosen.long())
    if getattr(router, "norm_topk_prob", False):
        weights = weights / weights.sum(dim=-1, keepdim=True)
    # Tokens the model routes itself keep its own weights exactly (the same numbers as without replay).
    weights = torch.where(given, weights.to(scores.dtype), scores)
    return chosen, weights


def agreement(own: torch.Tensor, routes: torch.Tensor, where: torch.Tensor) -> tuple[float, int]:
    """The fraction of (token, layer) pairs whose chosen expert sets agree, over the tokens `where` is true and the
    layers with a route, and how many pairs that was. own, routes: [tokens, layers, top_k]; where: [tokens]."""
    have = (routes >= 0).all(-1) & (own >= 0).all(-1) & where[:, None]  # [tokens, layers]
    if not have.any():
        return float("nan"), 0
    same = (own.sort(-1).values == routes.sort(-1).values).all(-1)
    return float(same[have].float().mean()), int(have.sum())


def layout_routes(source: torch.Tensor, per_sample: list[Any], lengths: list[int], num_layers: int,
                  top_k: int) -> torch.Tensor:
    """Per-sample routes ([length_i, layers, top_k] numpy int16, or None) as routes of a micro-batch's layout:
    [positions, layers, top_k] for the layout's `source` ([R, N] index into the samples laid end to end, -1 at
    pad), NO_ROUTE where there is none."""
    import numpy as np

    parts = [np.full((n, num_layers, top_k), NO_ROUTE, dtype=np.int16) if r is None else r
             for r, n in zip(per_sample, lengths, strict=True)]
    flat = torch.from_numpy(np.concatenate(parts)) if parts else torch.empty(0, num_layers, top_k, dtype=torch.int16)
    src = source.reshape(-1).cpu()
    out = flat[src.clamp(min=0)]
    out[src < 0] = NO_ROUTE
    return out


def layout_flags(source: torch.Tensor, per_sample: list[list[bool]]) -> torch.Tensor:
    """Per-sample per-position flags laid out as `source` ([R, N]) flattened: [positions] bool, False at pad."""
    flat = torch.tensor([f for flags in per_sample for f in flags], dtype=torch.bool)
    src = source.reshape(-1).cpu()
    return flat[src.clamp(min=0)] & (src >= 0)


def aux_loss_coef(model: torch.nn.Module, coef: float | None) -> float:
    """The load-balancing loss weight by TRL's rule: `coef`, or the model config's `router_aux_loss_coef` when
    None; 0.0 for a model that returns no router logits (a dense one)."""
    text = model.config.get_text_config()
    if not hasattr(text, "output_router_logits"):
        if coef:
            raise ValueError(f"router_aux_loss_coef {coef}: {type(model).__name__} returns no router logits")
        return 0.0
    return float(getattr(text, "router_aux_loss_coef", 0.0) or 0.0) if coef is None else float(coef)
