"""Redis's own counters, read from the server: ``INFO commandstats`` (calls and time
by command, commands run inside scripts included; ``INFO`` itself left out), ``INFO
cpu`` and ``INFO clients``; one reading, and what happened between two. The
redis-load bench measures the farm with them, the bench's pilots and the planner a
run's ledger. Also the unit the redis-load bench states CPU in (trivial script calls,
:func:`trivial_calls`) and a profile of one run by command from Redis's slow log
(:func:`profiled`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import redis


@dataclass(frozen=True)
class Sample:
    """One reading of Redis's own counters."""

    at: float
    calls: dict[str, int]  # command -> calls (INFO commandstats), INFO itself left out
    cpu_s: float  # used_cpu_sys + used_cpu_user
    clients: int  # connected_clients
    usec: dict[str, int]  # command -> microseconds spent in it (INFO commandstats)

    @property
    def total(self) -> int:
        return sum(self.calls.values())


def read(client: redis.Redis) -> Sample:
    """One reading of *client*'s counters."""
    stats = client.info("commandstats")
    cpu = client.info("cpu")
    clients = client.info("clients")
    ours = {name.removeprefix("cmdstat_"): v for name, v in stats.items()
            if name != "cmdstat_info"}
    return Sample(time.monotonic(), {k: int(v["calls"]) for k, v in ours.items()},
                  float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"]),
                  int(clients["connected_clients"]),
                  {k: int(v["usec"]) for k, v in ours.items()})


@dataclass(frozen=True)
class Window:
    """What happened between two samples."""

    seconds: float
    calls: dict[str, int]
    cpu_s: float
    usec: dict[str, int] = field(default_factory=dict)  # in commands (a script's: EVALSHA)

    @classmethod
    def between(cls, a: Sample, b: Sample) -> Window:
        calls = {k: b.calls.get(k, 0) - a.calls.get(k, 0) for k in b.calls}
        usec = {k: b.usec.get(k, 0) - a.usec.get(k, 0) for k in b.usec}
        return cls(b.at - a.at, {k: v for k, v in calls.items() if v}, b.cpu_s - a.cpu_s,
                   {k: v for k, v in usec.items() if v})

    @property
    def calls_per_s(self) -> float:
        return sum(self.calls.values()) / self.seconds

    @property
    def core_pct(self) -> float:
        return 100.0 * self.cpu_s / self.seconds

    def per_s_above(self, ref: Window) -> dict[str, float]:
        """Calls per second by command above *ref*'s rate of the same command, most
        first."""
        above = {k: v / self.seconds - ref.calls.get(k, 0) / ref.seconds
                 for k, v in self.calls.items()}
        return dict(sorted(above.items(), key=lambda kv: -kv[1]))


#: The unit of Redis CPU: one trivial script call (``EVALSHA`` of this script with one
#: key and one argument), sent one at a time on one connection. What a farm costs is
#: said in these units, measured on the same server in the same run: absolute CPU per
#: call moves with the machine and its load, the unit moves with it.
TRIVIAL_SCRIPT = "return 1"
#: Trivial calls per measurement of the unit.
UNIT_CALLS = 10_000


def above(w: Window, ref: Window) -> tuple[float, float]:
    """(calls, cpu seconds) of *w* above *ref*'s rates."""
    return (sum(w.calls.values()) - ref.calls_per_s * w.seconds,
            w.cpu_s - ref.cpu_s / ref.seconds * w.seconds)


def trivial_calls(client: redis.Redis, calls: int = UNIT_CALLS) -> Window:
    """Send *calls* trivial script calls on *client*'s connection, one at a time, and
    return Redis's counters over them (whatever else ran meanwhile included)."""
    sha = client.script_load(TRIVIAL_SCRIPT)
    a = read(client)
    for _ in range(calls):
        client.evalsha(sha, 1, "trivial-unit", "x")
    return Window.between(a, read(client))


#: Slow-log entries kept while a profile runs (every command is one).
PROFILE_ENTRIES = 1_000_000


def profiled(client: redis.Redis, run: Callable[[], object], scripts: Mapping[str, str]
             ) -> dict[str, tuple[int, int]]:
    """Run *run* while Redis's slow log takes every command, and return (calls,
    microseconds) by command: what each cost Redis to execute, its I/O left out; a
    script call (``EVALSHA``) goes under its name in *scripts* (SHA1 -> name). The slow
    log's settings are put back after, and it is emptied before and after."""
    saved = client.config_get("slowlog-*")
    client.config_set("slowlog-max-len", PROFILE_ENTRIES)
    client.config_set("slowlog-log-slower-than", 0)
    client.slowlog_reset()
    try:
        run()
        entries = client.slowlog_get(PROFILE_ENTRIES)
    finally:
        for name, value in saved.items():
            client.config_set(name, value)
        client.slowlog_reset()
    out: dict[str, tuple[int, int]] = {}
    for entry in entries:
        command = entry["command"]
        words = (command.decode(errors="replace") if isinstance(command, bytes)
                 else str(command)).split()
        if not words:
            continue
        name = words[0].lower()
        if name in ("evalsha", "evalsha_ro") and len(words) > 1:
            sha = words[1]
            name = f"{scripts[sha]}.lua" if sha in scripts else f"script {sha[:8]}"
        elif name in ("slowlog", "config", "info"):
            continue  # the profile's own
        calls, usec = out.get(name, (0, 0))
        out[name] = (calls + 1, usec + int(entry["duration"]))
    return out
