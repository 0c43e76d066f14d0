"""Intrusive doubly linked LRU lists, one per cache component. Refines :mod:`kvledger.spec.lru`.

A radix node carries one ``(lru_prev, lru_next)`` pointer pair per component
(SGLang's ``UnifiedLRUList`` keeps ``lru_prev[pt]`` / ``lru_next[pt]``); an
:class:`LRUList` threads the nodes that hold content of its component between
a head sentinel (most recently used side) and a tail sentinel (least recently
used side). ``lru_prev`` points towards the head, ``lru_next`` towards the tail.
Underneath, a node keeps its pointers in two lists indexed by ``SLOT[component]``
(``prev``, ``next``); ``lru_prev[c]`` / ``lru_next[c]`` are views of them by
component, and the lists' own code indexes them directly (no enum hashing per step).

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

from collections.abc import Iterator, MutableMapping, Sequence
from typing import Generic, TypeVar, cast

from kvledger.spec.errors import AlreadyInList, IntegrityError, NotInList, UnknownNode
from kvledger.spec.types import Component

SENTINEL_ID = -1
"""The id both sentinels carry (``kvledger.spec.lru.SENTINEL``)."""

SLOT: dict[Component, int] = {c: i for i, c in enumerate(Component)}
"""Where component ``c`` keeps its entry in a node's per-component lists (``Linked.prev``, ``Linked.next``)."""


T = TypeVar("T")


class ByComponent(MutableMapping[Component, T]):
    """A node's per-component list read and written by component (``list[SLOT[c]]``): a live view, not a copy."""

    __slots__ = ("_items",)

    def __init__(self, items: list[T]) -> None:
        self._items = items

    def __getitem__(self, c: Component) -> T:
        return self._items[SLOT[c]]

    def __setitem__(self, c: Component, x: T) -> None:
        self._items[SLOT[c]] = x

    def __delitem__(self, c: Component) -> None:
        raise TypeError(f"{c.value}: every component keeps an entry (assign instead)")

    def __iter__(self) -> Iterator[Component]:
        return iter(SLOT)

    def __len__(self) -> int:
        return len(SLOT)

    def __repr__(self) -> str:
        return repr(dict(self))


class Linked:
    """Something that can sit in one LRU list per component: an id and a pointer pair per component.

    ``prev[i]`` / ``next[i]``: the pointers of the list of component ``i``
    (``SLOT``); ``lru_prev[c]`` / ``lru_next[c]`` read and write them by
    component. A node outside a component's list has both ``None``.
    """

    __slots__ = ("id", "next", "prev")

    def __init__(self, ident: int) -> None:
        self.id = ident
        self.prev: list[Linked | None] = [None] * len(SLOT)
        self.next: list[Linked | None] = [None] * len(SLOT)

    @property
    def lru_prev(self) -> ByComponent[Linked | None]:
        """The pointer towards the head (more recently used), per component."""
        return ByComponent(self.prev)

    @property
    def lru_next(self) -> ByComponent[Linked | None]:
        """The pointer towards the tail (less recently used), per component."""
        return ByComponent(self.next)


N = TypeVar("N", bound=Linked)


def _ident(node: object) -> int:
    """The id to name ``node`` by in an error (``-1`` for something that is not a node)."""
    ident = getattr(node, "id", -1)
    return ident if type(ident) is int else -1


def _repeated(order: list[N]) -> N:
    """The first node ``order`` names a second time (it names one: the caller found fewer distinct nodes)."""
    seen: set[N] = set()
    for x in order:
        if x in seen:
            return x
        seen.add(x)
    raise AssertionError("_repeated: no node named twice")


def _check_node(op: str, component: Component, node: object) -> None:
    """Raise ``UnknownNode`` unless ``node`` can sit in a list: a ``Linked`` with an int id."""
    if not isinstance(node, Linked) or type(node.id) is not int:
        raise UnknownNode(op, component.value, _ident(node), f"not a node: {type(node).__name__} {node!r:.40}")


