"""`queue-rollout doctor`: a corrupted counter fails it, --repair mends it."""

from __future__ import annotations

import pytest

from queue_rollout.cli.main import main
from queue_rollout.ledger.doctor import examine, repair
from testkit import trivial_prompts, write_farm


@pytest.fixture
def farm_toml(tmp_path, redis_url):
    return str(write_farm(tmp_path / "farm.toml", farm={"name": "t", "redis_url": redis_url},
                          rollout={"group_size": 2, "max_concurrent_samples": 8}))


def busy_ledger(make_ledger):
    ledger = make_ledger(group_size=2, batch_size=1, max_concurrent_samples=8)
    ledger.submit(trivial_prompts(4))
    a, b, c = (ledger.admit() for _ in range(3))
    ledger.start(a.attempt_ids[0], "w", "r", "b", 30)
    ledger.finish(a.attempt_ids[0], 0, b"x")
    ledger.start(a.attempt_ids[1], "w", "r", "b", 30)
    ledger.finish(a.attempt_ids[1], 1, b"x")
    ledger.judge(a.group_id, accept=True)
    ledger.start(b.attempt_ids[0], "w", "r", "b", 30)
    ledger.mark_doubtful(b.attempt_ids[0], "lease_expired")
    ledger.start(c.attempt_ids[1], "w", "r", "b", 30)
    return ledger


def test_doctor_passes_fails_on_a_corrupt_counter_and_repairs(make_ledger, farm_toml, capsys):
    ledger = busy_ledger(make_ledger)
    assert examine(ledger.client, ledger.keys, ledger.rollout.batch_size).ok
    assert main(["doctor", "-c", farm_toml]) == 0
    assert "doctor: ok (4 slots reserved, 2 groups in flight)" in capsys.readouterr().out

    ledger.client.hincrby(ledger.keys.counters, "reserved", 3)
    ledger.client.zrem(ledger.keys.leases, ledger.current_attempt("p2", 1)[0])
    assert main(["doctor", "-c", farm_toml]) == 1
    out = capsys.readouterr().out
    assert "reserved: stored 7, records say 4" in out
    assert "leases: holds 0 attempts, 1 are running" in out

    assert main(["doctor", "--repair", "-c", farm_toml]) == 0
    assert main(["doctor", "-c", farm_toml]) == 0
    assert ledger.counters()["reserved"] == 4
    assert ledger.client.zcard(ledger.keys.leases) == 1


def test_doctor_reports_negative_counters(make_ledger):
    ledger = busy_ledger(make_ledger)
    ledger.client.hset(ledger.keys.counters, "finished", -1)
    report = examine(ledger.client, ledger.keys, ledger.rollout.batch_size)
    assert "finished: negative (-1)" in report.problems


def test_doctor_finds_a_group_whose_done_count_disagrees_with_its_attempts(make_ledger):
    ledger = busy_ledger(make_ledger)
    raw = ledger.client.hget(ledger.keys.groups, "p1")
    ledger.client.hset(ledger.keys.groups, "p1", raw.replace(b'"done":0', b'"done":1'))
    problems = examine(ledger.client, ledger.keys, ledger.rollout.batch_size).problems
    assert "group p1: done 1, 0 members ended" in problems
    assert "reserved: stored 4, records say 3" in problems


def test_doctor_without_redis_exits_4_and_hides_the_password(tmp_path, capsys):
    path = write_farm(tmp_path / "farm.toml",
                      farm={"redis_url": "redis://user:hunter2@127.0.0.1:1/0"})
    assert main(["doctor", "-c", str(path)]) == 4
    err = capsys.readouterr().err
    assert "redis://user:***@127.0.0.1:1/0" in err and "hunter2" not in err


def test_doctor_finds_and_mends_records_that_disagree_with_each_other(make_ledger):
    ledger = busy_ledger(make_ledger)
    k, b = ledger.keys, ledger.rollout.batch_size
    # a result of a member whose attempt is still running (c's member 1)
    ledger.client.hset(k.results, "p2/1", b"stray")
    # a delivered group no batch holds: deliver p0, then lose the batch record
    delivery = ledger.pop_batch("t0")
    assert delivery is not None and delivery.batch.groups == ["p0"]
    held = ledger.client.hget(k.batches, "t0")
    ledger.client.hdel(k.batches, "t0")
    # and a consumer's batch that names a group that is not delivered (p1: in flight)
    ledger.client.hset(k.batches, "t1", held.replace(b'"p0"', b'"p1"'))
    report = examine(ledger.client, k, b)
    assert set(report.problems) >= {
        "result p2/1: no ended attempt stands for it",
        "group p0: delivered, but no batch holds it",
        f"batch {delivery.batch.id} of t1: group p1 is in_flight",
    }
    repair(ledger.client, k, b)
    assert examine(ledger.client, k, b).ok
    assert ledger.result("p2", 1) is None and ledger.result("p0", 0) == b"x"
    assert ledger.client.hget(k.batches, "t1") is None
    again = ledger.pop_batch("t0")  # p0 is delivered again, whole
    assert again is not None and again.batch.groups == ["p0"] and not again.redelivered
    assert ledger.ack("t0", again.batch.id).status == "acked"
    assert examine(ledger.client, k, b).ok
