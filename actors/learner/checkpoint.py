"""Learner checkpoints: the policy plus optimizer, scheduler, every random number generator that decides what comes
next, and the run state, written atomically (a temporary directory renamed), in one format whatever the number of
ranks. A full fine-tune writes an HF model directory with its
tokenizer (loadable by transformers and vLLM as it is); a LoRA learner writes its adapter in PEFT's format
(adapter_config.json + adapter_model.safetensors, loadable with `PeftModel.from_pretrained` on the base), and can
write the merged model.
Sharded learners gather on rank 0, which writes; loading reads on rank 0 and broadcasts.

    <dir>/<HF model files or the adapter>, tokenizer files
    <dir>/optimizer.pt      {"optimizer", "scheduler", "rng": RNG_STATE}
    <dir>/STATE_FILE        written last: {"global_step", "files": {relative path: bytes} of every other file,
                            **the caller's extra}; a checkpoint whose files do not match it is damaged
"""

from __future__ import annotations

import functools
import io
import json
import os
import random
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from actors.learner.lora import adapter_keys, load_adapter_file, save_adapter
from actors.weights.sender import from_checkpoint_layout

STATE_FILE = "rayward_state.json"
# Where a checkpoint being replaced (the same step saved again after a recovery, checkpoint-best) waits until its
# successor is in place: a crash in between leaves one of the two whole.
REPLACED_SUFFIX = ".old"


@dataclass(frozen=True)
class TrainState:
    """What a checkpoint saves and restores: the learner's training objects (restored in place) and how this rank
    holds them."""

    model: torch.nn.Module  # the policy (a PEFT model with LoRA; FSDP-sharded when `sharded`)
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    global_step: int  # optimizer steps done
    rank: int
    sharded: bool
    tied: dict[str, str]  # {alias: source} HF names of tied weights (written once)
    lora: bool  # the model is a PEFT model: checkpoints hold the adapter
    model_path: str  # the base model's directory: its tokenizer goes next to the weights
    trust_remote_code: bool
    shuffle: random.Random  # the micro-batch shuffle's generator (the same draws on every rank)


