"""The ledger: a typed wrapper over the Lua scripts, one method per operation.

The ledger is the truth about capacity: which groups are admitted, which attempt holds
which slot, what has been recorded. Every method is one atomic script call, keyed by
attempt id where a worker reports, with the clock passed in (``clock``), so tests and
simulations control time.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import redis

from queue_rollout.config import Config, HistoryConfig, RolloutConfig
from queue_rollout.ledger.connection import client_url, translate_errors
from queue_rollout.ledger.durable import SELF_RECEIPTED, UNWAITED, DurableCalls, WaitPolicy
from queue_rollout.ledger.group_shapes import SHAPES_KEPT
from queue_rollout.ledger.keys import EVENTS_GROUP, Keys, episode_field, rq_queue_key
from queue_rollout.ledger.records import (
    SUPERSEDED,
    AttemptRecord,
    BatchRecord,
    GroupRecord,
    decode_attempt,
    decode_batch,
    decode_group,
)
from queue_rollout.ledger.scripts import Scripts
from queue_rollout.ledger.shape import check_shape

Clock = Callable[[], float]


def new_attempt_id() -> str:
    """A fresh attempt id: 32 hex digits, valid as an RQ job id and an SGLang rid."""
    return uuid.uuid4().hex


def _s(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass(frozen=True, slots=True)
class Answer:
    """What a script answered: its status word, and the fields that operation fills."""

    status: str
    reason: str = ""  # why it was ignored; a rejected group's reason
    group_complete: bool = False  # finish, retry: this ended the group's last member
    attempt_id: str = ""  # retry: the new attempt of the member
    count: int = 0  # submit: prompts added; ack: groups consumed
    duplicates: tuple[str, ...] = ()  # submit: ids the farm knows already

    @property
    def ignored(self) -> bool:
        return self.status == "ignored"

    @property
    def refused(self) -> bool:
        """ack: the batch was released from this consumer (reason ``released``)."""
        return self.status == "refused"


@dataclass(frozen=True, slots=True)
class Renewal:
    """What a lease renewal reports for one attempt: its sequence number (growing),
    output tokens so far, the rid of its request in flight (its attempt id, or a later
    turn's or piece's), whether it waits on a tool, and whether any of these *changed*
    since its lease holder last reported it (an unchanged one leaves its record alone)."""

    aid: str
    seq: int
    tokens: int = 0
    rid: str = ""
    tool: bool = False
    changed: bool = True


#: Released batch ids the ledger remembers (a late ack of an older one is answered
#: ``ignored`` rather than ``refused``).
RELEASED_KEPT = 10_000


#: Why admission refuses a group now (``admit.lua``'s answers).
BLOCK_REASONS = ("capacity", "staleness", "paused", "placement")


@dataclass(frozen=True, slots=True)
class Reservation:
    """The control Redis's answer for a group to admit on a farm of several cells: its
    budget held (``reserved``, or ``already`` for a group reserved before, with that
    call's cell), or ``blocked`` (``paused``, ``staleness``)."""

    status: Literal["reserved", "already", "blocked"]
    reason: str = ""
    version: int = 0  # the policy version the group is admitted under
    cell: str = ""


@dataclass(frozen=True, slots=True)
class Admission:
    #: already: the reserved group this cell admitted before (its attempts, as then)
    status: Literal["admitted", "already", "blocked", "empty"]
    #: blocked: one of :data:`BLOCK_REASONS`
    reason: str = ""
    group_id: str = ""
    attempt_ids: tuple[str, ...] = ()
    #: placement: the worker each attempt is placed on (empty when any worker takes it)
    replicas: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Start:
    status: Literal["started", "ignored"]
    reason: str = ""
    group_id: str = ""
    member: int = -1
    attempt_number: int = 0
    prompt: bytes | None = None  # the group's prompt JSON, read in the same step
    version: int = 0  # the policy version when the attempt started


@dataclass(frozen=True, slots=True)
class Delivery:
    batch: BatchRecord
    redelivered: bool


class Ledger:
    """Atomic ledger operations for one farm."""

    def __init__(
        self, client: redis.Redis, farm: str, rollout: RolloutConfig,
        *, clock: Clock = time.time, wait: WaitPolicy | None = None,
        history: HistoryConfig | None = None,
    ) -> None:
        self.client = client
        self.keys = Keys(farm)
        self.rollout = rollout
        #: what the scripts keep of each group's story (``trace``)
        self.history = history if history is not None else HistoryConfig()
        self.clock = clock
        self._url = client_url(client)
        waits = wait if wait is not None and wait.replicas > 0 else None
        self._scripts = Scripts(client, receipts=waits is not None,
                                unwrapped=UNWAITED | SELF_RECEIPTED)
        #: With replicas to wait for: every change is sent through these.
        self.durable = (DurableCalls(client, self._scripts, self.keys, waits, self._url)
                        if waits is not None else None)

    @classmethod
    def from_config(cls, client: redis.Redis, config: Config, *,
                    clock: Clock = time.time) -> Ledger:
        """The farm's ledger; refuses (ConfigError) a *config* that disagrees with the
        farm's recorded shape (:mod:`queue_rollout.ledger.shape`), and records it if none is."""
        check_shape(client, config)
        return cls(client, config.farm.name, config.rollout, clock=clock,
                   wait=WaitPolicy(config.farm.redis_wait_replicas, config.timeouts.redis_wait),
                   history=config.history)

    def _call(self, name: str, keys: list[str], *args: object) -> list[Any]:
        full = [repr(self.clock()), *args]
        if self.durable is not None and name not in UNWAITED:
            return self.durable.call(name, keys, full)
        with translate_errors(self._url):
            return self._scripts.call(name, keys, full)

    def _call_id(self) -> str:
        """The id of a start or finish call: what a resend of it is known by. Only
        calls sent through :attr:`durable` are resent with the same arguments."""
        return uuid.uuid4().hex if self.durable is not None else ""

    def _answer(self, name: str, keys: list[str], *args: object) -> Answer:
        """A script's ``{status, detail}``, with the detail in its named field: a reason
        when ignored or rejected, else what *name* answers there."""
        reply = self._call(name, keys, *args)
        status, detail = _s(reply[0]), _s(reply[1]) if len(reply) > 1 else ""
        if status in ("ignored", "rejected", "refused"):
            return Answer(status, reason=detail)
        if status in ("recorded", "failed"):  # finish, retry
            return Answer(status, group_complete=detail == "group_complete")
        if status == "retried":
            return Answer(status, attempt_id=detail)
        if status in ("acked", "submitted", "consumed"):
            return Answer(status, count=int(detail))
        return Answer(status)

    # -- prompts and admission ---------------------------------------------------------

    def submit(self, prompts: Iterable[tuple[str, bytes]]) -> Answer:
        """Add prompts (id, prompt JSON) all or none: ``submitted`` with their ``count``,
        or ``duplicate`` with the ids the farm knows already."""
        k = self.keys
        args: list[object] = []
        for pid, payload in prompts:
            args += [pid, payload]
        reply = self._call("submit", [k.counters, k.prompts, k.groups, k.pending, k.wake], *args)
        if _s(reply[0]) == "duplicate":
            return Answer("duplicate", duplicates=tuple(_s(x) for x in reply[1:]))
        return Answer("submitted", count=int(reply[1]))

    def known(self, prompt_ids: list[str]) -> list[str]:
        """Of *prompt_ids*, those this ledger knows (pending, admitted or judged), as
        :meth:`submit` would refuse them; read only."""
        if not prompt_ids:
            return []
        with translate_errors(self._url):
            pipe = self.client.pipeline(transaction=False)
            pipe.hmget(self.keys.prompts, prompt_ids)
            pipe.hmget(self.keys.groups, prompt_ids)
            prompts, groups = pipe.execute()
        return [pid for pid, p, g in zip(prompt_ids, prompts, groups, strict=True)
                if p is not None or g is not None]

    def admit(self, live_worker_slots: int | None = None, *,
              reserved: tuple[str, int] | None = None) -> Admission:
        """Admit the next pending prompt as a group, if pause, staleness and slots allow.
        On a cell of a farm of several, *reserved* is the group (the next pending one)
        and version the control Redis reserved (:meth:`reserve`): pause and budget were
        decided there, slots are decided here."""
        r, k = self.rollout, self.keys
        aids = [new_attempt_id() for _ in range(r.group_size)]
        cell_args = [reserved[0], reserved[1]] if reserved is not None else []
        reply = self._call(
            "admit",
            [k.counters, k.state, k.pending, k.groups, k.attempts, k.outbox,
             k.replica_free, k.replica_load, k.placed, k.refusals, k.history, k.history_index],
            r.group_size, r.batch_size, r.capacity_slots(live_worker_slots),
            r.max_staleness, r.mode, r.placement, self.history.max_groups,
            self.history.ttl_s, *aids, *cell_args,
        )
        status = _s(reply[0])
        if status == "already":
            return Admission("already", "", _s(reply[1]), tuple(_s(a) for a in reply[2:]))
        if status == "admitted":
            g = r.group_size
            return Admission("admitted", "", _s(reply[1]), tuple(_s(a) for a in reply[2:2 + g]),
                             tuple(_s(w) for w in reply[2 + g:]))
        return Admission(status, _s(reply[1]))  # type: ignore[arg-type]

    def reserve(self, group_id: str, cell: str) -> Reservation:
        """On the control Redis of a farm of several cells: hold the farm-wide staleness
        budget for *group_id*, to be admitted by *cell* (:meth:`admit` there, with the
        answer's version), if the farm is not paused. Reserving it again answers the
        first reservation."""
        r, k = self.rollout, self.keys
        reply = self._call("reserve", [k.counters, k.state, k.groups, k.refusals],
                           group_id, cell, r.group_size, r.batch_size, r.max_staleness, r.mode)
        status = _s(reply[0])
        if status == "blocked":
            return Reservation("blocked", reason=_s(reply[1]))
        return Reservation(status, version=int(reply[1]), cell=_s(reply[2]))  # type: ignore[arg-type]

    def settle(self, group_id: str, *, accept: bool, reason: str = "") -> Answer:
        """On the control Redis of a farm of several cells: the verdict on a group its
        cell completed, before the cell's :meth:`judge`: ``accepted`` (onto the farm's
        ready list) or ``rejected`` (its budget given back). A group settled before
        answers its first verdict and nothing changes."""
        k = self.keys
        return self._answer("settle", [k.counters, k.groups, k.ready], group_id,
                            "accept" if accept else "reject", reason)

    def consume(self, batch_id: str, consumer: str, group_ids: Iterable[str]) -> Answer:
        """In a cell of a farm of several: the groups of a batch acknowledged on the
        control Redis (:meth:`ack` there) that this cell ran are consumed and their
        detail deleted; ``consumed`` with the ``count`` this call consumed (sent again,
        0)."""
        k = self.keys
        return self._answer("consume", [k.counters, k.groups, k.ready, k.prompts, k.attempts,
                                        k.results, k.history],
                            batch_id, consumer, *group_ids)

    # -- attempts ----------------------------------------------------------------------

    def start(self, aid: str, worker: str, replica: str, boot: str, lease_s: float,
              *, holder: str = "") -> Start:
        """Claim a queued attempt for *worker* before anything is sent to the replica.
        *holder*: the worker process that renews its lease (:meth:`renew`)."""
        k = self.keys
        reply = self._call(
            "start", [k.counters, k.attempts, k.leases, k.prompts, k.state,
                      k.replica_free, k.replica_load, k.placed],
            aid, worker, replica, boot, repr(float(lease_s)), self._call_id(), holder,
        )
        if _s(reply[0]) == "started":
            prompt = reply[4] if isinstance(reply[4], bytes) else str(reply[4]).encode()
            return Start("started", "", _s(reply[1]), int(reply[2]), int(reply[3]),
                         prompt or None, int(reply[5]))
        return Start("ignored", _s(reply[1]))

    def progress(self, aid: str, worker: str, seq: int, lease_s: float, tokens: int = 0,
                 *, rid: str = "", tool: bool = False) -> Answer:
        """Heartbeat: renew the lease; *seq* must grow per attempt."""
        return self.renew(worker, lease_s, [Renewal(aid, seq, tokens, rid, tool)])[0]

    def renew(self, worker: str, lease_s: float, attempts: list[Renewal], *,
              holder: str = "") -> list[Answer]:
        """Heartbeat of several attempts of *worker* in one call, with what each reports
        (:class:`Renewal`); one answer each. Each is renewed for *lease_s*; from a lease
        *holder* (the worker process that started them) the holder's own lease is
        renewed once, and an attempt that reports nothing new keeps its record, its
        lease renewed when under two thirds of one is left (should such renewals stop,
        it follows the holder's: :meth:`expire_leases`)."""
        k = self.keys
        args: list[object] = [worker, repr(float(lease_s)), holder]
        for r in attempts:
            args += [r.aid, r.seq, r.tokens, "" if r.rid == r.aid else r.rid,
                     "1" if r.tool else "0", "1" if r.changed else "0"]
        reply = self._call("progress", [k.counters, k.attempts, k.leases, k.doubt, k.history,
                                        k.holders], *args)
        return [Answer(_s(status), reason=_s(reason) if _s(status) == "ignored" else "")
                for status, reason in zip(reply[::2], reply[1::2], strict=True)]

    def finish(
        self, aid: str, member: int, result: bytes, *, output_tokens: int = 0,
        outcome: Literal["finished", "failed"] = "finished",
        reason: Literal["workflow", "oversized"] = "workflow",
        prefill_computed: int = 0, prefill_cached: int = 0, turns: int = 1,
        tool_seconds: Sequence[float] = (), shape: str = "",
    ) -> Answer:
        """Record an attempt's result; ``recorded`` (``group_complete`` when it ended the
        group's last member) or ``ignored`` with the reason. A failed episode is counted
        by *reason* (``failed:<reason>``); its context tokens the replica computed and
        found cached are added to ``prefill:computed`` and ``prefill:cached``, its
        *turns* (requests to the replica) to ``turns``; each of its *tool_seconds* is
        an observation of the tool-wait histogram. *shape*: the member's shape
        (:func:`~queue_rollout.ledger.group_shapes.member_shape`); a group whose members all
        left one joins the farm's shape history when it completes."""
        k = self.keys
        return self._answer(
            "finish",
            [k.counters, k.attempts, k.groups, k.results, k.leases, k.doubt, k.events,
             k.observations, k.shape_parts, k.shapes, k.replica_free, k.replica_load,
             k.history],
            aid, member, outcome, output_tokens, result, reason, max(0, prefill_computed),
            max(0, prefill_cached), self._call_id(), max(0, turns),
            ",".join(f"{max(0.0, s):.3f}" for s in tool_seconds), shape, SHAPES_KEPT,
        )

    def expire_leases(self, most: int = 1000) -> list[str]:
        """The running attempts whose lease ran out: each one whose lease holder is live
        follows the holder's lease, the others become doubtful (``lease_expired``);
        the doubted ones' ids. Each call takes what it looks at out of the expired ones,
        so it calls again while a call looked at *most*."""
        k = self.keys
        doubted: list[str] = []
        now = self.clock()
        with translate_errors(self._url):  # nothing due nor left (the usual case): no script
            pipe = self.client.pipeline(transaction=False)
            pipe.zrangebyscore(k.leases, "-inf", now, 0, 1)
            pipe.zrangebyscore(k.holders, "-inf", f"({now!r}", 0, 1)
            if not any(pipe.execute()):
                return doubted
        while True:
            reply = self._call("expire", [k.counters, k.attempts, k.leases, k.doubt,
                                          k.history, k.holders], most)
            doubted += [_s(aid) for aid in reply[2:]]
            if int(reply[0]) < most:
                return doubted

    def mark_doubtful(self, aid: str, cause: str) -> Answer:
        """A running attempt may or may not still run: it keeps its slot."""
        k = self.keys
        return self._answer(
            "doubt", [k.counters, k.attempts, k.leases, k.doubt, k.history], aid, cause,
        )

    def retry(
        self, aid: str, *, cause: str, resolution: Literal["stopped", "lost"] = "stopped",
        doubt_s: float = 0.0,
    ) -> Answer:
        """The attempt is confirmed stopped (or declared lost after *doubt_s* of doubt):
        ``retried`` with the new ``attempt_id``, or ``failed`` after max_attempts."""
        k = self.keys
        return self._answer(
            "retry",
            [k.counters, k.attempts, k.groups, k.outbox, k.leases, k.doubt, k.events,
             k.replica_free, k.replica_load, k.placed, k.history],
            aid, new_attempt_id(), resolution, cause, self.rollout.max_attempts,
            repr(float(doubt_s)),
        )

    # -- placement ---------------------------------------------------------------------

    def set_replicas(self, slots: dict[str, int]) -> None:
        """Set the workers admission may place groups on: worker id -> slots (0: the
        worker leaves; what waits on its queue is for :meth:`move`)."""
        k = self.keys
        args: list[object] = []
        for worker, n in slots.items():
            args += [worker, max(0, int(n))]
        if args:
            self._call("replicas", [k.replica_slots, k.replica_free, k.replica_load], *args)

    def move(self, worker: str, aids: Sequence[str]) -> int:
        """Queued attempts placed on *worker* go to the shared queue; returns how many
        moved (one started or moved meanwhile stays where it is)."""
        if not aids:
            return 0
        k = self.keys
        reply = self._call(
            "move",
            [k.counters, k.attempts, k.replica_free, k.replica_load, k.placed,
             rq_queue_key(k.rq_replica_queue(worker)), rq_queue_key(k.rq_queue)],
            worker, *aids,
        )
        return int(reply[1])

    def placed_before(self, when: float) -> list[str]:
        """Queued attempts placed on a replica's queue at or before *when*."""
        with translate_errors(self._url):
            return [_s(aid) for aid in self.client.zrangebyscore(self.keys.placed, "-inf", when)]

    def replica_slots(self) -> dict[str, int]:
        """The workers admission may place groups on, with their slots."""
        with translate_errors(self._url):
            raw = self.client.hgetall(self.keys.replica_slots)
        return {_s(w): int(n) for w, n in raw.items()}

    # -- groups and batches ------------------------------------------------------------

    def judge(self, group_id: str, *, accept: bool, reason: str = "", entry_id: str = "",
              detail: str = "") -> Answer:
        """Accept or reject a complete group; acknowledges the events entry *entry_id*.
        *detail*: why it was rejected, in words, for the group's story (``trace``)."""
        k = self.keys
        return self._answer(
            "judge",
            [k.counters, k.groups, k.ready, k.events, k.prompts, k.attempts, k.results,
             k.history],
            group_id, "accept" if accept else "reject", reason, EVENTS_GROUP, entry_id, detail,
        )

    def pop_batch(self, consumer: str) -> Delivery | None:
        """Exactly B ready groups, or the consumer's unacknowledged batch again. A batch
        of groups released from another consumer (:meth:`release`) is ``redelivered``
        too, under the version of their first delivery."""
        k = self.keys
        reply = self._call(
            "pop_batch",
            [k.counters, k.state, k.groups, k.ready, k.batches, k.observations, k.history],
            consumer, self.rollout.batch_size, uuid.uuid4().hex,
        )
        status = _s(reply[0])
        if status == "empty":
            return None
        batch = decode_batch(reply[1])
        return Delivery(batch, redelivered=status == "redelivered" or batch.redelivered)

    def ack(self, consumer: str, batch_id: str) -> Answer:
        """The consumer trained on its batch: ``acked`` with the groups consumed;
        ``ignored`` when it holds no such batch; ``refused`` (reason ``released``) when
        the batch was released from it (:meth:`release`) and goes to another consumer:
        counted in ``acks_refused``."""
        k = self.keys
        return self._answer(
            "ack",
            [k.counters, k.groups, k.batches, k.prompts, k.attempts, k.results, k.state,
             k.observations, k.released, k.history],
            consumer, batch_id,
        )

    def release(self, consumer: str, batch_id: str = "") -> BatchRecord | None:
        """*consumer*'s unacknowledged batch goes back whole to the head of the ready
        groups: the next :meth:`pop_batch` of any consumer delivers it again
        (``redelivered``, under the version of its first delivery), and a late
        :meth:`ack` of it from *consumer* is ``refused``. *batch_id*: release only
        that batch (a consumer that acknowledged it meanwhile keeps its next one).
        Returns the batch released, or None when *consumer* held none (or another)."""
        k = self.keys
        reply = self._call(
            "release", [k.counters, k.groups, k.ready, k.batches, k.released],
            consumer, batch_id, RELEASED_KEPT,
        )
        return decode_batch(reply[1]) if _s(reply[0]) == "released" else None

    def held(self) -> list[BatchRecord]:
        """Every batch delivered and not yet acknowledged, oldest first."""
        with translate_errors(self._url):
            raw = self.client.hvals(self.keys.batches)
        return sorted((decode_batch(b) for b in raw), key=lambda b: b.delivered_at)

    # -- trainer controls --------------------------------------------------------------

    def set_version(self, version: int) -> int:
        """Set the policy version and move the staleness budget's baseline so that the
        groups consumed so far count as ``version * B``; returns the previous version."""
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise ValueError(f"version must be an int >= 0, got {version!r}")
        k = self.keys
        reply = self._call("set_version", [k.state, k.counters, k.wake], version,
                           self.rollout.batch_size)
        return int(reply[1])

    def set_paused(self, paused: bool, mode: str = "in_place") -> bool:
        """Raise or clear the pause flag; returns the previous flag. The workers hear
        of it at once (:meth:`announce_controls`)."""
        reply = self._call("set_paused", [self.keys.state, self.keys.wake], "1" if paused else "0",
                           mode)
        self.announce_controls("pause" if paused else "resume")
        return _s(reply[1]) == "1"

    def pause(self, mode: str) -> int:
        """Raise the pause flag; returns the new pause epoch workers acknowledge."""
        epoch = int(self._call("set_paused", [self.keys.state, self.keys.wake], "1", mode)[2])
        self.announce_controls("pause")
        return epoch

    def announce_controls(self, what: str) -> None:
        """Tell every listening worker that the controls changed (a hint: a lost
        message only delays a worker until its periodic re-read)."""
        with translate_errors(self._url):
            self.client.publish(self.keys.controls_channel, what)

    def lead(self, candidate: str, lease_s: float) -> tuple[bool, str]:
        """Take or renew collector leadership; returns (leading?, current holder)."""
        reply = self._call("lead", [self.keys.leader], candidate, repr(float(lease_s)))
        return _s(reply[0]) == "leader", _s(reply[1])

    # -- reading -----------------------------------------------------------------------

    def leases_held(self) -> int:
        """Attempts holding a lease: running, tool waits included (one ZCARD)."""
        with translate_errors(self._url):
            return int(self.client.zcard(self.keys.leases))

    def doubtful(self) -> list[tuple[str, float]]:
        """Every doubtful attempt id and since when, oldest first."""
        with translate_errors(self._url):
            raw = self.client.zrange(self.keys.doubt, 0, -1, withscores=True)
        return [(_s(aid), float(since)) for aid, since in raw]

    def counters(self) -> dict[str, int]:
        with translate_errors(self._url):
            raw = self.client.hgetall(self.keys.counters)
        return {_s(f): int(v) for f, v in raw.items()}

    def version(self) -> int:
        return int(self._hget(self.keys.state, "version") or 0)

    def budget_baseline(self) -> int:
        """Groups the staleness budget does not count of ``accepted`` (negative after a
        trainer resumed at a version ahead of what it consumed here)."""
        return int(self._hget(self.keys.state, "budget_baseline") or 0)

    def paused(self) -> bool:
        return self._hget(self.keys.state, "paused") == b"1"

    def _hget(self, key: str, field: str) -> bytes | None:
        with translate_errors(self._url):
            raw: bytes | None = self.client.hget(key, field)
        return raw

    def group(self, group_id: str) -> GroupRecord | None:
        raw = self._hget(self.keys.groups, group_id)
        return decode_group(raw) if raw else None

    def groups(self, group_ids: list[str]) -> list[GroupRecord | None]:
        """The records of *group_ids*, in one round trip (None for one not on record)."""
        if not group_ids:
            return []
        with translate_errors(self._url):
            raws = self.client.hmget(self.keys.groups, group_ids)
        return [decode_group(raw) if raw else None for raw in raws]

    def next_pending(self) -> str | None:
        """The submitted group admission takes next, if any."""
        with translate_errors(self._url):
            raw = self.client.lindex(self.keys.pending, 0)
        return _s(raw) if raw is not None else None

    def ready_groups(self) -> list[str]:
        """The accepted groups waiting for a batch, in their order."""
        with translate_errors(self._url):
            return [_s(g) for g in self.client.lrange(self.keys.ready, 0, -1)]

    def member_attempts(self, group_id: str, member: int) -> list[tuple[str, AttemptRecord]]:
        """Every attempt of one member still on record, oldest first."""
        group = self.group(group_id)
        if group is None:
            return []
        ids = group.attempt_ids
        with translate_errors(self._url):
            raws = self.client.hmget(self.keys.attempts, ids)
        found = [(aid, decode_attempt(raw)) for aid, raw in zip(ids, raws, strict=True) if raw]
        return [(aid, a) for aid, a in found if a.member == member]

    def current_attempt(self, group_id: str, member: int) -> tuple[str, AttemptRecord] | None:
        """The member's attempt that has not been superseded (stopped or lost)."""
        current = [(aid, a) for aid, a in self.member_attempts(group_id, member)
                   if a.state not in SUPERSEDED]
        return current[-1] if current else None

    def attempt(self, aid: str) -> AttemptRecord | None:
        raw = self._hget(self.keys.attempts, aid)
        return decode_attempt(raw) if raw else None

    def group_with_results(self, group_id: str
                           ) -> tuple[GroupRecord | None, bytes | None, list[bytes | None]]:
        """The group's record, prompt and members' results in one round trip."""
        k, g = self.keys, self.rollout.group_size
        pipe = self.client.pipeline(transaction=True)
        pipe.hget(k.groups, group_id)
        pipe.hget(k.prompts, group_id)
        pipe.hmget(k.results, [episode_field(group_id, m) for m in range(g)])
        with translate_errors(self._url):
            raw, prompt, results = pipe.execute()
        record = decode_group(raw) if raw is not None else None
        if record is not None and g != record.G:  # recorded under another group size
            with translate_errors(self._url):
                results = self.client.hmget(
                    k.results, [episode_field(group_id, m) for m in range(record.G)])
        return record, prompt, results

    def result(self, group_id: str, member: int) -> bytes | None:
        return self._hget(self.keys.results, episode_field(group_id, member))

    def prompt(self, group_id: str) -> bytes | None:
        return self._hget(self.keys.prompts, group_id)
