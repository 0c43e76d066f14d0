"""Lock pairing: lock handles and per-position lock counts (DESIGN.md rule 3, bug B5).

Locking a matched prefix returns a *handle* that records exactly which
(position, component) counters it raised; unlocking takes that handle and
lowers exactly those counters, once. Positions, not nodes: a position is a
cached token prefix ``Key`` (the token at position ``len(key) - 1``), so the
spec does not care how an implementation splits its radix nodes. The laws:

* ``inv_lock_ref_counts_handles``: per (key, component), ``lock_ref`` equals
  the number of live handles covering it (absent means 0);
* ``inv_lock_ref_nonnegative``: no count is negative.

SGLang's ``inc_lock_ref(node)`` / ``dec_lock_ref(node, swa_uuid_for_lock)``
are ``inc_lock_ref`` / ``dec_lock_ref`` here; the handle replaces the lock
result that B5 (SGLang PR #27038) dropped, after which the SWA release walked
to the root and lowered counts that belonged to other requests.

A handle may cover nothing (a match of length 0 still returns a handle, so
every match is released the same way). Handle ids are never reused: a
released id stays in ``released`` so a second unlock is a ``DoubleUnlock``.

>>> from kvledger.spec.types import HandleId
>>> need = required_coverage((7, 8, 9), window=2, mamba=False)
>>> sorted((k, c.value) for k, c in need)
[((7,), 'full'), ((7, 8), 'full'), ((7, 8), 'swa'), ((7, 8, 9), 'full'), ((7, 8, 9), 'swa')]
>>> s = inc_lock_ref(new_lock_state(), HandleId(1), need)
>>> is_locked(s, (7, 8), Component.SWA), is_locked(s, (7,), Component.SWA)
(True, False)
>>> s = dec_lock_ref(s, HandleId(1))
>>> dict(s.lock_ref), inv_lock_ref_counts_handles(s)
({}, True)
>>> dec_lock_ref(s, HandleId(1))
Traceback (most recent call last):
...
kvledger.spec.errors.DoubleUnlock: dec_lock_ref of handle 1: handle already released (double unlock)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import icontract

from kvledger.spec.errors import BadCoverage, DoubleUnlock, HandleError, HandleReused, UnknownHandle, must
from kvledger.spec.types import Component

if TYPE_CHECKING:
    from kvledger.spec.types import HandleId
else:
    # NOTE: CrossHair 0.0.113 crashes (dynamic_typing.unify: "issubclass() arg 1 must be a class") on a
    # NewType inside a container annotation; at run time the id is an int, so annotate with int there.
    HandleId = int

Key = tuple[int, ...]
"""A cached prefix of whole pages; it names the page of tokens ``len(key) - page_size .. len(key) - 1``
of every sequence that starts with it (with ``page_size == 1``: the token position ``len(key) - 1``)."""

LockSite = tuple[Key, Component]
"""One counter a handle can raise: a cached page in one component."""

Coverage = frozenset[LockSite]


@dataclass(frozen=True)
class LockState:
    """Abstract lock table of one radix cache.

    ``handles`` maps each live handle to the sites it covers; ``lock_ref``
    maps each site with a positive count to that count (absent means 0);
    ``released`` is every handle id that was issued and released. An
    implementation need not keep ``released``: its handle object carries a
    "released" flag, and conformance compares ``handles`` and ``lock_ref``.
    """

    handles: Mapping[HandleId, Coverage] = field(default_factory=dict)
    lock_ref: Mapping[LockSite, int] = field(default_factory=dict)
    released: frozenset[HandleId] = frozenset()


def new_lock_state() -> LockState:
    """No handles, nothing locked."""
    return LockState({}, {}, frozenset())


def lock_ref_of(s: LockState, key: Key, comp: Component) -> int:
    """The lock count of ``key`` in ``comp`` (0 when absent)."""
    return s.lock_ref.get((key, comp), 0)


def is_locked(s: LockState, key: Key, comp: Component) -> bool:
    """Some live handle covers ``key`` in ``comp``: it must not be evicted from ``comp``."""
    return lock_ref_of(s, key, comp) > 0


def window_start(length: int, window: int, page_size: int = 1) -> int:
    """The first page end ``i`` (a multiple of ``page_size``) whose page overlaps the last ``window`` tokens.

    The pages of a prefix of ``length`` tokens that hold one of its last
    ``window`` tokens are ``key[:i]`` for ``window_start <= i <= length``,
    ``i % page_size == 0``; with ``page_size == 1``: ``max(1, length - window + 1)``.
    """
    return max(1, (length - window) // page_size + 1) * page_size


def required_coverage(key: Key, window: int | None, mamba: bool, page_size: int = 1) -> Coverage:
    """The least a lock on a match of prefix ``key`` (whole pages) must cover.

    FULL: every page ``key[:i]``, ``i`` a multiple of ``page_size`` in ``[1, len(key)]`` (the path to the root).
    SWA, when ``window`` is set: the pages holding the last ``window`` tokens, ``i >= window_start(...)``
    (up to the window boundary). MAMBA, when ``mamba``: ``key`` itself (the state at the match end), if non-empty.
    """
    n, p = len(key), page_size
    out = {(key[:i], Component.FULL) for i in range(p, n + 1, p)}
    if window is not None:
        out |= {(key[:i], Component.SWA) for i in range(window_start(n, window, p), n + 1, p)}
    if mamba and n > 0:
        out.add((key, Component.MAMBA))
    return frozenset(out)


def covers_required(coverage: Coverage, required: Coverage) -> bool:
    """A handle's coverage includes what its match requires (it may lock more, e.g. whole nodes)."""
    return required <= coverage


