"""The member's context, grown turn by turn, and laid out for training."""

from __future__ import annotations

import pytest

from queue_rollout.lab.sim.tokens import Tokens
from queue_rollout.transcript import Transcript, layout


def test_a_transcript_grows_by_outputs_and_tool_output_and_keeps_the_boundaries():
    t = Transcript([1, 2, 3])
    t.output([10, 11])
    t.tool([90])
    t.tool([91])  # two tool results after one turn join one another
    t.output([12])
    t.tool([92])  # after the last turn: in the context, never sent
    assert t.context == [1, 2, 3, 10, 11, 90, 91, 12, 92]
    assert (t.prompt_len, t.turn_lengths, t.tools, t.sent) == (3, [2, 1], [[90, 91], [92]],
                                                               [3, 7])


def test_text_and_run_length_tokens_grow_the_same_way():
    t = Transcript("Q:")
    t.output(" a")
    t.tool(" ok.")
    t.output(" b")
    assert (t.context, t.tools, t.sent) == ("Q: a ok. b", [" ok.", ""], [2, 8])
    r = Transcript(Tokens.of(range(5)))
    r.output(Tokens.of(range(100, 103)))
    r.tool(Tokens.of([7]))
    assert list(r.context) == [0, 1, 2, 3, 4, 100, 101, 102, 7] and r.sent == [5]


def test_tool_output_before_a_turn_is_refused():
    with pytest.raises(ValueError, match="before any turn"):
        Transcript([1]).tool([2])


def test_layout_interleaves_turns_and_tool_tokens():
    laid = layout([1, 2], [10, 11, 12], [2, 1], [[90, 91]])
    assert laid.input_ids == [1, 2, 10, 11, 90, 91, 12]
    assert laid.produced == [False, False, True, True, False, False, True]
    assert laid.turn_spans == [(2, 4), (6, 7)]


@pytest.mark.parametrize(("turns", "tools", "match"), [
    ([2, 2], [[9]], "do not cover"),
    ([1, 1, 1], [[9]], "tool output after 1"),
])
def test_layout_refuses_pieces_that_do_not_fit(turns, tools, match):
    with pytest.raises(ValueError, match=match):
        layout([1], [10, 11, 12], turns, tools)
