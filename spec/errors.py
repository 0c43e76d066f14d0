"""Typed errors raised by every layer of kvledger.

Each error names the law that was broken, the operation, the slots and the
owners involved (STYLE.md rule 11). A rejected operation never changes state.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar


def _show(slots: Iterable[int], limit: int = 8) -> str:
    items = sorted(slots)
    head = ", ".join(str(s) for s in items[:limit])
    more = f", ... ({len(items)} in all)" if len(items) > limit else ""
    return f"[{head}{more}]"


class KVLedgerError(Exception):
    """Base of every kvledger error."""


E = TypeVar("E", bound=KVLedgerError)


def must(err: E | None) -> E:
    """The error a ``check_*`` predicate returned, for an ``icontract.require(..., error=...)``.

    NOTE: icontract calls ``error`` only after the predicate said "illegal", so ``err`` is never ``None``.
    """
    assert err is not None
    return err


class LedgerError(KVLedgerError):
    """A pool operation broke single ownership; the pool is unchanged."""

    def __init__(self, operation: str, pool: str, slots: Iterable[int], detail: str) -> None:
        self.operation = operation
        self.pool = pool
        self.slots = tuple(sorted(slots))
        self.detail = detail
        super().__init__(f"{operation} on pool {pool!r} slots {_show(self.slots)}: {detail}")


def inv_names_culprit(err: KVLedgerError) -> bool:
    """A refusal about particular slots names at least one of them: an ``OutOfRange``, ``DoubleFree`` or
    ``NotOwner`` whose ``slots`` are empty tells an engine author nothing about which slot broke the rule.

    >>> inv_names_culprit(OutOfRange("free", "kv", [12], "outside [1, 12)"))
    True
    >>> inv_names_culprit(NotOwner("free", "kv", [], "held by another owner"))
    False
    """
    if isinstance(err, OutOfRange | DoubleFree | NotOwner):
        return bool(err.slots)
    return True


def inv_names_one_operation(errors: Iterable[KVLedgerError]) -> bool:
    """The refusals of one call name one operation, whatever was wrong with its arguments: an error that names
    something else as the operation (its pool, a helper's name) sends its reader to the wrong call.

    >>> inv_names_one_operation([OutOfRange("free", "kv", [12], "outside"), InvalidArgument("free", "kv", [], "2-D")])
    True
    >>> inv_names_one_operation([OutOfRange("free", "kv", [12], "outside"), InvalidArgument("kv", "free", [], "2-D")])
    False
    """
    return len({e.operation for e in errors if isinstance(e, LedgerError)}) <= 1


class OutOfRange(LedgerError):
    """A slot id outside the pool."""


class DoubleFree(LedgerError):
    """Freeing (or transferring) a slot that is already on the free list."""


class NotOwner(LedgerError):
    """Freeing or transferring a slot held by someone other than the named owner.

    ``held``: one of ``slots`` and the owner holding it, where the raiser says who holds it (the detail's
    "slot X is held by H"): what :func:`inv_names_holder` checks against the ledger.
    """

    def __init__(
        self, operation: str, pool: str, slots: Iterable[int], detail: str, *, held: tuple[int, object] | None = None
    ) -> None:
        super().__init__(operation, pool, slots, detail)
        self.held = held


def inv_names_holder(err: KVLedgerError, owner_of: Callable[[str, int], object]) -> bool:
    """A ``NotOwner`` that says who holds a slot tells the truth: the slot is one it names, and ``owner_of(pool,
    slot)`` (the ledger before the refused call) is that holder. An engine author reads "slot 17 is held by
    request 5" and goes looking for request 5; a message that pairs one slot with another slot's holder sends
    them to the wrong owner.

    >>> owners = {("kv", 3): "req 1", ("kv", 4): "req 2"}
    >>> inv_names_holder(NotOwner("free", "kv", [3, 4], "held", held=(3, "req 1")), lambda p, x: owners[p, x])
    True
    >>> inv_names_holder(NotOwner("free", "kv", [3, 4], "held", held=(4, "req 1")), lambda p, x: owners[p, x])
    False
    >>> inv_names_holder(NotOwner("free", "kv", [3], "held", held=(4, "req 2")), lambda p, x: owners[p, x])
    False
    """
    if not isinstance(err, NotOwner) or err.held is None:
        return True
    slot, holder = err.held
    return slot in err.slots and owner_of(err.pool, slot) == holder


class OverAllocation(LedgerError):
    """Asking for more slots than are free, or for a slot that is not free."""


class InvalidArgument(LedgerError):
    """A malformed request: a non-positive size, a duplicate id, a bad tensor."""


class PageAlignmentError(LedgerError):
    """A paged free that would split a page."""


class CacheError(KVLedgerError):
    """A radix-cache or lock operation was rejected; the cache is unchanged."""


class LockError(CacheError):
    """A lock handle was misused (double unlock, unknown handle)."""


class IntegrityError(KVLedgerError):
    """Slot contents do not match the tokens they are supposed to hold."""


# ---------------------------------------------------------------- LRU lists (spec/lru.py)


class LruError(CacheError):
    """An LRU list operation was rejected; the list is unchanged."""

    def __init__(self, operation: str, lru: str, node: int, detail: str) -> None:
        self.operation = operation
        self.lru = lru
        self.node = node
        self.detail = detail
        super().__init__(f"{operation} on the {lru} LRU list, node {node}: {detail}")


class AlreadyInList(LruError):
    """Inserting (or forgetting) a node that is still in the list."""


class NotInList(LruError):
    """Removing or touching a node that is not in the list (double remove)."""


class UnknownNode(LruError):
    """A node the list has never been told exists (or was already forgotten)."""


class NodeExists(LruError):
    """Announcing a node id that already exists."""


# ---------------------------------------------------------------- lock handles (spec/locks.py)


class HandleError(LockError):
    """A lock handle was misused; the lock table is unchanged."""

    def __init__(self, operation: str, handle: int, detail: str) -> None:
        self.operation = operation
        self.handle = handle
        self.detail = detail
        super().__init__(f"{operation} of handle {handle}: {detail}")


class UnknownHandle(HandleError):
    """Unlocking a handle that was never issued."""


class DoubleUnlock(HandleError):
    """Unlocking a handle that was already released."""


class HandleReused(HandleError):
    """Issuing a handle id that is live or was released before (ids are never reused)."""


class BadCoverage(HandleError):
    """A handle that would cover the root (the empty key), which is never locked."""


# ---------------------------------------------------------------- prefix content (spec/prefix.py)


def _show_key(key: tuple[int, ...], limit: int = 6) -> str:
    if len(key) <= limit:
        return str(tuple(key))
    return f"({key[0]}, {key[1]}, ..., {key[-1]}) of length {len(key)}"


class PrefixError(CacheError):
    """A prefix-cache operation was rejected; the cache is unchanged."""

    def __init__(self, operation: str, key: tuple[int, ...], detail: str) -> None:
        self.operation = operation
        self.key = tuple(key)
        self.detail = detail
        super().__init__(f"{operation} of key {_show_key(self.key)}: {detail}")


class UnalignedKey(PrefixError):
    """Inserting a key whose length is not a multiple of the page size."""


class LengthMismatch(PrefixError):
    """Inserting a key with a different number of slots than tokens."""


class SlotConflict(PrefixError):
    """A slot offered twice, or already held by the cache at another position."""


class ComponentDisabled(PrefixError):
    """Using a component (SWA, Mamba) the cache was built without, or a Mamba state at the root."""


class NotCached(PrefixError):
    """Evicting a position that the component does not hold."""


class EvictLockedError(PrefixError):
    """Evicting a position that a live lock handle covers."""


class EvictInteriorError(PrefixError):
    """Evicting a prefix whose cached extension stays (the cache must stay prefix-closed)."""


class EvictHoldsStateError(PrefixError):
    """Evicting a position from FULL while it still holds a Mamba state (its slot would leak)."""


# ---------------------------------------------------------------- library calls outside the pools


class ArgumentError(KVLedgerError):
    """A call of kvledger's own library (a recorder, a replay, an adapter) given an argument it cannot take.

    Names the call and the argument; nothing was done (no trace written, no state changed).
    """

    def __init__(self, operation: str, name: str, detail: str) -> None:
        self.operation = operation
        self.name = name
        self.detail = detail
        super().__init__(f"{operation}: {name} {detail}")


class LawBroken(AssertionError):
    """A law seen broken inside a call, where the call cannot go on: a finding, never a refusal.

    The message reads ``law: detail``, as every law's does. It is not a
    :class:`KVLedgerError`: a refusal changes nothing, while the call that meets
    this may already have changed state (an engine's scheduler stepped several
    times and then stopped moving the request it was asked to move).
    """
