"""`queue-rollout release --consumer ID`: prints what it released; nothing held is ok."""

from __future__ import annotations

import argparse

import pytest

from queue_rollout.cli.release import cmd_release, configure
from queue_rollout.config import load_config
from queue_rollout.ledger.core import Ledger
from queue_rollout.ledger.doctor import examine
from testkit import trivial_prompts, write_farm


@pytest.fixture
def config(tmp_path, redis_url):
    return load_config(write_farm(
        tmp_path / "farm.toml", farm={"name": "cr", "redis_url": redis_url},
        rollout={"group_size": 1, "batch_size": 2, "max_concurrent_samples": 8}))


def parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="release")
    configure(p)
    return p.parse_args(list(argv))


def test_the_consumer_is_required():
    with pytest.raises(SystemExit):
        parse()
    assert parse("--consumer", "trainer-3").consumer == "trainer-3"


def test_release_prints_the_batch_and_its_groups_then_nothing_is_held(r, config, capsys):
    ledger = Ledger.from_config(r, config)
    ledger.submit(trivial_prompts(2))
    for _ in range(2):
        a = ledger.admit()
        ledger.start(a.attempt_ids[0], "w", "r0", "b", 30)
        ledger.finish(a.attempt_ids[0], 0, b"x")
        ledger.judge(a.group_id, accept=True)
    held = ledger.pop_batch("trainer-3")
    assert held is not None

    assert cmd_release(config, parse("--consumer", "trainer-3")) == 0
    out = capsys.readouterr().out
    assert held.batch.id in out and "p0, p1" in out and "trainer-3" in out
    assert ledger.held() == [] and r.llen(ledger.keys.ready) == 2
    assert examine(r, ledger.keys, 2).ok

    assert cmd_release(config, parse("--consumer", "trainer-3")) == 0
    assert "holds no batch: nothing released" in capsys.readouterr().out
    assert ledger.counters()["released"] == 1
