"""The ledger's scripts against a real redis-server: the reference cases of [1/7]
and each operation's edge cases."""

from __future__ import annotations

import re

import pytest
import redis

from queue_rollout.ledger.core import Ledger, Renewal
from queue_rollout.ledger.doctor import examine, repair
from queue_rollout.ledger.keys import EVENTS_GROUP
from testkit import trivial_prompts


def ledger_counters(ledger: Ledger) -> dict[str, int]:
    """Counters except the tally of ignored notifications."""
    return {k: v for k, v in ledger.counters().items() if k != "ignored"}


def admit_groups(ledger: Ledger, n: int) -> list:
    out = []
    for _ in range(n):
        a = ledger.admit()
        assert a.status == "admitted", a
        out.append(a)
    return out


def run_member(ledger: Ledger, admission, member: int, worker: str = "w") -> None:
    aid = admission.attempt_ids[member]
    assert ledger.start(aid, worker, "r0", "boot0", 30).status == "started"
    assert ledger.finish(aid, member, b"result", output_tokens=7).status == "recorded"


def complete_group(ledger: Ledger, admission) -> None:
    for m in range(len(admission.attempt_ids)):
        run_member(ledger, admission, m)


# -- reference cases --------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["sample", "group"])
def test_g8_128_slots_refill_admits_17th_group_only_in_sample_mode(make_ledger, mode):
    fields = {"group_size": 8, "batch_size": 16, "max_staleness": 2}
    if mode == "sample":
        fields["max_concurrent_samples"] = 128
    else:
        fields["max_concurrent_rollouts"] = 16
    ledger = make_ledger(**fields)
    ledger.submit(trivial_prompts(20))
    groups = admit_groups(ledger, 16)
    assert ledger.admit().reason == "capacity"
    for g in groups[:8]:
        run_member(ledger, g, 3)
    seventeenth = ledger.admit()
    if mode == "sample":
        assert seventeenth.status == "admitted"
        assert ledger.counters()["reserved"] == 128
    else:
        assert (seventeenth.status, seventeenth.reason) == ("blocked", "capacity")
        complete_group(ledger, groups[8])
        assert ledger.admit().status == "admitted"


def test_partial_groups_cannot_bypass_the_staleness_budget(make_ledger):
    # budget: (max_staleness + version + 1) * B = (0 + 0 + 1) * 4 = 4 groups of 12
    ledger = make_ledger(group_size=12, batch_size=4, max_staleness=0, max_concurrent_samples=48)
    ledger.submit(trivial_prompts(5))
    groups = admit_groups(ledger, 4)
    for g in groups:
        for m in range(3):
            run_member(ledger, g, m)
    assert ledger.counters()["reserved"] == 36  # 12 slots free: capacity alone would admit
    refused = ledger.admit()
    assert (refused.status, refused.reason) == ("blocked", "staleness")


def test_a_whole_next_group_must_fit(make_ledger):
    four = make_ledger(group_size=4, max_concurrent_samples=6)
    three = make_ledger(group_size=3, max_concurrent_samples=6)
    four.submit(trivial_prompts(2))
    first = admit_groups(four, 1)[0]
    assert (three.admit().status, three.admit().reason) == ("blocked", "capacity")
    run_member(four, first, 0)
    assert three.admit().status == "admitted"
    assert three.counters()["reserved"] == 6


