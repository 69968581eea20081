"""AttemptRunner: one attempt end to end against a simulated replica and the ledger."""

from __future__ import annotations

import dataclasses
import json
import threading
import time

import msgspec
import pytest

from queue_rollout.config import Config
from queue_rollout.engines.base import episode_seed
from queue_rollout.engines.sglang import SGLangClient
from queue_rollout.lab.sim.server import ThreadedSimEngine
from queue_rollout.ledger.core import Answer, Ledger
from queue_rollout.results import decode_result
from queue_rollout.workers.episode import AttemptRunner, LeaseKeeper, _Live
from queue_rollout.workers.workflows import extract_answer, load_workflow
from testkit import running, wait_for


def make_config(**sections) -> Config:
    base = {"farm": {"name": "t"},
            "rollout": {"group_size": 2, "batch_size": 1, "max_concurrent_samples": 8}}
    for name, values in sections.items():
        base.setdefault(name, {}).update(values)
    return msgspec.convert(base, Config)


def setup(r, config: Config, prompts: list[dict]) -> tuple[Ledger, list]:
    ledger = Ledger(r, config.farm.name, config.rollout)
    ledger.submit((p["id"], json.dumps(p).encode()) for p in prompts)
    return ledger, [ledger.admit() for _ in prompts]


def runner_for(ledger: Ledger, config: Config, url: str, timeout: float = 5,
               **kw) -> AttemptRunner:
    return AttemptRunner(ledger=ledger, config=config, client=SGLangClient(url, timeout=timeout),
                         worker_id="w0", boot_id="boot0", workflow=load_workflow(config), **kw)


def run_in_background(runner: AttemptRunner, aid: str) -> tuple[threading.Thread, dict]:
    """Run the attempt on a thread; ``out["v"]`` holds what run() returned."""
    out: dict = {}
    thread = threading.Thread(target=lambda: out.setdefault("v", runner.run(aid)))
    thread.start()
    return thread, out


@pytest.fixture
def fast():
    with ThreadedSimEngine(slots=8, step_ms=0.05) as engine:
        yield engine


@pytest.fixture
def slow():
    with ThreadedSimEngine(slots=8, step_ms=10.0) as engine:  # 100 tokens/s
        yield engine


def test_controlled_length_episodes_produce_exactly_their_lengths(r, fast):
    config = make_config()
    ledger, [adm] = setup(r, config, [{"id": "p", "prompt": "x", "member_lengths": [7, 300]}])
    runner = runner_for(ledger, config, fast.url)
    assert [runner.run(aid) for aid in adm.attempt_ids] == ["finished", "finished"]
    results = [decode_result(ledger.result("p", m), 1 << 20) for m in range(2)]
    assert [len(x.output_ids) for x in results] == [7, 300]
    assert results[1].versions() == [0] * 300 and results[1].reward is None
    assert ledger.counters()["output_tokens"] == 307
    assert ledger.group("p").state == "complete"
    assert runner.run(adm.attempt_ids[0]) == "ignored"  # an RQ job run twice


def test_a_retry_samples_with_the_same_seed(r, fast):
    config = make_config()
    ledger, [adm] = setup(r, config, [{"id": "p", "prompt": "x", "member_lengths": [5, 5]}])
    runner = runner_for(ledger, config, fast.url)
    ledger.start(adm.attempt_ids[0], "w0", fast.url, "boot0", 30)
    new = ledger.retry(adm.attempt_ids[0], cause="worker_lost").attempt_id
    runner.run(new)
    runner.run(adm.attempt_ids[1])
    a, b = (decode_result(ledger.result("p", m), 1 << 20) for m in range(2))
    assert a.output_ids != b.output_ids  # members differ
    direct = SGLangClient(fast.url).generate(
        "direct", text="x", timeout=5, sampling_params={
            "max_new_tokens": 5, "ignore_eos": True, "sampling_seed": episode_seed(0, "p", 0)})
    assert a.output_ids == direct.output_ids  # the seed is (run seed, prompt, member)


def test_math_reward_follows_the_answer(r, fast):
    config = make_config(workflow={"name": "math", "sampling": {"max_new_tokens": 20}})
    ledger, [yes, no] = setup(r, config, [
        {"id": "right", "prompt": "6*7?", "answer": "42", "p_correct": 1.0},
        {"id": "wrong", "prompt": "6*7?", "answer": "42", "p_correct": 0.0},
    ])
    runner = runner_for(ledger, config, fast.url)
    for adm in (yes, no):
        for aid in adm.attempt_ids:
            assert runner.run(aid) == "finished"
    rewards = {gid: [decode_result(ledger.result(gid, m), 1 << 20).reward for m in range(2)]
               for gid in ("right", "wrong")}
    assert rewards == {"right": [1.0, 1.0], "wrong": [0.0, 0.0]}


