"""RewardWorker as a plain class (no Ray): TRL's calling convention, None semantics, errors, timeouts."""

import math
import time

import pytest

from actors.rewards.worker import RewardFunctionError, RewardSpec, RewardWorker, load_reward_function
from actors.types import RewardBatch, TrainerState

F = "tests.fixtures.trl_style_rewards"


def chunk(completions, n_groups=1, **columns):
    n = len(completions)
    return RewardBatch(["p"] * n, completions, [[1, 2, 3]] * n, columns, n // n_groups)


def worker(*specs, state=None):
    return RewardWorker(list(specs), trainer_state=state)


def test_trl_doc_functions_run_unchanged():
    w = worker(
        RewardSpec("len", f"{F}:reward_len"),
        RewardSpec("boxed", f"{F}:reward_func"),
        RewardSpec("math", f"{F}:math_reward_func"),
        RewardSpec("async", f"{F}:async_reward_func"),
    )
    out = w.score(chunk(["x" * 20, "\\boxed{4}", "no", "4"], ground_truth=["1", "4", "2", "4"],
                        task=["math", "math", "code", "math"]))
    s = out.scores
    assert s[0] == [0.0, -11.0, -18.0, -19.0]
    assert s[1] == [0.0, 1.0, 0.0, 0.0]
    assert s[2][0] == 0.0 and s[2][1] == 1.0 and math.isnan(s[2][2]) and s[2][3] == 1.0  # None -> NaN
    assert s[3] == [float(len(c) % 3) for c in ["x" * 20, "\\boxed{4}", "no", "4"]]


def test_conversational_completions_and_batched_calls():
    w = worker(RewardSpec("fmt", f"{F}:format_reward_func", batched=True))
    good = [{"role": "assistant", "content": "<think>hm</think><answer>4</answer>"}]
    bad = [{"role": "assistant", "content": "4"}]
    assert w.score(chunk([good, bad, good, bad], n_groups=2)).scores == [[1.0, 0.0, 1.0, 0.0]]


def test_trainer_state_is_a_transformers_trainer_state():
    w = worker(RewardSpec("s", f"{F}:step_aware_reward"), state=TrainerState(global_step=3, max_steps=10))
    assert w.score(chunk(["a", "b"])).scores == [[0.3, 0.3]]
    w.set_state(TrainerState(global_step=5, max_steps=10))
    assert w.score(chunk(["a"])).scores == [[0.5]]
    # a chunk carries the state current when the pool dispatched it, and that wins
    assert w.score(chunk(["a"]), TrainerState(global_step=10, max_steps=10)).scores == [[1.0]]


def first_sample_slow(completions, log_extra, **kwargs):
    time.sleep(0.2 if completions[0] == "a" else 0.0)  # the first sample's call finishes last
    log_extra("echo", list(completions))
    return [0.0] * len(completions)


def test_log_extra_values_stay_on_their_samples_when_calls_finish_out_of_order():
    out = worker(RewardSpec("e", f"{__name__}:first_sample_slow")).score(chunk(["a", "b", "c"]))
    assert out.extra["echo"] == ["a", "b", "c"]


def test_log_metric_and_log_extra():
    out = worker(RewardSpec("l", f"{F}:logging_reward")).score(chunk(["ab", "abcd"]))
    assert out.metrics["custom/len"] == [2.0, 4.0]  # one call per sample
    assert out.extra["upper"] == ["AB", "ABCD"]


def bad_len(completions, **kw):
    return [1.0]


def bad_type(completions, **kw):
    return ["high"] * len(completions)


def raises_on_b(completions, **kw):
    if "b" in completions:
        raise ZeroDivisionError("boom")
    return [1.0] * len(completions)


def sleepy(completions, **kw):
    if "slow" in completions:
        time.sleep(3)
    return [1.0] * len(completions)


async def async_sleepy(completions, **kw):
    import asyncio

    if "slow" in completions:
        await asyncio.sleep(30)
    return [1.0] * len(completions)


def test_wrong_return_names_reward_and_sample():
    with pytest.raises(RewardFunctionError, match=r"reward 'n' returned 1 values for 2 completions \(samples 0\.\.1\)"):
        worker(RewardSpec("n", f"{__name__}:bad_len", batched=True)).score(chunk(["a", "b"]))
    with pytest.raises(RewardFunctionError, match=r"reward 't' returned 'high' \(str\) for sample 0"):
        worker(RewardSpec("t", f"{__name__}:bad_type")).score(chunk(["a", "b"]))


def test_exception_raises_naming_sample_or_falls_back():
    with pytest.raises(RewardFunctionError, match=r"reward 'x' raised on sample 1: ZeroDivisionError: boom"):
        worker(RewardSpec("x", f"{__name__}:raises_on_b")).score(chunk(["a", "b", "c"]))
    out = worker(RewardSpec("x", f"{__name__}:raises_on_b", on_error="fallback", fallback=-1.0)).score(
        chunk(["a", "b", "c"]))
    assert out.scores == [[1.0, -1.0, 1.0]] and out.errors == {"x": 1}
    out = worker(RewardSpec("x", f"{__name__}:raises_on_b", on_error="fallback", fallback=None)).score(
        chunk(["a", "b"]))
    assert out.scores[0][0] == 1.0 and math.isnan(out.scores[0][1])


def test_errors_carry_what_the_driver_shows_and_survive_pickling():
    """What crosses Ray is the pickled error: no traceback, so the reward's frames travel as data."""
    import pickle

    chat = [{"role": "user", "content": "Write the letter q:"}]
    w = worker(RewardSpec("bad", "tests.fixtures.bad_rewards:misbehaving", kwargs={"mode": "raise"}))
    with pytest.raises(RewardFunctionError) as info:
        w.score(RewardBatch([chat, chat], [[{"role": "assistant", "content": "qqq"}]] * 2, [[1]] * 2, {}, 2, offset=4))
    err = pickle.loads(pickle.dumps(info.value))
    assert (err.reward, err.sample, err.error) == ("bad", 4, "ValueError: verifier exploded")
    assert (err.prompt, err.completion) == ("Write the letter q:", "qqq")  # a conversation's last message
    # the user's frames only: not the worker's, not concurrent.futures'
    assert [(f[0].rsplit("/", 1)[-1], f[2]) for f in err.frames] == [
        ("bad_rewards.py", "reward"), ("bad_rewards.py", "<listcomp>"), ("bad_rewards.py", "check_answer")]
    assert err.frames[-1][3] == 'raise ValueError("verifier exploded")'
    assert "concurrent/futures" in err.traceback and err.defined_at is None

    w = worker(RewardSpec("bad", "tests.fixtures.bad_rewards:misbehaving", kwargs={"mode": "strings"}))
    with pytest.raises(RewardFunctionError) as info:
        w.score(chunk(["a", "b"]))
    err = pickle.loads(pickle.dumps(info.value))
    assert err.frames == [] and err.defined_at.endswith("tests/fixtures/bad_rewards.py:19")
    assert err.error == "returned 'high' (str), expected a number or None" and err.completion == "a"


@pytest.mark.parametrize("fn", ["sleepy", "async_sleepy"])
def test_timeout_gives_fallback_to_the_slow_sample_only(fn):
    w = worker(RewardSpec("s", f"{__name__}:{fn}", timeout_s=0.5, fallback=-2.0))
    t0 = time.monotonic()
    out = w.score(chunk(["a", "slow", "c", "slow"]))
    assert time.monotonic() - t0 < 2.0  # bounded by the timeout, not by the slow call
    assert out.scores == [[1.0, -2.0, 1.0, -2.0]] and out.timeouts == {"s": 2}


def raises_its_own_timeout(completions, **kw):
    raise TimeoutError("the judge timed out")


async def async_raises_its_own_timeout(completions, **kw):
    raise TimeoutError("the judge timed out")


@pytest.mark.parametrize("fn", ["raises_its_own_timeout", "async_raises_its_own_timeout"])
def test_a_timeout_error_the_reward_raises_is_its_error_not_a_timeout(fn):
    out = worker(RewardSpec("j", f"{__name__}:{fn}", on_error="fallback", fallback=-1.0)).score(chunk(["a", "b"]))
    assert out.scores == [[-1.0, -1.0]] and out.errors == {"j": 2} and out.timeouts == {"j": 0}
    with pytest.raises(RewardFunctionError, match="raised on sample 0: TimeoutError: the judge timed out"):
        worker(RewardSpec("j", f"{__name__}:{fn}")).score(chunk(["a"]))


def test_load_errors_name_the_reward(tmp_path):
    with pytest.raises(RewardFunctionError,
                       match=r"reward 'r': function 'no_such_module:\w+': cannot import 'no_such_module'"):
        load_reward_function(RewardSpec("r", "no_such_module:f"))
    with pytest.raises(RewardFunctionError, match=r"has no attribute 'nope'"):
        load_reward_function(RewardSpec("r", f"{F}:nope"))
    f = tmp_path / "my_rewards.py"
    f.write_text("def r(completions, **kw):\n    return [len(c) for c in completions]\n")
    fn = load_reward_function(RewardSpec("r", f"{f}:r"))
    assert fn(completions=["abc"]) == [3]


def test_sequence_classification_reward_model(tiny_model_path, tmp_path):
    """A reward given as a model path scores prompt + completion with logits[:, 0], as TRL does."""
    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

    config = AutoConfig.from_pretrained(tiny_model_path, num_labels=1)
    torch.manual_seed(0)
    rm = AutoModelForSequenceClassification.from_config(config)
    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    rm.config.pad_token_id = tok.pad_token_id
    rm.save_pretrained(tmp_path / "rm")
    tok.save_pretrained(tmp_path / "rm")
    w = worker(RewardSpec("rm", model=str(tmp_path / "rm")))
    c = chunk(["a short answer", "another, longer answer here"])
    got = w.score(c).scores[0]
    with torch.no_grad():
        for p, comp, g in zip(c.prompts, c.completions, got, strict=True):
            ids = tok(p + comp, add_special_tokens=False, return_tensors="pt")
            assert g == pytest.approx(rm(**ids).logits[0, 0].item(), abs=1e-4)
    assert got[0] != got[1]


def test_worker_is_a_threaded_actor_not_an_async_one():
    """An `async def` method would make Ray run RewardWorker as an async actor, where the sync `score` blocks the
    event loop and chunks sent concurrently (max_concurrency) are scored one at a time."""
    from ray._private.async_compat import has_async_methods

    assert not has_async_methods(RewardWorker)


# --- gate.lazy ---------------------------------------------------------------------------------------------------

CALLED: list[str] = []  # the completions `counted_length` was called on


def starts_with_a(completions, **kwargs):
    """The cheap primary reward: 1 if the completion starts with "a", 0 otherwise, no opinion on "?"."""
    return [None if c == "?" else float(c.startswith("a")) for c in completions]


def counted_length(completions, **kwargs):
    """The expensive reward behind the gate: counts its calls."""
    CALLED.extend(completions)
    return [float(len(c)) for c in completions]


def test_a_lazy_gate_calls_only_the_open_samples_and_the_advantages_are_the_eager_ones():
    """Lazy gating (gate.lazy) against calling everywhere, on the same chunk: the expensive reward runs on the
    samples whose gate is open (the gating reward at or above the threshold, or no opinion: NaN leaves a gate open,
    as the driver's gates do), and after the driver's gates the totals and advantages are equal to the bit."""
    import torch

    from actors.rewards.worker import LazyGate
    from orchestrator.algo.aggregation import RewardAggregator, advantage_batch
    from orchestrator.config import RewardConfig
    from tests.fixtures.records import make_rollouts

    def rollouts_for(completions, group_size):
        return make_rollouts(completions, group_size)

    here = "tests.unit.actors.rewards.test_worker"
    completions = ["abc", "b", "ax", "?", "bb", "a", "ba", "aaaa"]  # 2 groups of 4
    gated = [RewardConfig(name="a", function=f"{here}:starts_with_a"),
             RewardConfig(name="len", function=f"{here}:counted_length", weight=0.5,
                          gate={"reward": "a", "threshold": 0.5, "fill": -1.0, "lazy": True})]
    results = {}
    for lazy in (False, True):
        CALLED.clear()
        w = worker(RewardSpec("a", f"{here}:starts_with_a"),
                   RewardSpec("len", f"{here}:counted_length", lazy_gate=LazyGate("a", 0.5) if lazy else None))
        results[lazy] = (w.score(chunk(completions, n_groups=2)), list(CALLED))
    (eager, eager_calls), (lazy, lazy_calls) = results[False], results[True]
    open_ = [c for c in completions if c.startswith("a") or c == "?"]
    assert eager_calls == completions and lazy_calls == open_ and len(lazy_calls) < len(completions)
    assert lazy.skipped == {"len": [c not in open_ for c in completions]} and eager.skipped == {}
    assert all(math.isnan(v) for v, c in zip(lazy.scores[1], completions, strict=True) if c not in open_)
    agg = RewardAggregator(gated)
    batches = [advantage_batch(agg, rollouts_for(completions, group_size=4), s, scale_rewards="group",
                               aggregation="sum_then_normalize") for s in (eager, lazy)]
    a, b = (torch.tensor(x.batch.advantages) for x in batches)
    assert torch.equal(a, b) and a.abs().sum() > 0
    assert batches[0].table["total"] == batches[1].table["total"]
    assert batches[0].table["gated/len"] == batches[1].table["gated/len"]
    # Both the gating reward's spread (a vs not) and the gated one's (lengths) reach the advantages.
    assert len({round(x, 6) for x in a.tolist()}) > 2


def test_trls_own_format_reward_gates_a_trl_doc_reward_lazily():
    """TRL's shipped `think_format_reward` (trl.rewards) as the gate of a reward from TRL's docs, lazily: the
    gated reward is not called where the think format is missing (its raw None there), and is where it holds."""
    from actors.rewards.worker import LazyGate

    think = [{"role": "assistant", "content": "<think>hm</think><answer>4</answer>"}]
    plain = [{"role": "assistant", "content": "<answer>4</answer>"}]
    w = worker(RewardSpec("think", "trl.rewards:think_format_reward"),
               RewardSpec("fmt", f"{F}:format_reward_func", lazy_gate=LazyGate("think", 1.0)))
    out = w.score(chunk([think, plain, plain, think], n_groups=2))
    assert out.scores[0] == [1.0, 0.0, 0.0, 1.0] and out.skipped == {"fmt": [False, True, True, False]}
    assert out.scores[1][0] == out.scores[1][3] == 1.0 and all(math.isnan(v) for v in out.scores[1][1:3])
