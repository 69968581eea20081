"""The redis-load bench over cells: its arithmetic on made-up readings, and one small
real run of a farm of one Redis beside a farm of two cells."""

from __future__ import annotations

import json

import pytest

from queue_rollout.lab.bench.redis_cells import (
    CONTROL,
    FARM,
    Calibration,
    ServerLoad,
    Topology,
    cells_json,
    cells_text,
    run_cells_bench,
)
from queue_rollout.lab.redis_info import UNIT_CALLS, Sample, Window
from testkit import write_farm


def window(seconds: float, cpu_s: float, **calls: int) -> Window:
    return Window.between(Sample(0.0, {}, 0.0, 0, {}), Sample(seconds, calls, cpu_s, 0, {}))


def server(name: str, gpus: int, *, idle_cpu: float, burst_cpu: list[float],
           episodes: list[int], running_cpu: float = 0.0, alone_cpu: float | None = None,
           ) -> ServerLoad:
    """A server whose empty window costs 0.01 s of CPU in 10 s, whose unit is 10 us
    (UNIT_CALLS calls cost 0.1 s above idle over 2 s), and whose other windows cost
    what is given (10 s idle and running windows, 2 s bursts)."""
    return ServerLoad(
        name, gpus, baseline=window(10, 0.01, ping=10),
        alone=None if alone_cpu is None else window(10, alone_cpu, evalsha=30),
        idle=window(10, idle_cpu, evalsha=50),
        bursts=[window(2, cpu, evalsha=100 * (i + 1), hget=5) for i, cpu in enumerate(burst_cpu)],
        burst_episodes=episodes,
        units=[window(2, 0.1 + idle_cpu / 5, evalsha=UNIT_CALLS)],
        running=window(10, running_cpu, evalsha=80) if running_cpu else None,
        running_episodes=gpus * 16 if running_cpu else 0)


def test_each_server_in_units_of_its_own_trivial_call():
    # idle: 0.05 s of CPU in 10 s, 0.04 above the empty server: 4 ms/s = 400 units/s;
    # bursts 2 s above the idle rate (0.01 s): 0.03, 0.01, 0.05 s = 3,000, 1,000, 5,000
    # units, over 100, 100 and 50 episodes: the median, 30 units an episode
    s = server(FARM, 2, idle_cpu=0.05, alone_cpu=0.03, burst_cpu=[0.04, 0.02, 0.06],
               episodes=[100, 100, 50], running_cpu=0.082)
    assert s.unit_ms == pytest.approx(0.01)
    assert s.idle_units_per_s == pytest.approx(400)
    assert s.alone_units_per_s == pytest.approx(200)
    assert s.units_per_episode == pytest.approx(30)
    # running: 0.082 s in 10 s, 0.032 above idle: 320 units/s over 32 episodes
    assert s.running_units_per_episode_s == pytest.approx(10)
    assert s.units_per_group(10) == pytest.approx(300)  # the median burst's 3,000 units
    assert s.calls_per() == {"evalsha": 1.0, "hget": 0.05}  # the median burst: 100 episodes
    assert s.calls_per(groups=10) == {"evalsha": 10.0, "hget": 0.5}


