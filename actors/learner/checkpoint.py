"""Learner checkpoints: the policy plus optimizer, scheduler and run state, written atomically (a temporary directory
renamed), in one format whatever the number of ranks. A full fine-tune writes an HF model directory with its
tokenizer (loadable by transformers and vLLM as it is); a LoRA learner writes its adapter in PEFT's format
(adapter_config.json + adapter_model.safetensors, loadable with `PeftModel.from_pretrained` on the base), and can
write the merged model.
Sharded learners gather on rank 0, which writes; loading reads on rank 0 and broadcasts."""

from __future__ import annotations

import io
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from actors.learner.lora import adapter_keys, load_adapter_file, save_adapter

STATE_FILE = "rayward_state.json"

# Each function takes the Learner (`lr`: its model, optimizer, scheduler, global_step, rank, tied names, lora).
Learner = Any


def full_state_dict(lr: Learner) -> dict[str, torch.Tensor]:
    """Collective: the unsharded weights on rank 0's CPU ({} on the others), tied aliases dropped."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    full = get_model_state_dict(lr.model, options=opts)
    return {k: v.contiguous() for k, v in full.items() if k not in lr.tied}


def adapter_state_dict(lr: Learner) -> dict[str, torch.Tensor]:
    """Collective under FSDP: the LoRA adapter's whole tensors on rank 0's CPU ({} on the others), keyed as in
    the model's state_dict. Only the adapter is gathered, never the frozen base."""
    state = lr.model.state_dict()
    out = {}
    for key in adapter_keys(lr.model).values():
        t = state[key]
        t = t.full_tensor() if hasattr(t, "full_tensor") else t  # every rank, in the same order
        if lr.rank == 0:
            out[key] = t.detach().cpu().contiguous()
    return out


def optimizer_param_names(lr: Learner) -> list[str]:
    """Parameter names in the optimizer's order: what `optimizer.state_dict()`'s integer ids index."""
    names = {id(p): n for n, p in lr.model.named_parameters()}
    return [names[id(p)] for g in lr.optimizer.param_groups for p in g["params"]]


def _optimizer_state(lr: Learner) -> dict[str, Any]:
    """The optimizer's state as a single learner's `state_dict()` has it (integer parameter ids); sharded, a
    collective whose result rank 0 holds ({} on the others)."""
    if not lr.sharded:
        return lr.optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    by_name = get_optimizer_state_dict(lr.model, lr.optimizer, options=opts)  # keyed by param name
    if lr.rank != 0:
        return {}
    ids = {n: i for i, n in enumerate(optimizer_param_names(lr))}
    return {  # the local optimizer's param_groups: integer ids, hyper-parameters as a 1-rank one has them
        "state": {ids[n]: v for n, v in by_name["state"].items()},
        "param_groups": lr.optimizer.state_dict()["param_groups"],
    }


def save(lr: Learner, path: str, extra: dict[str, Any] | None = None) -> str:
    """The policy (HF checkpoint, or the LoRA adapter in PEFT's format) + optimizer/scheduler + run state,
    written to a temporary directory and renamed, so a killed job never leaves a half-written checkpoint.
    Sharded: a collective; rank 0 writes the full weights and the full optimizer state in the same format
    (integer parameter ids), so checkpoints move between any numbers of ranks."""
    if lr.lora is not None:
        adapter = adapter_state_dict(lr)
        save_model: Callable[[Path], None] = lambda d: save_adapter(lr.model, d, adapter)  # noqa: E731
    elif lr.sharded:
        weights = full_state_dict(lr)
        save_model = lambda d: lr.model.save_pretrained(d, state_dict=weights)  # noqa: E731
    else:
        save_model = lr.model.save_pretrained
    optim = _optimizer_state(lr)
    if lr.rank == 0:
        _atomic(Path(path), lambda d: _fill(lr, d, save_model, optim, extra))
    if lr.sharded:
        import torch.distributed as dist

        dist.barrier()  # no rank returns before the checkpoint exists
    return str(Path(path))


def save_merged(lr: Learner, path: str) -> str:
    """A LoRA learner's merged model (exactly what the generators load: base + adapter, tied aliases dropped)
    plus the base's tokenizer, as an HF model directory. Collective under FSDP; rank 0 writes."""
    state = lr.weights.full_state()
    if lr.rank == 0:
        def fill(d: Path) -> None:
            lr.model.get_base_model().save_pretrained(d, state_dict=state)
            save_tokenizer(lr, d)

        _atomic(Path(path), fill)
    if lr.sharded:
        import torch.distributed as dist

        dist.barrier()
    return str(Path(path))


