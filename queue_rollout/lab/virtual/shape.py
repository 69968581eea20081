"""A farm's shape (replicas, slots, group and batch sizes, the trainer's pauses, the
engine model's settings) and the scale a run takes it at: what the ideal schedule, the
bench's pilots and the planner all run on."""

from __future__ import annotations

from dataclasses import dataclass

from queue_rollout.client.rollout import MAX_POLL_S
from queue_rollout.config import CollectorConfig


@dataclass(frozen=True)
class Shape:
    """The reference pilot: B16 x G8, 128 slots over 8 replicas, 128 groups."""

    prompts: int = 128
    group_size: int = 8
    batch_size: int = 16
    replicas: int = 8
    slots_per_replica: int = 16
    max_staleness: int = 2
    train_s: float = 10.0  # the fixed training pause after each of the first batches
    train_batches: int = 6
    #: rolling consumption: stop once this many batches are ready (None: every group)
    stop_after: int | None = None
    step_ms: float = 4.5
    step_ms_per_request: float = 0.2
    #: added per token of context the running requests hold (us); 0: the reference
    #: shape's calibration left it out
    step_us_per_context_token: float = 0.0
    prefill_tokens_per_s: float = 20_000.0
    chunked_prefill_size: int = 8192
    max_total_tokens: int = 220_000
    #: adaptive concurrency: the lowest limit a worker may set (its ceiling: the slots)
    min_slots_per_replica: int = 1

    @property
    def slots(self) -> int:
        return self.replicas * self.slots_per_replica


@dataclass(frozen=True)
class Scale:
    """Measured = reference x ``time`` for times; x ``tokens`` for lengths. The decode
    step is scaled by time / tokens so that an episode's duration scales by ``time``."""

    time: float = 0.1
    tokens: float = 0.125

    def length(self, reference_tokens: int) -> int:
        return max(1, round(reference_tokens * self.tokens))

    @property
    def step_factor(self) -> float:
        return self.time / self.tokens

    @property
    def collector_step_ms(self) -> float:
        """The collector's step (``collector.step_ms``, shipped 200 ms), scaled by time."""
        return CollectorConfig().step_ms * self.time

    @property
    def trainer_poll_s(self) -> float:
        """How far apart the trainer polls for a batch at most (shipped 0.5 s), scaled."""
        return MAX_POLL_S * self.time

    def as_json(self) -> dict[str, float]:
        return {"time": self.time, "tokens": self.tokens,
                "collector_step_ms": self.collector_step_ms,
                "trainer_poll_s": self.trainer_poll_s}
