"""The radix prefix cache: longest-prefix matches to the token (an edge split where a
match ends inside it), LRU eviction of whole leaves no running request holds."""

from __future__ import annotations

import random

from queue_rollout.lab.sim.prefix_cache import Node, PrefixCache


def test_a_cached_context_is_matched_to_the_token_where_another_differs() -> None:
    cache = PrefixCache()
    cache.insert(list(range(100)))
    assert cache.tokens == 100 and cache.nodes == 1
    assert cache.match(list(range(100))).tokens == 100
    assert cache.match(list(range(100)), limit=99).tokens == 99  # split at 99
    assert cache.match([*range(37), -1, *range(38, 60)]).tokens == 37
    assert cache.match([*range(64), -5]).tokens == 64
    assert cache.match([-1, *range(1, 50)]).tokens == 0
    assert cache.tokens == 100 and cache.nodes == 4  # splits at 37, 64 and 99
    assert cache.match(list(range(100))).node.depth == 100


def test_eviction_takes_the_least_recently_used_leaves_and_never_a_held_path() -> None:
    cache = PrefixCache()
    old = cache.insert([1] * 32)
    held = cache.insert([2] * 32)
    cache.insert([3] * 32)
    cache.lock(held)
    cache.match([1] * 32)  # used again: now the most recent but the held one
    assert cache.evictable == 64
    assert cache.evict(1) == 32  # the least recent leaf, whole: the [3] context
    assert cache.match([3] * 32).tokens == 0
    assert cache.evict(1000) == 32  # all that is not held
    assert cache.tokens == cache.locked == 32
    assert cache.match([2] * 32).tokens == 32 and cache.match([1] * 9).tokens == 0
    cache.unlock(held)
    assert cache.evictable == 32 and old.parent is None  # evicted: detached


def test_a_shared_prefix_is_stored_once_and_a_parent_goes_after_its_children() -> None:
    cache = PrefixCache()
    prompt = list(range(64))
    cache.insert([*prompt, *range(1000, 1016)])
    cache.insert([*prompt, *range(2000, 2016)])
    assert cache.tokens == 64 + 32 and cache.nodes == 3
    assert cache.evict(32) == 32  # both outputs, not the prompt under them
    assert cache.match(prompt).tokens == 64
    cache.flush()
    assert cache.tokens == 0 and cache.match(prompt).tokens == 0


def test_a_held_node_stays_the_end_of_its_prefix_when_a_later_match_splits_its_edge() -> None:
    cache = PrefixCache()
    leaf = cache.insert(list(range(50)))
    cache.lock(leaf)
    split = cache.match([*range(20), -1])  # cuts the held edge after 20 tokens
    assert split.tokens == 20 and split.node.depth == 20 and leaf.depth == 50
    assert leaf.parent is split.node and split.node.locks == 1
    assert cache.locked == 50 and cache.evict(1000) == 0  # all of it still held
    longer = cache.insert([*range(50), *range(900, 930)], leaf)  # from the held node
    assert longer.parent is leaf and cache.tokens == 80
    cache.unlock(leaf)
    assert cache.locked == 0 and cache.evict(1000) == 80 and cache.nodes == 0


def test_an_insert_from_a_held_node_is_the_same_as_one_from_the_root() -> None:
    rng = random.Random(7)
    reference, cache = PrefixCache(), PrefixCache()
    for _ in range(300):  # contexts sharing prefixes of random lengths, grown in turns
        base = [rng.randrange(4) for _ in range(rng.randrange(1, 40))]
        match = cache.match(base, limit=len(base) - 1)
        cache.lock(match.node)
        grown = [*base, *(rng.randrange(4) for _ in range(rng.randrange(0, 30)))]
        node = cache.insert(grown, match.node)
        cache.unlock(match.node)
        reference.insert(grown)
        assert node.depth == len(grown)
        assert cache.tokens == reference.tokens
        assert cache.match(grown).tokens == len(grown)
    assert cache.locked == 0
    assert sorted(_contexts(cache.root)) == sorted(_contexts(reference.root))


def _contexts(node: Node, prefix: tuple[int, ...] = ()) -> list[tuple[int, ...]]:
    """Every root-to-leaf context the tree holds."""
    path = prefix + node.key
    if not node.children:
        return [path]
    return [c for child in node.children.values() for c in _contexts(child, path)]
