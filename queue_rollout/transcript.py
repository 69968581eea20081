"""A member's context as the model sees it, turn by turn.

An episode's first request carries the prompt; each later request carries the whole
context so far: the prompt, every turn's output and the tool output between turns. One
:class:`Transcript` grows that context for the worker (token ids, or text for a prompt
sent as text) and for the virtual farm (its run-length token sequences), and keeps the
turn boundaries a trainer needs: each turn's output length and the tool tokens after
it. :func:`layout` lays a finished member out over the positions of its full sequence.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, Protocol, Self, TypeVar


class _Concat(Protocol):
    def __add__(self, other: Self, /) -> Self: ...
    def __getitem__(self, index: slice, /) -> Self: ...
    def __len__(self) -> int: ...


S = TypeVar("S", bound=_Concat)


@dataclass
class Transcript(Generic[S]):
    """The context of one member: ``context`` is what its next request carries."""

    context: S
    prompt_len: int = 0
    turn_lengths: list[int] = field(default_factory=list)  # output tokens of each turn
    sent: list[int] = field(default_factory=list)  # the context length each turn was sent
    tools: list[S] = field(default_factory=list)  # the tool output after each turn

    def __post_init__(self) -> None:
        self.prompt_len = len(self.context)

    def output(self, produced: S) -> None:
        """A turn's output joins the context."""
        self.sent.append(len(self.context))
        self.context = self.context + produced
        self.turn_lengths.append(len(produced))
        self.tools.append(produced[:0])

    def tool(self, returned: S) -> None:
        """A tool's output after the last turn joins the context (the next turn sees it)."""
        if not self.turn_lengths:
            raise ValueError("tool output before any turn")
        self.context = self.context + returned
        self.tools[-1] = self.tools[-1] + returned


@dataclass(frozen=True)
class Layout:
    """A member over the positions of its full sequence (prompt, then each turn's
    output and the tool tokens after it; nothing after the last turn)."""

    input_ids: list[int]
    produced: list[bool]  # the policy produced the token (not prompt, not tool)
    turn_spans: list[tuple[int, int]]  # [start, end) of each turn's output


def layout(prompt_ids: list[int], output_ids: list[int], turn_lengths: list[int],
           tool_ids: list[list[int]]) -> Layout:
    """Interleave a member's output (*turn_lengths* split it into turns) with the tool
    tokens after each turn but the last; ValueError when the pieces do not fit."""
    if sum(turn_lengths) != len(output_ids):
        raise ValueError(f"turn lengths {turn_lengths} do not cover {len(output_ids)} tokens")
    if len(tool_ids) < max(0, len(turn_lengths) - 1):
        raise ValueError(f"{len(turn_lengths)} turns but tool output after {len(tool_ids)}")
    ids, produced, spans = list(prompt_ids), [False] * len(prompt_ids), []
    at = 0
    for t, n in enumerate(turn_lengths):
        spans.append((len(ids), len(ids) + n))
        ids += output_ids[at:at + n]
        produced += [True] * n
        at += n
        if t + 1 < len(turn_lengths):
            ids += tool_ids[t]
            produced += [False] * len(tool_ids[t])
    return Layout(ids, produced, spans)
