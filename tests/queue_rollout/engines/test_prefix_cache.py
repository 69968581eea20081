"""The radix prefix cache: longest-prefix matches to the token, LRU eviction of leaves
no running request holds."""

from __future__ import annotations

from queue_rollout.engines.prefix_cache import PAGE, PrefixCache


def test_a_cached_context_is_matched_to_the_token_where_another_differs() -> None:
    cache = PrefixCache()
    cache.insert(list(range(100)))
    assert cache.tokens == 100
    assert cache.match(list(range(100))).tokens == 100
    assert cache.match(list(range(100)), limit=99).tokens == 99
    assert cache.match([*range(37), -1, *range(38, 60)]).tokens == 37  # inside a page
    assert cache.match([*range(64), -5]).tokens == 64
    assert cache.match([-1, *range(1, 50)]).tokens == 0


def test_eviction_takes_the_least_recently_used_leaves_and_never_a_held_path() -> None:
    cache = PrefixCache()
    old = cache.insert([1] * PAGE * 2)
    held = cache.insert([2] * PAGE * 2)
    cache.insert([3] * PAGE * 2)
    cache.lock(held)
    cache.match([1] * PAGE * 2)  # used again: now the most recent but the held one
    assert cache.evictable == PAGE * 4
    assert cache.evict(PAGE) == PAGE  # the least recent leaf: the [3] context's
    assert cache.match([3] * PAGE * 2).tokens == PAGE
    assert cache.evict(10 * PAGE) == 3 * PAGE  # all that is not held
    assert cache.tokens == cache.locked == 2 * PAGE
    assert cache.match([2] * PAGE * 2).tokens == 2 * PAGE and cache.match([1] * 9).tokens == 0
    cache.unlock(held)
    assert cache.evictable == 2 * PAGE and old.parent is None  # evicted: detached


def test_a_shared_prefix_is_stored_once_and_a_parent_goes_after_its_children() -> None:
    cache = PrefixCache()
    prompt = list(range(PAGE * 4))
    cache.insert([*prompt, *range(1000, 1000 + PAGE)])
    cache.insert([*prompt, *range(2000, 2000 + PAGE)])
    assert cache.tokens == PAGE * 6
    assert cache.evict(PAGE * 2) == PAGE * 2  # both outputs, not the prompt under them
    assert cache.match(prompt).tokens == PAGE * 4
    cache.flush()
    assert cache.tokens == 0 and cache.match(prompt).tokens == 0


def test_an_insert_from_a_held_node_is_the_same_as_one_from_the_root() -> None:
    prompt = list(range(PAGE * 3 + 5))
    reference, cache = PrefixCache(), PrefixCache()
    for c in (reference, cache):
        c.insert([*prompt, *range(900, 920)])
    # a match that ends inside a page: its node's own page is not the new context's
    context = [*prompt[:PAGE * 2 + 3], *range(5000, 5100)]
    match = cache.match(context)
    assert match.tokens == PAGE * 2 + 3 and match.node.depth == PAGE * 3
    leaf = cache.insert(context, match.node)
    reference.insert(context)
    assert cache.tokens == reference.tokens
    assert cache.match(context).tokens == len(context) and leaf.depth == len(context)
    full = cache.match(prompt, limit=PAGE * 2)  # ends on a page boundary: a full node
    longer = [*prompt[:PAGE * 2], *range(7000, 7040)]
    assert cache.insert(longer, full.node).depth == len(longer)
    reference.insert(longer)
    assert cache.tokens == reference.tokens
