"""A client for SGLang's native HTTP API (the facts it relies on: SGLANG_API.md); the
simulated replica speaks it too."""

from __future__ import annotations

import json
import typing
from typing import Any

from queue_rollout.config import PauseMode
from queue_rollout.engines.base import (
    DuplicateRid,
    EngineError,
    GenerateUncertain,
    Generation,
    HttpEngine,
    message_of,
    weight_spans,
)
from queue_rollout.engines.concurrency import SGLANG_METRICS

#: SGLang's /pause_generation modes.
PAUSE_MODES: tuple[PauseMode, ...] = typing.get_args(PauseMode)


class SGLangClient(HttpEngine):
    """A replica that speaks SGLang's native API: generate by rid, abort by rid prefix,
    the rid's refusal while in flight as the proof a request stopped."""

    metric_names = SGLANG_METRICS

    # -- generation ----------------------------------------------------------------------

    def generate(self, rid: str, *, input_ids: list[int] | None = None, text: str | None = None,
                 sampling_params: dict[str, Any], return_logprob: bool = True,
                 timeout: float) -> Generation:
        """One non-streaming /generate with ``rid``; raises GenerateUncertain on a
        timeout or a lost connection (the request may still run)."""
        body: dict[str, Any] = {"rid": rid, "sampling_params": sampling_params,
                                "return_logprob": return_logprob}
        if input_ids is not None:
            body["input_ids"] = input_ids
        elif text is not None:
            body["text"] = text
        else:
            raise ValueError("generate needs input_ids or text")
        status, raw = self._send_generate("/generate", body, rid, timeout)
        if status != 200:
            message = message_of(raw)
            if status == 400 and "Duplicate request ID" in message:
                raise DuplicateRid(f"rid {rid} is still in flight on {self.url}", status)
            raise EngineError(f"{self.url}/generate: HTTP {status} {message}", status)
        out = json.loads(raw)
        meta = out.get("meta_info", {})
        logprobs = [entry[0] for entry in meta.get("output_token_logprobs") or []]
        return Generation(
            rid=rid, text=out.get("text", ""), output_ids=list(out.get("output_ids", [])),
            logprobs=logprobs, finish_reason=meta.get("finish_reason") or {},
            completion_tokens=int(meta.get("completion_tokens", 0)),
            prompt_tokens=meta.get("prompt_tokens"), weight_version=meta.get("weight_version"),
            meta_info=meta, cached_tokens=int(meta.get("cached_tokens") or 0),
            weight_spans=weight_spans(meta.get("weight_versions")),
        )

    def abort(self, rid: str) -> None:
        """Ask the replica to abort *rid*. Always 200 on SGLang: confirms nothing."""
        self._control("POST", "/abort_request", {"rid": rid})

    def confirm_stopped(self, rid: str, *, abort: str | None = None) -> bool:
        """Abort (*abort*: an rid prefix, e.g. the attempt id for every turn; default
        *rid*), then probe with *rid* and ``max_new_tokens = 0``: True when the probe is
        accepted (the rid is no longer in flight), False when it is refused as a
        duplicate. Raises EngineError when the replica cannot be asked."""
        self.abort(rid if abort is None else abort)
        try:
            self.generate(rid, input_ids=[0], sampling_params={"max_new_tokens": 0},
                          return_logprob=False, timeout=self.timeout)
        except DuplicateRid:
            return False
        except GenerateUncertain as exc:
            raise EngineError(str(exc)) from None
        return True

    # -- control -------------------------------------------------------------------------

    def pause(self, mode: PauseMode) -> None:
        self._control("POST", "/pause_generation", {"mode": mode})

    def resume(self) -> None:
        self._control("POST", "/continue_generation", {})

    def healthy(self, timeout: float = 5.0) -> bool:
        """``GET /health``: the replica serves generations. On SGLang it runs a one-token
        generation and takes about a second: for readiness, not for a periodic watch."""
        return self._answers("/health", timeout)

    def alive(self, timeout: float = 2.0) -> bool:
        """``GET /model_info``: the replica's server answers, in milliseconds and
        without a generation (SGLang's server goes down whole when its scheduler dies)."""
        return self._answers("/model_info", timeout)

    def server_info(self) -> dict[str, Any]:
        info = self._control("GET", "/server_info")
        if not isinstance(info, dict):
            raise EngineError(f"{self.url}/server_info: not a JSON object: {info!r}")
        return info

    def update_weights_from_disk(self, model_path: str, weight_version: str | None = None,
                                 timeout: float | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"model_path": model_path}
        if weight_version is not None:
            body["weight_version"] = weight_version
        result = self._control("POST", "/update_weights_from_disk", body, timeout)
        if not isinstance(result, dict) or not result.get("success"):
            raise EngineError(f"{self.url}: weight update failed: {result}")
        return result
