"""An error in one line, for the messages that name a failure (a weight sync, a checkpoint that does not load):
the innermost error (a Ray task error unwrapped to what the actor raised), its type and its message's first line
(the summary; what follows is a traceback, C++ frames or details)."""

from __future__ import annotations


def one_line(err: BaseException) -> str:
    """`Type: first line of the message` of the innermost error (Ray's task errors carry it as `cause`)."""
    seen: set[int] = set()
    while getattr(err, "cause", None) is not None and id(err) not in seen:  # a task error, maybe nested
        seen.add(id(err))
        err = err.cause
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return f"{type(err).__name__}: {lines[0]}" if lines else type(err).__name__
