"""The engine model on model time: prefill and the prefix cache, KV memory,
admission and retraction, pause modes and weight updates (SGLang's behaviour, see the
model's docstring for the source of each rule)."""

from __future__ import annotations

import pytest

from queue_rollout.lab.sim.model import OOM_MESSAGE, PromptTooLong, SimModel, SimRequest

STEP_S = 0.001  # step_ms 1, nothing per request


def model(**kw: float) -> SimModel:
    return SimModel(slots=8, step_ms=1.0, step_ms_per_request=0.0, **kw)  # type: ignore[arg-type]


def request(rid: str, target: int, prompt: list[int]) -> SimRequest:
    return SimRequest(rid, seed=sum(map(ord, rid)), target=target, weight_version="v",
                      prompt=prompt)


def ended(m: SimModel, rid: str) -> dict[str, object]:
    """The model's log entry of *rid*'s (last) end."""
    return [e for e in m.log if e["rid"] == rid][-1]


PROMPT = list(range(5000, 5000 + 4000))


def test_the_second_request_with_one_prompt_hits_the_cache_and_skips_its_prefill() -> None:
    m = model(prefill_tokens_per_s=1000.0)  # a 4,000-token prompt: 4 s of prefill
    first = request("a", 100, PROMPT)
    m.submit(first)
    m.advance(10.0)
    assert ended(m, "a")["ended"] == pytest.approx(4.0 + 100 * STEP_S)
    assert first.cached_tokens == 0
    second = request("b", 100, PROMPT)
    m.submit(second)
    m.advance(20.0)
    # SGLang reuses at most the prompt less one token (it computes one for the logits)
    assert second.cached_tokens == len(PROMPT) - 1
    took = float(ended(m, "b")["ended"]) - 10.0  # type: ignore[arg-type]
    assert took == pytest.approx(1 / 1000 + 100 * STEP_S)  # one token of prefill
    first_took = float(ended(m, "a")["ended"])  # type: ignore[arg-type]
    assert first_took - took == pytest.approx((len(PROMPT) - 1) / 1000)
    assert m.counters.cached_tokens == len(PROMPT) - 1
    assert m.log[-1]["cached_tokens"] == len(PROMPT) - 1


def test_prefill_stalls_decode_and_runs_in_chunks() -> None:
    m = model(prefill_tokens_per_s=1000.0, chunked_prefill_size=1000)
    m.submit(request("run", 3000, [1, 2, 3]))
    m.advance(1.0)  # ~1,000 tokens decoded
    produced = m.running["run"].produced
    m.submit(request("long", 10, list(range(100, 2600))))  # 2,500 tokens: 3 rounds
    m.advance(1.0 + 2.5 - 1e-6)
    assert m.running["run"].produced == pytest.approx(produced, abs=1e-6)  # stalled
    assert "long" not in m.running
    m.advance(1.0 + 2.5 + 5 * STEP_S)
    assert "long" in m.running and m.running["run"].produced > produced


def test_growth_past_the_pool_retracts_the_request_sglang_picks_and_it_completes_later() -> None:
    # admission estimates at most clip_max_new_tokens of output per request (SGLang's
    # SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION): three requests of 1,000 output tokens are
    # admitted to a pool of 2,400 and outgrow it together
    m = model(max_total_tokens=2400, chunked_prefill_size=2048, prefill_tokens_per_s=1e6,
              clip_max_new_tokens=100)
    for rid, prompt in (("a", list(range(10))), ("long-prompt", list(range(100, 200))),
                        ("b", list(range(300, 310)))):
        m.submit(request(rid, 1000, prompt))
    m.advance(0.01)
    assert set(m.running) == {"a", "long-prompt", "b"}
    m.advance(10.0)
    # equal outputs when the pool ran out: the longest prompt went first, and only it
    assert m.counters.retracted_requests == 1
    assert [e["rid"] for e in m.log if e["retractions"]] == ["long-prompt"]
    assert m.log[-1]["rid"] == "long-prompt"
    assert {e["rid"]: (e["tokens"], e["finish"]) for e in m.log} == {
        "a": (1000, "length"), "long-prompt": (1000, "length"), "b": (1000, "length")}
    assert m.counters.retracted_output_tokens > 700
    assert m.new_token_ratio > 0.098  # re-estimated after the retraction
    assert m.used_tokens() <= m.max_total_tokens


