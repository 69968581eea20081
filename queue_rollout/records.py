"""The ledger's records as Python sees them (decoded from the JSON the scripts write)."""

from __future__ import annotations

from typing import Literal

import msgspec

GroupState = Literal["in_flight", "complete", "accepted", "delivered", "consumed", "rejected"]
EpisodeState = Literal["active", "finished", "failed"]
AttemptState = Literal["queued", "running", "doubtful", "finished", "failed", "stopped", "lost"]

#: Attempt states that hold a live claim on a replica.
LIVE_ATTEMPT_STATES = ("running", "doubtful")


class GroupRecord(msgspec.Struct, frozen=True):
    id: str
    G: int
    mode: Literal["group", "sample"]
    state: GroupState
    done: int
    failed: int
    version: int
    admitted_at: float
    completed_at: float | None = None
    judged_at: float | None = None
    delivered_at: float | None = None
    consumed_at: float | None = None
    reason: str | None = None


class EpisodeRecord(msgspec.Struct, frozen=True):
    g: str
    m: int
    aid: str
    held: int
    state: EpisodeState
    n: int
    stops: int
    aids: str

    @property
    def attempt_ids(self) -> list[str]:
        return self.aids.split(",")


class AttemptRecord(msgspec.Struct, frozen=True):
    g: str
    m: int
    n: int
    state: AttemptState
    created_at: float
    worker: str | None = None
    replica: str | None = None
    boot: str | None = None
    started_at: float | None = None
    lease: float | None = None
    seq: int | None = None
    tokens: int | None = None
    doubt_at: float | None = None
    cause: str | None = None
    ended_at: float | None = None


class BatchRecord(msgspec.Struct, frozen=True):
    id: str
    consumer: str
    groups: list[str]
    version: int
    delivered_at: float


def decode_group(raw: bytes) -> GroupRecord:
    return msgspec.json.decode(raw, type=GroupRecord)


def decode_episode(raw: bytes) -> EpisodeRecord:
    return msgspec.json.decode(raw, type=EpisodeRecord)


def decode_attempt(raw: bytes) -> AttemptRecord:
    return msgspec.json.decode(raw, type=AttemptRecord)


def decode_batch(raw: bytes) -> BatchRecord:
    return msgspec.json.decode(raw, type=BatchRecord)
