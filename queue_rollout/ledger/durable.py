"""Ledger changes that replicas hold before anyone acts on them.

With ``farm.redis_wait_replicas = N > 0`` every state-changing script is sent in one
pipeline with ``WAIT N timeout`` (WAIT counts only its own connection's writes, so it
must ride on the script's connection). Fewer than N acknowledgements, or a connection
lost before the answer, leave the change uncertain: a failover now could lose it. The
call is then sent again with the same receipt key (``_receipt.lua``): if the change is
there, the script answers what it answered the first time and changes nothing; if a
failover lost it, it is applied now. ``start`` and ``finish``, an episode's two calls,
keep their receipt in the attempt's own record instead (the call's id, sent again
unchanged), which spares a key written and deleted per call. Only an answer that N
replicas acknowledged is returned, so while fewer than N replicas are attached the
caller holds still and says so in its log. A receipt is deleted (in the caller's next
pipeline) once its change is held; its lifetime only bounds what a caller that died in
between leaves behind.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis

from queue_rollout.errors import LedgerError, RedisUnavailable
from queue_rollout.ledger.connection import mask_url
from queue_rollout.ledger.keys import Keys
from queue_rollout.ledger.scripts import Scripts

log = logging.getLogger(__name__)

#: Seconds a receipt outlives its last use (a caller resends well within it).
RECEIPT_LIFETIME_S = 3600
#: How long a caller keeps resending through a lost connection (a Sentinel failover
#: takes down-after-milliseconds plus an election) before it reports Redis unreachable.
RECONNECT_S = 120.0
#: Seconds between repeated "held" log lines while replicas fall short.
LOG_EVERY_S = 10.0
#: Errors after which the change is uncertain and is sent again.
_RETRY = (redis.ConnectionError, redis.TimeoutError)
#: Answers of calls that changed nothing: no receipt is stored for them.
NO_CHANGE = frozenset({b"blocked", b"empty", b"ignored", b"redelivered", b"duplicate"})
#: Operations sent without waiting: losing a lease renewal costs the next renewal
#: (every lease/3), losing a leadership renewal a step of two leaders; neither is a
#: result, a delivery or a slot.
UNWAITED = frozenset({"progress", "lead"})
#: Operations that are their own receipt: the attempt record keeps the id of the call
#: that last changed it, and the same call sent again answers as it did the first time.
SELF_RECEIPTED = frozenset({"start", "finish"})


@dataclass(frozen=True)
class WaitPolicy:
    """How many replicas must hold a ledger change before the caller acts on it."""

    replicas: int = 0
    timeout_s: float = 1.0


def _held_back(reply: object) -> bool:
    """A refusal that says the change was not applied and may be sent again: the
    primary is short of replicas (min-replicas-to-write), or is a replica now."""
    return isinstance(reply, redis.ResponseError) and str(reply).startswith(
        ("NOREPLICAS", "READONLY", "LOADING", "MASTERDOWN"))


class DurableCalls:
    """Script calls for one client that return only what N replicas hold."""

    def __init__(self, client: redis.Redis, scripts: Scripts, keys: Keys, policy: WaitPolicy,
                 url: str, *, sleep: Callable[[float], None] = time.sleep) -> None:
        if not scripts.receipts:
            raise ValueError("durable calls need the scripts loaded with receipts")
        self.client, self.scripts, self.keys, self.policy = client, scripts, keys, policy
        self._url, self._sleep = url, sleep
        self._done: deque[str] = deque()  # receipts to delete (thread-safe ends)
        self._lock = threading.Lock()
        self._last_log = 0.0
        #: Replicas that acknowledged the latest change this client sent (None: none sent).
        self.last_acked: int | None = None

    def call(self, name: str, keys: list[str], args: list[object]) -> list[Any]:
        """Send script *name* until N replicas hold what it did: under a receipt key
        when the script is wrapped by ``_receipt.lua``, else (``SELF_RECEIPTED``) the
        script answers a resend of the same arguments as it answered the first send."""
        receipt = self.scripts.wrapped(name)
        receipt_key = self.keys.receipt(uuid.uuid4().hex) if receipt else ""
        if receipt:
            keys = [*keys, receipt_key]
        may_be_applied = False  # a send whose outcome is unknown went out before
        wait_ms = max(1, int(self.policy.timeout_s * 1000))
        lost_since: float | None = None
        delay = 0.05
        while True:
            done = self._take_done()
            pipe = self.client.pipeline(transaction=False)
            if done:
                pipe.unlink(*done)
            resent = "1" if may_be_applied else "0"
            self.scripts.queue(pipe, name, keys,
                               [*args, resent, RECEIPT_LIFETIME_S] if receipt else args)
            pipe.execute_command("WAIT", self.policy.replicas, wait_ms)
            try:
                *_, reply, acked = pipe.execute(raise_on_error=False)
            except _RETRY as exc:
                self._done.extend(done)
                may_be_applied = True
                now = time.monotonic()
                lost_since = now if lost_since is None else lost_since
                if now - lost_since > RECONNECT_S:
                    raise RedisUnavailable(
                        f"Redis unreachable at {mask_url(self._url)} for {RECONNECT_S:g} s "
                        f"while sending {name} (uncertain: it may have been applied)"
                    ) from exc
                self._say(f"{name}: Redis unreachable ({exc}); sending it again")
                self._sleep(delay)
                delay = min(delay * 2, 1.0)
                continue
            lost_since, delay = None, 0.05
            if isinstance(reply, redis.exceptions.NoScriptError):
                self.scripts.load(name)  # this send did not run; an earlier one may have
                continue
            may_be_applied = True
            if _held_back(reply):
                self._say(f"{name}: Redis refused it ({reply}); sending it again")
                self._sleep(self.policy.timeout_s)
                continue
            if isinstance(reply, redis.RedisError):
                raise LedgerError(f"Redis answered an error: {reply}")
            if isinstance(acked, redis.RedisError):
                raise LedgerError(f"WAIT failed: {acked} (the ACL must allow WAIT)")
            self.last_acked = int(acked)
            if self.last_acked >= self.policy.replicas:
                if receipt and reply and reply[0] not in NO_CHANGE:
                    self._done.append(receipt_key)
                return list(reply)
            self._say(f"{name} held: {self.last_acked} of farm.redis_wait_replicas = "
                      f"{self.policy.replicas} replicas acknowledged it within "
                      f"{self.policy.timeout_s:g} s; sending it again")

    def _take_done(self, at_most: int = 256) -> list[str]:
        taken: list[str] = []
        while self._done and len(taken) < at_most:
            try:
                taken.append(self._done.popleft())
            except IndexError:
                break
        return taken

    def _say(self, message: str) -> None:
        with self._lock:
            now = time.monotonic()
            if now - self._last_log < LOG_EVERY_S:
                return
            self._last_log = now
        log.warning("ledger change %s", message)
