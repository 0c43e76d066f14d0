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

from kvledger.impl.locks import LockHandle
from kvledger.impl.lru import Linked, LRUList
from kvledger.impl.radix import RadixCache
from kvledger.spec.types import Component


@dataclass(frozen=True)
class Fault:
    """One re-created bug: where it lives and the method that re-creates it."""

    name: str
    title: str
    upstream: str
    laws: tuple[str, ...]  # the general laws expected to catch it (any one of them)
    suites: tuple[str, ...]  # where kvledger check looks for it
    target: type
    method: str
    buggy: Callable[..., Any]


# ---------------------------------------------------------------- B1: LRU node not detached


def _b1_remove(self: LRUList[Linked], node: Linked) -> None:
    """``LRUList.remove`` as before SGLang PR #25770: neighbours relinked, the node's own links left dangling."""
    if node.id not in self._members:
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
    self._locks.release(h)
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


FAULTS: dict[str, Fault] = {
    f.name: f
    for f in (
        Fault(
            "B1",
            "LRU list node not detached: removal leaves the removed node's prev/next (reference cycles)",
            "SGLang PR #25770",
            ("inv_lru_detached",),
            ("cache",),
            LRUList,
            "remove",
            _b1_remove,
        ),
        Fault(
            "B5",
            "copy-on-write path unlocks without the lock's context and over-releases ancestors' SWA locks",
            "SGLang PR #27038",
            ("inv_lock_ref_counts_handles", "inv_lock_ref_nonnegative"),
            ("cache",),
            RadixCache,
            "_release_cow_lock",
            _b5_release_cow_lock,
        ),
    )
}

_saved: dict[str, Any] = {}


def active() -> frozenset[str]:
    """The faults switched on now."""
    return frozenset(_saved)


def enable(*names: str) -> None:
    """Switch faults on (by name, e.g. ``"B1"``); unknown names raise ``KeyError`` naming the known ones."""
    for name in names:
        if name not in FAULTS:
            raise KeyError(f"unknown fault {name!r}; known: {', '.join(sorted(FAULTS))}")
    for name in names:
        if name in _saved:
            continue
        f = FAULTS[name]
        _saved[name] = f.target.__dict__[f.method]
        setattr(f.target, f.method, f.buggy)


def disable(*names: str) -> None:
    """Switch faults off (all of them when no name is given)."""
    for name in names or tuple(_saved):
        if name in _saved:
            f = FAULTS[name]
            setattr(f.target, f.method, _saved.pop(name))


@contextmanager
def injected(*names: str) -> Iterator[None]:
    """Run a block with ``names`` switched on; afterwards they are off again."""
    enable(*names)
    try:
        yield
    finally:
        disable(*names)
