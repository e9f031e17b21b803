"""The training loops: one call per phase on named groups.

    loops.py     `run_sync`, `run_pipelined`: one screen each
    phases.py    the phases both loops call: generate, score, advantages, train, sync, log, finish
    inflight.py  pipelined bookkeeping: batches streaming from the generators into the reward pool
    rollout.py   how samples are made, chosen at build: one-turn or agentic; the agentic step metrics
"""
