"""`from rayward import GRPOTrainer`: TRL's trainer API as a rayward run.

    trainer.py   TRL's GRPOTrainer constructor and methods (functions by value, datasets saved, callbacks fed)
    args.py      every field of TRL's GRPOConfig: mapped to the config, ignored with a line, or refused by name
"""
