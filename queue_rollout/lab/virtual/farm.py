"""A farm in virtual time: the real ledger decides, simulated replicas generate.

Every admission, start, finish, judgement and batch goes through the ledger's Lua
scripts on a real Redis, with the ledger's clock set to the simulation's virtual
time. Replicas are the simulated replica's own model
(:class:`~queue_rollout.lab.sim.model.SimModel`, the one ``queue-rollout
sim-engine`` serves in real time), advanced analytically from event to event, so a
128-slot farm of a thousand long episodes simulates in seconds (:class:`EngineModel`).
The trainer (:class:`TrainerSchedule`) takes each ready batch, pauses generation
(``pause_mode``, in place by default) for ``train_s`` (the fixed training interval),
raises the policy version, and resumes; after ``train_batches`` batches the rest is
drained (each batch acknowledged and the version raised, without a pause).

An episode is one request (``lengths``: its output tokens) or several turns
(``member_turns``), run as the steps the ``controlled_turns`` workflow runs on a worker
(:func:`queue_rollout.turns.steps`), each step an event here: each turn's request
carries the whole context so far; after a turn its tool's output joins the context and
the episode holds its worker's slot for the tool's time while nothing generates. A
replica's worker runs at most ``slots_per_replica`` episodes, generating or waiting on
a tool; a request sent to a paused replica waits there, as SGLang holds it. A request
a pause aborted goes on after the pause as the worker's does
(:meth:`queue_rollout.turns.Request.resumed`).

Placement follows the ledger: with ``rollout.placement = "any"`` each admitted attempt
goes to the least loaded replica with a free slot; with ``"group"`` the admission
names each attempt's replica (worker ``sim-<j>``) and the attempt waits for that
replica's worker, as a placed job waits on its replica's queue.

Adaptive concurrency (:class:`AdaptiveSlots`): every ``interval_s`` each replica's
worker looks at its replica as it would at ``/metrics`` (token usage, queued requests,
retractions) and sets its limit with the worker's own controller
(:class:`~queue_rollout.engines.concurrency.SlotLimit`); a worker starts an episode
only under its limit, and ``"auto"`` capacity (sample mode) is the sum of the limits.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from queue_rollout.config import PauseMode
from queue_rollout.engines.base import turn_rid
from queue_rollout.engines.concurrency import KvSignal, SlotLimit
from queue_rollout.engines.synthetic import stable_hash
from queue_rollout.lab.sim.model import (
    SimModel,
    SimRequest,
    recomputed_tokens,
)
from queue_rollout.lab.sim.tokens import Tokens
from queue_rollout.lab.virtual.clock import ManualClock
from queue_rollout.lab.virtual.figures import (
    mean_rollout_interval,
    median_batch_interval,
    rollout_intervals,
    steady_groups_per_hour,
)
from queue_rollout.ledger.core import Ledger
from queue_rollout.ledger.group_shapes import member_shape
from queue_rollout.transcript import Transcript
from queue_rollout.turns import ModelCall, Request, Step, Turn, steps

_EPS = 1e-9


@dataclass(frozen=True)
class EngineModel:
    """The simulated replicas: how many, and the engine model each one runs
    (:class:`~queue_rollout.lab.sim.model.SimModel`, settings as ``engine.*``)."""

    replicas: int
    #: running requests each replica takes, and episodes its worker runs at most
    #: (generating or waiting on a tool)
    slots_per_replica: int
    step_ms: float  # a decode step's base time
    step_ms_per_request: float  # added per running request
    step_us_per_context_token: float = 0.0  # added per token of the running requests' context
    prefill_tokens_per_s: float = 20_000.0
    chunked_prefill_size: int = 8192
    max_total_tokens: int = 220_000  # the KV pool

    @property
    def slots(self) -> int:
        return self.replicas * self.slots_per_replica

    def model(self, now: float) -> SimModel:
        """One replica's engine model, its clock at *now*."""
        return SimModel(slots=self.slots_per_replica, step_ms=self.step_ms,
                        step_ms_per_request=self.step_ms_per_request,
                        step_us_per_context_token=self.step_us_per_context_token, now=now,
                        prefill_tokens_per_s=self.prefill_tokens_per_s,
                        chunked_prefill_size=self.chunked_prefill_size,
                        max_total_tokens=self.max_total_tokens)


