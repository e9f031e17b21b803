"""A run's life, from the config to the last checkpoint.

    train.py       `train(cfg)`: check, start or join Ray, build, resume, parity check, the supervised loop, teardown
    evaluate.py    `evaluate(cfg, checkpoint)`: `rayward eval`, an eval-only run built as a run is
    build/         the build: cheap checks before Ray, the actor groups, the assembled `Run`
    agents.py      tools, environments and agent functions checked before Ray starts (`AgentSetup`)
    state.py       `Run` (the built run's groups and choices), `Progress`, `FaultLog`
    groups.py      the groups a run holds as Protocols: what the driver calls (real groups and tests' fakes)
    cluster.py     starting or joining Ray, run names and namespaces, actor options
    checkpoints.py the run directory's checkpoints: what they hold, when they are written, what resumes
    signals.py     SIGTERM and Ctrl-C: stop at the step boundary with a checkpoint
    supervisor.py  the loop inside a recovery loop: a lost learner rebuilt and rewound
    watchdog.py    preemption notices and hang pings
    errors.py      a failed run as one short block
"""
