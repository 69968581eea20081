"""The demo and its virtual-time farm: the real ledger decides, the model is calibrated."""

from __future__ import annotations

import io

import pytest

from queue_rollout.config import Config, RolloutConfig
from queue_rollout.lab.demo.virtual import run_demo
from queue_rollout.lab.virtual.clock import ManualClock
from queue_rollout.lab.virtual.farm import EngineModel, SimFarm, TrainerSchedule
from queue_rollout.lab.workloads.pilots import long_tail_lengths
from queue_rollout.ledger.core import Ledger
from queue_rollout.ledger.doctor import examine


def simulate(r, farm: str, rollout: RolloutConfig, prompts: int, batches: int = 6):
    clock = ManualClock()
    ledger = Ledger(r, farm, rollout, clock=clock)
    sim = SimFarm(ledger, clock, long_tail_lengths(prompts, rollout.group_size),
                  engine=EngineModel(replicas=8, slots_per_replica=16, step_ms=4.5,
                                     step_ms_per_request=0.2),
                  trainer=TrainerSchedule(train_s=10.0, train_batches=batches),
                  capacity_slots=128)
    return ledger, sim.run()


def test_reference_long_tail_shape_in_both_modes(r):
    group_ledger, group = simulate(r, "g", RolloutConfig(), 128)
    sample_ledger, sample = simulate(r, "s", RolloutConfig(max_concurrent_samples=128), 128)
    # the timing model is calibrated so that group admission takes about 725 s (DESIGN 8)
    assert group.all_work_s == pytest.approx(725, rel=0.01)
    assert group.output_tokens == sample.output_tokens == 3_014_656
    assert group.groups_accepted == sample.groups_accepted == 128
    assert group.batches == sample.batches == 8
    assert sample.all_work_s < group.all_work_s * 0.8
    assert sample.mean_rollout_interval < group.mean_rollout_interval * 0.6
    assert sample.mean_active > group.mean_active
    for ledger in (group_ledger, sample_ledger):
        assert examine(ledger.client, ledger.keys, ledger.rollout.batch_size).ok
        c = ledger.counters()
        assert (c["reserved"], c["in_flight"], c["consumed"]) == (0, 0, 128)


def test_the_virtual_demo_prints_progress_and_a_summary(redis_url):
    out = io.StringIO()
    config = Config()
    assert run_demo(config, prompts=32, batches=1, out=out) == 0
    text = out.getvalue()
    assert "groups accepted                               32            32" in text
    assert "all-work completion (s)" in text and "slot occupancy" in text


@pytest.mark.e2e
def test_the_stack_demo_runs_both_modes_through_real_processes_and_keeps_logs_off_screen(
        tmp_path):
    import re
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    exe = shutil.which("queue-rollout", path=str(Path(sys.executable).parent))
    done = subprocess.run([exe, "demo"], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    assert "groups accepted                        32             32" in out
    assert "batches                                 8              8" in out
    for row in ("mean rollout interval (s)", "mean active episodes", "slot occupancy",
                "rollout interval: from the farm resuming", "this run's spread: group "):
        assert row in out
    assert "8 batches, the first 4 each followed by a 1 s training pause" in out
    # not a terminal: plain progress lines, each mode's last one at the end of its work
    for mode in ("group", "sample"):
        assert re.search(rf"^{mode}: 32/32 groups  reserved=\d+/16 slots  running=",
                         done.stderr, re.M), done.stderr
    # no process's log on the terminal
    logline = re.compile(r"\b(DEBUG|INFO|WARNING|ERROR)\b")
    assert [line for line in (out + done.stderr).splitlines() if logline.search(line)] == []
    logs = tmp_path / ".queue-rollout" / "demo" / "logs"
    assert out.rstrip().endswith(f"logs: {logs}")
    for mode in ("group", "sample"):
        names = {p.name for p in (logs / mode).iterdir()}
        assert {"worker-0.log", "worker-1.log", "replica-0.log", "collector.log"} <= names
        assert "episode process" in (logs / mode / "worker-0.log").read_text()
        # a Prometheus could follow each farm as it ran: its targets, emptied at its end
        targets = tmp_path / ".queue-rollout" / "demo" / mode / "prometheus" / "targets.json"
        assert targets.read_text().strip() == "[]"
    assert "worker gpu0 started" in (logs / "demo.log").read_text()


def test_the_live_view_draws_on_a_terminal_and_prints_plain_lines_elsewhere():
    from queue_rollout.progress import LiveView

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    tty, pipe, off = Terminal(), io.StringIO(), io.StringIO()
    for out in (tty, pipe):
        with LiveView("sample", 32, "groups", out=out, plain_every_s=3600) as view:
            view.show(12, slots="14/16", ready=2)
            view.show(13, slots="14/16", ready=2)  # within the hour: no second plain line
            view.show(32, slots="0/16", ready=0)  # the end: always
    assert "sample" in tty.getvalue() and "12/32" in tty.getvalue()
    assert "slots=14/16" in tty.getvalue() and "ready=2" in tty.getvalue()
    assert pipe.getvalue() == ("sample: 12/32 groups  slots=14/16  ready=2\n"
                               "sample: 32/32 groups  slots=0/16  ready=0\n")
    with LiveView("sample", 32, "groups", out=off, enabled=False) as view:
        view.show(32)
    assert off.getvalue() == ""
