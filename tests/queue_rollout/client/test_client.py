"""RolloutClient and `consume`: whole batches, redelivery, the staleness mask."""

from __future__ import annotations

import json

import pytest
import redis

from queue_rollout import RolloutClient
from queue_rollout.cli.main import main
from queue_rollout.collector.loop import Collector
from queue_rollout.config import load_config
from queue_rollout.errors import BadInput, BarrierTimeout, InvariantViolation
from queue_rollout.ledger.core import Ledger
from testkit import G2_B2, farm_config, finish_all, finish_queued, write_farm


def prompt(pid: str, text: str = "x") -> dict:
    """A prompt with what the farm's workflow (controlled_length, the default) needs:
    member_lengths, the 3 tokens each member of finish_all produces."""
    return {"id": pid, "prompt": text, "member_lengths": [3, 3]}


@pytest.fixture
def farm_toml(tmp_path, redis_url):
    return write_farm(tmp_path / "farm.toml", farm={"name": "tc", "redis_url": redis_url},
                      rollout=G2_B2)


def test_get_batch_returns_whole_groups_and_redelivers_until_ack(farm_toml):
    """A trainer that dies before its ack gets the same batch again (I6, I8)."""
    client = RolloutClient.from_config(farm_toml, consumer="t0")
    assert client.submit([prompt(f"q{i}") for i in range(3)]) == 3
    collector = Collector(client.ledger, client.config, name="c")
    collector.step()
    with pytest.raises(BarrierTimeout):
        client.get_batch(timeout=0.1)
    finish_all(client)
    collector.step()
    batch = client.get_batch(timeout=5)
    assert len(batch.groups) == 2 and not batch.redelivered
    member = batch.groups[0].members[1]
    assert (member.output_ids, member.reward, member.versions) == ([7, 8, 9], 1.0, [0, 0, 0])
    again = RolloutClient.from_config(farm_toml, consumer="t0").get_batch(timeout=1)
    assert again.redelivered and again.id == batch.id  # a restarted trainer
    client.ack(batch)
    with pytest.raises(BadInput):
        client.ack(batch)


def test_a_delivered_group_without_its_record_is_an_invariant_violation(farm_toml):
    """Checked, not asserted: the trainer is told which group broke the ledger (exit 1),
    also under ``python -O``."""
    client = RolloutClient.from_config(farm_toml, consumer="t0")
    client.submit([prompt(f"q{i}") for i in range(2)])
    collector = Collector(client.ledger, client.config, name="c")
    collector.step()
    finish_all(client)
    collector.step()
    assert client.ledger.pop_batch("t0") is not None  # delivered, held for t0
    client.ledger.client.hdel(client.ledger.keys.groups, "q1")
    with pytest.raises(InvariantViolation, match="group q1 was delivered but has no record"):
        client.get_batch(timeout=5)


def test_stale_token_mask(farm_toml):
    client = RolloutClient.from_config(farm_toml)
    client.submit([prompt(f"q{i}") for i in range(2)])
    Collector(client.ledger, client.config, name="c").step()
    finish_all(client, versions=((0, 1), (2, 2)))
    Collector(client.ledger, client.config, name="c").step()
    batch = client.get_batch(timeout=5)
    assert batch.stale_token_mask(current_version=3, max_staleness=1)[0][0] == [False, True, True]
    assert batch.stale_token_mask(current_version=3, max_staleness=3)[0][0] == [True] * 3


