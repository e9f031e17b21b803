"""The learner: the policy in torch and the GRPO update.

    learner.py        `Learner`: the policy, the update, micro-batches, `num_iterations`
    step.py           `StepContext` (one step's batch, plan, masks, frozen inputs), loss masks, the step's metrics
    model.py          policy and reference loading (LoRA, checkpointing, FSDP), CPU threads, `meta_model`
    optim.py          optimizer, learning-rate schedule, clipping
    packing.py        the `grpo.padding_free` choice and its probe
    inputs.py         the inputs part: text, or a VLM's pixel inputs and placeholder bias
    moe.py            the mixture-of-experts parts: routing replay (R2, R3, none) and the aux loss
    sampling.py       the sampling-correction part: vLLM importance weights and the sampler-learner gap
    teacher.py        the distillation part: the teacher's log-probs per micro-batch
    specs.py          what it is built from: `LearnerSpec`, `ParallelSpec`
    loss.py           the GRPO loss and vLLM importance weights (pure; TRL's semantics)
    distill.py        on-policy distillation's two forms (pure)
    micro_batches.py  the step's micro-batches and each rank's slots (pure)
    layout.py         a micro-batch padded or packed
    distributed.py    the ranks' process group and FSDP2 sharding
    routing.py        mixture of experts: routing replay (R2, R3) and the aux-loss rule
    lora.py           LoRA through PEFT
    checkpoint.py     atomic HF checkpoints + optimizer state and RNGs
"""
