"""The training loops: one call per phase on named groups.

    loops.py     `run_sync`, `run_pipelined`, `run_async`: one screen each
    phases.py    the phases every loop calls: generate, score, advantages, train, sync, log, finish
    inflight.py  pipelined bookkeeping: batches streaming from the generators into the reward pool
    feed.py      async bookkeeping: generators kept fed by small calls, batches taken from scored groups
    fleet.py     the generator fleet resized at a step boundary (`rayward scale --generators`)
    rollout.py   how samples are made, chosen at build: one-turn or agentic; the agentic step metrics
"""
