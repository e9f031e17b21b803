"""Run directories for the viewer's tests: a synthetic run written row by row as a run writes it (metrics.jsonl,
completions.jsonl, tokens.jsonl through records.TokenRecorder), and a token record made for a real run's
completions log from its text (until runs write tokens.jsonl themselves: their ids are the text retokenized,
their log-probs made up)."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

from orchestrator.telemetry.metrics import COMPLETIONS_FILE, METRICS_FILE
from orchestrator.view.records import TokenRecorder

WORDS = ("alpha", "beta", "gamma", "delta", "box", "letter", "answer", "the", "is", "open")


def char_decode(ids: list[int]) -> list[str]:
    """The synthetic run's 'tokenizer': id i is the word WORDS[i % len] with a space."""
    return [" " + WORDS[i % len(WORDS)] for i in ids]


class SyntheticRun:
    """A run that writes a step at a time: `write_step(step)` appends its metrics row, its completions rows and
    its token lines. Group g of every step has the same total for all its samples when g is in `flat_groups`.
    agentic: completions are conversations with a tool call and a stop reason; eval_every: an eval row after
    those steps."""

    def __init__(self, run_dir: Path, *, groups: int = 4, group_size: int = 4, tokens: int = 12,
                 token_samples: int = 4, flat_groups: tuple[int, ...] = (1,), agentic: bool = False,
                 eval_every: int = 0, learner_logprobs: bool = True, seed: int = 0):
        self.dir = Path(run_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.groups, self.group_size, self.tokens = groups, group_size, tokens
        self.flat_groups, self.agentic, self.eval_every = flat_groups, agentic, eval_every
        self.learner_logprobs = learner_logprobs
        self.recorder = TokenRecorder(self.dir, token_samples, decode=char_decode)
        self.rng = random.Random(seed)

    def metrics_row(self, step: int) -> dict[str, Any]:
        r = self.rng
        reward = min(1.0, 0.05 + step * 0.01 + r.random() * 0.02)
        return {"step": step, "reward": reward, "reward_std": 0.1, "rewards/letter/mean": reward,
                "rewards/format/mean": 0.5 + 0.1 * math.sin(step / 5), "gates/format/closed_frac": 0.25,
                "kl": 0.001 * step, "entropy": 3.0 / (1 + step / 50), "completions/mean_length": 15.5,
                "completions/min_length": 12, "completions/max_length": 16, "time/step": 0.3 + r.random() * 0.05,
                "time/generate": 0.12, "time/reward": 0.03, "time/train": 0.1, "time/sync": 0.02,
                "loss": r.random() - 0.5, "grad_norm": float("nan"), "roles/bottleneck": "generator",
                "policy_version": step - 1}

    def completion(self, step: int, g: int, j: int) -> Any:
        text = f"step {step} group {g} answer {j}"
        if not self.agentic:
            return text
        return [{"role": "assistant", "content": "", "tool_calls": [
                    {"type": "function", "function": {"name": "open_box", "arguments": {"box": j}}}]},
                {"role": "tool", "name": "open_box", "content": f"code {100 + j}"},
                {"role": "assistant", "content": text}]

    def write_step(self, step: int) -> None:
        with open(self.dir / METRICS_FILE, "a") as f:
            f.write(json.dumps(self.metrics_row(step)) + "\n")
            if self.eval_every and step % self.eval_every == 0:
                f.write(json.dumps({"step": step, "eval/reward": 0.1 + step * 0.01, "eval/pass@1": 0.2,
                                    "eval/pass@4": 0.5, "eval/prompts": 8}) + "\n")
        rows, ids, logprobs, masks = [], [], [], []
        for g in range(self.groups):
            for j in range(self.group_size):
                total = 0.5 if g in self.flat_groups else round(j / self.group_size, 3)
                row: dict[str, Any] = {"step": step, "policy_version": step - 1, "prompt_index": step * 100 + g,
                                       "prompt": f"Write the letter {'abcd'[g % 4]}:",
                                       "completion": self.completion(step, g, j), "total": total,
                                       "advantage": 0.0 if g in self.flat_groups else j - (self.group_size - 1) / 2,
                                       "rewards/letter": total, "gated/letter": total,
                                       "rewards/format": 1.0, "gated/format": 0.0 if j == 0 else 1.0}
                if self.agentic:
                    row.update(stop_reason="stop" if j else "max_turns", turns=2, tool_calls=1, tool_failures=0)
                rows.append(row)
                ids.append([self.rng.randrange(1000) for _ in range(self.tokens)])
                logprobs.append([-(self.rng.random() ** 3) * 6 for _ in range(self.tokens)])
                masks.append([0 if self.agentic and 3 <= t < 6 else 1 for t in range(self.tokens)])
        with open(self.dir / COMPLETIONS_FILE, "a") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
        learner = [[lp + self.rng.uniform(-0.05, 0.05) for lp in lps] for lps in logprobs]
        record_step(self.recorder, step, ids, logprobs, prompt_index=[r["prompt_index"] for r in rows],
                    learner_logprobs=learner if self.learner_logprobs else None, masks=masks if self.agentic else None)

    def write(self, steps: range) -> SyntheticRun:
        for step in steps:
            self.write_step(step)
        return self


def record_step(recorder: TokenRecorder, step: int, ids: list[list[int]], logprobs: list[list[Any]], *,
                prompt_index: list[Any] | None = None, learner_logprobs: list[list[Any]] | None = None,
                masks: list[list[int]] | None = None) -> int:
    """A step's rows into the recorder as a run records them: the picked rows (TokenRecorder.picks), each as the
    learner returns it (TrainResult.token_records)."""
    rows = {i: {"ids": ids[i], "logprobs": logprobs[i],
                "learner_logprobs": None if learner_logprobs is None else learner_logprobs[i],
                "mask": None if masks is None else masks[i]} for i in recorder.picks(len(ids))}
    return recorder.record(step, rows, prompt_index)


def token_record_for(run_dir: Path, tokenizer: Any, samples_per_step: int = 4, seed: int = 0) -> int:
    """A tokens.jsonl for a real run's completions log: each recorded completion's text retokenized (a
    conversation message by message through the chat template, tool messages and scaffold out of the loss),
    made-up log-probs; the learner's a little off them. Returns the bytes written."""
    from orchestrator.view.records import decode_tokens

    rng = random.Random(seed)
    recorder = TokenRecorder(run_dir, samples_per_step, decode=lambda ids: decode_tokens(tokenizer, ids))
    by_step: dict[int, list[dict[str, Any]]] = {}
    with open(run_dir / COMPLETIONS_FILE) as f:
        for line in f:
            row = json.loads(line)
            by_step.setdefault(row["step"], []).append(row)
    written = 0
    for step, rows in by_step.items():
        ids, masks = [], []
        for row in rows:
            i, m = _tokenize(tokenizer, row)
            ids.append(i)
            masks.append(m)
        logprobs = [[None if not m[t] else -(rng.random() ** 3) * 6 for t in range(len(i))] for i, m in
                    zip(ids, masks, strict=True)]
        learner = [[None if lp is None else lp + rng.uniform(-0.05, 0.05) for lp in lps] for lps in logprobs]
        written += record_step(recorder, step, ids, logprobs, prompt_index=[r.get("prompt_index") for r in rows],
                               learner_logprobs=learner, masks=masks)
    return written


def _tokenize(tokenizer: Any, row: dict[str, Any]) -> tuple[list[int], list[int]]:
    completion = row["completion"]
    if isinstance(completion, list) and len(completion) == 1 and not completion[0].get("tool_calls"):
        completion = completion[0].get("content") or ""  # a conversational prompt's one-turn answer
    if isinstance(completion, str):
        ids = tokenizer(completion, add_special_tokens=False)["input_ids"]
        return ids, [1] * len(ids)
    prompt = row["prompt"] if isinstance(row["prompt"], list) else [{"role": "user", "content": row["prompt"]}]
    ids, mask = [], []
    before = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=False)
    for k, msg in enumerate(completion):
        text = tokenizer.apply_chat_template(prompt + completion[: k + 1], tokenize=False)
        piece = tokenizer(text[len(before):], add_special_tokens=False)["input_ids"]
        ids += piece
        mask += [1 if msg.get("role") == "assistant" else 0] * len(piece)
        before = text
    return ids, mask


