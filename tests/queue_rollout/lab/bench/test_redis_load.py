"""The redis-load bench: its arithmetic on made-up readings, and one small real run."""

from __future__ import annotations

import json

import pytest

from queue_rollout.lab.bench.redis_load import (
    RENEWAL_ROUNDS,
    RedisLoadResult,
    redis_load_text,
    run_redis_load_bench,
)
from queue_rollout.lab.redis_info import Sample, Window
from testkit import write_farm


def window(seconds: float, cpu_s: float, **calls: int) -> Window:
    return Window.between(Sample(0.0, {}, 0.0, 0, {}), Sample(seconds, calls, cpu_s, 0, {}))


def test_per_gpu_per_episode_and_projection_arithmetic():
    r = RedisLoadResult(
        gpus=4, slots_per_gpu=16,
        baseline=window(10, 0.01, ping=10),          # 1 call/s, 0.1 % of a core
        idle=window(10, 0.03, ping=10, hset=30),     # 4 calls/s, 0.3 %
        connections=40,
        # three rounds: 800 calls each; 10, 30 and 6 ms above idle (2 s): the median, 10
        bursts=[window(2, 0.016, hset=808), window(2, 0.036, hset=808),
                window(2, 0.012, hset=808)],
        burst_episodes=100,
        running=window(10, 0.0364, ping=10, hset=30, evalsha=64),  # 64 calls, 6.4 ms above
        running_episodes=64,
        # 10,000 trivial calls each: 100, 200 and 40 ms above idle: the unit is 10 us
        units=[window(2, 0.106, evalsha=10_000), window(2, 0.206, evalsha=10_000),
               window(2, 0.046, evalsha=10_000)])
    assert r.idle_calls_per_gpu_s == pytest.approx(0.75)
    assert r.idle_core_pct_per_gpu == pytest.approx(0.05)
    assert r.connections_per_gpu == 10
    assert r.commands_per_episode == pytest.approx(8.0)
    assert r.redis_cpu_ms_per_episode == pytest.approx(0.1)
    assert r.running_calls_per_episode_s == pytest.approx(0.1)
    assert r.running_core_pct_per_episode == pytest.approx(0.001)
    p = r.projection(gpus=1024, slots=16, episode_s=10)
    assert p["episodes_per_s"] == pytest.approx(1638.4)
    assert p["idle_core_pct"] == pytest.approx(51.2)
    assert p["busy_core_pct"] == pytest.approx(16.38, abs=0.01)
    assert p["running_core_pct"] == pytest.approx(16.38, abs=0.01)
    assert p["sum_core_pct"] == pytest.approx(51.2 + 16.38 + 16.38, abs=0.02)
    assert p["connections"] == 10240
    assert r.rounds_cpu_ms_per_episode == pytest.approx([0.1, 0.3, 0.06])
    assert r.rounds_unit_ms == pytest.approx([0.01, 0.02, 0.004])
    assert r.unit_ms == pytest.approx(0.01)
    assert r.units_per_episode == pytest.approx(10.0)  # 0.1 ms
    assert r.idle_units_per_gpu_s == pytest.approx(50.0)  # 0.05 % of a core = 0.5 ms/s
    assert r.running_units_per_episode_s == pytest.approx(1.0)  # 0.01 ms/s
    u = r.projection_units(gpus=1024, slots=16, episode_s=10)
    assert (u["idle_units_per_s"], u["busy_units_per_s"], u["running_units_per_s"]) == (
        51200, 16384, 16384)
    assert u["quiet_core_pct"] == pytest.approx(84.0)  # of 100,000 units/s
    # in this run's core the units say what the ms say
    assert u["this_core_pct"] == pytest.approx(p["sum_core_pct"], abs=0.1)
    out = r.as_json()
    assert [(x["gpus"], x["slots_per_gpu"]) for x in out["projections_units"]] == [
        (1024, 16), (1024, 128)]
    assert "units/s" in redis_load_text(out)
    # not priced: a running episode's lease is the running window's figure
    assert out["renewal_us"] is None
    assert r.lease_units_per_episode_s == pytest.approx(r.running_units_per_episode_s)


