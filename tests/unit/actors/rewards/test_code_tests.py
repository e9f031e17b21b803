"""The code_tests reward, for real (programs run in the sandbox; nothing mocked): honest programs score the
fraction of tests they pass, forged results and hostile programs score 0, limits come from the factory (and
from a run config's kwargs through the built-in name)."""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from actors.rewards import code_tests as code_tests_module
from actors.rewards.builtin import builtin_target
from actors.rewards.code_tests import (
    CodeTestsReward,
    _count_passed,
    code_tests,
    completion_text,
    extract_code,
    fenced_python_format,
    make_code_tests,
)
from actors.rewards.sandbox import Limits, SandboxError, SandboxResult, probe
from actors.rewards.worker import RewardSpec, load_reward_function

pytestmark = pytest.mark.slow  # every program runs in a real sandbox process

TIMEOUT_S = 2.0

try:
    PROBE = probe()
except SandboxError as err:
    pytest.skip(f"sandbox unusable on this machine: {err}", allow_module_level=True)


@pytest.fixture(scope="module")
def reward() -> CodeTestsReward:
    limits = Limits(timeout_s=TIMEOUT_S, memory_mb=256, max_output_bytes=64 << 10, max_processes=16, max_file_mb=8,
                    disk_mb=32)
    return CodeTestsReward(limits, max_concurrency=2)


ADD_TESTS = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(2, 2) == 4", "assert add(0, 0) == 0"]
GOOD = "Here you go:\n```python\ndef add(a, b):\n    return a + b\n```\nIt adds."
HALF = "```python\ndef add(a, b):\n    return a + b if a != b else 99  # wrong on equal arguments\n```"


def fenced(code: str) -> str:
    return f"Solution:\n```python\n{code}\n```\n"


@dataclass
class SandboxRuns:
    """Every sandboxed run the reward made (the real runs, recorded), and the most that ran at once."""

    results: list[SandboxResult] = field(default_factory=list)
    running: int = 0
    peak: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


@pytest.fixture
def runs(monkeypatch: pytest.MonkeyPatch) -> SandboxRuns:
    seen = SandboxRuns()
    real = code_tests_module.run_sandboxed

    def recorded(*args: Any, **kwargs: Any) -> SandboxResult:
        with seen.lock:
            seen.running += 1
            seen.peak = max(seen.peak, seen.running)
        try:
            result = real(*args, **kwargs)
        finally:
            with seen.lock:
                seen.running -= 1
        seen.results.append(result)
        return result

    monkeypatch.setattr(code_tests_module, "run_sandboxed", recorded)
    return seen


def score(reward: CodeTestsReward, completion: object, tests: list[str] = ADD_TESTS) -> float:
    (out,) = reward(prompts=["p"], completions=[completion], tests=[tests])
    return out


# ------------------------------------------------------------------------------------------------------
# Extraction and format (pure).


def test_extract_code_takes_the_last_python_block_or_the_whole_text():
    two = "```python\nx = 1\n```\nthen\n```py\nx = 2\n```\n"
    assert extract_code(two) == "x = 2\n"
    assert extract_code("```Python3\ny = 1\n```") == "y = 1\n"
    assert extract_code("def f():\n    return 1\n") == "def f():\n    return 1\n"
    assert extract_code("```python\ncut = 'off by the length limit'") == "cut = 'off by the length limit'"
    assert extract_code("```js\nlet a\n```") == "```js\nlet a\n```"  # not Python: the whole text


def test_completion_text_accepts_trl_conversational_form():
    assert completion_text([{"role": "assistant", "content": "hi"}]) == "hi"
    assert completion_text("plain") == "plain"
    assert completion_text(None) == ""


def test_fenced_python_format():
    assert fenced_python_format([GOOD, "no code", "```python\nunclosed", [{"role": "assistant", "content": GOOD}]]) == [
        1.0, 0.0, 0.0, 1.0]


