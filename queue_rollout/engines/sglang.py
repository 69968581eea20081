"""A client for SGLang's native HTTP API (the facts it relies on: SGLANG_API.md).

Synchronous and dependency-free (``http.client``), one connection per call, so each
episode thread of a worker can call its replica on its own. What a call's failure
means for the ledger is decided by its type:

- :class:`GenerateUncertain`: the ``/generate`` call timed out or lost its connection;
  the request may still run on the replica. The attempt becomes doubtful.
- :class:`DuplicateRid`: the replica still has a request with this rid in flight.
- :class:`EngineError`: anything else the replica answered or failed to answer.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import socket
import typing
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from queue_rollout.config import PauseMode
from queue_rollout.errors import QueueRolloutError
from queue_rollout.results import add_tokens

#: SGLang's /pause_generation modes.
PAUSE_MODES: tuple[PauseMode, ...] = typing.get_args(PauseMode)


def episode_seed(run_seed: int, prompt_id: str, member: int) -> int:
    """The sampling seed of one episode (I7): (run seed, prompt id, member) only, so a
    retry samples the same way on a deterministic engine. 63 bits (SGLang: int64).
    A later turn's seed is ``episode_seed(<episode's seed>, "turn", turn)``."""
    digest = hashlib.blake2b(f"{run_seed}\x00{prompt_id}\x00{member}".encode(),
                             digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


def turn_rid(aid: str, turn: int) -> str:
    """The rid of an episode's request for *turn*: the attempt id for the first (0),
    then ``<aid>-tNNN``, zero-padded so that no turn's rid is a prefix of another's
    (SGLang aborts by rid prefix: the attempt id reaches every turn)."""
    return aid if turn == 0 else f"{aid}-t{turn:03d}"


class EngineError(QueueRolloutError):
    """The replica answered an error, or could not be reached for a control call."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class BadEngineURL(EngineError):
    """An engine URL that is not ``http(s)://host[:port]``: bad input (exit 2)."""

    exit_code = 2


class DuplicateRid(EngineError):
    """The rid is still in flight on the replica (SGLang >= 0.5.10 refuses it)."""


class GenerateUncertain(EngineError):
    """A /generate call timed out or lost its connection: it may still run."""


@dataclass(frozen=True)
class Generation:
    rid: str
    text: str
    output_ids: list[int]
    logprobs: list[float]
    finish_reason: dict[str, Any]
    completion_tokens: int
    prompt_tokens: int | None
    weight_version: str | None
    meta_info: dict[str, Any] = field(repr=False)
    cached_tokens: int = 0  # of prompt_tokens, found in the replica's prefix cache
    #: SGLang's ``weight_versions``: (version, start, end) over the output, end exclusive,
    #: where the weights changed while the request ran (empty when not returned)
    weight_spans: tuple[tuple[str, int, int], ...] = ()

    @property
    def aborted(self) -> bool:
        return self.finish_reason.get("type") == "abort"

    def version_runs(self, sent_under: int) -> list[tuple[int, int]]:
        """The policy versions of its output tokens as (version, count) runs: from the
        replica's ``weight_versions`` spans where it returns them, else all *sent_under*
        (the farm's version when the request was sent). A span whose version is not a
        number (SGLang names the weights it started with ``default``) counts as
        *sent_under*."""
        n = len(self.output_ids)
        runs: list[tuple[int, int]] = []
        covered = 0
        for version, start, end in self.weight_spans:
            end = min(end, n)
            add_tokens(runs, int(version) if version.isdigit() else sent_under,
                       end - max(start, covered))
            covered = max(covered, end)
        # no spans, or spans short of the output: the version it was sent under
        add_tokens(runs, sent_under, n - covered)
        return runs