def test_duplicates_wrong_ids_bad_members_and_superseded_attempts_are_ignored(make_ledger):
    ledger = make_ledger(group_size=2, max_concurrent_samples=8)
    ledger.submit(trivial_prompts(1))
    g = admit_groups(ledger, 1)[0]
    a0, a1 = g.attempt_ids
    assert ledger.start(a0, "w", "r", "b", 30).status == "started"
    assert ledger.progress(a0, "w", 1, 30, 5).status == "ok"
    assert ledger.finish(a0, 0, b"x", output_tokens=3).status == "recorded"
    assert ledger.start(a1, "w", "r", "b", 30).status == "started"
    assert ledger.mark_doubtful(a1, "lease_expired").status == "doubtful"
    retried = ledger.retry(a1, cause="replica_restart")
    assert retried.status == "retried"

    before = ledger_counters(ledger)
    ignored_before = ledger.counters().get("ignored", 0)
    cases = {
        "duplicate progress": ledger.progress(a0, "w", 1, 30, 5),
        "duplicate result": ledger.finish(a0, 0, b"x", output_tokens=3),
        "wrong attempt id": ledger.finish("nosuchattempt", 0, b"x"),
        "member out of range": ledger.finish(a1, 7, b"x"),
        "superseded attempt": ledger.finish(a1, 1, b"late", output_tokens=9),
        "superseded progress": ledger.progress(a1, "w", 5, 30, 5),
        "start of superseded": ledger.start(a1, "w", "r", "b", 30),
    }
    for name, answer in cases.items():
        assert answer.status == "ignored", name
    assert cases["duplicate result"].reason == "duplicate result"
    assert cases["wrong attempt id"].reason == "unknown attempt"
    assert cases["member out of range"].reason == "member mismatch"
    assert cases["superseded attempt"].reason == "superseded attempt"
    assert ledger_counters(ledger) == before
    assert ledger.counters()["ignored"] == ignored_before + len(cases)
    assert ledger.result(g.group_id, 1) is None


def test_doubtful_attempt_keeps_its_slot_until_a_late_completion_counted_once(make_ledger):
    ledger = make_ledger(group_size=2, max_concurrent_samples=2)
    ledger.submit(trivial_prompts(2))
    g = admit_groups(ledger, 1)[0]
    aid = g.attempt_ids[0]
    ledger.start(aid, "w", "r", "b", 30)
    assert ledger.mark_doubtful(aid, "lease_expired").status == "doubtful"
    c = ledger.counters()
    assert (c["reserved"], c["doubtful"], c["running"]) == (2, 1, 0)
    assert ledger.admit().reason == "capacity"  # no slot came back
    assert ledger.finish(aid, 0, b"late", output_tokens=4).status == "recorded"
    assert ledger.finish(aid, 0, b"late", output_tokens=4).status == "ignored"
    c = ledger.counters()
    assert (c["reserved"], c["doubtful"], c["finished"], c["output_tokens"]) == (1, 0, 1, 4)


def test_doubtful_attempt_keeps_its_slot_until_a_confirmed_stop_then_retries_in_it(make_ledger):
    ledger = make_ledger(group_size=2, max_concurrent_samples=2, max_attempts=3)
    ledger.submit(trivial_prompts(2))
    g = admit_groups(ledger, 1)[0]
    aid = g.attempt_ids[1]
    ledger.start(aid, "w", "r", "b", 30)
    ledger.mark_doubtful(aid, "worker_lost")
    # a doubt alone starts nothing: no new attempt in the outbox beyond the first two
    assert ledger.client.llen(ledger.keys.outbox) == 2
    retried = ledger.retry(aid, cause="replica_restart")
    assert retried.status == "retried"
    new = retried.attempt_id
    current_id, current = ledger.current_attempt(g.group_id, 1)
    assert current_id == new and current.number == 2 and current.stops == 1
    assert current.member == 1  # same member: same seed (I7)
    assert ledger.attempt(aid).state == "stopped"
    assert ledger.counters()["reserved"] == 2  # the slot moved, it was not released
    assert ledger.client.lrange(ledger.keys.outbox, -1, -1) == [f"{new}@".encode()]
    assert ledger.counters()["retries:replica_restart"] == 1


def test_rejected_group_gives_its_staleness_budget_back_an_accepted_one_does_not(make_ledger):
    ledger = make_ledger(group_size=2, batch_size=1, max_staleness=1, max_concurrent_samples=100)
    ledger.submit(trivial_prompts(4))
    a, b = admit_groups(ledger, 2)
    assert ledger.admit().reason == "staleness"  # budget (1 + 0 + 1) * 1 = 2
    complete_group(ledger, a)
    assert ledger.judge(a.group_id, accept=True).status == "accepted"
    assert ledger.admit().reason == "staleness"  # accepted keeps its budget
    complete_group(ledger, b)
    assert ledger.judge(b.group_id, accept=False, reason="zero_variance").status == "rejected"
    assert ledger.admit().status == "admitted"  # the rejected group's budget came back
    c = ledger.counters()
    assert (c["accepted"], c["rejected"], c["rejected:zero_variance"]) == (1, 1, 1)
    assert ledger.result(b.group_id, 0) is None  # rejected detail purged


