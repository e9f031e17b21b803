"""Cluster-scale simulation: the real driver and loop on a multi-node local Ray cluster, with synthetic
generators and learner, to measure what the driver itself carries at scale (issue 49's bench).

    python bench/scale_sim.py --samples 4096 --tokens 4096              # 16 generators, 5 steps, pipelined
    python bench/scale_sim.py --samples 4096 --tokens 4096 --routes --route-layers 8
    python bench/scale_sim.py --samples 1024 --tokens 1024 --address 127.0.0.1:PORT   # a cluster already up
    python bench/scale_sim.py --samples 1024 --tokens 4096 --generators 8 --sigma 1.0 --max-staleness 2 \
        --loop async            # issue 50's comparison; the same with --loop pipelined --shared-engine

What runs (everything of the driver is rayward's own code):
  cluster    cluster/local_cluster.sh: head (the driver, the reward pool), a reward node (the reward workers),
             a generator node (every generator), a learner node; the bench starts and stops it (--address: use
             a running one whose nodes carry the reward_node / generator_node / learner_node resources)
  driver     ray.init through orchestrator.run.cluster.init_ray; the run assembled by
             orchestrator.run.build.assemble_run from a Prepared made here (synthetic prompts and tokenizer,
             the real reward specs) and from groups started here: the real GeneratorGroup and LearnerGroup
             over the synthetic classes of bench/scale_sim_actors.py, the real reward pool (start_reward_pool)
             with its workers and bench/scale_sim_rewards.py:length_reward, the real object-store weight
             transfer (weight_transfer); then the loop of --loop (orchestrator.loop.loops.LOOPS)
  generators bench/scale_sim_actors.py SyntheticGenerator: per prompt G lengths from a log-normal clipped at
             --tokens, token ids, log-probs, versions, text (and --routes: int16 [prompt + completion,
             --route-layers, 8]) as Python lists, as the real generator returns them, after the modelled
             decode time (processor sharing at --engine-tps per engine, at most --seq-tps per sequence)
  engines    --shared-engine (always with --loop async): one modelled engine per generator that every call
             of the actor shares (bench/scale_sim_actors.py SharedEngine: processor sharing over all the live
             sequences, a weight load applied to the sequences running); it reports the engines' occupancy
  learner    SyntheticLearner: reads every row of the TrainBatch Ray hands it, sleeps its tokens /
             --learner-tps
  weights    the object-store backend with a 16-byte blob (the sync's calls are measured, not a model's copy)

Per step it prints: the wall time against the modelled ideal (pipelined: the slowest stage, the generators'
batch on the busiest engine or the learner's batch; sync: their sum), the bytes the driver received and sent,
its CPU seconds and their share of the ideal, its peak RSS, and the cluster's object stores (peak bytes in
use, bytes created). It ends with one line, `driver bytes/sample B; driver CPU share X%; step/ideal R`: bytes
and CPU over all the steps (a pipelined step carries the next batch's groups), step/ideal over the steps after
the first (which overlaps nothing).

What the driver's bytes are: every object Ray serializes in the driver process (actor-call arguments, ray.put)
and every object it deserializes (ray.get results, streamed items), sized as Ray stores them (pickle 5 with
out-of-band buffers), counted by hooks on Ray's SerializationContext in this process. Not counted: ObjectRefs
the driver passes on without fetching them (no bytes enter it), task specs and gRPC framing (a few hundred
bytes per call; the object counts are printed), and the actors' log lines Ray forwards to the driver. Driver
CPU: process_time of the driver (all its threads: Ray's receive threads included) between two steps' logs,
the bench's probe at each log left out (the object stores are sampled by a process of its own).
bench/README.md has the results.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
# The actors import bench.* and the reward workers bench.scale_sim_rewards (init_ray passes PYTHONPATH on).
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
os.chdir(ROOT)  # run_sys_path(): the reward workers' sys.path

from orchestrator.cli.auth import prepare_client_auth  # noqa: E402

prepare_client_auth()  # before ray is imported: Ray 2.60 reads RAY_AUTH_MODE at import

import psutil  # noqa: E402
import ray  # noqa: E402

from actors.generation.generator import GENERATOR_GROUPS, GENERATOR_METHOD_GROUPS  # noqa: E402
from actors.payloads import HOLD_LOADS  # noqa: E402
from actors.runtime.group import HEALTH_GROUP, PLACEMENT_TIMEOUT_S, GeneratorGroup, LearnerGroup  # noqa: E402
from actors.types import RewardBatch  # noqa: E402
from bench.scale_sim_actors import (  # noqa: E402
    ROUTE_LAYERS,
    VOCAB,
    EngineModel,
    LearnerModel,
    Ledger,
    SyntheticGenerator,
    SyntheticLearner,
    private_mb,
)
from orchestrator.config import ClusterConfig, RunConfig, parse_config  # noqa: E402
from orchestrator.data.sources import PromptSource  # noqa: E402
from orchestrator.loop.feed import feed_shape  # noqa: E402
from orchestrator.loop.loops import LOOPS  # noqa: E402
from orchestrator.run.build import (  # noqa: E402
    Groups,
    Prepared,
    assemble_run,
    reward_specs,
    shutdown_run,
    start_reward_pool,
    weight_transfer,
)
from orchestrator.run.cluster import actor_options, generator_options, init_ray, namespace  # noqa: E402
from orchestrator.telemetry.metrics import MetricsLogger  # noqa: E402
from orchestrator.telemetry.progress import Display  # noqa: E402

CLUSTER_SCRIPT = ROOT / "cluster" / "local_cluster.sh"
# The bench's nodes (besides local_cluster.sh's head, reward node and generator node).
LEARNER_NODE = '{"learner_node": 1}'
# Samples one engine decodes at once (vLLM's max_num_seqs order): --generators defaults to samples / this.
SAMPLES_PER_ENGINE = 256
MIN_GENERATORS, MAX_GENERATORS = 4, 32
# How often the object stores' use is sampled for its peak (one gRPC call to a raylet, which asks the others).
STORE_POLL_S = 1.0


# --- what the driver carries -------------------------------------------------------------------------------


@dataclass
class Bytes:
    """Bytes Ray serialized (sent) and deserialized (received) in this process, and how many objects."""

    sent: int = 0
    received: int = 0
    sent_objects: int = 0
    received_objects: int = 0
    paused: bool = False  # the bench's own calls (reading the ledger) are not the loop's traffic

    def snapshot(self) -> tuple[int, int, int, int]:
        return self.sent, self.received, self.sent_objects, self.received_objects


def count_driver_bytes(counter: Bytes) -> None:
    """Hook Ray's serialization context (ray._private.serialization, Ray 2.60) in this process: `serialize`
    (every actor-call argument that is not an ObjectRef, every ray.put) and `deserialize_objects` (every
    ray.get and streamed item: the buffer Ray hands over, inline or from the object store)."""
    from ray._private.serialization import SerializationContext

    serialize, deserialize = SerializationContext.serialize, SerializationContext.deserialize_objects

    def counted_serialize(self: Any, value: Any) -> Any:
        out = serialize(self, value)
        if not counter.paused:
            counter.sent += int(out.total_bytes)
            counter.sent_objects += 1
        return out

    def counted_deserialize(self: Any, objects: Any, refs: Any, *args: Any, **kwargs: Any) -> Any:
        if not counter.paused:
            for data, *_ in objects:
                counter.received += len(data) if data is not None else 0
                counter.received_objects += 1
        return deserialize(self, objects, refs, *args, **kwargs)

    SerializationContext.serialize = counted_serialize
    SerializationContext.deserialize_objects = counted_deserialize


# The object-store sampler, a process of its own so that its polling is no part of the driver's CPU: every
# STORE_POLL_S one gRPC call to a raylet, which asks the others (ray._private.internal_api, Ray 2.60), and a
# line "used created spilled" (bytes, the cluster's sums) appended to its file.
SAMPLER = """
import sys, time
from ray._private.internal_api import get_memory_info_reply, get_state_from_address
state = get_state_from_address(sys.argv[1])
with open(sys.argv[2], "a") as out:
    while True:
        try:
            s = get_memory_info_reply(state).store_stats
            out.write(f"{s.object_store_bytes_used} {s.cumulative_created_bytes} {s.spilled_bytes_total}\\n")
            out.flush()
        except Exception:
            pass
        time.sleep(float(sys.argv[3]))
