"""The GRPO maths, pure (torch and numbers; no Ray):

    grpo.py         group-normalized advantages and NaN-aware statistics (TRL's semantics)
    aggregation.py  raw scores -> rewards: schedules, gates, weights; advantages in one function
    selection.py    which scored groups train: all, or DAPO dynamic sampling with refills
"""
