"""The chaos soak (DESIGN I5, I8): a farm under `queue-rollout node` (2 simulated replicas,
one episode process per slot), a collector and a trainer, while faults are injected:
SIGKILLs of random episode processes, one collector kill, one Redis kill -9 and restart
(``appendfsync always``), one replica kill, and duplicate notifications (results and
claims of attempts that already ended).

At the end: every group delivered or rejected exactly once (an episode killed
`max_attempts` times fails, and its group is rejected: `failed_members`; then fewer
than B accepted groups may be left over, since a batch is exactly B groups), every
delivered member with its exact length, no slot reserved, `doctor` clean, every
duplicate refused, and the replicas' own request logs show no two requests of one
episode (same seed) running at the same time.

Time to detect, per fault kind, measured from the injection: an episode process's
attempt leaving ``running`` (its lease expired and the reconciler marked it doubtful);
the collector's leadership passing to the restarted one; Redis answering again and the
next episode finishing; ``node`` recording a new boot for the killed replica; a
duplicate being refused (the call's own answer).

The default suite runs a short version; `pytest -m soak` runs 2,000 episodes and prints
the figures (see docs/en/reliability.md)."""

from __future__ import annotations

import json
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import pytest
from redis.exceptions import RedisError
from rq.serializers import JSONSerializer
from rq.worker import Worker

from queue_rollout.errors import BarrierTimeout, QueueRolloutError
from queue_rollout.ledger.doctor import examine
from queue_rollout.ledger.embedded import EmbeddedRedis
from queue_rollout.ledger.records import decode_attempt
from queue_rollout.procs import Supervised, cli_exe
from queue_rollout.progress import LiveView
from testkit import children, stop_node_farm, submit_when_two_workers, write_node_farm

G = 4



def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _retry(call, what: str, timeout: float = 60.0):
    """Call until Redis answers (the soak kills it once)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return call()
        except QueueRolloutError:
            assert time.monotonic() < deadline, f"{what}: Redis did not come back"
            time.sleep(0.2)


class Detections:
    """Faults waiting to be noticed: (kind, injected at, predicate); polled each round.
    A predicate answers True (noticed), False (not yet) or None (nothing to notice)."""

    def __init__(self) -> None:
        self.pending: list[tuple[str, float, Callable[[], bool | None]]] = []
        self.seconds: dict[str, list[float]] = {}

    def watch(self, kind: str, check: Callable[[], bool | None],
              since: float | None = None) -> None:
        self.pending.append((kind, time.monotonic() if since is None else since, check))

    def record(self, kind: str, seconds: float) -> None:
        self.seconds.setdefault(kind, []).append(seconds)

    def poll(self) -> None:
        for item in list(self.pending):
            kind, since, check = item
            try:
                seen = check()
            except QueueRolloutError:
                continue  # Redis is away for the moment
            if seen is not False:
                self.pending.remove(item)
            if seen:
                self.record(kind, time.monotonic() - since)

    def summary(self) -> dict[str, dict[str, float]]:
        return {kind: {"n": len(v), "median_s": round(statistics.median(v), 3),
                       "max_s": round(max(v), 3)} for kind, v in sorted(self.seconds.items())}


def _running_attempt(ledger, pid: int) -> str | None:
    """The attempt (= RQ job id) the RQ worker in process *pid* is running."""
    try:
        for worker in Worker.all(connection=ledger.client, serializer=JSONSerializer):
            if worker.pid == pid:
                return worker.get_current_job_id()
    except RedisError:
        pass  # Redis is away for the moment
    return None


def _attempt_noticed(ledger, aid: str) -> bool | None:
    """The killed process's attempt left ``running``; None if it had ended before."""
    state = ledger.attempt(aid).state
    return None if state in ("finished", "failed") else state != "running"