@dataclass(frozen=True)
class TrainerSchedule:
    """The trainer's schedule: which ready batches it trains on, for how long, and how
    its pauses stop generation."""

    train_s: float  # the fixed training pause after each of the first batches
    #: batches trained on, each with a pause; the rest are drained (each consumed at
    #: once, the version raised)
    train_batches: int
    #: end the run once this many batches are ready (rolling consumption with
    #: ``train_batches = 0``), instead of when every group is done
    stop_after: int | None = None
    #: how a pause stops generation (``engine.pause_mode``): with ``abort`` each aborted
    #: episode is sent again after the pause, prompt + output so far, as the worker does
    pause_mode: PauseMode = "in_place"


@dataclass(frozen=True)
class AdaptiveSlots:
    """Adaptive concurrency: each worker's limit follows its replica's KV room, between
    ``floor`` and the replica's slots; the limits' sum is the ledger's capacity."""

    floor: int  # the lowest limit a worker may set
    interval_s: float = 1.0  # how often each worker looks at its replica


@dataclass
class _Placed:
    group_id: str
    member: int
    turns: list[Turn]
    steps: Iterator[Step]  # the steps still to take
    replica: int = 0
    #: its context: ``context`` is what the next turn's request carries
    transcript: Transcript[Tokens] = field(default_factory=lambda: Transcript(Tokens()))
    call: ModelCall | None = None  # the turn in flight
    request: Request[Tokens] | None = None  # its request (a piece, after a pause-abort)


@dataclass
class SimReport:
    mode: str
    slots: int
    groups_accepted: int
    groups_rejected: int
    batches: int
    ready_times: list[float]
    pause_ends: list[float]
    all_work_s: float
    mean_active: float
    output_tokens: int
    retractions: int = 0  # requests the replicas retracted (KV memory ran out)
    prefill_tokens: int = 0  # context tokens the replicas computed (recomputation included)
    recomputed_tokens: int = 0  # of those, computed again (after a retraction)
    mean_in_flight: float = 0.0  # episodes holding a slot (tool waits too), time-averaged
    gpu_busy: float = 0.0  # share of replica time with a prefill or decode running
    cached_tokens: int = 0  # prompt tokens found in the replicas' prefix caches
    #: placement: groups admitted onto one replica, or split over several
    placements: dict[str, int] = field(default_factory=dict)
    #: adaptive concurrency: the workers' limits summed, time-averaged (else the slots)
    mean_slots_limit: float = 0.0
    limit_changes: int = 0  # times a worker's limit changed

    @property
    def rollout_intervals(self) -> list[float]:
        """Batch k (k = 2..): from the end of batch k-1's pause to batch k ready."""
        return rollout_intervals(self.ready_times, self.pause_ends)

    @property
    def mean_rollout_interval(self) -> float:
        return mean_rollout_interval(self.ready_times, self.pause_ends)

    @property
    def slot_occupancy(self) -> float:
        return self.mean_active / self.slots

    def steady_groups_per_hour(self, batch_size: int) -> float:
        return steady_groups_per_hour(self.ready_times, batch_size)

    @property
    def median_batch_interval(self) -> float:
        return median_batch_interval(self.ready_times)