# -- other operations -------------------------------------------------------------------


def test_attempt_ids_are_rq_safe_and_unique(make_ledger):
    ledger = make_ledger(group_size=8, max_concurrent_samples=64)
    ledger.submit([("weird:id/with spaces", b"{}"), *trivial_prompts(7)])
    ids = [aid for a in admit_groups(ledger, 8) for aid in a.attempt_ids]
    assert len(set(ids)) == 64
    assert all(re.fullmatch(r"[A-Za-z0-9_-]+", aid) for aid in ids)


def test_group_mode_releases_slots_only_when_the_group_completes(make_ledger):
    ledger = make_ledger(group_size=3, max_concurrent_rollouts=2)
    ledger.submit(trivial_prompts(3))
    g, _ = admit_groups(ledger, 2)
    run_member(ledger, g, 0)
    run_member(ledger, g, 1)
    assert ledger.counters()["reserved"] == 6
    run_member(ledger, g, 2)
    assert ledger.counters()["reserved"] == 3
    entries = ledger.client.xrange(ledger.keys.events)
    assert [e[1][b"group"] for e in entries] == [g.group_id.encode()]


def test_sample_mode_releases_each_slot_at_once(make_ledger):
    ledger = make_ledger(group_size=3, max_concurrent_samples=6)
    ledger.submit(trivial_prompts(1))
    g = admit_groups(ledger, 1)[0]
    run_member(ledger, g, 0)
    assert ledger.counters()["reserved"] == 2


def test_episode_fails_after_max_attempts_and_the_group_still_completes(make_ledger):
    ledger = make_ledger(group_size=2, max_concurrent_samples=4, max_attempts=2)
    ledger.submit(trivial_prompts(1))
    g = admit_groups(ledger, 1)[0]
    run_member(ledger, g, 0)
    aid = g.attempt_ids[1]
    ledger.start(aid, "w", "r", "b", 30)
    aid = ledger.retry(aid, cause="generate_error").attempt_id
    ledger.start(aid, "w", "r", "b", 30)
    final = ledger.retry(aid, cause="generate_error")
    assert (final.status, final.group_complete) == ("failed", True)
    assert ledger.attempt(aid).state == "failed" and ledger.attempt(aid).resolution == "stopped"
    assert examine(ledger.client, ledger.keys, ledger.rollout.batch_size).ok
    c = ledger.counters()
    assert (c["failed"], c["finished"], c["reserved"]) == (1, 1, 0)
    assert ledger.group(g.group_id).failed == 1


def test_doubt_timeout_declares_lost_and_a_late_result_is_then_ignored(make_ledger, clock):
    ledger = make_ledger(group_size=1, max_concurrent_samples=1)
    ledger.submit(trivial_prompts(1))
    aid = admit_groups(ledger, 1)[0].attempt_ids[0]
    ledger.start(aid, "w", "r", "b", 30)
    ledger.mark_doubtful(aid, "lease_expired")
    clock.advance(100)
    early = ledger.retry(aid, cause="doubt_timeout", resolution="lost", doubt_s=1800)
    assert (early.status, early.reason) == ("ignored", "doubt too recent")
    clock.advance(1800)
    lost = ledger.retry(aid, cause="doubt_timeout", resolution="lost", doubt_s=1800)
    assert lost.status == "retried"
    assert ledger.finish(aid, 0, b"late").reason == "superseded attempt"
    assert ledger.attempt(aid).state == "lost"
    assert ledger.counters()["reserved"] == 1


def test_progress_renews_the_lease_and_revives_a_doubtful_attempt(make_ledger, clock):
    ledger = make_ledger(group_size=1, max_concurrent_samples=1)
    ledger.submit(trivial_prompts(1))
    aid = admit_groups(ledger, 1)[0].attempt_ids[0]
    ledger.start(aid, "w", "r", "b", 30)
    clock.advance(20)
    assert ledger.progress(aid, "w", 1, 30, 10).status == "ok"
    assert ledger.client.zscore(ledger.keys.leases, aid) == pytest.approx(clock.now + 30)
    assert ledger.progress(aid, "other-worker", 2, 30, 10).reason == "wrong worker"
    ledger.mark_doubtful(aid, "lease_expired")
    assert ledger.progress(aid, "w", 2, 30, 11).status == "revived"
    c = ledger.counters()
    assert (c["running"], c["doubtful"]) == (1, 0)


