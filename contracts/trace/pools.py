"""The ledgers a replay keeps: ``spec.ledger`` state held sparsely, so each event costs what it names.

A spec :class:`~kvledger.spec.ledger.Ledger` is frozen and lists every free
slot: each transition copies the free set, so replaying one event of a pool of
a million slots costs a million steps, and a header that declares a huge pool
costs its size before any event. :class:`SparseLedger` is the same abstract
state kept the other way round: a slot is free iff no owner holds it, so it
stores only the held slots (an owner per slot, a set per owner) and its
memory is proportional to the slots in use.

Its checks are the spec's own: ``SparseLedger.view`` is a ``Ledger`` whose
``free`` is a read-only view of the complement (membership and size in O(1)),
handed to ``spec.ledger.check_allocate`` / ``check_free`` / ``check_transfer``
and ``inv_rows_held``, so a rejected event raises exactly the typed error the
spec names and leaves the ledger untouched. Transitions then update the two
maps in place, in time proportional to the slots named. :meth:`to_ledger`
builds the full spec state (O(capacity): for tests and ``--contracts`` runs,
which re-run the spec's decorated transition and compare).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Set
from typing import TypeVar, cast

from kvledger.spec import ledger as L
from kvledger.spec.errors import LedgerError
from kvledger.spec.ledger import Ledger, Slots
from kvledger.spec.types import Owner

_S = TypeVar("_S")


class _Free(Set[int]):
    """The free slots of a :class:`SparseLedger`: every slot of its range that no owner holds (a live view)."""

    def __init__(self, pool: SparseLedger) -> None:
        self._pool = pool

    @classmethod
    def _from_iterable(cls, it: Iterable[_S]) -> Set[_S]:  # ``slots & free``, ``slots - free``: plain frozensets
        return frozenset(it)

    def __contains__(self, x: object) -> bool:
        p = self._pool
        return type(x) is int and p.base <= x < p.base + p.capacity and x not in p.owner

    def __len__(self) -> int:
        return self._pool.capacity - len(self._pool.owner)

    def __iter__(self) -> Iterator[int]:  # O(capacity): only for to_ledger and messages
        p = self._pool
        return (x for x in range(p.base, p.base + p.capacity) if x not in p.owner)


class SparseLedger:
    """One pool's ownership (``spec.ledger`` semantics), storing only held slots.

    ``owner``: slot -> its owner; ``held``: owner -> its slots (non-empty sets;
    an owner that holds nothing is absent). Both are read-only to callers.
    """

    def __init__(self, name: str, capacity: int, base: int = 0) -> None:
        self.name, self.capacity, self.base = name, capacity, base
        self.owner: dict[int, Owner] = {}
        self.held: dict[Owner, set[int]] = {}
        # NOTE: the spec's checks read ``free`` only through ``len``, ``&``, ``-`` and ``in`` (all O(slots named)
        # on the view), and ``held`` through ``get``/``items``; the casts say "a Ledger for reading".
        self.view = Ledger(name, capacity, cast(Slots, _Free(self)), cast(Mapping[Owner, Slots], self.held), base)

    # ------------------------------------------------------------ queries

    def owner_of(self, slot: int) -> Owner | None:
        """The owner holding ``slot`` (``None``: free or outside the pool)."""
        return self.owner.get(slot)

    def held_by(self, owner: Owner) -> frozenset[int]:
        """A copy of the slots ``owner`` holds."""
        return frozenset(self.held.get(owner, ()))

    @property
    def num_free(self) -> int:
        return self.capacity - len(self.owner)

    def in_range(self, slot: int) -> bool:
        return self.base <= slot < self.base + self.capacity

    # ------------------------------------------------------------ transitions (spec checks first)

    def check(self, src: Owner | None, dst: Owner | None, slots: Slots) -> LedgerError | None:
        """The spec's error for moving ``slots`` from ``src`` to ``dst`` (``None``: the free list), or ``None``."""
        if src is None and dst is not None:
            return L.check_allocate(self.view, dst, slots)
        if dst is None and src is not None:
            return L.check_free(self.view, src, slots)
        assert src is not None and dst is not None
        return L.check_transfer(self.view, src, dst, slots)

    def move(self, src: Owner | None, dst: Owner | None, slots: Iterable[int]) -> None:
        """``spec.ledger.allocate`` (``src`` ``None``), ``free`` (``dst`` ``None``) or ``transfer``, in place.

        The caller has run :meth:`check` (a rejected move must not get here).
        """
        slots = tuple(slots)
        if src is not None:
            mine = self.held[src]
            mine.difference_update(slots)
            if not mine:
                del self.held[src]
        if dst is None:
            for x in slots:
                del self.owner[x]
        else:
            self.held.setdefault(dst, set()).update(slots)
            for x in slots:
                self.owner[x] = dst

    def apply(self, src: Owner | None, dst: Owner | None, slots: Slots) -> LedgerError | None:
        """:meth:`check`, then :meth:`move` when legal; returns the error (state untouched) or ``None``."""
        err = self.check(src, dst, slots)
        if err is None:
            self.move(src, dst, slots)
        return err

    # ------------------------------------------------------------ the full spec state

    def to_ledger(self) -> Ledger:
        """The spec :class:`Ledger` this stands for (O(capacity))."""
        held = {o: frozenset(s) for o, s in self.held.items() if s}  # NOTE: an empty move leaves no holder
        return Ledger(self.name, self.capacity, frozenset(_Free(self)), held, self.base)

    @classmethod
    def of(cls, led: Ledger) -> SparseLedger:
        """The sparse form of a spec ledger."""
        out = cls(led.name, led.capacity, led.base)
        for o, slots in led.held.items():
            out.move(None, o, slots)
        return out


__all__ = ["SparseLedger"]
