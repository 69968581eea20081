"""`queue-rollout trace GROUP` on a real farm: a `queue-rollout worker` process with a
simulated replica and the real collector. One group's long attempt dies with its
episode process (SIGKILL): it is doubted, its stop confirmed, and retried; another
group is rejected by the acceptance rules. The trace tells both stories."""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
from contextlib import ExitStack
from pathlib import Path

import pytest
from rq.serializers import JSONSerializer
from rq.worker import Worker

from queue_rollout.cli.trace import cmd_trace, configure
from queue_rollout.collector.loop import Collector
from queue_rollout.config import Config, load_config
from queue_rollout.errors import BadInput
from queue_rollout.ledger.core import Ledger
from testkit import WorkerFarm, wait_for, write_worker_farm

RULES = '''
def rules(group):
    """Reject a group whose prompt says so, in words."""
    return True if group.prompt.get("keep", True) else "its prompt asked to be rejected"
'''


def trace(config: Config, *argv: str) -> int:
    parser = argparse.ArgumentParser(prog="queue-rollout trace")
    configure(parser)
    return cmd_trace(config, parser.parse_args(argv))


@pytest.mark.e2e
def test_trace_tells_a_retry_after_sigkill_and_a_rejection(
        r, redis_url, tmp_path, monkeypatch, capsys):
    (tmp_path / "trace_rules.py").write_text(RULES)
    monkeypatch.syspath_prepend(str(tmp_path))  # the collector here, the worker below
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        p for p in (str(tmp_path), os.environ.get("PYTHONPATH", "")) if p))
    toml = write_worker_farm(tmp_path / "farm.toml", redis_url, group_size=2, slots=2, lease=2,
                             acceptance={"plugin": "trace_rules:rules"},
                             collector={"step_ms": 50})
    config = load_config(toml)
    ledger = Ledger.from_config(r, config)
    stop = threading.Event()
    with ExitStack() as stack:
        WorkerFarm(stack, toml, replicas=1, step_ms=2.0)
        thread = Collector(ledger, config, name="test-collector").start(stop)
        stack.callback(thread.join, 30)
        stack.callback(stop.set)
        # member 0 decodes for about 4 s, member 1 ends at once
        ledger.submit([("long", json.dumps({"id": "long", "prompt": "x",
                                            "member_lengths": [2000, 20]}).encode())])

        def killable() -> bool:
            first, short = ledger.current_attempt("long", 0), ledger.current_attempt("long", 1)
            return (first is not None and first[1].state == "running"
                    and short is not None and short[1].state == "finished")

        wait_for(killable, 60, "the long member running, the short one finished")
        killed = ledger.current_attempt("long", 0)
        assert killed is not None
        # the worker's episode processes die (only the long attempt runs in one of them)
        pids = [w.pid for w in Worker.all(connection=r, serializer=JSONSerializer)]
        assert pids
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        wait_for(lambda: (g := ledger.group("long")) is not None and g.state == "accepted",
                 90, "the long group retried and accepted")
        retried = ledger.current_attempt("long", 0)
        assert retried is not None and retried[0] != killed[0]
        retried_aid = retried[0]
        ledger.submit([("bad", json.dumps({"id": "bad", "prompt": "x", "keep": False,
                                           "member_lengths": [20, 20]}).encode())])
        wait_for(lambda: (g := ledger.group("bad")) is not None and g.state == "rejected",
                 60, "the bad group rejected")
        delivery = ledger.pop_batch("trainer-0")
        assert delivery is not None and delivery.batch.groups == ["long"]
        assert ledger.ack("trainer-0", delivery.batch.id).status == "acked"
    capsys.readouterr()

    # the retried group, for people
    assert trace(config, "long") == 0
    text = capsys.readouterr().out
    for words in ("group long: consumed", "admitted", "under policy version 0",
                  f"attempt 1 {killed[0]}: worker ", f"retried as attempt 2 {retried_aid}",
                  "its stop was confirmed", f"attempt 2 {retried_aid}: worker ", "finished +",
                  "judged     +", "accepted", f"in batch {delivery.batch.id} to consumer "
                  "trainer-0", "acked      +"):
        assert words in text, (words, text)

    # and for programs
    assert trace(config, "long", "--json") == 0
    story = json.loads(capsys.readouterr().out)
    assert story["state"] == "consumed" and story["version"] == 0 and story["members"] == 2
    first, second, short = story["attempts"]
    assert (first["attempt"], first["member"], first["state"]) == (killed[0], 0, "stopped")
    assert first["worker"] == second["worker"] == short["worker"] is not None
    assert first["replica"] and first["started_at"] < first["ended_at"]
    assert first["retried_as"] == retried_aid and first["resolution"] == "stopped"
    assert first["cause"] in ("lease_expired", "worker_lost")
    (doubt,) = first["doubts"]
    assert doubt["resolution"] == "stopped" and doubt["resolved_at"] == first["ended_at"]
    assert (second["attempt"], second["number"], second["state"]) == (retried_aid, 2,
                                                                     "finished")
    assert second["started_at"] >= first["ended_at"]
    assert (short["member"], short["state"]) == (1, "finished")
    assert story["judged"]["accepted"] is True
    assert [(d["batch"], d["consumer"]) for d in story["deliveries"]] == [
        (delivery.batch.id, "trainer-0")]
    assert story["acked"]["consumer"] == "trainer-0"
    assert story["admitted_at"] <= first["started_at"] < story["judged"]["at"] \
        <= story["deliveries"][0]["at"] <= story["acked"]["at"]

    # the rejected group: why, in the rule's words; never delivered
    assert trace(config, "bad") == 0
    text = capsys.readouterr().out
    assert "group bad: rejected" in text
    assert "rejected: plugin (its prompt asked to be rejected)" in text, text
    assert "delivered" not in text and "acked" not in text
    assert trace(config, "bad", "--json") == 0
    story = json.loads(capsys.readouterr().out)
    assert story["judged"] == {"at": story["judged"]["at"], "accepted": False,
                               "reason": "plugin", "detail": "its prompt asked to be rejected"}
    assert [a["state"] for a in story["attempts"]] == ["finished", "finished"]
    assert story["deliveries"] == [] and story["acked"] is None

    # a group the farm never saw: bad input, exit 2
    with pytest.raises(BadInput, match="unknown to farm e2e") as exc:
        trace(config, "nobody")
    assert exc.value.exit_code == 2


def test_trace_of_an_unknown_group_is_bad_input(r, redis_url, tmp_path: Path):
    config = load_config(write_worker_farm(tmp_path / "farm.toml", redis_url, group_size=1,
                                           slots=1, lease=2))
    with pytest.raises(BadInput, match="'ghost': unknown to farm e2e") as exc:
        trace(config, "ghost")
    assert exc.value.exit_code == 2
