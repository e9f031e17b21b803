"""The `rayward` command.

    main.py     the parser and the subcommands (run, eval, submit, scale, samples, plot, ...)
    retry.py    `--max-retries`: the driver as a child process, restarted with `--resume auto`
    jobs.py     the Ray Jobs client: submit, status, logs, stop, list
    auth.py     Ray token authentication, found in Ray's documented order
    samples.py  `rayward samples`: a step's completions as a table
    plot.py     `rayward plot`: a PNG of a run
"""
