"""How a run stops on a signal, however the signal arrives.

    SIGTERM  `rayward stop`, `ray job stop`, `kill`, `timeout`, SLURM's time limit or preemption, Kubernetes
    SIGINT   Ctrl-C in a terminal

While the run starts, either ends it at once (RunStopped; a Ctrl-C: KeyboardInterrupt). Once the loop runs, the
first one asks it to stop at the next step boundary: the step in progress is trained and logged, a checkpoint
is written, and the run ends with RunStopped (exit 143 for SIGTERM, 130 for Ctrl-C). A second Ctrl-C quits at
once, without a checkpoint (KeyboardInterrupt); a second SIGTERM changes nothing (the run is already stopping).

`timeout` signals its whole process group, a terminal's Ctrl-C the foreground process group, and SLURM every
process of the job. An embedded Ray cluster's processes (GCS, raylet, the actors' workers: the learner, whose
weights the checkpoint needs) are the driver's children, so they would get the same signal and die before the
driver could checkpoint. So the driver starts them with SIGTERM and SIGINT blocked (`starting_ray`: children
inherit the signal mask; Ray itself already blocks SIGINT in them): only the driver acts on a signal, and they
end when it tears the cluster down, or with it (Ray's kernel fate-sharing) if it is killed.

Only the main thread can install handlers; elsewhere (a notebook's worker thread) nothing changes.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

from orchestrator.run.errors import SIGNAL_WORDS, RunStopped

# The signals a run stops on, by the name RunStopped and the CLI's exit code (128 + number) use.
HANDLED = {signal.SIGTERM: "SIGTERM", signal.SIGINT: "SIGINT"}


class Signals:
    """A run's signal handling (module docstring): installed when the run starts, `looping` once the loop runs,
    `restore`d at its end."""

    def __init__(self, name: str, say: Callable[[str], None]):
        self.name, self.say = name, say
        self.on_stop: Callable[[], None] | None = None  # the loop's stop request (set with `looping`)
        self.received: str | None = None  # the first signal's name
        self.main = threading.current_thread() is threading.main_thread()
        self.previous: dict[int, Any] = {s: signal.getsignal(s) for s in HANDLED} if self.main else {}
        self.previous_unraisable = sys.unraisablehook if self.main else None
        if self.main:
            sys.unraisablehook = self._unraisable
        self.install()

    def install(self) -> None:
        if self.previous:
            for s in HANDLED:
                signal.signal(s, self._on_signal)

    def looping(self, on_stop: Callable[[], None]) -> None:
        """The loop runs: from now on a signal asks it to stop at the next step boundary (`on_stop`)."""
        self.on_stop = on_stop
        if self.received is not None:  # one that arrived between the last check and now
            on_stop()

    def _on_signal(self, signum: int, frame: Any) -> None:
        name = HANDLED[signum]
        first = self.received is None
        if first:
            self.received = name
        if self.on_stop is None:  # starting: raised wherever the start is (C code may turn it into a SystemError,
            if signum == signal.SIGINT:  # and ray.init's fork hooks drop it: `check` raises it again)
                raise KeyboardInterrupt
            raise RunStopped(self.name, None, None, name)
        if signum == signal.SIGINT and not first:
            raise KeyboardInterrupt  # the second Ctrl-C: quit now
        if first:
            self.on_stop()
            then = " (Ctrl-C again quits at once, without one)" if signum == signal.SIGINT else ""
            # Said from a thread: printing inside a signal handler can re-enter the interrupted print.
            threading.Thread(target=self.say, daemon=True, args=(
                f"rayward: {SIGNAL_WORDS[name]}: stopping at the end of this step, with a checkpoint{then}",)).start()

    def check(self) -> None:
        """Between start-up stages: a signal whose exception something swallowed still stops the run."""
        if self.received is not None:
            raise self.interrupted()

    def interrupted(self) -> BaseException:
        """What a signal received while the run starts ends it with: KeyboardInterrupt for Ctrl-C, else
        RunStopped (nothing trained, nothing to checkpoint)."""
        if self.received == "SIGINT":
            return KeyboardInterrupt()
        return RunStopped(self.name, None, None, self.received or "SIGTERM")

    def stopped(self, step: int | None, checkpoint: Any) -> RunStopped:
        """The error a run stopped by the signal ends with."""
        return RunStopped(self.name, step, checkpoint, self.received or "SIGTERM")

    def _unraisable(self, unraisable: Any) -> None:
        """Where Python drops an exception (a finalizer, a fork hook) it prints a traceback; a dropped RunStopped
        or KeyboardInterrupt is already recorded (`received`, then `check`), so it prints nothing."""
        if isinstance(unraisable.exc_value, (RunStopped, KeyboardInterrupt)):
            return
        if self.previous_unraisable is not None:
            self.previous_unraisable(unraisable)

    @contextlib.contextmanager
    def starting_ray(self) -> Iterator[None]:
        """Around ray.init of an embedded cluster: the processes it starts inherit SIGTERM and SIGINT blocked (the
        module docstring), and ray.init installs no SIGTERM handler of its own (sys.exit(15), which could be
        dropped inside a fork hook while Ray spawns its processes, and the run trained on). A signal for the
        driver meanwhile is handled when the block ends (`check` then stops the start)."""
        from actors.runtime.ray_compat import ray_init_keeps_sigterm

        if not self.main:
            yield
            return
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, set(HANDLED))
        try:
            with ray_init_keeps_sigterm():
                yield
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)

    def restore(self) -> None:
        for s, handler in self.previous.items():
            signal.signal(s, handler)
        self.previous = {}
        if self.previous_unraisable is not None:
            sys.unraisablehook = self.previous_unraisable
            self.previous_unraisable = None