def rng_state(st: TrainState) -> dict[str, Any]:
    """Every generator a resumed learner must continue: the micro-batch shuffle, Python's and torch's (CPU, and
    CUDA where present)."""
    state = {"shuffle": st.shuffle.getstate(), "python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(st: TrainState, state: dict[str, Any] | None) -> None:
    """Restore `rng_state` (None: a checkpoint written before it was saved; the generators stay as they are)."""
    if state is None:
        return
    st.shuffle.setstate(state["shuffle"])
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def full_state_dict(st: TrainState) -> dict[str, torch.Tensor]:
    """Collective: the unsharded weights on rank 0's CPU ({} on the others), tied aliases dropped."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    full = get_model_state_dict(st.model, options=opts)
    return {k: v.contiguous() for k, v in full.items() if k not in st.tied}


def adapter_state_dict(st: TrainState) -> dict[str, torch.Tensor]:
    """Collective under FSDP: the LoRA adapter's whole tensors on rank 0's CPU ({} on the others), keyed as in
    the model's state_dict. Only the adapter is gathered, never the frozen base."""
    state = st.model.state_dict()
    out = {}
    for key in adapter_keys(st.model).values():
        t = state[key]
        t = t.full_tensor() if hasattr(t, "full_tensor") else t  # every rank, in the same order
        if st.rank == 0:
            out[key] = t.detach().cpu().contiguous()
    return out


def optimizer_param_names(st: TrainState) -> list[str]:
    """Parameter names in the optimizer's order: what `optimizer.state_dict()`'s integer ids index."""
    names = {id(p): n for n, p in st.model.named_parameters()}
    return [names[id(p)] for g in st.optimizer.param_groups for p in g["params"]]


def _optimizer_state(st: TrainState) -> dict[str, Any]:
    """The optimizer's state as a single learner's `state_dict()` has it (integer parameter ids); sharded, a
    collective whose result rank 0 holds ({} on the others)."""
    if not st.sharded:
        return st.optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    by_name = get_optimizer_state_dict(st.model, st.optimizer, options=opts)  # keyed by param name
    if st.rank != 0:
        return {}
    ids = {n: i for i, n in enumerate(optimizer_param_names(st))}
    return {  # the local optimizer's param_groups: integer ids, hyper-parameters as a 1-rank one has them
        "state": {ids[n]: v for n, v in by_name["state"].items()},
        "param_groups": st.optimizer.state_dict()["param_groups"],
    }


def save(st: TrainState, path: str, extra: dict[str, Any] | None = None) -> str:
    """The policy (HF checkpoint, or the LoRA adapter in PEFT's format) + optimizer/scheduler + run state,
    written to a temporary directory and renamed, so a killed job never leaves a half-written checkpoint.
    Sharded: a collective; rank 0 writes the full weights and the full optimizer state in the same format
    (integer parameter ids), so checkpoints move between any numbers of ranks."""
    if st.lora:
        adapter = adapter_state_dict(st)
        save_model: Callable[[Path], None] = lambda d: save_adapter(st.model, d, adapter)  # noqa: E731
    elif st.sharded:
        weights = full_state_dict(st)
        save_model = lambda d: st.model.save_pretrained(d, state_dict=weights)  # noqa: E731
    else:
        save_model = st.model.save_pretrained
    optim = _optimizer_state(st)
    if st.rank == 0:
        _atomic(Path(path), lambda d: _fill(st, d, save_model, optim, extra))
    if st.sharded:
        import torch.distributed as dist

        dist.barrier()  # no rank returns before the checkpoint exists
    return str(Path(path))


def save_merged(st: TrainState, path: str, merged: dict[str, torch.Tensor]) -> str:
    """A LoRA learner's merged model (`merged`: exactly what the generators load, base + adapter, tied aliases
    dropped, whole on rank 0) plus the base's tokenizer, as an HF model directory. Collective under FSDP; rank 0
    writes."""
    if st.rank == 0:
        def fill(d: Path) -> None:
            st.model.get_base_model().save_pretrained(d, state_dict=merged)
            save_tokenizer(st, d)

        _atomic(Path(path), fill)
    if st.sharded:
        import torch.distributed as dist

        dist.barrier()
    return str(Path(path))


def _fill(
    st: TrainState, d: Path, save_model: Callable[[Path], None], optim: dict[str, Any], extra: dict[str, Any] | None
) -> None:
    save_model(d)
    save_tokenizer(st, d)
    buf = io.BytesIO()
    torch.save({"optimizer": optim, "scheduler": st.scheduler.state_dict(), "rng": rng_state(st)}, buf)
    (d / "optimizer.pt").write_bytes(buf.getvalue())
    write_state(d, {"global_step": st.global_step, **(extra or {})})


def write_state(d: Path, state: dict[str, Any]) -> None:
    """STATE_FILE, last: `state` plus the size of every other file in the directory, which `damaged` checks."""
    files = {p.relative_to(d).as_posix(): p.stat().st_size for p in sorted(d.rglob("*")) if p.is_file()
             and p.name != STATE_FILE}
    (d / STATE_FILE).write_text(json.dumps({**state, "files": files}))


def damaged(d: Path) -> str | None:
    """Why a checkpoint directory cannot be trusted (its STATE_FILE unreadable, a file it lists missing or of
    another size), or None. A directory without STATE_FILE is incomplete, not damaged: the caller skips it."""
    try:
        state = json.loads((d / STATE_FILE).read_text())
        files = state.get("files", {})  # none in checkpoints written before it was recorded
    except (OSError, ValueError) as err:
        return f"{STATE_FILE} unreadable ({type(err).__name__}: {err})"
    for name, size in files.items():
        p = d / name
        if not p.is_file():
            return f"{name} is missing"
        if p.stat().st_size != size:
            return f"{name} has {p.stat().st_size} bytes, {size} were written"
    return None


def _atomic(final: Path, fill: Callable[[Path], None]) -> str:
    """Write a directory through `fill(tmp)` next to `final`, then swap it in. A crash at any point leaves the
    previous `final` whole: until the rename it is untouched; a `final` being replaced is renamed aside first
    and removed once its successor is in place."""
    tmp = final.with_name(final.name + ".tmp")
    old = final.with_name(final.name + REPLACED_SUFFIX)
    for leftover in (tmp, old):  # a previous attempt killed half-way
        if leftover.exists():
            shutil.rmtree(leftover)
    tmp.mkdir(parents=True)
    fill(tmp)
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)
    return str(final)


