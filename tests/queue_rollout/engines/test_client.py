"""One conformance suite at the engine-client seam, three engines: what a worker asks of
its replica, through the client ``engine.kind`` picks (:func:`engine_client`), asked of
the simulated replica (the fast tier), a real SGLang (``pytest -m sglang``) and a real
vLLM (``pytest -m vllm``) on this machine's CPU. Where the engines differ, the row says
what each one answered (:class:`Differs`); nothing is loosened to make them agree."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from queue_rollout.engines.base import EngineClient, EngineError, Generation
from queue_rollout.engines.client import engine_client
from queue_rollout.engines.concurrency import parse_metrics
from queue_rollout.errors import BadInput
from queue_rollout.lab.sim.server import ThreadedSimEngine

PROMPT = [5, 6, 7]


@dataclass(frozen=True)
class Differs:
    """What one engine answers where the three do not agree."""

    confirms_stop: bool  # a stopped request can be told from a running one by its id
    abort_spares_others: bool  # an abort by id always leaves the other requests running
    pause_aborts_all: bool  # a pause in abort mode ends every request sent before it
    in_place_holds: bool  # a request paused in place is always held until resume
    boot_id: bool  # its server info names the process (a restart is seen by the id)
    seeded: bool  # the same seed samples the same tokens again
    retract: bool  # it can pause by retracting running requests to its queue
    unknown_key: type[Exception]  # what a sampling key it lacks raises


DIFFERS = {
    "sim": Differs(confirms_stop=True, abort_spares_others=True, pause_aborts_all=True,
                   in_place_holds=True, boot_id=True, seeded=True, retract=True,
                   unknown_key=EngineError),
    # SGLang on the CPU takes sampling_seed and samples anew each time
    "sglang": Differs(confirms_stop=True, abort_spares_others=True, pause_aborts_all=True,
                      in_place_holds=True, boot_id=False, seeded=False, retract=True,
                      unknown_key=EngineError),
    # vLLM refuses no id in flight, its abort answers alike for any id, its gauges lag;
    # an abort of one of two running requests has ended both (with four, the other three
    # ran on): whether the other runs on is not asserted; a pause in abort mode ends what
    # the engine runs, and a request still on its way in (seen: one of two sent 3.5 s
    # before) is held and runs in full after resume; a request paused in place (`keep`)
    # ended under the pause within a second in one of three runs (a farm of vLLM
    # replicas pauses in abort mode only)
    "vllm": Differs(confirms_stop=False, abort_spares_others=False, pause_aborts_all=False,
                    in_place_holds=False, boot_id=True, seeded=True, retract=False,
                    unknown_key=BadInput),
}


@dataclass
class Engine:
    name: str
    client: EngineClient
    home: str  # the weights it started on
    other: str  # weights a weight update may load
    context_length: int
    long: int  # output tokens that run for seconds on it
    computes: bool  # its tokens come from its weights (the simulated replica's do not)
    probe: list[int]  # a prompt whose greedy output tells its two weights apart

    @property
    def differs(self) -> Differs:
        return DIFFERS[self.name]

    def settle(self, threads: list[threading.Thread]) -> None:
        """Until *threads*' requests run: SGLang's gauge says so; vLLM's lags (one read
        0 with four running), so there the clock decides."""
        if self.name == "vllm":
            time.sleep(3.0)
            return
        names = self.client.metric_names

        def running() -> bool:
            signal = parse_metrics(self.client.metrics(), names)
            return signal is not None and (signal.running or 0) >= len(threads)

        deadline = time.monotonic() + 60
        while not running():
            assert time.monotonic() < deadline, "the requests did not start"
            time.sleep(0.1)


@pytest.fixture(params=["sim", pytest.param("sglang", marks=pytest.mark.sglang),
                        pytest.param("vllm", marks=pytest.mark.vllm)])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    if request.param == "sim":
        home, other = tmp_path / "home", tmp_path / "other"  # folders, as SGLang needs
        home.mkdir()
        other.mkdir()
        with ThreadedSimEngine(slots=8, step_ms=20.0, context_length=4096) as sim:  # 50/s
            yield Engine("sim", engine_client("sglang", sim.url), str(home), str(other),
                         4096, 150, computes=False, probe=PROMPT)
        return
    if request.param == "sglang":
        real = request.getfixturevalue("real_sglang")
        client = engine_client("sglang", real.url)
        yield Engine("sglang", client, str(real.model_path), str(real.other_weights),
                     4096, 1500, computes=True, probe=PROMPT)
        return
    from real_engine.vllm_server import untied_model

    server = request.getfixturevalue("real_vllm")
    vllm = engine_client("vllm", server.url)
    vllm.resume()
    other = untied_model(request.getfixturevalue("vllm_python"), 1)
    # an abort or a pause lands up to seconds late on vLLM: its requests run longer
    yield Engine("vllm", vllm, str(server.model_path), str(other),
                 vllm.max_model_len(), 3500, computes=True,  # type: ignore[attr-defined]
                 probe=list(range(5, 305)))


def generating(client: EngineClient, rids: list[str], params: dict[str, object],
               out: dict[str, Generation]) -> list[threading.Thread]:
    """*rids* generating, each in a thread; their answers land in *out*."""
    threads = [threading.Thread(target=lambda rid=rid: out.setdefault(rid, client.generate(
        rid, input_ids=PROMPT, sampling_params=params, timeout=300))) for rid in rids]
    for t in threads:
        t.start()
    return threads


def greedy(engine: Engine, rid: str, n: int = 24) -> Generation:
    return engine.client.generate(rid, input_ids=engine.probe, timeout=300,
                                  sampling_params={"max_new_tokens": n, "ignore_eos": True,
                                                   "temperature": 0.0})


@pytest.mark.parametrize("n", [1, 7, 64])
def test_exact_lengths_with_a_logprob_per_token(engine: Engine, n: int) -> None:
    g = engine.client.generate(f"len-{n}", input_ids=PROMPT, timeout=120,
                               sampling_params={"max_new_tokens": n, "ignore_eos": True})
    assert len(g.output_ids) == g.completion_tokens == len(g.logprobs) == n
    assert g.finish_reason == {"type": "length", "length": n}
    assert g.prompt_tokens == len(PROMPT) and not g.aborted
    assert all(lp <= 0.0 for lp in g.logprobs)


def test_an_abort_by_id_ends_that_request_with_what_it_made_and_a_stop_is_confirmed_or_not(
        engine: Engine) -> None:
    """The doubt resolver's ground: abort-then-confirm ends the request (aborting it each
    time it asks); an engine that can tell a stopped id from a running one confirms it
    once the request ended, and an id it never saw; vLLM confirms nothing. An abort by
    id ends a request alone on the engine too."""
    client, out = engine.client, {}
    # the whole context ahead: on a loaded CPU vLLM's abort lands seconds late
    budget = {"max_new_tokens": engine.context_length - len(PROMPT), "ignore_eos": True}
    threads = generating(client, ["busy", "other"], budget, out)
    engine.settle(threads)
    confirmed, deadline = False, time.monotonic() + 60
    while threads[0].is_alive() or not confirmed:
        assert time.monotonic() < deadline, "abort-then-confirm did not end the request"
        confirmed = client.confirm_stopped("busy")
        assert not confirmed or engine.differs.confirms_stop
        if not engine.differs.confirms_stop and not threads[0].is_alive():
            break
        threads[0].join(0.5)
    g = out["busy"]
    assert g.aborted and g.finish_reason["type"] == "abort", (g.finish_reason, len(g.output_ids))
    assert (len(g.output_ids) == len(g.logprobs) == g.completion_tokens
            < engine.context_length - len(PROMPT))
    if engine.differs.abort_spares_others:
        assert threads[1].is_alive()  # an abort of one id left the other running
        client.abort("other")
        threads[1].join(60)
        assert out["other"].aborted, (out["other"].finish_reason, len(out["other"].output_ids))
    # where "other" may have ended with "busy" or run on for seconds (vLLM), it may also
    # be near its end: the next abort goes to a request that has its whole budget ahead
    client.abort("other")
    threads[1].join(300)
    late = generating(client, ["late"], budget, out)
    engine.settle(late)
    client.abort("late")
    late[0].join(60)
    assert not late[0].is_alive(), "the abort did not end the request"
    g = out["late"]
    assert g.aborted and len(g.output_ids) < engine.context_length - len(PROMPT), (
        g.finish_reason, len(g.output_ids))
    assert client.confirm_stopped("never-seen") is engine.differs.confirms_stop


def test_a_pause_in_abort_mode_ends_running_requests_then_resume_serves(
        engine: Engine) -> None:
    client, out = engine.client, {}
    threads = generating(client, ["pa-0", "pa-1"], {"max_new_tokens": engine.long,
                                                    "ignore_eos": True}, out)
    engine.settle(threads)
    time.sleep(0.5)  # a few tokens each
    client.pause("abort")
    try:
        for t in threads:  # an abort lands seconds late on vLLM; a held request stays
            t.join(60 if engine.differs.pause_aborts_all else 10)
        if engine.differs.pause_aborts_all:
            assert all(not t.is_alive() for t in threads)
    finally:
        client.resume()
    for t in threads:
        t.join(300)
    ended = {rid: (g.finish_reason, len(g.output_ids)) for rid, g in out.items()}
    aborted = [g for g in out.values() if g.aborted and 0 < len(g.output_ids) < engine.long]
    held = [g for g in out.values() if g.finish_reason == {"type": "length",
                                                           "length": engine.long}]
    assert len(aborted) + len(held) == 2 and aborted, ended
    assert not held or not engine.differs.pause_aborts_all, ended
    after = client.generate("pa-after", input_ids=PROMPT, timeout=60,
                            sampling_params={"max_new_tokens": 3, "ignore_eos": True})
    assert len(after.output_ids) == 3


def test_a_request_paused_in_place_resumes_with_the_tokens_it_would_have_made(
        engine: Engine) -> None:
    alone = greedy(engine, "kept-ref", engine.long)
    out: dict[str, Generation] = {}
    thread = threading.Thread(target=lambda: out.setdefault("kept", greedy(
        engine, "kept", engine.long)))
    thread.start()
    engine.settle([thread])
    engine.client.pause("in_place")
    try:
        thread.join(1.0)
        assert thread.is_alive() or not engine.differs.in_place_holds  # held, not ended
    finally:
        engine.client.resume()
    thread.join(300)
    assert out["kept"].finish_reason == {"type": "length", "length": engine.long}
    assert out["kept"].output_ids == alone.output_ids


def test_a_retracting_pause_is_taken_or_refused_before_anything_is_sent(
        engine: Engine) -> None:
    if not engine.differs.retract:
        with pytest.raises(EngineError, match="refused"):
            engine.client.pause("retract")
        after = engine.client.generate("rt-after", input_ids=PROMPT, timeout=60,
                                       sampling_params={"max_new_tokens": 2})
        assert len(after.output_ids) <= 2  # not paused
        return
    out: dict[str, Generation] = {}
    threads = generating(engine.client, ["rt"], {"max_new_tokens": engine.long,
                                                 "ignore_eos": True}, out)
    engine.settle(threads)
    engine.client.pause("retract")
    try:
        threads[0].join(1.0)
        assert threads[0].is_alive()  # back in the queue, not ended
    finally:
        engine.client.resume()
    threads[0].join(300)
    assert out["rt"].finish_reason == {"type": "length", "length": engine.long}


def test_a_weight_update_loads_and_later_tokens_carry_its_version(engine: Engine) -> None:
    before = greedy(engine, "w-before")
    try:
        engine.client.update_weights_from_disk(engine.other, weight_version="7")
        after = greedy(engine, "w-after")
        assert after.weight_version == "7" and after.version_runs(6) == [(7, 24)]
        if engine.computes:
            assert after.output_ids != before.output_ids
    finally:
        engine.client.update_weights_from_disk(engine.home, weight_version="default")
    assert greedy(engine, "w-back").output_ids == before.output_ids


def test_a_seed_samples_the_same_tokens_again_where_the_engine_honours_it(
        engine: Engine) -> None:
    params = {"max_new_tokens": 24, "ignore_eos": True, "temperature": 1.0,
              "sampling_seed": 1234}
    runs = [engine.client.generate(f"seed-{i}", input_ids=PROMPT, sampling_params=params,
                                   timeout=120).output_ids for i in range(2)]
    other = engine.client.generate("seed-other", input_ids=PROMPT, timeout=120,
                                   sampling_params={**params, "sampling_seed": 99})
    assert (runs[0] == runs[1]) is engine.differs.seeded
    assert other.output_ids != runs[0]


def test_what_the_engine_refuses(engine: Engine) -> None:
    """A prompt and budget past the model's context is refused, never cut; a sampling key
    the engine lacks is refused naming it."""
    with pytest.raises(EngineError, match="longer than the model's context length") as exc:
        engine.client.generate("too-long", input_ids=[7] * (engine.context_length + 10),
                               timeout=60, sampling_params={"max_new_tokens": 2})
    assert exc.value.status == 400
    with pytest.raises(engine.differs.unknown_key, match="no_such_key"):
        engine.client.generate("unknown", input_ids=PROMPT, timeout=60,
                               sampling_params={"max_new_tokens": 4, "no_such_key": 1})


def test_health_metrics_and_the_boot_id(engine: Engine) -> None:
    client = engine.client
    assert client.alive() and client.healthy(timeout=30) and client.health_problem() is None
    signal = parse_metrics(client.metrics(), client.metric_names)
    assert signal is not None and 0.0 <= signal.token_usage <= 1.0
    assert bool(client.server_info().get("boot_id")) is engine.differs.boot_id
