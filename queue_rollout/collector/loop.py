"""The collector: admission, the outbox, group judgement and the reconciler, under a
leader lease so that a standby collector takes over when the leader dies.

Each :meth:`Collector.step` (every ``collector.step_ms``, 200 ms by default) does, as
leader:

1. admit pending prompts while pause, staleness budget and capacity allow (each
   refusal is counted by reason in the ledger);
2. hand the new attempts to RQ (the outbox);
3. judge complete groups from the events stream, through the consumer group
   ``collector``: first every entry read but not acknowledged (by this collector before
   a restart, or by one that lost the lead), then new ones; judging acknowledges the
   entry in the same script, so nothing is judged twice;
4. tick the reconciler;
5. with ``timeouts.batch_ack`` set, release every batch unacknowledged for longer (its
   groups go to the next consumer that takes a batch), at most once a second.

In a cell of a farm of several, the leader lease, the staleness budget, the verdicts
and the batches are the control Redis's: admission and judgement take their
farm-wide half there first (:mod:`queue_rollout.ledger.cells`), and every
``SCAN_JOBS_EVERY`` steps the groups consumed on the control Redis but still
accepted in the cell (an acknowledgement cut short) are consumed here.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import redis

from queue_rollout.collector.acceptance import GroupView, load_plugin, verdict
from queue_rollout.collector.reconciler import Reconciler
from queue_rollout.config import Config
from queue_rollout.errors import BadInput, ClockSkewed, QueueRolloutError
from queue_rollout.ledger import cells
from queue_rollout.ledger.clock import check_clock
from queue_rollout.ledger.connection import client_url, translate_errors
from queue_rollout.ledger.core import Ledger
from queue_rollout.ledger.jobs import flush_outbox
from queue_rollout.ledger.keys import EVENTS_GROUP
from queue_rollout.ledger.registry import Registry
from queue_rollout.results import EpisodeResult, decode_result

log = logging.getLogger(__name__)
MAX_ADMIT_PER_STEP = 1000
IDLE_WAIT_S = 1.0  # an idle collector's longest wait between steps (the reconciler's pace)
BACKOFF_STEPS = 5  # while waiting for slots, steps slow down to this many apart (<= 1 s)
SCAN_JOBS_EVERY = 50  # steps between the reconciler's full scans for lost RQ jobs
#: Placement: seconds between the reconciler's placement work (the live workers read,
#: placeable workers updated, late attempts moved); a worker is live for three leases
#: and an attempt may wait placement_wait_s, so once a second is soon enough.
PLACE_EVERY_S = 1.0
#: Seconds (of the ledger's clock) between looks for batches past timeouts.batch_ack.
RELEASE_EVERY_S = 1.0


@dataclass
class StepReport:
    leader: bool
    admitted: int = 0
    blocked: str = ""
    judged: dict[str, str] = field(default_factory=dict)  # group id -> "" or reason
    handed_over: int = 0  # attempts handed to RQ
    reconciled: int = 0  # attempts the reconciler doubted, re-queued or declared lost

    @property
    def quiet(self) -> bool:
        """Nothing done, and nothing to do until something wakes the collector: a
        submission, a resume, a new version (the wake stream) or a completed group
        (the events stream). Waiting for slots (``capacity``, ``placement``) is not
        quiet: a slot frees without either."""
        return (self.leader and not self.admitted and not self.judged
                and not self.handed_over and not self.reconciled
                and self.blocked not in ("capacity", "placement"))


class Collector:
    """The collector of a farm's ledger; in a cell of a farm of several, of the cell
    *cell*, whose farm-wide half is the *control* ledger's."""

    def __init__(self, ledger: Ledger, config: Config, *, name: str | None = None,
                 control: Ledger | None = None, cell: str = "") -> None:
        self.ledger = ledger
        self.control = control
        self.cell = cell
        #: where the leader lease and the batches are
        self.farm = control if control is not None else ledger
        self.config = config
        self.keys = ledger.keys
        self.name = name or f"{socket.gethostname()}-{os.getpid()}"
        self.plugin = load_plugin(config.acceptance.plugin)
        self.reconciler = Reconciler(ledger, config)
        self.registry = Registry(ledger.client, ledger.keys, config.timeouts.lease,
                                 clock=ledger.clock)
        self._steps = 0
        self._place_at = 0.0  # placement: when the reconciler's placement work is due
        self._release_at = 0.0  # timeouts.batch_ack: when the next look is due (ledger clock)
        self._ensure_group()

    def _ensure_group(self) -> None:
        try:
            self.ledger.client.xgroup_create(self.keys.events, EVENTS_GROUP, id="0",
                                             mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    # -- one step --------------------------------------------------------------------

    def step(self) -> StepReport:
        """One round as leader (or a standby's look at the lease). Redis errors leave
        as :class:`~queue_rollout.errors.RedisUnavailable` / ``LedgerError``."""
        with translate_errors(client_url(self.ledger.client)):
            return self._step()

    def _step(self) -> StepReport:
        leading, _holder = self.farm.lead(self.name, self.config.timeouts.leader_lease)
        if not leading:
            return StepReport(leader=False)
        report = StepReport(leader=True)
        placing = (self.config.rollout.placement == "group"
                   and time.monotonic() >= self._place_at)
        if placing:
            self._place_at = time.monotonic() + PLACE_EVERY_S
        live = self._live_workers(placing)
        self._admit(report, None if live is None else self.registry.slots(live))
        report.handed_over = flush_outbox(self.ledger.client, self.keys)
        self._judge_events(report)
        self._steps += 1
        tick = self.reconciler.tick(scan_jobs=self._steps % SCAN_JOBS_EVERY == 1,
                                    live_workers=live if placing else None)
        report.reconciled = len(tick.doubted) + len(tick.requeued) + len(tick.lost) + tick.moved
        if self.control is not None and self._steps % SCAN_JOBS_EVERY == 1:
            report.reconciled += cells.sweep_consumed(self.control, {self.cell: self.ledger})
        if tick.requeued or tick.lost:  # their new attempts wait in the outbox
            report.handed_over += flush_outbox(self.ledger.client, self.keys)
        report.reconciled += len(self.release_overdue())
        return report

    def check_clock(self) -> None:
        """ClockSkewed (naming both clocks) when the ledger's clock is further from
        Redis's than ``timeouts.clock_skew``."""
        check_clock(self.ledger.client, self.ledger.clock, self.config.timeouts.skew_tolerance,
                    f"collector {self.name}")

    def release_overdue(self) -> list[str]:
        """With ``timeouts.batch_ack``: release each batch delivered longer ago than
        that and still unacknowledged; returns their ids. At most once a second."""
        limit = self.config.timeouts.batch_ack
        now = self.farm.clock()
        if limit <= 0 or now < self._release_at:
            return []
        self._release_at = now + RELEASE_EVERY_S
        released = []
        for batch in self.farm.held():
            if now - batch.delivered_at <= limit:
                break  # oldest first: the rest are younger
            if self.farm.release(batch.consumer, batch.id) is not None:
                log.warning("batch %s of consumer %s unacknowledged for %.0f s "
                            "(timeouts.batch_ack = %d): released to the next consumer",
                            batch.id, batch.consumer, now - batch.delivered_at, limit)
                released.append(batch.id)
        return released

    def _live_workers(self, placing: bool) -> dict[str, dict[str, Any]] | None:
        """The registry's live workers, when capacity (``"auto"``) or this step's
        placement work needs them; None otherwise."""
        if self.config.rollout.max_concurrent_samples != "auto" and not placing:
            return None
        return self.registry.live()

    def _admit(self, report: StepReport, live_slots: int | None) -> None:
        capacity = live_slots if self.config.rollout.max_concurrent_samples == "auto" else None
        while report.admitted < MAX_ADMIT_PER_STEP:
            admission = (self.ledger.admit(capacity) if self.control is None else
                         cells.admit_next(self.control, self.ledger, self.cell, capacity))
            if admission.status not in ("admitted", "already"):
                report.blocked = admission.reason
                return
            report.admitted += 1

    def _judge_events(self, report: StepReport) -> None:
        """Entries read but not acknowledged (by this collector before a restart, or by
        a collector that lost the lead) first, then new ones. Only the leader judges,
        so every pending entry is taken over at once; judging twice is harmless (the
        second answer is `ignored` and only acknowledges)."""
        client, events = self.ledger.client, self.keys.events
        cursor = "0-0"
        while True:
            cursor, entries, *_ = client.xautoclaim(events, EVENTS_GROUP, self.name, 0, cursor,
                                                    count=500)
            self._judge_entries(entries, report)
            if cursor in (b"0-0", "0-0"):
                break
        for _, entries in client.xreadgroup(EVENTS_GROUP, self.name, {events: ">"},
                                            count=500) or []:
            self._judge_entries(entries, report)

    def _judge_entries(self, entries: list[tuple[bytes, dict[bytes, bytes]]],
                       report: StepReport) -> None:
        for entry_id, fields in entries:
            if fields:  # an entry trimmed from the stream meanwhile has none
                self._judge(fields[b"group"].decode(), entry_id.decode(), report)

    def _judge(self, group_id: str, entry_id: str, report: StepReport) -> None:
        group, raw_prompt, raws = self.ledger.group_with_results(group_id)
        if group is None or group.state != "complete":  # judged already: just acknowledge
            self.ledger.judge(group_id, accept=True, entry_id=entry_id)
            return
        results = [self._result(group_id, m, raw) for m, raw in enumerate(raws)]
        unreadable = sum(1 for raw, res in zip(raws, results, strict=True)
                         if raw is not None and res is None)
        view = GroupView(group_id, json.loads(raw_prompt) if raw_prompt else {},
                         group.failed + unreadable, results)
        reason, detail = verdict(view, self.config.acceptance, self.plugin)
        if self.control is None:
            answer = self.ledger.judge(group_id, accept=not reason, reason=reason,
                                       entry_id=entry_id, detail=detail)
        else:
            answer = cells.judge(self.control, self.ledger, group_id, accept=not reason,
                                 reason=reason, entry_id=entry_id, detail=detail)
        if not answer.ignored:  # the verdict taken: in a cell, the one settled first
            report.judged[group_id] = answer.reason
            if answer.reason:
                log.info("group %s rejected: %s (%s)", group_id, answer.reason,
                         detail if answer.reason == reason else "settled so before")

    def _result(self, group_id: str, member: int, raw: bytes | None) -> EpisodeResult | None:
        """A member's result; one that cannot be decoded counts as a failed member
        (rather than blocking the collector on every step)."""
        if raw is None:
            return None
        try:
            return decode_result(raw, self.config.limits.max_result_bytes)
        except BadInput as exc:
            log.warning("group %s member %d: unreadable result: %s", group_id, member, exc)
            return None

    # -- the loop --------------------------------------------------------------------

    def start(self, stop: threading.Event) -> threading.Thread:
        """:meth:`run` in a daemon thread (named ``collector``) until *stop* is set."""
        thread = threading.Thread(target=self.run, args=(stop,), daemon=True,
                                  name="collector")
        thread.start()
        return thread

    def run(self, stop: threading.Event) -> None:
        """A step every ``collector.step_ms`` until *stop* is set. While a step finds
        nothing to do (:attr:`StepReport.quiet`), the next one waits, up to
        ``IDLE_WAIT_S``, for a new entry on the wake or events stream instead; while
        steps only wait for slots, they slow down to ``BACKOFF_STEPS`` steps apart."""
        step = self.config.collector.step_ms / 1000.0
        interval, slowest = step, min(IDLE_WAIT_S, BACKOFF_STEPS * step)
        was_leader = None
        self.check_clock()  # a skewed clock refuses to start (ClockSkewed, exit 2)
        check_at = time.monotonic() + self.config.timeouts.lease / 3
        while not stop.is_set():
            try:
                if time.monotonic() >= check_at:  # and stops at the next heartbeat
                    self.check_clock()
                    check_at = time.monotonic() + self.config.timeouts.lease / 3
                report = self.step()
            except ClockSkewed:
                raise
            except QueueRolloutError as exc:  # Redis away: say so, try again
                log.warning("collector %s: step failed: %s", self.name, exc)
                stop.wait(1.0)
                continue
            except Exception:
                log.exception("collector step failed")
                stop.wait(1.0)
                continue
            if report.leader != was_leader:
                log.info("collector %s: %s", self.name, "leader" if report.leader else "standby")
                was_leader = report.leader
            if report.quiet:
                self._wait_for_work(min(IDLE_WAIT_S, self.config.timeouts.leader_lease / 3))
            elif not report.leader:  # a standby: a look at the lease each second will do
                stop.wait(max(step, min(IDLE_WAIT_S, self.config.timeouts.leader_lease / 3)))
            else:
                # waiting for slots with nothing done: the steps slow down (up to
                # BACKOFF_STEPS steps apart); any work done brings them back
                productive = report.admitted or report.judged or report.handed_over
                interval = step if productive else min(slowest, interval * 2)
                if interval > step:  # a completed group (events) ends the wait early
                    self._wait_for_work(interval)
                else:
                    stop.wait(step)

    def _wait_for_work(self, timeout: float) -> None:
        """Block until the wake or the events stream gets an entry, or *timeout*."""
        try:
            with translate_errors(client_url(self.ledger.client)):
                self.ledger.client.xread({self.keys.wake: "$", self.keys.events: "$"},
                                         count=1, block=max(1, int(timeout * 1000)))
        except QueueRolloutError as exc:
            log.warning("collector %s: waiting for work: %s", self.name, exc)


def run_collector(config: Config) -> int:
    """``queue-rollout collector``: until SIGTERM or Ctrl-C."""
    import signal

    from queue_rollout.collector.metrics import FarmMetrics

    ledger, cell_ledgers = cells.connect_farm(config)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    metrics = FarmMetrics(ledger, config, cell_ledgers)
    port = metrics.serve()
    try:
        if not config.cells:
            collector = Collector(ledger, config)
            print(f"collector {collector.name} for farm {config.farm.name}; metrics on "
                  f"http://{config.metrics.host}:{port}/metrics", flush=True)
            collector.run(stop)
            return 0
        # a farm of cells: a collector of each cell, one leader (this process's name)
        # on the control Redis
        collectors = [Collector(cell, config.for_cell(name), control=ledger, cell=name)
                      for name, cell in cell_ledgers.items()]
        print(f"collector {collectors[0].name} for farm {config.farm.name}, cells "
              f"{', '.join(c.cell for c in collectors)}; metrics on "
              f"http://{config.metrics.host}:{port}/metrics", flush=True)
        threads = [c.start(stop) for c in collectors]
        while not stop.wait(1.0):
            if not all(t.is_alive() for t in threads):  # a cell's loop ended: stop all
                stop.set()
                return 1
        for t in threads:
            t.join()
        return 0
    finally:
        metrics.close()
