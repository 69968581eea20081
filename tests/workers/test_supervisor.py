"""The supervisor's logic in process, against an in-process simulated replica: its
record in the registry, its episode processes' layout, and the trainer's controls
followed and acknowledged. (Its signals, restarts and SIGKILL are proved on real
processes in tests/workers/test_worker.py, `pytest -m e2e`.)"""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import threading
import time

import msgspec
import pytest

from queue_rollout.client.rollout import RolloutClient
from queue_rollout.collector.loop import Collector
from queue_rollout.config import Config
from queue_rollout.engines.sglang import PAUSE_MODES, SGLangClient
from queue_rollout.errors import BarrierTimeout, ClockSkewed
from queue_rollout.lab.sim.server import ThreadedSimEngine
from queue_rollout.lab.virtual.clock import ManualClock
from queue_rollout.ledger.core import Ledger
from queue_rollout.ledger.embedded import free_port
from queue_rollout.ledger.registry import Ack, Registry
from queue_rollout.procs import cli_exe
from queue_rollout.workers.resolver import resolve_doubt
from queue_rollout.workers.rq_worker import SPEC_ENV
from queue_rollout.workers.supervisor import Supervisor
from testkit import Generating, greedy, metric_sum, running, wait_for, write_farm


def test_registers_its_replica_lays_out_its_slots_and_follows_the_controls(r, redis_url,
                                                                         tmp_path):
    config = msgspec.convert({"farm": {"name": "sv", "redis_url": redis_url},
                              "engine": {"slots_per_replica": 5, "threads_per_process": 2}},
                             Config)
    with ThreadedSimEngine(slots=5, step_ms=0.5) as engine:
        sup = Supervisor(config, gpu=3, engine_url=engine.url)
        sup.wait_for_replica(timeout=10)
        boot = str(sup.client.server_info()["boot_id"])
        assert sup.boot_id == boot and "reported" in sup.confirmation(given=False)
        registry = Registry(r, sup.keys, config.timeouts.lease)
        sup.register(registry)
        record = registry.live()[sup.worker_id]
        assert (record["gpu"], record["slots"], record["boot"]) == (3, 5, boot)
        assert record["replica"] == engine.url and sup.worker_id.endswith("-gpu3")

        # 5 slots in processes of 2 threads: 2 + 2 + 1, each told its first slot
        children = sup._children()
        specs = [child.env for child in children]
        assert [c.argv[-1] for c in children] == ["queue_rollout.workers.rq_worker"] * 3
        assert all(env is not None for env in specs)
        assert [spec_env_fields(env) for env in specs if env] == [(0, 2), (2, 2), (4, 1)]

        ledger = Ledger.from_config(r, config)
        epoch = ledger.pause("abort")
        sup._follow_controls(registry)
        assert engine.server.model.paused
        assert registry.acks("pause", [sup.worker_id]) == {sup.worker_id: Ack(epoch)}
        ledger.set_paused(False)
        sup._follow_controls(registry)
        assert not engine.server.model.paused

        ledger.pause("abort")
        sup._follow_controls(registry)
        weights = registry.request_weights(str(tmp_path), 7)
        sup._follow_controls(registry)
        assert registry.acks("weights", [sup.worker_id]) == {sup.worker_id: Ack(weights)}
        assert engine.server.model.weight_version == "7"


def spec_env_fields(env: dict[str, str]) -> tuple[int, int]:
    """(first slot, threads) of an episode process, from the environment it is given."""
    spec = json.loads(env[SPEC_ENV])
    return spec["first_slot"], spec["threads"]


def test_a_boot_id_the_replica_reports_wins_over_the_one_given(r, redis_url):
    """A launcher's ``--boot-id`` and a replica that names its own start (a vLLM server's
    instance id): the worker takes the replica's, so its watch sees no restart and the
    resolver settles no doubtful attempt of its own boot as ``replica_restart``."""
    config = msgspec.convert({"farm": {"name": "boots", "redis_url": redis_url},
                              "rollout": {"group_size": 1, "batch_size": 1}}, Config)
    with ThreadedSimEngine(slots=2, step_ms=0.5) as engine:
        reported = str(SGLangClient(engine.url).server_info()["boot_id"])
        sup = Supervisor(config, gpu=0, engine_url=engine.url, boot_id="launcher-id")
        assert sup.wait_for_replica(timeout=10)
        assert sup.boot_id == reported != "launcher-id"
        assert "reported" in sup.confirmation(given=False)
        registry = Registry(r, sup.keys, config.timeouts.lease)
        assert [sup._watch_replica(registry) for _ in range(3)] == [False] * 3
        assert sup.boot_id == reported
        ledger = Ledger.from_config(r, config)
        ledger.submit([("p", b'{"id": "p"}')])
        [aid] = ledger.admit().attempt_ids
        ledger.start(aid, sup.worker_id, engine.url, sup.boot_id, 30)
        ledger.mark_doubtful(aid, "lease_expired")
        assert resolve_doubt(ledger, sup.client, sup._current_boot(), worker_id=sup.worker_id,
                             min_age=60) == {}  # young, of this boot: left to revive
        assert ledger.attempt(aid).state == "doubtful"


