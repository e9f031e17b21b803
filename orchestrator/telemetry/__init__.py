"""What a run tells: metric sinks, Ray metrics, the terminal, the actors' logs.

    metrics.py      phase timer, metric sinks (jsonl and the trackers), the completions log
    trackers.py     TensorBoard, W&B, MLflow, trackio: one tracker run across resumes (trackers.json)
    ray_metrics.py  the run's Ray (Prometheus) metrics
    progress.py     the live bar (or a line per step off a terminal) and the summary table
    actor_logs.py   the actors' output into `<run dir>/actors.log`; only rayward's own lines on the terminal
    tool_calls.py   a run whose tool calls mostly fail says so, with the most common error
    engines.py      the generators' engines per step: occupancy, busy share, tokens/s (their streams' counters)
"""
