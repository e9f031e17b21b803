"""The fakes the loop tests run on (tests/fixtures/fakes.py), held to the real groups they stand for
(actors/runtime/group.py, actors/weights/transfer.py) through the Protocols `Run` is typed with
(orchestrator/run/groups.py, run.py): each fake's public methods are exactly its Protocol's, and the Protocol's, the
real group's and the fake's signatures of each are the same. A fake that drifts from its group (a method renamed,
removed or added on either side, an argument changed) fails here instead of passing the fake tier while the real thing
is broken (commit 580de37: a broken LearnerGroup passed it)."""

from __future__ import annotations

import inspect

import pytest

from actors.runtime.group import ControlGroup, EnvPoolGroup, GeneratorGroup, LearnerGroup, RewardPoolGroup
from actors.weights.transfer import (
    CollectiveTransfer,
    ObjectStoreTransfer,
    OverlappedCollectiveTransfer,
    WeightTransfer,
)
from orchestrator.run.groups import Control, EnvPoolView, Generators, LearnerView, RewardScorer
from tests.fixtures.fakes import (
    FakeControl,
    FakeEnvPool,
    FakeGenerators,
    FakeLearner,
    FakeRewardPool,
    FakeTransfer,
)

# (the Protocol the run holds it as, the real group, its fake)
CONTRACTS = [
    (Generators, GeneratorGroup, FakeGenerators),
    (LearnerView, LearnerGroup, FakeLearner),
    (RewardScorer, RewardPoolGroup, FakeRewardPool),
    (EnvPoolView, EnvPoolGroup, FakeEnvPool),
    (Control, ControlGroup, FakeControl),
    (WeightTransfer, CollectiveTransfer, FakeTransfer),
    (WeightTransfer, OverlappedCollectiveTransfer, FakeTransfer),
    (WeightTransfer, ObjectStoreTransfer, FakeTransfer),
]
# What the tests script on a fake (a death), which no real group has.
SCRIPTING = {FakeGenerators: {"die"}}
# Special methods the driver calls on a group.
CALLED_SPECIALS = ("__len__",)


def methods(cls: type) -> dict[str, inspect.Signature]:
    """A class's public methods (its own and inherited) and the special ones the driver calls: their signatures."""
    return {
        name: inspect.signature(fn)
        for name, fn in inspect.getmembers(cls, inspect.isfunction)
        if not name.startswith("_") or (name in CALLED_SPECIALS and fn is not getattr(object, name, None))
    }


@pytest.mark.parametrize("protocol,real,fake", CONTRACTS, ids=lambda c: c.__name__)
def test_a_fake_has_its_protocols_methods_with_the_real_groups_signatures(protocol, real, fake):
    wanted, actual, faked = methods(protocol), methods(real), methods(fake)
    scripted = SCRIPTING.get(fake, set())
    assert set(faked) - scripted == set(wanted), (
        f"{fake.__name__}'s methods are not {protocol.__name__}'s: only the fake has "
        f"{sorted(set(faked) - scripted - set(wanted))}, only the Protocol {sorted(set(wanted) - set(faked))}")
    for name, signature in wanted.items():
        assert name in actual, f"{real.__name__} has no {name}, which the run calls ({protocol.__name__})"
        assert actual[name] == signature, (
            f"{real.__name__}.{name}{actual[name]} is not {protocol.__name__}'s {signature}")
        assert faked[name] == signature, f"{fake.__name__}.{name}{faked[name]} is not {protocol.__name__}'s {signature}"


def test_the_check_sees_a_method_renamed_removed_or_changed_on_either_side():
    """The check above, on classes that drift: it names what differs."""

    class Real:
        def score(self, batch: int) -> int: ...

        def kill(self) -> None: ...

    class Wanted(Real):  # the Protocol: the same methods
        pass

    class Renamed:
        def scores(self, batch: int) -> int: ...

        def kill(self) -> None: ...

    class Changed:
        def score(self, batch: int, chunk: int = 1) -> int: ...

        def kill(self) -> None: ...

    assert methods(Wanted) == methods(Real)
    assert set(methods(Renamed)) != set(methods(Wanted))
    assert methods(Changed)["score"] != methods(Wanted)["score"]
    for drifted in ((Wanted, Real, Renamed), (Wanted, Renamed, Real), (Wanted, Real, Changed),
                    (Wanted, Changed, Real)):
        with pytest.raises(AssertionError):
            test_a_fake_has_its_protocols_methods_with_the_real_groups_signatures(*drifted)
