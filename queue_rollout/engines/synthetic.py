"""What the farm shares with a simulated replica: seeded token ids and the hints a
worker passes with its requests.

A simulated replica (``queue-rollout sim-engine``) answers a request with token ids
drawn from its seed; the workflows make a tool's reply the same way, so a multi-turn
episode's context is reproducible on either side. A prompt with an ``answer`` asks the
simulated replica to be right with chance ``p_correct``; a real SGLang server gets no
such hint. Everything here is pure and stable across processes (no salted ``hash``).
"""

from __future__ import annotations

import hashlib
from typing import Any

#: Token ids are drawn from 100 .. 100 + VOCAB - 1 (below 100: room for special ids).
VOCAB = 32_000


def stable_hash(*parts: object) -> int:
    """A stable 64-bit hash (no per-process salt, unlike hash())."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def _stride(kind: str, seed: int) -> tuple[int, int]:
    """A seed's own arithmetic sequence (step, start): cheap per token, which matters
    when a replica answers thousands of tokens a second."""
    h = stable_hash(kind, seed)
    return (h >> 32) | 1, h & 0xFFFFFFFF


def token_ids(seed: int, start: int, n: int) -> list[int]:
    """Output tokens *start* .. *start* + *n* of a request with *seed*."""
    step, first = _stride("tok", seed)
    return [100 + (first + step * i) % VOCAB for i in range(start, start + n)]


def token_logprobs(seed: int, n: int) -> list[float]:
    """The log-probabilities of a request's first *n* output tokens."""
    step, first = _stride("lp", seed)
    return [-((first + step * i) % 5000) / 1000.0 for i in range(n)]


def prompt_params(prompt: dict[str, Any]) -> dict[str, Any]:
    """What a worker adds to every request's ``sampling_params`` for a simulated
    replica: for a prompt with an ``answer``, ``custom_params`` with the answer and its
    chance (``p_correct``, default 0.5), so the simulated text is right that often."""
    if "answer" not in prompt:
        return {}
    return {"custom_params": {"sim_answer": str(prompt["answer"]),
                              "sim_p_correct": float(prompt.get("p_correct", 0.5))}}


def hint_problem(prompt: dict[str, Any]) -> str | None:
    """What is wrong with a prompt's hints for a simulated replica, or None: a
    ``p_correct``, if given, is a number in [0, 1]."""
    if "p_correct" not in prompt:
        return None
    p = prompt["p_correct"]
    if isinstance(p, (int, float)) and not isinstance(p, bool) and 0 <= p <= 1:
        return None
    return "`p_correct` must be a number in [0, 1]"
