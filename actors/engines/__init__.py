"""Second models on vLLM engines of their own.

    base.py     `EngineModel`: a model on one engine of its own, fed by an EngineLoop
    judge.py    `JudgeEngine`: an LLM judge (a prompt template over the sample; text scored by regex or labels)
    teacher.py  `TeacherEngine`: a distillation teacher (log-probs of the student's tokens)
    pool.py     `EnginePool` as `JudgePool` and `TeacherPool`: least-loaded routing, replacement, scaling
"""
