"""The Redis headroom's arithmetic: the redis-load figures times the planned farm."""

from __future__ import annotations

import pytest

from queue_rollout.lab.plan.headroom import headroom, load_redis_costs

COSTS = {"idle_core_pct_per_gpu": 0.01, "idle_calls_per_gpu_s": 2.0,
         "connections_per_gpu": 4.0, "redis_cpu_ms_per_episode": 0.3,
         "running_core_pct_per_episode": 0.001, "episode_usec": {"evalsha": 100.0}}


def test_each_term_scales_with_what_it_is_per() -> None:
    h = headroom(COSTS, gpus=100, episodes_per_s=50.0, mean_holding=800.0,
                 ledger_cpu_ms_per_episode=0.1)
    assert h.idle_pct == pytest.approx(1.0)  # 0.01 % per GPU x 100
    assert h.ledger_pct == pytest.approx(0.5)  # 0.1 ms x 50/s = 5 ms/s
    assert h.transport_pct == pytest.approx(1.0)  # (0.3 - 0.1 in scripts) ms x 50/s
    assert h.leases_pct == pytest.approx(0.8)
    assert h.headroom == pytest.approx(100 / 3.3)
    assert (h.idle_calls_per_s, h.connections) == (200.0, 400.0)


def test_the_collector_counts_once_where_redis_load_measured_it_apart() -> None:
    apart = {**COSTS, "collector_core_pct": 0.07, "collector_calls_per_s": 3.0,
             "collector_connections": 2}
    h = headroom(apart, gpus=100, episodes_per_s=50.0, mean_holding=800.0,
                 ledger_cpu_ms_per_episode=0.1)
    assert h.idle_pct == pytest.approx(1.07)
    assert (h.idle_calls_per_s, h.connections) == (203.0, 402.0)


def test_the_shipped_figures_load() -> None:
    costs = load_redis_costs()
    assert costs["profile"] == "redis-load" and costs["gpus"] >= 8


def test_the_priced_lease_is_taken_where_the_json_has_it() -> None:
    priced = {**COSTS, "lease_core_pct_per_episode": 0.0004}
    h = headroom(priced, gpus=100, episodes_per_s=50.0, mean_holding=800.0,
                 ledger_cpu_ms_per_episode=0.1)
    assert h.leases_pct == pytest.approx(0.32)  # not the running window's 0.8
