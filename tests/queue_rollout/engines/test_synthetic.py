"""What the farm shares with a simulated replica: seeded ids and request hints."""

from __future__ import annotations

import subprocess
import sys

import pytest

from queue_rollout.engines.synthetic import (
    VOCAB,
    hint_problem,
    prompt_params,
    stable_hash,
    token_ids,
    token_logprobs,
)


def test_token_ids_are_a_seeds_own_sequence_and_any_window_of_it_agrees():
    ids = token_ids(7, 0, 50)
    assert ids == token_ids(7, 0, 50) and ids != token_ids(8, 0, 50)
    assert token_ids(7, 20, 10) == ids[20:30]
    assert all(100 <= t < 100 + VOCAB for t in ids)
    assert len(token_logprobs(7, 12)) == 12 and all(lp <= 0 for lp in token_logprobs(7, 12))


def test_the_hash_is_the_same_in_another_process():
    code = ("from queue_rollout.engines.synthetic import stable_hash\n"
            "print(stable_hash('tok', 3))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60)
    assert int(out.stdout) == stable_hash("tok", 3)


def test_a_prompt_with_an_answer_asks_the_simulated_replica_to_be_right_that_often():
    assert prompt_params({"id": "a", "prompt": "x"}) == {}
    assert prompt_params({"answer": 4, "p_correct": 1}) == {
        "custom_params": {"sim_answer": "4", "sim_p_correct": 1.0}}
    assert prompt_params({"answer": "4"})["custom_params"]["sim_p_correct"] == 0.5


@pytest.mark.parametrize("prompt,problem", [
    ({}, None), ({"p_correct": 0}, None), ({"p_correct": 0.25}, None), ({"p_correct": 1}, None),
    ({"p_correct": 1.5}, "`p_correct` must be a number in [0, 1]"),
    ({"p_correct": -0.1}, "`p_correct` must be a number in [0, 1]"),
    ({"p_correct": True}, "`p_correct` must be a number in [0, 1]"),
    ({"p_correct": "0.5"}, "`p_correct` must be a number in [0, 1]"),
    ({"p_correct": None}, "`p_correct` must be a number in [0, 1]"),
])
def test_a_hint_out_of_range_is_named(prompt, problem):
    assert hint_problem(prompt) == problem
