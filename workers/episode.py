"""One episode attempt, end to end, on the worker's replica.

:class:`AttemptRunner` claims the attempt in the ledger (``start``), keeps its lease
alive from a heartbeat thread while the workflow runs, and reports the result
(``finish``) until the ledger answers. What a failure means:

- ``/generate`` timed out or lost its connection: the attempt becomes doubtful, then
  the runner asks the replica (abort, then probe the rid); confirmed stopped, it is
  retried with the same seed; replica unreachable, it stays doubtful for the resolver.
- the replica refused the request outright: nothing runs, the attempt is retried.
  After any replica failure the runner takes no new job until the replica's
  ``/health`` answers (:meth:`AttemptRunner.await_replica`): a dead replica costs each
  episode worker one attempt, not one per queued job.
- the workflow rejected its output, or raised: the episode fails with that reason.
- the ledger says the attempt was superseded (lost after a doubt timeout): the
  generation is aborted and nothing is reported.
- shutdown: running episodes may finish within ``timeouts.shutdown_grace``; after it
  the generation is aborted, the stop confirmed, and the attempt handed back.

With ``engine.pause_mode = "abort"`` a generation aborted by a pause is resumed after
the pause from prompt + tokens so far with the remaining budget (partial rollout);
every output token keeps the policy version that produced it.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from queue_rollout.config import Config
from queue_rollout.engines.base import (
    DuplicateRid,
    EngineClient,
    EngineError,
    GenerateUncertain,
    Generation,
    episode_seed,
    turn_rid,
)
from queue_rollout.engines.synthetic import prompt_params
from queue_rollout.errors import RedisUnavailable
from queue_rollout.ledger.core import Answer, Ledger, Renewal
from queue_rollout.ledger.group_shapes import member_shape
from queue_rollout.results import EpisodeResult, add_tokens, encode_result
from queue_rollout.turns import Request
from queue_rollout.workers.workflows import EpisodeContext, EpisodeFailed, Workflow

log = logging.getLogger(__name__)
T = TypeVar("T")

#: The runner of the worker process executing the current RQ job (see run_attempt).
CURRENT_RUNNER: ContextVar[AttemptRunner] = ContextVar("queue_rollout_runner")


class AttemptStopped(Exception):
    """The attempt was stopped on purpose (shutdown, or superseded in the ledger)."""


@dataclass(eq=False)
class _Live:
    """What the lease thread and the episode share for one attempt."""

    aid: str
    rid: str = ""
    tokens: int = 0
    version: int | None = None  # the policy version read when the attempt started
    seq: int = 0
    tool: bool = False  # waiting on a tool between turns
    next_beat: float = 0.0  # monotonic time of the next lease renewal
    #: (tokens, rid, tool) as the ledger last took them: what start recorded at first
    reported: tuple[int, str, bool] | None = None
    superseded: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)


class LeaseKeeper:
    """One thread per worker process renews the leases of all its running attempts
    together, every lease / 3, in one ledger call (not one per episode). The process is
    their lease holder (:attr:`holder`, named when each starts): the call renews its
    lease once, and an attempt that reports nothing new since the last call keeps its
    record (its lease alone renewed, every other call). An attempt the ledger no longer
    knows as this worker's (superseded, lost) is aborted on the
    replica; after the shutdown grace, every attempt still running is. Aborts go out on
    a second thread: a slow replica delays no renewal, and no episode waits on the
    replica to end or to record its request."""

    def __init__(self, ledger: Ledger, client: EngineClient, worker_id: str,
                 lease_s: float) -> None:
        self.ledger, self.client = ledger, client
        self.worker_id, self.lease_s = worker_id, lease_s
        #: this process as the lease holder of the attempts it runs: fresh per keeper
        self.holder = f"{worker_id}/{uuid.uuid4().hex[:16]}"
        self.stop_deadline: float | None = None
        self._swept = False  # every attempt was aborted at the stop deadline
        self._lock = threading.Lock()
        self._live: set[_Live] = set()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._aborts: queue.SimpleQueue[_Live] = queue.SimpleQueue()

    def stop_at(self, deadline: float) -> None:
        """Shutdown: at *deadline* (the end of the grace) every attempt still running is
        aborted at once, not at its next renewal (which may be lease / 3 later)."""
        if self.stop_deadline is None:
            self.stop_deadline = deadline
            self._wake.set()

    def add(self, live: _Live) -> None:
        with self._lock:
            self._live.add(live)
            if self._thread is None:  # one of each for the process's life
                self._thread = threading.Thread(target=self._loop, daemon=True, name="lease")
                self._thread.start()
                threading.Thread(target=self._abort_loop, daemon=True, name="abort").start()
        self._wake.set()

    def record(self, live: _Live) -> None:
        """Renew *live* now, so the ledger holds its rid and tool wait before the
        episode goes on (the resolver probes the rid it recorded)."""
        with self._lock:
            if live.done.is_set():
                return
            live.next_beat = time.monotonic() + self.lease_s / 3
            self._renew([live])

    def remove(self, live: _Live) -> None:
        """The attempt ends: no renewal of it starts after this returns (one in
        progress is waited for). Called before the episode reports, so no renewal
        follows its report."""
        with self._lock:
            live.done.set()
            self._live.discard(live)

    def _loop(self) -> None:
        while True:
            with self._lock:
                due = [x for x in self._live if not x.done.is_set()]
                delay = (min(x.next_beat for x in due) - time.monotonic()) if due else None
                sweep = []
                if self.stop_deadline is not None and not self._swept:
                    until = self.stop_deadline - time.monotonic()
                    if until <= 0:
                        self._swept, sweep = True, due
                    else:
                        delay = until if delay is None else min(delay, until)
            if sweep:  # the grace is over: stop every generation now
                log.info("shutdown grace over: aborting %d running attempts", len(sweep))
                for live in sweep:
                    self._aborts.put(live)
                continue
            if delay is None or delay > 0:
                self._wake.wait(delay)
                self._wake.clear()
                continue
            with self._lock:  # no attempt ends (and reports) mid-renewal
                # one is due: every one is renewed with it, in one call (those not yet
                # due a little early), so a process's renewals stay one call however
                # its attempts' starts are spread
                now = time.monotonic()
                batch = [x for x in self._live if not x.done.is_set()]
                for x in batch:
                    x.next_beat = now + self.lease_s / 3
                self._renew(batch)

    def _renew(self, batch: list[_Live]) -> None:
        reports: list[tuple[int, str, bool]] = []
        for live in batch:
            live.seq += 1
            reports.append((live.tokens, live.rid, live.tool))
        try:
            answers = self.ledger.renew(
                self.worker_id, self.lease_s,
                [Renewal(x.aid, x.seq, *r, changed=r != x.reported)
                 for x, r in zip(batch, reports, strict=True)], holder=self.holder)
        except RedisUnavailable as exc:
            log.warning("lease renewal of %d attempts failed: %s", len(batch), exc)
            return
        stopping = self.stop_deadline is not None and time.monotonic() >= self.stop_deadline
        for live, answer, report in zip(batch, answers, reports, strict=True):
            if not answer.ignored:
                live.reported = report
            if answer.ignored and answer.reason != "duplicate progress":
                log.warning("attempt %s: heartbeat ignored (%s): aborting it", live.aid,
                            answer.reason)
                live.superseded.set()
                live.done.set()  # nothing more to renew
                self._aborts.put(live)
            elif stopping:
                self._aborts.put(live)

    def _abort_loop(self) -> None:
        """Send the aborts the renewals asked for, one at a time, holding no lock."""
        while True:
            live = self._aborts.get()
            try:
                self.client.abort(live.aid)  # SGLang matches by prefix: every turn and piece
            except EngineError as exc:
                log.warning("attempt %s: abort failed: %s", live.aid, exc)


class AttemptRunner:
    def __init__(self, *, ledger: Ledger, config: Config, client: EngineClient,
                 worker_id: str, boot_id: str, workflow: Workflow,
                 lease: LeaseKeeper | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.ledger = ledger
        self.config = config
        self.client = client
        self.worker_id = worker_id
        self.boot_id = boot_id
        self.workflow = workflow
        self.sleep = sleep
        self.stop_deadline: float | None = None  # set on shutdown: grace ends here
        # the process's lease keeper (one for all its runners), or one of its own
        self.lease = lease or LeaseKeeper(ledger, client, worker_id, config.timeouts.lease)
        self.replica_failed = False  # set by a replica failure; cleared by await_replica

    # -- public ----------------------------------------------------------------------

    def request_stop(self) -> None:
        """Shutdown: running episodes may finish within the grace period."""
        if self.stop_deadline is None:
            self.stop_deadline = time.monotonic() + self.config.timeouts.shutdown_grace
        self.lease.stop_at(self.stop_deadline)

    def await_replica(self, stopping: Callable[[], bool], beat: Callable[[], None],
                      poll_s: float = 1.0) -> None:
        """After a replica failure, return once its /health answers (or *stopping*),
        calling *beat* about every 30 s; at once otherwise."""
        if not self.replica_failed:
            return
        since = last_beat = time.monotonic()
        warned = False
        while not self.client.healthy(timeout=min(5.0, poll_s * 5)):
            if stopping():
                return
            if not warned:
                log.warning("replica %s unreachable: no new episode until it is healthy",
                            self.client.url)
                warned = True
            if time.monotonic() - last_beat >= 30:
                beat()
                last_beat = time.monotonic()
            self.sleep(poll_s)
        if warned:
            log.info("replica %s healthy again after %.1fs", self.client.url,
                     time.monotonic() - since)
        self.replica_failed = False

    def run(self, aid: str) -> str:
        """Run attempt *aid*; returns what happened (a word, also logged)."""
        start = self.ledger.start(aid, self.worker_id, self.client.url, self.boot_id,
                                  self.config.timeouts.lease, holder=self.lease.holder)
        if start.status != "started":
            log.info("attempt %s: ignored (%s)", aid, start.reason)
            return "unknown" if start.reason == "unknown attempt" else "ignored"
        live = _Live(aid, rid=aid, version=start.version, reported=(0, aid, False),
                     next_beat=time.monotonic() + self.config.timeouts.lease / 3)
        self.lease.add(live)
        try:
            return self._episode(live, start.group_id, start.member, start.prompt)
        finally:
            self.lease.remove(live)

    # -- the episode -----------------------------------------------------------------

    def _episode(self, live: _Live, group_id: str, member: int, raw: bytes | None) -> str:
        aid = live.aid
        prompt: dict[str, Any] = json.loads(raw) if raw else {"id": group_id}
        ctx = EpisodeContext(
            prompt=prompt, member=member,
            seed=episode_seed(self.config.workflow.seed, group_id, member),
            sampling=self.config.workflow.sampling.params(),
            generate_call=lambda turn, ids, text, params: self._generate(
                live, turn, ids, text, params),
            tool_wait=lambda seconds: self._tool_wait(live, seconds),
            engine_params=prompt_params(prompt) if self.config.engine.kind == "sim" else {},
        )
        try:
            reward = self.workflow.run(ctx)
        except GenerateUncertain as exc:
            self.replica_failed = True
            return self._doubt(live, "generate_error", str(exc))
        except DuplicateRid as exc:  # our own earlier request still runs
            return self._doubt(live, "generate_error", str(exc))
        except AttemptStopped:
            if live.superseded.is_set():
                log.warning("attempt %s: superseded in the ledger, generation aborted", aid)
                return "superseded"
            return self._hand_back(live, "worker_lost")
        except EngineError as exc:
            log.warning("attempt %s: replica refused: %s", aid, exc)
            self.replica_failed = True
            return self._retry(live, "generate_error")
        except EpisodeFailed as exc:
            return self._report(live, ctx, None, outcome="failed", error=str(exc))
        except Exception as exc:  # a workflow plugin's bug fails the episode, not the worker
            log.exception("attempt %s: workflow raised", aid)
            return self._report(live, ctx, None, outcome="failed",
                                error=f"workflow raised {type(exc).__name__}: {exc}")
        return self._report(live, ctx, reward, outcome="finished")

    def _generate(self, live: _Live, turn: int, input_ids: list[int] | None,
                  text: str | None, params: dict[str, Any]
                  ) -> tuple[Generation, list[tuple[int, int]]]:
        """One workflow call, resumed across pause-aborts (partial rollout)."""
        context: list[int] | str = input_ids if input_ids is not None else (text or "")
        budget = int(params.get("max_new_tokens", 128))
        request: Request[Any] = Request(turn_rid(live.aid, turn), context, budget)
        ids: list[int] = []
        logprobs: list[float] = []
        texts: list[str] = []
        runs: list[tuple[int, int]] = []
        prompt_tokens = cached_tokens = 0
        while True:
            if request.rid != live.rid or live.tool:  # the ledger knows it before it is sent
                live.rid, live.tool = request.rid, False
                self.lease.record(live)
            if self._stopping(live):
                raise AttemptStopped
            if live.version is not None:  # read with the start: no round trip
                version, live.version = live.version, None
            else:
                version = self.ledger.version()
            sent = request.context
            gen = self.client.generate(
                request.rid, input_ids=sent if isinstance(sent, list) else None,
                text=sent if isinstance(sent, str) else None,
                sampling_params={**params, "max_new_tokens": request.max_new_tokens},
                timeout=self.config.timeouts.request)
            ids += gen.output_ids
            logprobs += gen.logprobs
            texts.append(gen.text)
            prompt_tokens += gen.prompt_tokens or 0
            cached_tokens += gen.cached_tokens
            live.tokens += len(gen.output_ids)
            for run in gen.version_runs(version):
                add_tokens(runs, *run)
            finish = gen.finish_reason
            if not gen.aborted:
                break
            if len(ids) >= budget:  # aborted as its last token came: nothing to resume
                finish = {"type": "length", "length": budget}
                break
            if self._stopping(live):
                raise AttemptStopped
            # aborted by a pause in "abort" mode: resume after it under the new version
            log.info("attempt %s: aborted by a pause after %d tokens; resuming", live.aid, len(ids))
            self._wait_unpaused(live)
            request = request.resumed(
                gen.output_ids if isinstance(request.context, list) else gen.text,
                len(gen.output_ids))
        merged = Generation(rid=request.base, text="".join(texts), output_ids=ids,
                            logprobs=logprobs, finish_reason=finish, completion_tokens=len(ids),
                            prompt_tokens=prompt_tokens, weight_version=gen.weight_version,
                            meta_info=gen.meta_info, cached_tokens=cached_tokens)
        return merged, runs

    def _tool_wait(self, live: _Live, seconds: float) -> None:
        """A tool runs: the slot is held for *seconds*, nothing generates; the ledger
        says so (``status``: tool waits). A stop ends the wait."""
        live.tool = True
        self.lease.record(live)
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            if self._stopping(live):
                raise AttemptStopped
            self.sleep(min(left, 0.2))

    def _wait_unpaused(self, live: _Live) -> None:
        while self.ledger.paused():
            if self._stopping(live):
                raise AttemptStopped
            self.sleep(0.2)

    def _stopping(self, live: _Live) -> bool:
        if live.superseded.is_set():
            return True
        return self.stop_deadline is not None and time.monotonic() >= self.stop_deadline

    # -- reporting to the ledger ------------------------------------------------------

    def _until_answered(self, what: str, call: Callable[[], T]) -> T:
        """Call the ledger until it answers (I8): a result is kept while Redis is away."""
        delay = 0.5
        while True:
            try:
                return call()
            except RedisUnavailable as exc:
                log.warning("%s: Redis unavailable, retrying in %.1fs: %s", what, delay, exc)
                self.sleep(delay)
                delay = min(delay * 2, 10.0)

    def _report(self, live: _Live, ctx: EpisodeContext, reward: float | None, *,
                outcome: Literal["finished", "failed"], error: str = "") -> str:
        aid, member = live.aid, ctx.member
        self.lease.remove(live)  # no renewal after the result: it would find it ended
        result = EpisodeResult(
            member=member, output_ids=ctx.output_ids, logprobs=ctx.logprobs,
            version_runs=ctx.version_runs, finish_reason=ctx.finish_reason or outcome,
            reward=reward, text="".join(ctx.texts), turns=ctx.turns, error=error,
            prompt_tokens=ctx.prompt_tokens, cached_tokens=ctx.cached_tokens,
            turn_lengths=ctx.turn_lengths, tool_ids=ctx.tool_ids(),
            prompt_ids=sent if (sent := ctx.sent_prompt()) != ctx.prompt.get("input_ids")
            else None)
        blob = encode_result(result)
        cap = self.config.limits.max_result_bytes
        reason: Literal["workflow", "oversized"] = "workflow"
        if len(blob) > cap:
            reason = "oversized"
            error = f"result of {len(blob)} bytes exceeds limits.max_result_bytes = {cap}"
            outcome = "failed"
            blob = encode_result(EpisodeResult(member=member, output_ids=[], logprobs=[],
                                               version_runs=[], finish_reason="oversized",
                                               turns=ctx.turns, error=error))  # no lengths
        shape = (member_shape(ctx.call_contexts[0], ctx.turn_lengths, ctx.tool_after,
                              ctx.call_contexts)
                 if outcome == "finished" and ctx.call_contexts else "")
        answer: Answer = self._until_answered(
            f"finish {aid}", lambda: self.ledger.finish(
                aid, member, blob, output_tokens=len(ctx.output_ids), outcome=outcome,
                reason=reason, prefill_computed=ctx.prompt_tokens - ctx.cached_tokens,
                prefill_cached=ctx.cached_tokens, turns=ctx.turns,
                tool_seconds=ctx.tool_seconds, shape=shape))
        if answer.ignored:
            log.info("attempt %s: result ignored (%s)", aid, answer.reason)
            return "ignored"
        if outcome == "failed":
            log.warning("attempt %s: episode failed: %s", aid, error)
        return outcome

    def _doubt(self, live: _Live, cause: str, why: str) -> str:
        aid = live.aid
        log.warning("attempt %s: doubtful (%s): %s", aid, cause, why)
        # no renewal after this: one would tell the ledger the request still runs
        self.lease.remove(live)
        self._until_answered(f"doubt {aid}", lambda: self.ledger.mark_doubtful(aid, cause))
        try:
            stopped = self.client.confirm_stopped(live.rid, abort=live.aid)
        except EngineError as exc:
            log.warning("attempt %s: replica cannot confirm the stop now: %s", aid, exc)
            return "doubtful"
        if not stopped:
            log.warning("attempt %s: still in flight on the replica after abort", aid)
            return "doubtful"
        return self._retry(live, cause)

    def _hand_back(self, live: _Live, cause: str) -> str:
        try:
            stopped = self.client.confirm_stopped(live.rid, abort=live.aid)
        except EngineError as exc:
            log.warning("attempt %s: stop not confirmed: %s", live.aid, exc)
            stopped = False
        if not stopped:
            self.lease.remove(live)
            self._until_answered(f"doubt {live.aid}",
                                 lambda: self.ledger.mark_doubtful(live.aid, cause))
            return "doubtful"
        return self._retry(live, cause)

    def _retry(self, live: _Live, cause: str) -> str:
        aid = live.aid
        self.lease.remove(live)
        answer = self._until_answered(
            f"retry {aid}", lambda: self.ledger.retry(aid, cause=cause, resolution="stopped"))
        log.info("attempt %s: stopped (%s): %s %s", aid, cause, answer.status,
                 answer.attempt_id or answer.reason)
        return answer.status


def run_attempt(aid: str) -> str:
    """The RQ job: run attempt *aid* with the runner of the worker executing it."""
    return CURRENT_RUNNER.get().run(aid)
