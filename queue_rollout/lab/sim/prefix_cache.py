"""A radix prefix cache of token contexts, as SGLang's ``RadixCache`` keeps them.

A finished or aborted request's context (prompt + output) stays in the cache until
evicted; a new request reuses the longest cached prefix of its context. Eviction is
LRU over leaves that no running request holds (SGLang's default
``--radix-eviction-policy lru``: a node's ``lock_ref`` keeps it; a parent becomes
evictable once its last child is gone), a whole leaf at a time.

The tree is SGLang's with ``page_size`` 1: an edge carries any number of tokens, a
node's children are keyed by their first token, and a match that ends inside an edge
splits it there (``_split_node``), so every match ends on a node. A split keeps the
deeper half in the original node object, so a node a request holds stays the end of
that request's prefix whatever later matches do to the tree.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field

from queue_rollout.lab.sim.tokens import Tokens, common_prefix, shared_prefix


@dataclass(eq=False)
class Node:
    key: Sequence[int]  # the edge's tokens, from the parent to this node (tuple or Tokens)
    parent: Node | None
    depth: int = 0  # tokens from the root to the end of this node
    children: dict[int, Node] = field(default_factory=dict)  # by their first token
    locks: int = 0  # running requests that hold this node (and so its ancestors)
    used: int = 0  # when a match or an insert last passed it (the cache's counter)


@dataclass(frozen=True)
class Match:
    """The longest cached prefix of a context: *tokens* long, ending at *node* (whose
    depth is *tokens*; the root for no match)."""

    tokens: int
    node: Node


class PrefixCache:
    """The cache of one replica. Sizes are in tokens."""

    def __init__(self) -> None:
        self.root = Node((), None)
        self.tokens = 0  # tokens held by the tree
        self.locked = 0  # of those, tokens held by a running request
        self.nodes = 0  # nodes in the tree, less the root
        # eviction candidates, least recently used first: (used, seq, node) pushed when
        # a match or an insert ends on a leaf, or a node's last child goes; entries
        # whose node has since been used, grown or evicted are stale
        self._heap: list[tuple[int, int, Node]] = []
        self._clock = 0
        self._seq = 0

    @property
    def evictable(self) -> int:
        return self.tokens - self.locked

    # -- matching and inserting ----------------------------------------------------------

    def match(self, context: Sequence[int], limit: int | None = None) -> Match:
        """The longest cached prefix of *context*, at most *limit* tokens; the path is
        marked as used (an edge the match ends inside is split there)."""
        limit = len(context) if limit is None else min(limit, len(context))
        self._clock += 1
        node, i = self.root, 0
        while i < limit:
            child = node.children.get(context[i])
            if child is None:
                break
            self._use(child)
            common = _common(child.key, context[i:min(i + len(child.key), limit)])
            node, i = child, i + common
            if common < len(child.key):  # ends inside the edge: split there
                node = self._split(child, common)
                break
        return Match(i, node)

    def insert(self, context: Sequence[int], known: Node | None = None) -> Node:
        """Cache *context* (what is not cached yet is added); the node it ends at,
        marked as used. *known*: a node on *context*'s path (one its caller holds:
        a held node stays where it was), so the tokens before it are not compared
        again."""
        self._clock += 1
        node = self.root if known is None or known.parent is None else known
        i, n = node.depth, len(context)
        while i < n:
            child = node.children.get(context[i])
            if child is None:
                child = Node(_freeze(context[i:]), node, n)
                node.children[context[i]] = child
                self.tokens += n - i
                self.nodes += 1
                self._use(child)
                return child
            self._use(child)
            common = _common(child.key, context[i:i + len(child.key)])
            node, i = child, i + common
            if common < len(child.key):  # the context ends inside the edge
                node = self._split(child, common)
        return node

    def _split(self, child: Node, at: int) -> Node:
        """Cut *child*'s edge after *at* tokens: a new node above it takes the first
        part (and its holders' locks); *child* keeps the rest and its identity."""
        parent = child.parent
        assert parent is not None and 0 < at < len(child.key)
        top = Node(child.key[:at], parent, child.depth - len(child.key) + at,
                   locks=child.locks, used=self._clock)
        parent.children[child.key[0]] = top
        child.key = child.key[at:]
        child.parent = top
        top.children[child.key[0]] = child
        self.nodes += 1
        return top

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
        first, whole leaves (a parent left without children takes its own place in
        that order); the tokens freed."""
        freed = 0
        held: list[tuple[int, int, Node]] = []
        while freed < tokens and self._heap:
            entry = heapq.heappop(self._heap)
            used, _, node = entry
            parent = node.parent
            if (parent is None or node.children or used != node.used
                    or parent.children.get(node.key[0]) is not node):
                continue  # stale: evicted, grown, split or used since
            if node.locks:
                held.append(entry)  # a candidate again once unlocked
                continue
            del parent.children[node.key[0]]
            node.parent = None
            self.tokens -= len(node.key)
            self.nodes -= 1
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
        self.tokens = self.nodes = 0
        self._heap.clear()

    def _use(self, node: Node) -> None:
        """Mark *node* as used now; a leaf becomes the most recent eviction candidate."""
        if node is self.root:
            return
        node.used = self._clock
        if not node.children:
            self._push(node)
        if len(self._heap) > 4 * self.nodes + 1024:  # drop stale entries
            self._heap = [e for e in self._heap
                          if e[2].parent is not None and not e[2].children
                          and e[0] == e[2].used]
            heapq.heapify(self._heap)

    def _push(self, node: Node) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (node.used, self._seq, node))


def _freeze(tokens: Sequence[int]) -> Sequence[int]:
    """An edge's key: compact tokens as they are, any other sequence as a tuple."""
    return tokens if isinstance(tokens, Tokens) else tuple(tokens)


def _common(key: Sequence[int], part: Sequence[int]) -> int:
    """How many leading tokens *key* and *part* share (run against run for compact
    tokens, else compared a slice at a time)."""
    if isinstance(key, Tokens) or isinstance(part, Tokens):
        return common_prefix(Tokens.of(key), Tokens.of(part))
    key, part = tuple(key), tuple(part)
    m = min(len(key), len(part))
    return m if key[:m] == part[:m] else shared_prefix(key, part, m)