class LRUList(Generic[N]):
    """The LRU list of one component: members between a head (MRU) and a tail (LRU) sentinel.

    Membership is tracked by a set of the nodes, independently of the pointers, so a node whose
    pointers were left dangling (B1) is still reported as *not* a member and the
    detachment law can see the dangling pointers.
    """

    def __init__(self, component: Component) -> None:
        if type(component) is not Component:
            raise UnknownNode("create", str(component), -1, "an LRU list's component must be a Component")
        self.component = component
        self.slot = SLOT[component]
        self.head = Linked(SENTINEL_ID)
        self.tail = Linked(SENTINEL_ID)
        self.head.next[self.slot] = self.tail
        self.tail.prev[self.slot] = self.head
        self._members: set[Linked] = set()  # NOTE: by identity: a set of nodes checks a whole path in C

    # ------------------------------------------------------------ queries

    def __len__(self) -> int:
        return len(self._members)

    def __contains__(self, node: Linked) -> bool:
        return node in self._members

    def lru_first(self) -> N | None:
        """The least recently used member (where eviction starts), or ``None`` when empty."""
        x = self.tail.prev[self.slot]
        return None if x is self.head or x is None else cast(N, x)

    def more_recent(self, node: N) -> N | None:
        """The member just more recently used than member ``node`` (towards the head), or ``None``."""
        _check_node("more_recent", self.component, node)
        if node not in self._members:
            raise NotInList("more_recent", self.component.value, _ident(node), "not in the list")
        x = node.prev[self.slot]
        return None if x is self.head or x is None else cast(N, x)

    def iter_lru(self) -> Iterator[N]:
        """Members from least to most recently used (``spec.lru.lru_eviction_order``).

        The yielded node may be removed before the next step; nothing else may change. A walk that passes
        more nodes than the list had members raises ``IntegrityError`` (``inv_lru_detached``), never loops.
        """
        i, head = self.slot, self.head
        left = len(self._members)  # NOTE: a walk longer than the members revisits a node: never walk a cycle
        x = self.tail.prev[i]
        while x is not None and x is not head:
            left -= 1
            if left < 0:
                raise self._revisit("tail", x)
            nxt = x.prev[i]
            yield x  # type: ignore[misc]  # NOTE: every member is an N (a ``cast`` per step costs a call)
            x = nxt

    def _revisit(self, end: str, x: Linked) -> IntegrityError:
        return IntegrityError(
            f"inv_lru_detached: {self.component.value} LRU list walked from the {end} passes node {x.id} after "
            f"{len(self._members)} members (a node linked twice, or a cycle)"
        )

    def order(self) -> list[int]:
        """Member ids from head (MRU) to tail (LRU), walked through the pointers (``LruState.order``).

        ``IntegrityError`` (``inv_lru_detached``) if the walk passes more nodes than the list has members.
        """
        out: list[int] = []
        i = self.slot
        x = self.head.next[i]
        while x is not None and x is not self.tail:
            if len(out) >= len(self._members):
                raise self._revisit("head", x)
            out.append(x.id)
            x = x.next[i]
        return out

    def check(self) -> None:
        """Raise ``IntegrityError`` unless the pointers form one symmetric chain of exactly the members."""
        i, seen = self.slot, list[int]()
        x: Linked | None = self.head
        while x is not self.tail:
            assert x is not None
            nxt = x.next[i]
            if nxt is None or nxt.prev[i] is not x or len(seen) > len(self._members):
                raise IntegrityError(
                    f"inv_lru_links_symmetric: {self.component.value} LRU list: broken or asymmetric link "
                    f"after node {x.id}"
                )
            if nxt is not self.tail:
                seen.append(nxt.id)
            x = nxt
        members = sorted(x.id for x in self._members)
        if sorted(seen) != members:
            raise IntegrityError(
                f"inv_lru_detached: {self.component.value} LRU list: walk {seen} differs from members {members}"
            )

    # ------------------------------------------------------------ transitions

    def insert_mru(self, node: N) -> None:
        """Put non-member ``node`` at the head. Refines ``spec.lru.lru_insert_mru``."""
        _check_node("lru_insert_mru", self.component, node)
        if node in self._members:
            raise AlreadyInList("lru_insert_mru", self.component.value, node.id, "already in the list (use touch)")
        self._check_unlinked("lru_insert_mru", node)
        self._link_after(self.head, node)

    def insert_ahead_of(self, anchor: N, node: N) -> None:
        """Put non-member ``node`` just on the MRU side of member ``anchor`` (a split node takes its child's recency).

        Abstractly ``lru_insert_mru`` followed by moving ``node`` down to ``anchor``; a
        radix operation that splits also touches the split node before it returns.
        """
        _check_node("lru_insert", self.component, node)
        _check_node("lru_insert", self.component, anchor)
        if node in self._members:
            raise AlreadyInList("lru_insert", self.component.value, node.id, "already in the list")
        if anchor not in self._members:
            raise NotInList("lru_insert", self.component.value, _ident(anchor), "anchor is not in the list")
        self._check_unlinked("lru_insert", node)
        prev = anchor.prev[self.slot]
        assert prev is not None
        self._link_after(prev, node)

    def remove(self, node: N) -> None:
        """Take member ``node`` out: relink its neighbours, clear its own pointers. Refines ``spec.lru.lru_remove``."""
        _check_node("lru_remove", self.component, node)
        if node not in self._members:
            raise NotInList("lru_remove", self.component.value, _ident(node), "not in the list (removed twice?)")
        self._unlink(node)
        # NOTE: B1 (SGLang PR #25770): the removed node's own pointers must be cleared too,
        # else evicted neighbours point at each other and only the cycle collector frees them.
        node.prev[self.slot] = None
        node.next[self.slot] = None

    def touch(self, node: N) -> None:
        """Move member ``node`` to the head (SGLang's ``reset_node_mru``). Refines ``spec.lru.lru_touch``."""
        self.touch_all([node])

    def touch_all(self, nodes: list[N]) -> None:
        """``touch`` each of ``nodes`` (distinct members) in turn, the last ending at the head: one call for a whole
        radix path. Nothing changes if one of them is not a member. The same as ``place(nodes[::-1])``.
        """
        if not isinstance(nodes, list | tuple):
            why = f"expected a list of nodes, got {type(nodes).__name__}"
            raise NotInList("lru_touch", self.component.value, -1, why)
        self.place(nodes[::-1])

    def place(self, order: list[N]) -> None:
        """Put distinct members ``order`` at the head, ``order[0]`` most recent, the other members keeping their
        order: ``touch`` of each of ``order`` from the last to the first. Nothing changes if one is not a member.

        NOTE: ``order`` is taken in runs, each a stretch that already lies in the list in that order (a
        radix path mostly does: its nodes were placed together, a split's new node sits just ahead of
        the node it split, a new leaf just behind its parent); a run that is not yet in its place is
        unlinked and linked back as one block, so the cost is per run, not per node. A path placed again
        in the same order moves nothing (an insert right after its match).
        """
        if type(order) is not list and not isinstance(order, list | tuple):
            raise NotInList(
                "lru_touch", self.component.value, -1, f"expected a list of nodes, got {type(order).__name__}"
            )
        placed = self._in_place(order)
        if placed is None:
            return
        pos, j = placed
        rest = order[j:] if j else order
        members = self._members
        try:
            named = set(rest)
        except TypeError:  # NOTE: something unhashable: not a node
            named = set()
        if not members.issuperset(named) or not named:
            bad = next(node for node in rest if not isinstance(node, Linked) or node not in members)
            raise NotInList("lru_touch", self.component.value, _ident(bad), "not in the list (evicted node touched?)")
        if len(named) != len(rest) or (j and not named.isdisjoint(order[:j])):
            raise AlreadyInList(
                "lru_touch", self.component.value, _ident(_repeated(order)), "a node named twice in one touch"
            )
        self._place_runs(pos, rest)

    def _reorder(self, order: list[N]) -> None:
        """``place`` for a caller that guarantees ``order`` names distinct members: no checks (the radix tree's own
        paths, a descent from the root: each node is in the tree, so in the FULL list, and is passed once)."""
        placed = self._in_place(order)
        if placed is not None:
            pos, j = placed
            self._place_runs(pos, order[j:] if j else order)

    def _in_place(self, order: Sequence[object]) -> tuple[Linked, int] | None:
        """How much of ``order`` already follows the head in that order: the last such node (or the head) and
        their count; ``None`` when all of it does. A node linked from the head is a member."""
        i = self.slot
        pos: Linked = self.head
        for j, node in enumerate(order):
            if pos.next[i] is not node:
                return pos, j
            pos = cast(Linked, node)  # NOTE: it is pos's successor, so a linked member
        return None

    def _place_runs(self, pos: Linked, rest: list[N]) -> None:
        """Put members ``rest`` (distinct, not yet in place) just after ``pos`` in that order, run by run."""
        i = self.slot
        first = last = rest[0]
        for node in rest[1:]:
            if last.next[i] is node:
                last = node
                continue
            pos = self._move_run(pos, first, last)
            first = last = node
        self._move_run(pos, first, last)

    def _move_run(self, pos: Linked, first: Linked, last: Linked) -> Linked:
        """Put the stretch ``first`` .. ``last`` of the list just after ``pos`` (not in it); return ``last``."""
        i = self.slot
        if pos.next[i] is not first:
            prev, nxt = first.prev[i], last.next[i]
            assert prev is not None and nxt is not None
            prev.next[i] = nxt
            nxt.prev[i] = prev
            after = pos.next[i]
            assert after is not None
            pos.next[i] = first
            first.prev[i] = pos
            last.next[i] = after
            after.prev[i] = last
        return last

    def insert_behind(self, anchor: N, node: N) -> None:
        """Put non-member ``node`` just on the LRU side of member ``anchor`` (a new leaf takes its parent's recency).

        Abstractly ``lru_insert_mru`` followed by moving ``node`` down behind
        ``anchor``; a radix insert touches the new leaf's path before it returns.
        """
        _check_node("lru_insert", self.component, node)
        _check_node("lru_insert", self.component, anchor)
        if node in self._members:
            raise AlreadyInList("lru_insert", self.component.value, node.id, "already in the list")
        if anchor not in self._members:
            raise NotInList("lru_insert", self.component.value, _ident(anchor), "anchor is not in the list")
        self._check_unlinked("lru_insert", node)
        self._link_after(anchor, node)

    # ------------------------------------------------------------ pointer surgery

    def _check_unlinked(self, op: str, node: Linked) -> None:
        """Raise ``AlreadyInList`` if non-member ``node`` still holds this component's pointers: it is linked in
        another list of the component (inserting it here would corrupt that one) or was left dangling."""
        i = self.slot
        if node.prev[i] is not None or node.next[i] is not None:
            raise AlreadyInList(op, self.component.value, node.id, "still linked (in another list, or left dangling)")

    def _link_after(self, prev: Linked, node: Linked) -> None:
        """Link non-member ``node`` just after ``prev`` (a member, or ``head``), unchecked: the callers check, or
        (the radix tree) link a node they have just made, so never in a list."""
        i = self.slot
        nxt = prev.next[i]
        assert nxt is not None
        node.prev[i], node.next[i] = prev, nxt
        prev.next[i] = node
        nxt.prev[i] = node
        self._members.add(node)

    def _unlink(self, node: Linked) -> None:
        i = self.slot
        prev, nxt = node.prev[i], node.next[i]
        assert prev is not None and nxt is not None
        prev.next[i] = nxt
        nxt.prev[i] = prev
        self._members.discard(node)