# ---------------------------------------------------------------- invariants


def _count_handles(handles: Iterable[Coverage]) -> dict[LockSite, int]:
    counts: dict[LockSite, int] = {}
    for cov in handles:
        for site in cov:
            counts[site] = counts.get(site, 0) + 1
    return counts


def inv_lock_ref_counts_handles(s: LockState) -> bool:
    """Per site, ``lock_ref`` == number of live handles covering it (absent means 0)."""
    counts = _count_handles(s.handles.values())
    return all(s.lock_ref.get(site, 0) == counts.get(site, 0) for site in set(counts) | set(s.lock_ref))


def inv_lock_ref_nonnegative(s: LockState) -> bool:
    """No lock count is negative."""
    return all(v >= 0 for v in s.lock_ref.values())


def inv_handles_fresh(s: LockState) -> bool:
    """A released handle is no longer live."""
    return not (s.released & set(s.handles))


def locked_length(coverage: Coverage) -> int:
    """How many tokens of prefix ``coverage`` locks: its longest FULL key (0 when it covers nothing)."""
    return max((len(k) for k, c in coverage if c is Component.FULL), default=0)


def inv_lock_covers_prefix(coverage: Coverage, prefix_len: int) -> bool:
    """A running request's lock covers exactly the prefix it runs on: ``prefix_len`` tokens, no more and no fewer.

    One that locks more than it uses keeps the rest from eviction for nothing (and, at admission, recomputes KV
    the cache held for it); one that uses more than it locks runs on KV that eviction may take.

    >>> inv_lock_covers_prefix(required_coverage((7, 8), None, False), 2)
    True
    >>> inv_lock_covers_prefix(required_coverage((7, 8), None, False), 0)
    False
    """
    return locked_length(coverage) == prefix_len


def inv_borrowed_under_lock(coverage: Coverage, borrowed: Key, page_size: int = 1) -> bool:
    """What a holder reads from the cache without owning it lies under a lock it holds: every whole page of
    ``borrowed`` (the tokens of its row's borrowed positions, from the first) on the path ``coverage`` locks.

    KV borrowed without a lock is KV eviction may take, or another request overwrite, while the holder still reads
    it: a lock taken on the wrong node, dropped early, or never taken. (A lock that covers more than is borrowed is
    :func:`inv_lock_covers_prefix`'s concern.)

    >>> inv_borrowed_under_lock(required_coverage((7, 8, 9), None, False), (7, 8))
    True
    >>> inv_borrowed_under_lock(required_coverage((7,), None, False), (7, 8))
    False
    >>> inv_borrowed_under_lock(required_coverage((7, 9), None, False), (7, 8))
    False
    >>> inv_borrowed_under_lock(required_coverage((7, 8), None, False, 2), (7, 8, 9), 2)
    True
    """
    return covers_required(coverage, required_coverage(borrowed, None, False, page_size))


