"""Learner side of weight transfer: the policy's tensors, cut into buckets, sent to every engine worker.

Every learner rank holds one `WeightSender`; with FSDP ranks every rank takes part in gathering each bucket's
full tensors (a collective of the learner ranks), and rank 0 alone belongs to the weight-transfer group and
broadcasts. Gathering a bucket completes on all ranks before rank 0 sends it: gathers interleaved with the
send, rank against rank, have hung peers (TRL PR 7131). Extra memory on rank 0: two buckets (the one on the
wire and the next one being packed), never a copy of the model.

What the generators receive is a *view* of the learner's state_dict under the base model's HF names (`Source` per
name, fixed when the learner is built): the plan (names, shapes) and every send walk the same view. A full
fine-tune's view is its state_dict without tied aliases; a LoRA learner's view (actors/learner/lora.py) names the
base weights and merges each adapter into its weight as the tensor is sent.

Overlapped sends (one learner rank, pipelined loop): `start(seq)` runs `send()` on a thread of the learner's process
and returns, so the learner's next train step computes its forward and backward while the buckets go out and the
engines load them; `settle()` (before the optimizer changes the weights, and before any other use of the group)
waits for it, and `result(seq)` hands the send's numbers, or its error, to whoever asks (the driver, through a
method the learner actor runs in a concurrency group of its own). Not with FSDP ranks: the per-bucket gathers are
collectives of the learner ranks, which must not interleave with the train step's.
"""

from __future__ import annotations

import dataclasses
import math
import re
import threading
import time
from dataclasses import dataclass
from typing import Any

import torch

from actors.weights.collective import Bucket, WeightGroup, plan_buckets, plan_to_wire, wire_tensors

MB = 1 << 20


@dataclass(frozen=True)
class Source:
    """Where one tensor the generators load comes from in the learner's state_dict: the tensor at `key`, plus for
    a LoRA-adapted weight the adapter merged into it on the way out: W + scaling * (B @ A) (transposed for
    fan_in_fan_out layers), PEFT's delta of a LoRA Linear layer, computed in float32."""

    key: str
    lora_a: str | None = None
    lora_b: str | None = None
    scaling: float = 1.0
    fan_in_fan_out: bool = False
    # A part of the whole (merged) tensor, as (storage offset, shape, stride) of `torch.as_strided` over it made
    # contiguous: one expert's gate_proj out of a fused [experts, 2 * intermediate, hidden] gate_up_proj.
    part: tuple[int, tuple[int, ...], tuple[int, ...]] | None = None

    def shape(self, whole: tuple[int, ...]) -> tuple[int, ...]:
        """The shape of what is sent, given the shape of the tensor at `key`."""
        return whole if self.part is None else self.part[1]


def plain_view(model: torch.nn.Module, tied: dict[str, str]) -> dict[str, Source]:
    """HF name -> Source of a model trained as it is: its state_dict, tied aliases dropped (the receiver derives
    them)."""
    return {k: Source(k) for k in model.state_dict() if k not in tied}


def checkpoint_view(model: torch.nn.Module, view: dict[str, Source], hf_model: Any = None) -> dict[str, Source]:
    """The view under the names and shapes of the model's checkpoint files, which are what an engine loads.

    transformers 5 holds some weights in memory in another layout than its checkpoints: a mixture of experts'
    experts fused into one [experts, 2 * intermediate, hidden] `gate_up_proj` and one `down_proj` per layer,
    where the checkpoint (and vLLM's loader) has `experts.{e}.gate_proj.weight` and so on. `save_pretrained`
    undoes that with the model's reverse conversions (`revert_weight_conversion`); this runs the same
    conversions once per distinct (name pattern, shape) on a tensor of its element indices, so the result says
    which elements of the in-memory tensor make each checkpoint tensor, and keeps that as a strided part
    (offset, shape, stride) of it. A model without conversions (dense Qwen2, Llama) keeps its view as it is.
    model: the module whose state_dict holds the view's keys; hf_model: the transformers model under it (the
    PEFT model's base model; default: model). A conversion that is not a pure re-layout is refused."""
    from transformers.core_model_loading import revert_weight_conversion

    out: dict[str, Source] = {}
    recipes: dict[tuple[str, tuple[int, ...]],
                  list[tuple[str, tuple[int, tuple[int, ...], tuple[int, ...]] | None]]] = {}
    state = model.state_dict()
    for name, src in view.items():
        whole = tuple(state[src.key].shape) if src.key in state else None
        if whole is None or src.part is not None:
            out[name] = src
            continue
        pattern = (re.sub(r"\.\d+\.", ".#.", name), whole)
        if pattern not in recipes:
            recipes[pattern] = _recipe(revert_weight_conversion, hf_model or model, name, whole)
        numbers = re.findall(r"\.(\d+)\.", name)
        for tmpl, part in recipes[pattern]:
            target = _fill(tmpl, numbers)
            out[target] = src if part is None else dataclasses.replace(src, part=part)
    return out


