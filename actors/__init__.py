"""The stages of the data path, as plain classes (testable without Ray); groups in runtime/ make them actors.
`actors/` never imports `orchestrator/`.

    types.py      the hand-off records: Sample, SampleInfo, GroupOut, Rollouts, RewardBatch, Scores, TrainBatch,
                  TrainResult, TrainerState
    payloads.py   the data plane: a group's tokens put in the object store by its generator, fetched by what
                  reads them (workers, judge and teacher stages, learner, completions writer), never the driver
    user_code.py  the one runner of user code: imports by `module:name`, calls within a deadline
    vision.py     images in prompts: decoding, a VLM's processor, placeholder expansion

    runtime/  generation/  agents/  envs/  rewards/  engines/  learner/  weights/
"""
