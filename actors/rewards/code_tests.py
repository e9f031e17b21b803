"""Built-in code rewards: `code_tests` runs the completion's program against the sample's tests in a local
sandbox (actors/rewards/sandbox/) and scores the fraction passed; `fenced_python_format` checks the
answer's format. Both have TRL's reward-function signature.

Dataset columns (per sample):
    tests       list of Python statements, usually `assert f(2) == 4`; each one is a test
    test_cases  optional list of {"input": stdin text, "output": expected stdout} (or APPS-style
                {"inputs": [...], "outputs": [...]}); each pair is a test, run as a script

The program is the completion's last ```python (or ```py / ```python3) fenced block: reasoning models
write drafts and examples before their final answer, and TRL's and open-r1's code rewards take the last
block too. A block cut off by the length limit (no closing fence) still counts. With no fenced block, the
whole completion is the program.

Score: tests passed / tests in [0, 1]; 0.0 when there is no code, a syntax error, an exception at import
time, a timeout, a crash or an output flood (partial results of a run that did not finish are not kept:
hanging on one test must not pay).

How asserts are checked (the program is untrusted and runs in the same process as the checks):
  * The program is executed as a module named `solution`, so an `if __name__ == "__main__":` demo block,
    which may wait for input, does not run; then each test runs in its own try/except.
  * Results go out on fd 3 as `<nonce> <index> pass|fail` lines, then `<nonce> done`. The nonce (128 random
    bits) and the tests arrive on fd 4, read and closed before the program is loaded: they are in no file,
    argument or environment variable the program could read, and printing cannot fake a result. A line
    without the nonce, a repeated index or a missing `done` scores the run 0.
  * Tests see the program's names except those shadowing builtins, with a private copy of the builtins,
    so a program cannot make `sorted` or `len` inside a test lie by rebinding them.
  What this cannot stop: a program written against this harness that digs the nonce out of interpreter
  memory, or returns an object whose `__eq__` always says True; a test's own expression decides that.

Limits are set per reward through `rewards[].kwargs`: with kwargs, the built-in name `code_tests` stands
for its factory `make_code_tests(**kwargs)` (actors/rewards/builtin.py), which builds a `CodeTestsReward`
from the sandbox `Limits` fields and `max_concurrency` named there:

    - name: tests
      function: code_tests            # or actors.rewards.code_tests:make_code_tests
      kwargs: {timeout_s: 5, memory_mb: 512, max_concurrency: 4}

In Python, `CodeTestsReward(Limits(...), max_concurrency)` builds one directly.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import secrets
import textwrap
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import fields
from typing import Any

from actors.rewards.sandbox import (
    Limits,
    SandboxResult,
    run_sandboxed,
    sandbox_python,
    warn_missing_protections,
)

# ```python / ```py / ```python3 fences, closed or (last one) cut off by the length limit.
_FENCE = re.compile(r"```[ \t]*(?:python3?|py)[ \t]*\r?\n(.*?)(?:```|\Z)", re.DOTALL | re.IGNORECASE)
_CLOSED_FENCE = re.compile(r"```[ \t]*(?:python3?|py)[ \t]*\r?\n.*?```", re.DOTALL | re.IGNORECASE)
SOLUTION_FILE = "solution.py"
NONCE_BYTES = 16  # 128 bits: not guessable within a run's time


def completion_text(completion: Any) -> str:
    """Plain text of a completion: a string, or TRL's conversational [{"role": "assistant", "content": ...}]."""
    if isinstance(completion, list):
        return "".join(str(m.get("content") or "") for m in completion if isinstance(m, dict))
    if isinstance(completion, dict):
        return str(completion.get("content") or "")
    return "" if completion is None else str(completion)


def extract_code(text: str) -> str:
    """The program in a completion: its last ```python block, else the whole text (see module docstring)."""
    blocks = _FENCE.findall(text)
    return blocks[-1] if blocks else text


def fenced_python_format(completions: list[Any], **kwargs: Any) -> list[float]:
    """1.0 where the completion contains a closed ```python fenced block, else 0.0."""
    return [1.0 if _CLOSED_FENCE.search(completion_text(c)) else 0.0 for c in completions]


# --------------------------------------------------------------------------------------------------------
# The runner: executed inside the sandbox by the sandbox's Python (any 3.8+; no annotations evaluated), as
# `-c` text. It loads solution.py as module `solution`, runs each test, reports on fd 3.


