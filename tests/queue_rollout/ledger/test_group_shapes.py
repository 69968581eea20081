"""The farm's history of group shapes: kept by ``finish`` as groups complete."""

from __future__ import annotations

import json

import pytest

from queue_rollout.ledger import group_shapes
from queue_rollout.ledger.group_shapes import member_shape, recorded_shapes, shapes_kept
from testkit import trivial_prompts


def test_a_member_shape_is_one_call_or_its_calls() -> None:
    assert json.loads(member_shape(120, [300])) == {"prompt_tokens": 120, "output_tokens": 300}
    # two calls: 4.5 s of tool after the first, whose output the second call's context shows
    calls = json.loads(member_shape(120, [300, 40], [4.5, 0.0], [120, 120 + 300 + 55]))
    assert calls == {"prompt_tokens": 120, "turns": [
        {"gen": 300, "tool_s": 4.5, "tool_tokens": 55},
        {"gen": 40, "tool_s": 0.0, "tool_tokens": 0}]}


def run_group(ledger, lengths: list[int], *, fail: int | None = None,
              resend: bool = False) -> None:
    admission = ledger.admit()
    assert admission.status == "admitted", admission
    for m, aid in enumerate(admission.attempt_ids):
        assert ledger.start(aid, "w", "r0", "boot0", 30).status == "started"
        outcome = "failed" if m == fail else "finished"
        shape = "" if m == fail else member_shape(9, [lengths[m]])
        for _ in range(2 if resend else 1):
            answer = ledger.finish(aid, m, b"r", output_tokens=lengths[m], outcome=outcome,
                                   shape=shape)
            assert answer.status in ("recorded", "ignored")


def test_completed_groups_are_kept_newest_last_once_each(make_ledger) -> None:
    ledger = make_ledger(group_size=3, batch_size=1, max_concurrent_rollouts=2,
                         max_staleness=100)
    ledger.submit(trivial_prompts(3))
    run_group(ledger, [5, 6, 7])
    run_group(ledger, [1, 2, 3], fail=1)  # a failed member leaves no shape: not kept
    run_group(ledger, [8, 9, 10], resend=True)  # a result sent twice counts once
    kept = recorded_shapes(ledger.client, ledger.keys)
    assert kept == [
        {"group_id": "p0", "prompt_tokens": 9,
         "members": [{"output_tokens": n} for n in (5, 6, 7)]},
        {"group_id": "p2", "prompt_tokens": 9,
         "members": [{"output_tokens": n} for n in (8, 9, 10)]}]
    assert shapes_kept(ledger.client, ledger.keys) == 2
    assert ledger.client.hlen(ledger.keys.shape_parts) == 0  # nothing left behind


def test_the_history_keeps_the_newest(make_ledger, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("queue_rollout.ledger.core.SHAPES_KEPT", 2)
    ledger = make_ledger(group_size=2, batch_size=1, max_concurrent_rollouts=1,
                         max_staleness=100)
    ledger.submit(trivial_prompts(4))
    for i in range(4):
        run_group(ledger, [i + 1, i + 2])
    assert [s["group_id"] for s in recorded_shapes(ledger.client, ledger.keys)] == ["p2", "p3"]
    assert group_shapes.SHAPES_KEPT == 4096
