"""Placement (``rollout.placement = "group"``) in the ledger's scripts: a group on one
replica with G free slots, else on as few as possible, else waiting; each replica's
load follows its attempts through start, finish and retry; moves to the shared queue;
the doctor recomputes and repairs it all."""

from __future__ import annotations

import msgspec
import pytest
import redis

from queue_rollout.collector.reconciler import Reconciler
from queue_rollout.config import Config
from queue_rollout.ledger.core import Ledger
from queue_rollout.ledger.doctor import examine, repair
from queue_rollout.ledger.jobs import flush_outbox
from queue_rollout.ledger.keys import rq_queue_key
from testkit import trivial_prompts


def config(mode: str = "sample", **rollout: object) -> Config:
    capacity = {"max_concurrent_samples": 64} if mode == "sample" else {
        "max_concurrent_rollouts": 8}
    return msgspec.convert({"farm": {"name": "pl"}, "rollout": {
        "group_size": 4, "batch_size": 1, "max_staleness": 50, "placement": "group",
        **capacity, **rollout}}, Config)


@pytest.fixture
def farm(r: redis.Redis, clock) -> tuple[Ledger, Reconciler]:
    c = config()
    ledger = Ledger(r, "pl", c.rollout, clock=clock)
    ledger.submit(trivial_prompts(8))
    return ledger, Reconciler(ledger, c)


def placed(ledger: Ledger, aids) -> list[str | None]:
    return [a.placed_on for a in map(ledger.attempt, aids)]


def free(ledger: Ledger) -> dict[str, int]:
    return {w.decode(): int(n) for w, n in
            ledger.client.zrange(ledger.keys.replica_free, 0, -1, withscores=True)}


def doctor_clean(ledger: Ledger) -> None:
    report = examine(ledger.client, ledger.keys, 1)
    assert report.ok, report.problems


def live(**slots: int) -> dict[str, dict[str, int]]:
    return {w: {"slots": n} for w, n in slots.items()}


def test_a_group_goes_to_the_replica_with_the_most_free_slots(farm):
    ledger, rec = farm
    rec.tick(scan_jobs=False, live_workers=live(a=4, b=6))
    first = ledger.admit()
    assert placed(ledger, first.attempt_ids) == ["b"] * 4
    assert first.replicas == ("b",) * 4  # the admission says where each went
    assert free(ledger) == {"a": 4, "b": 2}
    second = ledger.admit()  # a has 4 free, b 2: a holds the whole group
    assert placed(ledger, second.attempt_ids) == ["a"] * 4
    c = ledger.counters()
    assert c["placements:one_replica"] == 2 and "placements:split" not in c
    doctor_clean(ledger)


def test_with_no_replica_free_enough_the_group_is_split_over_the_fewest(farm):
    ledger, rec = farm
    rec.tick(scan_jobs=False, live_workers=live(a=3, b=2, c=1))
    admission = ledger.admit()
    assert placed(ledger, admission.attempt_ids) == ["a", "a", "a", "b"]
    assert ledger.counters()["placements:split"] == 1
    assert free(ledger) == {"a": 0, "b": 1, "c": 1}
    doctor_clean(ledger)


def test_with_too_few_free_slots_the_group_waits_at_the_head_and_is_counted(farm, redis_snapshot):
    ledger, rec = farm
    rec.tick(scan_jobs=False, live_workers=live(a=2, b=1))
    pending = ledger.client.lrange(ledger.keys.pending, 0, -1)
    before = redis_snapshot()
    assert (ledger.admit().status, ledger.admit().reason) == ("blocked", "placement")
    after = redis_snapshot()
    assert ledger.counters()["blocked:placement"] == 2
    counted = {ledger.keys.counters.encode(), ledger.keys.refusals.encode()}
    assert {k: v for k, v in after.items() if k not in counted} == {
        k: v for k, v in before.items() if k not in counted}
    assert ledger.client.lrange(ledger.keys.pending, 0, -1) == pending
    rec.tick(scan_jobs=False, live_workers=live(a=2, b=2))  # b grew
    assert ledger.admit().status == "admitted"


def test_the_load_follows_start_finish_and_a_start_elsewhere(farm):
    ledger, rec = farm
    rec.tick(scan_jobs=False, live_workers=live(a=4, b=4))
    aids = ledger.admit().attempt_ids  # on b (ties: the last name first)
    assert placed(ledger, aids) == ["b"] * 4
    assert ledger.start(aids[0], "b", "r", "boot", 30).status == "started"
    assert ledger.start(aids[1], "a", "r", "boot", 30).status == "started"  # moved, say
    assert free(ledger) == {"a": 3, "b": 1}
    assert set(ledger.placed_before(1e12)) == set(aids[2:])
    doctor_clean(ledger)
    assert ledger.finish(aids[0], 0, b"r").status == "recorded"
    assert ledger.finish(aids[1], 1, b"r").status == "recorded"
    assert free(ledger) == {"a": 4, "b": 2}
    assert ledger.client.hgetall(ledger.keys.replica_load) == {b"b": b"2"}
    doctor_clean(ledger)


def test_a_doubtful_attempt_keeps_its_replica_load_until_it_ends(farm):
    ledger, rec = farm
    rec.tick(scan_jobs=False, live_workers=live(a=4))
    aids = ledger.admit().attempt_ids
    ledger.start(aids[0], "a", "r", "boot", 30)
    assert ledger.mark_doubtful(aids[0], "lease_expired").status == "doubtful"
    assert free(ledger) == {"a": 0}  # it may still run there
    doctor_clean(ledger)
    assert ledger.finish(aids[0], 0, b"late").status == "recorded"
    assert free(ledger) == {"a": 1}
    doctor_clean(ledger)


