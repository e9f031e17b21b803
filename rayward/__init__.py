"""rayward's Python API for TRL users: `from rayward import GRPOConfig, GRPOTrainer` in place of TRL's import runs
the script's GRPO training on Ray (orchestrator/trl/trainer.py). GRPOConfig is TRL's own class."""

from trl import GRPOConfig

from orchestrator.trl.trainer import GRPOTrainer

__all__ = ["GRPOConfig", "GRPOTrainer"]
