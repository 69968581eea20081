"""A radix prefix cache of token contexts, as SGLang's ``RadixCache`` keeps them.

A finished or aborted request's context (prompt + output) stays in the cache until
evicted; a new request reuses the longest cached prefix of its context. Eviction is
LRU over leaves that no running request holds (SGLang's default
``--radix-eviction-policy lru``: a node's ``lock_ref`` keeps it; a parent becomes
evictable once its last child is gone).

Granularity: the tree is kept in pages of :data:`PAGE` tokens (SGLang's default
``page_size`` is 1). A full page is found by one dict lookup; where full pages stop
matching, the children of the last matched node are compared token by token, so a
match ends at the exact token where the contexts differ, as in SGLang. The one
simplification: a page that only partly matches is not split, so two contexts that
diverge inside a page each keep their own copy of its common tokens (at most
``PAGE - 1`` tokens counted twice).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

#: Tokens per node of the tree.
PAGE = 16


@dataclass(eq=False)
class Node:
    key: tuple[int, ...]
    parent: Node | None
    children: dict[tuple[int, ...], Node] = field(default_factory=dict)
    locks: int = 0  # running requests that hold this node (and so its ancestors)


@dataclass(frozen=True)
class Match:
    """The longest cached prefix of a context: *tokens* long, ending in *node* (whose
    page is used up to *tokens*; the root for no match)."""

    tokens: int
    node: Node


class PrefixCache:
    """The cache of one replica. Sizes are in tokens."""

    def __init__(self) -> None:
        self.root = Node((), None)
        self.tokens = 0  # tokens held by the tree
        self.locked = 0  # of those, tokens held by a running request
        # LRU of all nodes but the root, least recent first; an ancestor is always more
        # recent than its descendants (a path is touched leaf first), so the least
        # recent unlocked node is a leaf
        self._lru: OrderedDict[Node, None] = OrderedDict()

    @property
    def evictable(self) -> int:
        return self.tokens - self.locked

    # -- matching and inserting ----------------------------------------------------------

    def match(self, context: Sequence[int], limit: int | None = None) -> Match:
        """The longest cached prefix of *context*, at most *limit* tokens; the path is
        marked as used."""
        limit = len(context) if limit is None else min(limit, len(context))
        node, matched = self.root, 0
        while matched + PAGE <= limit:
            child = node.children.get(tuple(context[matched:matched + PAGE]))
            if child is None:
                break
            node, matched = child, matched + PAGE
        best, best_node = 0, node
        rest = context[matched:min(matched + PAGE, limit)]
        for key, child in node.children.items():
            common = _common(key, rest)
            if common > best:
                best, best_node = common, child
        self._touch(best_node)
        return Match(matched + best, best_node)

    def insert(self, context: Sequence[int]) -> Node:
        """Cache *context* (its pages not cached yet are added); the node of its last
        page, marked as used."""
        node = self.root
        for start in range(0, len(context), PAGE):
            key = tuple(context[start:start + PAGE])
            child = node.children.get(key)
            if child is None:
                child = Node(key, node)
                node.children[key] = child
                self.tokens += len(key)
                self._lru[child] = None
            node = child
        self._touch(node)
        return node

    # -- holding and evicting ------------------------------------------------------------

    def lock(self, node: Node) -> None:
        """A running request holds *node*'s path: none of it can be evicted."""
        n: Node | None = node
        while n is not None and n is not self.root:
            if n.locks == 0:
                self.locked += len(n.key)
            n.locks += 1
            n = n.parent

    def unlock(self, node: Node) -> None:
        n: Node | None = node
        while n is not None and n is not self.root:
            n.locks -= 1
            if n.locks == 0:
                self.locked -= len(n.key)
            n = n.parent

    def evict(self, tokens: int) -> int:
        """Free at least *tokens* (or all that can be freed), least recently used leaves
        first (a parent left without children takes its own place in that order); the
        tokens freed."""
        freed = 0
        for node in list(self._lru):
            if freed >= tokens:
                break
            if node.locks or node.children:
                continue
            parent = node.parent
            assert parent is not None
            del parent.children[node.key]
            del self._lru[node]
            self.tokens -= len(node.key)
            freed += len(node.key)
        return freed

    def flush(self) -> None:
        """Empty the cache (a weight update); held paths are kept."""
        if self.locked:
            self.evict(self.tokens)
            return
        self.root = Node((), None)
        self.tokens = 0
        self._lru.clear()

    def _touch(self, node: Node) -> None:
        n: Node | None = node
        while n is not None and n is not self.root:
            self._lru.move_to_end(n)
            n = n.parent


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
