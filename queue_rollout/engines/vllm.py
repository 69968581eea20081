"""A client for vLLM's OpenAI-compatible server (the facts it relies on: VLLM_API.md).

The server runs with ``VLLM_SERVER_DEV_MODE=1`` (pause, resume, abort by id, weights
reloaded from disk, the version label) and ``--enable-scale-out`` (token ids in and out
with per-token logprobs and weight-version spans: ``/inference/v1/generate``). Where vLLM
differs from SGLang, the client makes it answer as the workers expect:

- the config's sampling keys are SGLang's; they are translated, and a key vLLM has no
  equivalent for is refused before anything is sent (vLLM ignores unknown keys);
- a prompt plus ``max_new_tokens`` beyond the model's length is refused (vLLM would cut
  the output short and call it ``length``);
- a weight update checks that the folder holds weights (a failed reload kills the
  server), reloads, resets the prefix cache (a reload keeps the old weights' KV) and
  sets the version label;
- the pause modes: ``abort`` is vLLM's ``abort``; ``in_place`` its ``keep`` with the
  cache kept (a weight update over it would have to preempt the running requests);
  ``retract`` (vLLM's ``keep`` with the cache cleared) preempts them, and a vLLM CPU
  engine whose preempted request carries a seed dies when it resumes (0.32.0: "CPU
  Generator does not use offset"): refused, and a farm of vLLM replicas pauses in
  ``abort`` mode (the config says so at start);
- vLLM does not refuse a request id that is in flight, its abort answers the same
  whether it matched or not, and its request gauges are updated only now and then
  (one read 0 with four requests running): nothing it says confirms that one request
  stopped. A doubtful attempt stays in doubt, its slot kept, until the replica restarts
  (a new ``instance_id``, the workers' boot id: the stop is confirmed then) or
  ``timeouts.doubt`` declares it lost; never released on a guess.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from queue_rollout.config import PauseMode
from queue_rollout.engines.base import (
    EngineError,
    Generation,
    HttpEngine,
    message_of,
    weight_spans,
)
from queue_rollout.engines.concurrency import VLLM_METRICS
from queue_rollout.errors import BadInput

#: The config's sampling keys (SGLang's names) and vLLM's for each.
SAMPLING_KEYS = {
    "max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens",
    "temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
    "frequency_penalty": "frequency_penalty", "presence_penalty": "presence_penalty",
    "repetition_penalty": "repetition_penalty", "stop": "stop",
    "stop_token_ids": "stop_token_ids", "ignore_eos": "ignore_eos",
    "skip_special_tokens": "skip_special_tokens",
    "no_stop_trim": "include_stop_str_in_output", "sampling_seed": "seed",
}
#: SGLang's default ``max_new_tokens`` (vLLM's would be the rest of the context).
DEFAULT_MAX_NEW_TOKENS = 128
#: The farm's pause modes as vLLM's ``/pause`` query.
PAUSE_QUERY: dict[str, str] = {"abort": "mode=abort&clear_cache=false",
                               "in_place": "mode=keep&clear_cache=false"}
#: vLLM's prefix of a token-in, token-out request's id: what its abort matches.
ID_PREFIX = "generate-tokens-"


def translate(sampling_params: dict[str, Any]) -> dict[str, Any]:
    """SGLang's ``sampling_params`` as vLLM's; BadInput naming a key vLLM cannot take."""
    unknown = sorted(set(sampling_params) - set(SAMPLING_KEYS))
    if unknown:
        raise BadInput(f"workflow.sampling: vLLM has no equivalent of {', '.join(unknown)}")
    out = {SAMPLING_KEYS[k]: v for k, v in sampling_params.items() if v is not None}
    if out.get("top_k") == -1:  # SGLang's "no top-k"; vLLM's is 0
        out["top_k"] = 0
    out.setdefault("max_tokens", DEFAULT_MAX_NEW_TOKENS)
    out.setdefault("temperature", 1.0)  # vLLM's default too, but a model's config may differ
    return out


class VLLMClient(HttpEngine):
    """A replica that speaks vLLM's API (see the module's notes)."""

    metric_names = VLLM_METRICS

    def __init__(self, url: str, *, timeout: float = 30.0) -> None:
        super().__init__(url, timeout=timeout)
        self._max_model_len: int | None = None

    def max_model_len(self) -> int:
        """The served model's length (prompt and output), from ``/v1/models``."""
        if self._max_model_len is None:
            models = self._control("GET", "/v1/models")
            try:
                self._max_model_len = int(models["data"][0]["max_model_len"])
            except (TypeError, KeyError, IndexError, ValueError):
                raise EngineError(f"{self.url}/v1/models: no max_model_len in {models!r}"
                                  ) from None
        return self._max_model_len

    # -- generation ----------------------------------------------------------------------

    def generate(self, rid: str, *, input_ids: list[int] | None = None, text: str | None = None,
                 sampling_params: dict[str, Any], return_logprob: bool = True,
                 timeout: float) -> Generation:
        """One non-streaming ``/inference/v1/generate`` with *rid* as its request id;
        GenerateUncertain on a timeout or a lost connection (vLLM stops a request whose
        client went away, but the stop is not confirmed)."""
        if input_ids is None:
            if text is None:
                raise ValueError("generate needs input_ids or text")
            input_ids = self.tokenize(text)
        params = translate(sampling_params)
        limit, wanted = self.max_model_len(), len(input_ids) + int(params["max_tokens"])
        if wanted > limit:
            raise EngineError(
                f"{self.url}: HTTP 400 the input ({len(input_ids)} tokens) plus max_new_tokens "
                f"({params['max_tokens']}) is longer than the model's context length "
                f"({limit} tokens)", 400)
        if return_logprob:
            params["logprobs"] = 0
        body = {"token_ids": input_ids, "request_id": rid, "sampling_params": params}
        status, raw = self._send_generate("/inference/v1/generate", body, rid, timeout)
        if status != 200:
            raise EngineError(f"{self.url}/inference/v1/generate: HTTP {status} "
                              f"{message_of(raw)}", status)
        out = json.loads(raw)
        choice = out["choices"][0]
        ids = list(choice.get("token_ids") or [])
        content = (choice.get("logprobs") or {}).get("content") or []
        logprobs = [-math.inf if c["logprob"] == -9999.0 else float(c["logprob"])
                    for c in content]
        usage = out.get("usage") or {}
        spans = weight_spans(choice.get("weight_versions"))
        return Generation(
            rid=rid, text="", output_ids=ids, logprobs=logprobs,
            finish_reason=finish_reason(choice, len(ids)), completion_tokens=len(ids),
            prompt_tokens=usage.get("prompt_tokens"),
            weight_version=spans[-1][0] if spans else None,
            meta_info={"id": out.get("request_id"), "usage": usage},
            cached_tokens=int((usage.get("prompt_tokens_details") or {}).get("cached_tokens")
                              or 0),
            weight_spans=spans)

    def tokenize(self, text: str) -> list[int]:
        result = self._control("POST", "/tokenize", {"prompt": text,
                                                     "add_special_tokens": False})
        if not isinstance(result, dict) or not isinstance(result.get("tokens"), list):
            raise EngineError(f"{self.url}/tokenize: no tokens in {result!r}")
        return [int(t) for t in result["tokens"]]

    def abort(self, rid: str) -> None:
        """Ask the replica to abort *rid* (its token-in, token-out request). vLLM answers
        the same whether it matched: confirms nothing."""
        self._control("POST", "/abort_requests", {"request_ids": [ID_PREFIX + rid]})

    def confirm_stopped(self, rid: str, *, abort: str | None = None) -> bool:
        """Abort *rid* (a live attempt has one request: *abort*, SGLang's rid prefix for
        every turn, is not needed), then False: vLLM cannot confirm that it stopped.
        Raises EngineError when the replica cannot be asked."""
        self.abort(rid)
        return False

    # -- control -------------------------------------------------------------------------

    def pause(self, mode: PauseMode) -> None:
        if mode not in PAUSE_QUERY:
            raise EngineError(f"{self.url}: pause mode {mode!r} refused: it preempts running "
                              "requests, and a vLLM CPU engine dies when a seeded one resumes")
        self._control("POST", f"/pause?{PAUSE_QUERY[mode]}")

    def resume(self) -> None:
        self._control("POST", "/resume")

    def healthy(self, timeout: float = 5.0) -> bool:
        """``GET /health``: 200 while the engine lives (503 once it died)."""
        return self.health_problem(timeout) is None

    def alive(self, timeout: float = 2.0) -> bool:
        """``GET /version``: the server answers, without a generation."""
        return self._answers("/version", timeout)

    def server_info(self) -> dict[str, Any]:
        """What the workers read of the server: ``boot_id``, its ``instance_id`` (new at
        every start), and the model's length."""
        info = self._control("GET", "/server_info?config_format=json")
        try:
            instance = str(info["vllm_config"]["instance_id"])
        except (TypeError, KeyError):
            raise EngineError(f"{self.url}/server_info: no vllm_config.instance_id") from None
        return {"boot_id": instance, "instance_id": instance,
                "max_model_len": self.max_model_len()}

    def update_weights_from_disk(self, model_path: str, weight_version: str | None = None,
                                 timeout: float | None = None) -> dict[str, Any]:
        """Reload the weights in *model_path*, reset the prefix cache, set the version
        label. The folder is checked first: vLLM dies on a reload that fails."""
        folder = Path(model_path)
        if not (folder.is_dir() and any(folder.glob("*.safetensors"))):
            raise EngineError(f"{self.url}: weight update refused: {model_path} is not a "
                              "folder holding *.safetensors weights")
        self._control("POST", "/collective_rpc", {"method": "reload_weights",
                                                  "kwargs": {"weights_path": model_path}},
                      timeout)
        reset = self._control("POST", "/reset_prefix_cache", timeout=timeout)
        if not isinstance(reset, dict) or not reset.get("success"):
            raise EngineError(f"{self.url}: weights reloaded but the prefix cache was not "
                              f"reset (requests hold KV): {reset!r}")
        if weight_version is not None:
            self._control("POST", "/update_weight_version", {"new_version": weight_version},
                          timeout)
        return {"success": True, "model_path": model_path, "weight_version": weight_version}


def finish_reason(choice: dict[str, Any], produced: int) -> dict[str, Any]:
    """vLLM's ``finish_reason`` and ``stop_reason`` in SGLang's form."""
    reason = choice.get("finish_reason")
    if reason == "length":
        return {"type": "length", "length": produced}
    if reason == "stop":
        return {"type": "stop", "matched": choice.get("stop_reason")}
    if reason == "abort":
        return {"type": "abort"}
    return {"type": str(reason)}
