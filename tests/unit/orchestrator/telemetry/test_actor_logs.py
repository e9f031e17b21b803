"""Routing the actors' output: every line to actors.log, rayward's own messages (once) to the terminal."""

from __future__ import annotations

import logging

from actors.runtime import ray_compat
from orchestrator.telemetry.actor_logs import ActorOutput, rayward_messages

VLLM_NOISE = [
    "Triton is installed, but doesn't include CPU backend. Disabling Triton.",
    "[W1123 12:33:33.900906560 utils.cpp:68] Warning: NUMA binding: Using MEMBIND policy for memory allocation",
    "Loading safetensors checkpoint shards: 100% Completed | 1/1 [00:00<00:00, 362.95it/s]",
]
SANDBOX = [
    "rayward: code sandbox: this machine does not grant 1 protection(s) to sandboxed programs:",
    "  - drop_uid: programs run as a fresh unprivileged uid",
    "some other line",
]


def test_rayward_messages_take_their_indented_continuations():
    assert rayward_messages(VLLM_NOISE) == []
    assert rayward_messages(SANDBOX) == ["\n".join(SANDBOX[:2])]
    assert (rayward_messages(["\x1b[33mrayward: coloured\x1b[0m", "rayward: two"])
            == ["rayward: coloured", "rayward: two"])


def test_every_line_to_the_file_rayward_messages_once_to_the_terminal(tmp_path):
    shown: list[str] = []
    out = ActorOutput(tmp_path / "actors.log", echo=shown.append)
    out({"pid": 11, "actor_name": "Generator", "is_err": True, "lines": VLLM_NOISE})
    for pid in (21, 22):  # two reward workers warn the same
        out({"pid": pid, "actor_name": "RewardWorker", "is_err": True, "lines": SANDBOX})
    out({"pid": 12, "actor_name": "Learner", "is_err": True,
         "lines": ["\rWriting model shards:   0%|  | 0/1\rWriting model shards: 100%|##| 1/1\r"]})
    out({"pid": "autoscaler", "lines": ["======== Autoscaler status: 2026-11-23 ========", "Node status"]})
    out.close()
    out({"pid": 11, "actor_name": "Generator", "lines": ["after close"]})  # a late batch is dropped, not an error
    assert shown == ["\n".join(SANDBOX[:2])]
    text = (tmp_path / "actors.log").read_text().splitlines()
    assert text[0] == f"(Generator pid=11 stderr) {VLLM_NOISE[0]}"
    assert sum("NUMA binding" in x for x in text) == 1 and sum("code sandbox" in x for x in text) == 2
    assert text[-1] == "(Learner pid=12 stderr) Writing model shards: 100%|##| 1/1"  # the bar's last state
    assert not any("Autoscaler status" in x or "after close" in x for x in text)


def test_the_ray_logger_goes_to_the_file_and_comes_back(tmp_path):
    ray_logger = logging.getLogger("ray")
    before = (list(ray_logger.handlers), ray_logger.propagate)
    out = ActorOutput(tmp_path / "actors.log", echo=None)
    out.capture_ray_logger()
    logging.getLogger("ray.some_module").warning("object store is using /tmp instead of /dev/shm")
    out.close()
    assert (list(ray_logger.handlers), ray_logger.propagate) == before
    assert "WARNING ray.some_module: object store is using /tmp" in (tmp_path / "actors.log").read_text()


RAYLET_PARAGRAPH = (
    "A worker died or was killed while executing a task by an unexpected system error. To troubleshoot the "
    "problem, check the logs for the dead worker. RayTask ID: ffff Worker ID: 1a2b Node ID: 3c4d Worker IP "
    "address: 10.0.0.1 Worker port: 10002 Worker PID: 4242 Worker exit type: SYSTEM_ERROR Worker exit detail: "
    "Worker unexpectedly exits with a connection error code 2. End of file. There are some potential root "
    "causes. (1) The process is killed by SIGKILL by OOM killer due to high memory usage. (2) ray stop --force "
    "is called. (3) The worker is crashed unexpectedly due to SIGSEGV or other unexpected errors. Consider "
    "--enable-resource-isolation."
)


def test_the_errors_ray_publishes_to_the_driver_go_to_the_file_not_the_terminal(tmp_path, capsys):
    """A learner or generator killed mid-run: Ray's raylet publishes a paragraph to the driver, which its error
    thread (listen_error_messages) prints beside the log dispatcher. rayward says in its own line what it does
    about it; Ray's paragraph goes to actors.log. --verbose (keep_ray_printing) leaves Ray's printing alone."""
    from ray._private import worker

    printer = worker.print_to_stdstream
    shown: list[str] = []
    out = ActorOutput(tmp_path / "actors.log", echo=shown.append)
    assert out.attach(keep_ray_printing=False)
    try:
        # what listen_error_messages does with each error it receives
        worker.print_to_stdstream({"lines": [RAYLET_PARAGRAPH], "pid": "raylet", "is_err": False},
                                  ignore_prefix=False)
        # and what the forwarding thread hands the dispatcher: an actor's own line
        ray_compat.log_dispatcher().emit({"lines": ["hello"], "pid": 42, "actor_name": "Generator", "is_err": True})
    finally:
        out.close()
    assert worker.print_to_stdstream is printer
    captured = capsys.readouterr()
    assert "A worker died" not in captured.out + captured.err and shown == []
    assert (tmp_path / "actors.log").read_text() == f"(raylet) {RAYLET_PARAGRAPH}\n(Generator pid=42 stderr) hello\n"

    verbose = ActorOutput(tmp_path / "verbose.log", echo=shown.append)
    verbose.attach(keep_ray_printing=True)
    try:
        assert worker.print_to_stdstream is printer
    finally:
        verbose.close()