class SGLangClient:
    def __init__(self, url: str, *, timeout: float = 30.0) -> None:
        parts = urlsplit(url)
        try:
            port = parts.port  # ValueError: not a port number
        except ValueError:
            port = -1
        if parts.scheme not in ("http", "https") or not parts.hostname or port == -1:
            raise BadEngineURL(f"engine URL must be http(s)://host:port, got {url!r}")
        self.url = url.rstrip("/")
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = port or (443 if self._https else 80)
        self.timeout = timeout

    def _request(self, method: str, path: str, body: dict[str, Any] | None,
                 timeout: float) -> tuple[int, bytes]:
        cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        conn = cls(self._host, self._port, timeout=timeout)
        try:
            data = None if body is None else json.dumps(body).encode()
            headers = {"Content-Type": "application/json"} if data is not None else {}
            conn.request(method, path, body=data, headers=headers)
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def _control(self, method: str, path: str, body: dict[str, Any] | None = None,
                 timeout: float | None = None) -> Any:
        try:
            status, raw = self._request(method, path, body, timeout or self.timeout)
        except (OSError, http.client.HTTPException) as exc:
            raise EngineError(f"{self.url}{path}: {exc or type(exc).__name__}") from None
        if status != 200:
            raise EngineError(f"{self.url}{path}: HTTP {status} {_message(raw)}", status)
        return json.loads(raw) if raw.strip() else None

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
        try:
            status, raw = self._request("POST", "/generate", body, timeout)
        except TimeoutError as exc:
            raise GenerateUncertain(f"{self.url}/generate rid {rid}: timed out") from exc
        except ConnectionRefusedError as exc:
            # nothing was sent: the request never reached the replica
            raise EngineError(f"{self.url}/generate: connection refused") from exc
        except (OSError, http.client.HTTPException) as exc:
            raise GenerateUncertain(
                f"{self.url}/generate rid {rid}: {exc or type(exc).__name__}") from exc
        if status != 200:
            message = _message(raw)
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
            weight_spans=_spans(meta.get("weight_versions")),
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
        try:
            self._control("GET", "/health", timeout=timeout)
        except EngineError:
            return False
        return True

    def health_problem(self, timeout: float = 5.0) -> str | None:
        """``GET /health``: None when the replica serves generations, else why not, in
        a few words (``connection refused``, ``HTTP 503 ...``, ``no answer within 2 s``),
        for a worker that says what it waits for."""
        try:
            status, raw = self._request("GET", "/health", None, timeout)
        except ConnectionRefusedError:
            return "connection refused"
        except TimeoutError:
            return f"no answer within {timeout:g} s"
        except socket.gaierror as exc:
            return f"host {self._host!r} not found ({exc.strerror})"
        except (OSError, http.client.HTTPException) as exc:
            return str(exc) or type(exc).__name__
        if status != 200:
            return f"HTTP {status} {_message(raw)}".strip()
        return None

    def alive(self, timeout: float = 2.0) -> bool:
        """``GET /model_info``: the replica's server answers, in milliseconds and
        without a generation (SGLang's server goes down whole when its scheduler dies)."""
        try:
            self._control("GET", "/model_info", timeout=timeout)
        except EngineError:
            return False
        return True

    def metrics(self, timeout: float = 2.0) -> str:
        """``GET /metrics``: the Prometheus text (``--enable-metrics``); EngineError with
        status 404 when the replica exports none."""
        try:
            status, raw = self._request("GET", "/metrics", None, timeout)
        except (OSError, http.client.HTTPException) as exc:
            raise EngineError(f"{self.url}/metrics: {exc or type(exc).__name__}") from None
        if status != 200:
            raise EngineError(f"{self.url}/metrics: HTTP {status}", status)
        return raw.decode(errors="replace")

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


def _spans(value: Any) -> tuple[tuple[str, int, int], ...]:
    """SGLang's ``weight_versions`` (``[{version, start, end}]``); () when absent or
    not in that form (older SGLang returns none)."""
    if not isinstance(value, list):
        return ()
    try:
        return tuple((str(span["version"]), int(span["start"]), int(span["end"]))
                     for span in value)
    except (TypeError, KeyError, ValueError):
        return ()


def _message(raw: bytes) -> str:
    """The error text of an SGLang error body: {"error": {"message"}}, {"error": "..."}
    or a control call's {"success": false, "message": "..."}."""
    try:
        body = json.loads(raw)
    except ValueError:
        return raw[:200].decode(errors="replace")
    if not isinstance(body, dict):
        return str(body)
    error = body.get("error")
    if isinstance(error, dict):
        return str(error.get("message", error))
    if error is None and "message" in body:
        return str(body["message"])
    return str(error if error is not None else body)