def save_tokenizer(st: TrainState, directory: Path) -> None:
    """The policy's tokenizer next to the weights, so vLLM (`rayward eval --checkpoint`, serving) loads the
    directory alone."""
    _tokenizer(st.model_path, st.trust_remote_code).save_pretrained(directory)


@functools.cache
def _tokenizer(model_path: str, trust_remote_code: bool) -> Any:
    """Loaded once per learner process."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path, trust_remote_code=trust_remote_code)


def _read(st: TrainState, p: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any], Any, dict[str, Any]]:
    """Rank 0's read of a checkpoint: (weights keyed as the model's state_dict, optimizer state keyed by
    parameter name, scheduler state, run state)."""
    if st.lora:
        keys = adapter_keys(st.model)
        saved = load_adapter_file(p)
        if saved.keys() != keys.keys():
            raise ValueError(
                f"the adapter in {p} does not fit this learner's LoRA layers (model.lora differs from the run that "
                f"wrote it): {len(saved)} tensors there, {len(keys)} here, "
                f"e.g. {sorted(saved.keys() ^ keys.keys())[:3]}"
            )
        weights = {keys[k]: v for k, v in saved.items()}
    else:
        from safetensors.torch import load_file

        if not (p / "model.safetensors").exists():
            raise FileNotFoundError(
                f"{p} holds no model.safetensors: it was written by a LoRA learner (model.lora), so it resumes one"
            )
        # The file is in the checkpoint's layout (save_pretrained's: an MoE's experts one by one), the model's
        # state_dict in its in-memory one (fused experts).
        weights = from_checkpoint_layout(st.model, load_file(str(p / "model.safetensors")))
        for alias, source in st.tied.items():  # the file holds a tied weight once
            weights.setdefault(alias, weights[source])
    opt = torch.load(p / "optimizer.pt", map_location="cpu", weights_only=False)
    names = optimizer_param_names(st)
    by_name = {
        "state": {names[i]: v for i, v in opt["optimizer"]["state"].items()},
        "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in opt["optimizer"]["param_groups"]],
    }
    return weights, by_name, opt, json.loads((p / STATE_FILE).read_text())


def load(st: TrainState, path: str) -> dict[str, Any]:
    """Restore the policy (weights or adapter), optimizer and scheduler in place from `save`'s directory (written by
    any number of ranks); returns its run state (`global_step` and save's `extra`), for the learner to take its
    global_step from. Sharded: a collective; rank 0 reads, the others get broadcasts (a read error on rank 0 is
    raised on every rank)."""
    p = Path(path)
    if not st.sharded:
        weights, _, opt, state = _read(st, p)
        result = st.model.load_state_dict(weights, strict=False)
        assert not result.unexpected_keys, result.unexpected_keys
        st.optimizer.load_state_dict(opt["optimizer"])
        st.scheduler.load_state_dict(opt["scheduler"])
        set_rng_state(st, opt.get("rng"))
        return state
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    weights: dict[str, Any] = {}
    by_name: dict[str, Any] = {}
    # read error, scheduler state, run state, whether the optimizer state holds tensors, its param_groups, the
    # RNG state: broadcast as objects
    small: list[Any] = [None, None, None, False, None, None]
    if st.rank == 0:
        try:
            weights, by_name, opt, state = _read(st, p)
            has_tensors = any(torch.is_tensor(v) for s in by_name["state"].values() for v in s.values())
            small = [None, opt["scheduler"], state, has_tensors, by_name["param_groups"], opt.get("rng")]
        except Exception as err:  # noqa: BLE001 - re-raised on every rank below
            small = [f"{type(err).__name__}: {err}", None, None, False, None, None]
    dist.broadcast_object_list(small, src=0)
    error, scheduler, state, has_tensors, groups, rng = small
    if error is not None:
        raise RuntimeError(f"loading checkpoint {p} failed on rank 0: {error}")
    # strict=False: a LoRA checkpoint holds the adapter only; the frozen base is the one loaded at start
    opts = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=not st.lora)
    set_model_state_dict(st.model, weights, options=opts)
    if has_tensors:
        set_optimizer_state_dict(st.model, st.optimizer, by_name, options=opts)
    else:  # plain SGD keeps no state; torch's loader then finds no device and refuses: the hyper-parameters only
        for group, saved in zip(st.optimizer.param_groups, groups, strict=True):
            group.update({k: v for k, v in saved.items() if k != "params"})
    st.scheduler.load_state_dict(scheduler)
    set_rng_state(st, rng)
    return state