def test_a_holder_s_renewal_of_an_unchanged_attempt_leaves_its_record_and_its_lease_follows_the_holder_s(  # noqa: E501
        make_ledger, clock):
    ledger = make_ledger(group_size=2, max_concurrent_samples=2)
    ledger.submit(trivial_prompts(1))
    a, b = admit_groups(ledger, 1)[0].attempt_ids
    for aid in (a, b):
        assert ledger.start(aid, "w", "r", "boot", 30, holder="w/p1").status == "started"
    assert ledger.attempt(a).holder == "w/p1"
    record = ledger.client.hget(ledger.keys.attempts, a)
    t0 = clock.now
    clock.advance(5)  # 25 s of a's lease left: nothing written
    assert ledger.renew("w", 30, [Renewal(a, 1, changed=False)], holder="w/p1")[0].status == "ok"
    assert ledger.client.zscore(ledger.keys.leases, a) == pytest.approx(t0 + 30)
    clock.advance(15)  # 10 s left, under two thirds of a lease: the lease alone renewed
    answers = ledger.renew("w", 30, [Renewal(a, 2, changed=False),
                                     Renewal(b, 1, tokens=9, changed=True)], holder="w/p1")
    assert [x.status for x in answers] == ["ok", "ok"]
    assert ledger.client.hget(ledger.keys.attempts, a) == record  # its record untouched
    assert ledger.client.zscore(ledger.keys.leases, a) == pytest.approx(clock.now + 30)
    assert ledger.attempt(b).tokens == 9  # a change is recorded, its lease renewed
    assert ledger.client.zscore(ledger.keys.leases, b) == pytest.approx(clock.now + 30)
    assert ledger.client.zscore(ledger.keys.holders, "w/p1") == pytest.approx(clock.now + 30)
    clock.advance(25)  # the process renews its own lease and reports no attempt
    ledger.renew("w", 30, [], holder="w/p1")
    clock.advance(10)  # both attempts' leases ran out; the holder's has 20 s to go
    assert ledger.expire_leases() == []
    for aid in (a, b):
        assert ledger.client.zscore(ledger.keys.leases, aid) == pytest.approx(clock.now + 20)
    clock.advance(21)  # the holder renewed nothing: both leases run out
    assert sorted(ledger.expire_leases()) == sorted([a, b])
    assert ledger.attempt(a).cause == "lease_expired"
    assert ledger.client.zscore(ledger.keys.holders, "w/p1") is None
    # the holder reports again: an attempt in doubt is revived, however unchanged
    assert ledger.renew("w", 30, [Renewal(a, 3, changed=False)],
                        holder="w/p1")[0].status == "revived"
    assert ledger.client.zscore(ledger.keys.leases, a) == pytest.approx(clock.now + 30)
    assert ledger.counters()["doubtful"] == 1 and examine(ledger.client, ledger.keys,
                                                              ledger.rollout.batch_size).ok


@pytest.mark.parametrize("holder", ["w-gpu0/0a1b", 'w "odd" \\ name/0a1b'])
def test_an_expired_lease_follows_its_holder_s_whatever_the_holder_s_name(make_ledger, clock,
                                                                          holder):
    ledger = make_ledger(group_size=1, max_concurrent_samples=1)
    ledger.submit(trivial_prompts(1))
    aid = admit_groups(ledger, 1)[0].attempt_ids[0]
    ledger.start(aid, "w", "r", "b", 30, holder=holder)
    clock.advance(29)
    ledger.renew("w", 30, [], holder=holder)
    clock.advance(2)
    assert ledger.expire_leases() == []
    assert ledger.client.zscore(ledger.keys.leases, aid) == pytest.approx(clock.now + 28)


