"""Held-out evaluation.

    evaluator.py  the evaluators the loops call (none, blocking, overlapped) and checkpoint-best
    metrics.py    pure: unbiased pass@k, the eval schedule, eval metrics, the best value so far
"""
