"""The learner with a mixture-of-experts policy (tiny Qwen3-MoE and Qwen2-MoE, orchestrator/builtin/models/moe.py): what
the generators are sent, routing replay (actors/learner/routing.py), the load-balancing loss by TRL's rule, and two
FSDP ranks against one."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load as safetensors_load
from safetensors.torch import load_file

from actors.learner.learner import Learner
from actors.learner.routing import NO_ROUTE, Replay, agreement, aux_loss_coef, layout_routes
from actors.runtime.net import free_port
from actors.types import TrainBatch
from orchestrator.builtin.models.moe import FAMILIES, NUM_EXPERTS, TOP_K, ensure_tiny_moe
from tests.fixtures.learner import TIMED_METRICS, make_batch, scenario_spec, spec


@pytest.fixture(scope="module", params=FAMILIES)
def moe_path(request):
    return str(ensure_tiny_moe(request.param))


@pytest.fixture(scope="module")
def qwen3_moe_path():
    return str(ensure_tiny_moe("qwen3_moe"))


def make(path, **kw):
    return Learner(spec(path, **{"loss_type": "dapo", "learning_rate": 1e-2, "micro_batch_size": 4, **kw}))


def own_routes(lr: Learner, b: TrainBatch) -> list[np.ndarray]:
    """Each sample's routes as the learner routes it alone ([prompt + completion, layers, top_k])."""
    out = []
    for p, c in zip(b.prompt_ids, b.completion_ids, strict=True):
        with torch.no_grad(), lr.replay.recording() as rec:
            lr.model(input_ids=torch.tensor([p + c]))
        out.append(lr.replay.stack(rec).numpy())
    return out


def other_routes(routes: list[np.ndarray], seed: int = 0) -> list[np.ndarray]:
    """Routes with about half the (token, layer) expert sets moved elsewhere (each row's experts stay distinct)."""
    g = np.random.default_rng(seed)
    out = []
    for r in routes:
        r = r.copy()
        move = g.random(r.shape[:2]) < 0.5
        r[move] = (r[move] + 1 + g.integers(0, NUM_EXPERTS - TOP_K, size=(int(move.sum()), 1))) % NUM_EXPERTS
        r[move, 1] = (r[move, 0] + 1) % NUM_EXPERTS
        out.append(r.astype(np.int16))
    return out


def test_the_generators_are_sent_the_checkpoint_layout(moe_path):
    """Experts go out one by one under the checkpoint's names (what vLLM loads), equal to the files on disk: not
    transformers 5's fused in-memory [experts, 2 x intermediate, hidden] tensors."""
    lr = make(moe_path)
    sent = safetensors_load(lr.export_weights())
    disk = load_file(f"{moe_path}/model.safetensors")
    assert sent.keys() == disk.keys()
    assert ("model.layers.0.mlp.experts.7.up_proj.weight" in sent
            and "model.layers.0.mlp.experts.gate_up_proj" not in sent)
    for k in disk:
        assert torch.equal(sent[k], disk[k]), k
    lr.train_step(make_batch(8))  # after a step too: what is sent is what save_pretrained writes
    state = {k: v for k, v in lr.model.state_dict().items() if k not in lr.tied}
    from transformers.core_model_loading import revert_weight_conversion

    on_disk_layout = revert_weight_conversion(lr.model, state)
    sent = safetensors_load(lr.export_weights())
    assert sent.keys() == on_disk_layout.keys()
    for k in sent:
        assert torch.equal(sent[k], on_disk_layout[k].contiguous()), k


