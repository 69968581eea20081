"""The outbox: every admitted attempt becomes exactly one RQ job, JSON payload = its id."""

from __future__ import annotations

import json
import zlib

from rq.job import Job
from rq.serializers import JSONSerializer

from queue_rollout.ledger.keys import EPISODE_JOB_FUNC
from queue_rollout.ledger.outbox import episode_queue, flush_outbox
from testkit import trivial_prompts


def test_outbox_enqueues_each_attempt_once_with_only_its_id(make_ledger, r):
    ledger = make_ledger(group_size=4, max_concurrent_samples=8)
    ledger.submit(trivial_prompts(1))
    admission = ledger.admit()
    assert flush_outbox(r, ledger.keys) == 4
    assert r.llen(ledger.keys.outbox) == 0
    queue = episode_queue(r, ledger.keys)
    assert sorted(queue.job_ids) == sorted(admission.attempt_ids)
    job = Job.fetch(admission.attempt_ids[0], connection=r, serializer=JSONSerializer)
    assert job.func_name == EPISODE_JOB_FUNC and list(job.args) == [admission.attempt_ids[0]]
    payload = json.loads(zlib.decompress(r.hget(job.key, "data")))  # JSON, not pickle
    assert payload[2] == [admission.attempt_ids[0]]
    assert flush_outbox(r, ledger.keys) == 0 and queue.count == 4


def test_a_crash_between_enqueue_and_outbox_removal_enqueues_nothing_twice(make_ledger, r):
    ledger = make_ledger(group_size=2, max_concurrent_samples=8)
    ledger.submit(trivial_prompts(1))
    admission = ledger.admit()
    queue = episode_queue(r, ledger.keys)
    # the dispatcher enqueued the first job, then died before removing it from the outbox
    queue.enqueue_call(EPISODE_JOB_FUNC, args=(admission.attempt_ids[0],),
                       job_id=admission.attempt_ids[0])
    assert r.llen(ledger.keys.outbox) == 2
    assert flush_outbox(r, ledger.keys) == 1
    assert queue.count == 2 and r.llen(ledger.keys.outbox) == 0


def test_attempts_no_longer_queued_are_not_enqueued(make_ledger, r):
    ledger = make_ledger(group_size=1, max_concurrent_samples=8)
    ledger.submit(trivial_prompts(1))
    aid = ledger.admit().attempt_ids[0]
    ledger.start(aid, "w", "r", "b", 30)  # the job ran (e.g. the reconciler re-enqueued it)
    assert flush_outbox(r, ledger.keys) == 0
    assert episode_queue(r, ledger.keys).count == 0 and r.llen(ledger.keys.outbox) == 0
