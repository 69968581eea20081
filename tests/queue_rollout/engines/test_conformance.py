"""One conformance suite, two engines: each behaviour of SGLang's native API that the
farm relies on, asked of the simulated replica and of a real SGLang server on this
machine's CPU (``pytest -m sglang``), with the values SGLang answers. The simulated side
runs in the fast tier."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from queue_rollout.engines.sglang import DuplicateRid, EngineError, Generation, SGLangClient
from queue_rollout.engines.sim_server import ThreadedSimEngine
from testkit import metric_sum, wait_for

PROMPT = [5, 6, 7]


@dataclass
class Engine:
    client: SGLangClient
    other_weights: str  # a model_path a weight update may load


@pytest.fixture(params=["sim", pytest.param("sglang", marks=pytest.mark.sglang)])
def engine(request: pytest.FixtureRequest) -> Iterator[Engine]:
    if request.param == "sim":
        with ThreadedSimEngine(slots=8, step_ms=20.0) as sim:  # 50 tokens/s
            yield Engine(SGLangClient(sim.url, timeout=60), "/models/other")
    else:
        real = request.getfixturevalue("real_sglang")
        yield Engine(SGLangClient(real.url, timeout=120), str(real.other_weights))


def running(client: SGLangClient) -> float:
    """``sglang:num_running_reqs`` from the replica's /metrics (both engines export it)."""
    return metric_sum(client.metrics(), "sglang:num_running_reqs")


@pytest.mark.parametrize("n", [1, 7, 64])
def test_ignore_eos_gives_exactly_max_new_tokens_and_says_length(engine, n):
    g = engine.client.generate(f"len-{n}", input_ids=PROMPT, timeout=120,
                        sampling_params={"max_new_tokens": n, "ignore_eos": True,
                                         "temperature": 0.0})
    assert len(g.output_ids) == g.completion_tokens == n
    assert g.finish_reason == {"type": "length", "length": n}
    assert g.prompt_tokens == len(PROMPT) and len(g.logprobs) == n


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
    info = client._control("GET", "/get_model_info")
    assert (info["model_path"], info["weight_version"]) == (engine.other_weights, "v-b")