def test_an_attempt_without_a_holder_expires_with_its_own_lease(make_ledger, clock):
    ledger = make_ledger(group_size=1, max_concurrent_samples=1)
    ledger.submit(trivial_prompts(1))
    aid = admit_groups(ledger, 1)[0].attempt_ids[0]
    ledger.start(aid, "w", "r", "b", 30)
    ledger.renew("w", 30, [], holder="w/p1")  # some process's lease, not this attempt's
    clock.advance(31)
    ledger.renew("w", 30, [], holder="w/p1")
    assert ledger.expire_leases() == [aid]


def test_the_lease_sweep_takes_every_expired_lease_in_calls_of_a_few(make_ledger, clock):
    ledger = make_ledger(group_size=5, max_concurrent_samples=5)
    ledger.submit(trivial_prompts(1))
    aids = admit_groups(ledger, 1)[0].attempt_ids
    for aid in aids:
        ledger.start(aid, "w", "r", "b", 30, holder="w/p1")
    ledger.client.zadd(ledger.keys.leases, {"no-such-attempt": 1.0})  # a stale entry
    clock.advance(31)
    assert sorted(ledger.expire_leases(most=2)) == sorted(aids)
    assert ledger.client.zcard(ledger.keys.leases) == 0


def test_start_claims_an_attempt_once(make_ledger):
    ledger = make_ledger(group_size=1, max_concurrent_samples=1)
    ledger.submit(trivial_prompts(1))
    aid = admit_groups(ledger, 1)[0].attempt_ids[0]
    assert ledger.start(aid, "w1", "r", "b", 30).status == "started"
    second = ledger.start(aid, "w2", "r", "b", 30)  # the same RQ job run twice
    assert (second.status, second.reason) == ("ignored", "attempt is running")
    assert ledger.counters()["running"] == 1


def test_pop_batch_hands_out_exactly_b_groups_once_and_redelivers_until_ack(make_ledger):
    ledger = make_ledger(group_size=1, batch_size=2, max_concurrent_samples=10)
    ledger.submit(trivial_prompts(5))
    groups = admit_groups(ledger, 5)
    for g in groups[:3]:
        complete_group(ledger, g)
        ledger.judge(g.group_id, accept=True)
    first = ledger.pop_batch("trainer-0")
    assert first is not None and len(first.batch.groups) == 2 and not first.redelivered
    again = ledger.pop_batch("trainer-0")
    assert again.redelivered and again.batch == first.batch
    assert ledger.pop_batch("trainer-1") is None  # one ready group is not a batch
    assert ledger.ack("trainer-0", "not-the-batch").status == "ignored"
    assert ledger.ack("trainer-0", first.batch.id).status == "acked"
    assert ledger.counters()["consumed"] == 2
    complete_group(ledger, groups[3])
    ledger.judge(groups[3].group_id, accept=True)
    second = ledger.pop_batch("trainer-0")
    assert set(second.batch.groups).isdisjoint(first.batch.groups)
    assert ledger.group(first.batch.groups[0]).state == "consumed"
    assert ledger.result(first.batch.groups[0], 0) is None  # purged after ack


def test_the_rollout_interval_leaves_the_training_pause_out(make_ledger, r, clock):
    """Each delivery after the first observes the batch interval and the rollout
    interval: from the later of the last delivery and the last resume, to now or to the
    pause the farm sits in."""
    ledger = make_ledger(group_size=1, batch_size=1, max_concurrent_samples=10,
                         max_staleness=4)
    ledger.submit(trivial_prompts(4))
    groups = admit_groups(ledger, 4)

    def deliver(after_s: float) -> None:
        clock.advance(after_s)
        group = groups.pop(0)
        complete_group(ledger, group)
        assert ledger.judge(group.group_id, accept=True).status == "accepted"
        delivery = ledger.pop_batch("t")
        assert delivery is not None and ledger.ack("t", delivery.batch.id).status == "acked"

    def observed(kind: bytes) -> list[float]:
        return [float(f[b"v"]) for _, f in r.xrange(ledger.keys.observations)
                if f[b"k"] == kind]

    deliver(5)  # the first: nothing to measure from
    ledger.set_paused(True)
    clock.advance(30)  # training
    ledger.set_paused(False)
    deliver(7)  # 37 s after the last batch, 7 s of it generating
    assert ledger.set_paused(False) is False  # a resume without a pause moves nothing
    deliver(4)  # no pause in between: the batch interval
    clock.advance(6)
    ledger.set_paused(True)  # delivered while paused: generation stopped 6 s in
    deliver(20)
    assert observed(b"batch_interval_s") == [37, 4, 26]
    assert observed(b"rollout_interval_s") == [7, 4, 6]


