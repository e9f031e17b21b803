"""`weight_sync:` how new weights travel from the learner into the generators."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from orchestrator.config.base import _Section

# Weight-sync bucket: the first bucket is on the wire alone and the last one loads alone, so smaller buckets
# overlap the wire with vLLM's load more finely, until per-bucket costs win; 64 MiB was the fastest of the sizes
# tried (bench/README.md, bench/weight_sync.py). On NCCL a 64 MiB broadcast is still far above the size where
# launch latency matters.
DEFAULT_BUCKET_MB = 64.0


class WeightSyncConfig(_Section):
    backend: Literal["collective", "object_store"] = "collective"
    """`collective`: the learner's rank 0 broadcasts the weights bucket by bucket to every engine worker (every
    tensor-parallel rank) over a process group (NCCL on GPUs, gloo on CPU), each worker loading each bucket in
    place as it arrives. `object_store`: the whole state dict as safetensors bytes through Ray's object store
    (slower, more memory; for clusters whose generator nodes cannot open TCP connections to the learner's node)."""
    bucket_mb: float = Field(DEFAULT_BUCKET_MB, gt=0)
    """Collective: bucket size in MiB. The learner holds at most two buckets beyond the model (one on the wire, one
    being packed); an engine holds two buckets plus what vLLM's layerwise reload needs for the layer being loaded
    (that layer afresh and, on CPU, its repacked copy: with a large embedding, more than a bucket). Smaller buckets
    overlap the wire and the engine's load more finely, larger ones mean fewer collectives."""
    timeout_s: float = Field(600.0, gt=0)
    """Collective: seconds any member waits for the others (forming the group, each bucket) before the sync
    fails naming the stage and the engine. It must cover a generation already queued on a generator ahead of
    the sync in pipelined mode."""