def test_get_groups_returns_the_asked_groups_in_order_and_refuses_others(farm_toml, caplog):
    """A synchronous trainer waits for the groups it submitted: in its order; another
    submitter's groups are refused by name; a restarted trainer's unfinished step
    (redelivered, none of the asked groups) is acknowledged untrained."""
    client = RolloutClient.from_config(farm_toml, consumer="t0")
    collector = Collector(client.ledger, client.config, name="c")

    def run(*ids: str) -> None:
        client.submit([prompt(i) for i in ids])
        collector.step()
        finish_all(client)
        collector.step()

    with pytest.raises(BadInput, match="2 distinct group ids"):
        client.get_groups(["q0"])
    with pytest.raises(BadInput, match="with repeats"):
        client.get_groups(["q0", "q0"])
    run("q0", "q1")
    batch = client.get_groups(["q1", "q0"], timeout=5)
    assert [g.id for g in batch.groups] == ["q1", "q0"]
    assert [g.prompt["id"] for g in batch.groups] == ["q1", "q0"]
    client.ack(batch)
    run("x0", "x1")  # another trainer's
    with pytest.raises(BadInput, match=r"groups not asked for \(x0, x1\) in place of q2, q3"):
        client.get_groups(["q2", "q3"], timeout=5)
    restarted = RolloutClient.from_config(farm_toml, consumer="t0")
    run("q2", "q3")
    with caplog.at_level("WARNING"):
        batch = restarted.get_groups(["q3", "q2"], timeout=5)
    assert [g.id for g in batch.groups] == ["q3", "q2"]
    assert "acknowledged untrained" in caplog.text
    restarted.ack(batch)
    assert client.ledger.counters()["consumed"] == 6
    with pytest.raises(BarrierTimeout):
        restarted.get_groups(["q4", "q5"], timeout=0.1)


def test_submit_refuses_bad_and_duplicate_prompts_whole(farm_toml):
    client = RolloutClient.from_config(farm_toml)
    with pytest.raises(BadInput, match="prompt #1"):
        client.submit([prompt("a"), {"id": "b"}])
    with pytest.raises(BadInput, match="duplicate id 'a'"):
        client.submit([prompt("a"), prompt("a", "y")])
    client.submit([prompt("a")])
    with pytest.raises(BadInput, match=r"1 id already known to the farm: 'a' \(prompt #1\)"):
        client.submit([prompt("b"), prompt("a")])
    assert client.status()["groups"]["pending"] == 1


def test_one_prompt_given_where_a_list_of_prompts_goes_is_refused_as_such(farm_toml):
    client = RolloutClient.from_config(farm_toml)
    for one in (prompt("c"), '{"id": "c"}', b'{"id": "c"}'):
        with pytest.raises(BadInput, match=r"submit takes a list of prompts .*"
                                           r"submit\(\[prompt\]\)"):
            client.submit(one)
    assert client.status()["groups"]["pending"] == 0


def test_consume_json_lines_and_version_bump(farm_toml, capsys):
    client = RolloutClient.from_config(farm_toml)
    client.submit([prompt(f"q{i}") for i in range(4)])
    collector = Collector(client.ledger, client.config, name="c")
    collector.step()
    finish_all(client)
    collector.step()
    assert main(["consume", "--batches", "2", "--json", "-c", str(farm_toml)]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(b["batch"], b["version"], b["redelivered"], len(b["groups"])) for b in lines] == [
        (1, 0, False, 2), (2, 1, False, 2)]
    assert lines[0]["groups"][0]["members"][0] == {
        "member": 0, "output_tokens": 3, "reward": 0.0, "finish_reason": "length",
        "versions": [0], "turn_lengths": []}  # a result written without turn lengths
    assert client.version() == 2
    assert main(["consume", "--batches", "1", "--timeout", "0.2", "-c", str(farm_toml)]) == 3
    assert main(["set-version", "7", "-c", str(farm_toml)]) == 0
    assert load_config(farm_toml).farm.name == "tc" and client.version() == 7


@pytest.fixture
def used_farm(farm_toml) -> RolloutClient:
    """A farm with history: 'a' and 'b' consumed (prompts purged), 'd' pending."""
    client = RolloutClient.from_config(farm_toml)
    client.submit([prompt(i) for i in "ab"])
    collector = Collector(client.ledger, client.config, name="c")
    collector.step()
    finish_all(client)
    collector.step()
    client.ack(client.get_batch(timeout=5))
    client.submit([prompt("d")])
    groups = client.status()["groups"]
    assert (groups["consumed"], groups["pending"]) == (2, 1)
    assert not client.ledger.client.hexists(client.ledger.keys.prompts, "a")
    return client


