"""The generator fleet resized while the run trains (`rayward scale RUN --generators N`, issue 50).

The client leaves the size it wants in the run's control mailbox (`NAME/control`, actors/runtime/control.py); each
loop calls `rescale` once per step, after the step's weight sync, and the driver applies it there, between two
syncs:

- grow: retiring generators take work again first; then new engines start (the loop waits while they load their
  model), the weight-transfer group is re-formed with the new world size and every engine is brought the current
  weights, through the code that re-forms it after a restart (`WeightTransfer.rejoin`), before a new engine is
  given a prompt; with logging.check_logprob_parity the start's parity check runs again, over every engine (it
  waits for a slot on engines busy with generation calls). A cluster with no room for them says so in one line,
  and the run goes on at its size.
- shrink: the generators past the new size take no new work at once (`shards` and the async feed's choice of
  engine leave them out) and finish the calls they have; a generator leaves once none of its calls is running and
  every group it made is trained (its groups' token data live in its object store: killed earlier, they would be
  lost), and the weight group is re-formed without it. Nothing is handed back or drawn again: no prompt is lost,
  none trained twice.

`busy`: the members whose calls run, or whose groups are not trained yet (each loop knows its own bookkeeping).
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from orchestrator.run.state import Run

# How long the loop waits for new engines to load their model before it gives up on them (and says so): a fresh
# vLLM engine's start, as a restarted one's (orchestrator/loop/phases.py RESTART_WAIT_S).
GROW_TIMEOUT_S = 600.0


def rescale(run: Run, busy: Iterable[int]) -> None:
    """At a step boundary, after the step's sync: apply a scale request, and let retiring generators whose work is
    all trained leave (see the module docstring)."""
    gens = run.generators
    wanted = run.control.take_generators() if run.control is not None else None
    before = gens.active
    if wanted is not None and wanted > gens.active:
        _grow(run, wanted)
    elif wanted is not None and wanted < gens.active:
        leaving = ", ".join(gens.retire(wanted))
        run.display.message(f"rayward: generators: {before} -> {gens.active} ({leaving}: no new work; leaves once "
                            "its calls are done and its groups trained)")
    retiring = set(gens.retiring())
    if retiring and not retiring & set(busy):
        run.weights.drain()  # the sync in flight includes them: it lands first
        run.evaluate.drain()  # an eval submitted before the request may have shards on them
        run.completions.drain()  # the completions log reads their groups' text from their object stores
        gone = gens.drop_retired()
        run.weights.rejoin(run.progress.global_step)  # the weight group re-formed without them
        run.display.message(f"rayward: generators: {', '.join(gone)} left (every group it made is trained)")
    if run.control is not None and (wanted is not None or retiring):
        run.control.report(gens.active, len(gens.retiring()))


def _grow(run: Run, wanted: int) -> None:
    gens, before = run.generators, run.generators.active
    fresh = wanted - len(gens)
    if fresh > 0 and (why := gens.room(fresh)) is not None:
        run.display.message(f"rayward: generators: stays at {before}: {why}")
        wanted = len(gens)  # the retiring ones still take work again
        if wanted == before:
            return
    t0 = time.monotonic()
    run.weights.drain()  # the step's sync lands on the engines there are before the group is re-formed
    try:
        started = gens.grow(wanted, GROW_TIMEOUT_S, on_wait=lambda text: run.display.message(f"rayward: {text}"))
    except Exception as err:  # noqa: BLE001 - the run goes on at its size; the reason in one line
        run.display.message(f"rayward: generators: stays at {before}: {str(err).splitlines()[0]}")
        return
    parity = ""
    if started:  # a new engine holds the initial weights: the current ones before it is given a prompt
        run.weights.rejoin(run.progress.global_step)
        if run.parity is not None:  # that they landed: the start's check, over every engine, the new ones too
            parity = f"; logprob parity after sync: max abs diff {run.parity():.2e}"
    run.display.message(f"rayward: generators: {before} -> {gens.active}"
                        + (f" ({', '.join(started)} started and synced in {time.monotonic() - t0:.1f} s{parity})"
                           if started else ""))
