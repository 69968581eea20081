"""The calibration table: the pause mode closest to the reference, and its text."""

from __future__ import annotations

import pytest

from queue_rollout.lab.bench.calibration import (
    PAUSE_MODES,
    REFERENCE,
    best_pause_mode,
    calibration_text,
    relative_error,
)


def rows(off: dict[str, float]) -> list[dict[str, object]]:
    """A run per (profile, pause mode, admission mode), each off the reference's figures
    by the fraction *off* gives its pause mode."""
    return [{"profile": name, "mode": mode, "pause_mode": pause,
             "mean_rollout_interval_s": interval * (1 + off[pause]),
             "all_work_completion_s": all_work * (1 - off[pause]),
             "reference_interval_s": interval, "reference_all_work_s": all_work,
             "retractions": 0, "prefill_tokens": 0}
            for name, modes in REFERENCE.items() for pause in PAUSE_MODES
            for mode, (interval, all_work) in modes.items()]


def test_the_best_pause_mode_is_the_one_closest_to_the_reference_and_the_table_lists_every_run():
    runs = rows({"in_place": 0.2, "abort": 0.05, "retract": 0.1})
    assert relative_error(runs[0]) == pytest.approx(0.2)
    assert best_pause_mode(runs) == {"long-tail": "abort", "equal": "abort"}
    text = calibration_text({"profile": "calibration", "runs": runs,
                             "best_pause_mode": best_pause_mode(runs)})
    table = [line for line in text.splitlines() if line.startswith(("  long-tail ", "  equal "))]
    assert len(table) == len(runs) == 2 * 2 * len(PAUSE_MODES)
    assert "733.13" in text and "abort" in text
