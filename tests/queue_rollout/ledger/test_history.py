"""The group history ``trace`` reads: what the scripts record of a group's life, the cap
on groups kept and their age, all on the ledger's clock (no sleeping)."""

from __future__ import annotations

import json

import pytest

from queue_rollout.config import HistoryConfig, RolloutConfig
from queue_rollout.errors import BadInput
from queue_rollout.ledger.core import Ledger
from queue_rollout.ledger.history import read_story, story_json, story_text
from testkit import trivial_prompts


def ledger_with(r, clock, *, max_groups: int = 10_000, ttl_s: int = 86_400, **rollout
                ) -> Ledger:
    fields = {"group_size": 1, "batch_size": 1, "max_concurrent_samples": 64,
              "max_staleness": 1000, **rollout}
    return Ledger(r, "h", RolloutConfig(**fields), clock=clock,  # type: ignore[arg-type]
                  history=HistoryConfig(max_groups=max_groups, ttl_s=ttl_s))


def admit_all(ledger: Ledger, clock) -> list[str]:
    gids = []
    while (a := ledger.admit()).status == "admitted":
        gids.append(a.group_id)
        clock.advance(1)
    return gids


def kept(ledger: Ledger) -> list[str]:
    k = ledger.keys
    index = [g.decode() for g in ledger.client.zrange(k.history_index, 0, -1)]
    assert sorted(index) == sorted(g.decode() for g in ledger.client.hkeys(k.history))
    return index


def test_the_last_max_groups_admitted_are_kept(r, clock):
    ledger = ledger_with(r, clock, max_groups=3)
    ledger.submit(trivial_prompts(5))
    for _ in range(5):
        clock.advance(1)
        ledger.admit()
    assert kept(ledger) == ["p2", "p3", "p4"]
    # a dropped group's later events bring no entry back
    (aid,) = ledger.group("p0").attempt_ids
    ledger.start(aid, "w", "rep", "boot", 30)
    assert ledger.finish(aid, 0, b"x").status == "recorded"
    assert kept(ledger) == ["p2", "p3", "p4"]
    with pytest.raises(BadInput, match=r"is not kept.*knows it as complete"):
        read_story(r, ledger.keys, "p0", ttl_s=86_400, now=clock())
    assert read_story(r, ledger.keys, "p4", ttl_s=86_400, now=clock()).group == "p4"


def test_a_lowered_cap_is_reached_within_a_few_admissions(r, clock):
    ledger = ledger_with(r, clock, max_groups=100)
    ledger.submit(trivial_prompts(30))
    for _ in range(25):
        ledger.admit()
        clock.advance(1)
    assert len(kept(ledger)) == 25
    lowered = ledger_with(r, clock, max_groups=2)
    lowered.admit()  # 26 kept, at most 8 beyond the cap leave per admission
    clock.advance(1)
    assert len(kept(ledger)) == 18
    assert admit_all(lowered, clock) == ["p26", "p27", "p28", "p29"]
    assert kept(ledger) == ["p28", "p29"]


def test_stories_older_than_ttl_leave_and_an_idle_history_expires(r, clock):
    ledger = ledger_with(r, clock, ttl_s=100)
    ledger.submit(trivial_prompts(4))
    ledger.admit()                 # p0 at t
    clock.advance(60)
    ledger.admit()                 # p1 at t + 60
    clock.advance(40)              # p0 is 100 s old now
    with pytest.raises(BadInput, match="is not kept"):
        read_story(r, ledger.keys, "p0", ttl_s=100, now=clock())
    assert read_story(r, ledger.keys, "p1", ttl_s=100, now=clock()).group == "p1"
    ledger.admit()                 # p2: the admission drops p0
    assert kept(ledger) == ["p1", "p2"]
    # the hash and the index live history.ttl_s after the last admission
    k = ledger.keys
    assert 0 < r.ttl(k.history) <= 100 and 0 < r.ttl(k.history_index) <= 100


def test_no_history_is_kept_with_max_groups_0(r, clock, redis_snapshot):
    ledger = ledger_with(r, clock, max_groups=0)
    ledger.submit(trivial_prompts(1))
    (aid,) = ledger.admit().attempt_ids
    ledger.start(aid, "w", "rep", "boot", 30)
    ledger.finish(aid, 0, b"x")
    ledger.judge("p0", accept=True)
    d = ledger.pop_batch("t")
    assert d is not None and ledger.ack("t", d.batch.id).status == "acked"
    k = ledger.keys
    assert not r.exists(k.history) and not r.exists(k.history_index)
    with pytest.raises(BadInput, match=r"is not kept.*knows it as consumed"):
        read_story(r, ledger.keys, "p0", ttl_s=86_400, now=clock())


def test_unknown_and_pending_groups_say_so(r, clock):
    ledger = ledger_with(r, clock)
    ledger.submit(trivial_prompts(1))
    with pytest.raises(BadInput, match="not admitted yet") as exc:
        read_story(r, ledger.keys, "p0", ttl_s=100, now=clock())
    assert exc.value.exit_code == 2
    with pytest.raises(BadInput, match="unknown to farm h"):
        read_story(r, ledger.keys, "nope", ttl_s=100, now=clock())