def _runner() -> None:
    import builtins
    import marshal
    import os

    write, exec_, compile_ = os.write, exec, compile  # bound now: the program may rebind the originals
    secret = b""
    while True:  # fd 4: nonce line, then the marshalled tests; closed before the program runs
        chunk = os.read(4, 1 << 16)
        if not chunk:
            break
        secret += chunk
    os.close(4)
    nonce, _, payload = secret.partition(b"\n")
    tests = marshal.loads(payload)
    del secret, payload
    pristine = dict(builtins.__dict__)
    ns = {"__name__": "solution", "__file__": "solution.py", "__builtins__": builtins}
    try:
        with open("solution.py", "rb") as f:
            code = compile_(f.read(), "solution.py", "exec")
        exec_(code, ns)
    except BaseException as err:  # noqa: BLE001 - SystemExit too: an import-time exit is a failed load
        os.write(2, f"solution failed to load: {type(err).__name__}: {err}\n".encode())
        write(3, nonce + b" load-error\n")
        os._exit(0)
    test_ns = {k: v for k, v in ns.items() if k not in pristine}
    test_ns["__builtins__"] = pristine
    for i, test in enumerate(tests):
        try:
            exec_(compile_(test, f"<test {i}>", "exec"), dict(test_ns))
            ok = True
        except BaseException:  # noqa: BLE001 - any exception (or exit) inside a test fails that test
            ok = False
        write(3, b"%s %d %s\n" % (nonce, i, b"pass" if ok else b"fail"))
    write(3, nonce + b" done\n")
    os._exit(0)  # now: no atexit handlers or lingering threads of the program run after the verdict


_RUNNER_SOURCE = textwrap.dedent(inspect.getsource(_runner)) + "\n_runner()\n"


def _count_passed(report: bytes, nonce: bytes, n_tests: int) -> int:
    """Tests passed according to the runner's report, or 0 if it is incomplete or tampered with."""
    passed: set[int] = set()
    seen: set[int] = set()
    done = False
    for line in report.split(b"\n"):
        if not line:
            continue
        head, _, rest = line.partition(b" ")
        if head != nonce or done:
            return 0  # not written by the runner, or written after its last word
        if rest == b"done":
            done = True
            continue
        if rest == b"load-error":
            return 0
        idx, _, verdict = rest.partition(b" ")
        try:
            i = int(idx)
        except ValueError:
            return 0
        if not 0 <= i < n_tests or i in seen or verdict not in (b"pass", b"fail"):
            return 0
        seen.add(i)
        if verdict == b"pass":
            passed.add(i)
    return len(passed) if done and len(seen) == n_tests else 0


def _normalize_output(text: str) -> str:
    """Stdout compared line by line, ignoring trailing spaces and leading/trailing blank lines."""
    return "\n".join(line.rstrip() for line in text.strip("\n").splitlines()).strip("\n")


def _as_tests(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):  # a column stored as JSON text, or a single test
        stripped = value.strip()
        if stripped.startswith("["):
            return [str(t) for t in json.loads(stripped)]
        return [value] if stripped else []
    return [str(t) for t in value]


def _as_cases(value: Any) -> list[tuple[str, str]]:
    if value is None:
        return []
    if isinstance(value, str):
        value = json.loads(value) if value.strip() else []
    if isinstance(value, dict):  # APPS style: {"inputs": [...], "outputs": [...]}
        return [(str(i), str(o)) for i, o in zip(value.get("inputs", []), value.get("outputs", []), strict=True)]
    return [(str(c.get("input", "")), str(c.get("output", ""))) for c in value]


