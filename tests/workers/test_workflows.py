"""The built-in ``controlled_turns`` workflow takes its member's steps in order, as the
virtual farm schedules them: each turn's call sends the whole context so far, each
tool's output joins it, and a tool after the last turn still holds the slot."""

from __future__ import annotations

from typing import Any

from queue_rollout.engines.base import Generation
from queue_rollout.turns import ModelCall, member_turns, steps
from queue_rollout.workers.workflows import ControlledTurns, EpisodeContext, tool_output

PROMPT = [7, 8, 9]
TURNS = [{"gen": 3, "tool_s": 0.5, "tool_tokens": 2}, {"gen": 2, "tool_tokens": 1},
         {"gen": 4, "tool_s": 1.5}]


def test_controlled_turns_takes_the_steps_of_its_member_in_order():
    taken: list[object] = []
    sent: list[list[int]] = []

    def generate_call(turn: int, ids: list[int] | None, text: str | None,
                      params: dict[str, Any]) -> tuple[Generation, list[tuple[int, int]]]:
        assert ids is not None and text is None and params["ignore_eos"] is True
        n = params["max_new_tokens"]
        taken.append(ModelCall(turn, n))
        sent.append(ids)
        out = list(range(100 * (turn + 1), 100 * (turn + 1) + n))
        return Generation(rid=f"r{turn}", text="", output_ids=out, logprobs=[0.0] * n,
                          finish_reason={"type": "length"}, completion_tokens=n,
                          prompt_tokens=len(ids), weight_version=None, meta_info={}), [(0, n)]

    def tool_wait(seconds: float) -> None:
        taken.append(("wait", seconds))

    ctx = EpisodeContext(prompt={"id": "g", "input_ids": PROMPT, "member_turns": [TURNS]},
                         member=0, seed=11, sampling={}, generate_call=generate_call,
                         tool_wait=tool_wait)
    ControlledTurns().run(ctx)

    expected: list[object] = []  # each call, and each tool's wait, in the steps' order
    for step in steps(member_turns(TURNS)):
        if isinstance(step, ModelCall):
            expected.append(step)
        elif step.seconds > 0:
            expected.append(("wait", step.seconds))
    assert taken == expected and len(expected) == 5
    # the context grew by each turn's output and each tool's tokens
    tool0, tool1 = tool_output(11, 1, 2), tool_output(11, 2, 1)
    assert sent == [PROMPT, [*PROMPT, 100, 101, 102, *tool0],
                    [*PROMPT, 100, 101, 102, *tool0, 200, 201, *tool1]]
    assert ctx.tool_seconds == [0.5, 1.5] and ctx.turn_lengths == [3, 2, 4]
    assert ctx.tool_ids() == [tool0, tool1]