def test_judge_acknowledges_the_stream_entry_and_judges_once(make_ledger, r):
    ledger = make_ledger(group_size=1, max_concurrent_samples=4)
    r.xgroup_create(ledger.keys.events, EVENTS_GROUP, id="0", mkstream=True)
    ledger.submit(trivial_prompts(1))
    complete_group(ledger, admit_groups(ledger, 1)[0])
    [(_, [(entry_id, fields)])] = r.xreadgroup(EVENTS_GROUP, "c1", {ledger.keys.events: ">"})
    gid = fields[b"group"].decode()
    assert r.xpending(ledger.keys.events, EVENTS_GROUP)["pending"] == 1
    assert ledger.judge(gid, accept=True, entry_id=entry_id.decode()).status == "accepted"
    assert r.xpending(ledger.keys.events, EVENTS_GROUP)["pending"] == 0
    assert ledger.judge(gid, accept=True).status == "ignored"
    assert ledger.counters()["accepted"] == 1


def consume_one_batch(ledger: Ledger, admission) -> None:
    """Run a group through, judge it, deliver and acknowledge it (B = 1)."""
    complete_group(ledger, admission)
    assert ledger.judge(admission.group_id, accept=True).status == "accepted"
    delivery = ledger.pop_batch("t")
    assert delivery is not None
    assert ledger.ack("t", delivery.batch.id).status == "acked"


def test_pause_blocks_admission_and_a_consumed_batch_widens_the_budget(make_ledger):
    ledger = make_ledger(group_size=1, batch_size=1, max_staleness=0, max_concurrent_samples=9)
    ledger.submit(trivial_prompts(3))
    assert ledger.set_paused(True) is False
    assert ledger.admit().reason == "paused"
    assert ledger.set_paused(False) is True
    [first] = admit_groups(ledger, 1)
    assert ledger.admit().reason == "staleness"
    consume_one_batch(ledger, first)
    assert ledger.set_version(1) == 0
    assert ledger.budget_baseline() == 0  # one batch per version: the budget as it was
    assert ledger.admit().status == "admitted"
    with pytest.raises(ValueError):
        ledger.set_version(-1)


@pytest.mark.parametrize("mode", ["sample", "group"])
def test_a_version_jump_up_admits_no_burst(make_ledger, mode):
    """A trainer resuming from a checkpoint at version 10 against a fresh farm: the
    budget stays (max_staleness + 1) * B groups ahead of what it has consumed."""
    cap = {"max_concurrent_samples": 50} if mode == "sample" else {"max_concurrent_rollouts": 50}
    ledger = make_ledger(group_size=1, batch_size=1, max_staleness=2, **cap)
    ledger.submit(trivial_prompts(20))
    assert ledger.set_version(10) == 0
    assert ledger.budget_baseline() == -10  # accepted counts as 10 * B
    admitted = admit_groups(ledger, 3)
    assert ledger.admit().reason == "staleness"
    consume_one_batch(ledger, admitted[0])
    ledger.set_version(11)
    assert ledger.budget_baseline() == -10
    admit_groups(ledger, 1)
    assert ledger.admit().reason == "staleness"
    assert ledger.counters()["accepted"] == 1  # the counter counts real groups


def test_a_rollback_admits_again_at_once(make_ledger):
    """A farm run to version 20, then set back to 10: admission resumes, up to
    (max_staleness + 1) * B groups ahead, instead of waiting for version 20 again."""
    ledger = make_ledger(group_size=1, batch_size=1, max_staleness=2, max_concurrent_samples=50)
    ledger.submit(trivial_prompts(30))
    for v in range(1, 21):
        consume_one_batch(ledger, admit_groups(ledger, 1)[0])
        ledger.set_version(v)
    assert ledger.budget_baseline() == 0
    assert ledger.set_version(10) == 20
    assert ledger.budget_baseline() == 10  # 20 consumed count as 10 * B
    admit_groups(ledger, 3)
    assert ledger.admit().reason == "staleness"
    assert examine(ledger.client, ledger.keys, ledger.rollout.batch_size).ok


