"""farm_status and its text: the Redis lines, for users that may and may not run INFO."""

from __future__ import annotations

import redis

from queue_rollout.config import Config, FarmConfig
from queue_rollout.ledger.status import farm_status, format_status


def test_status_names_the_primary_and_holds_when_replicas_are_short(r: redis.Redis) -> None:
    config = Config(farm=FarmConfig(name="t", redis_wait_replicas=1))
    s = farm_status(r, config, redis_url="x")
    port = r.connection_pool.connection_kwargs["port"]
    assert s["redis_primary"] == f"127.0.0.1:{port}"
    assert (s["redis_replicas"], s["redis_wait_replicas"]) == (0, 1)
    text = format_status(s)
    assert "0 replica(s) online, changes wait for 1" in text
    assert "HOLDING   0 of farm.redis_wait_replicas = 1" in text


def test_a_user_that_may_not_run_info_sees_replicas_unknown_and_no_hold(
        r: redis.Redis, redis_url: str) -> None:
    r.acl_setuser("noinfo", enabled=True, passwords=["+pw"], keys=["*"], channels=["*"],
                  commands=["+@all", "-info"])
    try:
        kw = r.connection_pool.connection_kwargs
        with redis.Redis(host=kw["host"], port=kw["port"], username="noinfo",
                         password="pw") as limited:
            config = Config(farm=FarmConfig(name="t", redis_wait_replicas=1))
            s = farm_status(limited, config, redis_url="x")
        assert s["redis_replicas"] is None
        text = format_status(s)
        assert "replicas unknown (this Redis user may not run INFO)" in text
        assert "HOLDING" not in text
    finally:
        r.acl_deluser("noinfo")


def test_a_farm_that_places_groups_shows_what_placement_did(r: redis.Redis, clock) -> None:
    from queue_rollout.config import RolloutConfig
    from queue_rollout.ledger.core import Ledger
    from testkit import trivial_prompts

    rollout = RolloutConfig(group_size=2, max_concurrent_samples=8, placement="group")
    config = Config(farm=FarmConfig(name="t"), rollout=rollout)
    ledger = Ledger(r, "t", rollout, clock=clock)
    ledger.submit(trivial_prompts(3))
    ledger.set_replicas({"a": 2, "b": 1})
    assert ledger.admit().status == "admitted"  # on a
    assert ledger.admit().reason == "placement"  # one free slot left in all
    s = farm_status(r, config, redis_url="x")
    assert s["placement"] == {"mode": "group", "one_replica": 1, "split": 0, "moved": 0,
                              "blocked": 1}
    assert ("placement groups: 1 on one replica, 0 split; 0 attempts moved to the shared "
            "queue; 1 admissions waited for free slots on the replicas") in format_status(s)
    unplaced = farm_status(r, Config(farm=FarmConfig(name="t")), redis_url="x")
    assert "placement groups" not in format_status(unplaced)


def test_each_worker_s_limit_is_shown_and_auto_capacity_is_their_sum(r: redis.Redis) -> None:
    from queue_rollout.config import RolloutConfig
    from queue_rollout.ledger.keys import Keys
    from queue_rollout.ledger.registry import Registry

    config = Config(farm=FarmConfig(name="t"),
                    rollout=RolloutConfig(max_concurrent_samples="auto"))
    registry = Registry(r, Keys("t"), config.timeouts.lease)
    registry.register("n1-gpu0", {"slots": 16})
    registry.register("n1-gpu1", {"slots": 16})
    same = farm_status(r, config, redis_url="x")
    assert same["workers"]["limits"] == {"n1-gpu0": 16, "n1-gpu1": 16}
    assert "workers   2 alive, 32 slots\n" in format_status(same)  # no range when equal
    registry.register("n1-gpu1", {"slots": 5})  # its limit fell
    s = farm_status(r, config, redis_url="x")
    assert s["workers"] == {"alive": 2, "slots": 21, "limits": {"n1-gpu0": 16, "n1-gpu1": 5}}
    assert s["capacity"] == 21
    assert "workers   2 alive, 21 slots (limits 5 to 16 per worker)" in format_status(s)


def test_status_says_who_leads_what_is_held_and_why_admission_waits(r: redis.Redis,
                                                                     clock) -> None:
    from queue_rollout.config import RolloutConfig, TimeoutsConfig
    from queue_rollout.ledger.core import Ledger
    from testkit import trivial_prompts

    rollout = RolloutConfig(group_size=2, batch_size=1, max_concurrent_samples=2)
    config = Config(farm=FarmConfig(name="t"), rollout=rollout,
                    timeouts=TimeoutsConfig(leader_lease=10))
    ledger = Ledger(r, "t", rollout, clock=clock)

    def status() -> dict:
        return farm_status(r, config, redis_url="x", now=clock())

    assert status()["collector"] == {"leader": None, "lease_age_s": None}
    assert "collector NONE leads" in format_status(status(), clock())
    assert ledger.lead("c1", 10)[0]
    clock.advance(4)
    assert status()["collector"] == {"leader": "c1", "lease_age_s": 4.0}
    ledger.submit(trivial_prompts(3))
    a = ledger.admit()
    for m, aid in enumerate(a.attempt_ids):
        assert ledger.start(aid, "w", "r0", "boot0", 30).status == "started"
        assert ledger.finish(aid, m, b"x", output_tokens=1).status == "recorded"
    assert ledger.judge(a.group_id, accept=True).status == "accepted"
    assert ledger.admit().status == "admitted"  # its slots: all there are
    for _ in range(3):
        assert ledger.admit().reason == "capacity"
    delivery = ledger.pop_batch("trainer-0")
    assert delivery is not None
    clock.advance(7)  # the collector stopped renewing: its lease ran out
    s = status()
    assert s["collector"]["leader"] is None
    assert s["held"] == [{"batch": delivery.batch.id, "consumer": "trainer-0",
                          "since": clock() - 7, "groups": 1}]
    assert s["blocked"] == {"capacity": 3}
    text = format_status(s, clock())
    assert f"held      1 groups in 1 unacknowledged batch(es): {delivery.batch.id} by " \
           "trainer-0 for 7 s" in text
    assert "blocked   admission refused in the last minute: capacity 3" in text
    clock.advance(61)  # refusals older than a minute no longer count
    assert status()["blocked"] == {}
    assert "no admission refused in the last minute" in format_status(status(), clock())
