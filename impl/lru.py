"""Intrusive doubly linked LRU lists, one per cache component. Refines :mod:`kvledger.spec.lru`.

A radix node carries one ``(lru_prev, lru_next)`` pointer pair per component
(SGLang's ``UnifiedLRUList`` keeps ``lru_prev[pt]`` / ``lru_next[pt]``); an
:class:`LRUList` threads the nodes that hold content of its component between
a head sentinel (most recently used side) and a tail sentinel (least recently
used side). ``lru_prev`` points towards the head, ``lru_next`` towards the tail.

The abstraction of a list is :class:`kvledger.spec.lru.LruState`: ``order()``
is its ``order`` (head to tail), each node's pointer pair is its ``links``.
The laws it keeps are ``inv_lru_detached`` (a node out of the list holds no
pointer of it, bug B1) and ``inv_lru_links_symmetric``.

>>> from kvledger.spec.types import Component
>>> lru: LRUList[Linked] = LRUList(Component.FULL)
>>> a, b = Linked(1), Linked(2)
>>> lru.insert_mru(a); lru.insert_mru(b)
>>> lru.order(), lru.lru_first() is a
([2, 1], True)
>>> lru.remove(a)
>>> a.lru_prev[Component.FULL], a.lru_next[Component.FULL], lru.order()
(None, None, [2])
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Generic, TypeVar, cast

from kvledger.spec.errors import AlreadyInList, IntegrityError, NotInList
from kvledger.spec.types import Component

SENTINEL_ID = -1
"""The id both sentinels carry (``kvledger.spec.lru.SENTINEL``)."""


class Linked:
    """Something that can sit in one LRU list per component: an id and a pointer pair per component.

    A node outside a component's list has ``lru_prev[c] is lru_next[c] is None``.
    """

    __slots__ = ("id", "lru_next", "lru_prev")

    def __init__(self, ident: int) -> None:
        self.id = ident
        self.lru_prev: dict[Component, Linked | None] = dict.fromkeys(Component)
        self.lru_next: dict[Component, Linked | None] = dict.fromkeys(Component)


N = TypeVar("N", bound=Linked)


class LRUList(Generic[N]):
    """The LRU list of one component: members between a head (MRU) and a tail (LRU) sentinel.

    Membership is tracked by id, independently of the pointers, so a node whose
    pointers were left dangling (B1) is still reported as *not* a member and the
    detachment law can see the dangling pointers.
    """

    def __init__(self, component: Component) -> None:
        self.component = component
        self.head = Linked(SENTINEL_ID)
        self.tail = Linked(SENTINEL_ID)
        self.head.lru_next[component] = self.tail
        self.tail.lru_prev[component] = self.head
        self._members: set[int] = set()

    # ------------------------------------------------------------ queries

    def __len__(self) -> int:
        return len(self._members)

    def __contains__(self, node: Linked) -> bool:
        return node.id in self._members

    def lru_first(self) -> N | None:
        """The least recently used member (where eviction starts), or ``None`` when empty."""
        x = self.tail.lru_prev[self.component]
        return None if x is self.head or x is None else cast(N, x)

    def more_recent(self, node: N) -> N | None:
        """The member just more recently used than ``node`` (towards the head), or ``None``."""
        x = node.lru_prev[self.component]
        return None if x is self.head or x is None else cast(N, x)

    def iter_lru(self) -> Iterator[N]:
        """Members from least to most recently used (``spec.lru.lru_eviction_order``).

        The yielded node may be removed before the next step; nothing else may change.
        """
        x = self.lru_first()
        while x is not None:
            nxt = self.more_recent(x)
            yield x
            x = nxt

    def order(self) -> list[int]:
        """Member ids from head (MRU) to tail (LRU), walked through the pointers (``LruState.order``)."""
        out: list[int] = []
        x = self.head.lru_next[self.component]
        while x is not None and x is not self.tail and len(out) <= len(self._members):
            out.append(x.id)
            x = x.lru_next[self.component]
        return out

    def check(self) -> None:
        """Raise ``IntegrityError`` unless the pointers form one symmetric chain of exactly the members."""
        c, seen = self.component, list[int]()
        x: Linked | None = self.head
        while x is not self.tail:
            assert x is not None
            nxt = x.lru_next[c]
            if nxt is None or nxt.lru_prev[c] is not x or len(seen) > len(self._members):
                raise IntegrityError(f"{c.value} LRU list: broken or asymmetric link after node {x.id}")
            if nxt is not self.tail:
                seen.append(nxt.id)
            x = nxt
        if sorted(seen) != sorted(self._members):
            raise IntegrityError(f"{c.value} LRU list: walk {seen} differs from members {sorted(self._members)}")

    # ------------------------------------------------------------ transitions

    def insert_mru(self, node: N) -> None:
        """Put non-member ``node`` at the head. Refines ``spec.lru.lru_insert_mru``."""
        if node.id in self._members:
            raise AlreadyInList("lru_insert_mru", self.component.value, node.id, "already in the list (use touch)")
        self._link_after(self.head, node)

    def insert_ahead_of(self, anchor: N, node: N) -> None:
        """Put non-member ``node`` just on the MRU side of member ``anchor`` (a split node takes its child's recency).

        Abstractly ``lru_insert_mru`` followed by moving ``node`` down to ``anchor``; a
        radix operation that splits also touches the split node before it returns.
        """
        if node.id in self._members:
            raise AlreadyInList("lru_insert", self.component.value, node.id, "already in the list")
        if anchor.id not in self._members:
            raise NotInList("lru_insert", self.component.value, anchor.id, "anchor is not in the list")
        prev = anchor.lru_prev[self.component]
        assert prev is not None
        self._link_after(prev, node)

    def remove(self, node: N) -> None:
        """Take member ``node`` out: relink its neighbours, clear its own pointers. Refines ``spec.lru.lru_remove``."""
        if node.id not in self._members:
            raise NotInList("lru_remove", self.component.value, node.id, "not in the list (removed twice?)")
        self._unlink(node)
        # NOTE: B1 (SGLang PR #25770): the removed node's own pointers must be cleared too,
        # else evicted neighbours point at each other and only the cycle collector frees them.
        node.lru_prev[self.component] = None
        node.lru_next[self.component] = None

    def touch(self, node: N) -> None:
        """Move member ``node`` to the head (SGLang's ``reset_node_mru``). Refines ``spec.lru.lru_touch``."""
        if node.id not in self._members:
            raise NotInList("lru_touch", self.component.value, node.id, "not in the list (evicted node touched?)")
        if self.head.lru_next[self.component] is node:
            return
        self._unlink(node)
        self._link_after(self.head, node)

    # ------------------------------------------------------------ pointer surgery

    def _link_after(self, prev: Linked, node: Linked) -> None:
        c = self.component
        nxt = prev.lru_next[c]
        assert nxt is not None
        node.lru_prev[c], node.lru_next[c] = prev, nxt
        prev.lru_next[c] = node
        nxt.lru_prev[c] = node
        self._members.add(node.id)

    def _unlink(self, node: Linked) -> None:
        c = self.component
        prev, nxt = node.lru_prev[c], node.lru_next[c]
        assert prev is not None and nxt is not None
        prev.lru_next[c] = nxt
        nxt.lru_prev[c] = prev
        self._members.discard(node.id)