def lengths(value: object) -> list[dict]:
    return [prompt("n0"), {"id": "n1", "prompt": "x", "member_lengths": value}]


@pytest.mark.parametrize("prompts,message", [
    ([prompt("n0"), prompt("n0", "y")],
     "prompt #1: duplicate id 'n0' (first as prompt #0)"),
    ([prompt("n0"), prompt("a"), prompt("d")],
     "nothing submitted: 2 ids already known to the farm: 'a' (prompt #1), 'd' (prompt #2)"),
    (lengths([1, 2, 3]), "prompt #1: prompt 'n1': `member_lengths` must hold "
                         "rollout.group_size = 2 ints"),
    (lengths((1, 2)), "prompt #1: prompt 'n1': `member_lengths` must hold "
                      "rollout.group_size = 2 ints"),
    (lengths([1, 0]), "prompt #1: prompt 'n1': `member_lengths` entries must be ints > 0"),
    (lengths([-3, 1]), "prompt #1: prompt 'n1': `member_lengths` entries must be ints > 0"),
    (lengths([True, 1]), "prompt #1: prompt 'n1': `member_lengths` entries must be ints > 0"),
    ([{"id": "n0"}], "prompt #0: prompt 'n0' needs exactly one of `prompt` or `input_ids`"),
    ([{"id": "n0", "prompt": "x" * (1 << 20)}],
     "prompt #0: prompt 'n0' is 1048599 bytes, over limits.max_prompt_bytes = 1048576"),
    ([{"id": "n0", "prompt": "x", "weight": float("inf")}],
     "prompt #0: prompt 'n0' is not JSON: NaN and infinities are not JSON"),
    ([{"id": "n0", "prompt": "x", "tags": {"t"}}],
     "prompt #0: prompt 'n0' is not JSON: Object of type set is not JSON serializable"),
    ([{"id": "n0", "prompt": "x", "scores": {("a", 1): 0.5}}],
     "prompt #0: prompt 'n0' is not JSON: keys must be str, int, float, bool or None, not tuple"),
    ([prompt("n\udc80")],
     "prompt #0: prompt 'n\\udc80' is not JSON: a lone surrogate (\\ud800-\\udfff) is not "
     "Unicode text"),
])
def test_bad_submissions_are_refused_whole_and_change_nothing(used_farm, redis_snapshot,
                                                              prompts, message):
    before = redis_snapshot()
    with pytest.raises(BadInput) as info:
        used_farm.submit(prompts)
    assert str(info.value) == message
    assert redis_snapshot() == before
    assert used_farm.submit([prompt("n0")]) == 1  # the farm still takes prompts
    assert redis_snapshot() != before


def test_every_trainer_call_raises_redis_unavailable_when_redis_is_gone(tmp_path):
    """The client is the trainer's boundary: a dead Redis is RedisUnavailable (with the
    URL masked), never one of redis-py's own errors."""
    from queue_rollout.errors import RedisUnavailable
    from queue_rollout.ledger.embedded import EmbeddedRedis

    server = EmbeddedRedis(tmp_path / "redis", write_url=False)
    url = server.start()
    toml = write_farm(tmp_path / "farm.toml", farm={"name": "gone", "redis_url": url},
                      rollout={"group_size": 2, "batch_size": 1}, timeouts={"pause_barrier": 1})
    client = RolloutClient.from_config(toml)
    server.stop()
    calls = {"status": client.status, "version": client.version,
             "set_version": lambda: client.set_version(3), "pause": client.pause,
             "resume": client.resume, "update_weights": lambda: client.update_weights("/w", 2),
             "group": lambda: client.ledger.group("g"),
             "attempt": lambda: client.ledger.attempt("a"),
             "result": lambda: client.ledger.result("g", 0),
             "get_batch": lambda: client.get_batch(timeout=0.5)}
    for name, call in calls.items():
        with pytest.raises((RedisUnavailable, BarrierTimeout)) as err:
            call()
        if name == "get_batch":  # polls through an outage until its timeout
            assert isinstance(err.value, BarrierTimeout), name
        else:
            assert isinstance(err.value, RedisUnavailable), name
            assert "Redis unreachable at redis://127.0.0.1:" in str(err.value), name


