"""rayward's Python API for TRL users: `from rayward import GRPOConfig, GRPOTrainer` in place of TRL's import
runs the script's GRPO training on Ray (orchestrator/trl/trainer.py). GRPOConfig is TRL's class without the
checks of the driver's devices (orchestrator/trl/grpo_config.py): the driver does not train."""

from orchestrator.trl.grpo_config import GRPOConfig
from orchestrator.trl.trainer import GRPOTrainer

__all__ = ["GRPOConfig", "GRPOTrainer"]
