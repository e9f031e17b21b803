"""rayward.GRPOConfig (orchestrator/trl/grpo_config.py): TRL's GRPOConfig, every field's default and meaning
kept, that constructs where the driver has no GPU (a laptop, a CPU head node), as TRL's own does not."""

from __future__ import annotations

import dataclasses

import pytest

trl = pytest.importorskip("trl")

from orchestrator.trl import args as trl_args  # noqa: E402
from rayward import GRPOConfig  # noqa: E402


def gpu_less(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process as a machine without CUDA sees itself, whatever machine runs the test."""
    import torch
    import transformers.training_args as training_args

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    monkeypatch.setattr(training_args, "is_torch_bf16_gpu_available", lambda *a, **kw: False)
    monkeypatch.setattr(training_args, "is_torch_tf32_available", lambda: False)


def test_trls_defaults_construct_without_cuda(monkeypatch, tmp_path):
    gpu_less(monkeypatch)
    with pytest.raises(ValueError, match="doesn't support bf16/gpu"):  # what a TRL script meets on a laptop
        trl.GRPOConfig(output_dir=str(tmp_path))
    args = GRPOConfig(output_dir=str(tmp_path))
    assert isinstance(args, trl.GRPOConfig) and type(args).__name__ == "GRPOConfig"
    assert (args.bf16, args.use_cpu, args.tf32, str(args.device)) == (True, False, None, "cpu")
    # every other field as TRL's class has it, built the one way it constructs here (use_cpu, which also turns
    # pin_memory off)
    theirs = trl.GRPOConfig(output_dir=str(tmp_path), use_cpu=True)
    differ = {f.name for f in dataclasses.fields(args) if getattr(args, f.name) != getattr(theirs, f.name)}
    assert differ == {"use_cpu", "dataloader_pin_memory"}
    # bf16 maps as with TRL's class: the learner trains in the model's dtype; one line, the only one, says so
    assert [n.split(":")[0] for n in trl_args.check_fields(args)] == ["GRPOConfig.bf16/fp16"]
    tree = trl_args.run_tree(args, train_rows=4, has_eval=False, model_max_len=None)
    assert "dtype" not in tree["model"] and tree["grpo"]["max_steps"] == 3 * 4  # 3 epochs, 1 prompt a step


def test_only_the_device_checks_are_left_out(monkeypatch, tmp_path):
    gpu_less(monkeypatch)
    with pytest.raises(ValueError, match="--tf32 requires Ampere"):
        trl.GRPOConfig(output_dir=str(tmp_path), use_cpu=True, tf32=True)
    assert GRPOConfig(output_dir=str(tmp_path), tf32=True).tf32 is True  # the script's value, kept
    with pytest.raises(ValueError, match="At most one of fp16 and bf16"):
        GRPOConfig(output_dir=str(tmp_path), fp16=True, bf16=True)
    with pytest.raises(ValueError, match="at least 2 generations"):  # TRL's own checks run as they are
        GRPOConfig(output_dir=str(tmp_path), num_generations=1)


def test_trls_argument_parser_builds_it_as_it_builds_trls(monkeypatch, tmp_path):
    """Scripts built on TrlParser / HfArgumentParser((..., GRPOConfig)) parse the command line into it."""
    from transformers import HfArgumentParser

    gpu_less(monkeypatch)
    (args,) = HfArgumentParser(GRPOConfig).parse_args_into_dataclasses(
        ["--output_dir", str(tmp_path), "--learning_rate", "3e-6", "--report_to", "trackio"])
    assert isinstance(args, GRPOConfig) and (args.learning_rate, args.report_to, args.bf16) == (
        3e-6, ["trackio"], True)
