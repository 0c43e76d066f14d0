"""Named faults: the historical bugs of ``shared/BUGS.md``, re-created in the reference implementation.

A fault is switched on explicitly — :func:`enable`, the :func:`injected`
context manager, or ``kvledger check --fault Bn`` — and never by accident.
Switching one on replaces one method of an impl class by its buggy twin (kept
here, beside the correct code's NOTE that names the bug); switching it off
puts the original back. With every fault off, the implementation runs its
own methods: a fault costs nothing when off.

No fault carries an assertion of its own: each is caught by the general laws
of the spec through the conformance machinery (``kvledger check --fault Bn``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from kvledger.impl import admission, leaks
from kvledger.impl.admission import Attempt
from kvledger.impl.arguments import check_int
from kvledger.impl.locks import LockHandle
from kvledger.impl.lru import Linked, LRUList
from kvledger.impl.memory import MemoryManager
from kvledger.impl.radix import RadixCache
from kvledger.impl.session import Sessions, SessionSlot
from kvledger.spec.errors import InvalidArgument
from kvledger.spec.types import Component


@dataclass(frozen=True)
class Fault:
    """One re-created bug: where it lives and the method that re-creates it."""

    name: str
    title: str
    upstream: str
    laws: tuple[str, ...]  # the general laws expected to catch it (any one of them)
    suites: tuple[str, ...]  # where kvledger check looks for it
    patches: tuple[tuple[Any, str, Callable[..., Any]], ...]  # (class or module, attribute, buggy twin)
    models: tuple[str, ...] = ()  # the models of those suites it can act in (empty: every model)


# ---------------------------------------------------------------- B1: LRU node not detached


def _b1_remove(self: LRUList[Linked], node: Linked) -> None:
    """``LRUList.remove`` as before SGLang PR #25770: neighbours relinked, the node's own links left dangling."""
    if node not in self._members:
        from kvledger.spec.errors import NotInList

        raise NotInList("lru_remove", self.component.value, node.id, "not in the list (removed twice?)")
    self._unlink(node)


# ---------------------------------------------------------------- B5: copy-on-write unlock without its context


def _b5_release_cow_lock(self: RadixCache, h: LockHandle) -> None:
    """The copy-on-write path's unlock as before SGLang PR #27038.

    It calls ``dec_lock_ref(node)`` without the lock result, so the SWA
    release does not stop at the window boundary the lock recorded: it walks
    from the node to the root, lowering the SWA counter of every ancestor
    (counters other requests' locks raised).
    """
    cov = self._locks.coverage("dec_lock_ref", h)
    self._locks.forget(h)
    n = self._nodes[h.node_id]
    x = n
    while x.parent is not None:
        self._lower_lock(x, Component.FULL)
        if self.swa_window is not None and not x.swa_tombstone:
            self._lower_lock(x, Component.SWA)
        x = x.parent
    for nid, comp in cov:
        if comp is Component.MAMBA:
            self._lower_lock(self._nodes[nid], comp)


# ---------------------------------------------------------------- B2: admission rollback keeps the Mamba slot


def _b2_release_attempt_state(mm: MemoryManager, a: Attempt) -> None:
    """Rollback before SGLang PR #21404: the rejected request goes back to waiting still holding the slot."""


# ---------------------------------------------------------------- B3: session close keeps Mamba state


def _b3_release_state(self: Sessions, slot: SessionSlot) -> None:
    """``release_session`` before SGLang PR #23496: KV and row freed, Mamba state and track buffers not."""
    self._own_slot("release_state", slot)  # NOTE: the bug is the state kept, not a missing argument check


def _b3_session_mamba_refs(slot: object) -> tuple[int, ...]:
    """The idle check before SGLang PR #23496: Mamba slots held by open sessions counted as 0."""
    return ()


# ---------------------------------------------------------------- B4: resume overwrites the tail


