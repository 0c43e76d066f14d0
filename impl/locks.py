"""Lock handles and the table of live ones. Refines :mod:`kvledger.spec.locks`.

``RadixCache.inc_lock_ref`` returns a :class:`LockHandle` naming exactly the
(node, component) counters it raised; ``dec_lock_ref`` takes the handle back
and lowers those counters, once. There is no release without a handle: the
pitfall of SGLang's ``dec_lock_ref(node)`` without its ``swa_uuid_for_lock``
(bug B5, PR #27038) cannot be written.

Node ids vs positions: the spec counts locks per *position* (cached token
prefix). A radix node covers several positions, and a match or insert may
split a locked node in two; the new upper node must then carry the same
counts, and every live handle that covered the old node covers the new one
too (:meth:`LockTable.extend_on_split`). The positions a handle covers never
change, so the abstraction (node counters expanded to positions) is
unaffected by splits. ``LockHandle.counters`` is what ``inc_lock_ref``
raised; :meth:`LockTable.coverage` is what the handle covers now.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from typing import NamedTuple

from kvledger.spec.errors import DoubleUnlock, LockError, UnknownHandle
from kvledger.spec.types import Component, HandleId, NodeId

Counter = tuple[NodeId, Component]
"""One lock counter: a radix node's ``lock_ref`` in one component."""

_TABLE_IDS = itertools.count(1)


class LockHandle(NamedTuple):
    """An immutable receipt for one ``inc_lock_ref``: owned by the caller until passed to ``dec_lock_ref``.

    ``table`` identifies the issuing cache (a handle from another cache is
    rejected); ``node_id`` is the node that was locked; ``counters`` the
    (node, component) counters raised, from that node towards the root.
    """

    id: HandleId
    table: int
    node_id: NodeId
    counters: tuple[Counter, ...]


class LockTable:
    """The live handles of one cache and the counters each covers (SGLang keeps no such table).

    NOTE: only the handles are kept on the hot path; the reverse index (which
    handles cover a counter) is rebuilt on demand, for the checks that ask.
    """

    def __init__(self) -> None:
        self.ident = next(_TABLE_IDS)
        self._next = 1
        self._live: dict[HandleId, list[Counter]] = {}
        self._index: dict[Counter, int] | None = None  # counter -> live handles covering it; None: stale

    def __len__(self) -> int:
        return len(self._live)

    def issue(self, node_id: NodeId, counters: Iterable[Counter]) -> LockHandle:
        """Record a new live handle covering ``counters`` (the caller has raised them; a list is kept, not copied)."""
        h = HandleId(self._next)
        self._next += 1
        cov = counters if isinstance(counters, list) else list(counters)
        self._live[h] = cov
        self._index = None
        return LockHandle(h, self.ident, node_id, tuple(cov))

    def coverage(self, op: str, handle: LockHandle) -> tuple[Counter, ...]:
        """The counters live ``handle`` covers now; raise ``DoubleUnlock`` / ``UnknownHandle`` otherwise."""
        return tuple(self.covered(op, handle))

    def covered(self, op: str, handle: LockHandle) -> list[Counter]:
        """``coverage`` as the table's own list (no copy): read it, do not change it."""
        if type(handle) is not LockHandle:
            raise LockError(f"{op}: expected a LockHandle, got {type(handle).__name__} {handle!r:.40}")
        if type(handle.id) is not int:
            raise UnknownHandle(op, -1, f"handle id must be an int, got {handle.id!r:.40}")
        if handle.table != self.ident:
            raise UnknownHandle(op, handle.id, f"issued by another cache (table {handle.table}, this is {self.ident})")
        cov = self._live.get(handle.id)
        if cov is None:
            if 0 < handle.id < self._next:
                raise DoubleUnlock(op, handle.id, f"on node {handle.node_id}: handle already released (double unlock)")
            raise UnknownHandle(op, handle.id, "was never issued by this cache")
        return cov

    def forget(self, handle: LockHandle) -> None:
        """Forget live ``handle`` (validated by ``coverage`` or ``covered``): it is released."""
        del self._live[handle.id]
        self._index = None

    def extend_on_split(self, old: NodeId, new: NodeId, components: Iterable[Component]) -> None:
        """``new`` took the upper part of split node ``old``: handles covering ``(old, c)`` now cover ``(new, c)``."""
        if not self._live:
            return
        for c in components:
            site = (old, c)
            for cov in self._live.values():
                if site in cov:
                    cov.append((new, c))
        self._index = None

    def is_live(self, handle: LockHandle) -> bool:
        """``handle`` was issued by this table and not yet released (``LockError`` if it is not a handle). A handle
        whose id is no int (``True``, ``1.0``, a numpy int: equal to an issued id, hashed as one) was never issued."""
        if type(handle) is not LockHandle:
            raise LockError(f"is_live: expected a LockHandle, got {type(handle).__name__} {handle!r:.40}")
        return type(handle.id) is int and handle.table == self.ident and handle.id in self._live

    def covering(self, node_id: NodeId, component: Component) -> int:
        """How many live handles cover ``(node_id, component)`` (``inv_lock_ref_counts_handles``)."""
        if self._index is None:
            index: dict[Counter, int] = {}
            for cov in self._live.values():
                for site in set(cov):
                    index[site] = index.get(site, 0) + 1
            self._index = index
        return self._index.get((node_id, component), 0)

    def live(self) -> Mapping[HandleId, tuple[Counter, ...]]:
        """Every live handle and the counters it covers now (for the abstraction function)."""
        return {h: tuple(c) for h, c in self._live.items()}
