"""The learner: the policy in torch and the GRPO update.

    learner.py        `Learner`: the policy, the update, micro-batches, `num_iterations`
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