def test_generate_runs_one_call_with_the_sampling_params_and_leaves_the_reward_to_the_trainer(
        r, fast):
    config = make_config(workflow={"name": "generate",
                                   "sampling": {"max_new_tokens": 6, "ignore_eos": True}})
    ledger, [adm] = setup(r, config, [{"id": "p", "input_ids": [5, 6, 7]}])
    runner = runner_for(ledger, config, fast.url)
    assert [runner.run(aid) for aid in adm.attempt_ids] == ["finished", "finished"]
    results = [decode_result(ledger.result("p", m), 1 << 20) for m in range(2)]
    assert [(len(x.output_ids), x.reward, x.turns) for x in results] == [(6, None, 1)] * 2
    assert results[0].output_ids != results[1].output_ids  # members sample apart


def test_extract_answer():
    assert extract_answer(r"so \boxed{\frac{1}{2}} and then \boxed{7}") == "7"
    assert extract_answer(r"\boxed{\frac{1}{2}}") == r"\frac{1}{2}"
    assert extract_answer("the total is 12, or 13.5") == "13.5"
    assert extract_answer("no digits") is None


def test_a_wrong_length_fails_the_episode_with_the_reason(r, fast):
    config = make_config()
    ledger, [adm] = setup(r, config, [{"id": "p", "prompt": "x", "member_lengths": [3]}])
    runner = runner_for(ledger, config, fast.url)
    assert runner.run(adm.attempt_ids[1]) == "failed"  # member 1 has no length
    result = decode_result(ledger.result("p", 1), 1 << 20)
    assert "no member_lengths[1]" in result.error
    assert ledger.counters()["failed"] == 1


def test_an_oversized_result_fails_the_episode(r, fast):
    config = make_config(limits={"max_result_bytes": 200})
    ledger, [adm] = setup(r, config, [{"id": "p", "prompt": "x", "member_lengths": [500, 1]}])
    runner = runner_for(ledger, config, fast.url)
    assert runner.run(adm.attempt_ids[0]) == "failed"
    result = decode_result(ledger.result("p", 0), 1 << 20)
    assert "exceeds limits.max_result_bytes = 200" in result.error
    assert result.finish_reason == "oversized" and result.output_ids == []
    c = ledger.counters()  # queue_rollout_episodes_failed_total{reason="oversized"}
    assert c["failed"] == c["failed:oversized"] == 1 and "failed:workflow" not in c


def test_a_generate_timeout_makes_the_attempt_doubtful_then_confirmed_and_retried(r, slow):
    config = make_config(timeouts={"request": 1})
    ledger, [adm] = setup(r, config, [{"id": "p", "prompt": "x", "member_lengths": [5000, 1]}])
    runner = runner_for(ledger, config, slow.url)
    assert runner.run(adm.attempt_ids[0]) == "retried"
    c = ledger.counters()
    assert c["doubts:generate_error"] == 1 and c["retries:generate_error"] == 1
    assert c["reserved"] == 2  # the slot moved to the new attempt
    assert ledger.attempt(adm.attempt_ids[0]).state == "stopped"


def test_an_unreachable_replica_hands_the_attempt_back(r):
    config = make_config()
    ledger, [adm] = setup(r, config, [{"id": "p", "prompt": "x", "member_lengths": [5, 5]}])
    runner = runner_for(ledger, config, "http://127.0.0.1:1")
    assert runner.run(adm.attempt_ids[0]) == "retried"
    assert ledger.counters()["retries:generate_error"] == 1


def test_shutdown_aborts_after_the_grace_and_hands_back(r, slow):
    config = make_config(timeouts={"shutdown_grace": 1, "lease": 1})
    ledger, [adm] = setup(r, config, [{"id": "p", "prompt": "x", "member_lengths": [5000, 1]}])
    runner = runner_for(ledger, config, slow.url)
    runner.request_stop()
    started = time.monotonic()
    assert runner.run(adm.attempt_ids[0]) == "retried"
    assert time.monotonic() - started < 10
    assert ledger.counters()["retries:worker_lost"] == 1


