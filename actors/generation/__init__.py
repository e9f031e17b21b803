"""The generator: one vLLM engine in an actor.

    generator.py    `Generator`: batched and streamed sampling, agentic rollouts, weights labelled by step
    engine.py       `open_engine` (every vLLM engine of a run: the policy's, a judge's, a teacher's) and `EngineLoop`:
                    one thread steps the engine; requests join as they come, loads between steps
    prompts.py      the prompts part: token ids (`TokenPrompts`) or a VLM's images (`ImagePrompts`)
    routes.py       the routing-replay part (R3): `RouteCapture` or `NoRoutes`
    vllm_compat.py  every reach into vLLM's internals for MoE (the CPU experts' repack, routing capture)
    vllm_plugin.py  vLLM plugin: caps the engine queues' idle busy-spin
"""