def inv_locks(s: LockState) -> bool:
    """All lock-table laws."""
    return inv_lock_ref_counts_handles(s) and inv_lock_ref_nonnegative(s) and inv_handles_fresh(s)


# ---------------------------------------------------------------- predicates


def check_inc_lock_ref(s: LockState, handle: HandleId, covered: Coverage) -> HandleError | None:
    """Why ``handle`` may not be issued covering ``covered``, or ``None``."""
    if handle in s.handles or handle in s.released:
        state = "live" if handle in s.handles else "released"
        return HandleReused("inc_lock_ref", handle, f"handle id is already {state} (handle ids are never reused)")
    if any(key == () for key, _ in covered):
        return BadCoverage("inc_lock_ref", handle, "covers the root (empty key), which is never locked")
    return None


def check_dec_lock_ref(s: LockState, handle: HandleId) -> HandleError | None:
    """Why ``handle`` may not be released, or ``None``."""
    if handle in s.released:
        return DoubleUnlock("dec_lock_ref", handle, "handle already released (double unlock)")
    if handle not in s.handles:
        return UnknownHandle("dec_lock_ref", handle, "handle was never issued (a lock result from elsewhere?)")
    return None


# ---------------------------------------------------------------- transitions


def _moved_by(old: LockState, new: LockState, covered: Coverage, delta: int) -> bool:
    """Counts changed by ``delta`` exactly on ``covered`` and nowhere else."""
    sites = set(old.lock_ref) | set(new.lock_ref) | covered
    return all(new.lock_ref.get(x, 0) == old.lock_ref.get(x, 0) + (delta if x in covered else 0) for x in sites)


def _bumped(lock_ref: Mapping[LockSite, int], covered: Coverage, delta: int) -> dict[LockSite, int]:
    out = dict(lock_ref)
    for site in covered:
        out[site] = out.get(site, 0) + delta
        if out[site] == 0:
            del out[site]  # NOTE: absent means 0, so equal tables compare equal
    return out


@icontract.require(
    lambda s, handle, covered: check_inc_lock_ref(s, handle, covered) is None,
    "fresh handle, no root",
    error=lambda s, handle, covered: must(check_inc_lock_ref(s, handle, covered)),
)
@icontract.require(lambda s: inv_locks(s), "lock table well-formed")
@icontract.ensure(lambda handle, covered, result: result.handles[handle] == covered, "handle records its coverage")
@icontract.ensure(lambda s, covered, result: _moved_by(s, result, covered, +1), "counts rise by one on the coverage")
@icontract.ensure(lambda result: inv_locks(result), "lock table stays well-formed")
def inc_lock_ref(s: LockState, handle: HandleId, covered: Coverage) -> LockState:
    """Issue ``handle``, raising the count of every site in ``covered`` by one.

    The caller owns the handle until it passes it to ``dec_lock_ref``; while
    it is live, no site it covers may be evicted from its component.
    """
    return LockState({**s.handles, handle: covered}, _bumped(s.lock_ref, covered, +1), s.released)


@icontract.require(
    lambda s, handle: check_dec_lock_ref(s, handle) is None,
    "live handle",
    error=lambda s, handle: must(check_dec_lock_ref(s, handle)),
)
@icontract.require(lambda s: inv_locks(s), "lock table well-formed")
@icontract.ensure(
    lambda s, handle, result: _moved_by(s, result, s.handles[handle], -1), "counts fall by one on the coverage only"
)
@icontract.ensure(
    lambda s, handle, result: handle not in result.handles and result.released == s.released | {handle},
    "handle released once",
)
@icontract.ensure(lambda result: inv_locks(result), "lock table stays well-formed")
def dec_lock_ref(s: LockState, handle: HandleId) -> LockState:
    """Release ``handle``: lower exactly the counts it raised, once (SGLang's ``dec_lock_ref``)."""
    covered = s.handles[handle]
    handles = {h: c for h, c in s.handles.items() if h != handle}
    return LockState(handles, _bumped(s.lock_ref, covered, -1), s.released | {handle})