def test_a_retry_prefers_the_replica_its_attempt_ran_on(farm):
    ledger, rec = farm
    rec.tick(scan_jobs=False, live_workers=live(a=4, b=4))
    aids = ledger.admit().attempt_ids
    for aid in aids:
        ledger.start(aid, "b", "r", "boot", 30)
    again = ledger.retry(aids[0], cause="replica_restart")
    assert again.status == "retried"
    assert placed(ledger, [again.attempt_id]) == ["b"]  # the slot it left
    assert free(ledger) == {"a": 4, "b": 0}
    doctor_clean(ledger)
    # no free slot where it ran (the replica left): the retry goes to the shared queue
    rec.tick(scan_jobs=False, live_workers=live(a=4))
    ledger.start(again.attempt_id, "b", "r", "boot", 30)
    shared = ledger.retry(again.attempt_id, cause="replica_restart")
    assert placed(ledger, [shared.attempt_id]) == [None]
    assert ledger.attempt(shared.attempt_id).load_counted
    doctor_clean(ledger)


def one_group_enqueued(r, clock, wait_s: float, **slots: int
                       ) -> tuple[Ledger, Reconciler, tuple[str, ...]]:
    """A placing farm with workers of *slots*, one group admitted and its jobs on
    their replica's queue."""
    c = config(placement_wait_s=wait_s)
    ledger = Ledger(r, "pl", c.rollout, clock=clock)
    rec = Reconciler(ledger, c)
    ledger.submit(trivial_prompts(2))
    rec.tick(scan_jobs=False, live_workers=live(**slots))
    aids = ledger.admit().attempt_ids
    flush_outbox(r, ledger.keys)
    return ledger, rec, aids


def test_attempts_not_started_in_time_move_to_the_shared_queue(r, clock):
    ledger, rec, first = one_group_enqueued(r, clock, 10, a=4, b=4)
    keys = ledger.keys
    b_queue, shared = rq_queue_key(keys.rq_replica_queue("b")), rq_queue_key(keys.rq_queue)
    assert r.lrange(b_queue, 0, -1) == [a.encode() for a in first]
    ledger.start(first[0], "b", "r", "boot", 30)  # one started in time
    clock.advance(9)
    assert rec.tick(scan_jobs=False, live_workers=live(a=4, b=4)).moved == 0
    clock.advance(2)
    assert rec.tick(scan_jobs=False, live_workers=live(a=4, b=4)).moved == 3
    assert r.lrange(shared, 0, -1) == [a.encode() for a in sorted(first[1:])]
    assert r.lrange(b_queue, 0, -1) == [first[0].encode()]  # started (no worker took it)
    assert placed(ledger, first) == [None] * 4
    assert free(ledger) == {"a": 4, "b": 3}
    assert ledger.counters()["placements:moved"] == 3
    assert rec.tick(scan_jobs=False, live_workers=live(a=4, b=4)).moved == 0  # once
    # a moved attempt starts on any worker, once
    assert ledger.start(first[1], "a", "r", "boot", 30).status == "started"
    assert ledger.start(first[1], "b", "r", "boot2", 30).status == "ignored"
    assert free(ledger) == {"a": 3, "b": 3}
    doctor_clean(ledger)


def test_a_gone_worker_leaves_at_once_and_what_waits_on_it_moves(r, clock):
    ledger, rec, on_b = one_group_enqueued(r, clock, 600, a=4, b=8)
    report = rec.tick(scan_jobs=False, live_workers=live(a=4))
    assert report.moved == 4
    assert ledger.replica_slots() == {"a": 4}
    assert free(ledger) == {"a": 4}
    assert r.llen(rq_queue_key(ledger.keys.rq_queue)) == 4
    assert placed(ledger, ledger.admit().attempt_ids) == ["a"] * 4
    assert set(on_b) <= {a.decode() for a in r.lrange(rq_queue_key(ledger.keys.rq_queue), 0, -1)}
    doctor_clean(ledger)


def test_group_mode_places_too_and_frees_members_as_they_end(r, clock):
    c = config("group")
    ledger = Ledger(r, "pl", c.rollout, clock=clock)
    rec = Reconciler(ledger, c)
    ledger.submit(trivial_prompts(2))
    rec.tick(scan_jobs=False, live_workers=live(a=4))
    aids = ledger.admit().attempt_ids
    assert ledger.admit().reason == "placement"  # the group's slots are global: 8 x 4
    ledger.start(aids[0], "a", "r", "boot", 30)
    ledger.finish(aids[0], 0, b"r")
    assert free(ledger) == {"a": 1}  # the replica's slot is free; the group's is held
    assert ledger.counters()["reserved"] == 4
    doctor_clean(ledger)


def test_the_doctor_finds_and_repairs_placement_drift(farm):
    ledger, rec = farm
    rec.tick(scan_jobs=False, live_workers=live(a=4, b=4))
    aids = ledger.admit().attempt_ids
    ledger.start(aids[0], "b", "r", "boot", 30)
    client, keys = ledger.client, ledger.keys
    client.hincrby(keys.replica_load, "b", 2)
    client.zadd(keys.replica_free, {"a": 1})
    client.zrem(keys.placed, aids[1])
    report = examine(client, keys, 1)
    assert "replica b: load 6, records say 4" in report.problems
    assert "replica a: free slots not 4 (its slots less its load)" in report.problems
    assert any("are queued on a replica" in p for p in report.problems)
    repair(client, keys, 1)
    doctor_clean(ledger)
    assert free(ledger) == {"a": 4, "b": 0}
    assert set(ledger.placed_before(1e12)) == set(aids[1:])