def _recipe(revert: Any, model: torch.nn.Module, name: str, whole: tuple[int, ...]) -> list[tuple[str, Any]]:
    """[(checkpoint name template, part or None)] of the tensor `name` of shape `whole`. A tensor the conversions
    pass through (or only rename) is found so on the meta device, at no cost; a re-laid-out one by converting a
    tensor of its element indices (int64, the tensor's size, once per distinct name pattern and shape)."""
    numbers = re.findall(r"\.(\d+)\.", name)
    probe = torch.empty(whole, device="meta")
    converted = revert(model, {name: probe})
    if len(converted) == 1 and next(iter(converted.values())) is probe:
        return [(_template(next(iter(converted)), numbers), None)]
    numel = math.prod(whole)
    # int32 where it holds every index: half the transient memory of the probe.
    dtype = torch.int32 if numel < 2**31 else torch.int64
    flat_index = torch.arange(numel, dtype=dtype)
    converted = revert(model, {name: flat_index.reshape(whole)})
    recipe = []
    for target, t in converted.items():
        flat = t.contiguous().reshape(-1)
        if t.numel() == numel and tuple(t.shape) == whole and torch.equal(flat, flat_index):
            recipe.append((_template(target, numbers), None))
            continue
        part = _as_strided(flat, tuple(t.shape), flat_index)
        if part is None:
            raise ValueError(f"weight transfer: {name} -> {target} is not a strided part of {name}; "
                             "this model's checkpoint conversion is not supported")
        recipe.append((_template(target, numbers), part))
    return recipe


def from_checkpoint_layout(model: torch.nn.Module, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`checkpoint_view`'s inverse: tensors under the checkpoint's names (a file `save_pretrained` wrote) as the
    model's state_dict holds them (an MoE's experts fused again). Names the model does not convert pass as they are."""
    view = checkpoint_view(model, {k: Source(k) for k in model.state_dict()})
    state = model.state_dict()
    out: dict[str, torch.Tensor] = {}
    for name, src in view.items():
        if name not in weights:
            continue
        if src.part is None:
            out[src.key] = weights[name]
            continue
        whole = out.get(src.key)
        if whole is None:
            whole = out[src.key] = torch.empty(tuple(state[src.key].shape), dtype=weights[name].dtype)
        offset, shape, stride = src.part
        torch.as_strided(whole, shape, stride, offset).copy_(weights[name])
    out.update({k: v for k, v in weights.items() if k not in view})  # what the view does not name (tied aliases)
    return out


def _as_strided(flat: torch.Tensor, shape: tuple[int, ...], index: torch.Tensor
                ) -> tuple[int, tuple[int, ...], tuple[int, ...]] | None:
    """(offset, shape, stride) such that as_strided over the whole tensor gives the elements `flat` (in order), or
    None if no strided pattern does. index: the whole tensor's element indices, flat (the guess is a view of it)."""
    if flat.numel() == 0:
        return None
    idx = flat.reshape(shape)
    offset = int(flat[0])
    stride = []
    for d, n in enumerate(shape):
        if n == 1:
            stride.append(0)
            continue
        step = idx.narrow(d, 1, 1) - idx.narrow(d, 0, 1)
        stride.append(int(step.reshape(-1)[0]))
    if offset < 0 or any(s < 0 for s in stride) or offset + sum((n - 1) * s for n, s in zip(shape, stride, strict=True)
                                                                 ) >= index.numel():
        return None
    guess = torch.as_strided(index, shape, tuple(stride), offset)
    return (offset, shape, tuple(stride)) if torch.equal(guess, idx) else None


