"""LRU detachment: one intrusive LRU list of the radix cache (DESIGN.md rule 2, bug B1).

A radix cache keeps one doubly linked LRU list per component (SGLang's
``LRUList``, ``SWALRUList``, and the per-component ``lru_prev[pt]`` /
``lru_next[pt]`` of ``UnifiedLRUList``). The abstract state is the list's
order plus, for *every* node that exists, the pair of pointers that node
holds for this list. The laws:

* ``inv_lru_detached``: the members are ``order`` without duplicates, each
  member's pointers are its neighbours in ``order`` (``None`` at the ends),
  and a node outside the list holds no pointer of it: ``(None, None)``
  (``spec.tree.detached``: the detachment law, stated once for every structure).
  B1 (SGLang PR #25770) broke this: ``_remove_node`` relinked the neighbours
  but left the removed node's own ``prev`` / ``next`` pointing into the list.
* ``inv_lru_links_symmetric``: ``p.next is n`` whenever ``n.prev is p``, and
  the other way round, for every node in or out of the list.

Eviction walks from the LRU end (``lru_eviction_order``); the head is the
most recently used node.

>>> from kvledger.spec.types import NodeId
>>> s = lru_add_node(lru_add_node(new_lru(), NodeId(1)), NodeId(2))
>>> s = lru_insert_mru(lru_insert_mru(s, NodeId(1)), NodeId(2))
>>> s.order, lru_lru_first(s)
((2, 1), 1)
>>> s = lru_remove(s, NodeId(1))
>>> s.links[NodeId(1)], inv_lru_detached(s)
((None, None), True)
>>> lru_remove(s, NodeId(1))
Traceback (most recent call last):
...
kvledger.spec.errors.NotInList: lru_remove on the full LRU list, node 1: not in the list (removed twice?)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import icontract

from kvledger.spec.errors import AlreadyInList, LruError, NodeExists, NotInList, UnknownNode, must
from kvledger.spec.tree import detached
from kvledger.spec.types import Component

if TYPE_CHECKING:
    from kvledger.spec.types import NodeId
else:
    # NOTE: CrossHair 0.0.113 crashes on a NewType inside a container annotation (see spec/locks.py).
    NodeId = int

Links = tuple[NodeId | None, NodeId | None]
"""``(prev, next)``: the pointers one node holds for one list; ``prev`` points towards the MRU head."""

DETACHED: Links = (None, None)

SENTINEL: NodeId = NodeId(-1)
"""What an abstraction function writes for a pointer at the list's head or
tail sentinel held by a node *outside* the list (inside, the end pointers are
``None``). A detached node that still points at a sentinel is B1 too."""


@dataclass(frozen=True)
class LruState:
    """Abstract state of one LRU list.

    ``order`` runs from the head (most recently used) to the tail (least
    recently used), as walked from the head sentinel. ``links[n]`` is
    ``(prev, next)`` for every node ``n`` that exists, in the list or not.
    """

    order: tuple[NodeId, ...] = ()
    links: Mapping[NodeId, Links] = field(default_factory=dict)
    component: Component = Component.FULL


def new_lru(component: Component = Component.FULL) -> LruState:
    """An empty list of ``component`` with no nodes."""
    return LruState((), {}, component)


def in_list(s: LruState, node: NodeId) -> bool:
    """``node`` is a member of the list."""
    return node in s.order


def lru_eviction_order(s: LruState) -> tuple[NodeId, ...]:
    """The members from least to most recently used: the order eviction visits them."""
    return tuple(reversed(s.order))


def lru_lru_first(s: LruState, skip: frozenset[NodeId] = frozenset()) -> NodeId | None:
    """The least recently used member not in ``skip`` (e.g. the locked nodes), or ``None``."""
    return next((n for n in lru_eviction_order(s) if n not in skip), None)


# ---------------------------------------------------------------- invariants


def _expected_links(order: tuple[NodeId, ...], i: int) -> Links:
    return (order[i - 1] if i > 0 else None, order[i + 1] if i + 1 < len(order) else None)


def misplaced_members(s: LruState) -> dict[NodeId, tuple[Links | None, Links]]:
    """Members whose links are not the ones their place in ``order`` gives: ``node -> (links, expected)``.

    A member named twice is misplaced (its links cannot fit both places): its first place that they do not fit is
    the one reported.

    >>> a, b = NodeId(1), NodeId(2)
    >>> misplaced_members(LruState((a, b), {a: (None, b), b: (a, None)}))
    {}
    >>> misplaced_members(LruState((a, b), {a: (None, None), b: (a, None)}))
    {1: ((None, None), (None, 2))}
    """
    out: dict[NodeId, tuple[Links | None, Links]] = {}
    seen: set[NodeId] = set()
    for i, n in enumerate(s.order):
        want = _expected_links(s.order, i)
        if n not in out and (n in seen or s.links.get(n) != want):
            out[n] = (s.links.get(n), want)
        seen.add(n)
    return out


def inv_lru_detached(s: LruState) -> bool:
    """Members are ``order`` (no duplicates, all known) linked in order; every other node is detached."""
    if len(set(s.order)) != len(s.order) or not all(n in s.links for n in s.order):
        return False
    members = set(s.order)
    if not all(s.links[n] == _expected_links(s.order, i) for i, n in enumerate(s.order)):
        return False
    return all(detached(links) for n, links in s.links.items() if n not in members)


def inv_lru_links_symmetric(s: LruState) -> bool:
    """For every node: ``prev.next`` and ``next.prev`` lead back to it."""
    for n, (prev, nxt) in s.links.items():
        if prev is not None and (prev not in s.links or s.links[prev][1] != n):
            return False
        if nxt is not None and (nxt not in s.links or s.links[nxt][0] != n):
            return False
    return True


def inv_lru(s: LruState) -> bool:
    """Both LRU laws."""
    return inv_lru_detached(s) and inv_lru_links_symmetric(s)


def inv_lru_members(s: LruState, cached: frozenset[NodeId]) -> bool:
    """The members are exactly the nodes this component considers cached (checked by the caller)."""
    return frozenset(s.order) == cached


# ---------------------------------------------------------------- recency

Stamp = tuple[int, int]
"""What an observer knows of when something was last used, in ticks of its own clock: ``(lo, hi)``, used last at
a tick ``lo <= t <= hi``. ``lo``: the last call known to use it (a match or an insert covering it); ``hi``: the
last call that may have (a cache may also refresh, say, the rest of a node it split)."""


def joint_stamp(stamps: Sequence[Stamp]) -> Stamp | None:
    """The stamp of something used whole, each time, with all of its parts ``stamps`` (a node and its pages): used
    last no earlier than its parts' latest known use, and no later than their earliest possible last use.
    ``None`` for nothing."""
    if not stamps:
        return None
    return max(lo for lo, _ in stamps), min(hi for _, hi in stamps)


def recency_inversion(order: Sequence[NodeId], stamps: Mapping[NodeId, Stamp]) -> tuple[NodeId, NodeId] | None:
    """A pair ``(a, b)`` with ``a`` ahead of ``b`` in ``order`` (head, most recent, first) though ``a`` was last
    used before ``b`` for sure (``hi(a) < lo(b)``), or ``None``. Nodes without a stamp are passed over."""
    oldest: tuple[int, NodeId] | None = None  # NOTE: the smallest hi ahead of the walk, and whose it is
    for n in order:
        st = stamps.get(n)
        if st is None:
            continue
        if oldest is not None and oldest[0] < st[0]:
            return oldest[1], n
        if oldest is None or st[1] < oldest[0]:
            oldest = (st[1], n)
    return None


def inv_lru_recency(order: Sequence[NodeId], stamps: Mapping[NodeId, Stamp]) -> bool:
    """An LRU list orders its members by last use: none lies ahead of one used after it for sure
    (``recency_inversion``). Ties, and uses an observer cannot order, may fall either way."""
    return recency_inversion(order, stamps) is None


def evicts_lru_first(evicted: Iterable[Stamp], kept: Iterable[Stamp]) -> bool:
    """An eviction took the least recently used first: nothing it took was used, for sure, after something it
    could have taken instead and kept (``kept``: what stays evictable at once, an unlocked leaf)."""
    newest = max((lo for lo, _ in evicted), default=None)
    return newest is None or all(newest <= hi for _, hi in kept)


def evicts_enough(asked: int, could: int, freed: int) -> bool:
    """An eviction asked for ``asked`` frees at least that much, or all ``could`` (what no lock held) when less."""
    return freed >= min(asked, could)


def evicts_no_more(asked: int, freed: int, last: Iterable[int]) -> bool:
    """An eviction stops once it has freed ``asked``: when it freed that much, one of the units it may have taken
    last (``last``: the size of each node it took whose parent it kept) was needed to reach ``asked``."""
    sizes = list(last)
    return freed < asked or not sizes or any(freed - n < asked for n in sizes)


# ---------------------------------------------------------------- predicates


def _err(cls: type[LruError], op: str, s: LruState, node: NodeId, detail: str) -> LruError:
    return cls(op, s.component.value, node, detail)


def check_lru_add_node(s: LruState, node: NodeId) -> LruError | None:
    """Why ``node`` may not start to exist, or ``None``."""
    if node in s.links:
        return _err(NodeExists, "lru_add_node", s, node, "node id already exists (ids are never reused)")
    return None


def check_lru_delete_node(s: LruState, node: NodeId) -> LruError | None:
    """Why ``node`` may not stop existing, or ``None``."""
    if node not in s.links:
        return _err(UnknownNode, "lru_delete_node", s, node, "unknown node (deleted twice?)")
    if in_list(s, node):
        return _err(AlreadyInList, "lru_delete_node", s, node, "still in the list (remove it before deleting)")
    return None


def check_lru_insert_mru(s: LruState, node: NodeId) -> LruError | None:
    """Why ``node`` may not be inserted at the head, or ``None``."""
    if node not in s.links:
        return _err(UnknownNode, "lru_insert_mru", s, node, "unknown node (lru_add_node first)")
    if in_list(s, node):
        return _err(AlreadyInList, "lru_insert_mru", s, node, "already in the list (use lru_touch)")
    return None


def check_lru_remove(s: LruState, node: NodeId) -> LruError | None:
    """Why ``node`` may not be removed, or ``None``."""
    if not in_list(s, node):
        return _err(NotInList, "lru_remove", s, node, "not in the list (removed twice?)")
    return None


def check_lru_touch(s: LruState, node: NodeId) -> LruError | None:
    """Why ``node`` may not be moved to the head, or ``None``."""
    if not in_list(s, node):
        return _err(NotInList, "lru_touch", s, node, "not in the list (touched after removal or eviction?)")
    return None


# ---------------------------------------------------------------- transitions


def _relinked(s: LruState, order: tuple[NodeId, ...], touched: frozenset[NodeId]) -> LruState:
    """``s`` with ``order`` and the pointers of ``touched`` recomputed from it (the rest are untouched)."""
    pos = {n: i for i, n in enumerate(order)}
    links = dict(s.links)
    for n in touched:
        if n in links:
            links[n] = _expected_links(order, pos[n]) if n in pos else DETACHED
    return LruState(order, links, s.component)


def _neighbours(s: LruState, node: NodeId) -> frozenset[NodeId]:
    return frozenset(x for x in (node, *s.links.get(node, DETACHED)) if x is not None)


@icontract.require(
    lambda s, node: check_lru_add_node(s, node) is None,
    "node id is new",
    error=lambda s, node: must(check_lru_add_node(s, node)),
)
@icontract.require(lambda s: inv_lru(s), "list well-formed")
@icontract.ensure(
    lambda s, node, result: result == LruState(s.order, {**s.links, node: DETACHED}, s.component),
    "only the node is added, detached",
)
def lru_add_node(s: LruState, node: NodeId) -> LruState:
    """A new node exists, outside the list (the radix cache created it)."""
    return LruState(s.order, {**s.links, node: DETACHED}, s.component)


@icontract.require(
    lambda s, node: check_lru_delete_node(s, node) is None,
    "node is known and detached",
    error=lambda s, node: must(check_lru_delete_node(s, node)),
)
@icontract.require(lambda s: inv_lru(s), "list well-formed")
@icontract.ensure(lambda s, node, result: result.order == s.order and node not in result.links, "only the node goes")
def lru_delete_node(s: LruState, node: NodeId) -> LruState:
    """``node`` stops existing (the radix cache deleted it); it must already be out of the list."""
    return LruState(s.order, {n: v for n, v in s.links.items() if n != node}, s.component)


@icontract.require(
    lambda s, node: check_lru_insert_mru(s, node) is None,
    "node known and not in the list",
    error=lambda s, node: must(check_lru_insert_mru(s, node)),
)
@icontract.require(lambda s: inv_lru(s), "list well-formed")
@icontract.ensure(lambda s, node, result: result.order == (node, *s.order), "node becomes the head")
@icontract.ensure(lambda result: inv_lru(result), "list stays well-formed")
def lru_insert_mru(s: LruState, node: NodeId) -> LruState:
    """Put ``node`` at the head: it becomes the most recently used member."""
    order = (node, *s.order)
    return _relinked(s, order, frozenset({node, *s.order[:1]}))


@icontract.require(
    lambda s, node: check_lru_remove(s, node) is None,
    "node in the list",
    error=lambda s, node: must(check_lru_remove(s, node)),
)
@icontract.require(lambda s: inv_lru(s), "list well-formed")
@icontract.ensure(
    lambda s, node, result: result.order == tuple(n for n in s.order if n != node), "only the node leaves"
)
@icontract.ensure(lambda node, result: result.links[node] == DETACHED, "removed node detached (B1)")
@icontract.ensure(lambda result: inv_lru(result), "list stays well-formed")
def lru_remove(s: LruState, node: NodeId) -> LruState:
    """Take ``node`` out of the list; its neighbours are relinked and its own pointers cleared.

    SGLang's ``_remove_node``; clearing the removed node's pointers is the B1 fix.
    """
    order = tuple(n for n in s.order if n != node)
    return _relinked(s, order, _neighbours(s, node))


@icontract.require(
    lambda s, node: check_lru_touch(s, node) is None,
    "node in the list",
    error=lambda s, node: must(check_lru_touch(s, node)),
)
@icontract.require(lambda s: inv_lru(s), "list well-formed")
@icontract.ensure(
    lambda s, node, result: result.order == (node, *(n for n in s.order if n != node)), "node moves to the head"
)
@icontract.ensure(lambda result: inv_lru(result), "list stays well-formed")
def lru_touch(s: LruState, node: NodeId) -> LruState:
    """Move member ``node`` to the head (SGLang's ``reset_node_mru``)."""
    order = (node, *(n for n in s.order if n != node))
    return _relinked(s, order, _neighbours(s, node) | frozenset(s.order[:1]))
