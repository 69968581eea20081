"""Option value types: each accepts what it names and refuses the rest with a reason."""

from __future__ import annotations

import argparse

import pytest

from queue_rollout.argtypes import (
    choices,
    fraction,
    int_list,
    non_negative,
    non_negative_float,
    positive,
    positive_float,
)


@pytest.mark.parametrize("parse,good,want", [
    (positive, "3", 3), (non_negative, "0", 0), (positive_float, "0.5", 0.5),
    (non_negative_float, "0", 0.0), (fraction, "1", 1.0), (int_list, "0,2,8", [0, 2, 8]),
    (choices("mode(s)", ("group", "sample")), "sample,group", ["sample", "group"]),
])
def test_a_good_value_is_parsed(parse, good, want):
    assert parse(good) == want


@pytest.mark.parametrize("parse,bad,reason", [
    (positive, "0", "must be a positive integer"),
    (non_negative, "-1", "must be 0 or more"),
    (positive_float, "inf", "must be a positive number"),
    (non_negative_float, "nan", "must be a number >= 0"),
    (fraction, "1.5", "must be in (0, 1]"),
    (int_list, "1,x", "is not a comma-separated list of integers"),
    (int_list, "1,-2", "every value must be >= 0"),
    (choices("mode(s)", ("group", "sample")), "group,all",
     "unknown mode(s) all; choose from group, sample"),
])
def test_a_bad_value_is_refused_with_its_reason(parse, bad, reason):
    with pytest.raises(argparse.ArgumentTypeError, match=reason.replace("(", r"\(")
                       .replace(")", r"\)").replace("[", r"\[").replace("]", r"\]")):
        parse(bad)
