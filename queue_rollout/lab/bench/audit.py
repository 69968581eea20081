"""The pilots' audit: what each run delivered against the manifest it was given, each
call found in the replicas' request logs."""

from __future__ import annotations

from typing import Any

from queue_rollout.engines.base import episode_seed, turn_rid
from queue_rollout.lab.bench.measures import ModeRun
from queue_rollout.lab.workloads.profile import manifest_digest
from queue_rollout.turns import member_turns


def manifest_turns(prompt: dict[str, Any]) -> list[list[int]]:
    """Each member's output tokens per model call, as the manifest asks."""
    if "member_turns" in prompt:
        return [[t.gen for t in member_turns(m)] for m in prompt["member_turns"]]
    return [[n] for n in prompt["member_lengths"]]



def audit(prompts: list[dict[str, Any]], runs: list[ModeRun], *, complete: bool = True,
          run_seed: int = 0, request_logs: bool = True, resumed: bool = False) -> list[str]:
    """Every problem found; empty when the runs are sound. *complete*: every group was
    to be delivered (else only what was delivered is checked: rolling consumption stops
    with groups in flight). With *request_logs* (simulated replicas), each delivered
    member's calls are found in the replicas' logs by their sampling seeds: one request
    per call, its exact length, the rids of one attempt's turns. With *resumed* (a
    pause that aborts: a call cut short goes on as a further request), the replicas ran
    at least one request per call, and every token once."""
    problems: list[str] = []
    want = {p["id"]: manifest_turns(p) for p in prompts}
    for run in runs:
        tag = f"{run.mode} mode" + (f", placement {run.placement}"
                                     if run.placement != "any" else "")
        subset = [p for p in prompts if p["id"] in run.delivered]
        if run.delivered_digest != manifest_digest(subset) or not set(run.delivered) <= set(want):
            problems.append(f"{tag}: the prompts delivered differ from the manifest")
        if complete and set(run.delivered) != set(want):
            missing = sorted(set(want) - set(run.delivered))[:5]
            problems.append(f"{tag}: {len(want) - len(run.delivered)} groups not delivered "
                            f"(e.g. {missing})")
        by_seed: dict[int, list[dict[str, Any]]] = {}
        for r in run.requests:
            by_seed.setdefault(r["seed"], []).append(r)
        calls = 0
        for gid, tokens in run.delivered.items():
            turns = want.get(gid, [])
            if tokens != [sum(t) for t in turns]:
                problems.append(f"{tag}: group {gid} members produced {tokens}, expected "
                                f"{[sum(t) for t in turns]}")
            elif run.delivered_turns.get(gid) != turns:
                problems.append(f"{tag}: group {gid} members' calls produced "
                                f"{run.delivered_turns.get(gid)}, expected {turns}")
            for member, calls_of_member in enumerate(turns):
                calls += len(calls_of_member)
                if request_logs:
                    problems += _audit_calls(tag, gid, member, calls_of_member, by_seed,
                                             run_seed)
        if request_logs:
            rids = [r["rid"] for r in run.requests]
            if len(rids) != len(set(rids)):
                problems.append(f"{tag}: an rid was sent to the replicas twice")
            requests: float | None = len(rids)
            generated: float | None = sum(r["tokens"] for r in run.requests)
        else:  # the replicas' own counters over the run
            requests = run.engine_counters.get("requests")
            generated = run.engine_counters.get("generation_tokens")
        if complete:
            if requests is None or requests < calls or (requests != calls and not resumed):
                problems.append(f"{tag}: the replicas ran {requests} requests for {calls} "
                                "model calls")
            if generated != run.output_tokens:
                problems.append(f"{tag}: the replicas generated {generated} tokens, the "
                                f"results hold {run.output_tokens}")
            episodes = sum(len(t) for t in want.values())
            if run.counters.get("finished", 0) != episodes:
                problems.append(f"{tag}: {run.counters.get('finished', 0)} episodes "
                                f"finished, expected {episodes}")
        problems += [f"{tag}: doctor: {p}" for p in run.doctor_problems]
    return problems



def _audit_calls(tag: str, gid: str, member: int, lengths: list[int],
                 by_seed: dict[int, list[dict[str, Any]]], run_seed: int) -> list[str]:
    """One delivered member's calls against the replicas' logs."""
    first = episode_seed(run_seed, gid, member)
    aid = None
    for turn, length in enumerate(lengths):
        found = by_seed.get(first if turn == 0 else episode_seed(first, "turn", turn), [])
        where = f"{tag}: group {gid} member {member} call {turn}"
        if len(found) != 1:
            return [f"{where}: {len(found)} requests in the replicas' logs, expected 1"]
        request = found[0]
        aid = request["rid"] if turn == 0 else aid
        if request["tokens"] != length:
            return [f"{where}: {request['tokens']} tokens, expected {length}"]
        if aid is None or request["rid"] != turn_rid(aid, turn):
            return [f"{where}: rid {request['rid']!r} is not turn {turn} of attempt {aid!r}"]
    return []

