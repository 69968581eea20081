"""A farm whose ledger was written by an earlier release runs on under this one, every
group delivered (``fixtures/write_ledger.py`` says how each file was made): the release
before the ledger recorded its schema (commit 37aa30b: the record gains the schema), and
the release before a farm could have cells (commit a1367b2: a farm of one Redis, its
keys as they were)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from ledgerdump import dump, load

from queue_rollout.ledger.core import Ledger
from queue_rollout.ledger.doctor import examine
from queue_rollout.ledger.jobs import flush_outbox
from queue_rollout.ledger.keys import Keys
from queue_rollout.ledger.shape import SCHEMA
from testkit import G2_B1, farm_config

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.mark.parametrize(("release", "had_schema", "handed"), [
    ("37aa30b", False, 1),  # its outbox entries, bare ids: only a queued attempt's goes
    ("a1367b2", True, 6),  # every entry becomes a job (start lets one claim win)
])
def test_a_ledger_written_by_an_earlier_release_runs_on_in_place(r, redis_url, release,
                                                                  had_schema, handed):
    load(r, json.loads((FIXTURES / f"ledger-{release}.json").read_text()))
    keys = Keys("upgrade")
    old = json.loads(r.get(keys.shape))
    assert ("schema" in old) is had_schema  # as that release wrote it
    old.pop("schema", None)
    config = farm_config(farm={"name": "upgrade", "redis_url": redis_url},
                         rollout={**G2_B1, "max_staleness": 2})
    now = [1_800_000_100.0]
    ledger = Ledger.from_config(r, config, clock=lambda: now[0])
    assert json.loads(r.get(keys.shape)) == {**old, "schema": SCHEMA}
    assert examine(r, keys, 1).problems == []

    # the outbox it left: handed over as that release's entries say
    assert flush_outbox(r, keys) == handed and r.llen(keys.outbox) == 0
    [held] = ledger.held()
    assert (held.consumer, held.groups) == ("trainer", ["p0"])
    assert ledger.ack("trainer", held.id).status == "acked"
    assert ledger.set_version(1) == 0 and ledger.version() == 1

    def finish(gid: str, member: int, *, start: bool = True) -> None:
        aid, attempt = ledger.current_attempt(gid, member)  # type: ignore[misc]
        if start:
            assert attempt.state == "queued", attempt
            assert ledger.start(aid, "w1", "r0", "boot1", 600).status == "started"
        now[0] += 1
        assert ledger.finish(aid, member, b'{"reward": 1.0}', output_tokens=5
                             ).status == "recorded"

    delivered: list[str] = []

    def train() -> None:  # as a trainer: each batch acknowledged, the version raised
        while (delivery := ledger.pop_batch("trainer")) is not None:
            delivered.extend(delivery.batch.groups)
            assert ledger.ack("trainer", delivery.batch.id).status == "acked"
            ledger.set_version(ledger.version() + 1)

    finish("p2", 0, start=False)  # running when the old release stopped
    finish("p2", 1)
    assert ledger.judge("p2", accept=True).status == "accepted"
    for _ in range(2):
        train()
        admission = ledger.admit()
        assert admission.status == "admitted", admission
        for m in range(2):
            finish(admission.group_id, m)
        assert ledger.judge(admission.group_id, accept=True).status == "accepted"
    assert ledger.admit().status == "empty"
    train()
    assert sorted(delivered) == ["p1", "p2", "p3", "p4"]
    assert {ledger.group(g).state for g in ("p0", *delivered)} == {"consumed"}  # type: ignore[union-attr]
    report = examine(r, keys, 1)
    assert report.problems == [] and report.stored["consumed"] == 5, report


def test_the_fixtures_format_gives_back_every_key_as_it_was(r):
    """``ledgerdump``: what it writes, it reads back, pending stream entries included."""
    r.set("s", b"\x00bytes")
    r.hset("h", mapping={"a": "1", "b": "2"})
    r.rpush("l", "x", "y", "x")
    r.sadd("set", "m", "n")
    r.zadd("z", {"a": 1.5, "b": -2})
    r.set("ttl", "v", px=600_000)
    ids = [r.xadd("events", {"n": str(i)}) for i in range(4)]
    r.xgroup_create("events", "judges", id="0")
    r.xreadgroup("judges", "c1", {"events": ">"}, count=2)
    r.xreadgroup("judges", "c2", {"events": ">"}, count=1)
    r.xack("events", "judges", ids[0])
    before = dump(r)
    r.flushdb()
    load(r, before)
    after = dump(r)
    for name, entry in before["keys"].items():  # an expiry has ticked meanwhile
        assert abs(after["keys"][name].pop("pttl") - entry.pop("pttl")) < 10_000
    assert after == before
    [group] = before["keys"][next(k for k in before["keys"]
                                  if base64.b64decode(k) == b"events")]["groups"]
    assert [p[0] for p in group["pending"]] == [i.decode() for i in ids[1:3]]
