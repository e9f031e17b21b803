"""Learner checkpoints: an HF model directory with its tokenizer (loadable by transformers and vLLM as it is)
plus optimizer, scheduler and run state, written atomically (a temporary directory renamed), in one format whatever the number of ranks.
Sharded learners gather on rank 0, which writes; loading reads on rank 0 and broadcasts."""

from __future__ import annotations

import io
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

# Each function takes the Learner (`lr`: its model, optimizer, scheduler, global_step, rank, tied names).
Learner = Any


def full_state_dict(lr: Learner) -> dict[str, torch.Tensor]:
    """Collective: the unsharded weights on rank 0's CPU ({} on the others), tied aliases dropped."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    full = get_model_state_dict(lr.model, options=opts)
    return {k: v.contiguous() for k, v in full.items() if k not in lr.tied}

def optimizer_param_names(lr: Learner) -> list[str]:
    """Parameter names in the optimizer's order: what `optimizer.state_dict()`'s integer ids index."""
    names = {id(p): n for n, p in lr.model.named_parameters()}
    return [names[id(p)] for g in lr.optimizer.param_groups for p in g["params"]]

def save(lr: Learner, path: str, extra: dict[str, Any] | None = None) -> str:
    """HF checkpoint (loadable by transformers and vLLM) + optimizer/scheduler + run state, written to a
    temporary directory and renamed, so a killed job never leaves a half-written checkpoint.
    Sharded: a collective; rank 0 writes the full weights and the full optimizer state in the same
    format (integer parameter ids), so checkpoints move between any numbers of ranks."""
    if not lr.sharded:
        return _write(lr, path, lr.model.save_pretrained, lr.optimizer.state_dict(), extra)
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    weights = full_state_dict(lr)
    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    by_name = get_optimizer_state_dict(lr.model, lr.optimizer, options=opts)  # keyed by param name
    if lr.rank == 0:
        ids = {n: i for i, n in enumerate(optimizer_param_names(lr))}
        optim = {  # the local optimizer's param_groups: integer ids, hyper-parameters as a 1-rank one has them
            "state": {ids[n]: v for n, v in by_name["state"].items()},
            "param_groups": lr.optimizer.state_dict()["param_groups"],
        }
        _write(lr, path, lambda d: lr.model.save_pretrained(d, state_dict=weights), optim, extra)
    dist.barrier()  # no rank returns before the checkpoint exists
    return str(Path(path))

def _write(
    lr: Learner, path: str, save_model: Callable[[Path], None], optim: dict[str, Any], extra: dict[str, Any] | None
) -> str:
    final = Path(path)
    tmp = final.with_name(final.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    save_model(tmp)
    save_tokenizer(lr, tmp)
    buf = io.BytesIO()
    torch.save({"optimizer": optim, "scheduler": lr.scheduler.state_dict()}, buf)
    (tmp / "optimizer.pt").write_bytes(buf.getvalue())
    (tmp / "rayward_state.json").write_text(
        json.dumps({"global_step": lr.global_step, **(extra or {})})
    )
    if final.exists():
        for f in final.iterdir():
            f.unlink()
        final.rmdir()
    os.replace(tmp, final)
    return str(final)

def save_tokenizer(lr: Learner, directory: Path) -> None:
    """The policy's tokenizer next to the weights, so vLLM (`rayward eval --checkpoint`, serving) loads the
    directory alone. Loaded once per learner."""
    if getattr(lr, "_tokenizer", None) is None:
        from transformers import AutoTokenizer

        lr._tokenizer = AutoTokenizer.from_pretrained(lr.model_path, trust_remote_code=lr.trust_remote_code)
    lr._tokenizer.save_pretrained(directory)


def load(lr: Learner, path: str) -> dict[str, Any]:
    """Restore policy weights, optimizer, scheduler and global_step from `save_checkpoint`'s directory
    (written by any number of ranks). Sharded: a collective; rank 0 reads, the others get broadcasts."""
    from safetensors.torch import load_file

    p = Path(path)
    if not lr.sharded:
        lr.model.load_state_dict(load_file(str(p / "model.safetensors")), strict=False)
        opt = torch.load(p / "optimizer.pt", map_location=lr.device, weights_only=False)
        lr.optimizer.load_state_dict(opt["optimizer"])
        lr.scheduler.load_state_dict(opt["scheduler"])
        state = json.loads((p / "rayward_state.json").read_text())
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
    small: list[Any] = [None, None]  # scheduler state, run state: broadcast as objects
    if lr.rank == 0:
        weights = load_file(str(p / "model.safetensors"))
        for alias, source in lr.tied.items():  # the file holds a tied weight once
            weights.setdefault(alias, weights[source])
        opt = torch.load(p / "optimizer.pt", map_location="cpu", weights_only=False)
        names = optimizer_param_names(lr)
        by_name = {
            "state": {names[i]: v for i, v in opt["optimizer"]["state"].items()},
            "param_groups": [
                {**g, "params": [names[i] for i in g["params"]]} for g in opt["optimizer"]["param_groups"]
            ],
        }
        small = [opt["scheduler"], json.loads((p / "rayward_state.json").read_text())]
    opts = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(lr.model, weights, options=opts)
    set_optimizer_state_dict(lr.model, lr.optimizer, by_name, options=opts)
    dist.broadcast_object_list(small, src=0)
    lr.scheduler.load_state_dict(small[0])
    state = small[1]
    lr.global_step = int(state["global_step"])
    return state
