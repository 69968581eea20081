"""``queue-rollout status``: one consistent snapshot of the farm's state."""

from __future__ import annotations

import json
import time
from typing import Any

import redis

from queue_rollout.config import Config
from queue_rollout.ledger.connection import mask_url, primary_address, translate_errors
from queue_rollout.ledger.core import BLOCK_REASONS
from queue_rollout.ledger.keys import Keys
from queue_rollout.ledger.registry import Registry


def farm_status(client: redis.Redis, config: Config, *, redis_url: str,
                now: float | None = None) -> dict[str, Any]:
    """One snapshot of the ledger, read in one transaction so its numbers agree."""
    with translate_errors(redis_url):
        return _farm_status(client, config, redis_url=redis_url, now=now)


def _farm_status(client: redis.Redis, config: Config, *, redis_url: str,
                 now: float | None) -> dict[str, Any]:
    keys = Keys(config.farm.name)
    registry = Registry(client, keys, config.timeouts.lease,
                        clock=time.time if now is None else lambda: now)
    workers = registry.live()
    live_worker_slots = registry.slots(workers)
    pipe = client.pipeline(transaction=True)
    pipe.hgetall(keys.counters)
    pipe.hgetall(keys.state)
    pipe.llen(keys.pending)
    pipe.llen(keys.ready)
    pipe.llen(keys.shapes)
    pipe.hgetall(keys.leader)
    pipe.hgetall(keys.batches)
    pipe.hgetall(keys.refusals)
    (raw_counters, raw_state, pending, ready, shapes, raw_leader, raw_batches,
     raw_refusals) = pipe.execute()
    clock = time.time() if now is None else now
    replicas = _online_replicas(client)
    c = {k.decode(): int(v) for k, v in raw_counters.items()}
    state = {k.decode(): v.decode() for k, v in raw_state.items()}
    r = config.rollout
    capacity = r.capacity_slots(live_worker_slots)
    return {
        "farm": config.farm.name,
        "redis_url": redis_url,
        "redis_primary": primary_address(client),
        "redis_replicas": replicas,
        "redis_wait_replicas": config.farm.redis_wait_replicas,
        "mode": r.mode,
        "capacity": capacity,
        "reserved": c.get("reserved", 0),
        "active_episodes": c.get("running", 0),
        "tool_waits": c.get("tool_wait", 0),
        "doubtful": c.get("doubtful", 0),
        "version": int(state.get("version", 0)),
        "paused": state.get("paused") == "1",
        "pause_mode": state.get("pause_mode") if state.get("paused") == "1" else None,
        "budget_baseline": int(state.get("budget_baseline", 0)),
        "groups": {
            "pending": pending,
            "in_flight": c.get("in_flight", 0),
            "ready": ready,
            "accepted": c.get("accepted", 0),
            "rejected": c.get("rejected", 0),
            "consumed": c.get("consumed", 0),
        },
        "workers": {"alive": len(workers), "slots": live_worker_slots,
                    "limits": {w: int(record.get("slots", 0))
                               for w, record in sorted(workers.items())}},
        "shapes_kept": shapes,
        "placement": {
            "mode": r.placement,
            "one_replica": c.get("placements:one_replica", 0),
            "split": c.get("placements:split", 0),
            "moved": c.get("placements:moved", 0),
            "blocked": c.get("blocked:placement", 0),
        },
        "collector": _collector(raw_leader, clock, config.timeouts.leader_lease),
        "held": sorted(({"batch": b["id"], "consumer": b["consumer"], "since": b["delivered_at"],
                         "groups": len(b["groups"])}
                        for b in map(json.loads, raw_batches.values())),
                       key=lambda h: (h["since"], h["consumer"])),
        "blocked": {reason: n for reason in BLOCK_REASONS
                    if (n := _last_minute(raw_refusals.get(reason.encode()), clock))},
    }


#: What the cells of a farm add up to in its status (the rest is the control Redis's).
CELL_SUMS = ("capacity", "reserved", "active_episodes", "tool_waits", "doubtful")


def cells_status(control: redis.Redis, cells: dict[str, redis.Redis], config: Config, *,
                 now: float | None = None) -> dict[str, Any]:
    """A farm of cells: the control Redis's status (version, pause, groups in flight,
    accepted and consumed, batches, the collector), the slots, episodes, pending and
    rejected groups and workers summed over the cells, and each cell's own status
    under ``cells``."""
    farm = farm_status(control, config, redis_url=mask_url(config.farm.redis_url), now=now)
    parts = {name: farm_status(client, seen := config.for_cell(name),
                               redis_url=mask_url(seen.farm.redis_url), now=now)
             for name, client in cells.items()}
    for key in CELL_SUMS:
        farm[key] = sum(p[key] for p in parts.values())
    for key in ("pending", "rejected"):
        farm["groups"][key] = sum(p["groups"][key] for p in parts.values())
    farm["workers"] = {"alive": sum(p["workers"]["alive"] for p in parts.values()),
                       "slots": sum(p["workers"]["slots"] for p in parts.values()),
                       "limits": {w: n for p in parts.values()
                                  for w, n in p["workers"]["limits"].items()}}
    farm["cells"] = parts
    return farm


def _collector(leader: dict[bytes, bytes], now: float, lease_s: float) -> dict[str, Any]:
    """The collector that leads, and how long ago it last renewed its lease; no leader
    when none holds an unexpired lease (a stopped collector's lease runs out)."""
    holder = leader.get(b"holder", b"").decode()
    expires = float(leader.get(b"expires", b"0"))
    if not holder or now >= expires:
        return {"leader": None, "lease_age_s": None}
    return {"leader": holder, "lease_age_s": round(max(0.0, now - (expires - lease_s)), 1)}


