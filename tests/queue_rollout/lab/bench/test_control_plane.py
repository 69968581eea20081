"""`bench --profile control-plane`: no-op episodes through the farm and no-op jobs through
plain RQ, the same workers on both sides. (Its 0.8 target is a benchmark, not a test.)"""

from __future__ import annotations

import pytest

from queue_rollout.errors import BadInput
from queue_rollout.lab.bench.control_plane import (
    run_control_plane_bench,
    run_farm,
    run_plain,
    side_runs,
)
from queue_rollout.ledger.connection import connect
from queue_rollout.ledger.keys import Keys


@pytest.mark.bench
def test_both_sides_run_every_episode_and_the_ratio_is_their_rates(redis_server, tmp_path):
    lines: list[str] = []
    # 2 runs a side: 144 + 144 episodes, each 18 groups: a batch of 16 and 2 groups more
    result = run_control_plane_bench(redis_server.url, workers=2, episodes=288, rounds=1,
                                     progress=lines.append)
    j = result.as_json()
    assert {"profile", "workers", "farm_episodes_per_s", "plain_rq_jobs_per_s",
            "ratio"} <= set(j)
    assert j["profile"] == "control-plane" and j["workers"] == 2 and j["episodes"] == 288
    assert abs(j["ratio"] - j["farm_episodes_per_s"] / j["plain_rq_jobs_per_s"]) < 0.01
    assert [line.split(":")[1].split()[0] for line in lines] == ["plain", "farm", "farm", "plain"]
    assert [int(line.split(":")[1].split()[1]) for line in lines] == [144] * 4


def test_each_side_runs_exactly_the_episodes_asked_for():
    assert side_runs(8000) == [2000] * 4  # the default: no episode dropped
    assert side_runs(8008) == [2008, 2000, 2000, 2000]
    assert side_runs(64, rounds=1) == [32, 32]
    for episodes in (8000, 8008, 7680, 32, 4096 + 8 * 3):
        runs = side_runs(episodes)
        assert sum(runs) == episodes and all(r % 8 == 0 and r > 0 for r in runs)
        assert max(runs) - min(runs) <= 8
    for bad in (8001, 24, 0):  # not whole groups; fewer groups than runs
        with pytest.raises(BadInput, match="--episodes"):
            side_runs(bad)


@pytest.mark.bench
def test_a_farm_run_short_of_whole_batches_ends_when_its_groups_are_accepted(redis_server,
                                                                             tmp_path):
    assert isinstance(run_farm(redis_server.url, 2, 144, "t3", tmp_path), float)
    counters = connect(redis_server.url).hgetall(Keys("cp-t3").counters)
    assert int(counters[b"finished"]) == 144 and int(counters[b"accepted"]) == 18
    assert int(counters[b"consumed"]) == 16  # one batch; the 2 groups more wait, accepted


@pytest.mark.bench
def test_the_farm_side_runs_noop_episodes_through_the_ledger(redis_server, tmp_path):
    assert isinstance(run_farm(redis_server.url, 2, 128, "t1", tmp_path), float)
    counters = connect(redis_server.url).hgetall(Keys("cp-t1").counters)
    assert int(counters[b"finished"]) == 128 and int(counters[b"consumed"]) == 16
    assert int(counters.get(b"reserved", b"0")) == 0


def test_the_plain_side_waits_for_every_job(redis_server):
    from rq import Queue
    from rq.registry import FinishedJobRegistry
    from rq.serializers import JSONSerializer

    assert run_plain(redis_server.url, 2, 20, "t2") > 0
    queue = Queue("plain-t2", connection=connect(redis_server.url), serializer=JSONSerializer)
    assert FinishedJobRegistry(queue=queue).count == 20
