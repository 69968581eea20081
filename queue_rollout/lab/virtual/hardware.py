"""The engine model's constants for the hardware a replica runs on: a GPU's (the decode
step and prefill rate of a Qwen3-4B-shaped model measured on one NVIDIA H200, CUDA
graphs, bf16) and, beside it, a CPU's (a real SGLang on one core of this project's
machine).

The measurements and how they were taken, with their limits (random weights, a dense
uniform KV cache, unfused norms, no RoPE, no scheduler), are kept in
``docs/assets/gpu/h200/``; the constants below are derived from those tables by
:func:`fit_decode` and :func:`prefill_rate`, and a test derives them again from the
files. Nothing here is fitted to a pilot's figures. The CPU's constants are the
real-sglang bench's calibration on its long-tail group-admission runs
(``docs/assets/bench/real-sglang.json``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from queue_rollout.lab.virtual.shape import Shape


@dataclass(frozen=True)
class EngineProfile:
    """The engine model's constants for one kind of replica: decode step = ``step_ms`` +
    ``step_ms_per_request`` x running requests + ``step_us_per_context_token`` x the
    tokens their contexts hold / 1000; prefill at ``prefill_tokens_per_s``."""

    name: str
    step_ms: float
    step_ms_per_request: float
    step_us_per_context_token: float
    prefill_tokens_per_s: float

    def shape(self, shape: Shape) -> Shape:
        """*shape* with this GPU's engine constants."""
        return replace(shape, step_ms=self.step_ms,
                       step_ms_per_request=self.step_ms_per_request,
                       step_us_per_context_token=self.step_us_per_context_token,
                       prefill_tokens_per_s=self.prefill_tokens_per_s)


def fit_decode(points: Iterable[Mapping[str, Any]]) -> tuple[float, float, float]:
    """Ordinary least squares of ``ms`` = a + b x batch + c x (batch x context) over
    decode points (each ``b``, ``c`` and ``ms``, as the H200 tables hold them): (a ms,
    b ms per request, c us per context token)."""
    rows = [(1.0, float(p["b"]), float(p["b"]) * float(p["c"]), float(p["ms"]))
            for p in points]
    if len(rows) < 3:
        raise ValueError("fit_decode needs at least three points")
    # the normal equations, 3 x 3, solved by Gaussian elimination
    m = [[sum(r[i] * r[j] for r in rows) for j in range(3)]
         + [sum(r[i] * r[3] for r in rows)] for i in range(3)]
    for col in range(3):
        pivot = max(range(col, 3), key=lambda k: abs(m[k][col]))
        m[col], m[pivot] = m[pivot], m[col]
        for k in range(3):
            if k != col:
                f = m[k][col] / m[col][col]
                m[k] = [x - f * y for x, y in zip(m[k], m[col], strict=True)]
    a, b, c = (m[i][3] / m[i][i] for i in range(3))
    return a, b, c * 1000.0


def prefill_rate(points: Iterable[Mapping[str, Any]], tokens: int) -> float:
    """Tokens per second of one sequence of *tokens* prefilled as a CUDA graph (the
    chunk the engine model prefills at a time: ``chunked_prefill_size``)."""
    for p in points:
        if p["batch"] == 1 and p["seq_len"] == tokens:
            return float(p["tokens"]) / (float(p["ms_graph"]) / 1000.0)
    raise ValueError(f"no single-sequence prefill of {tokens} tokens in the table")


#: One H200: the 23-point uniform decode grid of ``h200_decode.json`` (within 4.1% of
#: every point) and its 1 x 8,192-token prefill (the engine model's chunk).
H200 = EngineProfile(name="h200", step_ms=3.8845, step_ms_per_request=0.0073065,
                  step_us_per_context_token=0.032411, prefill_tokens_per_s=45_576.0)

#: One CPU core running a real SGLang 0.5.23 (the tiny model of the real-engine tier):
#: the real-sglang bench's fit to its long-tail group-admission runs, and its probe's
#: prefill rate.
CPU_SGLANG = EngineProfile(name="cpu-sglang", step_ms=6.782, step_ms_per_request=0.4507,
                           step_us_per_context_token=1.6175, prefill_tokens_per_s=32_990.0)
