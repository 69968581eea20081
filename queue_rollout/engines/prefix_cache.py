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

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field

#: Tokens per node of the tree.
PAGE = 16


@dataclass(eq=False)
class Node:
    key: tuple[int, ...]
    parent: Node | None
    depth: int = 0  # tokens from the root to the end of this node
    children: dict[tuple[int, ...], Node] = field(default_factory=dict)
    locks: int = 0  # running requests that hold this node (and so its ancestors)
    used: int = 0  # when a match or an insert last ended on it (the cache's counter)


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
        # eviction candidates, least recently used first: (used, seq, node) pushed when
        # a match or an insert ends on a leaf, or a node's last child goes (with its
        # own time: its descendants, in use while it was, have just gone as the least
        # recent); entries whose node has since been used, grown or evicted are stale
        self._heap: list[tuple[int, int, Node]] = []
        self._clock = 0
        self._seq = 0

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

    def insert(self, context: Sequence[int], known: Node | None = None) -> Node:
        """Cache *context* (its pages not cached yet are added); the node of its last
        page, marked as used. *known*: a cached node on *context*'s path (one its
        caller holds), so the pages before it are not looked up again."""
        node = self.root
        if known is not None and known is not self.root:
            # its ancestors are on the path; itself only if its page is the context's
            # (a match can end inside a page), and only full pages have children
            own = tuple(context[known.depth - len(known.key):known.depth])
            node = known if len(known.key) == PAGE and known.key == own else (
                known.parent or self.root)
        for start in range(node.depth, len(context), PAGE):
            key = tuple(context[start:start + PAGE])
            child = node.children.get(key)
            if child is None:
                child = Node(key, node, node.depth + len(key))
                node.children[key] = child
                self.tokens += len(key)
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
        held: list[tuple[int, int, Node]] = []
        while freed < tokens and self._heap:
            entry = heapq.heappop(self._heap)
            used, _, node = entry
            parent = node.parent
            if (parent is None or parent.children.get(node.key) is not node
                    or node.children or used != node.used):
                continue  # stale: evicted, grown, or used since
            if node.locks:
                held.append(entry)  # a candidate again once unlocked
                continue
            del parent.children[node.key]
            node.parent = None
            self.tokens -= len(node.key)
            freed += len(node.key)
            if not parent.children and parent is not self.root:
                self._push(parent)
        for entry in held:
            heapq.heappush(self._heap, entry)
        return freed

    def flush(self) -> None:
        """Empty the cache (a weight update); held paths are kept."""
        if self.locked:
            self.evict(self.tokens)
            return
        self.root = Node((), None)
        self.tokens = 0
        self._heap.clear()

    def _touch(self, node: Node) -> None:
        if node is self.root:
            return
        self._clock += 1
        node.used = self._clock
        if not node.children:
            self._push(node)
        if len(self._heap) > 4 * self.tokens // PAGE + 1024:  # drop stale entries
            self._heap = [e for e in self._heap
                          if e[2].parent is not None and not e[2].children
                          and e[0] == e[2].used]
            heapq.heapify(self._heap)

    def _push(self, node: Node) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (node.used, self._seq, node))


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
