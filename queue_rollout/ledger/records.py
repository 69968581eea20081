"""The ledger's records as Python sees them (decoded from the JSON the scripts write)."""

from __future__ import annotations

from typing import Literal

import msgspec

GroupState = Literal["in_flight", "complete", "accepted", "delivered", "consumed", "rejected"]
AttemptState = Literal["queued", "running", "doubtful", "finished", "failed", "stopped", "lost"]

#: Attempt states of an attempt that was superseded by a retry.
SUPERSEDED = frozenset({"stopped", "lost"})
#: Attempt states in which the episode has ended.
ENDED = frozenset({"finished", "failed"})


class GroupRecord(msgspec.Struct, frozen=True):
    """A prompt group. Attributes have their names; the wire keys the scripts write stay
    compact where a field is named differently (``msgspec.field(name=...)``)."""

    id: str
    G: int
    mode: Literal["group", "sample"]
    state: GroupState
    done: int
    failed: int
    version: int
    admitted_at: float
    aids: str
    completed_at: float | None = None
    judged_at: float | None = None
    delivered_at: float | None = None
    consumed_at: float | None = None
    reason: str | None = None
    #: released: the policy version of its first delivery
    delivered_version: int | None = msgspec.field(default=None, name="dv")
    released: int | None = None  # how many times its batch was released (``release``)
    released_at: float | None = None
    #: on the control Redis of a farm of several cells: the cell that runs it (its
    #: attempts are that cell's, none here)
    cell: str | None = None

    @property
    def attempt_ids(self) -> list[str]:
        """Every attempt id the group ever had, in creation order."""
        return self.aids.split(",") if self.aids else []

    @property
    def slots_held(self) -> int:
        """Episode slots this group holds: group mode all G until it completes, sample
        mode one per member that has not ended."""
        if self.state != "in_flight":
            return 0
        return self.G if self.mode == "group" else self.G - self.done


class AttemptRecord(msgspec.Struct, frozen=True):
    """One attempt at a member's episode (wire keys in ``name=``)."""

    group_id: str = msgspec.field(name="g")
    member: int = msgspec.field(name="m")
    #: 1 for a member's first attempt, one more for each retry
    number: int = msgspec.field(name="n")
    stops: int
    state: AttemptState
    created_at: float
    worker: str | None = None
    replica: str | None = None
    boot: str | None = None
    started_at: float | None = None
    #: its own lease's expiry (set when it started or last reported something new)
    lease: float | None = None
    #: the worker process whose lease its own follows while it reports nothing new
    holder: str | None = msgspec.field(default=None, name="h")
    seq: int | None = None
    tokens: int | None = None
    doubt_at: float | None = None
    cause: str | None = None
    resolution: str | None = None
    ended_at: float | None = None
    #: the policy version it started under
    version: int | None = msgspec.field(default=None, name="v")
    call: str | None = None  # the id of the start or finish call that last changed it
    completed: bool | None = None  # its result completed the group
    rid: str | None = None  # its request in flight, when not the attempt id
    tool: bool | None = None  # waiting on a tool (running: counted in tool_wait)
    #: a farm placing groups: its load is counted on a replica
    load_counted: bool | None = msgspec.field(default=None, name="pl")
    #: queued: the worker whose queue its job waits on
    placed_on: str | None = msgspec.field(default=None, name="p")


class BatchRecord(msgspec.Struct, frozen=True):
    id: str
    consumer: str
    groups: list[str]
    version: int  # the policy version it was delivered under (its groups' first delivery)
    delivered_at: float
    redelivered: bool = False  # it holds groups released from another consumer's batch


def decode_group(raw: bytes) -> GroupRecord:
    return msgspec.json.decode(raw, type=GroupRecord)


def decode_attempt(raw: bytes) -> AttemptRecord:
    return msgspec.json.decode(raw, type=AttemptRecord)


def decode_batch(raw: bytes) -> BatchRecord:
    return msgspec.json.decode(raw, type=BatchRecord)
