"""The simulated replica over HTTP, through the SGLang client (real sockets)."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from collections.abc import Iterator

import pytest

from queue_rollout.engines.base import DuplicateRid, EngineError, GenerateUncertain
from queue_rollout.engines.sglang import SGLangClient
from queue_rollout.lab.sim.server import ThreadedSimEngine


class Replica(ThreadedSimEngine):
    def __init__(self, step_ms: float, slots: int = 8, request_log=None) -> None:
        super().__init__(slots=slots, step_ms=step_ms, request_log=request_log)
        self.client = SGLangClient(self.url, timeout=5)


@pytest.fixture
def replica() -> Iterator[Replica]:
    r = Replica(step_ms=0.05)  # 20,000 tokens/s: fast tests
    yield r
    r.close()


@pytest.fixture
def slow_replica() -> Iterator[Replica]:
    r = Replica(step_ms=20.0)  # 50 tokens/s: requests that stay in flight
    yield r
    r.close()


def in_background(fn, *args, **kwargs):
    out: dict = {}

    def run() -> None:
        try:
            out["value"] = fn(*args, **kwargs)
        except Exception as exc:
            out["error"] = exc

    t = threading.Thread(target=run)
    t.start()
    return t, out


def wait_until(predicate, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def test_generate_is_deterministic_in_the_seed_and_exact_with_ignore_eos(replica):
    params = {"max_new_tokens": 200, "ignore_eos": True, "sampling_seed": 7, "temperature": 1.0}
    a = replica.client.generate("r1", input_ids=[1, 2, 3], sampling_params=params, timeout=5)
    b = replica.client.generate("r2", input_ids=[1, 2, 3], sampling_params=params, timeout=5)
    c = replica.client.generate("r3", input_ids=[1, 2, 3],
                                sampling_params={**params, "sampling_seed": 8}, timeout=5)
    assert a.completion_tokens == len(a.output_ids) == 200 == len(a.logprobs)
    assert a.finish_reason == {"type": "length", "length": 200}
    assert (a.output_ids, a.logprobs) == (b.output_ids, b.logprobs)
    assert a.output_ids != c.output_ids
    assert a.prompt_tokens == 3 and a.weight_version == "default"


def test_unknown_sampling_keys_are_refused_like_a_real_server(replica):
    with pytest.raises(EngineError, match="unknown field `seed`") as info:
        replica.client.generate("r", input_ids=[1], sampling_params={"seed": 1}, timeout=5)
    assert info.value.status == 400


def test_math_answers_follow_p_correct(replica):
    def text(seed: int, p: float) -> str:
        params = {"max_new_tokens": 50, "sampling_seed": seed,
                  "custom_params": {"sim_answer": "42", "sim_p_correct": p}}
        return replica.client.generate(f"m{seed}{p}", text="2*21?", sampling_params=params,
                                       timeout=5).text

    assert all(text(s, 1.0).endswith("\\boxed{42}") for s in range(5))
    assert not any(text(s, 0.0).endswith("\\boxed{42}") for s in range(5))


def test_an_rid_in_flight_is_refused_and_abort_then_probe_confirms_the_stop(slow_replica):
    client = slow_replica.client
    params = {"max_new_tokens": 10_000, "ignore_eos": True}
    t, out = in_background(client.generate, "busy", input_ids=[1], sampling_params=params,
                           timeout=30)
    wait_until(lambda: client.server_info()["running"] == 1)
    with pytest.raises(DuplicateRid):
        client.generate("busy", input_ids=[0], sampling_params={"max_new_tokens": 0}, timeout=5)
    time.sleep(0.2)  # ~10 tokens at 50 tokens/s: the abort returns a partial output
    assert client.confirm_stopped("busy") is True
    t.join(5)
    assert out["value"].aborted and 0 < out["value"].completion_tokens < 10_000
    assert client.confirm_stopped("never-seen") is True


def test_a_timeout_is_uncertain_and_the_replica_aborts_the_abandoned_request(slow_replica):
    client = slow_replica.client
    with pytest.raises(GenerateUncertain, match="timed out"):
        client.generate("slow", input_ids=[1], sampling_params={"max_new_tokens": 10_000,
                                                                "ignore_eos": True}, timeout=0.3)
    wait_until(lambda: client.server_info()["running"] == 0)  # SGLang aborts on disconnect
    assert slow_replica.server.model.log[-1]["finish"] == "abort"


def test_pause_in_place_holds_requests_and_abort_mode_ends_them(slow_replica):
    client = slow_replica.client
    params = {"max_new_tokens": 10_000, "ignore_eos": True}
    t, out = in_background(client.generate, "p1", input_ids=[1], sampling_params=params,
                           timeout=30)
    wait_until(lambda: client.server_info()["running"] == 1)
    client.pause("in_place")
    info = client.server_info()
    assert info["paused"] == "in_place" and info["running"] == 1
    client.pause("abort")
    t.join(5)
    assert out["value"].aborted
    t2, out2 = in_background(client.generate, "p2", input_ids=[1],
                             sampling_params={"max_new_tokens": 1, "ignore_eos": True}, timeout=30)
    time.sleep(0.2)
    assert "value" not in out2  # a paused server holds new requests
    client.resume()
    t2.join(5)
    assert out2["value"].completion_tokens == 1


def test_weight_update_sets_the_version_reported_with_results(replica, tmp_path):
    client = replica.client
    client.pause("in_place")
    result = client.update_weights_from_disk(str(tmp_path), weight_version="3")
    client.resume()
    assert result["success"] and "Weight version updated to 3" in result["message"]
    gen = client.generate("w", input_ids=[1], sampling_params={"max_new_tokens": 3}, timeout=5)
    assert gen.weight_version == "3" and client.server_info()["weight_version"] == "3"


def test_health_boot_ids_and_the_request_log(tmp_path):
    log = tmp_path / "requests.jsonl"
    a, b = Replica(0.05, request_log=log), Replica(0.05)
    try:
        assert a.client.healthy() and b.client.healthy()
        assert a.client.server_info()["boot_id"] != b.client.server_info()["boot_id"]
        a.client.generate("logged", input_ids=[1], sampling_params={"max_new_tokens": 5,
                                                                     "ignore_eos": True}, timeout=5)
        a.server.healthy = False
        assert not a.client.healthy()
    finally:
        a.close()
        b.close()
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(e["rid"], e["tokens"], e["finish"]) for e in entries] == [("logged", 5, "length")]
    assert entries[0]["boot_id"] == a.server.boot_id


def test_an_unreachable_replica_is_an_engine_error_not_a_doubt():
    client = SGLangClient("http://127.0.0.1:1", timeout=1)
    assert not client.healthy()
    with pytest.raises(EngineError) as info:
        client.generate("x", input_ids=[1], sampling_params={}, timeout=1)
    assert not isinstance(info.value, GenerateUncertain)


def test_the_sim_engine_command_serves_on_loopback(tmp_path):
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    from queue_rollout.ledger.embedded import free_port

    exe = shutil.which("queue-rollout", path=str(Path(sys.executable).parent))
    port = free_port()
    proc = subprocess.Popen([exe, "sim-engine", "--port", str(port), "--slots", "4"],
                            stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert f"listening on http://127.0.0.1:{port}" in line
        client = SGLangClient(f"http://127.0.0.1:{port}", timeout=5)
        assert client.server_info()["max_running_requests"] == 4
        gen = client.generate("cli", input_ids=[1], timeout=5,
                              sampling_params={"max_new_tokens": 3, "ignore_eos": True})
        assert gen.completion_tokens == 3
    finally:
        proc.terminate()
        proc.wait(5)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_the_sim_engine_command_stops_on_ctrl_c_or_sigterm_even_started_with_sigint_ignored(
        sig):
    """A background job of a script starts with SIGINT ignored, and Python then raises
    no KeyboardInterrupt: the command's own handlers stop it, closed, exit 0."""
    from queue_rollout.ledger.embedded import free_port
    from queue_rollout.procs import cli_exe

    ignoring = 'trap "" INT; exec "$0" sim-engine --port "$1"'  # as `cmd &` in a script
    proc = subprocess.Popen(["sh", "-c", ignoring, cli_exe(), str(free_port())],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert "listening on" in proc.stdout.readline()
        proc.send_signal(sig)
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_metrics_use_sglang_gauge_names(slow_replica):
    import urllib.request

    client = slow_replica.client
    t, _ = in_background(client.generate, "m", input_ids=[1], timeout=30,
                         sampling_params={"max_new_tokens": 10_000, "ignore_eos": True})
    wait_until(lambda: client.server_info()["running"] == 1)
    text = urllib.request.urlopen(slow_replica.url + "/metrics", timeout=5).read().decode()
    assert 'sglang:num_running_reqs{model_name="sim"} 1' in text
    assert 'sglang:gen_throughput{model_name="sim"} 50.0\n' in text  # 1 / 20 ms
    client.abort("m")
    t.join(5)


def test_lengths_without_ignore_eos_are_seeded_and_long_tailed():
    from queue_rollout.lab.sim.server import output_length

    lengths = [output_length(seed, {"max_new_tokens": 16384}) for seed in range(2000)]
    assert lengths == [output_length(seed, {"max_new_tokens": 16384}) for seed in range(2000)]
    lengths.sort()
    median, p99 = lengths[1000], lengths[1980]
    assert 1500 < median < 2600 and p99 > 5 * median and max(lengths) <= 16384


def test_an_output_that_ends_on_its_own_says_stop_and_one_cut_at_max_new_tokens_length(
        replica):
    """SGLang says ``stop`` (with the token matched) for an EOS: the simulated replica's
    seeded end is its EOS. An output the budget cut says ``length``."""
    from queue_rollout.lab.sim.server import output_length

    seeds = range(200)
    short = next(s for s in seeds if output_length(s, {"max_new_tokens": 64}) < 64)
    cut = next(s for s in seeds if output_length(s, {"max_new_tokens": 64}) == 64)
    params = {"max_new_tokens": 64}
    ended = replica.client.generate("ends", input_ids=[1, 2], timeout=5,
                                    sampling_params={**params, "sampling_seed": short})
    assert 0 < len(ended.output_ids) < 64
    assert ended.finish_reason == {"type": "stop", "matched": ended.output_ids[-1]}
    full = replica.client.generate("cut", input_ids=[1, 2], timeout=5,
                                   sampling_params={**params, "sampling_seed": cut})
    assert full.finish_reason == {"type": "length", "length": 64}


# -- the engine model over HTTP: the same script as the model in virtual time ----------

SCRIPT = [(0.0, "a", list(range(10))), (0.02, "long-prompt", list(range(100, 200))),
          (0.04, "b", list(range(300, 310)))]
KV = {"max_total_tokens": 2400, "chunked_prefill_size": 2048, "prefill_tokens_per_s": 1e6,
      "clip_max_new_tokens": 100}


def _metric(text: str, name: str) -> float:
    line = next(x for x in text.splitlines() if x.startswith(f"sglang:{name}{{"))
    return float(line.rsplit(" ", 1)[1])


def test_the_replica_and_the_model_in_virtual_time_agree_on_one_script():
    """Three requests outgrow the KV pool together; the replica (real time, HTTP) and
    the model driven by hand (virtual time) retract the same one, and every request
    ends with its exact tokens; /metrics counts the retraction with SGLang's names."""
    import urllib.request

    from queue_rollout.lab.sim.model import SimModel, SimRequest

    model = SimModel(slots=8, step_ms=0.2, step_ms_per_request=0.0, **KV)  # type: ignore[arg-type]
    for at, rid, prompt in SCRIPT:
        model.advance(at)
        model.submit(SimRequest(rid, seed=1, target=1000, weight_version="v", prompt=prompt))
    model.advance(60.0)
    expected = {e["rid"]: (e["tokens"], e["retractions"]) for e in model.log}
    assert sorted(v[1] for v in expected.values()) == [0, 0, 1]

    with ThreadedSimEngine(slots=8, step_ms=0.2, **KV) as engine:
        client = SGLangClient(engine.url, timeout=30)
        started = time.monotonic()
        calls = []
        for at, rid, prompt in SCRIPT:
            time.sleep(max(0.0, started + at - time.monotonic()))
            calls.append(in_background(client.generate, rid, input_ids=prompt, timeout=30,
                                       sampling_params={"max_new_tokens": 1000,
                                                        "ignore_eos": True}))
        for t, _ in calls:
            t.join(30)
        got = {out["value"].rid: (out["value"].completion_tokens,
                                  out["value"].meta_info["num_retractions"])
               for _, out in calls}
        metrics = urllib.request.urlopen(engine.url + "/metrics", timeout=5).read().decode()
    assert got == expected
    assert _metric(metrics, "num_retracted_requests_total") == 1.0
    assert _metric(metrics, "generation_tokens_total") == 3000.0
    assert _metric(metrics, "prompt_tokens_total") == 120.0
    assert "# TYPE sglang:num_retracted_requests_total counter" in metrics
    assert "# TYPE sglang:token_usage gauge" in metrics


def test_a_repeated_prompt_reports_its_cached_tokens_in_meta_info_and_metrics():
    import urllib.request

    with ThreadedSimEngine(slots=4, step_ms=0.05) as engine:
        client = SGLangClient(engine.url, timeout=10)
        prompt = list(range(1000, 1300))
        params = {"max_new_tokens": 5, "ignore_eos": True}
        first = client.generate("p1", input_ids=prompt, sampling_params=params, timeout=10)
        second = client.generate("p2", input_ids=prompt, sampling_params=params, timeout=10)
        by_text = client.generate("t1", text="abcdefgh", sampling_params=params, timeout=10)
        metrics = urllib.request.urlopen(engine.url + "/metrics", timeout=5).read().decode()
    assert (first.prompt_tokens, first.meta_info["cached_tokens"]) == (300, 0)
    assert (second.prompt_tokens, second.meta_info["cached_tokens"]) == (300, 299)
    assert by_text.prompt_tokens == 2  # one token per 4 UTF-8 bytes
    assert _metric(metrics, "cached_tokens_total") == 299.0
    assert 0 < _metric(metrics, "cache_hit_rate") < 1


#: (name, type, help) of SGLang's metrics the replica serves, as the wheels 0.5.10 and
#: 0.5.23 define them (sglang/srt/observability/metrics_collector.py)
SGLANG_METRICS = [
    ("num_running_reqs", "gauge", "The number of running requests."),
    ("num_queue_reqs", "gauge", "The number of requests in the waiting queue."),
    ("gen_throughput", "gauge", "The generation throughput (token/s)."),
    ("token_usage", "gauge", "The token usage."),
    ("num_used_tokens", "gauge", "The number of used tokens."),
    ("max_total_num_tokens", "gauge", "Maximum total number of tokens in the KV cache pool."),
    ("cache_hit_rate", "gauge", "The prefix cache hit rate."),
    ("new_token_ratio", "gauge", "The new token ratio."),
    ("num_retracted_reqs", "gauge", "The number of retracted requests."),
    ("num_retracted_requests_total", "counter", "Total number of retracted requests."),
    ("num_retracted_input_tokens_total", "counter", "Total number of retracted input tokens."),
    ("num_retracted_output_tokens_total", "counter",
     "Total number of retracted output tokens."),
    ("prompt_tokens_total", "counter", "Number of prefill tokens processed."),
    ("generation_tokens_total", "counter", "Number of generation tokens processed."),
    ("cached_tokens_total", "counter",
     "Number of cached prompt tokens by source (device/host/storage)."),
    ("num_requests_total", "counter", "Number of requests processed."),
    ("num_aborted_requests_total", "counter", "Number of requests aborted."),
]


def test_metrics_have_sglangs_names_types_and_help(replica):
    import urllib.request

    text = urllib.request.urlopen(replica.url + "/metrics", timeout=5).read().decode()
    declared = [line for line in text.splitlines() if line.startswith("#")]
    expected = [line for name, kind, doc in SGLANG_METRICS
                for line in (f"# HELP sglang:{name} {doc}", f"# TYPE sglang:{name} {kind}")]
    assert declared == expected
    assert 'sglang:cached_tokens_total{model_name="sim",cache_source="device"} 0.0' in text


def test_the_sim_engine_on_a_port_in_use_says_so_in_one_line_and_exits_2():
    import socket
    import subprocess

    from queue_rollout.procs import cli_exe

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        done = subprocess.run([cli_exe(), "sim-engine", "--port", str(port)],
                              capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr == (f"queue-rollout: --port {port} is in use: [Errno 98] Address "
                           f"already in use (127.0.0.1:{port}); stop what holds it or choose "
                           "another port\n")
