"""The generator: one vLLM engine in an actor.

    generator.py    `Generator`: batched and streamed sampling, agentic rollouts, weights labelled by step
    engine.py       `EngineLoop`: one thread steps the engine; requests join as they come, loads between steps
    vllm_compat.py  every reach into vLLM's internals for MoE (the CPU experts' repack, routing capture)
    vllm_plugin.py  vLLM plugin: caps the engine queues' idle busy-spin
"""
