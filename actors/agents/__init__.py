"""Multi-turn rollouts: token in, token out.

    loop.py          `AgentLoop`: TRL's tool loop, each trajectory at its own pace over the engine loop
    endpoint.py      the OpenAI-compatible endpoint per generator, one base URL and key per trajectory
    openai_api.py    the chat-completions protocol as the endpoint serves it (pure)
    chat.py          chat templates: first prompt, tool-result suffix ids, tool calls parsed, the template check
    rollouts.py      the generator's agentic part: none, the TRL tool loop, or the endpoint
    agent_worker.py  `AgentWorker`: runs a user's agent function many at once
"""
