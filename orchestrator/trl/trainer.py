"""`rayward.GRPOTrainer`: TRL 1.16's GRPOTrainer, constructor and methods, run as a rayward run on Ray. A TRL
script moves to a Ray cluster by changing its import; nothing else.

    GRPOTrainer(model, reward_funcs, args, train_dataset, ...)   check everything, build the run's config
        -> train()      orchestrator.run.train.train: embedded Ray, or the cluster RAY_ADDRESS / rayward= names
        -> save_model   the final checkpoint's policy, as TRL's save_model writes it
        -> evaluate     orchestrator.run.evaluate on the eval_dataset

What the script hands over becomes a RunConfig (orchestrator/config/__init__.py), so the run is the one `rayward run`
would make from YAML:
    args (a trl.GRPOConfig)      field by field: orchestrator/trl/args.py (mapped, ignored with a line, or refused)
    reward_funcs                 functions, async functions, lambdas and closures by value (actors/user_code.py
                                 `by_value`); model paths and loaded sequence-classification models as reward models
    train_dataset, eval_dataset  saved (`save_to_disk`) under <output_dir>/rayward-inputs/, read by the driver
    model, processing_class      a path as it is; a loaded model (and a tokenizer that is not the model's own)
                                 saved there too
    peft_config                  model.lora (PEFT's LoraConfig names)
    tools, environment_factory   by value, run in the environment workers
    callbacks                    on_train_begin, on_log (each step's row, as the run writes it), on_train_end
    rayward=                     rayward's own settings TRL has no words for: a mapping or a YAML file of config
                                 sections (cluster, loop, weight_sync, agent, ...) merged over what args mean;
                                 `rewards` there maps a reward's name to extra fields (gate, schedule, timeout_s)
Everything is checked here, in the constructor, before Ray or vLLM start.
"""

from __future__ import annotations

import copy
import inspect
import itertools
import json
import math
import os
import re
import shutil
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from actors import user_code
from orchestrator.config import RUN_NAME_PATTERN, ConfigError, RunConfig, parse_config
from orchestrator.run.errors import RunStopped
from orchestrator.trl import args as trl_args

# Under <output_dir>: what the script handed over as objects, saved so the driver (and `rayward run --resume`
# with the saved config) reads them from disk.
INPUTS_DIR = "rayward-inputs"
# A checkpoint's files that are rayward's, not the model's: save_model leaves them out (TRL's holds the model).
CHECKPOINT_ONLY_FILES = {"optimizer.pt", "rayward_state.json"}
# The run name, where `rayward submit SCRIPT.py` set it (default: output_dir's last part); the run's files then go
# to output_dir's parent / that name.
RUN_NAME_ENV = "RAYWARD_RUN_NAME"
# How a script stopped by a signal exits: 128 + the signal's number, as `rayward run` does.
SIGNAL_EXIT = {"SIGTERM": 143, "SIGINT": 130}
# How often the callback thread reads new rows of metrics.jsonl.
CALLBACK_POLL_S = 0.5
# peft.LoraConfig fields rayward maps (model.lora), and those it ignores (they only say what PEFT task it is).
_LORA_MAPPED = ("r", "lora_alpha", "lora_dropout", "target_modules", "bias", "use_rslora")
_LORA_IGNORED = {"task_type", "peft_type", "base_model_name_or_path", "revision", "inference_mode",
                 "auto_mapping", "peft_version"}


def _name(fn: Any) -> str:
    """A reward function's name as TRL logs it (`get_callable_name`), in rayward's reward-name alphabet."""
    import functools

    while isinstance(fn, functools.partial):
        fn = fn.func
    raw = getattr(fn, "__name__", type(fn).__name__)
    return re.sub(r"[^A-Za-z0-9_.\-<>]+", "", raw) or "reward"


def _model_reward_name(name_or_path: str) -> str:
    """A reward model's name as TRL logs it: its checkpoint's last path part."""
    return re.sub(r"[^A-Za-z0-9_.\-]+", "-", name_or_path.rstrip("/").split("/")[-1])