class CodeTestsReward:
    """The `code_tests` reward with its own sandbox limits (per program run) and concurrency bound.

    max_concurrency: sandboxed programs running at once in this worker process (default: its CPU count).
    A per-completion call can wait for a slot, so keep the reward's `timeout_s` in the run config above
    (samples per chunk / max_concurrency + 1) * limits.timeout_s, or lower the chunk size.
    """

    def __init__(self, limits: Limits | None = None, max_concurrency: int | None = None):
        if max_concurrency is None:
            max_concurrency = len(os.sched_getaffinity(0))
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        self.limits = limits or Limits()
        self.max_concurrency = max_concurrency
        # One semaphore per reward, shared by every thread of the worker process that calls it: rayward
        # calls sync rewards from a thread pool, one call per completion, so without it a 64-sample chunk
        # would start 64 interpreters at once.
        self._slots = threading.BoundedSemaphore(max_concurrency)
        self.__name__ = "code_tests"
        # Start-up: find an interpreter that runs in the sandbox (raises if none) and say plainly which
        # protections this machine lacks; never a silent downgrade.
        self.python = sandbox_python(self.limits)
        self.missing_protections = warn_missing_protections(self.limits)

    def __repr__(self) -> str:
        return f"CodeTestsReward({self.limits}, max_concurrency={self.max_concurrency})"

    def __call__(
        self,
        prompts: list[Any] | None = None,
        completions: list[Any] | None = None,
        tests: Sequence[Any] | None = None,
        test_cases: Sequence[Any] | None = None,
        **kwargs: Any,
    ) -> list[float]:
        completions = list(completions or [])
        n = len(completions)
        tests_col = list(tests) if tests is not None else [None] * n
        cases_col = list(test_cases) if test_cases is not None else [None] * n
        if len(tests_col) != n or len(cases_col) != n:
            raise ValueError(f"code_tests: {n} completions but {len(tests_col)} tests / {len(cases_col)} test_cases")
        if tests is None and test_cases is None:
            raise ValueError("code_tests needs a `tests` (asserts) or `test_cases` (stdin/stdout) dataset column")
        jobs = [(completion_text(c), _as_tests(t), _as_cases(tc))
                for c, t, tc in zip(completions, tests_col, cases_col, strict=True)]
        for i, (_, t, tc) in enumerate(jobs):
            if not t and not tc:
                raise ValueError(f"code_tests: sample {i} has no tests and no test_cases")
        if n <= 1:
            return [self.score(*job) for job in jobs]
        # A batched call (a group): its samples share the reward's concurrency bound.
        with ThreadPoolExecutor(max_workers=min(n, self.max_concurrency)) as pool:
            return list(pool.map(lambda job: self.score(*job), jobs))

    def score(self, text: str, tests: list[str], cases: list[tuple[str, str]]) -> float:
        """Fraction of `tests` + `cases` the completion's program passes."""
        code = extract_code(text)
        if not code.strip():
            return 0.0
        passed = 0
        if tests:
            passed += self._run_asserts(code, tests)
        for stdin, expected in cases:
            result = self._sandboxed({SOLUTION_FILE: code}, stdin=stdin, argv=[self.python, "-s", "-B", SOLUTION_FILE])
            if result.ok and _normalize_output(result.stdout) == _normalize_output(expected):
                passed += 1
        return passed / (len(tests) + len(cases))

    def _run_asserts(self, code: str, tests: list[str]) -> int:
        import marshal

        nonce = secrets.token_hex(NONCE_BYTES).encode()
        result = self._sandboxed(
            {SOLUTION_FILE: code},
            argv=[self.python, "-s", "-B", "-c", _RUNNER_SOURCE],
            secret=nonce + b"\n" + marshal.dumps(tests, 4),  # version 4: readable by any Python 3.8+
        )
        if result.timed_out or result.output_limited or result.error:
            return 0
        return _count_passed(result.report, nonce, len(tests))

    def _sandboxed(self, files: dict[str, str], **kwargs: Any) -> SandboxResult:
        with self._slots:
            return run_sandboxed(files, limits=self.limits, **kwargs)


LIMIT_NAMES = tuple(f.name for f in fields(Limits))


def make_code_tests(max_concurrency: int | None = None, **limits: Any) -> CodeTestsReward:
    """What `function: code_tests` with `kwargs` in a run config builds: a CodeTestsReward whose sandbox
    Limits are the kwargs named after Limits fields (timeout_s, memory_mb, ...), with `max_concurrency`.
    An unknown name is a TypeError naming it (a typo fails at start-up, not as a silent default)."""
    unknown = sorted(set(limits) - set(LIMIT_NAMES))
    if unknown:
        raise TypeError(f"code_tests: unknown kwargs {unknown}; sandbox limits are {list(LIMIT_NAMES)}, "
                        "plus max_concurrency")
    if "hide_paths" in limits:  # a YAML list
        limits["hide_paths"] = tuple(limits["hide_paths"])
    return CodeTestsReward(Limits(**limits), max_concurrency)


_default: CodeTestsReward | None = None
_default_lock = threading.Lock()


def code_tests(
    prompts: list[Any],
    completions: list[Any],
    tests: Sequence[Any] | None = None,
    test_cases: Sequence[Any] | None = None,
    **kwargs: Any,
) -> list[float]:
    """Fraction of the sample's tests its completion's program passes, with the default limits (see the
    module docstring; `make_code_tests` builds one with other limits)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = CodeTestsReward()
    return _default(prompts=prompts, completions=completions, tests=tests, test_cases=test_cases, **kwargs)
