"""The farm's shape: the settings every process of one farm must agree on.

A worker with another ``rollout.group_size`` would run members the farm never asked
for; one with another workflow or seed would produce episodes that do not match their
group. The first process to reach a farm records these settings (``SET NX``, so two
first processes cannot both win); every later one compares its own and refuses to
start on a difference, naming each setting and both values. A farm placing groups
needs every worker to read its own replica's queue, so ``rollout.placement`` is part
of the shape; a farm recorded before a setting joined the shape holds its default.

The record also holds the schema of the ledger: the layout of the farm's keys and
records in Redis that this release reads and writes. A process of another schema
refuses to start (exit 2) and says to drain the farm first (``doctor`` checks it too).
A record without one was written before the schema was recorded, by a release this one
reads as it is (its outbox's plain attempt ids included): a process that matches the
rest of it adds the schema in place.
"""

from __future__ import annotations

import json
import os
import socket
import time

import redis

from queue_rollout.config import Config
from queue_rollout.errors import ConfigError, SchemaMismatch
from queue_rollout.ledger.connection import client_url, translate_errors
from queue_rollout.ledger.keys import Keys


def shape_of(config: Config) -> dict[str, object]:
    """The settings of *config* that must match the farm's, by dotted key."""
    return {"rollout.group_size": config.rollout.group_size,
            "workflow.name": config.workflow.name,
            "workflow.seed": config.workflow.seed,
            "rollout.placement": config.rollout.placement}


#: What a farm recorded before a setting joined the shape holds.
_RECORDED_BEFORE: dict[str, object] = {"rollout.placement": "any"}

#: The layout of the farm's keys and records in Redis this release reads and writes.
SCHEMA = 1
#: The schema of a ledger recorded before the record held one.
_SCHEMA_BEFORE = 1


def check_schema(client: redis.Redis, config: Config) -> None:
    """Raise SchemaMismatch if the farm's ledger is in another schema than this
    release's; writes nothing (a farm with no record yet passes)."""
    with translate_errors(client_url(client)):
        raw = client.get(Keys(config.farm.name).shape)
    if raw is not None:
        _same_schema(config.farm.name, json.loads(raw))


def _same_schema(farm_name: str, farm: dict[str, object]) -> None:
    schema = farm.get("schema", _SCHEMA_BEFORE)
    if schema != SCHEMA:
        raise SchemaMismatch(
            f"farm {farm_name!r} keeps its ledger in schema {schema} (recorded by "
            f"{farm.get('by', '?')}); this queue-rollout reads and writes schema {SCHEMA}. "
            "Drain the farm first with the release that runs it (every group delivered "
            "and acknowledged: `queue-rollout status`), then start this release under "
            "another farm.name")


def check_shape(client: redis.Redis, config: Config) -> None:
    """Record the farm's shape if none is recorded yet; else raise ConfigError if
    *config* disagrees with it."""
    key = Keys(config.farm.name).shape
    mine = shape_of(config)
    record = json.dumps({"schema": SCHEMA, "shape": mine,
                         "by": f"{socket.gethostname()}:{os.getpid()}", "at": time.time()})
    with translate_errors(client_url(client)):
        if client.set(key, record, nx=True):
            return
        raw = client.get(key)
    if raw is None:  # deleted in between (a farm being cleared): nothing to hold to
        return
    farm = json.loads(raw)
    _same_schema(config.farm.name, farm)
    theirs = {**_RECORDED_BEFORE, **farm.get("shape", {})}
    diffs = [f"{k} = {json.dumps(v)} here, {json.dumps(theirs.get(k))} in the farm"
             for k, v in mine.items() if theirs.get(k) != v]
    if diffs:
        raise ConfigError(
            f"farm {config.farm.name!r} runs another configuration: {'; '.join(diffs)} "
            f"(recorded by {farm.get('by', '?')}); use the farm's settings or another "
            "farm.name")
    if "schema" not in farm:
        _add_schema(client, key, raw, {"schema": SCHEMA, **farm})


def _add_schema(client: redis.Redis, key: str, raw: bytes, record: dict[str, object]) -> None:
    """Rewrite the shape record *raw* as *record* (the same, with the schema), unless it
    changed meanwhile: then whoever changed it decided."""
    with translate_errors(client_url(client)), client.pipeline() as pipe:
        try:
            pipe.watch(key)
            if pipe.get(key) == raw:
                pipe.multi()
                pipe.set(key, json.dumps(record))
                pipe.execute()
        except redis.WatchError:
            pass
