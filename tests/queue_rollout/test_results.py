"""Episode results: decoded with a size cap into a checked shape, or refused as BadInput."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from queue_rollout.errors import BadInput
from queue_rollout.results import EpisodeResult, add_tokens, decode_result, encode_result
from testkit import examples

FUZZ = settings(max_examples=examples(200), derandomize=True)
CAP = 4096
SMALL = encode_result(EpisodeResult(member=0, output_ids=[], logprobs=[], version_runs=[],
                                    finish_reason=""))


def check_shape(r: EpisodeResult) -> None:
    """What the trainer relies on in every result decode_result hands out."""
    assert r.member >= 0 and r.turns >= 0
    assert all(v >= 0 and n > 0 for v, n in r.version_runs)
    assert len(r.versions()) == len(r.output_ids)


def decode_or_refuse(raw: bytes, cap: int = CAP) -> EpisodeResult | None:
    try:
        result = decode_result(raw, cap)
    except BadInput as exc:
        assert str(exc).startswith(("malformed episode result: ", "result of "))
        return None
    assert len(raw) <= cap
    check_shape(result)
    return result


@st.composite
def results(draw: st.DrawFn) -> EpisodeResult:
    runs: list[tuple[int, int]] = []
    for version, count in draw(st.lists(st.tuples(st.integers(0, 2**40), st.integers(1, 5)),
                                        max_size=4)):
        add_tokens(runs, version, count)
    n = sum(count for _, count in runs)
    return EpisodeResult(
        member=draw(st.integers(0, 64)),
        output_ids=draw(st.lists(st.integers(-(2**63), 2**64 - 1), min_size=n, max_size=n)),
        logprobs=draw(st.lists(st.floats(), max_size=n + 1)),
        version_runs=runs, finish_reason=draw(st.text(max_size=8)),
        reward=draw(st.none() | st.floats()), text=draw(st.text(max_size=20)),
        turns=draw(st.integers(0, 4)), error=draw(st.text(max_size=8)))


@FUZZ
@given(results(), st.integers(0, 300))
def test_result_fuzz_valid_results_round_trip_under_the_cap(result, cap):
    raw = encode_result(result)
    if len(raw) > cap:
        with pytest.raises(BadInput, match=rf"^result of {len(raw)} bytes exceeds "
                                           rf"limits.max_result_bytes = {cap}$"):
            decode_result(raw, cap)
        return
    assert encode_result(decode_result(raw, cap)) == raw  # byte-exact (NaN rewards too)


mutations = st.lists(st.tuples(st.sampled_from(["flip", "insert", "delete", "cut"]),
                               st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=3)


def mutate(raw: bytes, steps: list[tuple[str, int, int]]) -> bytes:
    b = bytearray(raw)
    for kind, at, byte in steps:
        at = at % (len(b) + 1)
        if kind == "insert":
            b[at:at] = bytes([byte])
        elif b and kind == "flip":
            b[at % len(b)] ^= byte or 1
        elif kind == "delete":
            del b[at:at + 1]
        else:
            del b[at:]
    return bytes(b)


@FUZZ
@given(results(), mutations)
def test_result_fuzz_mutated_results_decode_checked_or_are_refused(result, steps):
    decode_or_refuse(mutate(encode_result(result), steps))


@FUZZ
@given(st.binary(max_size=150), st.integers(0, 100))
@example(SMALL, len(SMALL) - 1)  # a good result one byte over the cap
def test_result_fuzz_arbitrary_bytes(raw, cap):
    if decode_or_refuse(raw, cap) is None and len(raw) > cap:
        with pytest.raises(BadInput, match=r"^result of .* exceeds limits\.max_result_bytes"):
            decode_result(raw, cap)


shapes = st.fixed_dictionaries(
    {"member": st.integers(-2, 3), "output_ids": st.lists(st.integers(0, 9), max_size=4),
     "logprobs": st.lists(st.floats(), max_size=2),
     "version_runs": st.lists(st.tuples(st.integers(-2, 3), st.integers(-3, 4)) | st.lists(
         st.integers(-1, 3), max_size=3), max_size=4),
     "finish_reason": st.text(max_size=3) | st.integers(-1, 1)},
    optional={"reward": st.floats() | st.text(max_size=2), "turns": st.integers(-1, 3),
              "text": st.text(max_size=3), "error": st.text(max_size=3),
              "extra": st.integers(-(2**63), 2**64 - 1)})


@FUZZ
@given(shapes)
@example({"member": 0, "output_ids": [], "logprobs": [], "version_runs": [[0, 2], [1, -2]],
          "finish_reason": "stop"})
@example({"member": 0, "output_ids": [5], "logprobs": [], "version_runs": [[-1, 1]],
          "finish_reason": "stop"})
def test_result_fuzz_wrong_shapes_are_refused(shape):
    """MessagePack of anything near the shape: a result the trainer can use, or BadInput."""
    decode_or_refuse(msgspec.msgpack.encode(shape))


def test_runs_that_do_not_cover_the_tokens_are_refused():
    raw = encode_result(EpisodeResult(member=0, output_ids=[1, 2], logprobs=[],
                                      version_runs=[(0, 3)], finish_reason="stop"))
    with pytest.raises(BadInput, match="version runs do not cover the tokens"):
        decode_result(raw, CAP)
