"""`from rayward import GRPOConfig, GRPOTrainer`: TRL's trainer API as a rayward run.

    trainer.py      TRL's GRPOTrainer constructor and methods (functions by value, datasets saved, callbacks)
    args.py         every field of TRL's GRPOConfig: mapped to the config, ignored with a line, or refused
    grpo_config.py  rayward.GRPOConfig: TRL's GRPOConfig that constructs on a driver without a GPU
"""
