"""The training view: each member over the positions of its sequence, from a real
worker's results (multi-turn, tool tokens between turns) and from a staleness window."""

from __future__ import annotations

import json

import msgspec
import pytest

from queue_rollout import RolloutClient
from queue_rollout.collector.loop import Collector
from queue_rollout.config import Config
from queue_rollout.engines.sglang import SGLangClient
from queue_rollout.errors import BadInput
from queue_rollout.lab.sim.server import ThreadedSimEngine
from queue_rollout.ledger.core import Ledger
from queue_rollout.workers.episode import AttemptRunner
from queue_rollout.workers.workflows import load_workflow
from testkit import finish_all

PROMPT = [500, 501, 502, 503]
TURNS = [[{"gen": 3, "tool_tokens": 2}, {"gen": 4, "tool_tokens": 1}, {"gen": 2}],
         [{"gen": 5}]]


def config(redis_url: str, **workflow: str) -> Config:
    return msgspec.convert({"farm": {"name": "tv", "redis_url": redis_url},
                            "rollout": {"group_size": 2, "batch_size": 1,
                                        "max_concurrent_samples": 8},
                            "workflow": workflow}, Config)


def deliver(client: RolloutClient):
    Collector(client.ledger, client.config, name="c").step()
    return client.get_batch(timeout=5)


def test_a_multi_turn_member_is_laid_out_as_the_replica_saw_it(redis_url):
    cfg = config(redis_url, name="controlled_turns")
    client = RolloutClient.from_config(cfg)
    client.submit([{"id": "g", "input_ids": PROMPT, "member_turns": TURNS}])
    Collector(client.ledger, cfg, name="c").step()
    sent: dict[str, list[list[int]]] = {}
    with ThreadedSimEngine(slots=4, step_ms=0.05) as engine:
        replica = SGLangClient(engine.url, timeout=5)
        generate = replica.generate

        def recording(rid, **kw):  # what each call sent, per attempt
            sent.setdefault(rid[:rid.index("-t")] if "-t" in rid else rid, []).append(
                kw["input_ids"])
            return generate(rid, **kw)

        replica.generate = recording  # type: ignore[method-assign]
        runner = AttemptRunner(ledger=Ledger.from_config(client.ledger.client, cfg),
                               config=cfg, client=replica, worker_id="w", boot_id="b",
                               workflow=load_workflow(cfg))
        for raw in client.ledger.client.hkeys(client.ledger.keys.attempts):
            assert runner.run(raw.decode()) == "finished"
    batch = deliver(client)
    view = batch.training_view(current_version=0, max_staleness=0)
    first, second = view.samples
    member = batch.groups[0].members[0]
    # the last call sent everything before its turn: the sequence is that, then its output
    last_call = next(calls[-1] for calls in sent.values() if len(calls) == 3)
    assert first.input_ids == last_call + member.output_ids[-2:]
    assert first.input_ids[:4] == PROMPT and first.prompt_len == 4
    assert first.turn_spans == [(4, 7), (9, 13), (14, 16)]
    produced = {i for a, b in first.turn_spans for i in range(a, b)}
    assert [i for i, x in enumerate(first.loss_mask) if x] == sorted(produced)
    assert [first.logprobs[i] for i in sorted(produced)] == member.logprobs
    assert all(first.versions[i] == (0 if i in produced else -1)
               for i in range(len(first.input_ids)))
    assert not any(first.stale_mask)
    assert second.input_ids == PROMPT + batch.groups[0].members[1].output_ids
    assert member.tool_ids is not None and [len(t) for t in member.tool_ids] == [2, 1]
    # the prompt is stored once, with the group: the members did not repeat it
    assert member.prompt_ids is None


def test_the_stale_mask_removes_only_produced_tokens_older_than_the_window(redis_url):
    client = RolloutClient.from_config(config(redis_url))
    client.submit([{"id": "g", "input_ids": [5, 6], "member_lengths": [3, 3]}])
    Collector(client.ledger, client.config, name="c").step()
    finish_all(client, versions=((0, 1), (2, 2)))
    view = deliver(client).training_view(current_version=3, max_staleness=1)
    s = view.samples[0]
    assert (s.input_ids, s.loss_mask, s.versions) == ([5, 6, 7, 8, 9], [0, 0, 1, 1, 1],
                                                     [-1, -1, 0, 2, 2])
    assert s.stale_mask == [0, 0, 1, 0, 0] and s.logprobs == [0.0, 0.0, -1.0, -1.0, -1.0]
    assert view.masked_share() == pytest.approx(1 / 3)
    assert [len(g) for g in view.groups()] == [2] and s.reward == 0.0


def test_a_text_prompt_has_ids_only_when_the_client_tokenized_it(redis_url):
    client = RolloutClient.from_config(config(redis_url))
    client.submit([{"id": "t", "prompt": "hello", "member_lengths": [3, 3]}])
    Collector(client.ledger, client.config, name="c").step()
    finish_all(client)
    with pytest.raises(BadInput, match="group 't' member 0: its prompt was sent as text"):
        deliver(client).training_view(0, 0)

    tokenizing = RolloutClient.from_config(config(redis_url), consumer="t1",
                                           tokenize=lambda text: [ord(c) for c in text])
    tokenizing.submit([{"id": "u", "prompt": "hi", "member_lengths": [3, 3]}])
    stored = json.loads(tokenizing.ledger.client.hget(tokenizing.ledger.keys.prompts, "u"))
    assert stored["input_ids"] == [104, 105]