def _boots(tmp_path: Path) -> list[dict]:
    path = tmp_path / "node" / "boots.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def run_soak(tmp_path: Path, groups: int, seed: int) -> dict:
    rng = random.Random(seed)
    server = EmbeddedRedis(tmp_path / "redis", write_url=False, appendfsync="always")
    url = server.start()
    toml = write_node_farm(tmp_path / "farm.toml", "soak", url, group_size=G, batch_size=4)
    lengths = {f"s{i:04d}": [rng.randint(50, 600) for _ in range(G)] for i in range(groups)}
    with open(tmp_path / "node.log", "wb") as node_log:  # the child keeps its own copy
        node = subprocess.Popen([cli_exe(), "node", "--gpus", "0-1", "-c", str(toml)],
                                stdout=subprocess.DEVNULL, stderr=node_log, cwd=tmp_path)
    collector = Supervised("collector", [cli_exe(), "collector", "-c", str(toml)],
                           log_path=tmp_path / "collector.log")
    faults = {"episode_process_kill": 0, "collector_kill": 0, "redis_kill": 0,
              "replica_kill": 0, "duplicate_notification": 0}
    refused = 0
    detections = Detections()
    delivered: dict[str, list[int]] = {}
    twice: list[str] = []
    try:
        client = submit_when_two_workers(toml, collector.keep, lengths)
        ledger = client.ledger
        t0 = time.monotonic()

        failure: list[BaseException] = []

        def trainer() -> None:
            try:
                take_all()
            except BaseException as exc:
                failure.append(exc)

        def settled() -> bool:
            """Nothing left to run, and fewer than B accepted groups left over (a batch
            is exactly B groups; a rejection can leave a remainder)."""
            g = _retry(client.status, "status")["groups"]
            return g["pending"] == 0 and g["in_flight"] == 0 and g["ready"] < 4

        def take_all() -> None:
            while not settled():
                try:
                    batch = client.get_batch(timeout=2)
                except BarrierTimeout:
                    continue  # perhaps the last groups were rejected
                for g in batch.groups:
                    if g.id in delivered:
                        twice.append(g.id)
                    delivered[g.id] = [len(m.output_ids) for m in g.members]
                _retry(lambda b=batch: client.ack(b), "ack")
                _retry(lambda: client.set_version(client.version() + 1), "set_version")

        thread = threading.Thread(target=trainer, daemon=True)
        thread.start()
        plan = {0.25: "collector_kill", 0.5: "redis_kill", 0.75: "replica_kill"}
        next_kill = time.monotonic() + 1.0
        # on a terminal (pytest -s), a live view of the groups delivered and the faults
        view = LiveView("soak", groups, "groups", out=sys.__stderr__)
        while thread.is_alive() and time.monotonic() - t0 < 900:
            view.show(len(delivered), faults=sum(faults.values()))
            done = len(delivered) / groups
            if len(delivered) >= 0.9 * groups:
                plan.clear()  # the scheduled faults all come before the end
            for at, fault in list(plan.items()):
                if done >= at:
                    del plan[at]
                    faults[fault] += 1
                    if fault == "collector_kill" and collector.proc is not None:
                        holder = ledger.client.hget(ledger.keys.leader, "holder")
                        collector.proc.kill()
                        detections.watch(fault, lambda h=holder: ledger.client.hget(
                            ledger.keys.leader, "holder") not in (None, h))
                    elif fault == "redis_kill":
                        killed_at = time.monotonic()
                        server.kill()
                        time.sleep(1.0)
                        server.restart()
                        before = _retry(lambda: ledger.counters().get("finished", 0), "counters")
                        detections.watch(fault, lambda b=before: ledger.counters().get(
                            "finished", 0) > b, since=killed_at)
                    elif fault == "replica_kill":
                        engines = [p for w in children(node.pid)
                                   for p in [w] if "sim-engine" in _cmdline(w)]
                        boots = len(_boots(tmp_path))
                        os.kill(rng.choice(engines), signal.SIGKILL)
                        detections.watch(fault, lambda b=boots: len(_boots(tmp_path)) > b)
            if time.monotonic() >= next_kill:  # a random episode process dies
                next_kill = time.monotonic() + rng.uniform(1.0, 3.0)
                procs = [c for w in children(node.pid) if " worker " in _cmdline(w)
                         for c in children(w) if "rq_worker" in _cmdline(c)]
                if procs:
                    victim = rng.choice(procs)
                    aid = _running_attempt(ledger, victim)
                    os.kill(victim, signal.SIGKILL)
                    faults["episode_process_kill"] += 1
                    if aid is not None:  # an idle process's death has nothing to detect
                        detections.watch("episode_process_kill",
                                         lambda a=aid: _attempt_noticed(ledger, a))
                try:  # a duplicate notification for an attempt that already ended
                    ended = [(aid.decode(), a) for aid, raw in
                             ledger.client.hgetall(ledger.keys.attempts).items()
                             if (a := decode_attempt(raw)).state in ("finished", "stopped")]
                    if ended:
                        aid, a = rng.choice(ended)
                        faults["duplicate_notification"] += 2
                        sent = time.monotonic()
                        refused += ledger.finish(aid, a.member, b"duplicate").ignored
                        refused += ledger.start(aid, "w", "r", "b", 2).status == "ignored"
                        detections.record("duplicate_notification",
                                          (time.monotonic() - sent) / 2)
                except QueueRolloutError:
                    pass  # Redis is away for the moment
            collector.keep()
            detections.poll()
            time.sleep(0.05)
        elapsed = time.monotonic() - t0
        # a fault injected near the end is noticed all the same: the farm runs on (the
        # node restarts a killed replica after its backoff, perhaps after the last group)
        grace = time.monotonic() + 30.0
        while detections.pending and time.monotonic() < grace:
            collector.keep()
            detections.poll()
            time.sleep(0.1)
        view.close()
        thread.join(5)
        assert not failure, "the trainer failed: " + "".join(
            traceback.format_exception(failure[0]))
        assert not thread.is_alive(), f"{len(delivered)}/{groups} groups after {elapsed:.0f}s"
        counters = ledger.counters()
        report = examine(ledger.client, ledger.keys, ledger.rollout.batch_size)
        states = {gid.decode(): json.loads(raw)["state"]
                  for gid, raw in ledger.client.hgetall(ledger.keys.groups).items()}
        rejected = sorted(gid for gid, state in states.items() if state == "rejected")
        left_over = sorted(r.decode() for r in ledger.client.lrange(ledger.keys.ready, 0, -1))
    finally:
        stop_node_farm(node, collector)
        server.stop()
    # every group delivered or rejected, exactly once (or accepted and left over, fewer
    # than a batch); every delivered member whole
    assert twice == [] and not set(delivered) & set(rejected)
    assert len(left_over) < 4 and all(states[gid] == "accepted" for gid in left_over)
    assert sorted([*delivered, *rejected, *left_over]) == sorted(lengths)
    assert all(delivered[gid] == lengths[gid] for gid in delivered)
    assert len(rejected) == counters.get("rejected:failed_members", 0) == counters.get(
        "rejected", 0)
    assert counters.get("reserved", 0) == 0 and counters.get("running", 0) == 0
    assert report.ok, report.problems
    assert refused == faults["duplicate_notification"]  # every duplicate refused
    # the replicas' own logs: no two requests of one episode (one seed) at the same time
    requests: dict[int, list[tuple[float, float, str]]] = {}
    for path in (tmp_path / "node").glob("requests-gpu*.jsonl"):
        for line in path.read_text().splitlines():
            e = json.loads(line)
            requests.setdefault(e["seed"], []).append((e["started"] or e["arrived"],
                                                       e["ended"], e["rid"]))
    overlaps = [seed for seed, runs in requests.items()
                if any(a[1] > b[0] + 1e-6
                       for a, b in zip(sorted(runs), sorted(runs)[1:], strict=False))]
    assert overlaps == []
    retried = sum(v for k, v in counters.items() if k.startswith("retries:"))
    return {"episodes": groups * G, "groups": groups, "seconds": round(elapsed, 1),
            "delivered": len(delivered), "rejected": len(rejected),
            "left_over": len(left_over),
            "faults": faults, "time_to_detect": detections.summary(),
            "undetected": [kind for kind, _, _ in detections.pending],
            "duplicates_refused": refused, "retries": retried,
            "retries_by_cause": {k: v for k, v in counters.items() if k.startswith("retries:")},
            "requests": sum(len(r) for r in requests.values()),
            "slots_leaked": counters.get("reserved", 0), "results_lost": 0}


@pytest.mark.e2e
def test_short_soak(tmp_path):
    figures = run_soak(tmp_path, groups=40, seed=1)
    print("soak figures:", json.dumps(figures))
    assert set(figures["time_to_detect"]) >= {"redis_kill", "replica_kill",
                                              "duplicate_notification"}
    assert figures["faults"]["episode_process_kill"] >= 3
    assert figures["faults"]["redis_kill"] == figures["faults"]["replica_kill"] == 1


@pytest.mark.soak
@pytest.mark.timeout(1800)
def test_soak_2000_episodes(tmp_path):
    figures = run_soak(tmp_path, groups=500, seed=7)
    print("soak figures:", json.dumps(figures))
    assert figures["episodes"] >= 2000
