"""At fixed weights the farm samples from the policy the trainer holds:
``examples/sampler_check.py`` in the SGLang venv against ``queue-rollout up`` on the two
shared replicas, the farm's samples set beside the trainer's own at the same weights,
and a positive control (the replicas at temperature 0.9, the trainer assuming 1.0).

``QUEUE_ROLLOUT_SAMPLER_SAMPLES`` sets the samples per key on each side (the tier: 32,
the loop only); at :data:`POWERED` or more the control must be flagged.
``QUEUE_ROLLOUT_SAMPLER_OUT``, a folder, keeps each report there as
``sampler-NAME.json``, as the documented runs were made."""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

import pytest
from faultfarm import FaultServer, UpFarm
from real_engine.server import model

pytestmark = [pytest.mark.sglang, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = int(os.environ.get("QUEUE_ROLLOUT_SAMPLER_SAMPLES", "32"))
POWERED = 1000  # samples per key from which the positive control must be flagged
G = 16
#: name: (the replicas' temperature, the trainer's)
RUNS = {"matched": (1.0, 1.0), "control": (0.9, 1.0)}


@pytest.mark.parametrize("name", list(RUNS))
def test_the_farm_samples_the_trainers_policy_and_a_wrong_temperature_is_flagged(
        name: str, tmp_path: Path, replicas: list[FaultServer], sglang_interpreter: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    farm_t, assumed = RUNS[name]
    monkeypatch.setenv("PYTHONPATH", str(ROOT / "examples"))
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    farm = UpFarm(tmp_path / "farm", f"sampler-{name}", [s.url for s in replicas], "sample",
                  {"group_size": G, "batch_size": 4, "groups_at_once": 2,
                   "max_staleness": 1, "pause_mode": "abort", "temperature": farm_t,
                   "workflow": "grpo_tiny:KeyAnswer", "lease": 10})
    report_path = tmp_path / "report.json"
    with farm.running():
        proc = subprocess.run(
            [sglang_interpreter, str(ROOT / "examples" / "sampler_check.py"), "-c",
             str(farm.toml), "--model", str(model(sglang_interpreter, 0)), "--samples",
             str(SAMPLES), "--assume-temperature", str(assumed), "--json", str(report_path)],
            capture_output=True, text=True, timeout=1700, cwd=tmp_path)
        print(proc.stdout[-4000:])
        assert proc.returncode == 0, proc.stderr[-4000:] + farm.log_tail()
    report = json.loads(report_path.read_text())
    if out := os.environ.get("QUEUE_ROLLOUT_SAMPLER_OUT"):
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / f"sampler-{name}.json").write_text(json.dumps(report, indent=1) + "\n")
    assert (report["farm_temperature"], report["assumed_temperature"]) == (farm_t, assumed)
    assert [row["key"] for row in report["keys"]] == list(range(8))
    for row in report["keys"]:
        for side in ("farm", "local"):
            s = row[side]
            assert s["samples"] == SAMPLES
            assert math.isfinite(s["logp_plus_entropy"]) and s["se"] > 0 and -1 <= s["icc"] <= 1
            assert 0.0 <= s["reward"] <= 1.0
        assert 0.0 <= row["p"] <= 1.0 and row["df"] >= 0
    if SAMPLES >= POWERED and name == "control":
        assert report["flags"]["farm"], "the farm at 0.9 against a trainer at 1.0 passed"
