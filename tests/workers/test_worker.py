"""`queue-rollout worker`: real processes on a real Redis and a simulated replica."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rq.serializers import JSONSerializer
from rq.worker import Worker

from queue_rollout.config import load_config
from queue_rollout.engines.sglang import SGLangClient
from queue_rollout.lab.sim.server import ThreadedSimEngine
from queue_rollout.ledger.core import Ledger
from queue_rollout.ledger.jobs import flush_outbox
from queue_rollout.ledger.status import farm_status
from queue_rollout.workers.resolver import resolve_doubt
from testkit import G2_B1, rewrite_farm, wait_for, write_farm


@pytest.fixture
def engine():
    with ThreadedSimEngine(slots=4, step_ms=0.5) as e:  # 2,000 tokens/s
        yield e


@pytest.fixture
def farm_toml(tmp_path, redis_url) -> Path:
    return write_farm(tmp_path / "farm.toml", farm={"name": "w", "redis_url": redis_url},
                      rollout={**G2_B1, "max_staleness": 10},
                      # a process per slot: the tests kill one and watch the other
                      engine={"slots_per_replica": 2, "threads_per_process": 1},
                      timeouts={"shutdown_grace": 2, "lease": 3, "pause_barrier": 2})


def start_worker(farm_toml: Path, url: str, log: Path | None = None) -> subprocess.Popen:
    exe = shutil.which("queue-rollout", path=str(Path(sys.executable).parent))
    return subprocess.Popen([exe, "worker", "--gpu", "0", "--engine-url", url,
                             "-c", str(farm_toml)], stdout=subprocess.PIPE, text=True,
                            stderr=None if log is None else open(log, "wb"))


def dispatch(r, ledger: Ledger, n: int, lengths: list[int]) -> None:
    """Submit *n* prompts p0.. with *lengths*, admit them all, enqueue their jobs."""
    ledger.submit((f"p{i}", json.dumps({"id": f"p{i}", "prompt": "x",
                                        "member_lengths": lengths}).encode())
                  for i in range(n))
    for _ in range(n):
        assert ledger.admit().status == "admitted"
    assert flush_outbox(r, ledger.keys) == n * len(lengths)


def rq_workers(r) -> list[Worker]:
    return Worker.all(connection=r, serializer=JSONSerializer)


@pytest.mark.e2e
def test_worker_runs_episodes_restarts_a_killed_process_and_stops_cleanly(r, engine, farm_toml):
    config = load_config(farm_toml)
    ledger = Ledger.from_config(r, config)
    proc = start_worker(farm_toml, engine.url)
    try:
        assert "2 episode slots in 2 processes" in proc.stdout.readline()
        wait_for(lambda: len(rq_workers(r)) == 2, what="2 RQ workers")
        (worker_id, raw), = r.hgetall(ledger.keys.workers).items()
        record = json.loads(raw)
        assert record["slots"] == 2 and record["replica"] == engine.url
        status = farm_status(r, config, redis_url="x")
        assert status["workers"] == {"alive": 1, "slots": 2, "limits": {worker_id.decode(): 2}}

        dispatch(r, ledger, 4, [50, 200])
        wait_for(lambda: ledger.counters().get("finished", 0) == 8, what="8 finished episodes")
        assert ledger.counters()["output_tokens"] == 4 * 250

        before = {w.pid for w in rq_workers(r)}
        os.kill(next(iter(before)), signal.SIGKILL)
        # (the killed process's RQ registration lingers until its TTL, as RQ does)
        wait_for(lambda: {w.pid for w in rq_workers(r)} - before, what="a restarted process")
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    assert r.hlen(ledger.keys.workers) == 0


@pytest.mark.e2e
def test_a_member_after_its_sibling_finds_the_prompt_cached_and_the_ledger_counts_it(
        r, farm_toml):
    """One slot on the replica: the group's second member runs after the first, whose
    context stays in the replica's prefix cache; each result and the ledger's counters
    say how much of the context was computed and how much found cached."""
    from queue_rollout.results import decode_result

    config = load_config(farm_toml)
    ledger = Ledger.from_config(r, config)
    prompt = list(range(1000, 1400))
    ledger.submit([("p0", json.dumps({"id": "p0", "input_ids": prompt,
                                      "member_lengths": [30, 30]}).encode())])
    assert ledger.admit().status == "admitted"
    assert flush_outbox(r, ledger.keys) == 2
    with ThreadedSimEngine(slots=1, step_ms=0.5) as engine:
        proc = start_worker(farm_toml, engine.url)
        try:
            wait_for(lambda: ledger.counters().get("finished", 0) == 2, what="2 episodes")
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
    results = [decode_result(ledger.result("p0", m) or b"", 1 << 20) for m in (0, 1)]
    assert sorted((x.prompt_tokens, x.cached_tokens) for x in results) == [
        (400, 0), (400, 399)]
    counters = ledger.counters()
    assert (counters["prefill:computed"], counters["prefill:cached"]) == (401, 399)


@pytest.mark.e2e
def test_threaded_worker_runs_its_slots_in_one_process_and_drains_on_sigterm(r, engine, farm_toml):
    rewrite_farm(farm_toml, engine={"threads_per_process": 2})
    config = load_config(farm_toml)
    ledger = Ledger.from_config(r, config)
    proc = start_worker(farm_toml, engine.url)
    try:
        assert "2 episode slots in 1 process on " in proc.stdout.readline()
        wait_for(lambda: len(rq_workers(r)) == 2, what="2 RQ workers")
        assert len({w.pid for w in rq_workers(r)}) == 1  # two threads of one process
        dispatch(r, ledger, 1, [1500, 1500])
        wait_for(lambda: ledger.counters().get("running", 0) == 2, what="2 running at once")
        proc.send_signal(signal.SIGTERM)  # within the grace (2 s) both episodes finish
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    c = ledger.counters()
    assert c.get("finished", 0) == 2 and c.get("reserved", 0) == 0
    assert rq_workers(r) == []  # every thread deregistered from RQ


def test_resolver_retries_on_a_boot_change_and_after_abort_then_probe(r, engine, farm_toml):
    config = load_config(farm_toml)
    ledger = Ledger.from_config(r, config)
    ledger.submit([(p, json.dumps({"id": p, "prompt": "x", "member_lengths": [5, 5]}).encode())
                   for p in "pqr"])
    a, b = ledger.admit().attempt_ids
    c_, moved = ledger.admit().attempt_ids
    unknown, _ = ledger.admit().attempt_ids
    client = SGLangClient(engine.url)
    ledger.start(a, "w", engine.url, "old-boot", 30)
    ledger.start(b, "w", engine.url, "boot-now", 30)
    # another host's worker: its replica listens on the same loopback URL, on its host
    ledger.start(c_, "other-host-gpu0", engine.url, "their-boot", 30)
    # this worker's replica before a hard stop of its launcher, then on another port
    old_url = "http://127.0.0.1:9"
    ledger.start(moved, "w", old_url, "boot-before", 30)
    ledger.start(unknown, "w", old_url, "", 30)  # no boot id: nothing to tell it by
    for aid in (a, b, c_, moved, unknown):
        ledger.mark_doubtful(aid, "lease_expired")
    # an earlier boot's attempt is settled at once, whatever its URL; the current
    # boot's waits min_age
    outcome = resolve_doubt(ledger, client, "boot-now", worker_id="w", min_age=3600)
    assert outcome == {a: "replica restarted: retried", moved: "replica restarted: retried"}
    outcome = resolve_doubt(ledger, client, "boot-now", worker_id="w", min_age=0)
    assert outcome == {b: "confirmed stopped: retried"}
    assert ledger.attempt(c_).state == "doubtful"  # not ours to settle: left alone
    assert ledger.attempt(unknown).state == "doubtful"  # not probed at the wrong replica
    c = ledger.counters()
    assert c["retries:replica_restart"] == 2 and c["retries:lease_expired"] == 1
    assert c["doubtful"] == 2 and c["reserved"] == 6


@pytest.mark.e2e
def test_a_worker_against_a_replica_without_a_boot_id_runs_and_resolves_doubt(
        r, farm_toml, tmp_path):
    """SGLang started by hand reports no boot id: the worker starts without --boot-id,
    runs episodes, says that stops are confirmed by abort-then-probe, and settles a
    doubtful attempt of its own that way."""
    import socket

    config = load_config(farm_toml)
    ledger = Ledger.from_config(r, config)
    log = tmp_path / "worker.log"
    with ThreadedSimEngine(slots=4, step_ms=0.5) as engine:
        engine.server.boot_id = ""  # as SGLang: /server_info has no boot id
        assert not SGLangClient(engine.url).server_info().get("boot_id")
        proc = start_worker(farm_toml, engine.url, log=log)
        try:
            assert "(boot unknown)" in proc.stdout.readline()
            dispatch(r, ledger, 2, [50, 60])
            wait_for(lambda: ledger.counters().get("finished", 0) == 4, what="4 episodes")
            # an attempt this worker started whose request is gone (its process died)
            ledger.submit([("d", b'{"id": "d", "prompt": "x", "member_lengths": [5, 5]}')])
            first, second = ledger.admit().attempt_ids
            me = f"{socket.gethostname()}-gpu0"
            for aid in (first, second):
                assert ledger.start(aid, me, engine.url, "", 30).status == "started"
                ledger.mark_doubtful(aid, "lease_expired")
            # the supervisor probes them (doubt older than a lease, 3 s) and retries
            wait_for(lambda: ledger.counters().get("retries:lease_expired", 0) == 2, 30,
                     "both doubtful attempts settled by abort-then-probe")
            flush_outbox(r, ledger.keys)  # the collector's job: hand the retries to RQ
            wait_for(lambda: ledger.counters().get("finished", 0) == 6, what="retries ran")
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(60) == 0
    assert "a stop is confirmed by abort-then-probe alone" in log.read_text()
    c = ledger.counters()
    assert c.get("retries:replica_restart", 0) == 0 and c.get("doubtful", 0) == 0


@pytest.mark.e2e
def test_pause_barrier_resume_and_weight_update_through_live_workers(r, engine, farm_toml,
                                                                    tmp_path):
    from queue_rollout.client.rollout import RolloutClient
    from queue_rollout.errors import BarrierTimeout

    client = RolloutClient.from_config(farm_toml)
    sglang = SGLangClient(engine.url)
    proc = start_worker(farm_toml, engine.url)
    try:
        assert "2 episode slots in 2 processes" in proc.stdout.readline()
        client.pause()  # returns only once the worker paused its replica
        assert sglang.server_info()["paused"] == "in_place" and client.ledger.paused()
        client.resume()
        wait_for(lambda: sglang.server_info()["paused"] is None, what="replica resumed")
        client.update_weights(str(tmp_path), 3)  # a folder: the replica loads it
        assert sglang.server_info()["weight_version"] == "3"
        assert client.version() == 3 and not client.ledger.paused()
        wait_for(lambda: sglang.server_info()["paused"] is None, what="replica resumed")
        # a worker that is registered and alive but never answers: the barrier names it
        r.hset(client.ledger.keys.workers, "ghost-gpu9", json.dumps({"slots": 1}))
        r.zadd(client.ledger.keys.workers_seen, {"ghost-gpu9": time.time() + 3600})
        with pytest.raises(BarrierTimeout, match=r"1 worker\(s\): ghost-gpu9"):
            client.pause()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0


@pytest.mark.e2e
def test_a_dead_replica_costs_one_attempt_per_slot_and_its_restart_is_settled_at_once(
        r, tmp_path, farm_toml):
    """SIGKILL the replica with episodes running and jobs queued; keep it down for 3 s:
    the episode processes take no job while /health fails (without that gate each one
    spins through the queue, every job retried as generate_error, until max_attempts
    fails the episodes). Back under a new boot: new episode processes, the old boot's
    attempts retried as replica_restart, every episode finished."""
    from queue_rollout.ledger.embedded import free_port
    from queue_rollout.procs import cli_exe

    port = free_port()
    url = f"http://127.0.0.1:{port}"

    def replica() -> subprocess.Popen:
        proc = subprocess.Popen([cli_exe(), "sim-engine", "--port", str(port), "--slots", "4",
                                 "--step-ms", "2", "-c", str(farm_toml)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(lambda: SGLangClient(url, timeout=1).healthy(timeout=1), what="replica up")
        return proc

    config = load_config(farm_toml)
    ledger = Ledger.from_config(r, config)
    engine_proc = replica()
    first_boot = SGLangClient(url).server_info()["boot_id"]
    log_path = tmp_path / "worker.log"
    proc = start_worker(farm_toml, url, log=log_path)
    try:
        dispatch(r, ledger, 4, [400, 400])
        wait_for(lambda: ledger.counters().get("running", 0) == 2, what="2 running")
        engine_proc.kill()
        engine_proc.wait()
        time.sleep(3.0)
        c = ledger.counters()
        retried = sum(v for k, v in c.items() if k.startswith("retries:"))
        assert retried <= 2, c  # one attempt per episode process, at most
        assert c.get("failed", 0) == 0
        engine_proc = replica()
        wait_for(lambda: ledger.counters().get("finished", 0) == 8, 60, "8 finished episodes",
                 tick=lambda: flush_outbox(r, ledger.keys))  # retries (no collector here)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        engine_proc.kill()
    log = log_path.read_text()
    assert f"replica {url} unreachable" in log
    assert f"replica restarted (boot {first_boot} -> " in log
    c = ledger.counters()
    assert c.get("failed", 0) == 0 and c.get("reserved", 0) == 0
    assert c.get("retries:replica_restart", 0) + c.get("retries:generate_error", 0) >= 2


@pytest.mark.e2e
def test_a_forged_job_is_deleted_unrun_and_the_worker_carries_on(r, engine, farm_toml, tmp_path):
    """RQ imports and calls whatever function a job names: anyone who can write the
    queue could name os.system. The episode worker never reads a job's payload: it runs
    the attempt the job's id names, and the ledger knows none by these ids."""
    from rq import Queue
    from rq.job import Callback

    from queue_rollout.ledger.keys import EPISODE_JOB_FUNC

    config = load_config(farm_toml)
    ledger = Ledger.from_config(r, config)
    marker = tmp_path / "pwned"
    queue = Queue(ledger.keys.rq_queue, connection=r, serializer=JSONSerializer)
    forged = [queue.enqueue("os.system", f"touch {marker}"),
              queue.enqueue(EPISODE_JOB_FUNC, "x", extra="y"),
              queue.enqueue(EPISODE_JOB_FUNC, "x", on_failure=Callback("os.system"))]
    proc = start_worker(farm_toml, engine.url, log=tmp_path / "worker.log")
    try:
        dispatch(r, ledger, 1, [5, 5])
        wait_for(lambda: ledger.counters().get("finished", 0) == 2, what="the real episodes")
        wait_for(lambda: r.llen(f"rq:queue:{ledger.keys.rq_queue}") == 0, what="queue drained")
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    assert not marker.exists()
    assert not any(r.exists(job.key) for job in forged)  # deleted, not failed with callbacks
    log = (tmp_path / "worker.log").read_text()
    # a job is its id: one that names no attempt of the farm runs nothing at all
    for job in forged:
        assert f"job {job.id} names no attempt of farm w: deleted unrun" in log
    assert r.llen(f"rq:queue:{ledger.keys.rq_queue}:intermediate") == 0