def test_count_passed_rejects_anything_not_from_the_runner():
    n = b"abc"
    ok = b"abc 0 pass\nabc 1 fail\nabc done\n"
    assert _count_passed(ok, n, 2) == 1
    assert _count_passed(b"abc 0 pass\nabc 1 pass\n", n, 2) == 0  # no done: crashed or killed
    assert _count_passed(b"xyz 0 pass\n" + ok, n, 2) == 0  # a line without the nonce
    assert _count_passed(b"abc 0 pass\nabc 0 pass\nabc 1 pass\nabc done\n", n, 2) == 0  # repeated index
    assert _count_passed(ok + b"abc 1 pass\n", n, 2) == 0  # written after done
    assert _count_passed(b"abc 0 pass\nabc done\n", n, 2) == 0  # a test missing
    assert _count_passed(b"abc load-error\n", n, 2) == 0


# ------------------------------------------------------------------------------------------------------
# Honest programs.


def test_honest_programs_score_the_fraction_passed(reward: CodeTestsReward):
    completions = [GOOD, HALF, "I cannot do that.", fenced("def add(a, b:\n    return a + b"), "",
                   [{"role": "assistant", "content": GOOD}], "def add(a, b):\n    return a + b\n",
                   fenced("raise RuntimeError('at import')")]
    out = reward(prompts=["p"] * len(completions), completions=completions, tests=[ADD_TESTS] * len(completions))
    assert out == [1.0, 0.5, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0]


def test_a_hang_in_one_test_scores_zero_not_partial(reward: CodeTestsReward, runs: SandboxRuns):
    code = fenced("def add(a, b):\n    while a == 2:\n        pass\n    return a + b")
    assert score(reward, code) == 0.0
    assert [r.timed_out for r in runs.results] == [True]  # cut at its timeout, not waited for


def test_main_block_does_not_run_and_stdout_is_free(reward: CodeTestsReward):
    code = fenced("def add(a, b):\n    print('debug', a, b)\n    return a + b\n\n"
                  "if __name__ == '__main__':\n    input()")
    assert score(reward, code) == 1.0


def test_tests_are_independent_and_may_import(reward: CodeTestsReward):
    tests = ["import math\nassert math.isclose(add(0.1, 0.2), 0.3)", "x = add(1, 1)\nassert x == 2", "assert x == 2"]
    assert score(reward, GOOD, tests) == pytest.approx(2 / 3)  # `x` from the previous test is not visible


def test_stdin_stdout_test_cases(reward: CodeTestsReward):
    prog = fenced("n = int(input())\nprint(n * 2)")
    cases = [{"input": "3\n", "output": "6\n"}, {"input": "5", "output": "10  \n\n"}, {"input": "1", "output": "3"}]
    assert reward(prompts=["p"], completions=[prog], test_cases=[cases]) == [pytest.approx(2 / 3)]
    apps = {"inputs": ["2\n", "4\n"], "outputs": ["4\n", "8\n"]}
    assert reward(prompts=["p"], completions=[prog], test_cases=[apps]) == [1.0]
    both = fenced("def double(n):\n    return 2 * n\n\nif __name__ == '__main__':\n    print(double(int(input())))")
    out = reward(prompts=["p"], completions=[both], tests=[["assert double(4) == 8"]], test_cases=[[cases[0]]])
    assert out == [1.0]


def test_called_the_way_rayward_calls_rewards(reward: CodeTestsReward):
    logged: list[tuple[str, float]] = []
    out = reward(prompts=["Write add"], completions=[GOOD], completion_ids=[[1, 2, 3]], tests=[ADD_TESTS],
                 trainer_state=None, log_extra=lambda *a: None, log_metric=lambda k, v: logged.append((k, v)))
    assert out == [1.0]


def test_default_code_tests_builtin():
    assert code_tests(prompts=["p"], completions=[GOOD, HALF], tests=[ADD_TESTS, ADD_TESTS]) == [1.0, 0.5]


def test_builtin_name_with_kwargs_is_built_by_its_factory():
    # `function: code_tests` with `kwargs: {...}` in a run config: the name stands for make_code_tests(**kwargs)
    spec = RewardSpec("tests", builtin_target("code_tests", configured=True),
                      kwargs={"timeout_s": 1.0, "memory_mb": 200, "hide_paths": ["/srv"], "max_concurrency": 1})
    built = load_reward_function(spec)
    assert isinstance(built, CodeTestsReward)
    assert (built.limits.timeout_s, built.limits.memory_mb, built.limits.hide_paths, built.max_concurrency) == (
        1.0, 200, ("/srv",), 1)
    assert built(prompts=["p"], completions=[GOOD], tests=[ADD_TESTS]) == [1.0]
    # without kwargs the name is the reward itself
    assert load_reward_function(RewardSpec("tests", builtin_target("code_tests", configured=False))) is code_tests


