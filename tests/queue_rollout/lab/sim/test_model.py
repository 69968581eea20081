"""The simulated replica's timing model, driven by a hand-moved clock."""

from __future__ import annotations

import pytest

from queue_rollout.lab.sim.model import DuplicateRid, SimModel, SimRequest, recomputed_tokens


def model(slots: int = 4) -> SimModel:
    return SimModel(slots=slots, step_ms=4.5, step_ms_per_request=0.2)


def request(rid: str, target: int, ended: dict[str, tuple[int, str]]) -> SimRequest:
    return SimRequest(rid, seed=1, target=target, weight_version="v0",
                      on_done=lambda r, reason: ended.__setitem__(
                          r.rid, (r.tokens, reason["type"])))


def test_one_request_takes_target_times_step():
    ended: dict = {}
    m = model()
    m.submit(request("a", 100, ended))
    m.advance(100 * 0.0047 - 0.001)
    assert "a" not in ended
    m.advance(100 * 0.0047 + 0.001)
    assert ended["a"] == (100, "length")


def test_step_time_grows_with_running_requests_and_completions_are_exact():
    ended: dict = {}
    m = model()
    m.submit(request("short", 10, ended))
    m.submit(request("long", 20, ended))
    # two running: step 4.9 ms; short ends at 49 ms; then long alone at 4.7 ms/step
    m.advance(0.049 + 1e-9)
    assert ended == {"short": (10, "length")}
    m.advance(0.049 + 10 * 0.0047 + 1e-9)
    assert ended["long"] == (20, "length")


def test_slots_limit_running_requests_and_the_rest_wait_in_order():
    ended: dict = {}
    m = model(slots=2)
    for rid in ("a", "b", "c"):
        m.submit(request(rid, 10, ended))
    m.advance(0.0)  # their (empty) prefill
    assert set(m.running) == {"a", "b"} and [r.rid for r in m.waiting] == ["c"]
    m.advance(10 * 0.0049 + 1e-9)
    assert set(m.running) == {"c"} and m.running["c"].started == pytest.approx(0.049)


def test_abort_returns_tokens_so_far_and_tells_waiting_from_running():
    ended: dict = {}
    m = model(slots=1)
    m.submit(request("run", 1000, ended))
    m.submit(request("wait", 1000, ended))
    m.advance(50 * 0.0047)
    assert m.abort("run") == 1
    assert ended["run"] == (50, "abort")
    assert m.log[-1]["finish"] == "abort"
    m.abort("wa")  # SGLang matches rids by prefix
    assert ended["wait"][1] == "abort"


def test_pause_in_place_freezes_progress_and_resume_continues():
    ended: dict = {}
    m = model()
    m.submit(request("a", 100, ended))
    m.advance(0.1)
    m.pause("in_place")
    m.advance(100.0)
    assert "a" not in ended and m.next_event() == float("inf")
    m.resume()
    m.advance(100.0 + 100 * 0.0047)
    assert ended["a"] == (100, "length")


def test_pause_abort_ends_everything_and_holds_new_work():
    ended: dict = {}
    m = model(slots=1)
    m.submit(request("a", 100, ended))
    m.submit(request("b", 100, ended))
    m.pause("abort")
    assert {k: v[1] for k, v in ended.items()} == {"a": "abort", "b": "abort"}
    m.submit(request("c", 10, ended))
    m.advance(10.0)
    assert "c" not in ended  # waits until resumed
    m.resume()
    m.advance(10.0 + 10 * 0.0047 + 1e-9)
    assert ended["c"] == (10, "length")


def test_an_rid_in_flight_is_refused_and_free_again_once_ended():
    ended: dict = {}
    m = model()
    m.submit(request("a", 10, ended))
    with pytest.raises(DuplicateRid):
        m.submit(request("a", 10, ended))
    m.abort("a")
    m.submit(request("a", 0, ended))  # the probe: max_new_tokens 0 ends at once
    assert ended["a"] == (0, "length")


