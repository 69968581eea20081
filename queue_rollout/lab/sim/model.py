"""The engine model: what an SGLang replica charges, advanced analytically.

One model drives both the simulated replica (``queue-rollout sim-engine``, in real
time, :mod:`queue_rollout.lab.sim.server`) and the virtual-time farm
(:mod:`queue_rollout.lab.virtual.farm`); everything here is synchronous and takes the time
as an argument, so tests drive it with a hand-moved clock. Per replica it carries, as
SGLang's scheduler does (read from SGLang 0.5.x's ``scheduler.py``,
``schedule_policy.py``, ``schedule_batch.py`` and ``radix_cache.py``; see
``SGLANG_API.md``):

- **Decode.** A step takes ``step_ms + step_ms_per_request * running +
  step_us_per_context_token * context / 1000`` ms, *context* being the prompt and
  output tokens of every running request (attention reads each request's whole KV:
  on a CPU with torch-native attention that term dominates long contexts), and gives
  every running request one token. Between events the running set is constant and
  each step adds *running* tokens to the context, so a step's time grows linearly
  and progress over any interval is solved in closed form, never per token.
- **Prefill.** A request's context tokens not in the prefix cache are computed at
  ``prefill_tokens_per_s``, in rounds of at most ``chunked_prefill_size`` tokens; a
  round stalls decode while it runs (SGLang runs a prefill batch instead of a decode
  step whenever one can be formed). Simplification: the first output token is charged
  to a decode step, not to the prefill pass (one step per request).
- **Prefix cache.** A finished or aborted request's context (prompt + output) stays
  cached (:class:`~.prefix_cache.PrefixCache`); a request reuses the longest cached
  prefix of its context, at most its length minus one (SGLang computes at least one
  token). After its prefill a request's context is in the cache, held until it ends.
- **KV memory.** ``max_total_tokens`` holds the cache and the running requests'
  tokens. A waiting request is admitted, in arrival order, only while
  ``extend + min(max_new, clip)`` fits in free + evictable tokens less what running
  requests may still need (``min(max_new - produced, clip) * new_token_ratio``; the
  whole ``min(max_new - produced, clip)`` for an ``ignore_eos`` request, which cannot
  end early: SGLang 0.5.23's rule),
  checked again once its cached prefix is held (no longer evictable); a refusal blocks
  admission until a request ends (SGLang's ``batch_is_full``).
  ``new_token_ratio`` starts at 0.7, decays per decode step to 0.098 over 600 steps,
  is re-estimated after a retraction and reset when the replica is idle.
- **Retraction.** When the next decode step does not fit even after evicting the
  cache, running requests are retracted, fewest output tokens first (ties: longest
  prompt first), until it fits; at least one, never the last. A retracted request
  frees its KV, keeps its output and waits at the end of the queue; when admitted
  again it recomputes its context (prompt + output) less what is still cached.
- **One request larger than the pool.** SGLang clamps each request's
  ``max_new_tokens`` so that prompt + output fits an empty pool; so does the model, and
  such a request ends with ``length`` at the clamped length. A prompt that alone does
  not fit is refused.
- **Pause modes.** ``in_place`` freezes everything (KV kept); ``abort`` ends every
  request (running contexts go to the cache); ``retract`` frees every running
  request's KV and puts it back in the queue (its prompt stays cached, its output is
  recomputed on resume).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from queue_rollout.config import PauseMode
from queue_rollout.engines.synthetic import token_ids
from queue_rollout.lab.sim.prefix_cache import Node, PrefixCache
from queue_rollout.lab.sim.tokens import Tokens

#: SGLang's defaults (environ.py): SGLANG_INIT_NEW_TOKEN_RATIO,
#: SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR, SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS,
#: SGLANG_RETRACT_DECODE_STEPS, SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION.
INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO = INIT_NEW_TOKEN_RATIO * 0.14
NEW_TOKEN_RATIO_DECAY = (INIT_NEW_TOKEN_RATIO - MIN_NEW_TOKEN_RATIO) / 600
RETRACT_DECODE_STEPS = 20
CLIP_MAX_NEW_TOKENS = 4096
OOM_MESSAGE = ("Out of memory even after retracting all other requests in the decode "
               "batch. Aborting the last request.")
_EPS = 1e-6


#: The prompt's first token ids a request's log entry carries: whose request it was,
#: for a client that sends no rid.
PROMPT_HEAD = 8


def recomputed_tokens(log: Iterable[dict[str, Any]]) -> int:
    """Context tokens the requests of a request *log* computed more than once: what a
    request prefilled beyond its first admission's share (its prompt less what it found
    cached), that is the recomputation retractions (and ``retract`` pauses) cost."""
    return sum(e["prefill_tokens"] - (e["prompt_tokens"] - e["cached_tokens"]) for e in log)


class DuplicateRid(Exception):
    """An rid that is still waiting or running was sent again (SGLang >= 0.5.10)."""


class PromptTooLong(Exception):
    """A prompt that alone does not fit the replica's KV pool."""


