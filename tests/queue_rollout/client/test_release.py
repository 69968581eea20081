"""The trainer's view of a released batch: another client gets it redelivered, under
the version of its first delivery, and the gone client's late ack raises."""

from __future__ import annotations

import pytest

from queue_rollout import RolloutClient
from queue_rollout.collector.loop import Collector
from queue_rollout.errors import BadInput, BatchReleased
from queue_rollout.ledger.doctor import examine
from testkit import G2_B2, finish_all, write_farm


@pytest.fixture
def farm_toml(tmp_path, redis_url):
    return write_farm(tmp_path / "farm.toml", farm={"name": "tr", "redis_url": redis_url},
                      rollout=G2_B2)


def test_a_released_batch_is_trained_once_by_another_trainer(farm_toml):
    gone = RolloutClient.from_config(farm_toml, consumer="gone")
    gone.submit([{"id": f"q{i}", "prompt": "x", "member_lengths": [3, 3]} for i in range(4)])
    collector = Collector(gone.ledger, gone.config, name="c")
    collector.step()
    finish_all(gone)
    collector.step()
    first = gone.get_batch(timeout=5)
    assert not first.redelivered and first.version == 0
    gone.set_version(5)

    released = gone.ledger.release("gone")
    assert released is not None and released.id == first.id

    other = RolloutClient.from_config(farm_toml, consumer="other")
    again = other.get_batch(timeout=5)
    assert again.redelivered
    assert [g.id for g in again.groups] == [g.id for g in first.groups]
    assert again.version == 0  # the version of its first delivery
    assert again.groups[0].members[1].output_ids == [7, 8, 9]  # the results are all there

    with pytest.raises(BatchReleased, match="released"):
        gone.ack(first)
    assert gone.ledger.counters()["acks_refused"] == 1
    assert isinstance(BatchReleased("x"), BadInput)  # exit 2, caught as a refusal
    other.ack(again)
    counters = other.ledger.counters()
    assert counters["consumed"] == 2 and counters["acks_refused"] == 1
    assert examine(other.ledger.client, other.ledger.keys, 2).ok

    # the rest goes on as usual; no group is consumed twice
    collector.step()
    finish_all(gone)
    collector.step()
    rest = other.get_batch(timeout=5)
    assert not rest.redelivered and rest.version == 5
    assert {g.id for g in rest.groups}.isdisjoint(g.id for g in again.groups)
    other.ack(rest)
    assert other.ledger.counters()["consumed"] == 4
    assert examine(other.ledger.client, other.ledger.keys, 2).ok
