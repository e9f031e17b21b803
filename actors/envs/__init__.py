"""The environment pool: TRL environment classes and tools, run where the driver and generators are not.

    spec.py    TRL's `tools` / `environment_factory` read as TRL reads them (pure); `EnvSpec`
    worker.py  `EnvWorker`: sessions, tool calls with timeouts, get_reward
    pool.py    `EnvPool`: sessions placed on the least-loaded worker; dead or hung workers replaced
    client.py  what an agent loop needs from the pool (`PoolEnvironments`)
"""
