"""`plan --cells`: the arithmetic on made-up figures, and a small real run (the control
Redis's cost per group measured on a private Redis)."""

from __future__ import annotations

import json
import math

import pytest

from queue_rollout.cli.main import main
from queue_rollout.errors import BadInput
from queue_rollout.lab.plan.cells import plan_cells

COSTS = {"idle_units_per_gpu_s": 2.0, "units_per_episode": 10.0,
         "lease_units_per_episode_s": 0.05, "collector_units_per_s": 20.0,
         "quiet_core_units_per_s": 100_000.0}


def test_the_cells_and_each_servers_share_by_arithmetic():
    p = plan_cells(COSTS, 4.0, gpus=1000, slots=100, episode_s=20.0, group_size=8,
                   batch_size=16)
    assert p.episodes_per_s == 5000 and p.groups_per_s == 625
    # cells: 2,000 idle + 50,000 episodes + 5,000 leases = 57,000 units/s; a cell takes
    # 70,000 - 20 (its collector) of them: one cell
    assert (p.idle, p.episodes, p.leases) == (2000, 50_000, 5000) and p.cells == 1
    assert p.cell_pct == pytest.approx(100 * (57_000 + 20) / 100_000)
    assert p.control_pct == pytest.approx(100 * (4.0 * 625 + 20) / 100_000)
    big = plan_cells(COSTS, 4.0, gpus=10_000, slots=128, episode_s=30.0, group_size=8,
                     batch_size=16)
    load = 2.0 * 10_000 + 10.0 * 1_280_000 / 30 + 0.05 * 1_280_000
    assert big.cells == math.ceil(load / (70_000 - 20)) and big.cell_pct <= 70
    assert plan_cells(COSTS, 4.0, gpus=10_000, slots=128, episode_s=30.0, group_size=8,
                      batch_size=16, limit_pct=35.0).cells == math.ceil(load / (35_000 - 20))


def test_figures_without_units_are_refused_naming_what_they_lack():
    with pytest.raises(BadInput, match="lack units_per_episode, lease_units_per_episode_s"):
        plan_cells({k: v for k, v in COSTS.items()
                    if k not in ("units_per_episode", "lease_units_per_episode_s")},
                   1.0, gpus=1, slots=1, episode_s=1.0, group_size=1, batch_size=1)


def test_the_plan_is_printed(tmp_path, capsys):
    costs = tmp_path / "costs.json"
    costs.write_text(json.dumps(COSTS | {"idle_core_pct_per_gpu": 0.0,
                                         "idle_calls_per_gpu_s": 0.0,
                                         "connections_per_gpu": 2,
                                         "redis_cpu_ms_per_episode": 0.1,
                                         "running_core_pct_per_episode": 0.0,
                                         "episode_usec": {}}))
    args = ["plan", "--cells", "--gpus", "100", "--slots-per-replica", "16",
            "--episode-s", "10", "--redis-load", str(costs), "--json"]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["cells"], out["episodes_per_s"], out["groups_per_s"]) == (1, 160.0, 20.0)
    assert out["cells_units_per_s"] == {"idle": 200, "episodes": 1600, "leases": 80,
                                        "collector_each": 20.0}
    assert main([*args[:-5], "--json"]) == 2  # no --episode-s
    assert "--episode-s" in capsys.readouterr().err
