"""The driver's watchdog: a thread that, every WATCH_PERIOD_S, looks for what no call of the loop would notice.

- Preemption notices. A node the cluster drains (`ray drain-node --reason DRAIN_NODE_REASON_PREEMPTION`, a
  cloud's spot notice through the autoscaler) is listed by Ray's `get_draining_nodes` with its deadline. When a
  learner rank is on one, the watchdog sets `progress.move_learner`: the loop checkpoints at its next step
  boundary and the supervisor moves the learner (orchestrator/run/supervisor.py), before the deadline if the step
  ends in time. Generators and reward workers on the node are replaced when it goes (Ray restarts generators,
  the reward pool replaces workers).
- Hangs. Every generator and learner rank that Ray reports ALIVE gets a `ping` in its health concurrency group
  (actors/runtime/group.py HEALTH_GROUP), which answers while the actor computes. One unanswered after
  cluster.hang_timeout_s is stopped or wedged: it is killed, named in one line and in faults.jsonl. A generator
  comes back as after a crash (Ray restarts it; the loop's call on it fails and the generator recovery runs);
  a learner rank's death ends the loop's call on it and the supervisor rebuilds the learner. Reward workers are
  the reward pool's: a chunk that takes its rewards' timeout plus cluster.hang_timeout_s gets its worker
  replaced (actors/rewards/pool.py).

The watchdog sees the actors through their groups' `members()` (actors/runtime/group.py Member: name, id, the GCS's
record, ping, kill), never their handles; it reads the groups anew at each check (the supervisor may replace the learner
group meanwhile) and kills actors; what follows a kill is the loop's and the supervisor's. Of the run's progress
it writes `move_learner` alone, from its own thread.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from actors.runtime import ray_compat
from actors.runtime.group import Member, Pending
from orchestrator.run.state import Run

# How often the watchdog looks (Ray Train polls worker health every 2 s and drain state every 5 s): well inside a
# preemption notice (GKE gives about 30 s) and far below any sane hang timeout.
WATCH_PERIOD_S = 2.0


@dataclass
class _Ping:
    sent: float  # time.monotonic() when sent
    pending: Pending[None]


class Watchdog:
    """See the module docstring. `start()` once the run is built, `stop()` when it ends."""

    def __init__(self, run: Run, period_s: float = WATCH_PERIOD_S):
        self.run, self.period_s = run, period_s
        self._pings: dict[str, _Ping] = {}  # by Member.id
        self._hung_learner: str | None = None
        self._noticed: set[str] = set()  # learner ranks (Member.id) already moved for a drain: one notice each
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="rayward-watchdog", daemon=True)
        self._failing = False  # a check raised: said once, until one succeeds

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.period_s + 5)

    def hung_learner(self) -> str | None:
        """If the watchdog killed a learner rank for not answering: what it said (once; then None)."""
        out, self._hung_learner = self._hung_learner, None
        return out

    def _watch(self) -> None:
        while not self._stopped.wait(self.period_s):
            try:
                self.check()
                self._failing = False
            except Exception as err:  # noqa: BLE001 - a GCS hiccup must not end the watch
                if not self._failing:
                    self._failing = True
                    self.run.display.message(f"rayward: watchdog check failed ({type(err).__name__}: {err}); "
                                             "retrying")

    def check(self) -> None:
        """One look: preemption notices, then hangs."""
        self.check_drains()
        self.check_hangs()

    # --- preemption notices -----------------------------------------------------------------------------------

    def check_drains(self) -> None:
        progress = self.run.progress
        draining = ray_compat.draining_nodes()  # {node id: deadline in ms since the epoch, 0 = none}
        if not draining or progress.move_learner is not None:
            return
        ranks = self.run.learner.members()
        for rank in ranks:
            node = rank.info().get("Address", {}).get("NodeID")
            # A rank already noticed is on its way out: the group that replaces it has new ranks.
            if node not in draining or rank.id in self._noticed:
                continue
            self._noticed.update(r.id for r in ranks)
            name = rank.name
            left = draining[node] / 1000 - time.time() if draining[node] else None
            when = f"deadline in {left:.0f} s" if left is not None else "no deadline given"
            self.run.faults.record(
                "preemption_notice",
                f"{name}'s node {node[:12]} is being drained ({when}): the learner checkpoints at the next step "
                "boundary and moves",
                node=node, deadline_s=left, step=progress.global_step,
            )
            progress.move_learner = f"{name}'s node {node[:12]} was drained (preemption)"
            return

    # --- hangs ----------------------------------------------------------------------------------------------

    def check_hangs(self) -> None:
        timeout, now = self.run.cfg.cluster.hang_timeout_s, time.monotonic()
        # each member, and whether it is a learner rank (its kill ends the loop's call: the learner is rebuilt)
        members: dict[str, tuple[Member, bool]] = {m.id: (m, False) for m in self.run.generators.members()}
        members.update({m.id: (m, True) for m in self.run.learner.members()})
        for gone in set(self._pings) - set(members):  # a replaced learner's ranks
            del self._pings[gone]
        for key, (m, learner) in members.items():
            ping = self._pings.get(key)
            if ping is not None and ping.pending.done():  # answered, or failed: its death is the loop's to see
                del self._pings[key]
                ping = None
            if ping is None:
                if m.info().get("State") == "ALIVE":  # not one that is starting or restarting
                    self._pings[key] = _Ping(now, m.ping())
                continue
            if now - ping.sent < timeout:
                continue
            del self._pings[key]
            if m.info().get("State") != "ALIVE":  # it died or restarts meanwhile: not a hang
                continue
            hung = f"{m.name} did not answer within {timeout:.0f} s (hung)"
            m.kill()
            if learner:
                self._hung_learner = hung
            then = "the learner is rebuilt" if learner else "Ray restarts it"
            self.run.faults.record("hung_killed", f"{hung}: killed; {then}", actor=m.name,
                                   step=self.run.progress.global_step)