@pytest.mark.e2e
def test_a_killed_worker_leaves_the_live_set_within_three_leases(r, engine, farm_toml):
    """The supervisor reports itself alive every lease / 3, not every few milliseconds;
    a dead one still drops out of the live workers ("auto" capacity, status, the pause
    barrier) three leases after its last report (lease = 3 s here)."""
    from testkit import process_tree

    config = load_config(farm_toml)
    proc = start_worker(farm_toml, engine.url)
    try:
        assert "2 episode slots" in proc.stdout.readline()
        status = farm_status(r, config, redis_url="x")
        assert (status["workers"]["alive"], status["workers"]["slots"]) == (1, 2)
        time.sleep(2.0)  # a report or two later: still alive
        assert farm_status(r, config, redis_url="x")["workers"]["alive"] == 1
        for pid in process_tree(proc.pid):
            os.kill(pid, signal.SIGKILL)
        # 3 leases after its last report, which was at most lease / 3 before the kill
        wait_for(lambda: farm_status(r, config, redis_url="x")["workers"]["alive"] == 0,
                 timeout=15, what="the dead worker leaving the live set")
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.e2e
def test_a_worker_says_what_it_waits_for_on_sigterm_and_a_second_one_stops_it_now(
        r, engine, farm_toml):
    rewrite_farm(farm_toml, timeouts={"shutdown_grace": 120})
    ledger = Ledger.from_config(r, load_config(farm_toml))
    proc = start_worker(farm_toml, engine.url)
    try:
        assert "2 episode slots" in proc.stdout.readline()
        dispatch(r, ledger, 1, [500_000, 500_000])  # 250 s each
        wait_for(lambda: ledger.counters().get("running", 0) == 2, what="2 running")
        proc.send_signal(signal.SIGTERM)
        assert proc.stdout.readline().endswith(
            ": stopping: its running episodes have up to 120 s to finish (then they are "
            "aborted and handed back); Ctrl-C again (or a second SIGTERM) to stop now\n")
        proc.send_signal(signal.SIGTERM)
        stopped_at = time.monotonic()
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0
        assert time.monotonic() - stopped_at < 60  # not the 120 s of grace
        assert "episode processes stopped now; what they ran is redone once its leases " \
            "expire" in out
    finally:
        if proc.poll() is None:
            proc.kill()
    assert r.hlen(ledger.keys.workers) == 0  # deregistered all the same
