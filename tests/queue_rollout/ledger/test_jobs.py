"""The job queues: every admitted attempt becomes exactly one RQ job, its id in the queue
its outbox entry names; the relay reads nothing else."""

from __future__ import annotations

from queue_rollout.ledger.jobs import episode_queue, flush_outbox, queue_of, requeue_lost
from testkit import trivial_prompts


def test_outbox_enqueues_each_attempt_once_with_only_its_id(make_ledger, r):
    ledger = make_ledger(group_size=4, max_concurrent_samples=8)
    ledger.submit(trivial_prompts(1))
    admission = ledger.admit()
    assert flush_outbox(r, ledger.keys) == 4
    assert r.llen(ledger.keys.outbox) == 0
    queue = episode_queue(r, ledger.keys)
    assert queue.job_ids == list(admission.attempt_ids)  # in order, at the tail
    # a job is its id and nothing more: no record, no payload anyone could forge to run
    assert not any(r.exists(f"rq:job:{aid}") for aid in admission.attempt_ids)
    assert queue.key.encode() in r.smembers(queue.redis_queues_keys)  # `rq info` lists it
    assert flush_outbox(r, ledger.keys) == 0 and queue.count == 4


def test_enqueue_and_outbox_removal_are_one_transaction(make_ledger, r, monkeypatch):
    """A flush that dies before its transaction runs enqueues nothing (the next one
    enqueues each attempt once); one that runs leaves nothing behind in the outbox."""
    ledger = make_ledger(group_size=2, max_concurrent_samples=8)
    ledger.submit(trivial_prompts(1))
    admission = ledger.admit()
    queue = episode_queue(r, ledger.keys)
    real = r.pipeline

    def dying(transaction=True, shard_hint=None):
        pipe = real(transaction=transaction, shard_hint=shard_hint)
        if transaction:
            def die(*a, **kw):
                raise ConnectionError("the dispatcher died here")
            pipe.execute = die
        return pipe

    monkeypatch.setattr(r, "pipeline", dying)
    try:
        flush_outbox(r, ledger.keys)
    except ConnectionError:
        pass
    monkeypatch.setattr(r, "pipeline", real)
    assert queue.count == 0 and r.llen(ledger.keys.outbox) == 2
    assert not any(r.exists(f"rq:job:{aid}") for aid in admission.attempt_ids)
    assert flush_outbox(r, ledger.keys) == 2
    assert sorted(queue.job_ids) == sorted(admission.attempt_ids)
    assert r.llen(ledger.keys.outbox) == 0 and flush_outbox(r, ledger.keys) == 0


def test_the_relay_reads_no_attempt_record_the_entry_names_the_queue(make_ledger, r):
    """An entry says where its job goes: the relay enqueues it with the attempts gone
    from Redis (it never read them). A job whose attempt started meanwhile (the
    reconciler handed it over again) is enqueued and runs nothing: ``start`` ignores
    it."""
    ledger = make_ledger(group_size=2, max_concurrent_samples=8)
    ledger.submit(trivial_prompts(1))
    first, second = ledger.admit().attempt_ids
    assert r.lrange(ledger.keys.outbox, 0, -1) == [f"{first}@".encode(), f"{second}@".encode()]
    assert ledger.start(first, "w", "r", "b", 30).status == "started"
    saved = r.dump(ledger.keys.attempts)
    r.delete(ledger.keys.attempts)
    assert flush_outbox(r, ledger.keys) == 2
    assert episode_queue(r, ledger.keys).job_ids == [first, second]
    r.restore(ledger.keys.attempts, 0, saved)
    assert ledger.start(first, "w2", "r", "b", 30).status == "ignored"


def test_an_entry_an_earlier_release_wrote_is_read_as_it_read_it(make_ledger, r):
    """A plain attempt id (the outbox before entries named their queue): the attempt
    record says where its job goes, and a job whose attempt is no longer queued is
    not enqueued."""
    ledger = make_ledger(group_size=2, max_concurrent_samples=8, placement="group")
    ledger.set_replicas({"w0": 4})
    ledger.submit(trivial_prompts(1))
    started, queued = ledger.admit().attempt_ids
    r.delete(ledger.keys.outbox)
    r.rpush(ledger.keys.outbox, started, queued)
    ledger.start(started, "w0", "r", "b", 30)
    assert flush_outbox(r, ledger.keys) == 1 and r.llen(ledger.keys.outbox) == 0
    assert r.lrange(queue_of(ledger.keys, "w0"), 0, -1) == [queued.encode()]
    assert episode_queue(r, ledger.keys).count == 0


def test_the_queue_keys_the_ledger_names_are_rqs_own(make_ledger, r):
    """Scripts reach RQ's lists by name (move.lua): the names must be RQ's keys."""
    from rq import Queue

    from queue_rollout.ledger.keys import rq_queue_key

    keys = make_ledger().keys
    for name in (keys.rq_queue, keys.rq_replica_queue("host-gpu0")):
        assert rq_queue_key(name) == Queue(name, connection=r).key


def test_a_lost_job_goes_back_to_the_outbox_for_the_queue_it_waited_in(make_ledger, r, clock):
    """The lost-job scan hands a placed attempt back for its worker's queue; an entry
    in either form counts as the job being in the outbox."""
    ledger = make_ledger(group_size=2, max_concurrent_samples=8, placement="group")
    ledger.set_replicas({"w0": 4})
    ledger.submit(trivial_prompts(1))
    first, second = ledger.admit().attempt_ids
    r.delete(ledger.keys.outbox)
    r.rpush(ledger.keys.outbox, second)  # as an earlier release wrote it
    clock.advance(60)
    assert requeue_lost(r, ledger.keys, clock()) == [first]
    assert r.lrange(ledger.keys.outbox, 0, -1) == [second.encode(), f"{first}@w0".encode()]
    assert requeue_lost(r, ledger.keys, clock()) == []
    assert flush_outbox(r, ledger.keys) == 2
    assert r.lrange(queue_of(ledger.keys, "w0"), 0, -1) == [second.encode(), first.encode()]
    assert requeue_lost(r, ledger.keys, clock()) == []  # waiting in their queue
