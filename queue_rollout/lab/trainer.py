"""The stand-in trainer of the lab's runs on the real stack (``queue-rollout demo``,
the bench's pilots): it takes each batch as it is ready; after each of the first
*train_batches* it pauses the farm (the barrier), "trains" for *train_s*, acknowledges
the batch, raises the policy version and resumes
(:meth:`~queue_rollout.client.rollout.RolloutClient.train_step`); the batches after
those are drained: acknowledged and the version raised, with no pause and no training.
(The virtual farm keeps the same schedule in virtual time, in its own event loop.)

Given a weights folder, it keeps AReaL's trainer order instead: generation goes on
while it trains; then it pauses the farm, has every replica load the folder, raises the
version and resumes (the pause spans the weight update only)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from queue_rollout.client.rollout import MAX_POLL_S, Batch, RolloutClient, stand_in_training


@dataclass
class TakenBatch:
    """A batch the trainer took: its index (from 0), the batch, when it was ready and,
    where it was trained on, when the farm was paused for it and resumed after it
    (seconds since *t0*)."""

    index: int
    batch: Batch
    ready: float
    resumed: float | None = None
    paused: float | None = None

    @property
    def pause(self) -> tuple[float, float] | None:
        """The window generation stood still for this batch, if it did."""
        if self.paused is None or self.resumed is None:
            return None
        return self.paused, self.resumed


def _nothing(taken: TakenBatch) -> None:
    pass


def run_trainer(client: RolloutClient, t0: float, *, batches: int, train_batches: int,
                train_s: float, timeout: float, max_poll_s: float = MAX_POLL_S,
                weights: str | None = None,
                on_ready: Callable[[TakenBatch], None] = _nothing,
                on_done: Callable[[TakenBatch], None] = _nothing) -> None:
    """Take *batches* batches from *client*, training on the first *train_batches*
    for *train_s* each and draining the rest; with *weights*, in AReaL's order (a
    weight update from that folder after each training). *on_ready* sees each batch as it is taken,
    before training; *on_done* after it was acknowledged (and the farm resumed).
    *timeout* and *max_poll_s*: :meth:`~queue_rollout.client.rollout.RolloutClient.get_batch`'s,
    for each batch."""
    for k in range(batches):
        batch = client.get_batch(timeout=timeout, max_poll_s=max_poll_s)
        taken = TakenBatch(k, batch, time.monotonic() - t0)
        on_ready(taken)
        training = k < train_batches  # then the drain: no pause, no training
        if weights is not None and training:
            stand_in_training(train_s)(batch)  # generation goes on meanwhile
            client.ack(batch)
            taken.paused = time.monotonic() - t0
            client.pause()
            version = client.version() + 1
            client.load_weights(weights, version)
            client.set_version(version)
            client.resume()
        else:
            if training:
                taken.paused = time.monotonic() - t0
            client.train_step(batch, stand_in_training(train_s if training else 0.0),
                              pause=training)
        if training:
            taken.resumed = time.monotonic() - t0
        on_done(taken)