def long_run(run_dir: Path, steps: int, *, rows_per_step: int = 64, group_size: int = 8, token_samples: int = 4,
             eval_every: int = 50, seed: int = 0) -> Path:
    """A long finished run shaped like the demo's (its metrics row's keys, 64 completions a step, 16 tokens each,
    an eval row every eval_every steps), written at once: the page's first-paint measure."""
    rng = random.Random(seed)
    run_dir.mkdir(parents=True, exist_ok=True)
    recorded = Path(__file__).parents[3] / "integration" / "orchestrator" / "view" / "recorded" / "demo"
    template = json.loads((recorded / METRICS_FILE).read_text().splitlines()[-1])
    with open(run_dir / METRICS_FILE, "w") as f:
        for step in range(1, steps + 1):
            row = {k: (v * (0.8 + 0.4 * rng.random()) if isinstance(v, float) else v) for k, v in template.items()}
            row.update(step=step, reward=min(1.0, step / steps + 0.05 * rng.random()), global_step=step)
            f.write(json.dumps(row) + "\n")
            if eval_every and step % eval_every == 0:
                f.write(json.dumps({"step": step, "eval/reward": step / steps, "eval/pass@1": step / steps / 2,
                                    "eval/pass@8": min(1.0, 2 * step / steps), "eval/prompts": 16}) + "\n")
    recorder = TokenRecorder(run_dir, token_samples, decode=char_decode)
    with open(run_dir / COMPLETIONS_FILE, "w") as f:
        for step in range(1, steps + 1):
            for i in range(rows_per_step):
                total = rng.random()
                f.write(json.dumps({"step": step, "policy_version": step - 1,
                                    "prompt_index": step * 8 + i // group_size,
                                    "prompt": "Write the letter d:", "completion": "".join(
                                        rng.choice("abcd efgh") for _ in range(24)), "total": total,
                                    "advantage": total - 0.5, "rewards/letter": total, "gated/letter": total}) + "\n")
            record_step(recorder, step, [[rng.randrange(512) for _ in range(16)] for _ in range(rows_per_step)],
                        [[-rng.random() * 4 for _ in range(16)] for _ in range(rows_per_step)])
    return run_dir
