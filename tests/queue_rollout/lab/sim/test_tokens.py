"""Tokens: a sequence of token ids kept as runs behaves as the list it stands for."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from queue_rollout.lab.sim.prefix_cache import PrefixCache
from queue_rollout.lab.sim.tokens import Tokens, common_prefix

#: a sequence as pieces: runs of step 1 or 3, and loose ids (repeats included)
pieces = st.lists(st.one_of(
    st.tuples(st.integers(0, 40), st.integers(1, 6)).map(lambda t: list(range(t[0], t[0] + t[1]))),
    st.tuples(st.integers(0, 40), st.integers(1, 4)).map(
        lambda t: list(range(t[0], t[0] + 3 * t[1], 3))),
    st.lists(st.integers(0, 40), min_size=1, max_size=4)), max_size=6)


def build(parts: list[list[int]]) -> tuple[list[int], Tokens]:
    flat: list[int] = []
    tokens = Tokens()
    for part in parts:
        flat += part
        tokens = tokens + (range(part[0], part[-1] + 1) if part == list(
            range(part[0], part[-1] + 1)) else part)
    return flat, tokens


@given(pieces, pieces, st.integers(0, 30), st.integers(0, 40))
def test_tokens_behave_as_their_list(a: list[list[int]], b: list[list[int]], cut: int,
                                     stop: int) -> None:
    fa, ta = build(a)
    fb, tb = build(b)
    fb, tb = fa[:cut] + fb, ta[:cut] + tb  # often a shared prefix
    assert list(ta) == fa and len(ta) == len(fa)
    assert list(tb) == fb
    expected = next((i for i, (x, y) in enumerate(zip(fa, fb, strict=False)) if x != y),
                    min(len(fa), len(fb)))
    assert common_prefix(ta, tb) == expected
    assert (ta == tb) == (fa == fb)
    assert list(ta[cut:stop]) == fa[cut:stop]
    for i in range(-len(fa), len(fa)):
        assert ta[i] == fa[i]


def test_a_context_of_a_million_tokens_is_a_few_runs() -> None:
    prompt, output = range(10**9, 10**9 + 4096), range(5 * 10**9, 5 * 10**9 + 10**6)
    context = Tokens.of(prompt) + output
    assert len(context) == 4096 + 10**6 and len(context.runs) == 2
    again = context[:4096 + 500_000] + output[500_000:]  # a resumed request's context
    assert again == context and len(again.runs) == 2


def test_the_prefix_cache_matches_compact_contexts_as_lists() -> None:
    compact, plain = PrefixCache(), PrefixCache()
    prompt = range(1000, 1600)
    first = Tokens.of(prompt) + range(9000, 9400)
    for cache, context in ((compact, first), (plain, list(first))):
        cache.insert(context)
    second = Tokens.of(prompt) + range(7000, 7100)
    assert compact.match(second).tokens == plain.match(list(second)).tokens == 600
    assert compact.match(first[:800]).tokens == plain.match(list(first[:800])).tokens == 800
    assert compact.tokens == plain.tokens == 1000
