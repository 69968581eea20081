"""Faults on a whole farm of REAL SGLang replicas (this machine's CPU), through the CLI.

Each test runs ``queue-rollout up -c farm.toml`` (``engine.kind = "sglang"``, the
replicas' URLs, a private redis-server with ``appendfsync always``) or ``queue-rollout
node --gpus 0`` (which launches the replica itself), each in one admission mode (group
admission; sample refill with ``max_concurrent_samples``; :data:`MODES_ENV` runs each in
both), with ``controlled_length`` episodes of 40 to 1,400 tokens, and injects one fault
while episodes are mid-flight:

1. an episode process SIGKILLed in the middle of its ``/generate``;
2. a replica SIGKILLed (its whole process group) and started again on its port (under
   ``up`` by the test, under ``node`` by node, under a new boot id);
3. a ``/generate`` running past ``timeouts.request``;
4. weight updates (the seed-1 model) in each pause mode while episodes run;
5. Redis killed with ``kill -9`` and started again on its port.

Then the trainer's client takes every batch: no group lost or delivered twice, every
member exactly its assigned length, ``queue-rollout doctor`` clean, and, from the
replicas' own request logs (``--log-requests-format json``), no episode with two
generations running at once on any replica. Each test prints its figures (retries by
cause, time to detect and to recover; for a dead replica, what its doubt cost) as one
JSON line, appended to the file named by ``QUEUE_ROLLOUT_FAULT_RESULTS`` when that is
set. ``QUEUE_ROLLOUT_FAULT_DOWN_S`` (default 20) is how long the group-mode replica kill
under ``up`` leaves the replica down before its restart begins.

Two replicas are shared by the session's tests (each takes 30-60 s to start here); a
test that kills one starts it again.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import msgspec
import pytest
from faultfarm import (
    REQUEST_LOG_ARGS,
    Consumed,
    FaultServer,
    NodeReplica,
    NodeRun,
    RequestLog,
    Sample,
    UpFarm,
    Watch,
    causes,
    consume,
    doctor,
    farm_toml,
    generating_processes,
    generations,
    kill_all,
    model_info,
    new_boot,
    node_boots,
    overlapping,
    record,
    registered,
    replica_pid,
    restore,
    serves,
    settled,
    stamp,
)
from real_engine.server import CPU_ARGS, STAND_IN, STAND_IN_LOG_ENV, model

from queue_rollout.client.rollout import RolloutClient
from queue_rollout.config import load_config
from queue_rollout.engines.base import episode_seed
from queue_rollout.launch.node import SGLANG_PYTHON_ENV
from queue_rollout.ledger.embedded import EmbeddedRedis
from queue_rollout.ledger.records import decode_attempt
from testkit import alive, free_ports, process_tree, wait_for

pytestmark = [pytest.mark.sglang, pytest.mark.timeout(600)]

G = 4  # members per group
#: The admission modes a fault runs in: ``QUEUE_ROLLOUT_FAULT_MODES`` (``group,sample``:
#: every fault in both, as the documented figures were made), else the one each test
#: names. The tier's choices give each mode a dead replica (sample under `up`, group
#: under `node`); group a request past its timeout and Redis killed; sample an episode
#: process killed, a hung replica and weight updates.
MODES_ENV = "QUEUE_ROLLOUT_FAULT_MODES"


def modes(tier: str) -> list[str]:
    """The modes a fault runs in: those :data:`MODES_ENV` names, else *tier*."""
    return (os.environ.get(MODES_ENV) or tier).split(",")


#: Members' lengths, rotated by group: a few hundred to 1,200 tokens (8 running
#: requests decode at ~50-80 tokens/s each here, so the long ones run 15-25 s).
LENGTHS = (150, 400, 800, 1200)
#: A weight-update wave's members: long enough to be mid-flight at the update.
WAVE_LENGTHS = (200, 500, 900, 500)
#: How long the doubt measurement leaves a killed replica down before starting it
#: again (its start takes another 30-40 s, down all the same).
DOWN_S = float(os.environ.get("QUEUE_ROLLOUT_FAULT_DOWN_S", "20"))


def assignment(prefix: str, groups: int,
               lengths: tuple[int, ...] = LENGTHS) -> dict[str, list[int]]:
    """*groups* group ids -> their members' lengths (rotated, so both replicas get
    long and short ones)."""
    return {f"{prefix}{i}": [lengths[(i + m) % len(lengths)] for m in range(G)]
            for i in range(groups)}


def prompts(lengths: dict[str, list[int]]) -> list[dict[str, Any]]:
    return [{"id": gid, "prompt": f"fault test {gid}", "member_lengths": ls}
            for gid, ls in lengths.items()]


# -- replicas ---------------------------------------------------------------------------


def offsets(logs: list[FaultServer]) -> list[int]:
    return [log.log_offset() for log in logs]


def attempts_on(client: RolloutClient, url: str, state: str) -> set[str]:
    """The attempts in *state* that a worker runs on the replica at *url*."""
    ledger = client.ledger
    return {aid.decode() for aid, raw in ledger.client.hgetall(ledger.keys.attempts).items()
            if (a := decode_attempt(raw)).state == state and a.replica == url}


def both_generating(client: RolloutClient, urls: list[str], at_least: int) -> bool:
    """Each replica has at least *at_least* attempts running on it (started by its worker,
    which sends the request at once; the replica's own gauge lags by up to 40 decode
    steps and may miss short requests)."""
    return all(len(attempts_on(client, url, "running")) >= at_least for url in urls)


# -- the common ending ---------------------------------------------------------------


def conclude(*, fault: str, mode: str, launcher: str, client: RolloutClient, toml: Path,
             lengths: dict[str, list[int]], logs: list[RequestLog], since: list[int],
             fault_at: float, watch: Watch, started: float, extra: dict[str, Any] | None = None,
             measure: Callable[[], dict[str, Any]] | None = None,
             may_fail: frozenset[tuple[str, int]] = frozenset(),
             consumed: Consumed | None = None,
             timeout: float = 300.0) -> tuple[Consumed, dict[str, int], dict[str, Any]]:
    """The trainer takes every batch (unless the test took them: *consumed*); the farm
    settles; ``doctor``; the replicas' logs. Records the figures, then asserts: nothing
    lost, nothing twice, every length exact, no episode generating twice at once,
    nothing left reserved. *measure* adds figures from the samples (taken to the end).
    Returns what the trainer got, the scenario's counters (since its watch began) and
    the figures."""
    got = consumed or consume(client, lengths, timeout=timeout, may_fail=may_fail)
    quiet = wait_for(lambda: settled(client), 60, "the farm to settle (nothing in flight, "
                     "reserved or in doubt)")
    now = client.ledger.counters()
    said = doctor(toml)
    samples = watch.stop()
    gens = [g for log, offset in zip(logs, since, strict=True) for g in generations(log, offset)]
    overlaps = overlapping(gens)
    # this scenario's own counts: the counters less what they held when it began
    first = next((s.counters for s in samples if s.counters is not None), {}) or {}
    counters = {k: v - first.get(k, 0) for k, v in now.items()}
    base = next((s for s in samples if s.counters is not None and s.at <= fault_at), None)
    retries0 = base.total("retries") if base else 0
    doubts0 = base.total("doubts") if base else 0
    retried = sum(causes(now, "retries").values())
    row: dict[str, Any] = {
        "fault": fault, "mode": mode, "launcher": launcher,
        "groups": len(lengths), "episodes": len(lengths) * G,
        "lost": len(got.lost), "duplicated": got.duplicated, "wrong_lengths": len(got.wrong),
        "failed_members": len(got.failed_members),
        "retries": causes(counters, "retries"), "doubts": causes(counters, "doubts"),
        "failed": causes(counters, "failed"), "ignored": counters.get("ignored", 0),
        "requests_generating": len(gens), "overlapping_generations": len(overlaps),
        "max_doubtful": max((s.counters or {}).get("doubtful", 0) for s in samples),
        "detect_s": watch.first(fault_at, lambda s: (s.total("doubts") or 0) > (doubts0 or 0)),
        "first_retry_s": watch.first(fault_at, lambda s: (s.total("retries") or 0)
                                     > (retries0 or 0)),
        "recovered_s": watch.first(fault_at, lambda s: (s.total("retries") or 0) >= retried
                                   and not (s.counters or {}).get("doubtful", 0)),
        "all_delivered_s": round(got.finished_at - fault_at, 1),
        "scenario_s": round(time.monotonic() - started, 1),
        **(extra or {}),
        **(measure() if measure is not None else {}),
    }
    record(row)
    assert got.lost == [], f"groups lost: {got.lost}"
    assert got.duplicated == 0, f"groups delivered twice: {got.got}"
    assert got.wrong == [], got.wrong
    assert overlaps == [], overlaps
    assert quiet is not None
    assert counters.get("consumed", 0) == len(lengths) and counters.get("rejected", 0) == 0
    assert now.get("reserved", 0) == 0 and now.get("doubtful", 0) == 0
    assert said.startswith("doctor: ok")
    return got, counters, row


@contextlib.contextmanager
def up_farm(tmp_path: Path, replicas: list[FaultServer], mode: str,
            **settings: Any) -> Iterator[tuple[UpFarm, RolloutClient]]:
    farm = UpFarm(tmp_path / "farm", f"rf-{mode}", [s.url for s in replicas], mode, settings)
    with farm.running() as client:
        yield farm, client


# -- 1. an episode process SIGKILLed mid-episode ----------------------------------------


@pytest.mark.parametrize("mode", modes("sample"))
def test_an_episode_process_killed_mid_generate(tmp_path: Path, replicas: list[FaultServer],
                                                mode: str) -> None:
    """The attempts of the killed process lose their lease, turn doubtful (their slots
    kept), are aborted and probed on the replica by the worker's resolver, and run again;
    the supervisor starts a new process."""
    started = time.monotonic()
    lengths = assignment(f"kill-{mode}-", 3)
    urls = [s.url for s in replicas]
    since = offsets(replicas)
    with up_farm(tmp_path, replicas, mode) as (farm, client):
        watch = Watch(farm.toml, urls)
        client.submit(prompts(lengths))
        wait_for(lambda: both_generating(client, urls, 3), 90, "episodes on both replicas")
        assert farm.proc is not None
        root, port = farm.proc.pid, replicas[0].port
        victims = wait_for(lambda: generating_processes(root, port), 30,
                           "an episode process in the middle of a /generate")
        os.kill(victims[0], signal.SIGKILL)
        fault_at = time.time()
        _, counters, _ = conclude(fault="episode process SIGKILL", mode=mode, launcher="up",
                                  client=client, toml=farm.toml, lengths=lengths,
                                  logs=list(replicas), since=since, fault_at=fault_at,
                                  watch=watch, started=started)
        assert counters.get("doubts:lease_expired", 0) >= 1, counters
        assert counters.get("retries:lease_expired", 0) >= 1, counters
        assert "episode process" in farm.log_tail(400) and "exited (-9)" in farm.log_tail(400)


# -- 2. a replica SIGKILLed and started again -------------------------------------------


@pytest.mark.parametrize("mode", modes("sample"))
def test_a_replica_killed_and_restarted_under_up(tmp_path: Path, replicas: list[FaultServer],
                                                 mode: str) -> None:
    """Replica 0 dies with episodes on it: they turn doubtful at once, keep their slots
    and are not retried while it is down; started again on its port, the worker aborts
    and probes them there and they run again. What the doubt costs is measured (slots
    held, what replica 1 does meanwhile); in group mode, with twice the groups that fit,
    the replica stays down about a minute (:data:`DOWN_S` plus its start)."""
    started = time.monotonic()
    groups = 8 if mode == "group" else 4  # group mode: twice what fits, for the measurement
    lengths = assignment(f"down-{mode}-", groups)
    urls = [s.url for s in replicas]
    since = offsets(replicas)
    victim, _ = replicas
    with up_farm(tmp_path, replicas, mode) as (farm, client):
        watch = Watch(farm.toml, urls)
        client.submit(prompts(lengths))
        # four each: sample refill admits 15 of the 16 members, and a loaded machine may
        # finish a replica's short members before the other's worker has started its own
        wait_for(lambda: both_generating(client, urls, 4), 120, "episodes on both replicas")
        ledger = client.ledger
        on_victim = attempts_on(client, victim.url, "running")
        fault_at = victim.kill()

        def in_doubt() -> set[str] | None:
            states = {aid: a.state for aid in on_victim
                      if (a := ledger.attempt(aid)) is not None}
            if "running" in states.values():
                return None
            return {aid for aid, state in states.items() if state == "doubtful"}

        doubtful = wait_for(in_doubt, 30, "the dead replica's attempts out of running")
        assert doubtful, "no attempt was running on the replica when it died"
        # down long enough for the workers' doubt rounds (every lease, 3 s) to have
        # settled them, had they settled doubt they cannot confirm
        time.sleep(DOWN_S if mode == "group" else 8)
        states = {aid: a.state for aid in doubtful if (a := ledger.attempt(aid)) is not None}
        victim.restart()
        back_at = time.time()
        extra: dict[str, Any] = {"down_s": round(back_at - fault_at, 1),
                                 "doubtful_at_kill": len(doubtful)}
        measure = partial(doubt_cost, watch, fault_at, back_at, other_index=1,
                          capacity=client.status()["capacity"], whole_groups=mode == "group")
        _, counters, row = conclude(fault="replica SIGKILL + restart", mode=mode,
                                    launcher="up", client=client, toml=farm.toml,
                                    lengths=lengths, logs=list(replicas), since=since,
                                    fault_at=fault_at, watch=watch, started=started,
                                    extra=extra, measure=measure)
    # while the replica could not confirm a stop, nothing settled those attempts (I5)
    assert set(states.values()) == {"doubtful"}, states
    assert counters.get("retries:generate_error", 0) >= len(doubtful), counters
    print(f"every group delivered {row['all_delivered_s']} s after the kill", flush=True)


def doubt_cost(watch: Watch, down: float, back: float, *, other_index: int,
               capacity: int, whole_groups: bool) -> dict[str, Any]:
    """While the replica was down: the attempts in doubt and the slots they hold (with
    *whole_groups*, group admission, all G slots of each of their groups), and what
    replica *other_index* did (its running requests and tokens, from its /metrics);
    after it came back, how long until no doubt was left."""
    outage = [s for s in watch.samples if down <= s.at < back and s.counters is not None]
    running = [v for s in outage if (v := s.running[other_index]) is not None]
    idle_at = next((round(s.at - down, 1) for s in outage
                    if s.running[other_index] == 0 and s.at > down + 2), None)
    made = [s for s in outage if s.generated[other_index] is not None]
    after = [s for s in watch.samples if s.at >= back and s.generated[other_index] is not None]

    def rate(samples: list[Sample]) -> float | None:
        if len(samples) < 2 or samples[-1].at - samples[0].at < 1:
            return None
        tokens = (samples[-1].generated[other_index] or 0) - (samples[0].generated[other_index]
                                                            or 0)
        return round(tokens / (samples[-1].at - samples[0].at), 1)

    first, last = outage[0].counters or {}, outage[-1].counters or {}
    return {
        # SGLang counts a request's tokens when it finishes: rates over whole windows
        "other_tokens_per_s_down": rate(made),
        "other_tokens_per_s_after_back": rate(after),
        "episodes_finished_down": last.get("finished", 0) - first.get("finished", 0),
        "capacity_slots": capacity,
        "doubt_max_attempts": max((s.counters or {}).get("doubtful", 0) for s in outage),
        "doubt_max_groups": max(s.doubtful_groups for s in outage),
        # group admission (*whole_groups*) holds a group's G slots until its last member
        # ends; refill one slot per member not ended: the doubtful ones' own
        "doubt_slots_held_max": (max(s.doubtful_groups for s in outage) * G if whole_groups
                                 else max((s.counters or {}).get("doubtful", 0)
                                          for s in outage)),
        "reserved_during_outage": sorted({(s.counters or {}).get("reserved", 0)
                                          for s in outage}),
        "other_running_mean": round(sum(running) / len(running), 2) if running else None,
        "other_running_series": [int(v) for v in running[::4]],
        "other_idle_after_s": idle_at,
        "other_idle_fraction": round(sum(1 for v in running if v == 0) / len(running), 2)
        if running else None,
        "doubt_settled_after_back_s": watch.first(back, lambda s: not (s.counters or {}).get(
            "doubtful")),
    }


# -- 3. a /generate running past timeouts.request ---------------------------------------


@pytest.mark.parametrize("mode", modes("group"))
def test_a_generate_past_the_request_timeout(tmp_path: Path, replicas: list[FaultServer],
                                             mode: str) -> None:
    """``timeouts.request = 3`` and one member of 1,400 tokens (~8 s alone): each attempt
    of it times out, turns doubtful (``generate_error``), is aborted and confirmed
    stopped on the replica, and only then run again; after ``max_attempts`` (2) it
    fails and its group is delivered with that member failed
    (``max_failed_members = 1``). The replicas' own logs show its generations one after
    another, never two at once, each ended by the abort; the other members are exact."""
    started = time.monotonic()
    lengths = {f"slow-{mode}-0": [1400, 40, 40, 40], f"slow-{mode}-1": [40, 40, 40, 40],
               f"slow-{mode}-2": [60, 60, 60, 60]}
    long_member = (f"slow-{mode}-0", 0)
    urls = [s.url for s in replicas]
    since = offsets(replicas)
    with up_farm(tmp_path, replicas, mode, request=3, max_attempts=2,
                 max_failed_members=1) as (farm, client):
        watch = Watch(farm.toml, urls)
        client.submit(prompts(lengths))
        fault_at = time.time()  # the long member is sent now: it times out 3 s later
        got, counters, row = conclude(
            fault="generate past timeouts.request", mode=mode, launcher="up", client=client,
            toml=farm.toml, lengths=lengths, logs=list(replicas), since=since,
            fault_at=fault_at, watch=watch, started=started,
            may_fail=frozenset({long_member}))
    assert got.failed_members == [f"{long_member[0]}/0"]
    assert counters.get("doubts:generate_error", 0) == 2, counters  # each attempt once
    # one retry, then max_attempts; its cause is generate_error, except when the worker's
    # lease renewal revives the attempt it has just given up on (the hung-replica test
    # below pins that down): then its lease expires and it is retried as lease_expired
    assert (counters.get("retries:generate_error", 0)
            + counters.get("retries:lease_expired", 0)) == 1, counters
    assert counters.get("failed:max_attempts", 0) == 1, counters
    # the replicas' side: the long member's generations ran one after another
    seed = episode_seed(0, long_member[0], 0)
    runs = sorted((g for log, offset in zip(replicas, since, strict=True)
                   for g in generations(log, offset) if g.seed == seed), key=lambda g: g.start)
    print(f"the long member's generations: {[(g.server, g.how, g.tokens) for g in runs]}")
    assert len(runs) == 2, runs  # one per attempt: no second generation of one attempt
    assert all(g.end is not None and g.how in ("abort", "disconnected") for g in runs), runs
    assert runs[0].end is not None and runs[1].start >= runs[0].end
    assert row["overlapping_generations"] == 0


def test_a_hung_replica_keeps_its_timed_out_attempts_in_doubt(
        tmp_path: Path, replicas: list[FaultServer]) -> None:
    """Replica 0 hangs (SIGSTOP to its process group) for 10 s with episodes on it,
    longer than ``timeouts.request`` (3 s): their ``/generate`` calls time out and they
    turn doubtful (``generate_error``); the abort and probe that follow hang as well
    (until the control call's own timeout), so the doubt stays, with its slot, and
    nothing runs them again until the replica answers (SIGCONT) and confirms each stop.
    Their worker is alive all along: an attempt it has given up on must not turn
    ``running`` again (doubt hidden) nor lose its lease (``lease_expired``) meanwhile."""
    started = time.monotonic()
    mode = "sample"
    lengths = assignment("hung-", 3, (60, 80, 100, 120))  # ~1-2 s each: within 3 s
    urls = [s.url for s in replicas]
    since = offsets(replicas)
    victim = replicas[0]
    assert victim.proc is not None
    timeline: dict[str, list[str]] = {}
    with up_farm(tmp_path, replicas, mode, request=3) as (farm, client):
        watch = Watch(farm.toml, urls)
        client.submit(prompts(lengths))
        on_victim = wait_for(lambda: attempts_on(client, victim.url, "running"), 60,
                             "episodes on replica 0")
        ledger = client.ledger
        os.killpg(victim.proc.pid, signal.SIGSTOP)
        fault_at = time.time()
        try:
            # the attempts' states, every 0.1 s, while the replica hangs
            while time.time() < fault_at + 10:
                for aid in on_victim:
                    attempt = ledger.attempt(aid)
                    states = timeline.setdefault(aid, [])
                    if attempt is not None and (not states or states[-1] != attempt.state):
                        states.append(attempt.state)
                time.sleep(0.1)
        finally:
            os.killpg(victim.proc.pid, signal.SIGCONT)
        _, counters, _ = conclude(
            fault="replica hung (SIGSTOP 10 s) past timeouts.request", mode=mode,
            launcher="up", client=client, toml=farm.toml, lengths=lengths,
            logs=list(replicas), since=since, fault_at=fault_at, watch=watch,
            started=started, extra={"attempt_states": timeline})
    print(f"the hung replica's attempts went through {timeline}")
    assert any("doubtful" in states for states in timeline.values()), timeline
    revived = {aid: states for aid, states in timeline.items()
               if "doubtful" in states and "running" in states[states.index("doubtful"):]}
    assert revived == {}, f"doubtful attempts turned running again: {revived}"
    assert "doubts:lease_expired" not in counters, counters
    assert counters.get("retries:generate_error", 0) >= 1, counters


# -- 4. weight updates in each pause mode ------------------------------------------------


@pytest.mark.parametrize("mode", modes("sample"))
def test_weight_updates_in_each_pause_mode_during_running_episodes(
        tmp_path: Path, replicas: list[FaultServer], mode: str) -> None:
    """Three waves of episodes; in the middle of each, the trainer's client loads other
    weights (``update_weights``), pausing in one mode: ``in_place``, ``abort``,
    ``retract``. Afterwards no replica is left paused (a request goes through at once),
    each serves the weights and version loaded, every group comes whole with exact
    lengths, and episodes that ran across the update carry both versions."""
    started = time.monotonic()
    urls = [s.url for s in replicas]
    since = offsets(replicas)
    seed0, seed1 = str(replicas[0].model_path), str(replicas[0].other_weights)
    waves = [("in_place", seed1), ("abort", seed0), ("retract", seed1)]
    update_s: dict[str, float] = {}
    versions: dict[str, list[list[int]]] = {}
    everything: dict[str, list[int]] = {}
    got_all = Consumed()
    try:
        with up_farm(tmp_path, replicas, mode) as (farm, client):
            watch = Watch(farm.toml, urls)
            config = load_config(farm.toml)
            fault_at = time.time()
            for version, (pause_mode, weights) in enumerate(waves, start=1):
                lengths = assignment(f"w{version}-{mode}-", 3, WAVE_LENGTHS)
                everything.update(lengths)
                client.submit(prompts(lengths))
                wait_for(lambda: both_generating(client, urls, 3), 90,
                         "episodes on both replicas")
                client.config = msgspec.structs.replace(config, engine=msgspec.structs.replace(
                    config.engine, pause_mode=pause_mode))
                began = time.monotonic()
                client.update_weights(weights, version)
                update_s[pause_mode] = round(time.monotonic() - began, 2)
                for url in urls:  # resumed: a request goes through
                    wait_for(partial(serves, url, timeout=5), 30, f"{url} to serve again")
                got = consume(client, lengths, timeout=240)
                got_all.got += got.got
                got_all.wrong += got.wrong
                got_all.lost += got.lost
                got_all.finished_at = got.finished_at
                versions[pause_mode] = sorted(map(list, {tuple(v) for v in got.versions}))
                for server in replicas:  # the weights loaded, and still serving at once
                    info = model_info(server.url)
                    assert (info["model_path"], info["weight_version"]) == (
                        weights, str(version)), (pause_mode, server.url, info)
                    assert serves(server.url, timeout=5), f"{server.url} left paused"
                assert client.version() == version
            conclude(fault="weight update x3 (in_place, abort, retract)", mode=mode,
                     launcher="up", client=client, toml=farm.toml, lengths=everything,
                     logs=list(replicas), since=since, fault_at=fault_at, watch=watch,
                     started=started, consumed=got_all,
                     extra={"update_s": update_s, "member_versions": versions})
    finally:
        for server in replicas:
            restore(server)
    for version, (pause_mode, _) in enumerate(waves, start=1):
        seen = versions[pause_mode]
        # every token from the old weights or the new; some episodes ran across the update
        assert all(set(v) <= {version - 1, version} for v in seen), (pause_mode, seen)
        assert [version - 1, version] in seen, (pause_mode, seen)


# -- 5. Redis killed with kill -9 and restarted ------------------------------------------


@pytest.mark.parametrize("mode", modes("group"))
def test_redis_killed_and_restarted(tmp_path: Path, replicas: list[FaultServer],
                                    mode: str) -> None:
    """The farm's redis-server (``appendfsync always``) is killed with ``kill -9`` with
    episodes mid-flight and started again on its port 2 s later: workers keep their
    results and send them again, the collector and the client carry on, `up` and its
    children ride it out."""
    started = time.monotonic()
    lengths = assignment(f"redis-{mode}-", 3)
    urls = [s.url for s in replicas]
    since = offsets(replicas)
    with up_farm(tmp_path, replicas, mode) as (farm, client):
        watch = Watch(farm.toml, urls)
        client.submit(prompts(lengths))
        wait_for(lambda: both_generating(client, urls, 3), 90, "episodes on both replicas")
        finished_before = client.ledger.counters().get("finished", 0)
        farm.redis.kill()
        fault_at = time.time()
        time.sleep(2)  # the outage
        farm.redis.restart()
        back_at = time.time()
        wait_for(lambda: client.ledger.counters().get("finished", 0) > finished_before, 120,
                 "an episode finished after the restart")
        first_finish_s = round(time.time() - back_at, 2)
        conclude(fault="redis kill -9 + restart", mode=mode, launcher="up", client=client,
                 toml=farm.toml, lengths=lengths, logs=list(replicas), since=since,
                 fault_at=fault_at, watch=watch, started=started,
                 extra={"redis_down_s": round(back_at - fault_at, 1),
                        "first_finish_after_restart_s": first_finish_s,
                        # one still starting when Redis went away exits and is restarted
                        "episode_processes_restarted": len(re.findall(
                            r"episode process \d+ exited", farm.log_tail(5000)))})
        assert farm.proc is not None and farm.proc.poll() is None
        # the workers' supervisors and the collector rode it out (none was restarted)
        said = farm.log_tail(5000)
        assert not re.search(r"(worker gpu\d+|collector) exited", said), said[-3000:]


# -- 2 under node: node launches the replicas, restarts the killed one --------------------


@pytest.mark.parametrize("mode", modes("group"))
def test_a_replica_killed_under_node_comes_back_under_a_new_boot_and_settles_its_doubt(
        tmp_path: Path, sglang_interpreter: str, mode: str) -> None:
    """`node --gpus 0` launches a real replica and its worker, a collector beside it (in
    the tier, group admission: sample refill meets a dead replica under `up`). The worker
    registers against the replica's boot and its watch sees no outage. With episodes on
    it, the replica's whole process tree is SIGKILLed: node starts it again under a new
    boot id and restarts its worker, which settles the old boot's attempts at once
    (``replica_restart``); every group comes whole, exactly once. SIGTERM then stops
    node: nothing it started left running, its worker deregistered, the ``sgl_kernel``
    stand-in never called."""
    gpu = 0
    python = sglang_interpreter
    redis = EmbeddedRedis(tmp_path / "redis", appendfsync="always", write_url=False)
    url = redis.start()
    port = free_ports(1)
    # the replica's stdout (its JSON request log) into its log, which node keeps
    wrapper = tmp_path / "sglang-python"
    wrapper.write_text(f'#!/bin/sh\nexec "{python}" "$@" 1>&2\n')
    wrapper.chmod(0o755)
    args = [*CPU_ARGS, "--max-total-tokens", "65536", *REQUEST_LOG_ARGS]
    engine = {"python": wrapper, "model_path": model(python, 0), "base_port": port,
              "sglang_args": args}
    toml = farm_toml(tmp_path / "farm.toml", name="rf-node", redis_url=url, urls=[],
                     mode=mode, groups_at_once=2, engine_extra=engine)
    state = toml.parent / "state"
    calls = tmp_path / "sgl_kernel_calls.jsonl"
    env = {**os.environ, STAND_IN_LOG_ENV: str(calls), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(STAND_IN),
                                          *filter(None, [os.environ.get("PYTHONPATH")])])}
    env.pop(SGLANG_PYTHON_ENV, None)
    replica = NodeReplica(f"http://127.0.0.1:{port}", state / "node" / f"replica-gpu{gpu}.log")
    node = NodeRun(toml, gpu, env, tmp_path / "node.log")
    began = time.monotonic()
    try:
        with node.running() as proc:
            client = RolloutClient.from_config(toml)
            first = wait_for(lambda: registered(client).get(gpu), 300,
                             "a worker against its replica")
            assert first == node_boots(state)[-1]["boot_id"]
            print(f"\nnode: a replica and its worker up after "
                  f"{time.monotonic() - began:.0f} s", flush=True)
            started = time.monotonic()
            watch = Watch(toml, [replica.url])
            lengths = assignment("node-", 3)
            since = [replica.log_offset()]
            client.submit(prompts(lengths))
            wait_for(partial(both_generating, client, [replica.url], 3), 120,
                     "episodes on the replica")
            # the worker has watched its replica since it registered: no false outage
            worker_log = state / "node" / f"worker-gpu{gpu}.log"
            assert "unreachable" not in worker_log.read_text()
            doomed = process_tree(replica_pid(proc.pid, "sglang.launch_server", port))
            assert len(doomed) >= 3  # the server, its scheduler and its detokenizer
            kill_all(doomed)  # all at once
            fault_at = time.time()
            wait_for(lambda: not alive(doomed), 30, "the replica's processes to die")
            replica.kills.append((replica.log_offset(), fault_at))
            new = wait_for(partial(new_boot, client, gpu, first), 300,
                           "node to restart the replica and its worker under a new boot")
            assert [b["boot_id"] for b in node_boots(state)] == [first, new]
            _, counters, _ = conclude(
                fault="replica SIGKILL (node restarts it)", mode=mode, launcher="node",
                client=client, toml=toml, lengths=lengths, logs=[replica], since=since,
                fault_at=fault_at, watch=watch, started=started,
                extra={"replica_back_s": round(time.time() - fault_at, 1)})
            assert counters.get("retries:replica_restart", 0) >= 1, counters
        node.check_stopped(client, "sglang.launch_server", port)
        assert not calls.exists() or calls.read_text() == "", calls.read_text()
    finally:
        redis.stop()


def test_the_request_logs_say_what_the_replicas_ran(tmp_path: Path) -> None:
    """The log reader itself: a generation's end is its finished entry, the line saying
    its client went away, or the server's SIGKILL; two at once for one seed are found."""
    log = tmp_path / "sglang.log"

    def entry(ts: str, event: str, rid: str, seed: int | None, tokens: int = 10) -> str:
        params: dict[str, Any] = {"max_new_tokens": tokens}
        if seed is not None:
            params["sampling_seed"] = seed
        body: dict[str, Any] = {"timestamp": f"2026-01-01T{ts}", "event": event, "rid": rid,
                                "obj": {"rid": rid, "sampling_params": params}}
        if event == "request.finished":
            body["out"] = {"meta_info": {"finish_reason": {"type": "length"},
                                         "completion_tokens": tokens}}
        return f"[2026-01-01 {ts[:8]}] {json.dumps(body)}\n"

    log.write_text(
        entry("10:00:00.100000", "request.received", "a", 7)
        + entry("10:00:00.200000", "request.received", "probe", None, 0)
        + entry("10:00:01.000000", "request.finished", "a", 7)
        + entry("10:00:01.500000", "request.received", "b", 7)
        + "[2026-01-01 10:00:02] [http_server] Error: Request is disconnected from the "
          "client side (type 1). Abort request obj.rid='b'\n"
        + entry("10:00:02.500000", "request.received", "c", 7)  # before b's second ended
        + entry("10:00:04.000000", "request.received", "d", 8))
    source = NodeReplica("http://x", log)
    source.kills.append((log.stat().st_size, stamp("2026-01-01T10:00:05")))
    gens = generations(source)
    assert [(g.rid, g.how) for g in gens] == [("a", "length"), ("b", "disconnected"),
                                              ("c", "killed"), ("d", "killed")]
    problems = overlapping(gens)
    assert len(problems) == 1 and "c on http://x started" in problems[0]
    assert overlapping([g for g in gens if g.rid != "c"]) == []