def test_one_request_larger_than_the_pool_is_clamped_and_a_prompt_too_large_refused() -> None:
    m = model(max_total_tokens=1000, chunked_prefill_size=512, prefill_tokens_per_s=1e6)
    big = request("big", 5000, list(range(100)))
    m.submit(big)
    m.advance(10.0)
    # SGLang's max_req_len (the pool less one) less the prompt, less one
    assert (ended(m, "big")["tokens"], ended(m, "big")["finish"]) == (1000 - 1 - 100 - 1,
                                                                       "length")
    with pytest.raises(PromptTooLong):
        m.submit(request("huge", 1, list(range(2000))))
    assert OOM_MESSAGE.startswith("Out of memory")


@pytest.mark.parametrize(("mode", "recomputed_s"), [("abort", 0.001), ("retract", 0.5)])
def test_abort_keeps_the_context_cached_and_retract_recomputes_the_output(
        mode: str, recomputed_s: float) -> None:
    m = model(prefill_tokens_per_s=1000.0)
    r = request("a", 2000, PROMPT[:1000])
    m.submit(r)
    m.advance(1.0 + 0.5)  # 1 s of prefill, then 500 tokens
    assert r.tokens == 500
    m.pause(mode)  # type: ignore[arg-type]
    m.advance(5.0)
    m.resume()
    if mode == "abort":  # ended; the worker sends prompt + output so far again
        assert ended(m, "a")["finish"] == "abort"
        r = request("a", 1500, [*PROMPT[:1000], *r.output(500)])
        m.submit(r)
        assert r.cached_tokens == 1000 + 500 - 1
    else:  # back in the queue, its prompt still cached, its output not
        assert "a" not in m.running and r.retractions == 1  # counted in its answer
    m.advance(5.0 + recomputed_s - 1e-4)
    assert "a" not in m.running
    m.advance(5.0 + recomputed_s + 1e-4)
    assert "a" in m.running


def test_a_weight_update_flushes_the_cache_only_when_idle() -> None:
    m = model()
    m.submit(request("a", 10, PROMPT[:100]))
    assert m.update_weights("2") is False  # a request in flight: SGLang keeps the cache
    m.advance(1.0)
    assert m.cache.tokens > 0
    assert m.update_weights("3") is True and m.cache.tokens == 0
    assert m.weight_version == "3"


def test_admission_waits_for_room_as_sglang_estimates_it() -> None:
        # each request may need 600 tokens: a pool of 1,500 admits two, not three
    m = model(max_total_tokens=1500, chunked_prefill_size=1024, prefill_tokens_per_s=1e6)
    for rid in ("a", "b", "c"):
        m.submit(request(rid, 590, [ord(rid)] * 10))
    m.advance(0.0001)
    assert set(m.running) == {"a", "b"} and [r.rid for r in m.waiting] == ["c"]
    m.advance(10.0)
    assert {e["rid"] for e in m.log} == {"a", "b", "c"}
    assert m.counters.retracted_requests == 0


def test_a_retracted_request_waits_while_its_held_prefix_would_not_fit() -> None:
    """Sixteen 13,000-token contexts outgrow a 220,000-token pool as they decode: one is
    retracted. Its context stays cached and evictable; counted as free room it would be
    admitted again at once and retracted again, forever. Once held it no longer fits
    (SGLang re-checks after locking the prefix), so it waits for a request to end."""
    m = SimModel(slots=16, step_ms=1.0, step_ms_per_request=0.0, prefill_tokens_per_s=1e7)
    for i in range(16):
        m.submit(request(f"r{i}", 1000, list(range(i * 10**6, i * 10**6 + 13_000))))
    events = 0
    while (t := m.next_event()) != float("inf"):
        m.advance(t)
        events += 1
        assert events < 2_000, f"no progress: {m.counters.retracted_requests} retractions"
    assert sorted(e["tokens"] for e in m.log) == [1000] * 16
    assert 1 <= m.counters.retracted_requests <= 3