def test_doctor_finds_and_repairs_a_baseline_out_of_range(make_ledger):
    ledger = make_ledger(group_size=1, batch_size=2, max_concurrent_samples=4)
    ledger.set_version(3)
    assert ledger.budget_baseline() == -6
    ledger.client.hset(ledger.keys.state, "version", 5)  # set behind the script's back
    report = examine(ledger.client, ledger.keys, 2)
    assert [p for p in report.problems if p.startswith("budget_baseline")], report.problems
    repair(ledger.client, ledger.keys, 2)
    assert ledger.budget_baseline() == -10
    assert examine(ledger.client, ledger.keys, 2).ok


def test_submit_is_all_or_nothing_on_duplicates(make_ledger):
    ledger = make_ledger(group_size=1, max_concurrent_samples=1)
    assert ledger.submit(trivial_prompts(2)).status == "submitted"
    dup = ledger.submit([("new", b"{}"), ("p1", b"{}")])
    assert (dup.status, dup.duplicates) == ("duplicate", ("p1",))
    assert ledger.client.llen(ledger.keys.pending) == 2
    admit_groups(ledger, 1)  # p0 admitted: still known to the farm
    assert ledger.submit([("p0", b"{}")]).status == "duplicate"


def test_farms_on_one_redis_do_not_share_capacity(make_ledger):
    a = make_ledger("farm-a", group_size=2, max_concurrent_samples=2)
    b = make_ledger("farm-b", group_size=2, max_concurrent_samples=2)
    a.submit(trivial_prompts(2))
    b.submit(trivial_prompts(2))
    assert a.admit().status == "admitted" and b.admit().status == "admitted"
    assert a.admit().reason == "capacity"


def test_an_id_given_twice_in_one_submission_refuses_it_whole(make_ledger):
    ledger = make_ledger(group_size=1, max_concurrent_samples=1)
    dup = ledger.submit([("a", b"{}"), ("b", b"{}"), ("a", b"{}")])
    assert (dup.status, dup.duplicates) == ("duplicate", ("a",))
    assert ledger.client.llen(ledger.keys.pending) == 0
    assert ledger.counters().get("submitted", 0) == 0


def test_script_errors_write_nothing(make_ledger, r):
    ledger = make_ledger(group_size=1, max_concurrent_samples=4)
    ledger.submit(trivial_prompts(2))
    aid = ledger.admit().attempt_ids[0]
    ledger.start(aid, "w", "r", "b", 30)
    ledger.finish(aid, 0, b"x")
    before = ledger.counters()
    scripts = ledger._scripts
    k = ledger.keys
    with pytest.raises(redis.ResponseError, match="verdict"):
        scripts.call("judge", [k.counters, k.groups, k.ready, k.events, k.prompts,
                               k.attempts, k.results, k.history],
                     [1, "p0", "maybe", "", "g", "", ""])
    # an attempt id that already exists: admit refuses before popping the prompt
    taken = ledger.client.hkeys(k.attempts)[0].decode()
    with pytest.raises(redis.ResponseError, match="already exists"):
        scripts.call("admit", [k.counters, k.state, k.pending, k.groups, k.attempts, k.outbox,
                               k.replica_free, k.replica_load, k.placed, k.refusals,
                               k.history, k.history_index],
                     [1, 1, 16, 4, 2, "sample", "any", 10, 60, taken])
    assert ledger.counters() == before
    assert r.lrange(k.pending, 0, -1) == [b"p1"]
    assert ledger.judge("p0", accept=True).status == "accepted"
    assert ledger.counters()["in_flight"] == 0


def test_leases_held_counts_the_attempts_running(make_ledger):
    ledger = make_ledger(group_size=2, max_concurrent_samples=4)
    ledger.submit(trivial_prompts(1))
    g = admit_groups(ledger, 1)[0]
    assert ledger.leases_held() == 0
    run_member(ledger, g, 0)  # started and finished: its lease is gone
    assert ledger.start(g.attempt_ids[1], "w", "r0", "boot0", 30).status == "started"
    assert ledger.leases_held() == 1
