"""An episode of fixed turns, step by step, whoever drives it; and how a generation a
pause aborted goes on.

An episode of fixed turns (a member of the ``controlled_turns`` workflow, every
episode of the virtual farm) is a list of :class:`Turn`: each generates exactly
``gen`` tokens from the whole context so far; then its tool's ``tool_tokens`` of output
join the context the next turn sends, and the tool holds the episode's slot ``tool_s``
seconds while nothing generates. :func:`steps` writes that sequence once, as
:class:`ModelCall` and :class:`ToolCall` steps. The worker's workflow takes each step
through its episode context, blocking until it is done; the virtual farm takes the same
steps as events in virtual time.

With ``engine.pause_mode = "abort"`` a pause aborts each running generation; after the
pause it goes on as a new request (:meth:`Request.resumed`): rid ``<turn rid>-rN``, the
context it carried and the tokens it produced, with what is left of its budget. Every
output token keeps the policy version that produced it (partial rollout).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, NamedTuple, Protocol, Self, TypeVar


class Turn(NamedTuple):
    """One turn: the tokens it generates, then the tool seconds and tool output tokens
    after it (0: no tool)."""

    gen: int
    tool_s: float = 0.0
    tool_tokens: int = 0

    @classmethod
    def of(cls, turn: Mapping[str, Any]) -> Turn:
        """A turn as a prompt writes it: ``{"gen", "tool_s", "tool_tokens"}`` (the last
        two optional; the entry is checked where the prompt is submitted)."""
        return cls(int(turn["gen"]), float(turn.get("tool_s", 0.0)),
                   int(turn.get("tool_tokens", 0)))


def member_turns(entry: Any) -> list[Turn]:
    """One ``member_turns`` entry's turns: a list of turns, or ``{"turns": [...], ...}``."""
    turns = entry["turns"] if isinstance(entry, Mapping) else entry
    return [Turn.of(t) for t in turns]


@dataclass(frozen=True)
class ModelCall:
    """Turn *turn* generates exactly *tokens* tokens from the context so far."""

    turn: int
    tokens: int


@dataclass(frozen=True)
class ToolCall:
    """A tool runs after turn *turn*: its *tokens* of output join the context, and the
    episode holds its slot *seconds* while nothing generates."""

    turn: int
    seconds: float
    tokens: int


Step = ModelCall | ToolCall


def steps(turns: Sequence[Turn]) -> Iterator[Step]:
    """The episode's steps in order: each turn's generation, then its tool (if any:
    after the last turn too, holding the slot before the episode ends)."""
    for t, turn in enumerate(turns):
        yield ModelCall(t, turn.gen)
        if turn.tool_s > 0 or turn.tool_tokens > 0:
            yield ToolCall(t, turn.tool_s, turn.tool_tokens)


class _Context(Protocol):
    def __add__(self, other: Self, /) -> Self: ...


C = TypeVar("C", bound=_Context)


@dataclass(frozen=True)
class Request(Generic[C]):
    """One request of a turn: the turn's rid (*base*), the *context* it carries (token
    ids, text, or the virtual farm's token runs) and its ``max_new_tokens``; *piece*
    counts the pause-aborts it goes on from."""

    base: str
    context: C
    max_new_tokens: int
    piece: int = 0

    @property
    def rid(self) -> str:
        """The turn's rid for its first request, then ``<turn rid>-rN``: every piece
        keeps the attempt id as its prefix (an abort by the attempt id reaches it)."""
        return self.base if self.piece == 0 else f"{self.base}-r{self.piece}"

    def resumed(self, produced: C, tokens: int) -> Request[C]:
        """The request that goes on after this one was aborted having produced
        *produced* (*tokens* tokens): this context and that output, the rest of the
        budget."""
        return Request(self.base, self.context + produced, self.max_new_tokens - tokens,
                       self.piece + 1)
