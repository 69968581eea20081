"""The client of an engine kind: the one place that maps ``engine.kind`` to the API a
replica speaks."""

from __future__ import annotations

from queue_rollout.engines.base import EngineClient
from queue_rollout.engines.sglang import SGLangClient
from queue_rollout.engines.vllm import VLLMClient


def engine_client(kind: str, url: str, *, timeout: float = 30.0) -> EngineClient:
    """A client for a replica of *kind* at *url* (``sim`` replicas speak SGLang's API)."""
    if kind in ("sim", "sglang"):
        return SGLangClient(url, timeout=timeout)
    if kind == "vllm":
        return VLLMClient(url, timeout=timeout)
    raise ValueError(f"no client for engine kind {kind!r}")