def _b4_free_tail(self: Sessions, slot: SessionSlot, start: int) -> None:
    """Resume before SGLang PR #22862: ``[start, allocated)`` is written over without being freed."""
    self._own_slot("free_tail", slot)  # NOTE: the bug is the tail not freed, not a missing argument check
    check_int("free_tail", "session", "start", start)
    slot.alloc_len = min(slot.alloc_len, start)


FAULTS: dict[str, Fault] = {
    f.name: f
    for f in (
        Fault(
            "B1",
            "LRU list node not detached: removal leaves the removed node's prev/next (reference cycles)",
            "SGLang PR #25770",
            ("inv_lru_detached",),
            ("cache",),
            ((LRUList, "remove", _b1_remove),),
        ),
        Fault(
            "B2",
            "a request rejected by admission keeps the Mamba slot matching copied for it",
            "SGLang PR #21404",
            ("admission rolls back", "leak checker agrees with the ledgers", "inv_owners_account"),
            ("system",),
            ((admission, "release_attempt_state", _b2_release_attempt_state),),
            models=("mamba",),  # it leaks Mamba state: only a model with a Mamba pool has any
        ),
        Fault(
            "B3",
            "session close keeps its Mamba state and track buffers; the idle check counts them as 0",
            "SGLang PR #23496",
            ("leak checker agrees with the ledgers", "inv_owners_account", "inv_released_on_close"),
            ("system",),
            ((Sessions, "release_state", _b3_release_state), (leaks, "session_mamba_refs", _b3_session_mamba_refs)),
            models=("mamba",),
        ),
        Fault(
            "B4",
            "resume overwrites the session's KV tail in the request table without freeing it",
            "SGLang PR #22862",
            ("inv_owners_account", "leak checker agrees with the ledgers", "inv_released_on_close"),
            ("system",),
            ((Sessions, "free_tail", _b4_free_tail),),
        ),
        Fault(
            "B5",
            "copy-on-write path unlocks without the lock's context and over-releases ancestors' SWA locks",
            "SGLang PR #27038",
            ("inv_lock_ref_counts_handles", "inv_lock_ref_nonnegative"),
            ("cache",),  # needs SWA, which only the cache suite's models have
            ((RadixCache, "_release_cow_lock", _b5_release_cow_lock),),
            models=("hybrid",),  # the Mamba copy-on-write path it lives on, and the SWA locks it over-releases
        ),
    )
}

_saved: dict[str, list[tuple[Any, str, Any]]] = {}


def active() -> frozenset[str]:
    """The faults switched on now."""
    return frozenset(_saved)


class UnknownFault(InvalidArgument, KeyError):
    """A fault name that is not one of ``FAULTS`` (a ``KeyError`` too, as callers of ``enable`` caught before)."""

    def __str__(self) -> str:
        return Exception.__str__(self)  # NOTE: KeyError's own would quote the message


def enable(*names: str) -> None:
    """Switch faults on (by name, e.g. ``"B1"``); an unknown name raises ``UnknownFault`` (an ``InvalidArgument``
    and a ``KeyError``) naming the known ones, before any fault is switched on."""
    for name in names:
        if type(name) is not str or name not in FAULTS:
            raise UnknownFault("enable", "faults", (), f"unknown fault {name!r}; known: {', '.join(sorted(FAULTS))}")
    for name in names:
        if name in _saved:
            continue
        _saved[name] = [(target, attr, target.__dict__[attr]) for target, attr, _ in FAULTS[name].patches]
        for target, attr, buggy in FAULTS[name].patches:
            setattr(target, attr, buggy)


def disable(*names: str) -> None:
    """Switch faults off (all of them when no name is given)."""
    for name in names or tuple(_saved):
        for target, attr, original in _saved.pop(name, ()):
            setattr(target, attr, original)


@contextmanager
def injected(*names: str) -> Iterator[None]:
    """Run a block with ``names`` switched on; afterwards they are off again."""
    enable(*names)
    try:
        yield
    finally:
        disable(*names)