def _last_minute(raw: bytes | None, now: float) -> int:
    """Refusals of the last six 10-second buckets (``admit.lua`` keeps them)."""
    if raw is None:
        return 0
    bucket, *counts = json.loads(raw)
    age = int(now // 10) - bucket  # buckets since the newest one kept
    return sum(counts[max(0, age):]) if age < len(counts) else 0


def _online_replicas(client: redis.Redis) -> int | None:
    """Replicas attached to the primary and online, from INFO replication; None for an
    ACL user that may not run INFO (the trainer's in ops/users.acl)."""
    try:
        replication = client.info("replication")
    except redis.exceptions.NoPermissionError:
        return None
    return sum(1 for name, value in replication.items()
               if name.startswith("slave") and isinstance(value, dict)
               and value.get("state") == "online")


def format_status(s: dict[str, Any], now: float | None = None) -> str:
    g = s["groups"]
    now = time.time() if now is None else now
    return "\n".join([
        f"farm {s['farm']} at {s['redis_url']}  mode={s['mode']}  version={s['version']}"
        + ("  PAUSED" if s["paused"] else ""),
        f"slots     {s['reserved']}/{s['capacity']} reserved, {_running_text(s)}, "
        f"{s['doubtful']} doubtful",
        f"groups    {g['pending']} pending, {g['in_flight']} in flight, {g['ready']} ready; "
        f"{g['accepted']} accepted, {g['rejected']} rejected, {g['consumed']} consumed; "
        f"{s['shapes_kept']} shapes kept for `plan --from-farm`",
        f"workers   {s['workers']['alive']} alive, {s['workers']['slots']} slots"
        + _limits_text(s["workers"]["limits"]),
        _collector_text(s["collector"]),
        *([_held_text(s["held"], now)] if s["held"] else []),
        *([_blocked_text(s["blocked"])] if s["blocked"] or g["pending"] else []),
        *([_placement_text(s["placement"])] if s["placement"]["mode"] == "group" else []),
        f"redis     primary {s['redis_primary']}, {_replicas_text(s['redis_replicas'])}"
        + (f", changes wait for {s['redis_wait_replicas']}" if s["redis_wait_replicas"] else ""),
        *([f"HOLDING   {s['redis_replicas']} of farm.redis_wait_replicas = "
           f"{s['redis_wait_replicas']} replicas online: no ledger change completes until "
           "enough replicas hold it"] if _short(s) else []),
        *(f"cell {name:<5} at {c['redis_url']}: {c['reserved']}/{c['capacity']} slots "
          f"reserved, {c['active_episodes']} running, {c['doubtful']} doubtful; "
          f"{c['groups']['pending']} pending, {c['groups']['in_flight']} in flight; "
          f"{c['workers']['alive']} workers, {c['workers']['slots']} slots"
          for name, c in s.get("cells", {}).items()),
    ])


#: What a pause does to the episodes it holds, by pause mode.
HELD = {"in_place": "paused in place", "abort": "paused, their requests aborted",
        "retract": "paused, their KV retracted"}


def _running_text(s: dict[str, Any]) -> str:
    """The running attempts: generating and in a tool wait, or, while the farm is
    paused, held by the pause."""
    tool = s["tool_waits"]
    if s["paused"]:
        held = HELD.get(s["pause_mode"] or "", "paused")
        return f"{s['active_episodes'] - tool} held ({held}), {tool} in a tool wait"
    return (f"{s['active_episodes']} running ({s['active_episodes'] - tool} generating, "
            f"{tool} in a tool wait)")


def _collector_text(c: dict[str, Any]) -> str:
    if c["leader"] is None:
        return ("collector NONE leads: nothing is admitted, judged or delivered until one "
                "runs (`queue-rollout collector`, or `up`)")
    return f"collector {c['leader']} leads (lease renewed {c['lease_age_s']:g} s ago)"


def _held_text(held: list[dict[str, Any]], now: float) -> str:
    groups = sum(h["groups"] for h in held)
    each = "; ".join(f"{h['batch']} by {h['consumer']} for {max(0.0, now - h['since']):.0f} s"
                     for h in held)
    return (f"held      {groups} groups in {len(held)} unacknowledged batch(es): {each} "
            "(`queue-rollout release --consumer ID` frees a gone consumer's)")


def _blocked_text(blocked: dict[str, int]) -> str:
    if not blocked:
        return "blocked   no admission refused in the last minute"
    return ("blocked   admission refused in the last minute: "
            + ", ".join(f"{reason} {n}" for reason, n in blocked.items()))


def _limits_text(limits: dict[str, int]) -> str:
    """The workers' limits when they differ (adaptive concurrency): their range."""
    values = set(limits.values())
    if len(values) < 2:
        return ""
    return f" (limits {min(values)} to {max(values)} per worker)"


def _placement_text(p: dict[str, Any]) -> str:
    return (f"placement groups: {p['one_replica']} on one replica, {p['split']} split; "
            f"{p['moved']} attempts moved to the shared queue; {p['blocked']} admissions "
            "waited for free slots on the replicas")


def _replicas_text(replicas: int | None) -> str:
    if replicas is None:
        return "replicas unknown (this Redis user may not run INFO)"
    return f"{replicas} replica(s) online"


def _short(s: dict[str, Any]) -> bool:
    replicas = s["redis_replicas"]
    return replicas is not None and replicas < s["redis_wait_replicas"]