def test_a_farm_of_one_redis_predicts_each_server_of_a_farm_of_cells():
    one = Topology(1, [server(FARM, 2, idle_cpu=0.05, alone_cpu=0.03, burst_cpu=[0.04],
                              episodes=[100], running_cpu=0.082)], burst_groups=16)
    calibration = Calibration.of(one, control_per_group=5.0)
    # the collector 200 units/s; the GPUs the other 200: 100 each
    assert calibration.collector == pytest.approx(200)
    assert calibration.idle_per_gpu == pytest.approx(100)
    control = server(CONTROL, 0, idle_cpu=0.03, burst_cpu=[0.03], episodes=[0])
    cell = server("c0", 1, idle_cpu=0.04, burst_cpu=[0.03], episodes=[64], running_cpu=0.06)
    assert calibration.predict(control) == pytest.approx(
        {"idle_units_per_s": 200, "units_per_group": 5.0})
    assert calibration.predict(cell) == pytest.approx(
        {"idle_units_per_s": 300, "units_per_episode": 30, "running_units_per_episode_s": 10})
    out = cells_json({1: one, 2: Topology(2, [control, cell], burst_groups=16)}, calibration,
                     gpus=2, slots=16)
    json.dumps(out)
    rows = {(r["cells"], r["server"]): r for r in out["servers"]}
    assert "predicted" not in rows[1, FARM] and rows[1, FARM]["units_per_episode"] == 30
    # 0.03 s of CPU in a 2 s burst at an idle rate of 0.003 s/s: 24 ms, 2,400 units
    assert rows[2, CONTROL]["units_per_group"] == pytest.approx(2400 / 16, abs=1e-3)
    assert rows[2, CONTROL]["predicted"]["units_per_group"] == 5.0
    assert rows[2, CONTROL]["groups_per_s"] == 8.0  # 16 groups in a burst of 2 s
    assert "units_per_episode" not in rows[2, CONTROL]
    assert rows[2, "c0"]["predicted"]["idle_units_per_s"] == 300
    text = cells_text(out)
    assert "K = 1 calibrates: a collector 200.0 units/s, idle 100.00 a GPU" in text
    assert " 2 control     0" in text and "150 (5)" in text


@pytest.mark.bench
def test_a_farm_of_one_redis_and_one_of_two_cells_measured_server_by_server(tmp_path):
    lines: list[str] = []
    out = run_cells_bench([1, 2], gpus=2, slots=8, idle_s=2.5, run_s=1.0, burst_groups=16,
                          burst_rounds=1, spaced_groups=32, workdir=tmp_path,
                          progress=lines.append)
    json.dumps(out)
    rows = {(r["cells"], r["server"]): r for r in out["servers"]}
    assert set(rows) == {(1, FARM), (2, CONTROL), (2, "c0"), (2, "c1")}
    # every episode of the burst ran once, in the cell its group hashed to
    assert rows[1, FARM]["episodes_each_burst"] == [128]
    assert rows[2, "c0"]["episodes_each_burst"][0] + rows[2, "c1"]["episodes_each_burst"][0] == 128
    # the control Redis runs no episode: its calls per group are its scripts' (reserve,
    # settle; a batch's pop and ack shared by its groups), and each cell's per episode
    assert rows[2, CONTROL]["gpus"] == 0 and "units_per_episode" not in rows[2, CONTROL]
    assert rows[2, CONTROL]["calls_per_group"]["evalsha"] >= 2
    # the profiled burst: every group reserved and settled on the control Redis
    scripts = rows[2, CONTROL]["scripts_per_group"]
    assert scripts["reserve.lua"] >= 1 and scripts["settle.lua"] >= 1
    assert all(rows[2, c]["calls_per_episode"]["evalsha"] >= 2 for c in ("c0", "c1"))
    assert rows[2, "c0"]["predicted"]["units_per_episode"] == pytest.approx(
        out["calibration"]["per_episode"], abs=1e-3)
    assert out["calibration"]["control_per_group"] > 0
    assert set(out["control_per_group_spaced"]) == {"0.002", "0.01"}
    assert any("collector alone" in line for line in lines)
    assert "measured (predicted from K = 1)" in cells_text(out)


def test_cell_counts_without_one_or_not_dealing_the_gpus_evenly_are_refused(tmp_path, capsys):
    from queue_rollout.cli.main import main

    toml = write_farm(tmp_path / "farm.toml", farm={"state_dir": tmp_path})
    with pytest.raises(SystemExit):
        main(["bench", "--profile", "redis-load", "--cells", "2,3", "-c", str(toml)])
    assert "1 among them (it calibrates)" in capsys.readouterr().err
    assert main(["bench", "--profile", "redis-load", "--cells", "1,4", "-c", str(toml)]) == 2
    assert "--gpus 6: not dealt evenly over 1, 4 cells" in capsys.readouterr().err
