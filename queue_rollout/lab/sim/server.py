"""A simulated replica speaking SGLang's native HTTP API.

``queue-rollout sim-engine --port P`` serves :class:`~.model.SimModel` in real time
over the endpoints the worker uses, answering as SGLang >= 0.5.10 answers (see
``SGLANG_API.md``): ``/generate`` (``rid``, ``sampling_params`` with SGLang's keys only,
``return_logprob``), ``/abort_request`` (always 200), ``/pause_generation`` (``abort``,
``in_place``, ``retract``), ``/continue_generation``,
``/health``, ``/get_server_info`` (with this process's ``boot_id``),
``/get_model_info``, ``/update_weights_from_disk`` (refused with SGLang's 400 when its
``model_path`` is not a folder on this machine, nothing loaded, and when its cache
flush is: requests running or paused in place), ``/flush_cache``, ``/metrics``.
An rid still in flight is refused with 400; a client that disconnects aborts its
request, as SGLang does. Each answer carries SGLang's ``weight_versions`` spans.

Tokens, logprobs and text are deterministic functions of ``sampling_seed``. For math
prompts the worker passes ``custom_params = {"sim_answer": X, "sim_p_correct": p}``;
the text then ends with ``\\boxed{X}`` with probability p (decided by the seed), else
with a wrong number. A ``text`` prompt counts one token per 4 UTF-8 bytes, rounded up
(each token the value of its bytes), so equal text prefixes share cached tokens. It
binds 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import math
import signal
import uuid
from pathlib import Path
from typing import Any

import msgspec

from queue_rollout.engines.synthetic import stable_hash, token_ids, token_logprobs
from queue_rollout.lab.sim.model import (
    DuplicateRid,
    PromptTooLong,
    SimModel,
    SimRequest,
)

log = logging.getLogger(__name__)

#: SamplingParams keys of SGLang 0.5.10; anything else is refused, as a real server does.
SAMPLING_KEYS = frozenset({
    "max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k",
    "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens",
    "n", "json_schema", "regex", "ebnf", "structural_tag", "ignore_eos", "skip_special_tokens",
    "spaces_between_special_tokens", "no_stop_trim", "custom_params", "stream_interval",
    "logit_bias", "sampling_seed",
})
#: SGLang's answers to a weight update whose cache flush it refused, and to /flush_cache
CACHE_NOT_FLUSHED = ("Weights were updated, but the cache was not flushed because requests "
                     "are still running or queued. Retract or finish them, then call "
                     "/flush_cache.")
#: How SGLang's answer to a weight update that found no weights begins (what follows
#: names the loader's error: a missing folder, one without weights)
WEIGHTS_NOT_FOUND = "Failed to get weights iterator:"
CACHE_FLUSHED = ("Cache flushed.\nPlease check backend logs for more details. (When there "
                 "are running or waiting requests, the operation will not be performed.)\n")
DEFAULT_SEED = 42  # SGLang's seed when none is given under deterministic inference
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            413: "Payload Too Large", 500: "Internal Server Error", 503: "Service Unavailable"}


class HTTPError(Exception):
    def __init__(self, status: int, body: Any) -> None:
        super().__init__(status)
        self.status, self.body = status, body


def _error(status: int, message: str) -> HTTPError:
    return HTTPError(status, {"error": {"message": message, "code": status}})


def output_length(seed: int, params: dict[str, Any]) -> int:
    """Tokens a request produces: ``max_new_tokens`` with ``ignore_eos``; otherwise a
    seeded long-tailed length (log-normal, median max_new_tokens / 8, sigma 1), capped
    at ``max_new_tokens`` as a real stop would be."""
    max_new = int(params.get("max_new_tokens", 128))
    if params.get("ignore_eos") or max_new <= 1:
        return max(0, max_new)
    u1 = (stable_hash("len1", seed) % 1_000_000 + 1) / 1_000_001
    u2 = (stable_hash("len2", seed) % 1_000_000) / 1_000_000
    z = math.sqrt(-2 * math.log(u1)) * math.cos(2 * math.pi * u2)
    return max(1, min(max_new, round(max_new / 8 * math.exp(z))))


def stop_at(seed: int, params: dict[str, Any], max_new: int
            ) -> tuple[int, dict[str, Any] | None]:
    """Where a request's output ends and why: at the first of its ``stop_token_ids``
    (included, as SGLang returns it), else after :func:`output_length` tokens; a stop
    before ``max_new_tokens`` says ``stop`` with the token matched (the simulated
    replica's EOS is the token it ended on), else None (``length``)."""
    length = output_length(seed, params)
    stops = set(params.get("stop_token_ids") or ())
    if stops and not params.get("ignore_eos"):
        for i, token in enumerate(token_ids(seed, 0, max(0, max_new))):
            if token in stops:
                return i + 1, {"type": "stop", "matched": token}
        return max_new, None
    if length < max_new:
        return length, {"type": "stop", "matched": token_ids(seed, length - 1, 1)[0]}
    return length, None


def output_text(seed: int, n: int, params: dict[str, Any], *, complete: bool = True) -> str:
    """The text of *n* tokens; a complete math answer ends with ``\\boxed{...}``."""
    words = " ".join(f"w{t % 997}" for t in token_ids(seed, 0, min(n, 64)))
    custom = params.get("custom_params") or {}
    if complete and "sim_answer" in custom:
        p = float(custom.get("sim_p_correct", 0.5))
        correct = (stable_hash("correct", seed) % 10_000) / 10_000 < p
        answer = custom["sim_answer"] if correct else f"{stable_hash('wrong', seed) % 1000}-wrong"
        return f"{words} The answer is \\boxed{{{answer}}}"
    return words


def text_tokens(text: str) -> list[int]:
    """The token ids of a ``text`` prompt: one per 4 UTF-8 bytes, rounded up."""
    data = text.encode()
    return [int.from_bytes(data[i:i + 4], "big") for i in range(0, len(data), 4)]


class PortUnavailable(OSError):
    """The replica's address could not be bound (in use, or not this host's)."""


class SimEngineServer:
    """The HTTP face of one simulated replica. ``await start()``, then ``serve_forever``."""

    def __init__(self, model: SimModel, *, host: str = "127.0.0.1", port: int = 0,
                 request_log: Path | None = None, max_body: int = 64 << 20,
                 context_length: int = 1 << 20) -> None:
        self.model = model
        self.context_length = context_length  # a longer prompt is refused, as SGLang does
        self.host, self.port = host, port
        self.boot_id = uuid.uuid4().hex
        self.request_log = request_log
        self.max_body = max_body
        self.healthy = True
        self.model_path = "sim"  # what /get_model_info names: the last weights loaded
        self.info_version = model.weight_version  # and the version it names
        self._wake = asyncio.Event()
        self._resumed = asyncio.Event()
        self._resumed.set()
        self._idle = asyncio.Event()  # nothing running (for weight updates)
        self._server: asyncio.AbstractServer | None = None
        self._ticker: asyncio.Task[None] | None = None
        self._logged = 0

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self) -> int:
        loop = asyncio.get_running_loop()
        self.model.now = loop.time()
        try:
            self._server = await asyncio.start_server(self._connection, self.host, self.port)
        except OSError as exc:  # the caller names the port in one line, not a traceback
            raise PortUnavailable(exc.errno, exc.strerror) from None
        self.port = self._server.sockets[0].getsockname()[1]
        self._ticker = asyncio.create_task(self._tick())
        log.info("sim engine on http://%s:%d boot %s", self.host, self.port, self.boot_id)
        return self.port

    async def serve_forever(self) -> None:
        assert self._server is not None
        await self._server.serve_forever()

    async def close(self) -> None:
        if self._ticker:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
        if self._server:
            self._server.close()
            # wait_closed may also wait for the clients' open connections (newer Pythons):
            # a peer that keeps an idle keep-alive connection must not hold the exit
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)

    # -- time ----------------------------------------------------------------------------

    def _sync(self) -> None:
        self.model.advance(asyncio.get_running_loop().time())
        self._flush_log()
        if not self.model.running and not self.model.waiting:
            self._idle.set()
        else:
            self._idle.clear()

    async def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._sync()
            delay = self.model.next_event() - loop.time()
            self._wake.clear()
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), min(delay, 3600.0))

    def _flush_log(self) -> None:
        if self.request_log is None or self._logged >= len(self.model.log):
            return
        entries = self.model.log[self._logged:]
        self._logged = len(self.model.log)
        with self.request_log.open("a") as f:
            for entry in entries:
                f.write(json.dumps({**entry, "boot_id": self.boot_id}) + "\n")

    # -- HTTP ----------------------------------------------------------------------------

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                line = await reader.readline()
                if not line:
                    return
                method, path, _ = line.decode("latin-1").split(" ", 2)
                headers: dict[str, str] = {}
                while (h := await reader.readline()) not in (b"\r\n", b"\n", b""):
                    name, _, value = h.decode("latin-1").partition(":")
                    headers[name.strip().lower()] = value.strip()
                length = int(headers.get("content-length", "0"))
                if length > self.max_body:
                    await self._respond(writer, 413, {"error": {"message": "body too large"}})
                    return
                body = await reader.readexactly(length) if length else b""
                try:
                    route = path.split("?")[0]
                    status, payload = 200, await self._route(method, route, body, reader)
                except HTTPError as exc:
                    status, payload = exc.status, exc.body
                except _Disconnected:
                    return
                await self._respond(writer, status, payload)
                if headers.get("connection", "").lower() == "close":
                    return
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            return
        finally:
            writer.close()

    @staticmethod
    async def _respond(writer: asyncio.StreamWriter, status: int, payload: Any) -> None:
        if isinstance(payload, _Text):
            data, kind = payload.encode(), "text/plain; version=0.0.4"
        else:
            data = b"" if payload is None else msgspec.json.encode(payload)
            kind = "application/json"
        head = (f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\n"
                f"Content-Type: {kind}\r\nContent-Length: {len(data)}\r\n\r\n")
        writer.write(head.encode() + data)
        await writer.drain()

    async def _route(self, method: str, path: str, body: bytes,
                     reader: asyncio.StreamReader) -> Any:
        get = {"/health": self._health, "/health_generate": self._health,
               "/get_server_info": self._server_info, "/server_info": self._server_info,
               "/get_model_info": self._model_info, "/model_info": self._model_info,
               "/metrics": self._metrics}
        post = {"/abort_request": self._abort, "/pause_generation": self._pause,
                "/continue_generation": self._continue,
                "/update_weights_from_disk": self._update_weights,
                "/flush_cache": self._flush_cache}
        if method == "GET" and path in get:
            return get[path]()
        if method == "GET" and path == "/flush_cache":  # SGLang takes GET or POST
            return await self._flush_cache({})
        if method in ("POST", "PUT") and path == "/generate":
            return await self._generate(_json(body), reader)
        if method == "POST" and path in post:
            return await post[path](_json(body))
        if path in get or path in post or path == "/generate":
            raise _error(405, f"{method} not allowed on {path}")
        raise _error(404, f"no route {path}")

    # -- endpoints -----------------------------------------------------------------------

    def _health(self) -> None:
        if not self.healthy:
            raise HTTPError(503, None)
        return

    def _server_info(self) -> dict[str, Any]:
        m = self.model
        return {"boot_id": self.boot_id, "version": "sim", "max_running_requests": m.slots,
                "max_total_num_tokens": m.max_total_tokens,
                "chunked_prefill_size": m.chunked_prefill_size,
                "prefill_tokens_per_s": m.prefill_tokens_per_s,
                "weight_version": m.weight_version, "step_ms": m.step_ms,
                "step_ms_per_request": m.step_ms_per_request,
                "running": len(m.running), "waiting": len(m.waiting),
                "paused": m.paused}

    def _metrics(self) -> _Text:
        """Prometheus text with SGLang's names and types (``--enable-metrics``)."""
        self._sync()
        m, c = self.model, self.model.counters
        running = len(m.running)
        throughput = running / m.step_s() if running and not m.paused else 0.0
        asked = c.prompt_tokens
        labels = '{model_name="sim"}'
        metrics: list[tuple[str, str, str, float, str]] = [
            ("num_running_reqs", "gauge", "The number of running requests.", running, labels),
            ("num_queue_reqs", "gauge", "The number of requests in the waiting queue.",
             len(m.waiting), labels),
            ("gen_throughput", "gauge", "The generation throughput (token/s).",
             throughput, labels),
            ("token_usage", "gauge", "The token usage.", m.token_usage(), labels),
            ("num_used_tokens", "gauge", "The number of used tokens.",
             m.used_tokens() - m.cache.evictable, labels),
            ("max_total_num_tokens", "gauge",
             "Maximum total number of tokens in the KV cache pool.", m.max_total_tokens, labels),
            ("cache_hit_rate", "gauge", "The prefix cache hit rate.",
             c.cached_tokens / asked if asked else 0.0, labels),
            ("new_token_ratio", "gauge", "The new token ratio.", m.new_token_ratio, labels),
            ("num_retracted_reqs", "gauge", "The number of retracted requests.",
             sum(1 for r in m.waiting if r.retractions), labels),
            ("num_retracted_requests_total", "counter", "Total number of retracted requests.",
             c.retracted_requests, labels),
            ("num_retracted_input_tokens_total", "counter",
             "Total number of retracted input tokens.", c.retracted_input_tokens, labels),
            ("num_retracted_output_tokens_total", "counter",
             "Total number of retracted output tokens.", c.retracted_output_tokens, labels),
            ("prompt_tokens_total", "counter", "Number of prefill tokens processed.",
             c.prompt_tokens, labels),
            ("generation_tokens_total", "counter", "Number of generation tokens processed.",
             c.generation_tokens, labels),
            ("cached_tokens_total", "counter",
             "Number of cached prompt tokens by source (device/host/storage).",
             c.cached_tokens, '{model_name="sim",cache_source="device"}'),
            ("num_requests_total", "counter", "Number of requests processed.",
             c.requests, labels),
            ("num_aborted_requests_total", "counter", "Number of requests aborted.",
             c.aborted_requests, labels),
        ]
        lines = []
        for name, kind, doc, value, label in metrics:
            lines += [f"# HELP sglang:{name} {doc}", f"# TYPE sglang:{name} {kind}"]
            # SGLang's retraction counters have no sample before the first retraction
            if not (name.startswith("num_retracted_") and kind == "counter"
                    and not c.retracted_requests):
                lines.append(f"sglang:{name}{label} {float(value)!r}")
        return _Text("\n".join(lines) + "\n")

    def _model_info(self) -> dict[str, Any]:
        return {"model_path": self.model_path, "weight_version": self.info_version}

    async def _abort(self, body: dict[str, Any]) -> None:
        self._sync()
        self.model.abort(str(body.get("rid", "")), bool(body.get("abort_all", False)))
        self._sync()
        self._wake.set()
        return

    async def _pause(self, body: dict[str, Any]) -> dict[str, str]:
        mode = body.get("mode", "abort")
        if mode not in ("abort", "in_place", "retract"):
            raise _error(400, f"invalid pause mode {mode!r}")
        self._sync()
        self.model.pause(mode)
        self._resumed.clear()
        self._sync()
        self._wake.set()
        return {"message": "Generation paused successfully.", "status": "ok"}

    async def _continue(self, body: dict[str, Any]) -> dict[str, str]:
        self._sync()
        self.model.resume()
        self._resumed.set()
        self._wake.set()
        return {"message": "Generation continued successfully.", "status": "ok"}

    async def _update_weights(self, body: dict[str, Any]) -> dict[str, Any]:
        if not body.get("model_path"):
            raise _error(400, "model_path is required")
        path = str(body["model_path"])
        if not Path(path).is_dir():  # SGLang finds no weights there, and keeps its own
            raise HTTPError(400, {"success": False, "num_paused_requests": 0, "message":
                                  f"{WEIGHTS_NOT_FOUND} no weights folder at `{path}`."})
        if body.get("abort_all_requests"):  # SGLang aborts every request first
            self._sync()
            self.model.abort(abort_all=True)
            self._sync()
            self._wake.set()
        if not self.model.paused:  # SGLang waits for in-flight generations to finish
            self._sync()
            await self._idle.wait()
        version = body.get("weight_version")
        self._sync()
        # the weights load either way; a refused flush fails the call, and then neither
        # /get_model_info nor the version it names change (the tokens' version does)
        if not self.model.update_weights(self.model.weight_version if version is None
                                         else str(version), bool(body.get("flush_cache", True))):
            raise HTTPError(400, {"success": False, "message": CACHE_NOT_FLUSHED,
                                  "num_paused_requests": 0})
        self.model_path = path
        self.info_version = self.model.weight_version
        message = "Succeeded to update model weights."
        if version is not None:
            message += f" Weight version updated to {version}."
        return {"success": True, "message": message, "num_paused_requests": 0}

    async def _flush_cache(self, body: dict[str, Any]) -> _Text:
        self._sync()
        if not self.model.flush_cache():
            raise HTTPError(400, _Text("Flush cache failed.\n"))
        return _Text(CACHE_FLUSHED)

    async def _generate(self, body: dict[str, Any], reader: asyncio.StreamReader) -> dict[str, Any]:
        params = body.get("sampling_params") or {}
        if not isinstance(params, dict):
            raise _error(400, "sampling_params must be an object")
        unknown = sorted(set(params) - SAMPLING_KEYS)
        if unknown:
            raise HTTPError(400, {"error": f"unknown field `{unknown[0]}` in sampling_params"})
        if "input_ids" in body:
            prompt = body["input_ids"]
            if not isinstance(prompt, list):
                raise _error(400, "input_ids must be a list of token ids")
        elif "text" in body:
            prompt = text_tokens(str(body["text"]))
        else:
            raise _error(400, "Either text or input_ids should be provided.")
        if len(prompt) >= self.context_length:
            raise _error(400, f"The input ({len(prompt)} tokens) is longer than the model's "
                              f"context length ({self.context_length} tokens).")
        if params.get("max_new_tokens", 128) < 0:
            raise _error(400, "max_new_tokens must be at least 0")
        rid = str(body.get("rid") or uuid.uuid4().hex)
        seed = params.get("sampling_seed")
        seed = DEFAULT_SEED if seed is None else int(seed)
        self._sync()
        if self.model.active(rid):
            raise _error(400, f"Duplicate request ID detected: {rid}")
        await self._resumed.wait()  # a paused server holds new requests
        loop = asyncio.get_running_loop()
        done: asyncio.Future[tuple[SimRequest, dict[str, Any]]] = loop.create_future()

        def on_done(request: SimRequest, reason: dict[str, Any]) -> None:
            if not done.done():
                done.set_result((request, reason))

        max_new = int(params.get("max_new_tokens", 128))
        length, stop = stop_at(seed, params, max_new)
        request = SimRequest(rid, seed, length, self.model.weight_version, prompt=prompt,
                             max_new=max_new, stop_reason=stop, on_done=on_done)
        self._sync()
        try:
            self.model.submit(request)
        except DuplicateRid:
            raise _error(400, f"Duplicate request ID detected: {rid}") from None
        except PromptTooLong as exc:
            raise _error(400, str(exc)) from None
        self._sync()
        self._wake.set()
        # Watch the connection while the request runs: a client that goes away has its
        # request aborted, as SGLang does. (Clients send nothing more while they wait.)
        eof = asyncio.ensure_future(reader.read(1))
        waits: set[asyncio.Future[Any]] = {done, eof}
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        if not done.done():
            self._sync()
            self.model.abort(rid)
            self._sync()
            raise _Disconnected
        eof.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await eof
        request, reason = done.result()
        return self._response(body, params, request, reason, loop.time())

    def _response(self, body: dict[str, Any], params: dict[str, Any], r: SimRequest,
                  reason: dict[str, Any], now: float) -> dict[str, Any]:
        n = r.tokens
        ids = r.output(n)
        meta: dict[str, Any] = {
            "id": r.rid, "finish_reason": reason, "prompt_tokens": len(r.prompt),
            "completion_tokens": n, "cached_tokens": r.cached_tokens,
            "num_retractions": r.retractions,
            "weight_version": r.version_events[-1][0] if r.version_events
            else self.model.weight_version,
            "weight_versions": self.model.version_spans(r),
            "e2e_latency": now - r.arrived,
        }
        if body.get("return_logprob"):
            # [logprob, token id, null] per token, as tuples (encoded as JSON arrays)
            meta["output_token_logprobs"] = list(zip(token_logprobs(r.seed, n), ids,
                                                     itertools.repeat(None)))
        text = output_text(r.seed, n, params, complete=reason["type"] != "abort")
        return {"text": text, "output_ids": ids, "meta_info": meta}