"""


class StoreSampler:
    """The cluster's object stores, sampled by a subprocess (SAMPLER): bytes in use (the peak between two
    `take`s), bytes created so far (Ray's cumulative counter), bytes spilled so far."""

    def __init__(self, gcs: str, path: Path):
        self.path = path
        path.touch()
        self.proc = subprocess.Popen([sys.executable, "-c", SAMPLER, gcs, str(path), str(STORE_POLL_S)])
        self.offset = 0
        self.last = (0, 0, 0)

    def take(self) -> tuple[int, int, int]:
        """(peak in use since the last take, created so far, spilled so far)."""
        with open(self.path) as f:
            f.seek(self.offset)
            text = f.read()
        lines = [ln for ln in text.split("\n") if ln.count(" ") == 2]
        self.offset += len(text) - len(text.rpartition("\n")[2])  # a line being written is read next time
        samples = [tuple(int(x) for x in ln.split()) for ln in lines]
        peak = max([self.last[0], *(u for u, _, _ in samples)])
        if samples:
            self.last = samples[-1]
        return peak, self.last[1], self.last[2]

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


@dataclass
class Step:
    """One step as the driver lived it."""

    step: int
    wall_s: float
    driver_cpu_s: float
    sent: int
    received: int
    sent_objects: int
    received_objects: int
    peak_rss_mb: float  # the driver's peak so far (ru_maxrss)
    rss_mb: float
    store_peak_gb: float
    store_created_gb: float
    store_spilled_gb: float
    learner_modelled_s: float
    learner_tokens: float
    generate_busy_s: float
    reward_busy_s: float
    wait_s: float  # the learner's wait for its batch (time/wait_rollouts)
    gen_modelled_s: float = math.nan  # filled from the ledger after the run
    ideal_s: float = math.nan


@dataclass
class Probe:
    """Called at each step's log (the loop's own MetricsLogger.log): the step's deltas."""

    counter: Bytes
    store: StoreSampler
    steps: list[Step] = field(default_factory=list)

    def start(self) -> None:
        self.t = time.perf_counter()
        self.cpu = time.process_time()
        self.bytes = self.counter.snapshot()
        _, self.created, self.spilled = self.store.take()

    def step(self, step: int, metrics: dict[str, Any]) -> None:
        now, cpu = time.perf_counter(), time.process_time()
        b = self.counter.snapshot()
        peak, created, spilled = self.store.take()
        self.steps.append(Step(
            step=step, wall_s=now - self.t, driver_cpu_s=cpu - self.cpu,
            sent=b[0] - self.bytes[0], received=b[1] - self.bytes[1],
            sent_objects=b[2] - self.bytes[2], received_objects=b[3] - self.bytes[3],
            peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            rss_mb=psutil.Process().memory_info().rss / 2**20,
            store_peak_gb=peak / 1e9, store_created_gb=(created - self.created) / 1e9,
            store_spilled_gb=(spilled - self.spilled) / 1e9,
            learner_modelled_s=float(metrics.get("sim/learner_modelled_s", math.nan)),
            learner_tokens=float(metrics.get("sim/learner_tokens", math.nan)),
            generate_busy_s=float(metrics.get("time/generate_busy", metrics.get("time/generate", math.nan))),
            reward_busy_s=float(metrics.get("roles/reward/busy_s", math.nan)),
            wait_s=float(metrics.get("time/wait_rollouts", math.nan)),
        ))
        s = self.steps[-1]
        print(f"  step {step}: {s.wall_s:.1f} s, driver recv {s.received / 1e6:.1f} MB, "
              f"sent {s.sent / 1e6:.1f} MB, CPU {s.driver_cpu_s:.2f} s", file=sys.stderr, flush=True)
        self.t, self.created, self.spilled = now, created, spilled
        self.bytes = self.counter.snapshot()
        self.cpu = time.process_time()


class ProbedLogger(MetricsLogger):
    """The run's MetricsLogger, which also hands every step's metrics to the probe."""

    def __init__(self, probe: Probe, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.probe = probe

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        super().log(step, metrics)
        self.probe.step(step, metrics)


# --- the cluster --------------------------------------------------------------------------------------------


def cluster_env(state: Path, store_fraction: float) -> dict[str, str]:
    ray_bin = Path(sys.executable).with_name("ray")
    return {**os.environ, "RAYWARD_CLUSTER_DIR": str(state), "RAY": str(ray_bin),
            # every node's object store: this share of the machine's memory (Ray's default is 0.3 per node,
            # four nodes on one machine would promise more than it has)
            "RAY_DEFAULT_OBJECT_STORE_MEMORY_PROPORTION": str(store_fraction)}


def start_cluster(state: Path, store_fraction: float) -> str:
    """local_cluster.sh: head, one reward node, one generator node, then a learner node; the GCS address."""
    env = cluster_env(state, store_fraction)
    for args in (["up", "--reward-nodes", "1", "--generator-node"],
                 ["add-node", "--num-cpus", "2", "--resources", LEARNER_NODE]):
        p = subprocess.run(["bash", str(CLUSTER_SCRIPT), *args], env=env, capture_output=True, text=True,
                           timeout=600)
        if p.returncode != 0:
            raise RuntimeError(f"local_cluster.sh {args[0]} failed:\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    return f"127.0.0.1:{(state / 'base_port').read_text().strip()}"


def stop_cluster(state: Path, store_fraction: float) -> None:
    subprocess.run(["bash", str(CLUSTER_SCRIPT), "down"], env=cluster_env(state, store_fraction),
                   capture_output=True, text=True, timeout=300)


# --- the run ------------------------------------------------------------------------------------------------


class SyntheticTokenizer:
    """What PromptSource needs of a tokenizer: a prompt's text as `prompt_len` ids (fixed per text)."""

    def __init__(self, prompt_len: int):
        self.prompt_len = prompt_len

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        import zlib

        import numpy as np

        rng = np.random.default_rng(zlib.crc32(text.encode()))
        return {"input_ids": rng.integers(0, VOCAB, self.prompt_len).tolist()}


def config(args: argparse.Namespace, name: str, gcs: str, run_root: Path) -> RunConfig:
    share = math.floor(10_000 / args.generators) / 10_000  # of the generator node's one generator_node unit
    return parse_config({
        "name": name,
        "rewards": [{"name": "length", "function": "bench.scale_sim_rewards:length_reward", "batched": True}],
        "generation": {"num_generations": args.group_size, "generation_batch_size": args.samples,
                       "max_completion_length": args.tokens,
                       "max_model_len": args.tokens + args.prompt_tokens + 1},
        "grpo": {"max_steps": args.steps, "per_device_train_batch_size": args.group_size,
                 "router_replay": "R3" if args.routes else None},
        "loop": {"mode": args.loop, "max_staleness": args.max_staleness},
        "weight_sync": {"backend": "object_store"},
        "cluster": {
            "address": gcs, "num_generators": args.generators, "num_reward_workers": args.reward_workers,
            "generator_max_restarts": 0,
            "generator": {"num_cpus": 0, "resources": {"generator_node": share}},
            "learner": {"num_cpus": 0, "resources": {"learner_node": 1}},
            "reward_worker": {"num_cpus": 0.25, "resources": {"reward_node": 1}},
        },
        "logging": {"dir": str(run_root), "progress": False, "report_to": ["jsonl"],
                    "check_logprob_parity": False, "log_completions": args.log_completions,
                    "token_samples": 0},
        "data": {"shuffle_dataset": False},
    })


def prompt_rows(n: int, prompt_len: int) -> list[dict[str, Any]]:
    """Distinct prompt rows whose text is about as long as their ids (4 characters a token), and an answer."""
    filler = "lorem ipsum " * (prompt_len * 4 // 12)
    return [{"prompt": f"q{i} {filler}", "answer": str(i % 10)} for i in range(n)]


def build(args: argparse.Namespace, name: str, gcs: str, probe_factory: Any) -> tuple[Any, Any, list[float]]:
    """The run (Ray initialised), the ledger its generators report to, and each generator's private MiB."""
    run_root = Path(tempfile.gettempdir()) / "rayward-scale-sim"
    cfg = config(args, name, gcs, run_root)
    ns = namespace(name)
    prompts_per_step = args.samples // args.group_size
    rows = prompt_rows(prompts_per_step * (args.steps + 3), args.prompt_tokens)
    prepared = Prepared(cfg, name, model_path="synthetic",
                        specs=reward_specs(cfg.rewards, chat_template_kwargs={}, seed=cfg.seed),
                        prompts=PromptSource(rows, SyntheticTokenizer(args.prompt_tokens), cfg.data,
                                             seed=cfg.seed),
                        run_dir=run_root / name, rewards=list(cfg.rewards))
    ledger = ray.remote(Ledger).options(name=f"{name}/scale-sim-ledger", namespace=ns, num_cpus=0).remote()
    engine = EngineModel(engine_tps=args.engine_tps, seq_tps=args.seq_tps, median_frac=args.median_frac,
                         sigma=args.sigma, route_layers=args.route_layers if args.routes else 0)
    reward_pool = start_reward_pool(cfg, name, prepared.specs)
    c = cfg.cluster
    generators = GeneratorGroup(
        SyntheticGenerator, c.num_generators,
        concurrency_groups={**GENERATOR_GROUPS, HEALTH_GROUP: 1}, method_groups=GENERATOR_METHOD_GROUPS,
        run_name=name, role="generator",
        # no torch in the synthetic generators' processes (Ray imports it in every worker where zero-copy
        # torch tensors are on; they send none): they stay small, and more of them fit on the machine
        options=generator_options(c.generator, 1, c.generator_max_restarts, namespace=ns,
                                  max_concurrency=generator_calls(cfg),
                                  runtime_env={"env_vars": {"RAY_ENABLE_ZERO_COPY_TORCH_TENSORS": "0"}}),
        args=("synthetic",),
        kwargs=dict(engine=engine, max_tokens=args.tokens, prompt_len=args.prompt_tokens, ledger=ledger,
                    shared_engine=args.shared_engine, payload_hold=cfg.loop.max_staleness + HOLD_LOADS),
        per_actor_kwargs=[{"seed": cfg.seed + i, "index": i} for i in range(c.num_generators)],
    )
    learner = LearnerGroup(
        SyntheticLearner, 1, run_name=name, options=actor_options(c.learner, namespace=ns),
        kwargs={"model": LearnerModel(args.learner_tps, cfg.grpo.num_iterations)},
        rank0_kwargs={"reward_pool": reward_pool.handle},
    )
    learner.wait_started(PLACEMENT_TIMEOUT_S)
    generators.wait_started(PLACEMENT_TIMEOUT_S)
    rss = generators.on_each(private_mb)
    groups = Groups(generators, learner, reward_pool, weight_transfer(cfg, learner, generators))
    logger = ProbedLogger(probe_factory(), prepared.run_dir, report_to=["jsonl"], progress=False,
                          max_steps=cfg.grpo.max_steps, run_name=name,
                          display=Display(cfg.grpo.max_steps, stream=io.StringIO()))
    return assemble_run(prepared, groups, logger), ledger, rss


def generator_calls(cfg: RunConfig) -> int:
    """Generation calls one generator runs at once: the async feed's (as orchestrator/run/build/start.py sizes
    the real generators), else one."""
    if cfg.loop.mode != "async":
        return 1
    g = cfg.generation
    return feed_shape(g.generation_batch_size // g.num_generations, cfg.cluster.num_generators,
                      cfg.loop.generation_chunks, cfg.loop.max_staleness, cfg.grpo.num_iterations
                      ).calls_per_generator


def warm_reward_pool(run: Any, group_size: int, timeout_s: float = 600.0) -> None:
    """Every reward worker up (each imports transformers first) and one group scored, so the first step does
    not wait for them: that start is the run's, not the data plane's."""
    deadline = time.monotonic() + timeout_s
    while True:
        st = ray.get(run.reward_pool.handle.stats.remote())
        if st.workers >= st.target_workers and not st.starting:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"reward workers not up after {timeout_s:.0f} s: {st}")
        time.sleep(1.0)
    g = group_size
    batch = RewardBatch(["q"] * g, ["abc"] * g, [[1, 2, 3]] * g, {"answer": ["1"] * g}, g)
    run.reward_pool.score(batch, chunk_groups=1)


def gen_modelled(records: list[dict[str, Any]], calls_per_batch: int) -> list[float]:
    """Per batch, in order: the busiest engine's modelled seconds (an engine runs its calls one after another;
    batch b is each engine's calls b * calls_per_batch ... (b + 1) * calls_per_batch - 1)."""
    by_member: dict[int, list[dict[str, Any]]] = {}
    for r in records:
        if r["kind"] == "generate":
            by_member.setdefault(r["member"], []).append(r)
    per_batch: dict[int, float] = {}
    for calls in by_member.values():
        sums: dict[int, float] = {}
        for k, r in enumerate(sorted(calls, key=lambda r: r["call"])):
            sums[k // calls_per_batch] = sums.get(k // calls_per_batch, 0.0) + r["modelled_s"]
        for b, total in sums.items():
            per_batch[b] = max(per_batch.get(b, 0.0), total)
    return [per_batch[b] for b in sorted(per_batch)]


# --- the report ---------------------------------------------------------------------------------------------


def table(steps: list[Step], samples: int) -> str:
    """The steps as a markdown table (bench/README.md's)."""
    head = ("| step | wall s | ideal s (gen / learner) | step/ideal | driver recv MB | driver sent MB "
            "| B/sample | objects in / out | driver CPU s | CPU % of ideal | driver peak RSS MB "
            "| store peak GB | store created GB |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for s in steps:
        ideal = f"{s.ideal_s:.1f} ({s.gen_modelled_s:.1f} / {s.learner_modelled_s:.1f})"
        lines.append(
            f"| {s.step} | {s.wall_s:.1f} | {ideal} | {s.wall_s / s.ideal_s:.2f} | {s.received / 1e6:.1f} "
            f"| {s.sent / 1e6:.1f} | {(s.received + s.sent) / samples:.0f} "
            f"| {s.received_objects} / {s.sent_objects} | {s.driver_cpu_s:.2f} "
            f"| {100 * s.driver_cpu_s / s.ideal_s:.1f} | {s.peak_rss_mb:.0f} | {s.store_peak_gb:.2f} "
            f"| {s.store_created_gb:.2f} |")
    return "\n".join(lines)


def shape(args: argparse.Namespace) -> str:
    routes = f" + routes ({args.route_layers} layers)" if args.routes else ""
    return (f"{args.samples} samples x {args.tokens} tokens{routes}, {args.generators} generators, "
            f"{args.loop}")


def summary(steps: list[Step], samples: int) -> tuple[float, float, float]:
    """(driver bytes per sample, driver CPU share of the ideal, step / ideal). Bytes and CPU over all the
    steps: each batch's traffic and work fall in some step (pipelined: a batch's groups arrive during earlier
    steps), and every batch is trained by the last. Step / ideal over the steps after the first (which
    overlaps nothing)."""
    rest = steps[1:] or steps
    return (sum(s.received + s.sent for s in steps) / (samples * len(steps)),
            sum(s.driver_cpu_s for s in steps) / sum(s.ideal_s for s in steps),
            sum(s.wall_s for s in rest) / sum(s.ideal_s for s in rest))


def default_generators(samples: int) -> int:
    return max(MIN_GENERATORS, min(MAX_GENERATORS, samples // SAMPLES_PER_ENGINE))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=4096, help="completions per step (prompts x --group-size)")
    ap.add_argument("--tokens", type=int, default=4096, help="max completion tokens (the length cap)")
    ap.add_argument("--routes", action="store_true", help="MoE routes on every sample (routing replay R3)")
    ap.add_argument("--route-layers", type=int, default=ROUTE_LAYERS,
                    help="MoE layers in the routes (48: Qwen3-30B-A3B; fewer to fit the object stores here)")
    ap.add_argument("--generators", type=int, default=None,
                    help=f"synthetic engines (default samples / {SAMPLES_PER_ENGINE}, "
                         f"{MIN_GENERATORS}..{MAX_GENERATORS})")
    ap.add_argument("--group-size", type=int, default=8, help="num_generations (G)")
    ap.add_argument("--prompt-tokens", type=int, default=256, help="tokens per prompt")
    ap.add_argument("--steps", type=int, default=5,
                    help="grpo.max_steps (the first is left out of the summary)")
    ap.add_argument("--loop", choices=["pipelined", "sync", "async"], default="pipelined")
    ap.add_argument("--max-staleness", type=int, default=1, help="loop.max_staleness")
    ap.add_argument("--shared-engine", action="store_true",
                    help="one modelled engine per generator shared by its calls (always with --loop async)")
    ap.add_argument("--engine-tps", type=float, default=16_000.0, help="modelled tokens/s of one engine")
    ap.add_argument("--seq-tps", type=float, default=200.0, help="modelled tokens/s of one sequence")
    ap.add_argument("--learner-tps", type=float, default=400_000.0, help="modelled learner tokens/s")
    ap.add_argument("--median-frac", type=float, default=0.35, help="median completion length / --tokens")
    ap.add_argument("--sigma", type=float, default=0.8, help="log-normal shape of the completion lengths")
    ap.add_argument("--reward-workers", type=int, default=2)
    ap.add_argument("--log-completions", action="store_true", help="logging.log_completions (off by default)")
    ap.add_argument("--address", default=None, help="a running cluster with the bench's node resources")
    ap.add_argument("--store-fraction", type=float, default=0.12,
                    help="each node's object store, as a share of the machine's memory (started cluster)")
    ap.add_argument("--json", default=None, help="write the steps and the summary here")
    args = ap.parse_args()
    args.generators = args.generators or default_generators(args.samples)
    args.shared_engine = args.shared_engine or args.loop == "async"
    if args.samples % args.group_size:
        ap.error("--samples must be a multiple of --group-size")
    if args.steps < 2:
        ap.error("--steps must be at least 2 (the first is a warm-up)")

    t_start = time.perf_counter()
    state = Path(tempfile.mkdtemp(prefix="rwss-", dir="/tmp"))
    name = f"scalesim-{os.getpid()}"
    counter = Bytes()
    count_driver_bytes(counter)
    run, store = None, None
    try:
        gcs = args.address or start_cluster(state, args.store_fraction)
        init_ray(ClusterConfig(address=gcs), name)
        store = StoreSampler(gcs, state / "store.txt")
        probe = Probe(counter, store)
        t_cluster = time.perf_counter()
        run, ledger, gen_rss = build(args, name, gcs, lambda: probe)
        warm_reward_pool(run, args.group_size)
        t_built = time.perf_counter()
        started = (f"cluster up in {t_cluster - t_start:.0f} s, actors in {t_built - t_cluster:.0f} s; "
                   f"generators {min(gen_rss):.0f}-{max(gen_rss):.0f} MiB private each")
        print(f"scale_sim: {shape(args)}; {started}", file=sys.stderr, flush=True)
        probe.start()
        LOOPS[args.loop](run)
        t_loop = time.perf_counter() - t_built
        counter.paused = True
        records = ray.get(ledger.take.remote())
        occupancy = run.generators.on_each(SyntheticGenerator.occupancy) if args.shared_engine else []
    finally:
        if store is not None:
            store.stop()
        if run is not None:
            shutdown_run(run)
        if ray.is_initialized():
            ray.shutdown()
        if args.address is None:
            stop_cluster(state, args.store_fraction)
    shutil.rmtree(state, ignore_errors=True)  # the nodes' logs: kept where the run failed (it raised above)

    calls_per_batch = run.cfg.loop.generation_chunks if args.loop == "pipelined" else 1
    gen = gen_modelled(records, calls_per_batch)
    if args.loop == "async":  # no batch per call: the ideal is the engines' tokens at full occupancy
        full = [sum(r["tokens"] for r in records if r["kind"] == "generate")
                / (args.engine_tps * args.generators * len(probe.steps))] * len(probe.steps)
        gen = full
    for s, g in zip(probe.steps, gen, strict=False):
        s.gen_modelled_s = g
        stages = [g, s.learner_modelled_s]
        s.ideal_s = sum(stages) if args.loop == "sync" else max(stages)
    tokens = sum(r["tokens"] for r in records if r["kind"] == "generate") / max(len(gen), 1)
    gen_cpu = sum(r["cpu_s"] for r in records if r["kind"] == "generate") / max(len(gen), 1)
    print(f"\n{shape(args)} (mean {tokens / args.samples:.0f} completion tokens); engine "
          f"{args.engine_tps:.0f} tokens/s ({args.seq_tps:.0f} per sequence), learner {args.learner_tps:.0f} "
          f"tokens/s; generators' CPU {gen_cpu:.2f} s per batch; {started}; loop {t_loop:.0f} s, all "
          f"{time.perf_counter() - t_start:.0f} s")
    print(table(probe.steps, args.samples))
    b, x, r = summary(probe.steps, args.samples)
    rest = probe.steps[1:]
    steps_per_s = len(rest) / sum(s.wall_s for s in rest)
    if occupancy:
        busy = sum(o[0] for o in occupancy)
        occ = sum(o[0] * o[1] for o in occupancy) / busy if busy else math.nan
        print(f"engine occupancy {100 * occ:.0f}% of capacity while busy; steps/s {steps_per_s:.4f} "
              f"(after the first); learner wait {sum(s.wait_s for s in rest) / len(rest):.1f} s per step")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "steps": [asdict(s) for s in probe.steps],
                                               "bytes_per_sample": b, "cpu_share": x, "step_over_ideal": r,
                                               "steps_per_s": steps_per_s,
                                               "loop_s": t_loop, "total_s": time.perf_counter() - t_start},
                                              indent=1))
    print(f"driver bytes/sample {b:.0f}; driver CPU share {100 * x:.1f}%; step/ideal {r:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