def test_the_request_log_counts_each_request_s_prefill_and_what_a_retraction_recomputes():
    """Four requests that outgrow the pool: a retracted one computes its context again
    when it runs again; one never retracted computes its prompt less its cache hit."""
    model = SimModel(slots=4, step_ms=1.0, step_ms_per_request=0.0, now=0.0,
                     max_total_tokens=4096, chunked_prefill_size=1024)
    for i in range(4):
        model.submit(SimRequest(f"r{i}", seed=i, target=1500, weight_version="",
                                prompt=list(range(i * 100, i * 100 + 10))))
    model.advance(60.0)
    assert len(model.log) == 4 and model.counters.retracted_requests > 0
    assert sum(e["prefill_tokens"] for e in model.log) == model.counters.prefill_tokens
    for e in model.log:
        first = e["prompt_tokens"] - e["cached_tokens"]
        if e["retractions"] == 0:
            assert e["prefill_tokens"] == first
        else:  # its prompt and the output it had made, computed again
            assert e["prefill_tokens"] > first + e["retractions"]
    retracted = [e for e in model.log if e["retractions"]]
    assert recomputed_tokens(model.log) == recomputed_tokens(retracted) > 0


def test_a_step_grows_with_the_context_and_completions_match_stepping_token_by_token():
    """Each step reads the running requests' whole context: stepping token by token
    (the slow way) and the model's closed form finish each request at the same time,
    whether the clock moves in one jump or in many small ones."""
    prompts, targets = {"a": 50, "b": 400}, {"a": 30, "b": 90}
    step_ms, per_request, per_token_us = 4.0, 0.5, 20.0

    def by_hand() -> dict[str, float]:
        produced, ends, t = {"a": 0, "b": 0}, {}, 0.0
        while len(ends) < 2:
            running = [k for k in produced if k not in ends]
            context = sum(prompts[k] + produced[k] for k in running)
            t += (step_ms + per_request * len(running) + per_token_us * context / 1000) / 1000
            for k in running:
                produced[k] += 1
                if produced[k] == targets[k]:
                    ends[k] = t
        return ends

    def by_model(jumps: int) -> dict[str, float]:
        m = SimModel(slots=4, step_ms=step_ms, step_ms_per_request=per_request,
                     step_us_per_context_token=per_token_us, prefill_tokens_per_s=1e12)
        ends: dict[str, float] = {}
        for rid in prompts:
            m.submit(SimRequest(rid, seed=1, target=targets[rid], weight_version="v0",
                                prompt=list(range(prompts[rid])),
                                on_done=lambda r, _: ends.__setitem__(r.rid, m.now)))
        for k in range(1, jumps + 1):
            m.advance(2.0 * k / jumps)
        return ends

    hand = by_hand()
    assert hand["b"] > 90 * (step_ms + per_request) / 1000 * 1.5  # the context term tells
    for jumps in (1, 997):
        ends = by_model(jumps)
        for rid in prompts:
            # the closed form treats a step's growth as continuous: half a step's
            # growth apart per step at most
            assert ends[rid] == pytest.approx(hand[rid], rel=0.005), (jumps, rid)
    without = SimModel(slots=4, step_ms=step_ms, step_ms_per_request=per_request)
    assert without.decode_steps(without.decode_time(7.0)) == pytest.approx(7.0)


@pytest.mark.parametrize(("ignore_eos", "admitted"), [(False, 3), (True, 2)])
def test_an_ignore_eos_request_reserves_its_whole_output_when_others_are_admitted(
        ignore_eos, admitted):
    """SGLang 0.5.23 reserves a running request's remaining output at the decaying
    estimate (0.7 at first), but all of it for an ``ignore_eos`` request, which cannot
    end early: in a pool of 1,000 tokens, with two 400-token requests running, a third
    starts, or waits."""
    m = SimModel(slots=8, step_ms=1.0, step_ms_per_request=0.0, max_total_tokens=1000)

    def submit(i: int) -> None:
        m.submit(SimRequest(f"r{i}", seed=i, target=400, weight_version="v0", prompt=[i],
                            ignore_eos=ignore_eos))

    submit(0)
    submit(1)
    m.advance(0.005)
    assert len(m.running) == 2
    submit(2)
    m.advance(0.01)
    assert len(m.running) == admitted and len(m.waiting) == 3 - admitted