class _Disconnected(Exception):
    pass


class _Text(str):
    """A plain-text response body."""


def _json(body: bytes) -> dict[str, Any]:
    if not body:
        return {}
    try:
        value = msgspec.json.decode(body)
    except msgspec.DecodeError:
        raise _error(400, "body is not valid JSON") from None
    if not isinstance(value, dict):
        raise _error(400, "body must be a JSON object")
    return value


def run_sim_engine(*, host: str, port: int, slots: int, step_ms: float,
                   step_ms_per_request: float, request_log: Path | None = None,
                   boot_id: str | None = None, **kv: Any) -> None:
    """Serve one simulated replica until SIGINT or SIGTERM (``queue-rollout
    sim-engine``), then close and return; *kv*: the model's prefill and KV settings
    (``prefill_tokens_per_s``, ``chunked_prefill_size``, ``max_total_tokens``). The
    handlers are its own: a process started with SIGINT ignored (a background job of a
    script) stops on Ctrl-C all the same."""

    async def main() -> None:
        model = SimModel(slots=slots, step_ms=step_ms, step_ms_per_request=step_ms_per_request,
                         **kv)
        server = SimEngineServer(model, host=host, port=port, request_log=request_log)
        if boot_id:
            server.boot_id = boot_id
        await server.start()
        serving = asyncio.ensure_future(server.serve_forever())
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, serving.cancel)
        print(f"sim engine listening on http://{host}:{server.port} (boot {server.boot_id})",
              flush=True)
        try:
            with contextlib.suppress(asyncio.CancelledError):
                await serving
        finally:
            await server.close()

    asyncio.run(main())


class ThreadedSimEngine:
    """A simulated replica on its own event-loop thread, for tests and in-process farms."""

    def __init__(self, *, slots: int, step_ms: float, step_ms_per_request: float = 0.0,
                 host: str = "127.0.0.1", port: int = 0, request_log: Path | None = None,
                 context_length: int = 1 << 20, **kv: Any) -> None:
        import threading

        self.loop = asyncio.new_event_loop()
        self.server = SimEngineServer(
            SimModel(slots=slots, step_ms=step_ms, step_ms_per_request=step_ms_per_request,
                     **kv),
            host=host, port=port, request_log=request_log, context_length=context_length)
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True,
                                       name="sim-engine")
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result(10)
        self.url = f"http://{host}:{self.server.port}"

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.close(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    def __enter__(self) -> ThreadedSimEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