@dataclass(eq=False)
class SimRequest:
    rid: str
    seed: int
    target: int  # tokens this request will produce if nothing stops it
    weight_version: str
    prompt: Sequence[int] = ()
    max_new: int = -1  # the request's max_new_tokens (-1: its target)
    #: sent with ``ignore_eos``: it runs to max_new, so admission reserves all of it
    ignore_eos: bool = False
    #: its output token ids, compact (a range or Tokens: the virtual farm's); default:
    #: the seeded ids the server returns, made as they are produced
    output_ids: Sequence[int] | None = field(default=None, repr=False)
    produced: float = 0.0
    arrived: float = 0.0
    started: float | None = None
    cached_tokens: int = 0  # prompt tokens found in the cache at the first admission
    retractions: int = 0
    #: how it ends when it reaches *target* unless cut short: a stop (EOS or a stop
    #: token, ``{"type": "stop", "matched": id}``); None: ``length``
    stop_reason: dict[str, Any] | None = None
    #: the weights changed while it ran: (the version before, output tokens by then)
    version_events: list[tuple[str, int]] = field(default_factory=list)
    computed_tokens: int = 0  # context tokens prefilled for it, every admission included
    on_done: Callable[[SimRequest, dict[str, Any]], None] | None = field(default=None, repr=False)
    # engine state
    _extend_left: int = 0  # context tokens still to prefill
    _kv: int = 0  # tokens this request holds outside the cache
    _mark: float = 0.0  # produced when it (re)joined the running set
    _held: Node | None = None  # the cache path it holds
    _admitted: bool = False  # admitted before (a re-admission's cache hit is not counted)
    _outputs: list[int] = field(default_factory=list, repr=False)
    _context: tuple[int, Sequence[int]] | None = field(default=None, repr=False)

    @property
    def tokens(self) -> int:
        return min(self.target, int(self.produced + _EPS))

    def output(self, n: int) -> Sequence[int]:
        """Its first *n* output token ids."""
        if self.output_ids is not None:
            return self.output_ids[:n]
        have = len(self._outputs)
        if have < n:
            self._outputs += token_ids(self.seed, have, n - have)
        return self._outputs[:n]

    def context(self) -> Sequence[int]:
        """Prompt and output so far (kept while the output does not grow: a request
        waiting for admission is looked at again and again); compact
        (:class:`~.tokens.Tokens`) when its output ids are."""
        n = self.tokens
        if self._context is None or self._context[0] != n:
            context: Sequence[int] = (
                Tokens.of(self.prompt) + self.output(n) if self.output_ids is not None
                else [*self.prompt, *self.output(n)])
            self._context = (n, context)
        return self._context[1]