def test_a_group_s_whole_story(r, clock):
    """Admitted under version 2; member 0: doubted, reported again (revived), doubted
    again, stop confirmed, retried, its late result of the first attempt ignored, the
    second finished; member 1 finished; accepted, delivered, acknowledged. And a second
    group rejected with the rule's words."""
    ledger = ledger_with(r, clock, group_size=2, batch_size=1, max_attempts=3)
    ledger.set_version(2)
    ledger.submit(trivial_prompts(2))
    t0 = clock()
    a0, a1 = ledger.admit().attempt_ids
    clock.advance(1)
    ledger.start(a0, "w0", "http://r0", "boot0", 30)
    ledger.start(a1, "w1", "http://r1", "boot1", 30)
    clock.advance(1)
    ledger.mark_doubtful(a0, "lease_expired")
    clock.advance(1)
    assert ledger.progress(a0, "w0", 1, 30).status == "revived"
    clock.advance(1)
    ledger.mark_doubtful(a0, "worker_lost")
    clock.advance(1)
    retried = ledger.retry(a0, cause="worker_lost")
    b0 = retried.attempt_id
    assert ledger.finish(a0, 0, b"late").ignored  # superseded: no event
    clock.advance(1)
    ledger.start(b0, "w1", "http://r1", "boot1", 30)
    ledger.finish(a1, 1, b"x", output_tokens=3)
    clock.advance(2)
    ledger.finish(b0, 0, b"y")
    ledger.judge("p0", accept=True)
    clock.advance(1)
    d = ledger.pop_batch("trainer-0")
    assert d is not None
    clock.advance(1)
    ledger.ack("trainer-0", d.batch.id)

    story = read_story(r, ledger.keys, "p0", ttl_s=86_400, now=clock())
    assert (story.state, story.version, story.members, story.admitted_at) == (
        "consumed", 2, 2, t0)
    first, second, other = story.attempts
    assert (first.attempt, first.member, first.number, first.state) == (a0, 0, 1, "stopped")
    assert (first.worker, first.replica, first.started_at) == ("w0", "http://r0", t0 + 1)
    assert (first.ended_at, first.cause, first.retried_as) == (t0 + 5, "worker_lost", b0)
    assert [(d.since, d.cause, d.resolved_at, d.resolution) for d in first.doubts] == [
        (t0 + 2, "lease_expired", t0 + 3, "reported"),
        (t0 + 4, "worker_lost", t0 + 5, "stopped")]
    assert (second.attempt, second.number, second.state, second.worker) == (
        b0, 2, "finished", "w1")
    assert (second.started_at, second.ended_at, second.version) == (t0 + 6, t0 + 8, 2)
    assert (other.member, other.state, other.ended_at) == (1, "finished", t0 + 6)
    assert story.judged is not None and story.judged.accepted
    (delivery,) = story.deliveries
    assert (delivery.batch, delivery.consumer, delivery.version, delivery.at) == (
        d.batch.id, "trainer-0", 2, t0 + 9)
    assert story.acked is not None
    assert (story.acked.at, story.acked.consumer) == (t0 + 10, "trainer-0")
    text = story_text(story)
    for words in ("group p0: consumed", "under policy version 2",
                  f"attempt 1 {a0}: worker w0, replica http://r0",
                  f"retried as attempt 2 {b0}", "doubtful +2.000s (lease_expired), resolved "
                  "+3.000s: it reported again", "its stop was confirmed",
                  f"delivered  +9.000s in batch {d.batch.id} to consumer trainer-0",
                  "acked      +10.000s by consumer trainer-0"):
        assert words in text, (words, text)
    assert json.loads(story_json(story))["attempts"][0]["retried_as"] == b0

    # the second group: its member ends failed for good after a lost attempt, and the
    # rule rejects it
    (c0, c1) = ledger.admit().attempt_ids
    for aid in (c0, c1):
        ledger.start(aid, "w0", "http://r0", "boot0", 30)
    ledger.finish(c1, 1, b"x")
    ledger.mark_doubtful(c0, "lease_expired")
    clock.advance(10)
    assert ledger.retry(c0, cause="doubt_timeout", resolution="lost", doubt_s=5).status == "retried"
    (aid,) = [a for a, rec in ledger.member_attempts("p1", 0) if rec.state == "queued"]
    ledger.start(aid, "w0", "http://r0", "boot0", 30)
    ledger.finish(aid, 0, b"", outcome="failed", reason="oversized")
    ledger.judge("p1", accept=False, reason="failed_members",
                 detail="1 failed members > max_failed_members = 0")
    story = read_story(r, ledger.keys, "p1", ttl_s=86_400, now=clock())
    lost, failed, _ = story.attempts
    assert (lost.state, lost.resolution, lost.doubts[0].resolution) == ("lost", "lost", "lost")
    assert (failed.state, failed.failed_reason) == ("failed", "oversized")
    assert story.state == "rejected" and story.judged is not None
    assert (story.judged.accepted, story.judged.reason, story.judged.detail) == (
        False, "failed_members", "1 failed members > max_failed_members = 0")
    assert "rejected: failed_members (1 failed members > max_failed_members = 0)" in \
        story_text(story)


def test_a_running_attempt_is_read_from_its_live_record(r, clock):
    ledger = ledger_with(r, clock)
    ledger.submit(trivial_prompts(1))
    (aid,) = ledger.admit().attempt_ids
    clock.advance(1)
    ledger.start(aid, "w0", "http://r0", "boot0", 30)
    clock.advance(1)
    ledger.mark_doubtful(aid, "lease_expired")
    story = read_story(r, ledger.keys, "p0", ttl_s=86_400, now=clock())
    (a,) = story.attempts
    assert (a.state, a.worker, a.started_at, a.ended_at) == (
        "doubtful", "w0", story.admitted_at + 1, None)
    assert [(d.cause, d.resolution) for d in a.doubts] == [("lease_expired", None)]
    assert "doubtful now" in story_text(story) and "unresolved" in story_text(story)