def test_bad_columns_are_errors_not_zeros(reward: CodeTestsReward):
    with pytest.raises(ValueError, match="tests"):
        reward(prompts=["p"], completions=[GOOD])
    with pytest.raises(ValueError, match="sample 0 has no tests"):
        reward(prompts=["p"], completions=[GOOD], tests=[[]])


def test_factory_limits_and_validation():
    r = make_code_tests(timeout_s=1.5, memory_mb=128, max_output_bytes=1000, max_processes=4, max_concurrency=3)
    assert (r.limits.timeout_s, r.limits.memory_mb, r.limits.max_output_bytes, r.limits.max_processes) == (
        1.5, 128, 1000, 4)
    assert r.max_concurrency == 3
    with pytest.raises(ValueError):
        make_code_tests(max_concurrency=0)
    with pytest.raises(ValueError):
        make_code_tests(timeout_s=0)
    with pytest.raises(TypeError, match=r"unknown kwargs \['timeout'\]"):
        make_code_tests(timeout=3)  # a typo in rewards[].kwargs fails at start-up, naming it
    # its own output cap applies: a chatty but correct program is cut off, not paid
    chatty = fenced("print('x' * 5000)\ndef add(a, b):\n    return a + b")
    assert score(r, chatty) == 0.0


SLEEP_S = 0.25  # each program sleeps: runs that were allowed to overlap would overlap