@dataclass
class EngineCounters:
    """SGLang's counters (``/metrics``)."""

    prompt_tokens: int = 0
    prefill_tokens: int = 0  # context tokens computed, in every prefill round
    generation_tokens: int = 0
    cached_tokens: int = 0
    requests: int = 0
    aborted_requests: int = 0
    retracted_requests: int = 0
    retracted_input_tokens: int = 0
    retracted_output_tokens: int = 0


class SimModel:
    def __init__(self, *, slots: int, step_ms: float, step_ms_per_request: float,
                 step_us_per_context_token: float = 0.0, now: float = 0.0,
                 weight_version: str = "default",
                 prefill_tokens_per_s: float = 20_000.0, chunked_prefill_size: int = 8192,
                 max_total_tokens: int = 220_000,
                 clip_max_new_tokens: int = CLIP_MAX_NEW_TOKENS) -> None:
        if min(prefill_tokens_per_s, chunked_prefill_size, max_total_tokens) <= 0:
            raise ValueError("prefill rate, chunk and pool sizes must be positive")
        self.slots = slots
        self.step_ms = step_ms
        self.step_ms_per_request = step_ms_per_request
        self.step_us_per_context_token = step_us_per_context_token
        self.prefill_tokens_per_s = prefill_tokens_per_s
        self.chunked_prefill_size = chunked_prefill_size
        self.max_total_tokens = max_total_tokens
        self.clip = clip_max_new_tokens
        self.now = now
        self.weight_version = weight_version
        self.running: dict[str, SimRequest] = {}
        self.waiting: deque[SimRequest] = deque()
        self.cache = PrefixCache()
        self.counters = EngineCounters()
        self.new_token_ratio = INIT_NEW_TOKEN_RATIO
        self.paused: PauseMode | None = None
        self.log: list[dict[str, Any]] = []  # one entry per request that ended
        self._prefill: list[SimRequest] = []  # the prefill round in progress
        self._prefill_left = 0.0  # its seconds still to run
        self._chunked: SimRequest | None = None  # partly prefilled, continues first
        self._batch_full = False  # admission refused until a request ends

    # -- sizes ----------------------------------------------------------------------------

    def used_tokens(self) -> float:
        """Tokens held: the cache and the requests' own."""
        own = sum(r._kv + r.produced - r._mark for r in self.running.values())
        own += sum(r._kv for r in self._prefill)
        if self._chunked is not None and self._chunked not in self._prefill:
            own += self._chunked._kv
        return self.cache.tokens + own

    def token_usage(self) -> float:
        """SGLang's ``token_usage``: tokens held less the evictable cache, of the pool."""
        return (self.used_tokens() - self.cache.evictable) / self.max_total_tokens

    @property
    def busy(self) -> bool:
        """Whether the GPU has work: a prefill round or decoding (NVML's utilization
        counts such time)."""
        return not self.paused and bool(self._prefill or self.running)

    def step_s(self) -> float:
        """The next decode step's time (s)."""
        context = sum(len(r.prompt) + r.produced for r in self.running.values())
        return (self.step_ms + self.step_ms_per_request * len(self.running)
                + self.step_us_per_context_token * context / 1000.0) / 1000.0

    def _growth_s(self) -> float:
        """How much each step's time grows over the one before (s): the running
        requests' new tokens, each read by every later step."""
        return self.step_us_per_context_token * len(self.running) / 1e6

    def decode_time(self, steps: float) -> float:
        """Seconds the running set takes for *steps* more steps."""
        return steps * self.step_s() + self._growth_s() * steps * steps / 2

    def decode_steps(self, seconds: float) -> float:
        """Steps the running set makes in *seconds* (the inverse of :meth:`decode_time`)."""
        first, growth = self.step_s(), self._growth_s()
        return 2 * seconds / (first + math.sqrt(first * first + 2 * growth * seconds))

    # -- time -----------------------------------------------------------------------------

    def next_event(self) -> float:
        """When the next prefill round ends, request completes or decode runs out of
        memory (inf when nothing runs or paused)."""
        if self.paused:
            return math.inf
        if self._prefill:
            return self.now + self._prefill_left
        if not self.running:
            return math.inf
        left = min(r.target - r.produced for r in self.running.values())
        room = self.max_total_tokens - self.used_tokens() + self.cache.evictable
        steps = min(max(0.0, left), max(0.0, math.floor(room / len(self.running) + _EPS)))
        return self.now + self.decode_time(steps)

    def advance(self, now: float) -> None:
        """Run up to *now*, handling every event at its exact time."""
        while True:
            t = self.next_event()
            if t > now:
                break
            self._progress(t)
            if self._prefill:
                self._end_prefill()
            else:
                done = [r for r in self.running.values() if r.target - r.produced <= _EPS]
                for r in done:
                    self._end(r, r.stop_reason or {"type": "length", "length": r.target})
                if not done:
                    self._retract_for_decode()
            self._schedule()
        self._progress(now)

    def _progress(self, t: float) -> None:
        if t <= self.now:
            return
        dt, self.now = t - self.now, t
        if self.paused:
            return
        if self._prefill:
            self._prefill_left = max(0.0, self._prefill_left - dt)
            return
        if self.running:
            tokens = self.decode_steps(dt)
            for r in self.running.values():
                r.produced = min(float(r.target), r.produced + tokens)
            self.new_token_ratio = max(MIN_NEW_TOKEN_RATIO,
                                       self.new_token_ratio - NEW_TOKEN_RATIO_DECAY * tokens)
            self._fit()

    # -- scheduling -----------------------------------------------------------------------

    def _schedule(self) -> None:
        """Start a prefill round if one can be formed (prefill first)."""
        if self.paused or self._prefill:
            return
        if not self.running and not self.waiting and self._chunked is None:
            self.new_token_ratio = INIT_NEW_TOKEN_RATIO  # idle: SGLang's reset
            return
        if (self._batch_full or not self.waiting) and self._chunked is None:
            return
        chunk_left = self.chunked_prefill_size
        budget = (self.max_total_tokens - self.used_tokens() + self.cache.evictable
                  - sum(min(r.max_new - r.produced, self.clip)
                        * (1.0 if r.ignore_eos else self.new_token_ratio)
                        for r in self.running.values()))
        round_: list[tuple[SimRequest, int]] = []
        if self._chunked is not None:
            r = self._chunked
            take = min(r._extend_left, chunk_left)
            round_.append((r, take))
            chunk_left -= take
            budget -= take
        while self.waiting and chunk_left > 0 and not self._batch_full \
                and len(self.running) + len(round_) < self.slots:
            r = self.waiting[0]
            context = r.context()
            match = self.cache.match(context, limit=len(context) - 1)
            extend = len(context) - match.tokens
            need = extend + min(max(r.max_new - r.tokens, 0), self.clip)
            if need >= budget:
                self._batch_full = True
                break
            take = min(extend, chunk_left)
            if take < extend and any(x is self._chunked for x, _ in round_):
                break  # one chunked request at a time
            # its cached prefix is held from now on: no longer evictable, so the check
            # is made again (SGLang's add_one_req re-checks after inc_lock_ref)
            evictable = self.cache.evictable
            self.cache.lock(match.node)
            budget -= evictable - self.cache.evictable
            if need >= budget:
                self.cache.unlock(match.node)
                self._batch_full = True
                break
            self.waiting.popleft()
            r._held = match.node
            if not r._admitted:
                r._admitted = True
                r.cached_tokens = match.tokens
                self.counters.cached_tokens += match.tokens
            r._extend_left = extend
            round_.append((r, take))
            chunk_left -= take
            budget -= need
        if not round_:
            return
        tokens = 0
        for r, take in round_:
            r._kv += take
            r.computed_tokens += take
            r._extend_left -= take
            tokens += take
        self.counters.prefill_tokens += tokens
        self._fit()
        self._prefill = [r for r, _ in round_]
        self._prefill_left = tokens / self.prefill_tokens_per_s

    def _end_prefill(self) -> None:
        done, self._prefill = self._prefill, []
        self._chunked = None
        for r in done:
            if r._extend_left > 0:
                self._chunked = r
                continue
            node = self.cache.insert(r.context(), r._held)  # cached, and held
            self.cache.lock(node)
            self._release(r)
            r._held = node
            r._mark = r.produced
            self._fit()
            if r.started is None:
                r.started = self.now
            self.running[r.rid] = r

    def _retract_for_decode(self) -> None:
        """The next decode step does not fit: retract (SGLang's ``retract_decode``)."""
        order = sorted(self.running.values(),
                       key=lambda r: (r.tokens, -len(r.prompt)), reverse=True)
        first = True
        while first or self._room() < len(order):
            first = False
            if len(order) == 1:
                if self._room() < 1:  # SGLang aborts the last request
                    self._end(order[0], {"type": "abort", "message": OOM_MESSAGE,
                                         "status_code": 500, "err_type": None})
                break
            r = order.pop()
            del self.running[r.rid]
            self._release(r)
            r.retractions += 1
            c = self.counters
            c.retracted_requests += 1
            c.retracted_input_tokens += len(r.prompt)
            c.retracted_output_tokens += r.tokens
            r.produced = float(r.tokens)
            self.waiting.append(r)
        shortfall = len(order) * RETRACT_DECODE_STEPS - (
            self.max_total_tokens - self.used_tokens())
        if shortfall > 0:
            self.cache.evict(math.ceil(shortfall))
        if order:
            decoded = sum(r.tokens for r in order)
            max_new = sum(r.max_new for r in order)
            self.new_token_ratio = min(
                1.0, (decoded + RETRACT_DECODE_STEPS * len(order)) / (max_new + 1))
        self._batch_full = False

    def _fit(self) -> None:
        """Evict cached leaves while the pool holds more than it can."""
        over = self.used_tokens() - self.max_total_tokens
        if over > 0:
            self.cache.evict(math.ceil(over))

    def _room(self) -> float:
        return self.max_total_tokens - self.used_tokens() + self.cache.evictable

    def _release(self, r: SimRequest) -> None:
        """Free what *r* holds outside the cache and its hold on the cache."""
        if r._held is not None:
            self.cache.unlock(r._held)
            r._held = None
        r._kv = 0
        r._mark = r.produced

    # -- requests -------------------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        """Requests it holds: running, in prefill or waiting."""
        chunked = self._chunked is not None and self._chunked not in self._prefill
        return len(self.running) + len(self._prefill) + chunked + len(self.waiting)

    def active(self, rid: str) -> bool:
        return any(r.rid == rid for r in self._requests())

    def _requests(self) -> list[SimRequest]:
        pending = [*self._prefill, *([self._chunked] if self._chunked else [])]
        unique = list(dict.fromkeys(pending))
        return [*self.running.values(), *unique, *self.waiting]

    def submit(self, request: SimRequest) -> None:
        if self.active(request.rid):
            raise DuplicateRid(request.rid)
        prompt = len(request.prompt)
        room = self.max_total_tokens - prompt - 2  # SGLang: max_req_len - prompt - 1
        if room < 0:
            raise PromptTooLong(f"{prompt} prompt tokens do not fit a KV pool of "
                                f"{self.max_total_tokens} tokens")
        request.max_new = min(request.target if request.max_new < 0 else request.max_new, room)
        if request.target > request.max_new:  # cut short by the room: not its stop
            request.target, request.stop_reason = request.max_new, None
        request.arrived = self.now
        self.counters.requests += 1
        self.counters.prompt_tokens += prompt
        if request.target <= 0:
            request.started = self.now
            self._end(request, {"type": "length", "length": 0})
            return
        self.waiting.append(request)
        self._schedule()

    def abort(self, rid: str = "", abort_all: bool = False) -> int:
        """Abort by rid prefix (as SGLang's scheduler matches), or everything."""
        hit = [r for r in self._requests() if abort_all or (rid and r.rid.startswith(rid))]
        for r in hit:
            queued = r.rid not in self.running
            message = "Abort in waiting queue" if queued else "Aborted"
            self._end(r, {"type": "abort", "message": message, "status_code": None,
                          "err_type": None})
        self._schedule()
        return len(hit)

    def pause(self, mode: PauseMode) -> None:
        if mode == "abort":
            self.abort(abort_all=True)
        elif mode == "retract":
            for r in self._requests():
                if r in self.waiting:
                    continue
                self.running.pop(r.rid, None)
                self._release(r)
                r.retractions += 1  # its answer counts it; SGLang's counter does not
                r._extend_left = 0
                r.produced = float(r.tokens)
                self.waiting.append(r)
            self._prefill, self._prefill_left, self._chunked = [], 0.0, None
            self._batch_full = False
        self.paused = mode

    def resume(self) -> None:
        self.paused = None
        self._schedule()

    def update_weights(self, version: str, flush: bool = True) -> bool:
        """A new policy version (each request with output records the change, as
        SGLang's ``weight_versions`` spans say), then the cache is flushed when *flush*
        (SGLang's ``flush_cache`` after ``update_weights_from_disk``). False when the
        flush was refused (:meth:`flush_cache`)."""
        for r in self._requests():
            if r.tokens:
                r.version_events.append((self.weight_version, r.tokens))
        self.weight_version = version
        return self.flush_cache() if flush else True

    def flush_cache(self) -> bool:
        """Empty the prefix cache; refused (False) while requests run or, unless
        paused, wait (SGLang's ``is_fully_idle``: a paused server ignores its queue)."""
        if self.running or self._prefill or self._chunked or (self.waiting and not self.paused):
            return False
        self.cache.flush()
        return True

    def version_spans(self, r: SimRequest) -> list[dict[str, Any]]:
        """SGLang's ``weight_versions`` of *r*'s output: ``{version, start, end}``
        spans, end exclusive."""
        n = r.tokens
        spans: list[tuple[str, int, int]] = []  # (version, start, end)
        for version, end in [*r.version_events, (self.weight_version, n)]:
            end = min(end, n)
            if spans and end <= spans[-1][2]:
                continue
            if spans and spans[-1][0] == version:
                spans[-1] = (version, spans[-1][1], end)
                continue
            spans.append((version, spans[-1][2] if spans else 0, end))
        return [{"version": v, "start": start, "end": end} for v, start, end in spans]

    def _end(self, r: SimRequest, finish_reason: dict[str, Any]) -> None:
        ran = r.rid in self.running
        self.running.pop(r.rid, None)
        if r in self.waiting:
            self.waiting.remove(r)
        if r in self._prefill:
            self._prefill.remove(r)
        if self._chunked is r:
            self._chunked = None
        if ran:  # its context stays cached (SGLang's cache_finished_req)
            self.cache.insert(r.context(), r._held)
        self._release(r)
        self._fit()
        self._batch_full = False
        # its tokens' versions as they stand: a weight update before its answer is sent
        # does not relabel them
        r.version_events.append((self.weight_version, r.tokens))
        self.counters.generation_tokens += r.tokens
        if finish_reason["type"] == "abort":
            self.counters.aborted_requests += 1
        self.log.append({"rid": r.rid, "seed": r.seed, "arrived": r.arrived,
                         "started": r.started, "ended": self.now, "tokens": r.tokens,
                         "prompt_tokens": len(r.prompt), "cached_tokens": r.cached_tokens,
                         "prompt_head": [int(t) for t in r.prompt[:PROMPT_HEAD]],
                         "retractions": r.retractions, "prefill_tokens": r.computed_tokens,
                         "finish": finish_reason["type"]})
        if r.on_done is not None:
            r.on_done(r, finish_reason)