def test_the_end_of_the_grace_aborts_a_generation_without_waiting_for_a_renewal(r, slow):
    """With a long lease the next renewal is lease / 3 = 100 s away: the generation is
    aborted when the grace ends, not then (a Ctrl-C took 15 s with a 5 s grace)."""
    config = make_config(timeouts={"shutdown_grace": 1, "lease": 300})
    ledger, [adm] = setup(r, config, [{"id": "p", "prompt": "x",
                                       "member_lengths": [100_000, 1]}])  # 1,000 s
    runner = runner_for(ledger, config, slow.url)
    out: dict = {}
    thread = threading.Thread(target=lambda: out.setdefault("v", runner.run(adm.attempt_ids[0])),
                              daemon=True)
    thread.start()
    wait_for(lambda: running(SGLangClient(slow.url)) == 1, 30, "the generation to run")
    runner.request_stop()
    thread.join(60)  # far less than the 100 s until a renewal
    assert out.get("v") == "retried"
    assert [e["finish"] for e in slow.server.model.log].count("abort") == 1
    assert ledger.counters()["retries:worker_lost"] == 1


def test_a_superseded_attempt_is_aborted_and_reports_nothing(r, slow, clock):
    config = make_config(timeouts={"lease": 1})
    ledger, [adm] = setup(r, config, [{"id": "p", "prompt": "x", "member_lengths": [5000, 1]}])
    runner = runner_for(ledger, config, slow.url)
    aid = adm.attempt_ids[0]
    t, out = run_in_background(runner, aid)
    deadline = time.monotonic() + 5
    while ledger.attempt(aid).state != "running":
        assert time.monotonic() < deadline
        time.sleep(0.02)
    # the reconciler declared it lost (after the doubt timeout) while it still ran
    ledger.mark_doubtful(aid, "lease_expired")
    assert ledger.retry(aid, cause="doubt_timeout", resolution="lost").status == "retried"
    t.join(10)
    assert out["v"] == "superseded"
    assert slow.server.model.log[-1]["finish"] == "abort"
    assert ledger.result("p", 0) is None


class StuckAbort(SGLangClient):
    """A replica whose abort does not answer until ``release`` is set."""

    def __init__(self, url: str) -> None:
        super().__init__(url, timeout=30)
        self.called, self.release = threading.Event(), threading.Event()

    def abort(self, rid: str) -> None:
        self.called.set()
        self.release.wait(30)
        super().abort(rid)


def test_an_abort_the_replica_is_slow_to_answer_holds_up_no_other_episode(r, slow):
    """The lease thread aborts a superseded attempt on a replica that does not answer:
    meanwhile another episode of the same process starts, renews, finishes and returns
    (it waits on no lock the abort holds), and the superseded one ends once it does."""
    config = make_config(timeouts={"lease": 1})
    ledger, [stale, other] = setup(r, config, [
        {"id": "p", "prompt": "x", "member_lengths": [5000, 1]},
        {"id": "q", "prompt": "y", "member_lengths": [150, 150]}])
    client = StuckAbort(slow.url)
    first = AttemptRunner(ledger=ledger, config=config, client=client, worker_id="w0",
                          boot_id="boot0", workflow=load_workflow(config))
    second = AttemptRunner(ledger=ledger, config=config, client=client, worker_id="w0",
                           boot_id="boot0", workflow=load_workflow(config), lease=first.lease)
    aid = stale.attempt_ids[0]
    t, out = run_in_background(first, aid)
    wait_for(lambda: ledger.attempt(aid).state == "running", 5, "the attempt to start")
    ledger.mark_doubtful(aid, "lease_expired")
    assert ledger.retry(aid, cause="doubt_timeout", resolution="lost").status == "retried"
    try:
        assert client.called.wait(5), "the lease thread never aborted the superseded attempt"
        other_aid = other.attempt_ids[0]
        t2, out2 = run_in_background(second, other_aid)
        t2.join(10)  # 150 tokens at 100 tokens/s: renewed several times on the way
        assert out2.get("v") == "finished", "an episode waited on the stuck abort"
        assert ledger.result("q", 0) is not None
        assert not client.release.is_set()  # it all happened while the abort hung
    finally:
        client.release.set()
    t.join(10)
    assert out["v"] == "superseded"
    assert ledger.counters().get("ignored", 0) == 1  # the stale heartbeat, nothing after


