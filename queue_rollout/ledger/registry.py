"""The worker registry and the trainer's controls: the one module that reads and writes
them.

- **Registry**: each GPU's worker records itself in ``workers`` (host, GPU, replica,
  boot id, slots) and reports alive in ``workers_seen``. A worker is *live* while its
  last report is younger than ``LIVE_LEASES`` leases; the live workers' slots are the
  capacity of ``max_concurrent_samples = "auto"``.
- **Controls**: the pause flag, its epoch and mode (set by the ``set_paused`` script in
  ``state``), and weight-update requests (``control``: path, version, epoch).
- **Acknowledgements**: each worker answers a pause or a weight update in ``acks`` with
  ``<epoch> ok`` or ``<epoch> error: <why>``; ``pause()`` and ``update_weights()`` wait
  for every live worker's answer.

Every call goes through the Redis error boundary
(:func:`~queue_rollout.ledger.connection.translate_errors`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import redis

from queue_rollout.errors import QueueRolloutError
from queue_rollout.ledger.connection import client_url, translate_errors
from queue_rollout.ledger.keys import Keys

#: A worker is live while its supervisor reported within this many leases.
LIVE_LEASES = 3
AckKind = Literal["pause", "weights"]


def _text(raw: bytes | None) -> str:
    return raw.decode() if raw is not None else ""


@dataclass(frozen=True, slots=True)
class Controls:
    """What the trainer asked of the workers, read in one round trip."""

    paused: bool
    pause_epoch: int
    pause_mode: str
    weights_epoch: int
    weights_path: str
    weights_version: str


@dataclass(frozen=True, slots=True)
class Ack:
    """A worker's answer to a pause or a weight update."""

    epoch: int
    error: str = ""  # why it failed; "" when it succeeded

    @property
    def ok(self) -> bool:
        return not self.error

    def encode(self) -> str:
        return f"{self.epoch} ok" if self.ok else f"{self.epoch} error: {self.error}"

    @classmethod
    def decode(cls, raw: bytes) -> Ack:
        """``<epoch> ok``, ``<epoch> error: <why>``, or a bare ``<epoch>`` (ok)."""
        epoch, _, rest = raw.decode().partition(" ")
        error = rest.partition("error: ")[2] if rest.startswith("error") else ""
        return cls(int(epoch), error)


class Registry:
    """The registry, controls and acknowledgements of one farm."""

    def __init__(self, client: redis.Redis, keys: Keys, lease_s: float,
                 clock: Callable[[], float] = time.time) -> None:
        self.client, self.keys, self.clock = client, keys, clock
        self.stale_after = LIVE_LEASES * lease_s
        self._url = client_url(client)

    # -- workers -----------------------------------------------------------------------

    def register(self, worker_id: str, record: dict[str, Any]) -> None:
        """Record (or update) a worker and mark it seen now."""
        pipe = self.client.pipeline(transaction=True)
        pipe.hset(self.keys.workers, worker_id, json.dumps(record))
        pipe.zadd(self.keys.workers_seen, {worker_id: self.clock()})
        with translate_errors(self._url):
            pipe.execute()

    def seen(self, worker_id: str) -> None:
        """The worker is alive now."""
        with translate_errors(self._url):
            self.client.zadd(self.keys.workers_seen, {worker_id: self.clock()})

    def deregister(self, worker_id: str) -> None:
        pipe = self.client.pipeline(transaction=True)
        pipe.hdel(self.keys.workers, worker_id)
        pipe.zrem(self.keys.workers_seen, worker_id)
        with translate_errors(self._url):
            pipe.execute()

    def live(self) -> dict[str, dict[str, Any]]:
        """Worker id -> record of every worker seen within ``LIVE_LEASES`` leases."""
        with translate_errors(self._url):
            seen = self.client.zrangebyscore(self.keys.workers_seen,
                                             self.clock() - self.stale_after, "+inf")
            records = self.client.hmget(self.keys.workers, seen) if seen else []
        return {w.decode(): json.loads(r) for w, r in zip(seen, records, strict=True)
                if r is not None}

    @staticmethod
    def slots(workers: dict[str, dict[str, Any]]) -> int:
        """The episode slots *workers* serve (``"auto"`` capacity)."""
        return sum(int(w.get("slots", 0)) for w in workers.values())

    # -- controls ----------------------------------------------------------------------

    def controls(self) -> Controls:
        pipe = self.client.pipeline(transaction=False)
        pipe.hmget(self.keys.state, "paused", "pause_epoch", "pause_mode")
        pipe.hmget(self.keys.control, "weights_epoch", "weights_path", "weights_version")
        with translate_errors(self._url):
            (paused, p_epoch, mode), (w_epoch, path, version) = pipe.execute()
        return Controls(paused == b"1", int(p_epoch or 0), _text(mode) or "in_place",
                        int(w_epoch or 0), _text(path), _text(version))

    def request_weights(self, model_path: str, version: int) -> int:
        """Ask every worker to load *model_path* as *version*; returns the request's
        epoch, which each worker's answer carries."""
        pipe = self.client.pipeline(transaction=True)  # path, version, epoch together
        pipe.hset(self.keys.control, mapping={"weights_path": model_path,
                                              "weights_version": str(version)})
        pipe.hincrby(self.keys.control, "weights_epoch", 1)
        pipe.publish(self.keys.controls_channel, "weights")
        with translate_errors(self._url):
            return int(pipe.execute()[1])

    # -- acknowledgements --------------------------------------------------------------

    def acknowledge(self, kind: AckKind, worker_id: str, ack: Ack) -> None:
        with translate_errors(self._url):
            self.client.hset(self.keys.acks, f"{kind}:{worker_id}", ack.encode())

    def acks(self, kind: AckKind, workers: list[str]) -> dict[str, Ack | None]:
        """Each worker's latest answer of *kind* (None: none yet)."""
        if not workers:
            return {}
        with translate_errors(self._url):
            raws = self.client.hmget(self.keys.acks, [f"{kind}:{w}" for w in workers])
        return {w: None if raw is None else Ack.decode(raw)
                for w, raw in zip(workers, raws, strict=True)}


class ControlListener:
    """Wakes a worker's supervisor when the trainer's controls change, instead of a read
    every few milliseconds: a subscription to the farm's controls channel.

    A message is only a hint; it never carries what changed. So nothing is lost when one
    is: :meth:`wait` also answers True on every (re)subscription, and the caller re-reads
    the controls then and at least every ``CONTROLS_REREAD_S`` (see the supervisor)."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.client, self.channel = client, keys.controls_channel
        self._pubsub: Any = None
        self._url = client_url(client)

    def wait(self, timeout: float) -> bool:
        """True when the controls may have changed since the last call: a message, or a
        new subscription (after a start or a lost connection). False after *timeout*
        seconds of neither. RedisUnavailable when Redis is away (the next call
        subscribes again)."""
        if self._pubsub is None:
            pubsub = self.client.pubsub(ignore_subscribe_messages=True)
            with translate_errors(self._url):
                pubsub.subscribe(self.channel)
            self._pubsub = pubsub
            return True
        try:
            with translate_errors(self._url):
                message = self._pubsub.get_message(timeout=timeout)
                if message is None:
                    return False
                while self._pubsub.get_message(timeout=0) is not None:
                    pass  # one re-read answers every message waiting
        except QueueRolloutError:
            self.close()
            raise
        return True

    def close(self) -> None:
        if self._pubsub is not None:
            try:
                self._pubsub.close()
            except redis.RedisError:
                pass
            self._pubsub = None
