"""The stand-in trainer's schedule: the first batches paused and trained on, the rest
drained; what it reports of each batch, and when."""

from __future__ import annotations

import time
from typing import Any

from queue_rollout.lab.trainer import TakenBatch, run_trainer


class FakeClient:
    """Hands out numbered batches; records each train step (its pause and how long
    training took) and every callback between, in order."""

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []
        self.handed = 0

    def get_batch(self, timeout: float | None = None, max_poll_s: float = 0.5) -> Any:
        self.events.append(("get", timeout, max_poll_s))
        self.handed += 1
        return f"batch-{self.handed}"

    def train_step(self, batch: Any, train: Any, *, pause: bool = True) -> None:
        started = time.monotonic()
        train(batch)
        self.events.append(("train", batch, pause, time.monotonic() - started))


def test_the_first_batches_are_trained_on_with_a_pause_and_the_rest_drained():
    client, taken = FakeClient(), []

    def ready(t: TakenBatch) -> None:
        client.events.append(("ready", t.index, t.resumed))

    def done(t: TakenBatch) -> None:
        client.events.append(("done", t.index))
        taken.append(t)

    run_trainer(client, time.monotonic(), batches=4, train_batches=2, train_s=0.05,
                timeout=7.0, max_poll_s=0.2, on_ready=ready, on_done=done)
    kinds = [e[0] for e in client.events]
    assert kinds == ["get", "ready", "train", "done"] * 4
    assert all(e[1:] == (7.0, 0.2) for e in client.events if e[0] == "get")
    assert all(e[2] is None for e in client.events if e[0] == "ready")  # before training
    trains = [e for e in client.events if e[0] == "train"]
    assert [(e[1], e[2]) for e in trains] == [("batch-1", True), ("batch-2", True),
                                              ("batch-3", False), ("batch-4", False)]
    assert all(e[3] >= 0.05 for e in trains[:2]) and all(e[3] < 0.05 for e in trains[2:])
    assert [t.index for t in taken] == [0, 1, 2, 3]
    assert [t.batch for t in taken] == ["batch-1", "batch-2", "batch-3", "batch-4"]
    first, second, drained = taken[0], taken[1], taken[2:]
    assert first.resumed is not None and first.resumed - first.ready >= 0.05
    assert second.resumed is not None and second.ready >= first.resumed
    assert all(t.resumed is None for t in drained)