@pytest.mark.sglang
def test_the_replica_watch_sees_no_outage_on_a_real_server_and_makes_it_generate_nothing(
        real_sglang, r, redis_url, caplog):
    """SGLang's /health generates a token and takes about a second: a watch with a
    one-second timeout saw outages that were not there, and cost a prefill each time."""
    config = msgspec.convert({"farm": {"name": "watch", "redis_url": redis_url}}, Config)
    sup = Supervisor(config, gpu=0, engine_url=real_sglang.url)  # health_s = 1.0
    registry = Registry(r, sup.keys, config.timeouts.lease)
    prefilled = metric_sum(sup.client.metrics(), "sglang:prefill_effective_tokens_total")
    assert [sup._watch_replica(registry) for _ in range(5)] == [False] * 5
    assert sup._replica_up and "unreachable" not in caplog.text
    assert metric_sum(sup.client.metrics(),
                      "sglang:prefill_effective_tokens_total") == prefilled


@pytest.mark.parametrize("mode", PAUSE_MODES)
def test_a_weight_update_while_episodes_run_loads_in_every_pause_mode(
        replica, r, redis_url, mode):
    """SGLang refuses to flush its cache over requests paused in place (HTTP 400 after
    loading the weights): the worker retracts them first. Every mode loads, the requests
    that ran on say where their weights changed, and a greedy request afterwards equals
    the new weights' output on a freshly started server."""
    config = msgspec.convert({"farm": {"name": f"wu-{mode}", "redis_url": redis_url},
                              "engine": {"pause_mode": mode}}, Config)
    sup = Supervisor(config, gpu=0, engine_url=replica.url)
    client = SGLangClient(replica.url, timeout=120)
    registry = Registry(r, sup.keys, config.timeouts.lease)
    ledger = Ledger.from_config(r, config)
    episodes = Generating(client, [f"wu-{mode}-0", f"wu-{mode}-1"], replica.long)
    try:
        wait_for(lambda: running(client) == 2, 60, "two requests to run")
        time.sleep(0.5)  # a few tokens each before the pause
        ledger.pause(mode)
        sup._follow_controls(registry)
        version = 20 + PAUSE_MODES.index(mode)  # one each: the server is shared
        epoch = registry.request_weights(replica.other_weights, version)
        sup._follow_controls(registry)
        assert registry.acks("weights", [sup.worker_id]) == {sup.worker_id: Ack(epoch)}
    finally:
        ledger.set_paused(False)
        sup._follow_controls(registry)  # resumes the replica
    for g in episodes.join().values():
        runs = g.version_runs(8)
        if mode == "abort":  # they ended at the pause, under the old weights
            assert g.aborted and len(runs) == 1 and runs[0][0] != version
        else:  # the old weights' tokens, then the new ones'
            assert [v == version for v, _ in runs] == [False, True]
            assert sum(n for _, n in runs) == replica.long
    after = greedy(client, "greedy")
    assert after.weight_version == str(version)
    if replica.reference is not None:
        assert after.output_ids == replica.reference


def test_a_worker_on_its_way_out_resumes_the_replica_it_paused(r, redis_url):
    config = msgspec.convert({"farm": {"name": "out", "redis_url": redis_url}}, Config)
    with ThreadedSimEngine(slots=2, step_ms=1.0) as engine:
        sup = Supervisor(config, gpu=0, engine_url=engine.url)
        registry = Registry(r, sup.keys, config.timeouts.lease)
        Ledger.from_config(r, config).pause("in_place")
        sup._follow_controls(registry)
        assert engine.server.model.paused == "in_place"
        sup._shutdown(registry)
        assert engine.server.model.paused is None


# -- waiting for the replica -----------------------------------------------------------

def waiting_supervisor(stop_at: float | None = None) -> tuple[Supervisor, ManualClock]:
    """A supervisor whose replica URL has nothing listening, on a manual clock that its
    sleeps advance; *stop_at*: a SIGTERM arrives when the clock reaches it."""
    config = msgspec.convert({"farm": {"name": "wait"}}, Config)
    clock = ManualClock(start=0.0)
    sup: Supervisor

    def sleep(seconds: float) -> None:
        clock.advance(seconds)
        if stop_at is not None and clock.now >= stop_at:
            sup._on_signal(signal.SIGTERM, None)

    sup = Supervisor(config, gpu=0, engine_url=f"http://127.0.0.1:{free_port()}",
                     clock=clock, sleep=sleep)
    return sup, clock


