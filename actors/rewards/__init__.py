"""Scoring: the reward pool and its workers.

    pool.py        `RewardPool`: chunks batches over workers, scales, retries
    stages.py      the pool's stages beside the workers: `JudgeStage` (judge pools, lazy gates), `TeacherStage`
    worker.py      `RewardWorker`: calls reward functions TRL's way, with time bounds and error policy
    builtin.py     built-in reward functions by name (`rayward rewards`)
    code_tests.py  the `code_tests` reward: the completion's program against the sample's tests
    sandbox/       the sandbox for model-written programs
"""