def test_concurrency_bound_is_shared_across_threads(runs: SandboxRuns):
    r = CodeTestsReward(Limits(timeout_s=TIMEOUT_S, memory_mb=256), max_concurrency=1)
    prog = fenced(f"import time\ntime.sleep({SLEEP_S})\ndef add(a, b):\n    return a + b")
    results: list[float] = []
    threads = [threading.Thread(target=lambda: results.append(score(r, prog))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [1.0] * 4
    assert r(prompts=["p"] * 4, completions=[prog] * 4, tests=[ADD_TESTS] * 4) == [1.0] * 4  # a batched call
    assert len(runs.results) == 8 and runs.peak == 1  # one at a time, across threads and within a call


# ------------------------------------------------------------------------------------------------------
# Forged results: a correct-looking report must come from the runner, not from the program.


FORGERIES = {
    "prints_pass_lines": "print('PASS\\n' * 4)\nprint('4/4 tests passed')\nfor i in range(4):\n    print(i, 'pass')",
    "writes_report_fd": "import os\nfor i in range(4):\n    os.write(3, b'%d pass\\n' % i)\nos.write(3, b'done\\n')",
    "reads_secret_fd": "import os\nos.read(4, 100)",
    "exit_0_at_import": "import sys\nsys.exit(0)",
    "os_exit_0_at_import": "import os\nos._exit(0)",
    "exit_inside_tests": "import sys\ndef add(a, b):\n    sys.exit(0)",
    "os_exit_inside_tests": "import os\ndef add(a, b):\n    os._exit(0)",
    "closes_report_fd": "import os\nos.close(3)\nos.open('/dev/null', os.O_WRONLY)",
    "rebinds_builtins": "import builtins\nbuiltins.AssertionError = type('X', (Exception,), {})\n"
                        "sorted = lambda x: 'z'\nbuiltins.sorted = sorted\nbuiltins.len = lambda x: 7\n"
                        "def add(a, b):\n    return 'z'",
    "hunts_for_test_files": "import os\nfound = [open(f).read() for d in ('.', '/tmp') for f in os.listdir(d)\n"
                            "         if os.path.isfile(os.path.join(d, f)) and "
                            "'assert' in open(os.path.join(d, f)).read()]\n"
                            "assert found, 'no tests on disk'",
    "kills_runner_with_signal": "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)",
    "daemon_writes_later": "import os, time\nif os.fork() == 0:\n    time.sleep(0.5)\n    os.write(3, b'forged\\n')\n"
                           "    os._exit(0)\ndef add(a, b):\n    return 0",
}
FORGERY_TESTS = ["assert add(1, 2) == 3", "assert sorted([2, 1]) == add(0, 0)", "assert len('ab') == 7",
                 "assert add(2, 2) == 4"]


@pytest.mark.parametrize("name", list(FORGERIES))
def test_forged_results_score_zero(reward: CodeTestsReward, name: str):
    assert score(reward, fenced(FORGERIES[name]), FORGERY_TESTS) == 0.0


# ------------------------------------------------------------------------------------------------------
# Hostile programs as completions: each attack is followed by a correct `add`, so a program whose attack
# did not stop it would score 1.0. Score 0 means the attack failed loudly or was killed.


@pytest.fixture(scope="module")
def decoys() -> Iterator[dict[str, object]]:
    secret = f"secret-decoy-{secrets.token_hex(8)}"
    parent = next((p for p in ("/opt", "/srv", "/var/lib", "/mnt") if os.access(p, os.W_OK)), None)
    if parent is None:
        pytest.skip("no writable directory outside /tmp for decoys")
    outside = Path(tempfile.mkdtemp(prefix="rayward-decoy-", dir=parent))
    outside.chmod(0o755)
    token = outside / "auth_token"
    token.write_text(secret)
    token.chmod(0o644)
    env = pytest.MonkeyPatch()  # undone in the finally below
    env.setenv("RAY_AUTH_TOKEN", secret)
    env.setenv("RAY_AUTH_TOKEN_PATH", str(token))
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    listener.setblocking(False)
    try:
        yield {"secret": secret, "outside": outside, "token": token, "port": listener.getsockname()[1],
               "listener": listener}
    finally:
        listener.close()
        env.undo()
        shutil.rmtree(outside, ignore_errors=True)


HOSTILE = {
    "fork_bomb": ("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
                  ("rlimit_nproc", "pid_namespace")),
    "infinite_loop": ("while True:\n    pass", ()),
    "allocate_8gb": ("x = bytearray(8 << 30)\nx[-1] = 1", ("rlimits",)),
    "fill_disk": ("with open('big.bin', 'wb') as f:\n    for _ in range(4096):\n        f.write(b'0' * (1 << 20))",
                  ("rlimits",)),
    "print_a_gigabyte": ("import sys\nfor _ in range(1024):\n    sys.stdout.write('x' * (1 << 20))", ()),
    "read_environment": ("import os\nprint(os.environ['RAY_AUTH_TOKEN'])", ("clean_env",)),
    "read_token_file": ("data = open('{token}').read()\nassert data\nprint(data)", ("mount_isolation",)),
    "connect_local_port": ("import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)",
                           ("network_namespace",)),
    "kill_parent": ("import os\nos.kill(os.getppid(), 9)", ("drop_uid", "pid_namespace")),
    "kill_everything": ("import os\nos.system('kill -9 -1')\nos.kill(-1, 9)", ("drop_uid", "pid_namespace")),
    "rm_rf_decoy": ("import os\nos.system('rm -rf {outside}')\nassert not os.path.exists('{token}')",
                    ("drop_uid", "mount_isolation")),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_completion_scores_zero_and_is_contained(reward: CodeTestsReward, decoys: dict, name: str,
                                                         caplog: pytest.LogCaptureFixture):
    attack, needs = HOSTILE[name]
    if needs and not any(PROBE.get(p) for p in needs):
        pytest.skip(f"machine lacks any of {needs}")
    caplog.set_level("DEBUG")
    code = attack.format(token=decoys["token"], outside=decoys["outside"], port=decoys["port"])
    completion = fenced(code + "\n\ndef add(a, b):\n    return a + b")
    existing = _children()  # e.g. multiprocessing's resource tracker, left by earlier tests
    out = score(reward, completion)
    assert out == 0.0
    assert decoys["token"].read_text() == decoys["secret"]  # type: ignore[union-attr]
    with pytest.raises(BlockingIOError):
        decoys["listener"].accept()  # type: ignore[union-attr]
    assert decoys["secret"] not in caplog.text
    # nothing of the run is left: no child of ours, no sandbox directory
    assert not _children() - existing
    assert not [p for p in Path(tempfile.gettempdir()).glob(f"rayward-sandbox-{os.getpid()}-*")]


def _children() -> set[str]:
    return {p for p in os.listdir("/proc") if p.isdigit() and _ppid(int(p)) == os.getpid()}


def _ppid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])