class Renewals:
    """A ledger that records the attempts of each renewal call and answers ok."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.changed: list[list[bool]] = []
        self.holders: list[str] = []
        self.called = threading.Event()

    def renew(self, worker, lease_s, attempts, *, holder=""):
        self.calls.append([a.aid for a in attempts])
        self.changed.append([a.changed for a in attempts])
        self.holders.append(holder)
        self.called.set()
        return [Answer("ok") for _ in attempts]


def test_one_renewal_call_carries_every_attempt_of_the_process_however_their_starts_spread():
    """Three attempts whose renewals fall due at different times: when the first is due,
    all three go in that one call (the others a little early), not one call each."""
    ledger = Renewals()
    keeper = LeaseKeeper(ledger, SGLangClient("http://127.0.0.1:9"), "w0", lease_s=30)
    now = time.monotonic()
    lives = [_Live(f"a{i}", rid=f"a{i}", next_beat=now + 0.2 + 3 * i) for i in range(3)]
    for live in lives:
        keeper.add(live)
    assert ledger.called.wait(5)
    assert sorted(ledger.calls[0]) == ["a0", "a1", "a2"]
    assert all(live.next_beat >= now + 10 for live in lives)  # all due together next time
    for live in lives:
        keeper.remove(live)


def test_a_renewal_says_which_attempts_report_something_new_and_names_the_process():
    """Started with rid = its id and no tokens, an attempt reports nothing new until its
    tokens, rid or tool wait change; each call names the process as the lease holder."""
    ledger = Renewals()
    keeper = LeaseKeeper(ledger, SGLangClient("http://127.0.0.1:9"), "w0", lease_s=30)
    live = _Live("a0", rid="a0", reported=(0, "a0", False))
    keeper._renew([live])
    live.tokens = 5
    keeper._renew([live])
    keeper._renew([live])
    live.rid = "a0-turn-1"
    keeper._renew([live])
    assert ledger.changed == [[False], [True], [False], [True]]
    assert set(ledger.holders) == {keeper.holder} and keeper.holder.startswith("w0/")
    assert LeaseKeeper(ledger, keeper.client, "w0", lease_s=30).holder != keeper.holder


def test_partial_rollout_resumes_after_an_abort_pause_with_new_versions(r, slow):
    config = make_config(engine={"pause_mode": "abort"})
    ledger, [adm] = setup(r, config, [{"id": "p", "prompt": "x", "member_lengths": [300, 1]}])
    runner = runner_for(ledger, config, slow.url)
    aid = adm.attempt_ids[0]
    t, out = run_in_background(runner, aid)
    time.sleep(0.5)  # ~50 tokens under version 0
    client = SGLangClient(slow.url)
    ledger.set_paused(True)
    client.pause("abort")
    ledger.set_version(1)
    client.resume()
    ledger.set_paused(False)
    t.join(15)
    assert out["v"] == "finished"
    result = decode_result(ledger.result("p", 0), 1 << 20)
    assert len(result.output_ids) == 300
    versions = [v for v, _ in result.version_runs]
    assert versions == [0, 1] and 0 < result.version_runs[0][1] < 300
    # the rest went on as the turn's next piece, under its own rid
    assert [e["rid"] for e in slow.server.model.log if e["rid"].startswith(aid)] == [
        aid, f"{aid}-r1"]


def test_an_abort_that_comes_with_the_last_token_is_not_resumed(r, fast):
    """A pause-abort can end a request after its last token: its answer says abort with
    every token there. Nothing is left to resume (SGLang answers a request for 0 new
    tokens with one logprob and no token, which would misalign the result)."""
    config = make_config(engine={"pause_mode": "abort"})
    ledger, [adm] = setup(r, config, [{"id": "p", "prompt": "x", "member_lengths": [6, 1]}])
    runner = runner_for(ledger, config, fast.url)
    generate, calls = runner.client.generate, []

    def aborted_at_the_end(rid, **kw):
        calls.append(kw["sampling_params"]["max_new_tokens"])
        gen = generate(rid, **kw)
        if len(calls) > 1:  # only the first answer is cut by the pause
            return gen
        return dataclasses.replace(gen, finish_reason={"type": "abort", "message": "paused"})

    runner.client.generate = aborted_at_the_end
    assert runner.run(adm.attempt_ids[0]) == "finished"
    result = decode_result(ledger.result("p", 0), 1 << 20)
    assert calls == [6]  # one request, no second for 0 tokens
    assert (len(result.output_ids), len(result.logprobs)) == (6, 6)
    assert result.finish_reason == "length"


def test_pause_in_place_without_new_weights_keeps_the_request_and_its_version(r, slow):
    config = make_config()  # pause_mode in_place
    ledger, [adm] = setup(r, config, [{"id": "p", "prompt": "x", "member_lengths": [150, 1]}])
    runner = runner_for(ledger, config, slow.url)
    aid = adm.attempt_ids[0]
    t, out = run_in_background(runner, aid)
    time.sleep(0.4)
    client = SGLangClient(slow.url)
    client.pause("in_place")
    ledger.set_version(1)
    time.sleep(0.3)
    client.resume()
    t.join(15)
    assert out["v"] == "finished"
    result = decode_result(ledger.result("p", 0), 1 << 20)
    # the replica loaded no weights: its spans say one version, the one it was sent under
    assert len(result.output_ids) == 150 and result.version_runs == [(0, 150)]


def test_a_request_that_spans_a_weight_update_takes_each_token_s_version_from_the_replica(
        r, replica):
    """The replica's ``weight_versions`` spans say where its weights changed inside one
    request: the tokens before carry the old version, the rest the new one."""
    config = make_config(engine={"pause_mode": "retract"})
    client = SGLangClient(replica.url, timeout=120)
    client.update_weights_from_disk(replica.other_weights, weight_version="0")  # the farm's
    n = replica.long
    ledger, [adm] = setup(r, config, [{"id": "p", "prompt": "x", "member_lengths": [n, 1]}])
    runner = runner_for(ledger, config, replica.url, timeout=120)
    t, out = run_in_background(runner, adm.attempt_ids[0])
    wait_for(lambda: running(client) == 1, 60, "the request to run")
    time.sleep(0.5)  # a few tokens under version 0
    client.pause("retract")
    client.update_weights_from_disk(replica.other_weights, weight_version="41")
    ledger.set_version(41)
    client.resume()
    t.join(120)
    assert out["v"] == "finished"
    result = decode_result(ledger.result("p", 0), 1 << 20)
    (old, before), (new, after) = result.version_runs
    assert (old, new, before + after) == (0, 41, n) and before > 0


def test_a_timeout_starts_no_second_attempt_while_the_replica_still_runs_the_first(r, slow):
    config = make_config(timeouts={"request": 1})
    ledger, [adm] = setup(r, config, [{"id": "p", "prompt": "x", "member_lengths": [5000, 1]}])
    runner = runner_for(ledger, config, slow.url)
    runner.client.confirm_stopped = lambda rid, abort=None: False  # still in flight
    aid = adm.attempt_ids[0]
    assert runner.run(aid) == "doubtful"
    c = ledger.counters()
    assert (c["doubtful"], c["reserved"], c.get("retries:generate_error", 0)) == (1, 2, 0)
    assert r.llen(ledger.keys.outbox) == 2  # the two first attempts only: no retry queued
    assert ledger.attempt(aid).state == "doubtful"


PLUGIN = '''
class TwoTurns:
    """Generate, run a "tool" on the output, generate again."""

    def __init__(self, config):
        self.config = config

    def run(self, ctx):
        first = ctx.generate(text=ctx.prompt["prompt"], max_new_tokens=5, ignore_eos=True)
        tool_output = f" [tool saw {len(first.output_ids)} tokens] "
        ctx.generate(text=ctx.prompt["prompt"] + first.text + tool_output,
                     max_new_tokens=7, ignore_eos=True)
        return 0.5


def factory(config):
    return TwoTurns(config)
'''


def test_a_plugin_workflow_may_call_generate_several_times(r, fast, tmp_path, monkeypatch):
    (tmp_path / "my_tools_plugin.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    config = make_config(workflow={"name": "my_tools_plugin:factory"})
    ledger, [adm] = setup(r, config, [{"id": "p", "prompt": "x"}])
    runner = runner_for(ledger, config, fast.url)
    assert runner.run(adm.attempt_ids[0]) == "finished"
    result = decode_result(ledger.result("p", 0), 1 << 20)
    assert (result.turns, len(result.output_ids), result.reward) == (2, 12, 0.5)
    rids = [e["rid"] for e in fast.server.model.log]
    assert rids == [adm.attempt_ids[0], f"{adm.attempt_ids[0]}-t001"]  # abortable by prefix


def test_an_unknown_workflow_is_a_config_error():
    from queue_rollout.errors import ConfigError

    with pytest.raises(ConfigError, match=r"workflow\.name"):
        load_workflow(make_config(workflow={"name": "nope"}))
    with pytest.raises(ConfigError, match="cannot load"):
        load_workflow(make_config(workflow={"name": "no_such_module_xyz:factory"}))
