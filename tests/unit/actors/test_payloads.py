"""actors/payloads.py without Ray: how long a generator holds its payloads. (Payloads through a real object store,
lost with their owner: tests/integration/actors/test_payloads.py; resolving batches: the loop and stage tests.)"""


def test_a_generator_holds_each_payload_for_hold_weight_loads_then_releases_it(monkeypatch):
    """HeldStore: the generator's own reference to a payload outlives the batches that may train it (Ray can count a
    payload nested in a streamed item to zero early), and no longer: the store is bounded by that window."""
    import ray

    from actors.payloads import HeldStore

    monkeypatch.setattr(ray, "put", lambda payload: ("ref", payload))
    store = HeldStore(hold=2)
    assert store("a") == ("ref", "a") and store("b") == ("ref", "b")
    store.loaded()
    store("c")
    store.loaded()
    assert len(store) == 3  # two loads after a and b: a batch max_staleness + 1 steps old may still train them
    store.loaded()
    assert len(store) == 1  # the third load releases a and b; c (put after the first) is held one load more
    store.loaded()
    assert len(store) == 0
