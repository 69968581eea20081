"""The worker registry, the trainer's controls and the workers' acknowledgements."""

from __future__ import annotations

import pytest
import redis

from queue_rollout.errors import RedisUnavailable
from queue_rollout.lab.virtual.clock import ManualClock
from queue_rollout.ledger.keys import Keys
from queue_rollout.ledger.registry import LIVE_LEASES, Ack, Registry


def test_a_worker_is_live_for_three_leases_after_its_last_report(r):
    clock = ManualClock()
    reg = Registry(r, Keys("reg"), lease_s=10, clock=clock)
    reg.register("h-gpu0", {"slots": 16, "gpu": 0})
    reg.register("h-gpu1", {"slots": 8, "gpu": 1})
    assert reg.slots(reg.live()) == 24
    clock.advance(LIVE_LEASES * 10 - 1)
    reg.seen("h-gpu1")
    clock.advance(2)  # gpu0 last reported 31 s ago: gone; gpu1 2 s ago
    assert list(reg.live()) == ["h-gpu1"] and reg.slots(reg.live()) == 8
    reg.deregister("h-gpu1")
    assert reg.live() == {} and r.hlen(Keys("reg").workers) == 1  # gpu0's record stays


def test_controls_read_the_pause_flag_and_the_weight_request_together(make_ledger, r):
    ledger = make_ledger("reg")
    reg = Registry(r, ledger.keys, lease_s=10)
    c = reg.controls()
    assert (c.paused, c.pause_epoch, c.weights_epoch, c.weights_path) == (False, 0, 0, "")
    epoch = ledger.pause("abort")
    assert reg.request_weights("/ckpt/step-3", 3) == 1
    assert reg.request_weights("/ckpt/step-4", 4) == 2
    c = reg.controls()
    assert (c.paused, c.pause_epoch, c.pause_mode) == (True, epoch, "abort")
    assert (c.weights_epoch, c.weights_path, c.weights_version) == (2, "/ckpt/step-4", "4")


def test_acknowledgements_round_trip_and_read_older_bare_epochs(r):
    reg = Registry(r, Keys("reg"), lease_s=10)
    reg.acknowledge("pause", "a", Ack(3))
    reg.acknowledge("weights", "a", Ack(2, "HTTP 500 load failed"))
    r.hset(Keys("reg").acks, "pause:old", "5")  # written by an earlier release
    acks = reg.acks("pause", ["a", "old", "silent"])
    assert acks == {"a": Ack(3), "old": Ack(5), "silent": None}
    [(_, ack)] = reg.acks("weights", ["a"]).items()
    assert not ack.ok and ack.error == "HTTP 500 load failed" and ack.epoch == 2
    assert Ack.decode(Ack(7, "x: y").encode().encode()) == Ack(7, "x: y")


def test_every_call_translates_a_lost_redis(tmp_path):
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    from queue_rollout.ledger.embedded import free_port

    gone = redis.Redis(port=free_port(), socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0))
    reg = Registry(gone, Keys("reg"), lease_s=10)
    for call in (reg.live, reg.controls, lambda: reg.seen("w"),
                 lambda: reg.register("w", {}), lambda: reg.deregister("w"),
                 lambda: reg.acks("pause", ["w"]), lambda: reg.request_weights("/p", 1),
                 lambda: reg.acknowledge("pause", "w", Ack(1))):
        with pytest.raises(RedisUnavailable):
            call()