def _unique(names: list[str]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for n in names:
        seen[n] = seen.get(n, 0) + 1
        out.append(n if seen[n] == 1 else f"{n}_{seen[n]}")
    return out


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """`extra` over `base`, section by section (in place); unknown keys stay for the config to refuse by name."""
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = copy.deepcopy(value)
    return base


def _rayward_tree(rayward: dict[str, Any] | str | os.PathLike | None) -> dict[str, Any]:
    if rayward is None:
        return {}
    if isinstance(rayward, dict):
        return copy.deepcopy(rayward)
    path = Path(rayward)
    if not path.is_file():
        raise ConfigError(f"rayward={str(rayward)!r}: no such YAML file")
    tree = yaml.safe_load(path.read_text()) or {}
    if not isinstance(tree, dict):
        raise ConfigError(f"rayward={str(rayward)!r}: the top level must be a mapping of config sections")
    return tree


def _with_rayward(tree: dict[str, Any], rayward: dict[str, Any] | str | os.PathLike | None) -> dict[str, Any]:
    """The config tree with the `rayward=` keyword's sections merged over it; its `rewards` (name -> extra fields)
    merged into the reward of that name."""
    extra = _rayward_tree(rayward)
    by_name = extra.pop("rewards", None)
    if by_name is not None:
        if not isinstance(by_name, dict):
            raise ConfigError("rayward['rewards']: a mapping of reward name -> extra fields (gate, schedule, "
                              "timeout_s, ...); the functions themselves come from reward_funcs")
        known = {r["name"]: r for r in tree["rewards"]}
        for name, fields in by_name.items():
            if name not in known:
                raise ConfigError(f"rayward['rewards'][{name!r}]: no such reward (reward_funcs give {sorted(known)})")
            _merge(known[name], fields)
    return _merge(tree, extra)


def _dataset_rows(ds: Any, *, what: str, max_steps: int | None) -> int | None:
    """Check a dataset the script handed over: its number of rows (None for an IterableDataset, which takes
    GRPOConfig.max_steps to size the run)."""
    import datasets

    if isinstance(ds, (datasets.DatasetDict, datasets.IterableDatasetDict)) or isinstance(ds, dict):
        raise ConfigError(f"{what}: a dict of datasets; give one Dataset (rayward runs one split)")
    if isinstance(ds, datasets.IterableDataset):
        if max_steps is None:
            raise ConfigError(f"{what}: an IterableDataset needs GRPOConfig.max_steps (TRL requires it too)")
        return None
    if not isinstance(ds, datasets.Dataset):
        raise ConfigError(f"{what}: a {type(ds).__name__}; give a datasets.Dataset or IterableDataset")
    if len(ds) == 0:
        raise ConfigError(f"{what}: the dataset has no rows")
    return len(ds)


def _save_dataset(ds: Any, dest: Path, *, what: str, rows_needed: int | None) -> str:
    """Save a checked datasets.Dataset (of an IterableDataset, the rows the run needs) where the driver reads
    it; the directory."""
    import datasets

    if isinstance(ds, datasets.IterableDataset):
        rows = list(itertools.islice(ds, rows_needed))
        if not rows:
            raise ConfigError(f"{what}: the IterableDataset yields no rows")
        ds = datasets.Dataset.from_list(rows)
    ds.save_to_disk(str(dest))
    return str(dest)


def _checked_args(args: Any, model: Any) -> Any:
    """The script's GRPOConfig; without one, TRL's default (output_dir `<model name>-GRPO`), built as
    rayward.GRPOConfig so that it constructs on a machine without a GPU (orchestrator/trl/grpo_config.py)."""
    import trl

    from orchestrator.trl.grpo_config import GRPOConfig

    if args is None:
        config = getattr(model, "config", None)
        name = model if isinstance(model, str) else getattr(config, "_name_or_path", "m")
        return GRPOConfig(output_dir=f"{str(name).split('/')[-1]}-GRPO")
    if not isinstance(args, trl.GRPOConfig):
        raise ConfigError(f"args: a {type(args).__name__}; give a trl.GRPOConfig")
    return args


def _refuse_arguments(optimizers: tuple[Any, Any], quantization_config: Any, rollout_func: Any) -> None:
    for value, what, instead in (
        (optimizers != (None, None), "optimizers", "GRPOConfig.optim, learning_rate, lr_scheduler_type"),
        (quantization_config is not None, "quantization_config", "a bf16 or float32 model"),
        (rollout_func is not None, "rollout_func", "tools or environment_factory"),
    ):
        if value:
            raise ConfigError(f"{what}: rayward cannot run it (its learner and generators are separate "
                              f"processes); instead: {instead}")


def _reward_list(reward_funcs: Any, environment_factory: Any) -> list[Any]:
    funcs = [] if reward_funcs is None else list(reward_funcs) if isinstance(reward_funcs, list) else [
        reward_funcs]
    if not funcs and environment_factory is None:
        raise ConfigError("reward_funcs: give at least one (or an environment_factory whose class has "
                          "get_reward(), as in TRL)")
    return funcs


def _train_rows(ds: Any, args: Any, environment_factory: Any) -> int | None:
    if ds is None:
        if environment_factory is None:
            raise ConfigError("train_dataset: give one (only an environment_factory that owns its data runs "
                              "without one, as in TRL)")
        return None
    max_steps = args.max_steps if args.max_steps and args.max_steps > 0 else None
    return _dataset_rows(ds, what="train_dataset", max_steps=max_steps)


def _emptied(path: Path) -> Path:
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


def _run_name(output_dir: Path) -> str:
    """RAYWARD_RUN_NAME (`rayward submit`), else output_dir's last part as a run name."""
    given = os.environ.get(RUN_NAME_ENV)
    name = given or re.sub(r"[^a-z0-9\-]+", "-", output_dir.name.lower()).strip("-")[:63] or "run"
    if not re.match(RUN_NAME_PATTERN, name):
        raise ConfigError(f"GRPOConfig.output_dir {str(output_dir)!r}: its last part must make a run name "
                          "(letters, digits, '-')")
    return name


def _environment(tools: list[Callable[..., Any]] | None, environment_factory: Any) -> dict[str, Any]:
    """The config's tools and environment_factory: the script's objects, by value."""
    out: dict[str, Any] = {}
    if tools:
        out["tools"] = [user_code.by_value(t) for t in tools]
    if environment_factory is not None:
        out["environment_factory"] = (
            {k: user_code.by_value(v) for k, v in environment_factory.items()}
            if isinstance(environment_factory, dict) else user_code.by_value(environment_factory))
    return out


def _is_model(obj: Any) -> bool:
    import torch

    return isinstance(obj, torch.nn.Module)


def _with_tokenizer(model_dir: str, tokenizer: Any, dest: Path) -> str:
    """A directory holding the model of `model_dir` and `tokenizer` (the script's processing_class): the model's
    files linked, not copied, the tokenizer's written over them."""
    src = Path(model_dir)
    if not src.is_dir():
        raise ConfigError(f"processing_class: given with model {model_dir!r}, which is not a local directory; "
                          "pass the loaded model, or save model and tokenizer to one directory")
    dest.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and not (dest / f.name).exists():
            (dest / f.name).symlink_to(f.resolve())
    for f in dest.iterdir():  # the tokenizer's files replace the model's links of the same name
        if f.is_symlink() and ("token" in f.name or f.name in ("special_tokens_map.json", "chat_template.jinja",
                                                               "vocab.json", "merges.txt")):
            f.unlink()
    tokenizer.save_pretrained(str(dest))
    return str(dest)


def trl_row(row: dict[str, Any]) -> dict[str, Any]:
    """A metrics row with TRL's names beside rayward's, where TRL has another: a reward function's `log_metric`
    values under their own name (rayward: `reward_fn/<name>`), `step_time` (rayward: `time/step`), and an eval's
    `eval_<metric>` (rayward: `eval/<metric>`)."""
    out = dict(row)
    for key, value in row.items():
        if key.startswith("reward_fn/"):
            out.setdefault(key.removeprefix("reward_fn/"), value)
        elif key.startswith("eval/"):
            out.setdefault("eval_" + key.removeprefix("eval/"), value)
    if "time/step" in row:
        out.setdefault("step_time", row["time/step"])
    return out


class GRPOTrainer:
    """TRL's GRPOTrainer on Ray (the module docstring); `rayward` is rayward's own keyword. Raises ConfigError
    naming the argument or GRPOConfig field it cannot honour, before anything starts."""

    def __init__(
        self,
        model: Any,
        reward_funcs: Any = None,
        args: Any = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        processing_class: Any = None,
        reward_processing_classes: Any = None,
        callbacks: list[Any] | None = None,
        optimizers: tuple[Any, Any] = (None, None),
        quantization_config: Any = None,
        peft_config: Any = None,
        tools: list[Callable[..., Any]] | None = None,
        rollout_func: Callable[..., Any] | None = None,
        environment_factory: Any = None,
        *,
        rayward: dict[str, Any] | str | os.PathLike | None = None,
    ):
        self.args = _checked_args(args, model)
        _refuse_arguments(optimizers, quantization_config, rollout_func)
        self.notes = trl_args.check_fields(self.args)
        self.callbacks = list(callbacks or [])
        self.processing_class = processing_class
        funcs = _reward_list(reward_funcs, environment_factory)
        out = Path(self.args.output_dir).resolve()
        self._inputs = _emptied(out / INPUTS_DIR)
        self.model_path, model_max_len = self._model(model, processing_class)
        train_rows = _train_rows(train_dataset, self.args, environment_factory)
        tree = trl_args.run_tree(self.args, train_rows=train_rows, has_eval=eval_dataset is not None,
                                 model_max_len=model_max_len)
        tree["data"]["path"] = self._saved_train(train_dataset, tree)
        tree["rewards"] = self._rewards(funcs, reward_processing_classes, tree.pop("rewards"))
        tree["name"] = _run_name(out)
        tree["model"].update(self._policy(peft_config))
        if eval_dataset is not None:
            tree["eval"]["data"] = {"path": self._saved_eval(eval_dataset)}
        tree.update(_environment(tools, environment_factory))
        self.cfg: RunConfig = parse_config(_with_rayward(tree, rayward))
        self._settle(out)

    def _settle(self, out: Path) -> None:
        """The run directory (a line where it is not output_dir), the notes printed, TRL's state and
        control."""
        from transformers import TrainerControl, TrainerState

        self.run_dir = Path(self.cfg.logging.dir) / self.cfg.name
        if self.run_dir != out:
            self.notes.append(f"GRPOConfig.output_dir: the run's files go to {self.run_dir} (a run name is "
                              "lowercase letters, digits and '-')")
        for note in self.notes:  # the GRPOConfig fields set here that rayward ignores, one line each
            print(f"rayward: {note}", flush=True)
        self.state = TrainerState(max_steps=self.cfg.grpo.max_steps,
                                  num_train_epochs=self.args.num_train_epochs)
        self.control = TrainerControl()

    # --- what the script handed over -------------------------------------------------------------------------

    def _model(self, model: Any, processing_class: Any) -> tuple[str, int | None]:
        """The policy's directory and its context limit (max_position_embeddings)."""
        from transformers import AutoConfig, AutoTokenizer, PreTrainedModel

        if hasattr(model, "peft_config") and _is_model(model):
            raise ConfigError("model: a PeftModel; pass the base model and peft_config (rayward applies LoRA in "
                              "its learner)")
        if isinstance(model, (str, os.PathLike)):
            path = str(model)
            if processing_class is not None and getattr(processing_class, "name_or_path", None) != path:
                path = _with_tokenizer(path, processing_class, self._inputs / "model")
        elif isinstance(model, PreTrainedModel):
            dest = self._inputs / "model"
            model.save_pretrained(str(dest))
            tok = processing_class or AutoTokenizer.from_pretrained(model.config._name_or_path)
            tok.save_pretrained(str(dest))
            path = str(dest)
        else:
            raise ConfigError(f"model: a {type(model).__name__}; give a model path (or hub id) or a loaded "
                              "transformers model")
        try:
            conf = AutoConfig.from_pretrained(path, trust_remote_code=self.args.trust_remote_code)
        except Exception as err:  # noqa: BLE001 - the path is the user's to fix, named
            raise ConfigError(f"model {path!r}: cannot load its config ({type(err).__name__}: {err})") from None
        text = getattr(conf, "text_config", None) or conf
        return path, getattr(text, "max_position_embeddings", None)

    def _saved_train(self, ds: Any, tree: dict[str, Any]) -> str | None:
        """train_dataset saved for the driver (of an IterableDataset: the rows max_steps x prompts per
        step)."""
        if ds is None:
            return None
        gen = tree["generation"]
        needed = tree["grpo"]["max_steps"] * (gen["generation_batch_size"] // gen["num_generations"])
        return _save_dataset(ds, self._inputs / "train", what="train_dataset", rows_needed=needed)

    def _saved_eval(self, ds: Any) -> str:
        if isinstance(ds, dict) and len(ds) == 1:
            ds = next(iter(ds.values()))
        _dataset_rows(ds, what="eval_dataset", max_steps=None)
        return _save_dataset(ds, self._inputs / "eval", what="eval_dataset", rows_needed=None)

    def _policy(self, peft_config: Any) -> dict[str, Any]:
        """The config's model fields the arguments give: its directory, and LoRA from peft_config."""
        lora = {} if peft_config is None else {"lora": self._lora(peft_config, self.model_path)}
        return {"name_or_path": self.model_path, **lora}

    def _rewards(self, funcs: list[Any], processors: Any, weights: list[dict[str, float]] | None
                 ) -> list[dict[str, Any]]:
        """The config's rewards: one per reward function, named as TRL names it; `weights` from run_tree."""
        from transformers import AutoTokenizer

        if weights is not None and len(weights) != len(funcs):
            raise ConfigError(f"GRPOConfig.reward_weights: {len(weights)} weights for {len(funcs)} reward_funcs")
        procs = processors if isinstance(processors, list) else [processors] * len(funcs)
        names, sources = [], []
        for i, fn in enumerate(funcs):
            if isinstance(fn, (str, os.PathLike)):
                names.append(_model_reward_name(str(fn)))
                sources.append({"model": str(fn)})
            elif _is_model(fn):
                dest = self._inputs / f"reward-model-{i}"
                fn.save_pretrained(str(dest))
                (procs[i] or AutoTokenizer.from_pretrained(fn.config._name_or_path)).save_pretrained(str(dest))
                names.append(_model_reward_name(fn.config._name_or_path))
                sources.append({"model": str(dest)})
            elif callable(fn):
                names.append(_name(fn))
                sources.append({"function": user_code.by_value(fn, label=_name(fn))})
            else:
                raise ConfigError(f"reward_funcs[{i}]: a {type(fn).__name__}; give a function, a model path or a "
                                  "sequence-classification model")
        return [{"name": n, **s, **(weights[i] if weights is not None else {})}
                for i, (n, s) in enumerate(zip(_unique(names), sources, strict=True))]

    def _lora(self, peft_config: Any, model_path: str) -> dict[str, Any]:
        import peft

        if not isinstance(peft_config, peft.LoraConfig):
            raise ConfigError(f"peft_config: a {type(peft_config).__name__}; rayward's learner applies LoRA "
                              "(peft.LoraConfig)")
        default = peft.LoraConfig()
        unsupported = sorted(k for k, v in vars(peft_config).items()
                             if k not in _LORA_MAPPED and k not in _LORA_IGNORED and not k.startswith("_")
                             and v != getattr(default, k, v))
        if unsupported:
            raise ConfigError(f"peft_config: rayward's LoRA takes {list(_LORA_MAPPED)}; these are set too: "
                              f"{unsupported}")
        targets = peft_config.target_modules
        if targets is None:  # PEFT's per-architecture default, as get_peft_model would pick it
            from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as by_type
            from transformers import AutoConfig

            model_type = AutoConfig.from_pretrained(model_path).model_type
            if model_type not in by_type:
                raise ConfigError(f"peft_config.target_modules: PEFT has no default for {model_type!r}; name them")
            targets = list(by_type[model_type])
        elif not isinstance(targets, str):
            targets = sorted(targets)
        return {"r": peft_config.r, "lora_alpha": peft_config.lora_alpha, "lora_dropout": peft_config.lora_dropout,
                "target_modules": targets, "bias": peft_config.bias, "use_rslora": peft_config.use_rslora}

    # --- TRL's methods ---------------------------------------------------------------------------------------

    def train(self, resume_from_checkpoint: str | bool | None = None, trial: Any = None,
              ignore_keys_for_eval: list[str] | None = None, **_: Any) -> Any:
        """Run the whole training on Ray (as `rayward run`); TRL's TrainOutput(global_step, training_loss,
        metrics). resume_from_checkpoint: True, or a checkpoint of this output_dir, continues from the run's latest
        checkpoint (rayward resumes from the latest: the data position, optimizer and curriculum with it);
        "auto" continues from it if the run directory has one, else starts (a requeued or restarted script).
        A SIGTERM or Ctrl-C ends the step, writes a checkpoint and exits the script (SystemExit 143 / 130) with one
        line; a failure raises RunFailed (orchestrator/run/errors.py: the step, the last checkpoint; the error that
        ended the run as its __cause__)."""
        from transformers.trainer_utils import TrainOutput

        from orchestrator.run.train import train as run_train

        if trial is not None:
            raise ConfigError("train(trial=...): hyperparameter search is not supported")
        resume = self._resume_mode(resume_from_checkpoint)
        watch = _CallbackFeed(self) if self.callbacks else None
        t0 = time.time()
        closing: dict[str, Any] | None = None
        try:
            if watch:
                watch.start()
            history = run_train(self.cfg, self.cfg.name, resume=resume)
            closing = self._finish_state(history, time.time() - t0)
        except RunStopped as err:
            # SIGTERM (timeout, SLURM, `ray job stop`) or Ctrl-C: the step finished and a checkpoint was written;
            # the script ends as `rayward run` does, one line and 143 (130), instead of a traceback
            print(f"rayward: {err}", file=sys.stderr, flush=True)
            raise SystemExit(SIGNAL_EXIT.get(err.signal, SIGNAL_EXIT["SIGTERM"])) from None
        finally:
            if watch:
                watch.stop(closing)
        return TrainOutput(self.state.global_step, closing["train_loss"], {
            k: v for k, v in closing.items() if k != "step"})

    def _resume_mode(self, resume_from_checkpoint: str | bool | None) -> bool | str:
        """train()'s resume_from_checkpoint as orchestrator.run.train's `resume`: "auto" as it is (the latest
        checkpoint if there is one, else a fresh start), True or a checkpoint of the run directory: True."""
        from orchestrator.run.checkpoints import RESUME_AUTO

        if resume_from_checkpoint == RESUME_AUTO:
            return RESUME_AUTO
        if isinstance(resume_from_checkpoint, str) and Path(resume_from_checkpoint).resolve().parent != (
                self.run_dir.resolve()):
            raise ConfigError(f"train(resume_from_checkpoint={resume_from_checkpoint!r}): rayward resumes "
                              f"from the latest checkpoint of its run directory {self.run_dir} (or \"auto\": "
                              "it if there is one)")
        return bool(resume_from_checkpoint)

    def _finish_state(self, history: list[dict[str, Any]], elapsed: float) -> dict[str, Any]:
        """trainer.state as transformers' Trainer.train leaves it (global_step, epoch, total_flos, the logging /
        save / eval intervals, the batch size, the best checkpoint, log_history) and the closing row it appends
        to log_history: train_runtime, train_samples_per_second, train_steps_per_second, total_flos, train_loss,
        epoch, step. Returned: that row."""
        from orchestrator.run import checkpoints

        rows = [r for r in history if "loss" in r or not any(k.startswith("eval/") for k in r)]
        st, a = self.state, self.args
        st.global_step = max((int(r.get("step", 0)) for r in rows), default=0)
        st.epoch = next((float(r["epoch"]) for r in reversed(rows) if "epoch" in r), 0.0)
        st.log_history = [trl_row(r) for r in history]
        st.logging_steps, st.save_steps, st.eval_steps = a.logging_steps, a.save_steps, a.eval_steps or a.logging_steps
        st.train_batch_size = a.per_device_train_batch_size
        st.total_flos = float(6 * non_embedding_parameters(checkpoints.latest(self.run_dir))
                              * sum(float(r.get("num_tokens", 0.0)) for r in rows))
        best = self.run_dir / "checkpoint-best"
        if self.cfg.grpo.save_best is not None and best.is_dir():
            st.best_model_checkpoint = str(best)
            st.best_global_step = checkpoints.saved_step(best)
            st.best_metric = next((r[self.cfg.grpo.save_best] for r in history
                                   if r.get("step") == st.best_global_step and self.cfg.grpo.save_best in r), None)
        losses = [r["loss"] for r in rows if isinstance(r.get("loss"), (int, float)) and math.isfinite(r["loss"])]
        steps = max(st.global_step, 1)
        closing = {"train_runtime": round(elapsed, 4),
                   "train_samples_per_second": round(steps * self.cfg.generation.generation_batch_size / elapsed, 3)
                   if elapsed else 0.0,
                   "train_steps_per_second": round(steps / elapsed, 3) if elapsed else 0.0,
                   "total_flos": st.total_flos, "train_loss": sum(losses) / len(losses) if losses else float("nan"),
                   "epoch": st.epoch, "step": st.global_step}
        st.log_history.append(closing)
        return closing

    def latest_checkpoint(self) -> Path | None:
        from orchestrator.run import checkpoints

        return checkpoints.latest(self.run_dir)

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """The trained policy (the final checkpoint's model files: an HF model directory with its tokenizer; with
        LoRA, the adapter in PEFT's format), written to output_dir (default: args.output_dir), as TRL's
        save_model writes it."""
        ckpt = self.latest_checkpoint()
        if ckpt is None:
            raise RuntimeError(f"save_model: no checkpoint in {self.run_dir}: call train() first")
        dest = Path(output_dir or self.args.output_dir)
        dest.mkdir(parents=True, exist_ok=True)
        for f in ckpt.iterdir():
            if f.is_file() and f.name not in CHECKPOINT_ONLY_FILES:
                shutil.copy2(f, dest / f.name)

    def evaluate(self, eval_dataset: Any = None, ignore_keys: list[str] | None = None,
                 metric_key_prefix: str = "eval") -> dict[str, float]:
        """Evaluate the latest checkpoint (before train(): the initial model) on the eval_dataset, with the
        training reward functions; TRL's metric names (`eval_reward`, `eval_rewards/<name>/mean`, ...)."""
        from orchestrator.run.evaluate import evaluate as run_eval

        if eval_dataset is not None:
            raise ConfigError("evaluate(eval_dataset=...): give the eval_dataset to the constructor")
        if self.cfg.eval is None:
            raise ConfigError("evaluate(): the trainer has no eval_dataset")
        ckpt = self.latest_checkpoint()
        report = run_eval(self.cfg, ckpt, name=f"{self.cfg.name}-eval", verbose=False,
                          output=self.run_dir / "eval.json")
        metrics = {f"{metric_key_prefix}_{k.removeprefix('eval/')}": v for k, v in report["metrics"].items()
                   if isinstance(v, (int, float))}
        self.state.log_history.append({**metrics, "step": self.state.global_step})
        return metrics

    def add_callback(self, callback: Any) -> None:
        self.callbacks.append(callback() if inspect.isclass(callback) else callback)


def non_embedding_parameters(checkpoint: Path | None) -> int:
    """The parameters a checkpoint's safetensors hold, embeddings left out (transformers' total_flos counts 6 x
    these per token), read from the files' headers; 0 without a checkpoint."""
    from safetensors import safe_open

    total = 0
    for f in sorted(checkpoint.glob("*.safetensors")) if checkpoint is not None else []:
        with safe_open(str(f), "pt") as st:
            for name in st.keys():
                if "embed" not in name:
                    total += math.prod(st.get_slice(name).get_shape())
    return total


class _CallbackFeed:
    """The script's TrainerCallbacks, on the driver: on_train_begin, then on_log with each row metrics.jsonl gets
    (as the run writes it: a thread reads the new lines), then on_train_end."""

    def __init__(self, trainer: GRPOTrainer):
        self.t = trainer
        self.path = trainer.run_dir / "metrics.jsonl"
        self.stopping = threading.Event()
        self.offset = 0
        self.thread = threading.Thread(target=self._loop, name="rayward-callbacks", daemon=True)

    def _each(self, event: str, **kw: Any) -> None:
        for cb in self.t.callbacks:
            fn = getattr(cb, event, None)
            if fn is not None:
                fn(self.t.args, self.t.state, self.t.control, **kw)

    def start(self) -> None:
        self.offset = self.path.stat().st_size if self.path.exists() else 0  # a resumed run's old rows: not new
        self._each("on_train_begin")
        self.thread.start()

    def _read(self) -> None:
        if not self.path.exists():
            return
        with open(self.path) as f:
            f.seek(self.offset)
            for line in f:
                if not line.endswith("\n"):
                    break
                self.offset += len(line.encode())
                row = trl_row(json.loads(line))
                self.t.state.global_step = int(row.get("step", self.t.state.global_step))
                self.t.state.log_history.append(row)
                self._each("on_log", logs=row)

    def _loop(self) -> None:
        while not self.stopping.wait(CALLBACK_POLL_S):
            self._read()

    def stop(self, closing: dict[str, Any] | None = None) -> None:
        """The last rows read; then the closing row logged (a finished train()), and on_train_end."""
        self.stopping.set()
        self.thread.join()
        self._read()
        if closing is not None:
            self._each("on_log", logs=closing)
        self._each("on_train_end")
