"""One conformance suite, two engines: each behaviour of SGLang's native API that the
farm relies on, asked of the simulated replica and of a real SGLang server on this
machine's CPU (``pytest -m sglang``), with the values SGLang answers. The simulated side
runs in the fast tier."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from queue_rollout.engines.base import DuplicateRid, EngineError, Generation
from queue_rollout.engines.concurrency import parse_metrics
from queue_rollout.engines.sglang import SGLangClient
from queue_rollout.lab.sim.server import (
    CACHE_FLUSHED,
    CACHE_NOT_FLUSHED,
    WEIGHTS_NOT_FOUND,
    ThreadedSimEngine,
)
from testkit import Generating, metric_sum, running, wait_for

PROMPT = [5, 6, 7]


@dataclass
class Engine:
    client: SGLangClient
    other_weights: str  # a model_path a weight update may load
    context_length: int = 4096  # the model's (the tiny model's max_position_embeddings)
    long: int = 1500  # output tokens that run a few seconds on it


@pytest.fixture(params=["sim", pytest.param("sglang", marks=pytest.mark.sglang)])
def engine(request: pytest.FixtureRequest) -> Iterator[Engine]:
    if request.param == "sim":
        other = request.getfixturevalue("tmp_path") / "other-weights"  # a folder, as SGLang needs
        other.mkdir()
        with ThreadedSimEngine(slots=8, step_ms=20.0, context_length=4096) as sim:  # 50/s
            yield Engine(SGLangClient(sim.url, timeout=60), str(other), long=150)
    else:
        real = request.getfixturevalue("real_sglang")
        yield Engine(SGLangClient(real.url, timeout=120), str(real.other_weights))


def test_an_rid_in_flight_is_refused_and_an_abort_returns_the_partial_output(
        engine: Engine) -> None:
    """The doubt probe's ground: a second /generate with a running rid is refused; an
    abort ends it (not at once on either engine: the probe is refused until the request
    has ended, so the resolver asks again) and the first request answers with what it
    made."""
    client = engine.client
    out: dict[str, Generation] = {}
    long = {"max_new_tokens": 3000, "ignore_eos": True}
    first = threading.Thread(target=lambda: out.setdefault("g", client.generate(
        "busy", input_ids=PROMPT, sampling_params=long, timeout=120)))
    first.start()
    # probe only once the request runs: a probe that arrived first would take the rid
    wait_for(lambda: running(client) == 1, 60, "the request to run")

    def refused() -> bool:
        try:
            client.generate("busy", input_ids=[0], sampling_params={"max_new_tokens": 0},
                            return_logprob=False, timeout=30)
        except DuplicateRid:
            return True
        return False

    wait_for(refused, 60, "the probe to be refused while the rid runs")
    wait_for(lambda: client.confirm_stopped("busy"), 30, "abort-then-probe to confirm")
    first.join(60)
    g = out["g"]
    assert g.aborted and g.finish_reason["type"] == "abort"
    assert g.completion_tokens == len(g.output_ids) < 3000  # what it made before the abort
    assert client.confirm_stopped("never-seen") is True


def test_an_unknown_sampling_parameter_is_refused_naming_it(engine: Engine) -> None:
    with pytest.raises(EngineError, match="unknown field `no_such_key`") as refused:
        engine.client.generate("unknown", input_ids=PROMPT, timeout=60,
                               sampling_params={"max_new_tokens": 4, "no_such_key": 1})
    assert refused.value.status == 400


def test_a_repeated_prompt_finds_all_but_its_last_token_cached(engine: Engine) -> None:
    prompt = [9] * 40 + [11, 12]
    params = {"max_new_tokens": 2, "ignore_eos": True}
    first = engine.client.generate("cache-1", input_ids=prompt, sampling_params=params,
                                   timeout=60)
    again = engine.client.generate("cache-2", input_ids=prompt, sampling_params=params,
                                   timeout=60)
    assert (first.cached_tokens, again.cached_tokens) == (0, len(prompt) - 1)


def test_a_weight_update_while_idle_loads_and_later_tokens_carry_its_version(
        engine: Engine) -> None:
    client = engine.client
    answer = client._control("POST", "/update_weights_from_disk",
                             {"model_path": engine.other_weights, "weight_version": "v-b"})
    assert answer == {"success": True, "num_paused_requests": 0, "message":
                      "Succeeded to update model weights. Weight version updated to v-b."}
    g = client.generate("after", input_ids=PROMPT, timeout=60,
                        sampling_params={"max_new_tokens": 3, "ignore_eos": True})
    assert g.weight_version == "v-b"
    info = client._control("GET", "/model_info")
    assert (info["model_path"], info["weight_version"]) == (engine.other_weights, "v-b")


def test_a_weight_update_from_a_path_that_does_not_exist_is_refused_and_loads_nothing(
        engine: Engine, tmp_path) -> None:
    client = engine.client
    before = client._control("GET", "/model_info")
    missing = tmp_path / "no-such-weights"
    with pytest.raises(EngineError) as refused:
        client._control("POST", "/update_weights_from_disk",
                        {"model_path": str(missing), "weight_version": "v-x"})
    assert refused.value.status == 400
    assert WEIGHTS_NOT_FOUND in str(refused.value)
    after = client._control("GET", "/model_info")
    assert (after["model_path"], after["weight_version"]) == (before["model_path"],
                                                              before["weight_version"])
    g = client.generate("still", input_ids=PROMPT, timeout=60,
                        sampling_params={"max_new_tokens": 2, "ignore_eos": True})
    assert g.weight_version == before["weight_version"]


def test_a_stop_token_ends_the_output_with_it_and_says_stop(engine: Engine) -> None:
    greedy = {"max_new_tokens": 20, "temperature": 0.0}
    free = engine.client.generate("free", input_ids=PROMPT, timeout=60,
                                  sampling_params={**greedy, "ignore_eos": True})
    token = free.output_ids[3]
    first = free.output_ids.index(token)
    g = engine.client.generate("stop", input_ids=PROMPT, timeout=60,
                               sampling_params={**greedy, "stop_token_ids": [token]})
    assert g.output_ids == free.output_ids[:first + 1]
    assert g.finish_reason == {"type": "stop", "matched": token}


def queue(client: SGLangClient) -> float:
    return metric_sum(client.metrics(), "sglang:num_queue_reqs")


@pytest.mark.parametrize("mode", ["in_place", "retract", "abort"])
def test_a_pause_and_a_weight_update_while_requests_run(engine: Engine, mode: str) -> None:
    """Two requests run when the replica is paused in *mode*; a request sent while
    paused waits; weights are loaded while paused; generation continues."""
    client = engine.client
    before = client._control("GET", "/model_info")["weight_version"]
    n = engine.long
    long = Generating(client, [f"{mode}-a", f"{mode}-b"], n)
    try:
        wait_for(lambda: running(client) == 2, 60, "two requests to run")
        time.sleep(0.5)  # a few tokens each before the pause
        client.pause(mode)
        if mode == "in_place":  # they stay in the running batch, holding their KV
            assert (running(client), queue(client)) == (2, 0)
        elif mode == "retract":  # they move to the queue
            wait_for(lambda: (running(client), queue(client)) == (0, 2), 10, "retracted")
        else:  # they end with what they made
            aborted = long.join(60)
            assert all(g.aborted and 0 < len(g.output_ids) < n for g in aborted.values())
        late = Generating(client, [f"{mode}-late"], 4)
        late.threads[0].join(1.0)
        assert late.threads[0].is_alive()  # held while paused
        version = f"{mode}-v"
        body = {"model_path": engine.other_weights, "weight_version": version}
        if mode == "in_place":
            with pytest.raises(EngineError) as refused:
                client._control("POST", "/update_weights_from_disk", body)
            assert refused.value.status == 400 and CACHE_NOT_FLUSHED in str(refused.value)
            # the weights loaded, the cache stays: retracting lets the flush go through
            client.pause("retract")
        answer = client._control("POST", "/update_weights_from_disk", body)
        assert answer["success"] is True and answer["message"].endswith(
            f"Weight version updated to {version}.")
    finally:
        client.resume()
    assert late.join(60)[f"{mode}-late"].completion_tokens == 4
    answers = long.join()
    for g in answers.values():
        if mode == "abort":
            assert g.weight_spans == ((before, 0, len(g.output_ids)),)
            continue
        assert g.finish_reason == {"type": "length", "length": n}
        # the tokens before the update carry the old version, the rest the new one
        (old, start, cut), (new, cut_again, end) = g.weight_spans
        assert (old, start, new, end) == (before, 0, version, n)
        assert 0 < cut == cut_again < n
        assert g.meta_info["num_retractions"] == 1  # in place, then retracted for the update


def test_a_weight_update_that_aborts_all_requests_ends_them_with_what_they_made(
        engine: Engine) -> None:
    """AReaL's disk update: ``abort_all_requests`` while two requests run, the replica
    not paused. Both end at once with their partial output, all of it under the old
    version (not relabelled by the update that ended them); the weights load; the next
    request carries the new version."""
    client = engine.client
    before = client._control("GET", "/model_info")["weight_version"]
    n = engine.long
    long = Generating(client, ["abort-all-a", "abort-all-b"], n)
    wait_for(lambda: running(client) == 2, 60, "two requests to run")
    time.sleep(0.5)  # a few tokens each
    answer = client._control("POST", "/update_weights_from_disk",
                             {"model_path": engine.other_weights, "weight_version": "v-all",
                              "abort_all_requests": True})
    assert answer["success"] is True
    for g in long.join(60).values():
        assert g.aborted and 0 < len(g.output_ids) < n
        assert g.weight_spans == ((before, 0, len(g.output_ids)),)
    after = client.generate("after-abort-all", input_ids=PROMPT, timeout=60,
                            sampling_params={"max_new_tokens": 2, "ignore_eos": True})
    assert after.weight_version == "v-all"


def test_flush_cache_is_refused_while_a_request_runs_and_empties_the_cache_after(
        engine: Engine) -> None:
    client = engine.client
    prompt = [13] * 30 + [14]
    params = {"max_new_tokens": 2, "ignore_eos": True}
    client.generate("warm", input_ids=prompt, sampling_params=params, timeout=60)
    busy = Generating(client, ["flush-busy"], engine.long)
    wait_for(lambda: running(client) == 1, 60, "the request to run")
    with pytest.raises(EngineError) as refused:
        client._control("POST", "/flush_cache")
    assert refused.value.status == 400 and "Flush cache failed." in str(refused.value)
    client.abort("flush-busy")
    busy.join(60)
    # the abort's answer may come before the scheduler has let the request go
    def flush() -> bytes | None:
        status, text = client._request("POST", "/flush_cache", None, 60)
        return text if status == 200 else None

    assert wait_for(flush, 30, "the flush to go through").decode() == CACHE_FLUSHED
    again = client.generate("cold", input_ids=prompt, sampling_params=params, timeout=60)
    assert again.cached_tokens == 0


def test_metrics_carry_what_the_adaptive_controller_reads(engine: Engine) -> None:
    text = engine.client.metrics()
    kinds = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    for name in ("sglang:token_usage", "sglang:num_queue_reqs", "sglang:num_running_reqs"):
        assert kinds[name] == "gauge"
    signal = parse_metrics(text)
    assert signal is not None and signal.running is not None
    # the retraction counter, once there is one, is a counter
    assert kinds.get("sglang:num_retracted_requests_total", "counter") == "counter"


def test_a_prompt_longer_than_the_context_is_refused(engine: Engine) -> None:
    context = engine.context_length
    with pytest.raises(EngineError, match=rf"The input \({context + 10} tokens\) is longer "
                                          rf"than the model's context length \({context} "
                                          r"tokens\)") as refused:
        engine.client.generate("too-long", input_ids=[7] * (context + 10), timeout=60,
                               sampling_params={"max_new_tokens": 2})
    assert refused.value.status == 400


def test_server_info_answers_a_json_object_naming_its_limits(engine: Engine) -> None:
    info = engine.client.server_info()
    assert info["max_total_num_tokens"] > 0 and info["max_running_requests"] > 0


def test_the_watch_s_probe_costs_the_replica_no_request_and_health_answers(
        engine: Engine) -> None:
    """The workers watch a replica through /model_info; /health (a one-token
    generation and a second's sleep on SGLang) serves readiness only."""
    client = engine.client
    requests = metric_sum(client.metrics(), "sglang:num_requests_total")
    assert all(client.alive(timeout=30) for _ in range(3))
    assert metric_sum(client.metrics(), "sglang:num_requests_total") == requests
    assert client.healthy(timeout=30)
