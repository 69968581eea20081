"""A Redis database as JSON and back: every key with its type, value and expiry, streams
with their consumer groups and pending entries. Unlike DUMP / RESTORE the file does not
depend on the Redis version that wrote it. Imports nothing of queue-rollout, so a
checkout of another release can write a file this one reads."""

from __future__ import annotations

import base64
from typing import Any

import redis


def _s(b: bytes) -> str:
    return base64.b64encode(b).decode()


def _b(s: str) -> bytes:
    return base64.b64decode(s)


def dump(client: redis.Redis) -> dict[str, Any]:
    """Every key of *client*'s database, sorted by name."""
    keys: dict[str, Any] = {}
    for key in sorted(client.scan_iter(count=1000)):
        kind = client.type(key).decode()
        entry: dict[str, Any] = {"type": kind, "pttl": client.pttl(key)}
        if kind == "string":
            entry["value"] = _s(client.get(key))
        elif kind == "hash":
            entry["value"] = {_s(k): _s(v) for k, v in sorted(client.hgetall(key).items())}
        elif kind == "list":
            entry["value"] = [_s(v) for v in client.lrange(key, 0, -1)]
        elif kind == "set":
            entry["value"] = sorted(_s(v) for v in client.smembers(key))
        elif kind == "zset":
            entry["value"] = [[_s(m), s] for m, s in client.zrange(key, 0, -1, withscores=True)]
        elif kind == "stream":
            entry["value"] = [[i.decode(), {_s(k): _s(v) for k, v in f.items()}]
                              for i, f in client.xrange(key)]
            groups = []
            for g in client.xinfo_groups(key):
                name = g["name"]
                pending = client.xpending_range(key, name, "-", "+", 1_000_000)
                groups.append({"name": _s(name), "last": g["last-delivered-id"].decode(),
                               "pending": [[p["message_id"].decode(), _s(p["consumer"])]
                                           for p in pending]})
            entry["groups"] = groups
        else:
            raise ValueError(f"{key!r}: a {kind} cannot be written")
        keys[_s(key)] = entry
    return {"keys": keys}


def load(client: redis.Redis, data: dict[str, Any]) -> None:
    """Write *data* (from :func:`dump`) into *client*'s database, which holds none of
    its keys; pending stream entries go back to their consumers."""
    for name, entry in data["keys"].items():
        key, kind, value = _b(name), entry["type"], entry["value"]
        if kind == "string":
            client.set(key, _b(value))
        elif kind == "hash":
            client.hset(key, mapping={_b(k): _b(v) for k, v in value.items()})
        elif kind == "list":
            client.rpush(key, *[_b(v) for v in value])
        elif kind == "set":
            client.sadd(key, *[_b(v) for v in value])
        elif kind == "zset":
            client.zadd(key, {_b(m): s for m, s in value})
        elif kind == "stream":
            for i, fields in value:
                client.xadd(key, {_b(k): _b(v) for k, v in fields.items()}, id=i)
            for g in entry["groups"]:
                group = _b(g["name"])
                client.xgroup_create(key, group, id="0")
                for i, consumer in g["pending"]:  # read again, so pending where it was
                    client.xgroup_setid(key, group, _before(i))
                    got = client.xreadgroup(group, _b(consumer), {key: ">"}, count=1)
                    assert got and got[0][1][0][0].decode() == i, (name, i, got)
                client.xgroup_setid(key, group, g["last"])
        if entry["pttl"] >= 0:
            client.pexpire(key, entry["pttl"])


def _before(stream_id: str) -> str:
    """The id just before *stream_id*."""
    ms, seq = (int(x) for x in stream_id.split("-"))
    return f"{ms}-{seq - 1}" if seq else f"{ms - 1}-18446744073709551615"