def _fill(
    lr: Learner, d: Path, save_model: Callable[[Path], None], optim: dict[str, Any], extra: dict[str, Any] | None
) -> None:
    save_model(d)
    save_tokenizer(lr, d)
    buf = io.BytesIO()
    torch.save({"optimizer": optim, "scheduler": lr.scheduler.state_dict()}, buf)
    (d / "optimizer.pt").write_bytes(buf.getvalue())
    (d / STATE_FILE).write_text(json.dumps({"global_step": lr.global_step, **(extra or {})}))


def _atomic(final: Path, fill: Callable[[Path], None]) -> str:
    """Write a directory through `fill(tmp)` next to `final`, then swap it in."""
    tmp = final.with_name(final.name + ".tmp")
    if tmp.exists():  # a previous attempt killed half-way
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    fill(tmp)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    return str(final)


def save_tokenizer(lr: Learner, directory: Path) -> None:
    """The policy's tokenizer next to the weights, so vLLM (`rayward eval --checkpoint`, serving) loads the
    directory alone. Loaded once per learner."""
    if getattr(lr, "_tokenizer", None) is None:
        from transformers import AutoTokenizer

        lr._tokenizer = AutoTokenizer.from_pretrained(lr.model_path, trust_remote_code=lr.trust_remote_code)
    lr._tokenizer.save_pretrained(directory)


def _read(lr: Learner, p: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any], Any, dict[str, Any]]:
    """Rank 0's read of a checkpoint: (weights keyed as the model's state_dict, optimizer state keyed by
    parameter name, scheduler state, run state)."""
    if lr.lora is not None:
        keys = adapter_keys(lr.model)
        saved = load_adapter_file(p)
        if saved.keys() != keys.keys():
            raise ValueError(
                f"the adapter in {p} does not fit this learner's LoRA layers (model.lora differs from the run that "
                f"wrote it): {len(saved)} tensors there, {len(keys)} here, e.g. {sorted(saved.keys() ^ keys.keys())[:3]}"
            )
        weights = {keys[k]: v for k, v in saved.items()}
    else:
        from safetensors.torch import load_file

        if not (p / "model.safetensors").exists():
            raise FileNotFoundError(
                f"{p} holds no model.safetensors: it was written by a LoRA learner (model.lora), so it resumes one"
            )
        weights = load_file(str(p / "model.safetensors"))
        for alias, source in lr.tied.items():  # the file holds a tied weight once
            weights.setdefault(alias, weights[source])
    opt = torch.load(p / "optimizer.pt", map_location="cpu", weights_only=False)
    names = optimizer_param_names(lr)
    by_name = {
        "state": {names[i]: v for i, v in opt["optimizer"]["state"].items()},
        "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in opt["optimizer"]["param_groups"]],
    }
    return weights, by_name, opt, json.loads((p / STATE_FILE).read_text())


def load(lr: Learner, path: str) -> dict[str, Any]:
    """Restore the policy (weights or adapter), optimizer, scheduler and global_step from `save`'s directory
    (written by any number of ranks). Sharded: a collective; rank 0 reads, the others get broadcasts (a read
    error on rank 0 is raised on every rank)."""
    p = Path(path)
    if not lr.sharded:
        weights, _, opt, state = _read(lr, p)
        result = lr.model.load_state_dict(weights, strict=False)
        assert not result.unexpected_keys, result.unexpected_keys
        lr.optimizer.load_state_dict(opt["optimizer"])
        lr.scheduler.load_state_dict(opt["scheduler"])
        lr.global_step = int(state["global_step"])
        return state
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    weights: dict[str, Any] = {}
    by_name: dict[str, Any] = {}
    # read error, scheduler state, run state, whether the optimizer state holds tensors, its param_groups:
    # broadcast as objects
    small: list[Any] = [None, None, None, False, None]
    if lr.rank == 0:
        try:
            weights, by_name, opt, state = _read(lr, p)
            has_tensors = any(torch.is_tensor(v) for s in by_name["state"].values() for v in s.values())
            small = [None, opt["scheduler"], state, has_tensors, by_name["param_groups"]]
        except Exception as err:  # noqa: BLE001 - re-raised on every rank below
            small = [f"{type(err).__name__}: {err}", None, None, False, None]
    dist.broadcast_object_list(small, src=0)
    error, scheduler, state, has_tensors, groups = small
    if error is not None:
        raise RuntimeError(f"loading checkpoint {p} failed on rank 0: {error}")
    # strict=False: a LoRA checkpoint holds the adapter only; the frozen base is the one loaded at start
    opts = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=lr.lora is None)
    set_model_state_dict(lr.model, weights, options=opts)
    if has_tensors:
        set_optimizer_state_dict(lr.model, lr.optimizer, by_name, options=opts)
    else:  # plain SGD keeps no state; torch's loader then finds no device and refuses: the hyper-parameters only
        for group, saved in zip(lr.optimizer.param_groups, groups, strict=True):
            group.update({k: v for k, v in saved.items() if k != "params"})
    lr.scheduler.load_state_dict(scheduler)
    lr.global_step = int(state["global_step"])
    return state