def test_the_sent_experts_follow_training_and_lora(tmp_path, qwen3_moe_path):
    lr = make(qwen3_moe_path, lora={"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]})
    lr.train_step(make_batch(8))
    sent = safetensors_load(lr.export_weights())
    lr.save_merged(str(tmp_path / "merged"))
    merged = load_file(str(tmp_path / "merged" / "model.safetensors"))
    assert sent.keys() == merged.keys()
    for k in sent:
        torch.testing.assert_close(sent[k], merged[k], rtol=0, atol=1e-6, msg=k)


def test_replaying_the_learners_own_routing_changes_nothing_and_other_routes_train_the_router(moe_path):
    lr = make(moe_path, router_replay="R3")
    b = make_batch(6)
    rows = lr.layout(b.prompt_ids, b.completion_ids)
    own = own_routes(lr, b)
    lengths = [len(p) + len(c) for p, c in zip(b.prompt_ids, b.completion_ids, strict=True)]
    with torch.no_grad():
        plain, _ = lr._forward_logps(lr.model, rows, with_entropy=False)
        with lr.replay.replaying(layout_routes(rows.source, own, lengths, lr.replay.num_layers, lr.replay.top_k)):
            same, _ = lr._forward_logps(lr.model, rows, with_entropy=False)
    torch.testing.assert_close(same, plain, rtol=0, atol=1e-5)  # packed rows vs one sample alone: rounding only
    moved = layout_routes(rows.source, other_routes(own), lengths, lr.replay.num_layers, lr.replay.top_k)
    with lr.replay.replaying(moved), lr.replay.recording() as rec:
        logp, _ = lr._forward_logps(lr.model, rows, with_entropy=False)
        logp.sum().backward()
    assert (logp - plain).abs().max() > 0.1  # another expert is another function
    assert agreement(lr.replay.stack(rec), moved, torch.ones(len(moved), dtype=torch.bool))[0] == 1.0
    router = next(iter(lr.replay.routers.values()))
    assert router.weight.grad is not None and router.weight.grad.abs().sum() > 0  # weights from the router's logits


def test_routes_land_on_their_tokens_packed_and_padded(qwen3_moe_path):
    b = make_batch(8)
    got = {}
    for packed in (True, False):
        lr = make(qwen3_moe_path, router_replay="R3", padding_free=packed)
        lengths = [len(p) + len(c) for p, c in zip(b.prompt_ids, b.completion_ids, strict=True)]
        rows = lr.layout(b.prompt_ids, b.completion_ids)
        routes = layout_routes(rows.source, other_routes(own_routes(lr, b)), lengths, lr.replay.num_layers,
                               lr.replay.top_k)
        assert (routes[rows.source.reshape(-1) < 0] == NO_ROUTE).all()
        with torch.no_grad(), lr.replay.replaying(routes):
            got[packed], _ = lr._forward_logps(lr.model, rows, with_entropy=False)
    real = torch.zeros_like(got[True], dtype=torch.bool)
    for i, c in enumerate(b.completion_ids):
        real[i, : len(c)] = True
    torch.testing.assert_close(got[True][real], got[False][real], rtol=0, atol=1e-4)


def test_r3_trains_on_the_engines_routes_and_reports_agreement(qwen3_moe_path):
    lr = make(qwen3_moe_path, router_replay="R3", num_iterations=2, beta=0.1)
    b = make_batch(8)
    b = dataclasses.replace(b, routes=own_routes(lr, b))
    m = lr.train_step(b).metrics
    assert m["routing/agreement"] == 1.0
    assert m["routing/logp_difference_without_replay/mean"] == pytest.approx(
        m["sampling/sampling_logp_difference/mean"], abs=1e-5)
    lr = make(qwen3_moe_path, router_replay="R3")
    b = dataclasses.replace(b, routes=other_routes(b.routes))
    m = lr.train_step(b).metrics
    assert 0.2 < m["routing/agreement"] < 0.9
    with pytest.raises(ValueError, match="routes"):
        make(qwen3_moe_path, router_replay="R3").train_step(make_batch(8))  # no routes recorded: named


def test_r2_replays_the_first_pass_routing_in_later_iterations(qwen3_moe_path, monkeypatch):
    lr = make(qwen3_moe_path, router_replay="R2", num_iterations=3)
    given = []
    original = Replay.replaying

    def spy(self, routes):
        given.append(routes)
        return original(self, routes)

    monkeypatch.setattr(Replay, "replaying", spy)
    lr.train_step(make_batch(8))
    assert len(given) == 2 * 2 and all(r is not None and (r >= 0).any() for r in given)  # 2 micro-batches x 2 passes


def test_the_load_balancing_loss_follows_trl(qwen3_moe_path, tiny_model_path):
    """TRL 1.16's rule: the config's coefficient when unset, 0 turns it off, a dense model refuses a value; the loss
    adds coef x aux_loss / gradient accumulation steps and logs aux_loss, the model's own aux_loss of the batch."""
    base = make(qwen3_moe_path)
    assert aux_loss_coef(base.model, None) == base.model.config.router_aux_loss_coef == base.aux_coef > 0
    assert aux_loss_coef(base.model, 0.0) == 0.0
    assert make(tiny_model_path).aux_coef == 0.0
    with pytest.raises(ValueError, match="returns no router logits"):
        make(tiny_model_path, router_aux_loss_coef=0.1)
    b = make_batch(4)
    lr = make(qwen3_moe_path, router_aux_loss_coef=0.5, padding_free=False, optim="sgd", learning_rate=0.0, beta=0.1,
              max_grad_norm=None)
    rows = lr.layout(b.prompt_ids, b.completion_ids)
    with torch.no_grad():
        want = lr.model(input_ids=rows.input_ids, attention_mask=rows.attention_mask, position_ids=rows.position_ids,
                        output_router_logits=True, use_cache=False).aux_loss
    m = lr.train_step(b).metrics
    assert m["aux_loss"] == pytest.approx(want.item(), rel=1e-5)
    grads = {n: p.grad.clone() for n, p in lr.model.named_parameters() if "mlp.gate" in n}
    off = make(qwen3_moe_path, router_aux_loss_coef=0.0, padding_free=False, optim="sgd", learning_rate=0.0,
               max_grad_norm=None)
    assert "aux_loss" not in off.train_step(b).metrics
    assert any((grads[n] - p.grad).abs().max() > 1e-6 for n, p in off.model.named_parameters() if n in grads)


# ------------------------------------------------------------------------------------------------ two FSDP ranks
WORLD = 2
# As tests/unit/actors/learner/test_learner_fsdp.py: fp32, the same kernels, only the sums over ranks and
# micro-batches reorder. MoE adds the experts' index_add, whose order is the same on both sides.
ATOL = 1e-6
MOE_SCENARIO = dict(loss_type="grpo", micro_batch_size=4, num_iterations=2, beta=0.1, router_replay="R3",
                    router_aux_loss_coef=0.01)


def moe_batch(path: str) -> TrainBatch:
    b = make_batch(12)
    lr = Learner(scenario_spec(path, **MOE_SCENARIO))
    return dataclasses.replace(b, routes=other_routes(own_routes(lr, b), seed=3))


def _rank(rank: int, port: int, path: str, out: str) -> None:
    from actors.learner.checkpoint import full_state_dict

    torch.set_num_threads(1)
    lr = Learner(scenario_spec(path, **MOE_SCENARIO), strategy="fsdp", rank=rank, world_size=WORLD,
                 init_method=f"tcp://127.0.0.1:{port}")
    result = lr.train_step(moe_batch(path))
    seen = {"result": result, "weights": full_state_dict(lr.train_state()), "export": lr.export_weights()}
    if rank == 0:
        torch.save(seen, out)


@pytest.mark.slow
def test_two_fsdp_ranks_train_an_moe_as_one(tmp_path, qwen3_moe_path):
    out = str(tmp_path / "rank0.pt")
    mp.spawn(_rank, args=(free_port(), qwen3_moe_path, out), nprocs=WORLD, join=True)
    got = torch.load(out, weights_only=False)
    single = Learner(scenario_spec(qwen3_moe_path, **MOE_SCENARIO))
    result = single.train_step(moe_batch(qwen3_moe_path))
    want = {k: v for k, v in single.model.state_dict().items() if k not in single.tied}
    assert got["weights"].keys() == want.keys()
    for k, v in want.items():
        torch.testing.assert_close(got["weights"][k], v, rtol=0, atol=ATOL, msg=k)
    m1, m2 = result.metrics, got["result"].metrics
    assert m1.keys() == m2.keys() and {"routing/agreement", "aux_loss", "kl"} <= m1.keys()
    for k in m1.keys() - TIMED_METRICS:
        assert m2[k] == pytest.approx(m1[k], rel=1e-4, abs=1e-6), k
    sent, want_sent = safetensors_load(got["export"]), safetensors_load(single.export_weights())
    assert sent.keys() == want_sent.keys() and "model.layers.1.mlp.experts.3.down_proj.weight" in sent
    for k in sent:
        torch.testing.assert_close(sent[k], want_sent[k], rtol=0, atol=ATOL, msg=k)
    assert not math.isnan(m1["routing/agreement"])


def test_an_moe_checkpoint_resumes_exactly_and_is_a_plain_hf_checkpoint(tmp_path, qwen3_moe_path):
    from transformers import AutoModelForCausalLM

    lr = make(qwen3_moe_path, router_replay="R2", num_iterations=2, optim="adamw_torch")
    lr.train_step(make_batch(8))
    path = lr.save_checkpoint(str(tmp_path / "ckpt"), extra={"note": "moe"})
    again = make(qwen3_moe_path, router_replay="R2", num_iterations=2, optim="adamw_torch")
    assert again.load_checkpoint(path)["note"] == "moe"
    assert again.export_weights() == lr.export_weights()
    hf = AutoModelForCausalLM.from_pretrained(path)  # what any HF user loads: the checkpoint layout on disk
    assert "model.layers.0.mlp.experts.3.gate_proj.weight" in load_file(f"{path}/model.safetensors")
    for k, v in hf.state_dict().items():
        torch.testing.assert_close(v, again.model.state_dict()[k], rtol=0, atol=0, msg=k)
    b = make_batch(12)
    m1, m2 = lr.train_step(b).metrics, again.train_step(b).metrics  # the optimizer's moments came back too
    assert {k: m1[k] for k in m1.keys() - TIMED_METRICS} == {k: m2[k] for k in m2.keys() - TIMED_METRICS}


def test_routes_survive_collective_rpcs_serialisation():
    """An engine core in its own process hands worker results back through msgspec, where a numpy array would arrive
    as nested lists: routes travel as (shape, bytes) and come back as the same int16 array."""
    import msgspec

    from actors.generation.vllm_compat import decode_routes, encode_routes

    routes = np.arange(2 * 3 * 2, dtype=np.int16).reshape(2, 3, 2) - 1
    wire = msgspec.msgpack.decode(msgspec.msgpack.encode([encode_routes(routes), encode_routes(None)]))
    back = [decode_routes(x) for x in wire]
    assert back[1] is None and back[0].dtype == np.int16 and np.array_equal(back[0], routes)


def test_a_part_is_found_only_where_it_is_a_strided_view_of_the_whole():
    from actors.weights.sender import _as_strided

    index = torch.arange(4 * 6 * 5, dtype=torch.int32)
    whole = index.reshape(4, 6, 5)
    gate = whole[2, :3]  # one expert's gate rows out of a fused gate_up: a strided part
    assert _as_strided(gate.contiguous().reshape(-1), (3, 5), index) == (2 * 30, (3, 5), (5, 1))
    transposed = whole[1].T  # a transpose is a strided view too
    assert _as_strided(transposed.contiguous().reshape(-1), (5, 6), index) == (30, (5, 6), (1, 5))
    shuffled = whole[0].reshape(-1)[torch.randperm(30, generator=torch.Generator().manual_seed(0))]
    assert _as_strided(shuffled, (30,), index) is None  # not a re-layout: refused, never sent wrong
