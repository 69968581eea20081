"""The adaptive-concurrency controller and the metrics it reads."""

from __future__ import annotations

import pytest

from queue_rollout.engines.concurrency import (
    HIGH_WATER,
    KvSignal,
    SlotLimit,
    parse_metrics,
)
from queue_rollout.engines.sglang import SGLangClient
from queue_rollout.lab.sim.model import SimModel, SimRequest
from queue_rollout.lab.sim.server import ThreadedSimEngine


def calm(retractions: int = 0) -> KvSignal:
    return KvSignal(token_usage=0.2, queued=0, retractions=retractions)


def test_the_limit_starts_at_the_ceiling_and_halves_on_a_retraction_down_to_the_floor():
    limit = SlotLimit(16, floor=3)
    assert limit.limit == 16
    assert limit.observe(calm(5)) == 16  # the first look only learns the count
    assert limit.observe(calm(6)) == 8
    assert limit.observe(calm(7)) == 4
    assert limit.observe(calm(9)) == 3  # not below the floor
    assert limit.observe(calm(9)) == 4  # room again: one slot a look
    assert limit.observe(calm(9)) == 5


def test_usage_past_the_mark_decreases_a_queue_holds_and_room_increases_to_the_ceiling():
    limit = SlotLimit(4)
    assert limit.observe(KvSignal(HIGH_WATER + 0.01, 0, 0)) == 2
    assert limit.observe(KvSignal(HIGH_WATER, 3, 0)) == 2  # at the mark, queued: hold
    assert limit.observe(calm()) == 3
    assert limit.observe(KvSignal(0.5, 1, 0, running=2)) == 3  # queued once: hold
    assert [limit.observe(calm()) for _ in range(3)] == [4, 4, 4]


def test_a_queue_at_two_looks_in_a_row_brings_the_limit_down_to_what_runs():
    """SGLang queues what its pool cannot promise room for while usage reads low: a
    queue that stays is a full replica."""
    limit = SlotLimit(8, floor=2)
    assert limit.observe(KvSignal(0.3, 6, 0, running=2)) == 8  # once: a request arriving
    assert limit.observe(KvSignal(0.4, 6, 0, running=3)) == 3  # twice: what it runs
    assert limit.observe(KvSignal(0.5, 5, 0, running=1)) == 2  # not below the floor
    assert limit.observe(KvSignal(0.5, 0, 0, running=2)) == 3  # drained: room again
    limit = SlotLimit(8)
    limit.observe(KvSignal(0.3, 2, 0))
    assert limit.observe(KvSignal(0.3, 2, 0)) == 4  # running unknown: halved


def test_a_counter_that_went_down_is_a_restarted_replica_not_a_retraction():
    limit = SlotLimit(8)
    limit.observe(calm(40))
    assert limit.observe(calm(0)) == 8
    assert limit.observe(calm(1)) == 4


def test_a_floor_outside_one_to_the_ceiling_is_refused():
    for floor in (0, 9):
        with pytest.raises(ValueError, match="floor"):
            SlotLimit(8, floor=floor)


def test_parse_reads_sglang_s_text_format_series_by_series():
    text = "\n".join([
        "# HELP sglang:token_usage The token usage.",
        "# TYPE sglang:token_usage gauge",
        'sglang:token_usage{model_name="m",dp_rank="0"} 0.25',
        'sglang:token_usage{model_name="a}b",dp_rank="1"} 0.75 1700000000000',
        'sglang:num_queue_reqs{model_name="m",dp_rank="0"} 2.0',
        'sglang:num_queue_reqs{model_name="m",dp_rank="1"} 1.0',
        'sglang:num_retracted_requests_total{model_name="m"} 7.0',
        'sglang:num_retracted_requests_created{model_name="m"} 1.7e9',
        'sglang:token_usage_other{model_name="m"} 0.99',
        "sglang:num_running_reqs 3.0",
    ])
    assert parse_metrics(text) == KvSignal(0.75, 3, 7, running=3)
    # as a router that rewrites the colon serves them
    assert parse_metrics(text.replace("sglang:", "sglang_")) == KvSignal(0.75, 3, 7, 3)


def test_parse_without_usage_or_queue_is_none_and_without_retractions_counts_none():
    assert parse_metrics("") is None
    assert parse_metrics("sglang:token_usage 0.5\n") is None
    assert parse_metrics("sglang:num_queue_reqs 0\nsglang:token_usage NaN\n") is None
    assert parse_metrics("sglang:num_queue_reqs 0\nsglang:token_usage 0.5\n") == \
        KvSignal(0.5, 0, 0)


def test_the_simulated_replica_s_metrics_carry_the_model_s_usage_and_retractions():
    with ThreadedSimEngine(slots=4, step_ms=1.0, max_total_tokens=4096) as engine:
        signal = parse_metrics(SGLangClient(engine.url).metrics())
        assert signal == KvSignal(0.0, 0, 0, running=0)


def test_the_model_s_own_signal_rises_with_decode_and_counts_its_retractions():
    """Four requests that together outgrow the pool: usage climbs past the mark, the
    model retracts, and the signal says both."""
    now = [0.0]
    model = SimModel(slots=4, step_ms=1.0, step_ms_per_request=0.0, now=0.0,
                     max_total_tokens=4096, chunked_prefill_size=1024)
    for i in range(4):
        model.submit(SimRequest(f"r{i}", seed=i, target=1500, weight_version="",
                                prompt=list(range(i * 100, i * 100 + 10))))
    seen = []
    while now[0] < 3.0:
        now[0] += 0.1
        model.advance(now[0])
        seen.append(KvSignal(model.token_usage(), len(model.waiting),
                             model.counters.retracted_requests))
    assert max(s.token_usage for s in seen) > HIGH_WATER
    assert seen[-1].retractions >= 1
    limit = SlotLimit(4)
    assert min(limit.observe(s) for s in seen) < 4
