"""The driver: what runs where, in which order. Folders by concern, along the data path:

    run/        a run's life: train, the build, checkpoints, signals, supervisor, watchdog, errors
    loop/       the loops and their phases            algo/       the GRPO maths (pure)
    eval/       held-out evaluation                   data/       prompts: datasets, shards, curriculum
    config/     the typed config tree                 trl/        TRL's GRPOTrainer as a rayward run
    builtin/    built-in tasks and tiny models        cli/        the `rayward` command
    telemetry/  metrics, progress, logs
"""
