"""`queue-rollout bench --profile ledger`: runs both phases and reports the JSON shape.
(Its speed target is a benchmark, not a test: see docs/en/benchmarks.md.)"""

from __future__ import annotations

import json

import pytest

from queue_rollout.cli.main import main

OPS = ("admit", "admit_commands", "start", "start_commands", "finish", "finish_commands")


@pytest.mark.parametrize("placement", ["any", "group"])
@pytest.mark.bench
def test_ledger_bench_json_shape(capsys, placement):
    assert main(["bench", "--profile", "ledger", "--json", "--clients", "2",
                 "--seconds", "0.6", "--rounds", "2", "--placement", placement]) == 0
    result = json.loads(capsys.readouterr().out)
    assert set(result) == {"profile", "clients", "wait_replicas", "placement",
                           "ledger_ops_per_s", "trivial_script_per_s", "ratio",
                           "redis_us_per_call"}
    assert result["placement"] == placement
    costs = result["redis_us_per_call"]
    assert set(costs) == {*OPS, "trivial", "read", "write", "record_json", "record_msgpack"}
    assert all(isinstance(v, float | int) for v in costs.values())
    assert (result["profile"], result["clients"], result["wait_replicas"]) == ("ledger", 2, 0)
    expected = result["ledger_ops_per_s"] / result["trivial_script_per_s"]
    assert abs(result["ratio"] - expected) < 0.01


@pytest.mark.bench
def test_ledger_bench_with_a_replica_waits_for_it_and_says_what_wait_costs(capsys):
    assert main(["bench", "--profile", "ledger", "--json", "--clients", "1",
                 "--seconds", "0.4", "--rounds", "1", "--wait-replicas", "1"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["wait_replicas"] == 1 and "ledger_ops_per_s" in result
    assert {"wait", *OPS} <= set(result["redis_us_per_call"])


def test_segments_alternate_abba():
    from queue_rollout.lab.bench.ledger import segment_kinds

    assert segment_kinds(2) == ["trivial", "ledger", "ledger", "trivial"]


def test_sim_replica_bench_json_shape(capsys):
    assert main(["bench", "--profile", "sim-replica", "--json", "--requests", "4",
                 "--seconds", "0.5"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert set(result) == {"profile", "concurrent_requests", "seconds", "cpu_fraction_of_one_core",
                           "completed", "cached_fraction", "retracted", "prompt_tokens",
                           "output_tokens"}
    assert result["profile"] == "sim-replica" and result["concurrent_requests"] == 4
    assert result["retracted"] == 0 and result["prompt_tokens"] == 4096
    assert 0 <= result["cpu_fraction_of_one_core"] <= 2
