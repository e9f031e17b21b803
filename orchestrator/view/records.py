"""The token record: `<run dir>/tokens.jsonl`, a few completions per step token by token, for `rayward view`'s
token view. One JSON line per recorded sample, keys in this order (the reader finds a line's step and sample from
its start without parsing the rest):

    step              the optimizer step the sample was trained at (completions.jsonl's `step`)
    sample            the row's position among that step's rows in completions.jsonl
    prompt_index      the prompt's draw index (completions.jsonl's; None when not tracked)
    ids               completion token ids
    tokens            each token's decoded text
    logprobs          sampling log-prob per token, rounded to LOGPROB_DECIMALS; null where the model did not sample it
    learner_logprobs  the learner's log-prob per token at its first pass, same rounding; null when not recorded
    mask              per token: 1 in the loss, 0 not (a tool result, template scaffold)
    versions          per token: the policy version that sampled it (-1 where the model did not); null: the row's
                      policy_version throughout (one-turn samples)
    length            only on a cut line: the completion's whole token count (the line holds the first max_tokens)

`token_line` builds a line from plain lists; `TokenRecorder` appends a bounded number of lines per step.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

TOKENS_FILE = "tokens.jsonl"
# Log-probs to a thousandth of a nat: finer than any shading or comparison on the page needs, and each value stays
# a few characters in the file.
LOGPROB_DECIMALS = 3
# Samples per step recorded by default (logging.token_samples): enough to compare a group's best and worst by eye,
# few enough that the record stays a small fraction of completions.jsonl.
DEFAULT_TOKEN_SAMPLES = 4
# A recorded completion's tokens at most: one line of a long agentic trajectory stays a few hundred kilobytes,
# which the page fetches and draws at once.
MAX_RECORD_TOKENS = 8192


def _round(values: Sequence[float | None] | None, n: int) -> list[float | None] | None:
    """The first n values rounded; NaN and infinities (tokens the model did not sample) become None (JSON has no
    NaN, and a browser's JSON.parse refuses it)."""
    if values is None:
        return None
    out: list[float | None] = []
    for v in values[:n]:
        if v is None or not math.isfinite(v):
            out.append(None)
        else:
            out.append(round(v, LOGPROB_DECIMALS) + 0.0)  # + 0.0: no "-0.0" in the file
    return out


def token_line(
    *, step: int, sample: int, prompt_index: int | None, ids: Sequence[int], tokens: Sequence[str],
    logprobs: Sequence[float | None], learner_logprobs: Sequence[float | None] | None = None,
    mask: Sequence[int] | None = None, versions: Sequence[int] | None = None, max_tokens: int = MAX_RECORD_TOKENS,
) -> str:
    """One line of the record (JSON, no newline). mask None: every token in the loss; versions None: the row's
    policy_version throughout. A completion longer than max_tokens keeps its first max_tokens and its `length`."""
    n = len(ids)
    for name, values in (("tokens", tokens), ("logprobs", logprobs), ("learner_logprobs", learner_logprobs),
                         ("mask", mask), ("versions", versions)):
        if values is not None and len(values) != n:
            raise ValueError(f"token record, step {step} sample {sample}: {len(values)} {name} for {n} ids")
    keep = min(n, max_tokens)
    line: dict[str, Any] = {
        "step": step, "sample": sample, "prompt_index": prompt_index,
        "ids": [int(i) for i in ids[:keep]],
        "tokens": list(tokens[:keep]),
        "logprobs": _round(logprobs, keep),
        "learner_logprobs": _round(learner_logprobs, keep),
        "mask": [1] * keep if mask is None else [int(bool(m)) for m in mask[:keep]],
        "versions": None if versions is None else [int(v) for v in versions[:keep]],
    }
    if keep < n:
        line["length"] = n
    # Compact separators and UTF-8 text: the record is mostly numbers and short strings.
    return json.dumps(line, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def pick_samples(num_rows: int, k: int) -> list[int]:
    """Which of a step's rows to record: k positions spread evenly over the step (with k at most the number of
    groups, each in a different group), always the first row."""
    if k <= 0 or num_rows <= 0:
        return []
    if k >= num_rows:
        return list(range(num_rows))
    return sorted({i * num_rows // k for i in range(k)})


def decode_tokens(tokenizer: Any, ids: Sequence[int]) -> list[str]:
    """Each token's text, decoded alone (special tokens kept: template scaffold is shown as such). A character
    split over several byte-level tokens shows as U+FFFD on each of them."""
    if not ids:  # an empty completion (a trajectory lost before its first turn): some tokenizers decode [] as ['']
        return []
    return tokenizer.batch_decode([[int(i)] for i in ids], skip_special_tokens=False,
                                  clean_up_tokenization_spaces=False)


class TokenRecorder:
    """Appends a bounded number of samples per step to `<run dir>/tokens.jsonl`: at most `samples_per_step`
    lines a step (0: records nothing), each at most `max_tokens` tokens. `decode` turns one completion's ids into
    its tokens' texts (`lambda ids: decode_tokens(tokenizer, ids)`); only the recorded samples are decoded."""

    def __init__(self, run_dir: Path, samples_per_step: int = DEFAULT_TOKEN_SAMPLES, *,
                 decode: Callable[[Sequence[int]], list[str]], max_tokens: int = MAX_RECORD_TOKENS):
        self.path = Path(run_dir) / TOKENS_FILE
        self.samples_per_step = samples_per_step
        self.decode = decode
        self.max_tokens = max_tokens

    def picks(self, num_rows: int) -> tuple[int, ...]:
        """The rows of a step of `num_rows` this recorder will write (the learner returns their log-probs)."""
        return tuple(pick_samples(num_rows, self.samples_per_step))

    def record(self, step: int, rows: dict[int, dict[str, Any]], prompt_index: Sequence[int] | None = None) -> int:
        """The step's recorded rows as the learner returned them (TrainResult.token_records: per row of the step,
        in completions.jsonl's order, its ids, sampling and learner log-probs and loss mask); writes them and
        returns the bytes written. Only these are decoded."""
        if not rows:
            return 0
        lines = []
        for i in sorted(rows):
            r = rows[i]
            ids = list(r["ids"])
            kept = ids[: self.max_tokens]
            lines.append(token_line(
                step=step, sample=i, prompt_index=None if prompt_index is None else prompt_index[i], ids=ids,
                tokens=self.decode(kept) + [""] * (len(ids) - len(kept)), logprobs=r["logprobs"],
                learner_logprobs=r.get("learner_logprobs"), mask=r.get("mask"), versions=r.get("versions"),
                max_tokens=self.max_tokens,
            ))
        data = ("\n".join(lines) + "\n").encode()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "ab") as f:  # one write: a reader sees whole lines, or a torn last one it skips
            f.write(data)
        return len(data)


class NoTokenRecord:
    """A run without a token record (logging.token_samples 0, or no completions log)."""

    def picks(self, num_rows: int) -> tuple[int, ...]:
        return ()

    def record(self, *args: Any, **kwargs: Any) -> int:
        return 0
