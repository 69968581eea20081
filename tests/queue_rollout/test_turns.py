"""An episode's steps and a resumed request, as the worker and the virtual farm both
take them."""

from __future__ import annotations

import pytest

from queue_rollout.turns import ModelCall, Request, ToolCall, Turn, member_turns, steps


def test_each_turn_generates_then_its_tool_runs_after_the_last_turn_too():
    turns = [Turn(100, 2.0, 50), Turn(200, 0.0, 30), Turn(50), Turn(10, 4.0)]
    assert list(steps(turns)) == [
        ModelCall(0, 100), ToolCall(0, 2.0, 50), ModelCall(1, 200), ToolCall(1, 0.0, 30),
        ModelCall(2, 50), ModelCall(3, 10), ToolCall(3, 4.0, 0)]


def test_a_member_turns_entry_as_a_list_or_an_object():
    listed = [{"gen": 5, "tool_s": 1, "tool_tokens": 3}, {"gen": 7}]
    assert member_turns(listed) == [Turn(5, 1.0, 3), Turn(7, 0.0, 0)]
    assert member_turns({"turns": listed, "harness_error": True}) == member_turns(listed)
    assert isinstance(member_turns(listed)[0].tool_s, float)
    with pytest.raises(KeyError):
        member_turns([{"tool_s": 1}])


@pytest.mark.parametrize("context, first, second", [
    ([1, 2, 3], [10, 11], [12]),
    ("the prompt", " two", " more"),
])
def test_a_request_aborted_twice_goes_on_from_everything_so_far(context, first, second):
    request = Request("aid-t002", context, 10)
    assert request.rid == "aid-t002"
    once = request.resumed(first, 2)
    assert (once.rid, once.context, once.max_new_tokens) == ("aid-t002-r1", context + first, 8)
    twice = once.resumed(second, 1)
    assert (twice.rid, twice.context, twice.max_new_tokens) == (
        "aid-t002-r2", context + first + second, 7)
    assert twice.base == "aid-t002" and twice.rid.startswith("aid")
