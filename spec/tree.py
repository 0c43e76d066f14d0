"""Detachment, stated once, and the radix tree's pointer laws (DESIGN.md rule 2, beyond the LRU lists).

**A node removed from a structure holds no pointer into it, and the structure
holds none to it.** B1 broke this for an LRU list (``spec.lru.inv_lru_detached``
is this law for one list); the same law holds for every other structure a
radix node sits in: the tree (its ``parent`` and ``children``), the cache's
index of live nodes (SGLang's hash maps from a node id or a page hash to a
node), and any cursor the cache keeps into the tree (a memoised walk). A node
that keeps such a pointer after eviction keeps its whole subtree or path alive
(a leak the cycle collector may or may not find), and a structure that keeps a
pointer to it hands an evicted node back to a later lookup.

The abstract state (:class:`TreeLinks`) holds, for every node ever seen, the
ids its tree pointers name; ``live`` are the nodes reachable from the root
through ``children``. The laws:

* ``inv_tree_detached``: every node outside the tree holds no tree pointer
  (:func:`detached`), and no live node points at one outside it;
* ``inv_tree_links_symmetric``: ``c`` is a child of ``p`` exactly when ``c``'s
  parent is ``p``;
* ``inv_tree_acyclic``: each live node's parents lead to the root, each node once;
* ``inv_tree_index``: the cache's index names exactly the live nodes, and its
  cursors only live ones.

>>> s = TreeLinks(NodeId(0), {0: None, 1: 0, 2: 1}, {0: frozenset({1}), 1: frozenset({2}), 2: frozenset()})
>>> sorted(s.live), inv_tree(s)
([0, 1, 2], True)
>>> evicted = TreeLinks(NodeId(0), {0: None, 1: 0, 2: 1}, {0: frozenset({1}), 1: frozenset(), 2: frozenset()})
>>> inv_tree_detached(evicted)  # node 2 left the tree but still points at its old parent
False
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvledger.spec.types import NodeId
else:
    # NOTE: CrossHair 0.0.113 crashes on a NewType inside a container annotation (see spec/locks.py).
    NodeId = int


def detached(pointers: Iterable[NodeId | None]) -> bool:
    """The detachment law for one node and one structure: every pointer it holds of the structure is ``None``."""
    return all(p is None for p in pointers)


@dataclass(frozen=True)
class TreeLinks:
    """Abstract pointers of a radix tree: for every node seen (live or removed), its parent and children.

    ``index``: the nodes the cache's lookup structures name (its id index, hash
    maps); ``None`` when not observable. ``cursors``: nodes other cached
    structures point at (a memoised walk's path).
    """

    root: NodeId
    parent: Mapping[NodeId, NodeId | None]
    children: Mapping[NodeId, frozenset[NodeId]]
    index: frozenset[NodeId] | None = None
    cursors: frozenset[NodeId] = field(default_factory=frozenset)

    @property
    def live(self) -> frozenset[NodeId]:
        """The nodes reachable from the root through ``children`` (each visited once, a cycle stops the walk)."""
        seen: set[NodeId] = set()
        todo = [self.root]
        while todo:
            n = todo.pop()
            if n in seen:
                continue
            seen.add(n)
            todo.extend(self.children.get(n, frozenset()))
        return frozenset(seen)


def inv_tree_detached(s: TreeLinks) -> bool:
    """A node outside the tree holds no tree pointer, and no node in it points at one outside it."""
    live = s.live
    for n in s.parent.keys() | s.children.keys():
        kids = s.children.get(n, frozenset())
        if n not in live and not detached([s.parent.get(n), *kids]):
            return False
        if n in live and not (kids <= live and (s.parent.get(n) is None or s.parent.get(n) in live)):
            return False
    return True


def inv_tree_links_symmetric(s: TreeLinks) -> bool:
    """For every live node: its children name it as their parent, and its parent names it as a child."""
    for n in s.live:
        if any(s.parent.get(c) != n for c in s.children.get(n, frozenset())):
            return False
        p = s.parent.get(n)
        if n != s.root and (p is None or n not in s.children.get(p, frozenset())):
            return False
    return s.parent.get(s.root) is None


def inv_tree_acyclic(s: TreeLinks) -> bool:
    """From every live node the parents lead to the root, passing each node at most once."""
    for n in s.live:
        x: NodeId | None = n
        steps = 0
        while x is not None and x != s.root:
            steps += 1
            if steps > len(s.live):
                return False
            x = s.parent.get(x)
        if x is None:
            return False
    return True


def inv_tree_index(s: TreeLinks) -> bool:
    """The cache's index names exactly the live nodes; its cursors name only live nodes."""
    live = s.live
    return (s.index is None or s.index == live) and s.cursors <= live


def inv_tree(s: TreeLinks) -> bool:
    """Every tree pointer law."""
    return inv_tree_detached(s) and inv_tree_links_symmetric(s) and inv_tree_acyclic(s) and inv_tree_index(s)
