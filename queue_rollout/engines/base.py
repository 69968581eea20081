"""What every engine client shares: the errors whose type decides what a failed call
means for the ledger, a generation as the workers see it, the episode's seed and
request ids, the HTTP plumbing, and the calls a worker makes on its replica
(:class:`EngineClient`), which the SGLang client (:mod:`.sglang`, also the simulated
replica's) and the vLLM client (:mod:`.vllm`) each make on their server's API.

Synchronous and dependency-free (``http.client``), one connection per call, so each
episode thread of a worker can call its replica on its own. A call's failure:

- :class:`GenerateUncertain`: the generate call timed out or lost its connection; the
  request may still run on the replica. The attempt becomes doubtful.
- :class:`DuplicateRid`: the replica still has a request with this id in flight.
- :class:`EngineError`: anything else the replica answered or failed to answer.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import socket
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urlsplit

from queue_rollout.config import PauseMode
from queue_rollout.engines.concurrency import MetricNames
from queue_rollout.errors import QueueRolloutError
from queue_rollout.results import add_tokens


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


class EngineClient(Protocol):
    """The calls a worker makes on its replica, whatever the engine."""

    url: str
    timeout: float
    metric_names: MetricNames  # what its /metrics calls the adaptive controller's signal

    def generate(self, rid: str, *, input_ids: list[int] | None = None,
                 text: str | None = None, sampling_params: dict[str, Any],
                 return_logprob: bool = True, timeout: float) -> Generation: ...
    def abort(self, rid: str) -> None: ...
    def confirm_stopped(self, rid: str, *, abort: str | None = None) -> bool: ...
    def pause(self, mode: PauseMode) -> None: ...
    def resume(self) -> None: ...
    def healthy(self, timeout: float = 5.0) -> bool: ...
    def health_problem(self, timeout: float = 5.0) -> str | None: ...
    def alive(self, timeout: float = 2.0) -> bool: ...
    def metrics(self, timeout: float = 2.0) -> str: ...
    def server_info(self) -> dict[str, Any]: ...
    def update_weights_from_disk(self, model_path: str, weight_version: str | None = None,
                                 timeout: float | None = None) -> dict[str, Any]: ...


class HttpEngine:
    """An engine's HTTP server at *url*: one connection per call."""

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
            raise EngineError(f"{self.url}{path}: HTTP {status} {message_of(raw)}", status)
        return json.loads(raw) if raw.strip() else None

    def _answers(self, path: str, timeout: float) -> bool:
        """``GET path`` answers 200 within *timeout*."""
        try:
            self._control("GET", path, timeout=timeout)
        except EngineError:
            return False
        return True

    def _send_generate(self, path: str, body: dict[str, Any], rid: str, timeout: float
                       ) -> tuple[int, bytes]:
        """POST a generation; GenerateUncertain on a timeout or a lost connection (the
        request may still run), EngineError when the connection was refused (nothing
        was sent)."""
        try:
            return self._request("POST", path, body, timeout)
        except TimeoutError as exc:
            raise GenerateUncertain(f"{self.url}{path} rid {rid}: timed out") from exc
        except ConnectionRefusedError as exc:
            raise EngineError(f"{self.url}{path}: connection refused") from exc
        except (OSError, http.client.HTTPException) as exc:
            raise GenerateUncertain(
                f"{self.url}{path} rid {rid}: {exc or type(exc).__name__}") from exc

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
            return f"HTTP {status} {message_of(raw)}".strip()
        return None

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


def weight_spans(value: Any) -> tuple[tuple[str, int, int], ...]:
    """SGLang's ``weight_versions`` (``[{version, start, end}]``); () when absent or
    not in that form (older SGLang returns none)."""
    if not isinstance(value, list):
        return ()
    try:
        return tuple((str(span["version"]), int(span["start"]), int(span["end"]))
                     for span in value)
    except (TypeError, KeyError, ValueError):
        return ()


def message_of(raw: bytes) -> str:
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
