"""`rayward plot RUN_DIR`: one PNG of a run from its metrics.jsonl (matplotlib, no display needed).

Four panels over optimizer steps: the weighted total reward, each reward function's raw mean and the eval reward
(`eval/reward`, where the run evaluated); phase times (`time/*`); KL to the reference (beta > 0); entropy.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.telemetry.metrics import METRICS_FILE, read_jsonl

# 10 x 7 inches at 80 dpi: 800 x 560 pixels, readable on a screen and small in a repository (~60 kB).
FIGSIZE = (10, 7)
DPI = 80
# Phases drawn in this order (the rest follow, sorted): the loop's own, then the learner's compute.
PHASE_ORDER = ("step", "generate", "wait_rollouts", "reward", "train", "sync", "train_compute")


def series(rows: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) where the key has a number (None / NaN / missing steps left out)."""
    xs, ys = [], []
    for r in rows:
        v = r.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v:
            xs.append(r["step"])
            ys.append(float(v))
    return xs, ys


def reward_keys(rows: list[dict[str, Any]]) -> list[str]:
    return sorted({k for r in rows for k in r if k.startswith("rewards/") and k.endswith("/mean")})


def phase_keys(rows: list[dict[str, Any]]) -> list[str]:
    found = {k[5:] for r in rows for k in r if k.startswith("time/")}
    ordered = [p for p in PHASE_ORDER if p in found] + sorted(found - set(PHASE_ORDER))
    return [f"time/{p}" for p in ordered]


def plot_run(run_dir: Path, out: str | Path | None = None) -> Path:
    """Write the PNG (default `<run dir>/plot.png`); returns its path."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on a cluster head or in CI
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    rows = read_jsonl(run_dir / METRICS_FILE)
    if not rows:
        raise ValueError(f"{run_dir / METRICS_FILE} has no steps yet")
    out = Path(out) if out is not None else run_dir / "plot.png"
    fig, axes = plt.subplots(2, 2, figsize=FIGSIZE, dpi=DPI, sharex=True)
    (ax_r, ax_t), (ax_kl, ax_h) = axes

    for k in reward_keys(rows):
        ax_r.plot(*series(rows, k), label=k.split("/")[1], linewidth=1.5)
    # dashed, on top: with one reward of weight 1 the total is that reward's line
    ax_r.plot(*series(rows, "reward"), "--", label="reward (weighted total)", linewidth=1.5, color="black")
    ex, ey = series(rows, "eval/reward")
    if ex:
        ax_r.plot(ex, ey, "o--", label="eval/reward", color="tab:red")
    ax_r.set_title("reward")
    ax_r.legend(fontsize=8)

    for k in phase_keys(rows):
        ax_t.plot(*series(rows, k), label=k[5:], linewidth=2 if k == "time/step" else 1)
    ax_t.set_title("phase times (s)")
    ax_t.legend(fontsize=8, ncol=2)

    for ax, key, empty in ((ax_kl, "kl", "no KL: grpo.beta = 0"), (ax_h, "entropy", "no entropy logged")):
        xs, ys = series(rows, key)
        if xs:
            ax.plot(xs, ys, color="tab:purple")
        else:
            ax.text(0.5, 0.5, empty, ha="center", va="center", transform=ax.transAxes, color="gray")
        ax.set_title(key)
        ax.set_xlabel("step")
    for ax in axes.flat:
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    # The metrics file holds a row per step and one per eval: the steps are the rows with a training reward.
    steps = len({r["step"] for r in rows if "reward" in r and "step" in r})
    fig.suptitle(f"rayward run {run_dir.name!r}: {steps} steps")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out