def test_priced_renewals_give_the_lease_term():
    r = RedisLoadResult(
        gpus=4, slots_per_gpu=16, baseline=window(10, 0.01, ping=10),
        idle=window(10, 0.03, ping=10, hset=30), connections=40,
        bursts=[window(2, 0.016, hset=808)], burst_episodes=100,
        running=window(10, 0.0364, ping=10, hset=30, evalsha=64),  # 3.64 ms/s
        running_episodes=64,
        units=[window(2, 0.106, evalsha=10_000)],  # the unit: 10 us
        # 2 s at the running rate (7.28 ms) and 12.8 ms more for 6,400 renewals: 2 us each
        renewals=window(2, 0.02008, evalsha=400), renewal_count=6_400, renewal_period_s=10.0,
        # one attempt to a call: 6,400 calls, 64 ms above the running rate, 10 us each
        renewals_alone=window(2, 0.07128, evalsha=6_400))
    assert r.renewal_ms == pytest.approx(0.002)
    assert r.renewal_units == pytest.approx(0.2)
    assert r.lease_units_per_episode_s == pytest.approx(0.02)  # one renewal per 10 s
    assert r.lease_core_pct_per_episode == pytest.approx(0.00002)
    u = r.projection_units(gpus=1024, slots=128, episode_s=30)
    assert u["running_units_per_s"] == round(0.02 * 1024 * 128)
    out = r.as_json()
    assert (out["renewal_us"], out["renewal_units"]) == (2.0, 0.2)
    assert r.renewal_alone_ms == pytest.approx(0.01) and out["renewal_alone_units"] == 1.0
    assert "one attempt's renewal 2.00 us" in redis_load_text(out)
    assert out["extension_us"] is None and "extension" not in redis_load_text(out)
    # the sweeps priced too: 25.6 ms above the running rate for 6,400 extensions, 4 us
    # (0.4 units) each, beside the lease, not in it (renewed on time, none is needed)
    r.extensions, r.extension_count = window(2, 0.03288, evalsha=400), 6_400
    assert r.extension_ms == pytest.approx(0.004) and r.extension_units == pytest.approx(0.4)
    assert r.lease_units_per_episode_s == pytest.approx(0.02)
    out = r.as_json()
    assert (out["extension_us"], out["extension_units"]) == (4.0, 0.4)
    assert "the sweep's extension to the holder's lease 4.00 us = 0.400 units" in (
        redis_load_text(out))


def test_the_collector_counts_once_per_farm_not_once_per_gpu():
    r = RedisLoadResult(
        gpus=4, slots_per_gpu=16,
        baseline=window(10, 0.01, ping=10),               # 1 call/s, 0.1 %
        collector=window(10, 0.018, ping=10, hget=30),    # +3 calls/s, +0.08 %
        collector_connections=3,
        idle=window(10, 0.03, ping=10, hget=30, hset=20),  # +2 calls/s, +0.12 % for 4 GPUs
        connections=43,
        bursts=[window(2, 0.016, hset=808)], burst_episodes=100,
        running=window(10, 0.0364, ping=10, hset=30, evalsha=64), running_episodes=64,
        units=[window(2, 0.106, evalsha=10_000)])  # 10 us
    assert r.collector_calls_per_s == pytest.approx(3.0)
    assert r.collector_units_per_s == pytest.approx(80.0)  # 0.08 % of a core = 0.8 ms/s
    assert r.collector_core_pct == pytest.approx(0.08)
    assert r.idle_calls_per_gpu_s == pytest.approx(0.5)
    assert r.idle_core_pct_per_gpu == pytest.approx(0.03)
    assert r.connections_per_gpu == 10
    p = r.projection(gpus=1024, slots=16, episode_s=10)
    assert p["idle_core_pct"] == pytest.approx(0.08 + 0.03 * 1024)
    assert p["idle_calls_per_s"] == 3 + 512
    assert p["connections"] == 3 + 10240
    out = r.as_json()
    assert (out["collector_core_pct"], out["collector_connections"]) == (0.08, 3)
    assert out["idle_commands_per_gpu_s"] == {"hset": 0.5, "ping": 0.0, "hget": 0.0}
    # what the GPUs add comes first, not what the idle farm called most (the collector's)
    assert next(iter(out["idle_commands_per_gpu_s"])) == "hset"


