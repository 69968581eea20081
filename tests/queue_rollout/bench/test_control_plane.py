"""`bench --profile control-plane`: no-op episodes through the farm and no-op jobs through
plain RQ, the same workers on both sides. (Its 0.8 target is a benchmark, not a test.)"""

from __future__ import annotations

import pytest

from queue_rollout.bench.control_plane import run_control_plane_bench, run_farm, run_plain
from queue_rollout.ledger.connection import connect
from queue_rollout.ledger.keys import Keys


@pytest.mark.bench
def test_both_sides_run_every_episode_and_the_ratio_is_their_rates(redis_server, tmp_path):
    lines: list[str] = []
    result = run_control_plane_bench(redis_server.url, workers=2, episodes=64, rounds=1,
                                     progress=lines.append)
    j = result.as_json()
    assert {"profile", "workers", "farm_episodes_per_s", "plain_rq_jobs_per_s",
            "ratio"} <= set(j)
    # at least one batch of 16 groups of 8 per run, 2 runs per side
    assert j["profile"] == "control-plane" and j["workers"] == 2 and j["episodes"] == 256
    assert abs(j["ratio"] - j["farm_episodes_per_s"] / j["plain_rq_jobs_per_s"]) < 0.01
    assert [line.split(":")[1].split()[0] for line in lines] == ["plain", "farm", "farm", "plain"]


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
