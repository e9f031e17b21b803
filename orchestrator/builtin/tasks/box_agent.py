"""The box task (orchestrator/builtin/tasks/boxes.py) as an agent written only against the OpenAI API: what a user brings.

It knows nothing of rayward: it takes an `openai` client and the dataset row, keeps its own tools (the boxes are
drawn from the row's seed, as BoxEnv draws them), sends the OpenAI tool schemas of `open_box` and `submit`,
runs the tool calls the model returns and sends their results back as `tool` messages, for at most
MAX_ROUNDS rounds, and returns the reward: 1.0 when its first submitted code is the asked box's. Run against any
OpenAI-compatible server it behaves the same (`python -m orchestrator.builtin.tasks.box_agent --base-url ...`).

`box_agent` is the `async def` form (`AsyncOpenAI`, streaming its requests), `box_agent_sync` the sync one; both
are the agent of configs/agent.yaml (`agent_function:`), trained by rayward through the agent endpoint.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
from typing import Any

from orchestrator.builtin.tasks.boxes import CODES, NUM_BOXES

# Rounds of tool calls the agent allows (configs/tools.yaml: generation.max_tool_calling_iterations).
MAX_ROUNDS = 3
# Tokens per model turn the agent asks for (a turn is one short tool call or answer).
MAX_TOKENS = 48

def open_box(box: int) -> str:
    """Open a box and read the code inside.

    Args:
        box: The number of the box to open.
    """
    raise NotImplementedError  # a schema only: Boxes.call runs it


def submit(code: int) -> str:
    """Submit the code. Only the first submission counts.

    Args:
        code: The code to submit.
    """
    raise NotImplementedError  # a schema only: Boxes.call runs it


def _tools() -> list[dict[str, Any]]:
    """The tools' OpenAI schemas, from the functions' type hints and docstrings (transformers' get_json_schema, as
    many agent libraries make them): the schemas TRL makes of BoxEnv's methods, so both paths' prompts are equal."""
    from transformers.utils import get_json_schema

    return [get_json_schema(open_box), get_json_schema(submit)]


TOOLS = _tools()


class Boxes:
    """The agent's own tools: the row's boxes (drawn from its seed as BoxEnv draws them)."""

    def __init__(self, seed: int, box: int) -> None:
        rng = random.Random(seed)
        self.codes = dict(zip(range(1, NUM_BOXES + 1), rng.sample(CODES, NUM_BOXES), strict=True))
        self.box = box
        self.submitted: int | None = None

    def call(self, name: str, arguments: str) -> str:
        try:
            args = json.loads(arguments or "{}")
            if name == "open_box":
                return str(self.codes[int(args["box"])])
            if name == "submit":
                if self.submitted is None:
                    self.submitted = int(args["code"])
                    return "Submitted."
                return "Already submitted."
            return f"Error: no tool named {name}."
        except (KeyError, ValueError, TypeError) as err:
            return f"Error: {err}"

    def reward(self) -> float:
        return float(self.submitted == self.codes[self.box])


def _assistant(message: Any) -> dict[str, Any]:
    """The assistant message to send back, as OpenAI's docs show it (the SDK's message, as a dict)."""
    out: dict[str, Any] = {"role": "assistant", "content": message.content}
    if message.tool_calls:
        out["tool_calls"] = [{"id": c.id, "type": "function",
                              "function": {"name": c.function.name, "arguments": c.function.arguments}}
                             for c in message.tool_calls]
    return out


async def box_agent(client: Any, row: dict[str, Any], *, model: str) -> float:
    """The agent (async): streamed requests, tool calls answered until the model answers or MAX_ROUNDS pass."""
    boxes = Boxes(row["seed"], row["box"])
    messages: list[dict[str, Any]] = list(row["prompt"])
    for _ in range(MAX_ROUNDS + 1):
        stream = await client.chat.completions.create(model=model, messages=messages, tools=TOOLS,
                                                      max_tokens=MAX_TOKENS, stream=True)
        content, calls = "", {}
        async for chunk in stream:
            if not chunk.choices:
                continue
            delta = chunk.choices[0].delta
            content += delta.content or ""
            for c in delta.tool_calls or []:
                slot = calls.setdefault(c.index, {"id": c.id, "name": "", "arguments": ""})
                slot["name"] += c.function.name or ""
                slot["arguments"] += c.function.arguments or ""
        if not calls:
            break
        messages.append({"role": "assistant", "content": content or None, "tool_calls": [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for c in calls.values()]})
        for c in calls.values():
            messages.append({"role": "tool", "tool_call_id": c["id"], "content": boxes.call(c["name"], c["arguments"])})
    return boxes.reward()


def box_agent_sync(client: Any, row: dict[str, Any], *, model: str) -> float:
    """The agent (sync client, no streaming): the same loop."""
    boxes = Boxes(row["seed"], row["box"])
    messages: list[dict[str, Any]] = list(row["prompt"])
    for _ in range(MAX_ROUNDS + 1):
        response = client.chat.completions.create(model=model, messages=messages, tools=TOOLS, max_tokens=MAX_TOKENS)
        message = response.choices[0].message
        if not message.tool_calls:
            break
        messages.append(_assistant(message))
        for c in message.tool_calls:
            messages.append({"role": "tool", "tool_call_id": c.id, "content": boxes.call(c.function.name,
                                                                                        c.function.arguments)})
    return boxes.reward()


def main() -> None:
    """Run the agent once against any OpenAI-compatible server."""
    import openai

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--api-key", default="none")
    parser.add_argument("--model", required=True)
    parser.add_argument("--box", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    row = {"prompt": [{"role": "user", "content": f"Open box {args.box} and submit its code."}], "box": args.box,
           "seed": args.seed}
    client = openai.AsyncOpenAI(base_url=args.base_url, api_key=args.api_key)
    print(asyncio.run(box_agent(client, row, model=args.model)))


if __name__ == "__main__":
    main()
