"""The trainer's side: ``from queue_rollout import RolloutClient``.

    client = RolloutClient.from_config("farm.toml", consumer="trainer-0")
    client.submit(prompts)
    batch = client.get_batch(timeout=600)   # exactly B whole groups
    ...train on batch.groups...
    client.ack(batch)
    client.set_version(client.version() + 1)

A trainer that restarts with the same consumer id gets its unacknowledged batch again.
A batch whose consumer never comes back can be released (``queue-rollout release
--consumer ID``, or ``timeouts.batch_ack``): any consumer's next ``get_batch`` gets it,
``redelivered``, and the old consumer's late ``ack`` of it raises BatchReleased.
Results are deleted from Redis once their batch is acknowledged.

A client remembers the groups it trained on (the last :data:`REMEMBERED_GROUPS`). A
farm that does not wait for replicas (``farm.redis_wait_replicas = 0``) can lose its
last ledger changes in a Redis failover, among them a delivery or an acknowledgement;
the groups involved are then delivered again, and the client drops the ones it trained
on (a batch of nothing but those is acknowledged without reaching the trainer). A
trainer that restarted in between has forgotten them and trains on them twice.

On a farm of several cells (each a Redis of its own with its workers), the client's
ledger is the control Redis's and *cells* name the cells' ledgers: a prompt goes to the
cell its id hashes to, a group's results are read from its cell, an acknowledgement is
taken on the control Redis and then in the cells, and the trainer's controls (pause,
weights, version) reach every cell. The control Redis is the first to stop (pause) and
the last to go on (resume, a new version), so nothing is admitted under a flag or a
version the cells do not have yet.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from queue_rollout.client.prompts import check_prompt, farm_needs, known_ids_refusal
from queue_rollout.client.training import TrainingBatch, training_view
from queue_rollout.config import Config, load_config
from queue_rollout.errors import (
    BadInput,
    BarrierTimeout,
    BatchReleased,
    InvariantViolation,
    RedisUnavailable,
)
from queue_rollout.ledger import cells as farm_cells
from queue_rollout.ledger.clock import check_clock
from queue_rollout.ledger.connection import (
    mask_url,
    resolve_url,
)
from queue_rollout.ledger.core import Answer, Delivery, Ledger
from queue_rollout.ledger.registry import Ack, AckKind, Registry
from queue_rollout.ledger.status import cells_status, farm_status
from queue_rollout.results import decode_result

log = logging.getLogger(__name__)
T = TypeVar("T")
MAX_POLL_S = 0.5  # get_batch polls the ledger at most this far apart
#: How many group ids a client remembers having trained on.
REMEMBERED_GROUPS = 100_000


@dataclass(frozen=True)
class Member:
    member: int
    output_ids: list[int]
    logprobs: list[float]
    versions: list[int]  # the policy version of each output token
    reward: float | None
    finish_reason: str
    error: str = ""
    turn_lengths: list[int] = field(default_factory=list)  # output tokens of each turn
    #: the tool tokens between consecutive turns (None: not a sequence of token ids)
    tool_ids: list[list[int]] | None = None
    #: the ids its first call sent, where not the group's prompt ``input_ids``
    prompt_ids: list[int] | None = None


@dataclass(frozen=True)
class Group:
    id: str
    prompt: dict[str, Any]
    members: list[Member]
    #: the policy version the group was admitted under (its staleness counts from it)
    version: int = 0


@dataclass(frozen=True)
class Batch:
    id: str
    version: int  # the policy version when the batch was (first) delivered
    groups: list[Group]
    #: delivered before: to this consumer (it restarted) or, released, to another
    redelivered: bool = False

    def stale_token_mask(self, current_version: int, max_staleness: int) -> list[list[list[bool]]]:
        """Per group, member and token: False where ``current_version - token_version >
        max_staleness`` (the token is masked out of the loss), else True."""
        return [[[current_version - v <= max_staleness for v in m.versions] for m in g.members]
                for g in self.groups]

    def training_view(self, current_version: int, max_staleness: int) -> TrainingBatch:
        """Each member over the positions of its whole sequence, in the token space the
        model saw (see :mod:`queue_rollout.client.training`)."""
        return training_view(self, current_version, max_staleness)


def stand_in_training(seconds: float) -> Callable[[Batch], None]:
    """A training step that only takes *seconds* (the demo's and the benchmarks' fixed
    training interval), for :meth:`RolloutClient.train_step`."""
    def train(batch: Batch) -> None:
        time.sleep(seconds)

    return train


class RolloutClient:
    def __init__(self, ledger: Ledger, config: Config, consumer: str = "trainer-0", *,
                 tokenize: Callable[[str], list[int]] | None = None,
                 cells: dict[str, Ledger] | None = None,
                 weights: dict[str, float] | None = None) -> None:
        self.ledger = ledger
        self.config = config
        self.consumer = consumer
        #: text -> the token ids the replicas' engine makes of it (for SGLang: the model
        #: tokenizer's ``encode``); given, a text prompt is submitted as its ids
        self.tokenize = tokenize
        #: a farm of several cells: each cell's ledger by name (``ledger`` the control
        #: Redis's), and the weights new prompts are spread by (equal when not given)
        self.cells = cells or {}
        self.weights = weights or dict.fromkeys(self.cells, 1.0)
        self.registry = Registry(ledger.client, ledger.keys, config.timeouts.lease)
        #: where workers register and answer the trainer's controls
        self.registries = ([Registry(c.client, c.keys, config.timeouts.lease)
                            for c in self.cells.values()] or [self.registry])
        self._received: dict[str, list[str]] = {}  # batch id -> group ids, not yet acked
        self._trained: OrderedDict[str, None] = OrderedDict()  # groups passed to ack()
        self._clock_checked_at = -math.inf
        self._check_clock()  # a trainer whose clock is off takes no batch (ClockSkewed)

    @classmethod
    def from_config(cls, path_or_config: str | Path | Config | None = None,
                    consumer: str = "trainer-0", *,
                    tokenize: Callable[[str], list[int]] | None = None) -> RolloutClient:
        config = (path_or_config if isinstance(path_or_config, Config)
                  else load_config(path_or_config))
        ledger, cells = farm_cells.connect_farm(config)
        return cls(ledger, config, consumer, tokenize=tokenize, cells=cells,
                   weights=config.cell_weights())

    def submit(self, prompts: Iterable[dict[str, Any]]) -> int:
        """Validate and enqueue prompts, all or none; returns how many. A prompt must
        also carry what the farm's workflow needs (``member_lengths`` for
        ``controlled_length``, ``answer`` for ``math``, a plugin's ``prompt_fields``):
        BadInput names the first one that does not, by index and id. With a
        ``tokenize`` function, a prompt's ``prompt`` text is replaced by the ``input_ids``
        it makes (the replicas are sent those, and a trainer gets them back)."""
        if isinstance(prompts, dict | str | bytes):  # iterable, but one prompt (or text)
            raise BadInput(f"submit takes a list of prompts (each a dict), not one "
                           f"{type(prompts).__name__}: for one prompt, submit([prompt])")
        checked = []
        seen: dict[str, str] = {}  # id -> where it was given
        needs = farm_needs(self.config)
        for i, prompt in enumerate(prompts):
            where = f"prompt #{i}"
            if (self.tokenize is not None and "input_ids" not in prompt
                    and isinstance(prompt_text := prompt.get("prompt"), str)):
                prompt = {k: v for k, v in prompt.items() if k != "prompt"}
                prompt["input_ids"] = list(self.tokenize(prompt_text))
            pid, raw = check_prompt(prompt, max_bytes=self.config.limits.max_prompt_bytes,
                                    where=where, needs=needs)
            if pid in seen:
                raise BadInput(f"{where}: duplicate id {pid!r} (first as {seen[pid]})")
            seen[pid] = where
            checked.append((pid, raw))
        answer = (self.ledger.submit(checked)  # one script: checks every id, then writes
                  if not self.cells else farm_cells.submit(self.cells, self.weights, checked))
        if answer.status == "duplicate":
            raise BadInput(known_ids_refusal(answer.duplicates, seen))
        return answer.count

    def get_batch(self, timeout: float | None = None,
                  max_poll_s: float = MAX_POLL_S) -> Batch:
        """Wait for exactly B complete, accepted groups (or this consumer's unacknowledged
        batch); raises BarrierTimeout after *timeout* seconds. The ledger is polled at
        intervals growing from 20 ms to *max_poll_s*; while Redis is unreachable it is
        polled on (a restarted Redis is found again), until the timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = min(0.02, max_poll_s)
        while True:
            delivery = self._pop_batch()
            if delivery is not None:
                gids = list(delivery.batch.groups)
                fresh = [gid for gid in gids if gid not in self._trained]
                if fresh:
                    break
                log.warning("batch %s holds only groups this trainer trained on (a ledger "
                            "change lost in a Redis failover): acknowledged untrained",
                            delivery.batch.id)
                self._ack(delivery.batch.id, gids)
                continue
            if deadline is not None and time.monotonic() >= deadline:
                raise BarrierTimeout(f"no batch of {self.config.rollout.batch_size} groups "
                                     f"within {timeout:g}s")
            time.sleep(delay)
            delay = min(delay * 1.5, max_poll_s)
        if len(fresh) < len(gids):
            log.warning("batch %s: %d of its groups were trained on already (a ledger change "
                        "lost in a Redis failover): delivered without them",
                        delivery.batch.id, len(gids) - len(fresh))
        self._received[delivery.batch.id] = gids
        return Batch(delivery.batch.id, delivery.batch.version,
                     [self._group(gid, home) for gid, home in zip(fresh, self._homes(fresh),
                                                                   strict=True)],
                     delivery.redelivered)

    def get_groups(self, group_ids: Sequence[str], timeout: float | None = None,
                   max_poll_s: float = MAX_POLL_S) -> Batch:
        """Wait for the batch of exactly the groups *group_ids*, returned in that order:
        for a trainer that asks for completions of the prompts it just submitted (a
        synchronous loop, such as TRL's). The farm delivers whole batches of
        ``rollout.batch_size`` groups, so *group_ids* are that many ids this trainer
        submitted, and nobody else submits to the farm meanwhile: a batch holding another
        group raises BadInput naming it (the batch stays delivered to this consumer,
        unacknowledged). A batch redelivered to this consumer that holds none of them (a
        step of an earlier run that never finished) is acknowledged untrained, with a
        warning. Raises BarrierTimeout after *timeout* seconds."""
        wanted = list(group_ids)
        b = self.config.rollout.batch_size
        if len(wanted) != b or len(set(wanted)) != b:
            raise BadInput(f"get_groups takes rollout.batch_size = {b} distinct group ids "
                           f"(a batch's worth), not {len(wanted)}"
                           + (" with repeats" if len(set(wanted)) != len(wanted) else ""))
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            batch = self.get_batch(left, max_poll_s)
            got = {g.id: g for g in batch.groups}
            if set(got) == set(wanted):
                return Batch(batch.id, batch.version, [got[gid] for gid in wanted],
                             batch.redelivered)
            if batch.redelivered and not set(got) & set(wanted):
                log.warning("batch %s (groups %s) was delivered to consumer %s before and "
                            "never acknowledged, a step that did not finish: acknowledged "
                            "untrained", batch.id, ", ".join(sorted(got)), self.consumer)
                self.ack(batch)
                continue
            others = sorted(set(got) - set(wanted))
            missing = sorted(set(wanted) - set(got))
            raise BadInput(f"batch {batch.id} holds groups not asked for ({', '.join(others)}) "
                           f"in place of {', '.join(missing)}: another trainer submits to "
                           f"this farm, or consumer {self.consumer!r} is shared; it stays "
                           "delivered to this consumer, unacknowledged")

    def _check_clock(self) -> None:
        """At most every lease / 3: ClockSkewed (naming both clocks) when the ledger's
        clock is further from Redis's than ``timeouts.clock_skew``."""
        if time.monotonic() - self._clock_checked_at < self.config.timeouts.lease / 3:
            return
        check_clock(self.ledger.client, self.ledger.clock,
                    self.config.timeouts.skew_tolerance, f"trainer {self.consumer}")
        self._clock_checked_at = time.monotonic()

    def _pop_batch(self) -> Delivery | None:
        try:
            self._check_clock()
            return self.ledger.pop_batch(self.consumer)
        except RedisUnavailable as exc:
            log.warning("get_batch: %s; retrying", exc)
            return None

    def _homes(self, group_ids: list[str]) -> list[Ledger]:
        """The ledger that holds each group's results: on a farm of cells the cell its
        farm record names (the records read in one call), else the farm's."""
        if not self.cells:
            return [self.ledger] * len(group_ids)
        return [self.cells.get(r.cell, self.ledger) if r is not None and r.cell else self.ledger
                for r in self.ledger.groups(group_ids)]

    def _group(self, group_id: str, home: Ledger) -> Group:
        record, prompt, raws = home.group_with_results(group_id)
        if record is None:  # a delivered group is kept until its batch is acknowledged
            raise InvariantViolation(f"group {group_id} was delivered but has no record")
        cap = self.config.limits.max_result_bytes
        members = []
        for m, raw in enumerate(raws):
            if raw is None:  # failed after max_attempts: no output
                members.append(Member(m, [], [], [], None, "failed", "no result"))
                continue
            try:
                r = decode_result(raw, cap)
            except BadInput as exc:  # accepted under max_failed_members: a failed member
                members.append(Member(m, [], [], [], None, "failed", str(exc)))
                continue
            members.append(Member(m, r.output_ids, r.logprobs, r.versions(), r.reward,
                                  r.finish_reason, r.error, r.turn_lengths, r.tool_ids,
                                  r.prompt_ids))
        return Group(group_id, json.loads(prompt) if prompt else {}, members, record.version)

    def ack(self, batch: Batch) -> None:
        """The batch was trained on: its groups are consumed and their results deleted.
        A batch this client received whose delivery the ledger lost (a Redis failover)
        is refused by the ledger: logged, and its groups remembered so that they are
        dropped when they are delivered again. A batch released from this consumer
        (``release``) raises :class:`~queue_rollout.errors.BatchReleased`: the ledger
        does not count it, another consumer gets its groups (this client, should it
        get them back, drops them as trained)."""
        gids = self._received.pop(batch.id, None)
        answer = self._ack(batch.id, gids if gids is not None else [g.id for g in batch.groups])
        for gid in gids if gids is not None else [g.id for g in batch.groups]:
            self._trained[gid] = None
        while len(self._trained) > REMEMBERED_GROUPS:
            self._trained.popitem(last=False)
        if answer.refused:
            raise BatchReleased(f"ack of batch {batch.id} refused: it was released from "
                                f"consumer {self.consumer} and is delivered to another "
                                "consumer; this training step is not counted")
        if answer.ignored and gids is None:
            raise BadInput(f"ack of batch {batch.id} refused: {answer.reason}")
        if answer.ignored:
            log.warning("ack of batch %s refused (%s): the ledger lost its delivery; its "
                        "groups will be dropped if delivered again", batch.id, answer.reason)

    def _ack(self, batch_id: str, group_ids: list[str]) -> Answer:
        if not self.cells:
            return self.ledger.ack(self.consumer, batch_id)
        return farm_cells.ack(self.ledger, self.cells, self.consumer, batch_id, group_ids)

    # -- trainer controls ------------------------------------------------------------

    def _await_acks(self, what: str, kind: AckKind, epochs: list[int]) -> dict[str, Ack]:
        """Wait until every live worker has answered request *epochs* (one a registry)
        of *kind*; returns the answers. BarrierTimeout names the workers that did not
        answer in time."""
        deadline = time.monotonic() + self.config.timeouts.pause_barrier
        delay = 0.005  # workers answer within milliseconds of the announcement
        while True:
            answers: dict[str, Ack | None] = {}
            missing = []
            for registry, epoch in zip(self.registries, epochs, strict=True):
                got = registry.acks(kind, sorted(registry.live()))
                answers.update(got)
                missing += [w for w, a in got.items() if a is None or a.epoch < epoch]
            if not missing:
                return {w: a for w, a in answers.items() if a is not None}
            if time.monotonic() >= deadline:
                within = self.config.timeouts.pause_barrier
                raise BarrierTimeout(f"{what}: no answer within {within}s "
                                     f"from {len(missing)} worker(s): {', '.join(missing)}")
            time.sleep(delay)
            delay = min(delay * 2, 0.05)

    def pause(self) -> None:
        """Stop admission and return once every live worker has paused its replica in
        ``engine.pause_mode``; BarrierTimeout names the workers that did not answer."""
        mode = self.config.engine.pause_mode
        epoch = self.ledger.pause(mode)  # the control Redis first: no more admitted
        epochs = [c.pause(mode) for c in self.cells.values()] or [epoch]
        self._await_acks("pause", "pause", epochs)

    def resume(self) -> None:
        """Clear the pause flag: admission resumes, workers resume their replicas."""
        for cell in self.cells.values():  # the cells first, the control Redis last
            cell.set_paused(False)
        self.ledger.set_paused(False)

    def update_weights(self, model_path: str, version: int) -> None:
        """Pause, have every live worker load *model_path* into its replica, set the
        policy version, resume. Raises naming the workers that failed or did not answer
        (the farm then stays paused)."""
        self.pause()
        self.load_weights(model_path, version)
        self.set_version(version)
        self.resume()

    def load_weights(self, model_path: str, version: int) -> None:
        """Have every live worker load *model_path* into its replica, named *version*,
        and return once all did; the step of :meth:`update_weights` for a trainer that
        pauses, sets the version and resumes itself (AReaL's order). Call it paused.
        Raises naming the workers that failed or did not answer."""
        epochs = [r.request_weights(model_path, version) for r in self.registries]
        answers = self._await_acks("weight update", "weights", epochs)
        failed = [f"{w} ({a.error})" for w, a in answers.items() if not a.ok]
        if failed:
            raise BarrierTimeout(f"weight update to {model_path} failed on: {'; '.join(failed)}")

    def train_step(self, batch: Batch, train: Callable[[Batch], T], *, pause: bool = True,
                   weights: Callable[[int], str | None] | None = None) -> T:
        """One step of the trainer's loop: the pause barrier (every live worker has
        paused its replica), *train* on the batch, acknowledge it, raise the policy
        version by one, resume. *weights*, given the new version after training, may
        return a checkpoint path: every replica then loads it (:meth:`update_weights`)
        before generation resumes. ``pause=False`` trains while generation goes on
        (a drain, or a trainer on other GPUs). Returns what *train* returned."""
        if pause:
            self.pause()
        result = train(batch)
        self.ack(batch)
        version = self.version() + 1
        path = weights(version) if weights is not None else None
        if path is not None:
            self.update_weights(path, version)  # loads, sets the version, resumes
        else:
            self.set_version(version)
            if pause:
                self.resume()
        return result

    def version(self) -> int:
        return self.ledger.version()

    def set_version(self, version: int) -> None:
        farm_cells.set_version(self.ledger, self.cells, version)

    def status(self) -> dict[str, Any]:
        if self.cells:
            return cells_status(self.ledger.client,
                                {name: c.client for name, c in self.cells.items()}, self.config)
        return farm_status(self.ledger.client, self.config,
                           redis_url=mask_url(resolve_url(self.config)))
