"""The seed's controlled-length pilots under the H200 profile, beside the seed's figures."""

from __future__ import annotations

from pathlib import Path

import pytest

from queue_rollout.lab.bench.calibration import REFERENCE
from queue_rollout.lab.bench.gpu_h200 import (
    ENGINES,
    WORKLOAD_ENGINES,
    WORKLOAD_FIGURES,
    change,
    gpu_h200_text,
    run_gpu_h200,
)
from queue_rollout.lab.virtual.hardware import H200
from queue_rollout.lab.workloads.seed import BOBA_SEED


def test_every_engine_predicts_both_modes_and_each_change_is_set_beside_the_seeds(
        redis_url: str, tmp_path: Path) -> None:
    result = run_gpu_h200(redis_url, tmp_path, workloads=("boba-math",))
    assert result["engines"]["h200"]["step_ms"] == H200.step_ms
    assert result["engines"]["h200"]["prefill_tokens_per_s"] == H200.prefill_tokens_per_s
    runs = {(r["engine"], r["profile"], r["mode"]): r for r in result["runs"]}
    assert len(runs) == len(ENGINES) * 2 * 2
    # the engines differ: the H200's step is shorter at every running count
    for key in (("long-tail", "group"), ("equal", "group")):
        assert (runs[("h200", *key)]["all_work_completion_s"]
                < runs[("reference-fit", *key)]["all_work_completion_s"])
    for c in result["changes"]:
        k = 0 if c["figure"] == "mean_rollout_interval_s" else 1
        group = runs[c["engine"], c["profile"], "group"][c["figure"]]
        sample = runs[c["engine"], c["profile"], "sample"][c["figure"]]
        seed = REFERENCE[c["profile"]]
        assert c["predicted_pct"] == change(group, sample)
        assert c["seed_pct"] == change(seed["group"][k], seed["sample"][k])
        assert c["apart_pp"] == pytest.approx(c["predicted_pct"] - c["seed_pct"], abs=0.051)
    text = gpu_h200_text(result)
    assert "-64.7%" in text and "-38.1%" in text  # the seed's long-tail changes
    workload_lines = len(WORKLOAD_FIGURES["boba-math"])
    assert sum(line.startswith("  h200 ") for line in text.splitlines()) == 4 + 4 + workload_lines

    # boba-math under each engine: both modes, in the reference's seconds
    rows = {(r["engine"], r["mode"]): r for r in result["workloads"]}
    assert set(rows) == {(e, m) for e in WORKLOAD_ENGINES for m in ("group", "sample")}
    # the H200's shorter step makes the same work faster in group admission
    assert (rows["h200", "group"]["all_work_completion_s"]
            < rows["reference-fit", "group"]["all_work_completion_s"])
    seen = {(c["engine"], c["figure"]): c for c in result["workload_changes"]}
    assert len(seen) == len(WORKLOAD_ENGINES) * workload_lines
    for (engine, figure), c in seen.items():
        assert c["group"] == rows[engine, "group"][figure]
        assert c["predicted_pct"] == change(c["group"], c["sample"])
    interval = seen["h200", "mean_rollout_interval_s"]
    assert interval["seed"] == [105.20, 95.13]
    assert interval["seed_pct"] == change(105.20, 95.13) == -9.6
    assert interval["apart_pp"] == pytest.approx(interval["predicted_pct"] + 9.6, abs=0.051)
    # a change the seed reported only as a change; a figure it did not report
    rate = BOBA_SEED["change"]["accepted_groups_per_hour"]
    assert seen["h200", "steady_groups_per_hour"]["seed_pct"] == round(100 * rate, 1)
    assert seen["h200", "mean_active_episodes"]["seed_pct"] is None
    assert seen["h200", "mean_active_episodes"]["apart_pp"] is None


def test_a_change_is_in_percent_of_group_admission() -> None:
    assert change(73.99, 26.12) == -64.7
    assert change(315.95, 316.22) == 0.1