@pytest.mark.bench
def test_a_small_farm_is_measured_end_to_end(tmp_path):
    """With a replica following the Redis, not waited for (`--replicas 1`)."""
    lines: list[str] = []
    # idle windows of 2.5 s: an idle collector steps about once a second (IDLE_WAIT_S),
    # so a window of 1 s on a loaded machine could fall between two of its steps
    res = run_redis_load_bench(gpus=1, slots=8, idle_s=2.5, run_s=1.0, burst_groups=16,
                               burst_rounds=2, replicas=1, workdir=tmp_path,
                               progress=lines.append)
    out = res.as_json()
    json.dumps(out)
    assert out["profile"] == "redis-load" and (out["gpus"], out["slots_per_gpu"]) == (1, 8)
    assert res.burst_episodes == 128 and res.running_episodes == 8
    assert len(out["rounds_cpu_ms_per_episode"]) == 2
    assert out["redis_cpu_ms_per_episode"] in out["rounds_cpu_ms_per_episode"]
    # the collector alone: its leader lease and ticks cost calls and a connection (counts
    # of its window; the figure above the empty server is a difference of two rates)
    assert res.collector is not None and res.collector.calls.get("evalsha", 0) > 0
    assert out["collector_connections"] >= 1 and "collector_calls_per_s" in out
    # every episode costs Redis something: the ledger's scripts at least
    assert out["commands_per_episode"] > 5 and out["episode_commands"].get("evalsha", 0) > 1
    assert out["connections_per_gpu"] >= 2  # a supervisor and an episode process at least
    assert (out["replicas"], out["wait_replicas"]) == (1, 0)
    assert "wait" not in out["episode_commands"]  # followed, not waited for
    assert out["projection"]["gpus"] == 1024
    assert {"median"} <= set(out["pause_barrier_s"]) and {"median"} <= set(out["resume_s"])
    # every running attempt's renewal priced, once per round, on keys deleted after
    assert out["renewal_count"] == 8 * RENEWAL_ROUNDS and out["renewal_us"] is not None
    assert res.renewals is not None and res.renewals.calls.get("evalsha", 0) >= RENEWAL_ROUNDS
    assert res.renewals_alone is not None
    assert res.renewals_alone.calls.get("evalsha", 0) >= 8 * RENEWAL_ROUNDS
    assert res.collector.calls.get("evalsha", 0) < RENEWAL_ROUNDS  # its own window
    # and every running attempt's lease extended to its holder's, once per round (the
    # bench refuses a round in which one was not)
    assert out["extension_count"] == 8 * RENEWAL_ROUNDS and out["extension_us"] is not None
    assert res.extensions is not None
    assert res.extensions.calls.get("evalsha", 0) >= 2 * RENEWAL_ROUNDS  # holder + sweep
    assert "commands per episode" in redis_load_text(out)
    # the unit, after each burst: its trivial calls counted, its figure their median
    assert len(res.units) == 2 and all(w.calls.get("evalsha", 0) >= 10_000 for w in res.units)
    assert min(out["rounds_unit_us"]) <= out["unit_us"] <= max(out["rounds_unit_us"])
    assert len(out["projections_units"]) == 2
    # the profiled burst: each episode started and finished once, each by its script
    profile = out["episode_profile"]
    assert profile["start.lua"]["calls"] == profile["finish.lua"]["calls"] == 1
    assert "slow-log profile per episode" in redis_load_text(out)
    assert (tmp_path / "logs" / "worker-0.log").exists()


def test_fewer_replicas_than_every_change_waits_for_is_refused(tmp_path, capsys):
    from queue_rollout.cli.main import main

    toml = write_farm(tmp_path / "farm.toml", farm={"state_dir": tmp_path})
    assert main(["bench", "--profile", "redis-load", "--replicas", "0", "--wait-replicas", "1",
                 "-c", str(toml)]) == 2
    assert "--replicas 0: fewer than the --wait-replicas 1" in capsys.readouterr().err