class SimFarm:
    """Runs one admission mode over a prompt manifest to the end; see :meth:`run`."""

    def __init__(
        self, ledger: Ledger, clock: ManualClock, lengths: dict[str, list[int]] | None = None,
        *, member_turns: dict[str, list[list[Turn]]] | None = None,
        prompt_tokens: dict[str, int] | None = None,
        engine: EngineModel, trainer: TrainerSchedule,
        capacity_slots: int | None = None, adaptive: AdaptiveSlots | None = None,
        ignore_eos: bool = False,
        on_progress: Callable[[SimFarm], None] | None = None,
    ) -> None:
        """The episodes: *lengths* (each member one request of that many output tokens)
        or *member_turns* (each member's turns). *prompt_tokens*: each group's prompt
        length (default 1 token). *capacity_slots*: the live workers' slots the ledger
        is told at each admission (what ``"auto"`` capacity becomes); with *adaptive*
        concurrency (None: fixed slots) the workers' limits' sum instead. *ignore_eos*:
        the requests are sent with ``ignore_eos`` (as the ``controlled_length`` workflow
        sends them to a real replica), so each one's whole output is reserved when
        admitting others; else they are episodes that could end early (the engine's
        decaying estimate)."""
        self.engine, self.trainer, self.adaptive = engine, trainer, adaptive
        self.ignore_eos = ignore_eos
        self._aborted: list[tuple[str, SimRequest]] = []  # (attempt, request) to resume
        if (lengths is None) == (member_turns is None):
            raise ValueError("give exactly one of lengths and member_turns")
        self.turns: dict[str, list[list[Turn]]] = {  # (gen, tool_s, tool_tokens) tuples too
            gid: [[Turn(*t) for t in member] for member in members]
            for gid, members in member_turns.items()} if member_turns is not None else {
            gid: [[Turn(n)] for n in members] for gid, members in (lengths or {}).items()}
        self.ledger, self.clock = ledger, clock
        self.prompt_tokens = prompt_tokens or {}
        replicas, slots_per_replica = engine.replicas, engine.slots_per_replica
        self.replicas = [engine.model(clock.now) for _ in range(replicas)]
        self._placed: dict[str, _Placed] = {}  # attempt id -> its episode, on a replica
        self._completed: list[str] = []  # attempt ids whose turn's request completed
        self._tools: list[tuple[float, str]] = []  # (tool ends, attempt id), a heap
        self._episodes_on = [0] * replicas  # episodes each replica's worker holds
        # Only replicas with an event due are advanced (a thousand replicas each step
        # would cost more than the events): (when, replica) with the time each was
        # pushed for, stale entries skipped; the least loaded replica by
        # (episodes, requests, index), entries checked against the replica's now.
        self._due: list[tuple[float, int]] = []
        self._due_at = [math.inf] * replicas
        #: each worker's limit (adaptive concurrency; else its slots) and controller
        self.limits = [slots_per_replica] * replicas
        self._limit_sum = replicas * slots_per_replica
        self._controllers = ([SlotLimit(slots_per_replica, adaptive.floor)
                              for _ in range(replicas)] if adaptive is not None else [])
        self._next_look = math.inf
        self._limit_area = 0.0
        self.limit_changes = 0
        self._loads: list[tuple[int, int, int]] = [(-slots_per_replica, 0, j)
                                                   for j in range(replicas)]
        self._running = 0  # requests running on every replica
        self._busy = 0  # replicas with a prefill or decode running
        self.slots = engine.slots
        self.capacity_slots = capacity_slots
        self.on_progress = on_progress
        self.waiting: deque[str] = deque()  # admitted attempts not yet on a replica
        #: placement: attempts the ledger placed on replica j, waiting for its worker
        self.waiting_on: list[deque[str]] = [deque() for _ in range(replicas)]
        self.placing = ledger.rollout.placement == "group"
        self._waiting_replicas: set[int] = set()  # replicas with placed attempts waiting
        if self.placing:  # every replica's worker is live from the start
            ledger.set_replicas({_worker(j): slots_per_replica for j in range(replicas)})
        self.done_groups = 0
        self.accepted = self.rejected = 0
        self.ready_times: list[float] = []
        self.pause_ends: list[float] = []
        self.output_tokens = 0
        self._active_area = 0.0
        self._holding_area = 0.0
        self._busy_area = 0.0
        self._gen_time = 0.0
        self._training_until: float | None = None
        self._admissible = True  # something changed that may let the ledger admit
        self._deliverable = False  # a group was accepted since the last batch was asked
        self._held: str | None = None  # batch id being trained on

    @property
    def elapsed(self) -> float:
        return self.clock.now - self._t0

    def run(self) -> SimReport:
        ledger = self.ledger
        self._t0 = self.clock.now
        if self.adaptive is not None:
            self._next_look = self.clock.now + self.adaptive.interval_s
        ledger.submit((gid, b"{}") for gid in self.turns)
        last_complete = self.clock.now
        stop_after = self.trainer.stop_after
        while self.done_groups < len(self.turns) and (
                stop_after is None or len(self.ready_times) < stop_after):
            self._admit_and_place()
            tool = min(self._tools[0][0] if self._tools else math.inf, self._next_look)
            if self._training_until is not None:
                dt = min(self._training_until, tool) - self.clock.now
            else:
                dt = min(tool, self._next_due()) - self.clock.now
                if math.isinf(dt):
                    raise RuntimeError(f"simulation stalled at {self.elapsed:.1f}s: nothing "
                                       "runs, nothing admitted")
            finished = self._advance(dt)
            if self._training_until is not None and self.clock.now >= self._training_until - _EPS:
                self._end_training()
            while self._tools and self._tools[0][0] <= self.clock.now + _EPS:
                aid = heapq.heappop(self._tools)[1]  # its tool is done
                if self._step(aid) and self._finish(aid):
                    last_complete = self.clock.now
            if self.clock.now >= self._next_look - _EPS:
                self._look()
            for aid in finished:
                if self._turn_done(aid) and self._finish(aid):
                    last_complete = self.clock.now
            self._deliver()
            if self.on_progress:
                self.on_progress(self)
        return SimReport(
            mode=ledger.rollout.mode, slots=self.slots, groups_accepted=self.accepted,
            groups_rejected=self.rejected, batches=len(self.ready_times),
            ready_times=[t - self._t0 for t in self.ready_times],
            pause_ends=[t - self._t0 for t in self.pause_ends],
            all_work_s=last_complete - self._t0,
            mean_active=self._active_area / self._gen_time if self._gen_time else 0.0,
            mean_in_flight=self._holding_area / self._gen_time if self._gen_time else 0.0,
            gpu_busy=(self._busy_area / self._gen_time / len(self.replicas)
                      if self._gen_time else 0.0),
            output_tokens=self.output_tokens,
            retractions=sum(r.counters.retracted_requests for r in self.replicas),
            prefill_tokens=sum(r.counters.prefill_tokens for r in self.replicas),
            recomputed_tokens=sum(recomputed_tokens(r.log) for r in self.replicas),
            cached_tokens=sum(r.counters.cached_tokens for r in self.replicas),
            placements=self._placements(),
            mean_slots_limit=(self._limit_area / self._gen_time if self._gen_time
                              else float(self.slots)),
            limit_changes=self.limit_changes,
        )

    def _placements(self) -> dict[str, int]:
        """Groups the ledger placed on one replica, and split over several."""
        counters = self.ledger.counters()
        return {how: counters.get(f"placements:{how}", 0) for how in ("one_replica", "split")}

    def _admit_and_place(self) -> None:
        # the ledger admits again only after a finish, a judgement, a consumed batch or
        # a resume: asking in between would be refused the same way
        capacity = self._limit_sum if self._controllers else self.capacity_slots
        while self._admissible:
            admission = self.ledger.admit(capacity)
            if admission.status != "admitted":
                self._admissible = False
                break
            if self.placing:
                for aid, worker in zip(admission.attempt_ids, admission.replicas, strict=True):
                    j = int(worker.removeprefix("sim-"))
                    self.waiting_on[j].append(aid)
                    self._waiting_replicas.add(j)
            else:
                self.waiting.extend(admission.attempt_ids)
        if self._training_until is not None:
            return
        for j in sorted(self._waiting_replicas):  # placed attempts: on their replica
            queue = self.waiting_on[j]
            while queue and self._episodes_on[j] < self.limits[j]:
                self._start(queue.popleft(), j)
            if not queue:
                self._waiting_replicas.discard(j)
        while self.waiting:
            i = self._least_loaded()
            if self._episodes_on[i] >= self.limits[i]:
                break
            self._start(self.waiting.popleft(), i)

    def _start(self, aid: str, i: int) -> None:
        """Replica *i*'s worker starts the attempt and sends its first request."""
        start = self.ledger.start(aid, _worker(i), _worker(i), "sim-boot", 3600)
        if start.status != "started":
            raise RuntimeError(f"start {aid}: {start.reason}")
        turns = self.turns[start.group_id][start.member]
        self._placed[aid] = _Placed(start.group_id, start.member, turns, steps(turns),
                                    replica=i, transcript=Transcript(self._prompt(start.group_id)))
        self._episodes_on[i] += 1
        self._step(aid)

    def _step(self, aid: str) -> bool:
        """The episode's next step: its turn's request sent with the whole context; or
        its tool's output joins the context and the tool holds the slot (its end is an
        event); or none left: the episode ended (True)."""
        p = self._placed[aid]
        for step in p.steps:
            if isinstance(step, ModelCall):
                p.call = step
                p.request = Request(turn_rid(aid, step.turn), p.transcript.context, step.tokens)
                self._submit(p.replica, p.request, _tokens_of(p.request.base))
                return False
            p.transcript.tool(Tokens.of(_tokens_of(f"{aid}-tool{step.turn}")[:step.tokens]))
            if step.seconds > 0:
                heapq.heappush(self._tools, (self.clock.now + step.seconds, aid))
                return False
        return True

    def _submit(self, j: int, request: Request[Tokens], output_ids: Sequence[int]) -> None:
        self._touch(j, lambda replica: replica.submit(SimRequest(
            request.rid, seed=0, target=request.max_new_tokens, weight_version="",
            prompt=request.context, output_ids=output_ids, on_done=self._on_done,
            ignore_eos=self.ignore_eos)))

    def _turn_done(self, aid: str) -> bool:
        """A turn's request completed: its output joins the context (in place: the
        request that carried it has ended), and the episode takes its next step. Whether
        the episode ended."""
        p = self._placed[aid]
        assert p.call is not None
        p.transcript.output(Tokens.of(_tokens_of(turn_rid(aid, p.call.turn))[:p.call.tokens]))
        return self._step(aid)

    def _prompt(self, group_id: str) -> Tokens:
        """A group's prompt: token ids of its own (its members share them)."""
        return Tokens.of(_tokens_of(group_id)[:self.prompt_tokens.get(group_id, 1)])

    def _on_done(self, request: SimRequest, reason: dict[str, object]) -> None:
        if reason["type"] == "abort":  # by a pause in "abort" mode: resumed after it
            self._aborted.append((_attempt(request.rid), request))
            return
        self._completed.append(_attempt(request.rid))

    def _resume_aborted(self) -> None:
        """Each request a pause aborted goes on from its context + output so far, with
        the rest of its budget, as the worker's partial rollout does; that context is
        in the replica's cache."""
        aborted, self._aborted = self._aborted, []
        for aid, r in aborted:
            p = self._placed[aid]
            assert p.request is not None and r.output_ids is not None
            done = r.tokens
            p.request = p.request.resumed(Tokens.of(r.output(done)), done)
            self._submit(p.replica, p.request, r.output_ids[done:])

    def _advance(self, dt: float) -> list[str]:
        """Move every replica (and the clock) *dt* seconds on; the attempts that
        completed meanwhile, in order."""
        if self._training_until is None:
            self._active_area += self._running * dt
            self._holding_area += len(self._placed) * dt
            self._busy_area += self._busy * dt
            self._limit_area += self._limit_sum * dt
            self._gen_time += dt
        self.clock.now += dt
        due = set()
        while self._due and self._due[0][0] <= self.clock.now:
            when, j = heapq.heappop(self._due)
            if when == self._due_at[j]:
                due.add(j)
        for j in sorted(due):  # in replica order, as their completions are handled
            self._due_at[j] = math.inf
            self._touch(j, lambda replica: None)
        finished, self._completed = self._completed, []
        return finished

    # -- the replicas, advanced only when due or touched --------------------------------

    def _touch(self, j: int, act: Callable[[SimModel], object]) -> None:
        """Bring replica *j* to now, do *act* to it, and keep the farm's books on it:
        its running and busy counts, its next event, its load."""
        replica = self.replicas[j]
        self._running -= len(replica.running)
        self._busy -= replica.busy
        replica.advance(self.clock.now)
        act(replica)
        self._running += len(replica.running)
        self._busy += replica.busy
        when = replica.next_event()
        if when != self._due_at[j]:
            self._due_at[j] = when
            if when < math.inf:
                heapq.heappush(self._due, (when, j))
        self._loaded(j)

    def _next_due(self) -> float:
        while self._due and self._due[0][0] != self._due_at[self._due[0][1]]:
            heapq.heappop(self._due)  # stale: the replica was touched since
        return self._due[0][0] if self._due else math.inf

    def _load(self, j: int) -> tuple[int, int, int]:
        """Replica *j*'s place in the least-loaded order: its worker's free slots (most
        first), then its requests, then its index."""
        return self._episodes_on[j] - self.limits[j], self.replicas[j].in_flight, j

    def _loaded(self, j: int) -> None:
        """Replica *j*'s load changed: its entry in the least-loaded heap."""
        heapq.heappush(self._loads, self._load(j))
        if len(self._loads) > 8 * len(self.replicas) + 1024:  # drop stale entries
            self._loads = [self._load(k) for k in range(len(self.replicas))]
            heapq.heapify(self._loads)

    def _least_loaded(self) -> int:
        """The replica whose worker has the most free slots, then the fewest requests,
        then the lowest index."""
        while True:
            entry = self._loads[0]
            if entry == self._load(entry[2]):
                return entry[2]
            heapq.heappop(self._loads)

    def _look(self) -> None:
        """Adaptive concurrency: each worker looks at its replica and sets its limit;
        a changed limit may let the ledger admit (``"auto"`` capacity) or a worker
        start a waiting episode."""
        assert self.adaptive is not None
        self._next_look = self.clock.now + self.adaptive.interval_s
        changed: dict[str, int] = {}
        for j, replica in enumerate(self.replicas):
            self._touch(j, lambda replica: None)
            limit = self._controllers[j].observe(KvSignal(
                replica.token_usage(), len(replica.waiting),
                replica.counters.retracted_requests, len(replica.running)))
            if limit != self.limits[j]:
                self._limit_sum += limit - self.limits[j]
                self.limits[j] = limit
                changed[_worker(j)] = limit
                self._loaded(j)
        if not changed:
            return
        self.limit_changes += len(changed)
        self._admissible = True
        if self.placing:
            self.ledger.set_replicas(changed)
            self._waiting_replicas.update(int(w.removeprefix("sim-")) for w in changed)

    def _finish(self, aid: str) -> bool:
        r = self._placed.pop(aid)
        self._episodes_on[r.replica] -= 1
        self._loaded(r.replica)
        self._admissible = True
        tokens = sum(t.gen for t in r.turns)
        contexts = r.transcript.sent
        answer = self.ledger.finish(
            aid, r.member, b"{}", output_tokens=tokens, turns=len(r.turns),
            tool_seconds=[t.tool_s for t in r.turns if t.tool_s > 0],
            shape=member_shape(contexts[0], [t.gen for t in r.turns],
                               [t.tool_s for t in r.turns], contexts))
        if answer.status != "recorded":
            raise RuntimeError(f"finish {aid}: {answer.reason}")
        self.output_tokens += tokens
        if not answer.group_complete:
            return False
        verdict = self.ledger.judge(r.group_id, accept=True)
        self.accepted += verdict.status == "accepted"
        self._deliverable |= verdict.status == "accepted"
        self.done_groups += 1
        return True

    def _deliver(self) -> None:
        if self._training_until is not None or not self._deliverable:
            return
        self._deliverable = False
        while (delivery := self.ledger.pop_batch("trainer")) is not None:
            self.ready_times.append(self.clock.now)
            if len(self.ready_times) <= self.trainer.train_batches:
                self._held = delivery.batch.id
                self._training_until = self.clock.now + self.trainer.train_s
                self.ledger.set_paused(True)
                for j in range(len(self.replicas)):
                    self._touch(j, lambda replica: replica.pause(self.trainer.pause_mode))
                self._deliverable = True  # another batch may be ready after the pause
                return
            # the drain: consumed without a pause, the version still raised (the budget grows)
            self.ledger.ack("trainer", delivery.batch.id)
            self.ledger.set_version(self.ledger.version() + 1)
            self._admissible = True

    def _end_training(self) -> None:
        assert self._held is not None
        self.ledger.ack("trainer", self._held)
        self.ledger.set_version(self.ledger.version() + 1)
        self.ledger.set_paused(False)
        self._admissible = True
        for j in range(len(self.replicas)):
            self._touch(j, lambda replica: replica.resume())
        self._resume_aborted()
        self.pause_ends.append(self.clock.now)
        self._training_until = None
        self._held = None


def _worker(j: int) -> str:
    """The worker id of replica *j*'s worker."""
    return f"sim-{j}"


def _attempt(rid: str) -> str:
    """The attempt of a turn's rid or a resumed piece's (attempt ids hold no "-")."""
    return rid.split("-", 1)[0]


def _tokens_of(name: str) -> range:
    """Token ids of *name*'s own (a prompt's or an output's): a range far from every
    other name's, so contexts share a prefix only where they should."""
    start = (stable_hash("synthetic", name) % (1 << 40)) << 24
    return range(start, start + (1 << 24))
