"""actors/runtime/error_text.py: an error in one line, as the weight sync and the checkpoint messages name it."""

from ray.exceptions import RayTaskError

from actors.runtime.error_text import one_line


def test_the_type_and_the_first_line_of_the_message():
    err = RuntimeError("[gloo] connection closed by peer\nException raised from recv at gloo/transport.cc\nframe #0")
    assert one_line(err) == "RuntimeError: [gloo] connection closed by peer"
    assert one_line(ValueError()) == "ValueError"
    assert one_line(TimeoutError("\n  waited 3 s  \n")) == "TimeoutError: waited 3 s"


def test_a_ray_task_error_is_named_by_what_the_actor_raised():
    raised = KeyError("global_step")
    task = RayTaskError("Learner.load_checkpoint", "Traceback (most recent call last):\n  ...", raised)
    assert one_line(task) == "KeyError: 'global_step'"
    outer = RayTaskError("Pool.score", "Traceback (most recent call last):\n  ...", task)  # an actor calling one
    assert one_line(outer) == "KeyError: 'global_step'"
