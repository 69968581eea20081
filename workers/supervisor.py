"""``queue-rollout worker --gpu N --engine-url URL``: one GPU's episode processes.

The supervisor checks its replica, registers the worker in the farm (its slots count
toward ``max_concurrent_samples = "auto"``), keeps ``engine.slots_per_replica``
episode slots running in processes of ``engine.episode_threads``
(:class:`~.rq_worker.EpisodeProcess`; a dead process is restarted with backoff),
settles its replica's doubtful attempts at start and periodically, and on SIGTERM
passes the signal on, waits for the episodes' grace period, and deregisters. A SIGTERM
that comes after its launcher died (the kernel sends it: :mod:`queue_rollout.procs`)
stops the episode processes at once instead: what they ran is redone, as after a crash.
It compares its clock with Redis's ``TIME`` before it registers and at every heartbeat
(:mod:`queue_rollout.ledger.clock`): beyond ``timeouts.clock_skew`` it refuses work
(ClockSkewed, exit 2), naming both clocks.

It follows the trainer's controls (pause, resume, weight updates) as they are
announced on the farm's controls channel, re-reading them at least every
``CONTROLS_REREAD_S``, and reports itself alive every lease / 3: an idle supervisor
makes well under one Redis call a second.

It watches its replica every ``health_s`` through ``/model_info``, which answers
without a generation (SGLang's ``/health`` generates a token and takes about a second).
A failure is logged once and recorded (``replica_up`` in the worker's record); a replica
that reports its boot id (the simulated one does, and vLLM its instance id; SGLang does
not, and ``queue-rollout node`` restarts the worker with every replica start instead)
and comes back under a new one gets new episode processes bound to the new boot, and its
old attempts are settled at once (``replica_restart``) instead of at the next periodic
round. The id a replica reports is the worker's boot id, whatever ``--boot-id`` gave.

With ``engine.adaptive_slots`` it reads the replica's ``/metrics`` every
``engine.adaptive_interval_s`` and sets how many of its episode slots take new jobs
(:mod:`.limits`); the registered ``slots`` follow that limit, written only when it
changes, so ``"auto"`` capacity and placement follow the farm's KV room.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from redis import Redis

from queue_rollout.config import Config, PauseMode
from queue_rollout.engines.base import BadEngineURL, EngineError
from queue_rollout.engines.client import engine_client
from queue_rollout.engines.sglang import PAUSE_MODES
from queue_rollout.errors import BadInput, BarrierTimeout, ClockSkewed, QueueRolloutError
from queue_rollout.ledger.clock import check_clock, wall_clock
from queue_rollout.ledger.connection import connect_config
from queue_rollout.ledger.core import Ledger
from queue_rollout.ledger.keys import Keys
from queue_rollout.ledger.registry import Ack, ControlListener, Registry
from queue_rollout.procs import Supervised, orphaned, stop_all
from queue_rollout.workers.limits import AdaptiveLimit, LimitFile
from queue_rollout.workers.resolver import resolve_doubt
from queue_rollout.workers.rq_worker import WorkerSpec, spec_env

log = logging.getLogger(__name__)
#: The controls are re-read at least this often, whatever the channel says (a lost
#: message delays a pause by at most this much; it never loses it).
CONTROLS_REREAD_S = 10.0
#: How long a worker waits for its replica's /health before it gives up (exit 3), and
#: how often it says what it waits for meanwhile.
REPLICA_WAIT_S = 120.0
REPLICA_SAY_S = 5.0


def pause_mode(recorded: str) -> PauseMode:
    """The pause mode the trainer recorded; a value this release does not know pauses in
    place (keeps the requests) rather than not at all."""
    for mode in PAUSE_MODES:
        if mode == recorded:
            return mode
    log.warning("unknown pause mode %r recorded; pausing in place", recorded)
    return "in_place"


@dataclass
class Supervisor:
    config: Config
    gpu: int
    engine_url: str
    boot_id: str = ""
    health_s: float = 1.0  # the replica's /health (and boot id) are checked this often
    children: list[Supervised] = field(default_factory=list)
    clock: Callable[[], float] = time.monotonic  # the wait for the replica's clock
    sleep: Callable[[float], None] = time.sleep
    #: seconds its wall clock (and its episode processes') is off (0 but in tests)
    clock_offset: float = 0.0

    def __post_init__(self) -> None:
        self.keys = Keys(self.config.farm.name)
        try:
            self.client = engine_client(self.config.engine.kind, self.engine_url,
                                        timeout=10)
        except BadEngineURL as exc:
            raise BadInput(f"--engine-url: {exc}") from None
        self.worker_id = f"{socket.gethostname()}-gpu{self.gpu}"
        self._stop = False
        self._now = threading.Event()  # a second signal: stop the episode processes now
        self.waiting_for = ""  # while the replica is awaited: its URL and the last answer
        self._paused_epoch: int | None = None  # the pause epoch our replica is paused for
        self._weights_epoch = 0  # the last weight update applied (0: none yet)
        self._last_warning, self._last_warning_at = "", 0.0
        self._replica_up = True
        self._reports_boot = False  # the replica reports a boot id (sim, vLLM); SGLang not
        e = self.config.engine
        #: adaptive concurrency: the controller and the file the episode processes read
        self.adaptive = (AdaptiveLimit(e, self.client, self.worker_id)
                         if e.adaptive_slots else None)
        self.limit_file: LimitFile | None = None
        self._started_at = time.time()  # the record keeps it through re-registrations
        self._parent = os.getppid()  # who started it: a signal after it died stops now
        self.wall = wall_clock(self.clock_offset)  # what its ledger calls are stamped with

    # -- start -----------------------------------------------------------------------

    def wait_for_replica(self, timeout: float = REPLICA_WAIT_S, say_every: float = REPLICA_SAY_S,
                         poll_s: float = 1.0) -> bool:
        """Until the replica answers ``/health``, saying every *say_every* seconds what it
        waits for (the URL, the last answer); BarrierTimeout after *timeout*; False if a
        signal stopped the worker meanwhile."""
        started = self.clock()
        say_at = started  # the first failure is said at once
        while (problem := self.client.health_problem(timeout=min(5.0, max(1.0, poll_s * 2)))):
            waited = self.clock() - started
            self.waiting_for = f"{self.engine_url}: {problem}"
            if self._stop:
                return False
            if waited >= timeout:
                raise BarrierTimeout(
                    f"worker {self.worker_id}: its replica {self.engine_url} did not answer "
                    f"/health within {timeout:g} s (last: {problem}); is the engine running "
                    "there, and is --engine-url right?")
            if self.clock() >= say_at:
                log.info("worker %s: waiting for its replica %s: %s (%.0f s of %g s)",
                         self.worker_id, self.engine_url, problem, waited, timeout)
                say_at = self.clock() + say_every
            self._pause(poll_s)
        self.waiting_for = ""
        reported = str(self.client.server_info().get("boot_id") or "")
        self._reports_boot = bool(reported)
        given = self.boot_id
        if reported and reported != given:
            # the replica's own word wins: the resolver and the watch compare what it
            # reports now with what the attempts recorded (a vLLM server names its own)
            if given:
                log.info("worker %s: the replica reports boot id %s: the one given (%s) "
                         "is set aside", self.worker_id, reported, given)
            self.boot_id = reported
        log.info("worker %s: %s", self.worker_id,
                 self.confirmation(bool(given) and given == self.boot_id))
        return True

    def _pause(self, seconds: float) -> None:
        """Sleep *seconds*, in slices: a signal ends it at once."""
        end = self.clock() + seconds
        while not self._stop and (left := end - self.clock()) > 0:
            self.sleep(min(left, 0.2))

    def confirmation(self, given: bool) -> str:
        """How this worker confirms that a doubtful attempt's request has stopped."""
        if not self.boot_id:
            return ("the replica reports no boot id and none was given (--boot-id): a stop "
                    "is confirmed by abort-then-probe alone")
        return (f"replica boot id {self.boot_id} ({'given' if given else 'reported'}): a "
                "restart under another boot id confirms a stop at once, else abort-then-probe")

    def register(self, registry: Registry) -> None:
        registry.register(self.worker_id, {
            "host": socket.gethostname(), "gpu": self.gpu, "replica": self.engine_url,
            "boot": self.boot_id, "replica_up": self._replica_up,
            "slots": self.limit,
            "pid": os.getpid(), "started_at": self._started_at})

    @property
    def limit(self) -> int:
        """The episode slots that take new jobs: the adaptive limit, else every slot."""
        return self.adaptive.limit if self.adaptive else self.config.engine.slots_per_replica

    # -- children --------------------------------------------------------------------

    def _children(self) -> list[Supervised]:
        """``slots_per_replica`` episode workers in processes of ``episode_threads``."""
        slots, per = self.config.engine.slots_per_replica, self.config.engine.episode_threads
        return [self._child(i, start, min(per, slots - start))
                for i, start in enumerate(range(0, slots, per))]

    def _child(self, index: int, first_slot: int, threads: int) -> Supervised:
        spec = WorkerSpec(config=self.config, worker_id=self.worker_id,
                          engine_url=self.engine_url, boot_id=self.boot_id, index=index,
                          threads=threads, first_slot=first_slot,
                          clock_offset=self.clock_offset,
                          limit_file=str(self.limit_file.path) if self.limit_file else "")
        # -P: never import from the working directory (a source tree there would shadow)
        # nothing to tidy when the supervisor dies: what the process ran is redone
        return Supervised(f"worker {self.worker_id}: episode process {index}",
                          [sys.executable, "-P", "-m", "queue_rollout.workers.rq_worker"],
                          env=spec_env(spec), death_signal=signal.SIGKILL)

    # -- the loop --------------------------------------------------------------------

    def run(self) -> int:
        # from the start: a stop while the replica is awaited ends the wait at once
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_signal)
            signal.signal(signal.SIGINT, self._on_signal)
        redis = connect_config(self.config)
        ledger = Ledger.from_config(redis, self.config, clock=self.wall)
        registry = Registry(redis, self.keys, self.config.timeouts.lease, clock=self.wall)
        self._check_clock(redis)  # before anything: a skewed clock takes no work
        started = self.clock()
        if not self.wait_for_replica():
            print(f"worker {self.worker_id}: stopped before its replica was ready (waited "
                  f"{self.clock() - started:.0f} s for {self.waiting_for})", flush=True)
            return 0
        if self.adaptive:
            self.limit_file = LimitFile(self.limit)
        self.register(registry)
        self.children = self._children()
        e = self.config.engine
        adaptive = (f" (adaptive: {e.min_slots_per_replica} to {e.slots_per_replica} take "
                    "jobs)" if self.adaptive else "")
        print(f"worker {self.worker_id}: {e.slots_per_replica} episode slots{adaptive} in "
              f"{len(self.children)} process{'' if len(self.children) == 1 else 'es'} on "
              f"{self.engine_url} (boot {self.boot_id or 'unknown'})", flush=True)
        listener = ControlListener(redis, self.keys)
        next_resolve = next_health = next_seen = next_controls = next_look = 0.0
        try:
            while not self._stop:
                for child in self.children:
                    child.keep()
                try:
                    if time.monotonic() >= next_seen:  # alive, at the rate liveness needs
                        self._check_clock(redis)
                        registry.seen(self.worker_id)
                        next_seen = time.monotonic() + self.config.timeouts.lease / 3
                    if self.adaptive and time.monotonic() >= next_look:
                        next_look = time.monotonic() + self.config.engine.adaptive_interval_s
                        self._adapt(registry)
                    wake = min(next_seen, next_health, next_resolve, next_controls,
                               next_look if self.adaptive else math.inf)
                    changed = listener.wait(min(1.0, max(0.0, wake - time.monotonic())))
                    if changed or time.monotonic() >= next_controls:
                        self._follow_controls(registry)
                        next_controls = time.monotonic() + CONTROLS_REREAD_S
                    if time.monotonic() >= next_health:
                        next_health = time.monotonic() + self.health_s
                        if self._watch_replica(registry):
                            next_resolve = 0.0  # the replica is back: settle its doubt now
                    if time.monotonic() >= next_resolve:
                        resolve_doubt(ledger, self.client, self._current_boot(),
                                      worker_id=self.worker_id,
                                      min_age=self.config.timeouts.lease)
                        # as often as a lease: doubt younger than a lease is left alone
                        next_resolve = time.monotonic() + min(10.0, self.config.timeouts.lease)
                except ClockSkewed:
                    raise  # it stops taking work: the episodes get their grace, then exit 2
                except (QueueRolloutError, EngineError) as exc:
                    # Redis away, or the replica: keep the episode processes, try again
                    # next round (the listener subscribes again and re-reads)
                    self._warn(str(exc))
                    time.sleep(1.0)
        finally:
            listener.close()
            self._shutdown(registry)
        return 0

    def _check_clock(self, redis: Redis) -> None:
        """ClockSkewed (naming both clocks) when this worker's clock is further from
        Redis's than ``timeouts.clock_skew``."""
        check_clock(redis, self.wall, self.config.timeouts.skew_tolerance,
                    f"worker {self.worker_id}")

    def stop(self) -> None:
        """As SIGTERM does (for a supervisor run in a thread)."""
        self._stop = True

    def _adapt(self, registry: Registry) -> None:
        """One look at the replica's KV room; a new limit goes to the episode processes
        and into the registry (only when it changed)."""
        assert self.adaptive is not None and self.limit_file is not None
        before = self.adaptive.limit
        if self.adaptive.look() != before:
            self.limit_file.write(self.limit)
            self.register(registry)

    def _watch_replica(self, registry: Registry) -> bool:
        """One look at the replica; True when it is back (after an outage or under a new
        boot id): its doubtful attempts can be settled now."""
        up = self.client.alive(timeout=max(0.5, self.health_s))
        boot = self._current_boot() if up and self._reports_boot else self.boot_id
        if up == self._replica_up and boot == self.boot_id:
            return False
        if not up:
            log.warning("worker %s: replica %s unreachable", self.worker_id, self.engine_url)
        elif boot != self.boot_id:
            log.warning("worker %s: replica restarted (boot %s -> %s): new episode processes",
                        self.worker_id, self.boot_id, boot)
            self.boot_id = boot
            stop_all((c.proc for c in self.children if c.proc),
                     self.config.timeouts.shutdown_grace + 30)
            self.children = self._children()
        else:
            log.info("worker %s: replica %s healthy again", self.worker_id, self.engine_url)
        self._replica_up = up
        self.register(registry)
        return up

    def _follow_controls(self, registry: Registry) -> None:
        """Pause or resume the replica as the farm's pause flag says, and apply weight
        updates; acknowledge each (pause() and update_weights() wait for it)."""
        c = registry.controls()
        if c.paused:
            if self._paused_epoch != c.pause_epoch:
                self.client.pause(pause_mode(c.pause_mode))
                self._paused_epoch = c.pause_epoch
                registry.acknowledge("pause", self.worker_id, Ack(c.pause_epoch))
                log.info("worker %s: replica paused (epoch %d)", self.worker_id, c.pause_epoch)
        elif self._paused_epoch is not None:
            self.client.resume()
            self._paused_epoch = None
            log.info("worker %s: replica resumed", self.worker_id)
        if c.weights_epoch > self._weights_epoch:
            self._weights_epoch = c.weights_epoch
            ack = Ack(c.weights_epoch)
            try:
                if self._paused_epoch is not None and pause_mode(c.pause_mode) == "in_place":
                    # requests paused in place hold KV the old weights computed: SGLang
                    # loads the new weights but refuses to flush its cache over them
                    # (HTTP 400), so they are retracted and computed again under the new
                    self.client.pause("retract")
                    log.info("worker %s: requests paused in place retracted for the "
                             "weight update", self.worker_id)
                self.client.update_weights_from_disk(
                    c.weights_path, weight_version=c.weights_version or None,
                    timeout=self.config.timeouts.pause_barrier)
            except EngineError as exc:
                ack = Ack(c.weights_epoch, str(exc))
            registry.acknowledge("weights", self.worker_id, ack)
            log.info("worker %s: weights %s", self.worker_id, ack.encode())

    def _warn(self, message: str) -> None:
        """Log a failed round, at most once every 5 s while the message stays the same."""
        now = time.monotonic()
        if message != self._last_warning or now - self._last_warning_at >= 5.0:
            log.warning("worker %s: %s", self.worker_id, message)
            self._last_warning, self._last_warning_at = message, now

    def _current_boot(self) -> str:
        """The replica's boot id now (sim and vLLM report it; SGLang keeps the one given)."""
        try:
            return str(self.client.server_info().get("boot_id") or self.boot_id)
        except EngineError:
            return self.boot_id

    def _on_signal(self, signum: int, frame: object) -> None:
        # the second signal, or the first after the launcher died (the kernel's signal
        # for its children, with the farm's Redis likely gone too): the running
        # episodes are not waited for
        if self._stop or orphaned(self._parent):
            self._now.set()
        self._stop = True

    def _shutdown(self, registry: Registry) -> None:
        if self._paused_epoch is not None:  # never leave the replica paused
            try:
                self.client.resume()
                log.info("worker %s: replica resumed on the way out", self.worker_id)
            except EngineError as exc:
                log.warning("worker %s: could not resume the replica on the way out: %s",
                            self.worker_id, exc)
        grace = self.config.timeouts.shutdown_grace
        live = [c.proc for c in self.children if c.proc and c.proc.poll() is None]
        if live and not self._now.is_set():
            print(f"worker {self.worker_id}: stopping: its running episodes have up to "
                  f"{grace} s to finish (then they are aborted and handed back); Ctrl-C "
                  "again (or a second SIGTERM) to stop now", flush=True)
        stop_all(live, grace + 30, now=self._now)
        if self._now.is_set() and live:
            print(f"worker {self.worker_id}: episode processes stopped now; what they ran "
                  "is redone once its leases expire", flush=True)
        if self.limit_file is not None:
            self.limit_file.remove()
        try:
            registry.deregister(self.worker_id)
        except QueueRolloutError as exc:
            log.warning("worker %s: could not deregister: %s", self.worker_id, exc)
        print(f"worker {self.worker_id}: stopped", flush=True)