def _template(name: str, numbers: list[str] | None = None) -> str:
    """A checkpoint name with the source name's layer numbers replaced by {0}, {1}, ... (other numbers, such as
    an expert's, stay)."""
    numbers = numbers if numbers is not None else re.findall(r"\.(\d+)\.", name)
    parts = name.split(".")
    k = 0
    for i, p in enumerate(parts):
        if k < len(numbers) and p == numbers[k]:
            parts[i] = f"{{{k}}}"
            k += 1
    return ".".join(parts)


def _fill(template: str, numbers: list[str]) -> str:
    return template.format(*numbers)


class WeightSender:
    def __init__(
        self, model: torch.nn.Module, *, view: dict[str, Source], dtype: torch.dtype, rank: int, device: torch.device
    ):
        """view: HF name -> Source, every tensor the generators load (`plain_view`, or a LoRA learner's merged
        view). dtype: the dtype the generators run in (FSDP may hold float32 masters and compute in bfloat16)."""
        self.model, self.view, self.dtype, self.rank, self.device = model, view, dtype, rank, device
        self.buckets: list[Bucket] = []
        self.group: WeightGroup | None = None
        self._store: Any = None  # rank 0's TCPStore: outlives every generation of the group
        self._world_size = 0
        self._timeout_s = 0.0
        self._thread: threading.Thread | None = None  # an overlapped send in progress
        self._finished = threading.Condition()
        self._results: dict[int, dict[str, float] | BaseException] = {}  # seq -> numbers or error, until asked
        # The last whole tensor that parts were cut from (its Source's keys, the tensor), while its parts go out.
        self._last: tuple[tuple[str | None, ...], torch.Tensor | None] | None = None

    def _full(self, state: dict[str, torch.Tensor], src: Source) -> torch.Tensor | None:
        """The whole tensor for one HF name in the generators' dtype, on rank 0 (None on the others). Under FSDP
        a collective of all learner ranks: every rank gathers the weight (and its adapter), in view order."""
        keys = (src.key, src.lora_a, src.lora_b)
        if self._last is not None and self._last[0] == keys:
            whole = self._last[1]  # another part of the tensor just gathered (the next expert's): no new gather
        else:
            whole = self._merge(src, [_whole(state[k]) for k in keys if k is not None])
            # Every rank keeps the same entry, so every rank skips the same gathers.
            self._last = (keys, whole) if src.part is not None else None
        if whole is None:
            return None
        if src.part is not None:
            offset, shape, stride = src.part
            whole = torch.as_strided(whole.contiguous(), shape, stride, offset).contiguous()
        return whole.to(self.dtype)

    def _merge(self, src: Source, parts: list[torch.Tensor]) -> torch.Tensor | None:
        """The whole weight from its gathered parts (weight, and LoRA's A and B), on rank 0; None elsewhere."""
        if self.rank != 0:
            return None
        if src.lora_a is None:
            return parts[0].detach()
        base, a, b = (t.detach() for t in parts)
        delta = b.float() @ a.float()
        if src.fan_in_fan_out:
            delta = delta.T
        return base.float() + src.scaling * delta

    def full_state(self) -> dict[str, torch.Tensor]:
        """Every tensor the generators load, whole, on rank 0's CPU ({} on the others; a collective under FSDP):
        the object-store backend's payload and a LoRA run's merged model."""
        state = self.model.state_dict()
        out = {}
        for name, src in self.view.items():
            t = self._full(state, src)
            if t is not None:
                out[name] = t.cpu()
        self._last = None
        return out

    def plan(self, bucket_mb: float) -> list[list[Any]]:
        """Cut the policy into buckets of at most bucket_mb; returns the plan in wire form (sent once). The
        shapes are the view's (a merged LoRA weight has its base weight's shape)."""
        state = self.model.state_dict()
        shapes = [(name, self.dtype, src.shape(tuple(state[src.key].shape))) for name, src in self.view.items()]
        self.buckets = plan_buckets(shapes, int(bucket_mb * MB))
        return plan_to_wire(self.buckets)

    def export_bytes(self) -> bytes:
        """Every tensor as safetensors bytes on rank 0 (b"" elsewhere): the object-store backend."""
        from safetensors.torch import save

        full = self.full_state()
        return save(full) if self.rank == 0 else b""

    def open(self, world_size: int, timeout_s: float) -> tuple[str, int]:
        """Rank 0: start the store the group's members meet at (once per run)."""
        self._world_size, self._timeout_s = world_size, timeout_s
        if self.rank != 0:
            return "", 0
        if self.group is not None:
            self.group.close()
            self.group = None
        self._store, host, port = WeightGroup.open_store(world_size, timeout_s)
        return host, port

    def join(self, generation: int) -> int:
        """Rank 0 joins generation `generation` of the group (returns when every member has joined)."""
        self.settle()  # a send still on the old group ends (or fails) before the group is re-formed
        if self.rank != 0:
            return 0
        if self.group is not None:
            self.group.close()
            self.group = None
        self.group = WeightGroup.join(
            rank=0, world_size=self._world_size, device=self.device, timeout_s=self._timeout_s,
            generation=generation, store=self._store,
        )
        return 0

    def send(self) -> dict[str, float]:
        """Broadcast every bucket; the next bucket is gathered and packed while the previous one is on the
        wire. Returns gather_s (gather + pack), transfer_s (waiting on the wire), bytes (rank 0). Large tensors
        go on the wire as they are: on a single learner in the run's dtype, the parameters themselves (nothing
        changes them while the learner actor is inside this call)."""
        if not self.buckets:
            raise RuntimeError("send before plan: the weight transfer was not connected")
        if self._thread is not None and threading.current_thread() is not self._thread:
            self.settle()  # a direct send after an overlapped one: one at a time on the group
        state = self.model.state_dict()
        stats = {"gather_s": 0.0, "transfer_s": 0.0, "bytes": 0.0}
        in_flight: tuple[list[Any], int] | None = None  # (works, bucket index) of the bucket on the wire
        for k, bucket in enumerate(self.buckets):
            t0 = time.perf_counter()
            full = [self._full(state, self.view[m.name]) for m in bucket.tensors]  # every rank, together
            if self.rank != 0:
                continue
            bufs = wire_tensors(bucket, full, self.device)
            del full
            stats["gather_s"] += time.perf_counter() - t0
            if in_flight is not None:
                stats["transfer_s"] += self._wait(*in_flight)
            assert self.group is not None, "rank 0 sends only after joining the group"
            in_flight = (self.group.broadcast(bufs), k)
            stats["bytes"] += bucket.wire_bytes
        if in_flight is not None:
            stats["transfer_s"] += self._wait(*in_flight)
        self._last = None
        return stats

    def _wait(self, works: list[Any], k: int) -> float:
        assert self.group is not None
        return self.group.wait(works, f"sending bucket {k + 1}/{len(self.buckets)}")

    # --- overlapped sends ----------------------------------------------------------------------------

    def start(self, seq: int) -> None:
        """Start sync `seq` on a thread and return. Until `settle()` the caller may read the weights (forward,
        backward) but must not change them: large tensors go on the wire from the parameters themselves."""
        if self.rank != 0 or self._world_size == 0:
            err = RuntimeError("an overlapped send needs a single learner rank that joined the weight group")
            self._finish(seq, err)  # whoever waits in result(seq) hears it now, not at its timeout
            raise err
        self.settle()

        def run() -> None:
            try:
                out: dict[str, float] | BaseException = self.send()
                if self.device.type == "cuda":  # the wire has read the weights before the optimizer writes them
                    torch.cuda.current_stream(self.device).synchronize()
            except BaseException as err:  # noqa: BLE001 - handed to result(): the driver names it
                out = err
            self._finish(seq, out)

        self._thread = threading.Thread(target=run, name=f"rayward-weight-send-{seq}", daemon=True)
        self._thread.start()

    def _finish(self, seq: int, out: dict[str, float] | BaseException) -> None:
        with self._finished:
            self._results[seq] = out
            self._finished.notify_all()

    def settle(self) -> None:
        """Wait for an overlapped send in progress (its error, if any, goes to `result`, not here)."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def result(self, seq: int, timeout_s: float | None = None) -> dict[str, float]:
        """Sync `seq`'s numbers once it has finished (it may not have started yet); raises its error."""
        with self._finished:
            if not self._finished.wait_for(lambda: seq in self._results, timeout=timeout_s):
                raise TimeoutError(f"weight sync {seq} did not finish within {timeout_s:.0f} s")
            out = self._results.pop(seq)
        if isinstance(out, BaseException):
            raise out
        return out


def _whole(t: torch.Tensor) -> torch.Tensor:
    """A tensor whole: a DTensor shard all-gathered (a collective), a plain tensor as it is."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t