def _rewind_to(client: RolloutClient, dump: dict[bytes, bytes]) -> None:
    """Put the database back as *dump* holds it: a failover to a replica that missed
    the writes since (what ``farm.redis_wait_replicas = 0`` allows)."""
    r = client.ledger.client
    r.flushdb()
    for key, value in dump.items():
        r.restore(key, 0, value)


def _dump(client: RolloutClient) -> dict[bytes, bytes]:
    r = client.ledger.client
    return {key: r.dump(key) for key in r.scan_iter()}


def test_a_lost_ack_or_delivery_never_gives_the_trainer_a_group_twice(farm_toml, caplog):
    client = RolloutClient.from_config(farm_toml, consumer="t0")
    client.submit([prompt(f"q{i}") for i in range(6)])
    collector = Collector(client.ledger, client.config, name="c")
    for _ in range(3):
        collector.step()
        finish_all(client)
    collector.step()
    trained: list[str] = []

    def train(batch) -> None:
        trained.extend(g.id for g in batch.groups)
        client.ack(batch)

    # The acknowledgement is lost: the batch comes back, and is acknowledged untrained.
    first = client.get_batch(timeout=5)
    before_ack = _dump(client)
    train(first)
    _rewind_to(client, before_ack)
    # The delivery is lost: the ledger refuses the ack, the groups come again, dropped.
    before_delivery = _dump(client)
    second = client.get_batch(timeout=5)
    assert {g.id for g in second.groups}.isdisjoint(trained)
    _rewind_to(client, before_delivery)
    train(second)  # refused by the ledger, logged, no error
    third = client.get_batch(timeout=5)
    train(third)
    assert sorted(trained) == [f"q{i}" for i in range(6)]  # each group once
    assert client.status()["groups"]["consumed"] == 6
    assert "acknowledged untrained" in caplog.text and "lost its delivery" in caplog.text
    with pytest.raises(BarrierTimeout):
        client.get_batch(timeout=0.2)


def test_a_trainer_on_a_farm_of_cells(redis_url):
    """The control Redis and two cells as databases of one server: prompts go to their
    cells, batches come from the control Redis with each group's results from its cell,
    an ack consumes them in their cells, and the controls reach every cell (the control
    Redis first to pause, last to resume)."""
    base = redis_url.rsplit("/", 1)[0]
    config = farm_config(farm={"name": "tc", "redis_url": redis_url}, rollout=G2_B2)
    clients = [redis.Redis.from_url(f"{base}/{db}") for db in (1, 2, 3)]
    try:
        control, a, b = (Ledger(c, "tc", config.rollout) for c in clients)
        farm = {"a": a, "b": b}
        trainer = RolloutClient(control, config, "t0", cells=farm)
        assert trainer.submit([prompt(f"q{i}") for i in range(6)]) == 6
        with pytest.raises(BadInput, match="q3"):
            trainer.submit([prompt("q3"), prompt("q9")])
        collectors = [Collector(cell, config, name="c", control=control, cell=name)
                      for name, cell in farm.items()]
        for _ in range(3):
            for collector in collectors:
                collector.step()
            for cell in farm.values():
                finish_queued(cell)
        batch = trainer.get_batch(timeout=5)
        member = batch.groups[0].members[1]
        assert (member.output_ids, member.reward) == ([7, 8, 9], 1.0)
        cell_of = {g.id: control.group(g.id).cell for g in batch.groups}
        trainer.ack(batch)
        assert all(farm[cell_of[g]].group(g).state == "consumed" for g in cell_of)
        trainer.set_version(1)
        trainer.pause()  # no live workers: nobody to wait for
        assert [c.version() for c in (control, a, b)] == [1, 1, 1]
        assert all(c.client.hget(c.keys.state, "paused") == b"1" for c in (control, a, b))
        trainer.resume()
        assert all(c.client.hget(c.keys.state, "paused") == b"0" for c in (control, a, b))
    finally:
        for c in clients:
            c.close()
