"""actors/runtime/group.py without Ray: the shard arithmetic, death reasons, and the generator group's calls against the
Generator's methods (the Ray side: tests/integration)."""

from actors.runtime.group import GeneratorGroup, shards


def test_one_contiguous_shard_per_member_in_item_order():
    assert shards(10, 3) == [(0, slice(0, 3)), (1, slice(3, 6)), (2, slice(6, 10))]
    assert shards(4, 1) == [(0, slice(0, 4))]


def test_more_parts_than_members_are_dealt_in_turn():
    assert shards(8, 2, parts=4) == [(0, slice(0, 2)), (1, slice(2, 4)), (0, slice(4, 6)), (1, slice(6, 8))]


def test_never_more_shards_than_items_and_none_for_no_items():
    assert shards(2, 4) == [(0, slice(0, 1)), (1, slice(1, 2))]
    assert shards(3, 2, parts=8) == [(0, slice(0, 1)), (1, slice(1, 2)), (0, slice(2, 3))]
    assert shards(0, 2) == []


def test_death_reason_keeps_what_happened_not_rays_advice():
    from ray.exceptions import RayActorError

    from actors.runtime.group import death_reason

    err = RayActorError(error_msg=(
        "The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR Worker exit detail: "
        "Worker unexpectedly exits with a connection error code 2. End of file. Some common causes include: (1) the "
        "process was killed by the OOM killer"))
    assert death_reason(err) == "its worker process died: Worker unexpectedly exits with a connection error code 2"
    assert death_reason(RayActorError(error_msg="The actor died because its node has died.")) == (
        "The actor died because its node has died.")


class _Recorded(GeneratorGroup):
    """A GeneratorGroup without Ray: its fan-out records each call (method, positional and keyword arguments as
    one member receives them) instead of sending it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple, dict]] = []
        self.restarts, self._handles = 0, [None]

    def _submit(self, method, *args, per_member=None, **kwargs):
        self.calls.append((method, args, {**kwargs, **(per_member or [{}])[0]}))
        return []

    def _submit_sharded(self, method, items, *, aligned=None, **kwargs):
        self.calls.append((method, (items,), {**(aligned or {}), **kwargs}))
        return []

    def _stream(self, member, method, *args, **kwargs):
        self.calls.append((method, args, kwargs))


def test_every_generator_group_method_calls_a_generator_method_with_arguments_it_takes():
    """The group names the generator's methods by string in one place: each of those calls binds to
    actors/generation/generator.py Generator's signature (a renamed method or argument fails here, not on a
    cluster)."""
    import inspect

    from actors.generation.generator import Generator
    from actors.types import Sampling

    group = _Recorded()
    sampling = Sampling(n=2, max_tokens=4, temperature=1.0)
    group.generate([[1, 2]], [7], sampling, min_version=0)
    group.submit_generate([[1, 2]], [7], sampling, min_version=None, pin=True)
    group.stream_generate(0, [[1, 2]], [7], sampling, min_version=0)
    group.rollout([{"prompt": []}], [7], sampling, min_version=0)
    group.submit_rollout([{"prompt": []}], [7], sampling, min_version=None, pin=True)
    group.stream_rollout(0, [{"prompt": []}], [7], sampling, min_version=0)
    group.submit_load_weights(b"w", 3)
    group.submit_join_weight_group("h", 1, rank_offsets=[1], world_size=2, generation=0, timeout_s=1.0, plan=[])
    group.submit_receive_weights(3)
    group.sequence_logprobs([1, 2], 1.0)
    group.sequence_logprobs_and_routes([1, 2], 1.0)
    group.cpu_threads()
    called = [method for method, _, _ in group.calls]
    assert called == ["generate_groups", "generate_groups", "generate_groups_stream", "rollout_groups",
                      "rollout_groups", "rollout_groups_stream",
                      "load_weights", "join_weight_group", "receive_weights", "sequence_logprobs",
                      "sequence_logprobs_and_routes", "cpu_threads"]
    for method, args, kwargs in group.calls:
        inspect.signature(getattr(Generator, method)).bind(None, *args, **kwargs)  # TypeError if it does not bind


def test_the_reward_pool_group_keeps_its_judges_and_teachers_sizes_in_its_checkpoint_state(monkeypatch):
    """A checkpoint holds the reward pool's scaling with each judge pool's (`judges`) and the teacher pool's
    (`teacher`); a resume gives each its own back, and a pool the resumed run no longer has keeps nothing."""
    from actors.runtime.group import PoolGroup, RewardPoolGroup

    class Stand(PoolGroup):
        def __init__(self, state):
            self.state, self.restored = state, None

        def scaling(self):
            return dict(self.state)

        def restore_scaling(self, state):
            self.restored = state

    group = RewardPoolGroup.__new__(RewardPoolGroup)
    own = Stand({"target": 3})
    monkeypatch.setattr(PoolGroup, "scaling", lambda self: own.scaling())
    monkeypatch.setattr(PoolGroup, "restore_scaling", lambda self, state: own.restore_scaling(state))
    group.judges, group.teacher = {"j": Stand({"target": 2})}, Stand({"target": 4})
    state = group.scaling()
    assert state == {"target": 3, "judges": {"j": {"target": 2}}, "teacher": {"target": 4}}
    group.judges, group.teacher = {"j": Stand({}), "k": Stand({})}, Stand({})
    group.restore_scaling({**state, "judges": {"j": {"target": 5}, "gone": {"target": 1}}})
    assert own.restored == {"target": 3} and group.judges["j"].restored == {"target": 5}
    assert group.judges["k"].restored is None and group.teacher.restored == {"target": 4}
    group.teacher = None  # a resumed run without distillation: the teacher's size is dropped
    group.restore_scaling(state)