def test_a_worker_says_what_it_waits_for_and_gives_up_after_the_wait_with_a_timeout(caplog):
    caplog.set_level(logging.INFO, logger="queue_rollout.workers.supervisor")
    sup, clock = waiting_supervisor()
    with pytest.raises(BarrierTimeout) as raised:
        sup.wait_for_replica(timeout=120, say_every=5)
    assert raised.value.exit_code == 3  # the CLI's exit status for a timeout
    message = str(raised.value)
    assert sup.engine_url in message and "connection refused" in message
    assert "120 s" in message and clock.now >= 120
    said = [r.getMessage() for r in caplog.records if "waiting for its replica" in r.getMessage()]
    # at once, then every 5 s: the URL and the last answer each time
    assert len(said) == 120 // 5
    assert all(sup.engine_url in line and "connection refused" in line for line in said)
    assert said[0].endswith("(0 s of 120 s)") and said[-1].endswith("(115 s of 120 s)")


def test_a_stop_during_the_wait_ends_it_at_once_without_a_timeout():
    sup, clock = waiting_supervisor(stop_at=40.0)
    assert sup.wait_for_replica(timeout=120) is False
    assert 40 <= clock.now < 41  # the next slice of the sleep: not the rest of the wait
    assert sup.waiting_for == f"{sup.engine_url}: connection refused"


@pytest.mark.e2e
def test_a_worker_process_stopped_while_it_waits_says_so_and_exits_0(redis_url, tmp_path):
    toml = write_farm(tmp_path / "farm.toml", farm={"name": "wait", "redis_url": redis_url})
    url = f"http://127.0.0.1:{free_port()}"
    worker = subprocess.Popen([cli_exe(), "worker", "--gpu", "0", "--engine-url", url,
                               "-c", str(toml)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    assert worker.stderr is not None
    line = worker.stderr.readline()  # said at once, not after 120 s
    assert f"waiting for its replica {url}: connection refused (0 s of 120 s)" in line, line
    worker.send_signal(signal.SIGTERM)
    out, err = worker.communicate(timeout=30)
    assert worker.returncode == 0, err
    assert "stopped before its replica was ready" in out, out
    assert f"for {url}: connection refused)" in out, out
    assert "Traceback" not in err and "within 120" not in err + out


@pytest.mark.parametrize("url", ["localhost:30000", "http://", "http://host:port"])
def test_a_malformed_engine_url_is_bad_input_exit_2(url, tmp_path):
    done = subprocess.run([cli_exe(), "worker", "--gpu", "0", "--engine-url", url],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr == (f"queue-rollout: --engine-url: engine URL must be "
                           f"http(s)://host:port, got {url!r}\n")


@pytest.mark.e2e
def test_a_worker_clock_far_from_redis_s_refuses_work_and_one_within_the_tolerance_runs(
        r, redis_url):
    """Leases of 3 s (renewed every second), so a tolerance of 1 s. A worker built with
    its clock 10 s behind Redis's refuses to start, naming both clocks, before it
    registers; one 0.9 s behind (it and its episode processes) runs episodes of about 6 s,
    each over several renewals, beside an unskewed collector: every group comes back
    whole, nothing doubted, nothing run twice."""
    config = msgspec.convert({"farm": {"name": "skew", "redis_url": redis_url},
                              "rollout": {"group_size": 2, "batch_size": 1,
                                          "max_concurrent_samples": 4, "max_staleness": 100},
                              "engine": {"slots_per_replica": 4, "threads_per_process": 2},
                              "timeouts": {"lease": 3, "shutdown_grace": 2}}, Config)
    tolerance = config.timeouts.skew_tolerance
    assert tolerance == 1.0
    ledger = Ledger.from_config(r, config)
    with ThreadedSimEngine(slots=4, step_ms=2.0) as engine:  # 3,000 tokens: 6 s
        far = Supervisor(config, gpu=0, engine_url=engine.url, clock_offset=-10 * tolerance)
        with pytest.raises(ClockSkewed) as refused:
            far.run()
        message = str(refused.value)
        assert message.startswith(f"worker {far.worker_id}: this process's clock reads ")
        assert "and the Redis server's " in message and " s apart (the call took " in message
        assert ", beyond timeouts.clock_skew = 1 s" in message
        assert r.hlen(far.keys.workers) == 0  # refused before it registered

        near = Supervisor(config, gpu=0, engine_url=engine.url, clock_offset=-0.9 * tolerance)
        worker = threading.Thread(target=near.run, daemon=True)
        stop = threading.Event()
        worker.start()
        try:
            Collector(ledger, config, name="test").start(stop)
            client = RolloutClient.from_config(config)
            client.submit({"id": f"s{i}", "prompt": "x", "member_lengths": [3000, 3000]}
                          for i in range(4))
            got = []
            for _ in range(4):
                batch = client.get_batch(timeout=120)
                got += [(g.id, [len(m.output_ids) for m in g.members]) for g in batch.groups]
                client.ack(batch)
        finally:
            stop.set()
            near.stop()
            worker.join(60)
    assert sorted(got) == [(f"s{i}", [3000, 3000]) for i in range(4)]
    counters = ledger.counters()
    assert {k: v for k, v in counters.items()
            if k.startswith(("retries:", "doubts:")) and v} == {}, counters
    assert counters["finished"] == 8 and counters.get("reserved", 0) == 0
