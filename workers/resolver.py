"""Resolving doubt on the replica's own node.

The collector's reconciler only *marks* doubt; the replica usually listens on its
node's loopback, so the worker bound to it settles its doubtful attempts: a changed
boot id proves the attempt's request died with the old process (``replica_restart``);
otherwise (and always when the replica has no known boot id, as a plain SGLang server
started by hand) every request of the attempt is aborted (by its id: SGLang aborts by rid
prefix), then the rid the ledger recorded in flight (a multi-turn episode's later turn)
is probed with ``max_new_tokens = 0``, and a probe that is not refused as a duplicate
proves the request is gone. Either way the attempt
is retried with the same seed. An attempt of the current boot doubtful for less than
``min_age`` seconds is left alone, so a worker that is alive can still report it
(``progress`` revives it); one of an earlier boot is settled at once, since its request
died with that boot (a late result of it is refused as superseded).

A replica is identified by what it serves, its host and GPU slot (the worker id names
both), and by its boot id, not by its URL: every host's replicas listen on the same
loopback ports, and a launcher restarted after a hard stop may bring a replica back on
another port. So an attempt is this worker's to settle when this worker's id started
it; a changed boot id settles it whatever URL it ran at. Abort-then-probe asks the
replica at this worker's URL, so it settles only an attempt that ran there (with no
boot id to tell, the old URL's request may still run on a replica no one watches).
"""

from __future__ import annotations

import logging

from queue_rollout.engines.base import EngineClient, EngineError
from queue_rollout.ledger.core import Ledger

log = logging.getLogger(__name__)


def resolve_doubt(ledger: Ledger, client: EngineClient, boot_id: str, *, worker_id: str,
                  min_age: float) -> dict[str, str]:
    """Settle the doubtful attempts this worker started on this replica; returns
    attempt id -> what happened."""
    now = ledger.clock()
    outcome: dict[str, str] = {}
    for aid, since in ledger.doubtful():
        attempt = ledger.attempt(aid)
        if (attempt is None or attempt.worker != worker_id
                or (attempt.boot == boot_id and now - since < min_age)):
            continue
        if boot_id and attempt.boot and attempt.boot != boot_id:
            answer = ledger.retry(aid, cause="replica_restart")
            outcome[aid] = f"replica restarted: {answer.status}"
        elif attempt.replica != client.url:
            continue  # no boot to tell by, and the replica it ran on is not the one here
        else:
            try:
                # every turn aborted by the attempt id; the recorded turn's rid probed
                stopped = client.confirm_stopped(attempt.rid or aid, abort=aid)
            except EngineError as exc:
                log.warning("doubt %s: replica unreachable: %s", aid, exc)
                outcome[aid] = "unreachable"
                continue
            if not stopped:
                outcome[aid] = "still in flight"
                continue
            answer = ledger.retry(aid, cause=attempt.cause or "lease_expired")
            outcome[aid] = f"confirmed stopped: {answer.status}"
        log.warning("doubt %s: %s", aid, outcome[aid])
    return outcome
