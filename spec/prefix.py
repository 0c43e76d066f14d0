"""Prefix content: what a radix prefix cache holds, without its nodes.

The unit of caching is a page of ``page_size`` tokens (a token when
``page_size == 1``). A cached page is named by the prefix that ends with it
(``Key``, a multiple of ``page_size`` long), so two sequences share a page
only when they agree on it and on everything before it, as in a paged radix
tree. How an implementation splits pages into nodes is invisible here; lock
coverage (``kvledger.spec.locks``) is over the same keys. The laws:

* ``inv_prefix_closed``: if ``k`` is cached, so is every shorter page prefix of ``k``;
* ``inv_page_aligned``: every key is whole pages and holds one slot per token;
* ``inv_swa_live_cached``: SWA-live pages are cached (the others are SWA
  tombstones: full KV kept, window KV gone);
* ``inv_mamba_cached``: a Mamba state sits at the end of a cached prefix;
* ``inv_slots_distinct``: no slot (or Mamba state) is held twice;
* ``inv_locked_cached``: a live lock only covers what its component holds;
* ``inv_content``: each cached slot holds ``fingerprint(token, position)``.

>>> from kvledger.spec.locks import new_lock_state
>>> s = new_prefix_cache(page_size=2)
>>> r = insert(s, (5, 6, 7, 8), tuple(SlotId(x) for x in (10, 11, 12, 13)))
>>> r = insert(r.state, (5, 6, 9, 9), tuple(SlotId(x) for x in (20, 21, 22, 23)))
>>> r.prefix_len, r.dup_slots
(2, (20, 21))
>>> match_prefix(r.state, (5, 6, 7, 1, 2))
MatchResult(length=2, slots=(10, 11), mamba=None)
>>> evict_full(r.state, frozenset({(5, 6)}), new_lock_state())
Traceback (most recent call last):
...
kvledger.spec.errors.EvictInteriorError: evict_full of key (5, 6): its extension (5, 6, 7, 8) stays cached
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

import icontract

from kvledger.spec import errors as e
from kvledger.spec.locks import Key, LockState, lock_ref_of, window_start
from kvledger.spec.types import Component

if TYPE_CHECKING:
    from kvledger.spec.types import MambaSlot, SlotId
else:
    # NOTE: CrossHair 0.0.113 crashes on a NewType inside a container annotation (see spec/locks.py).
    MambaSlot = SlotId = int

# NOTE: longer than STYLE.md's 300-line guide: match, insert and the three evictions are one protocol
# over one state, and splitting them would part the laws from the operations that must keep them.

_V = TypeVar("_V")
ALL_COMPONENTS = (Component.FULL, Component.SWA, Component.MAMBA)


@dataclass(frozen=True)
class PrefixCache:
    """Abstract content of one radix cache; it owns every slot it maps until eviction hands it back.

    ``full[k]`` are the KV slots of the last ``page_size`` tokens of ``k``
    (token ``len(k) - page_size + j`` in slot ``full[k][j]``); ``swa_live``
    are the pages whose SWA KV is present (only with a ``window``);
    ``mamba_state[k]`` is the state after prefix ``k`` (only with ``mamba``).
    """

    page_size: int = 1
    window: int | None = None
    mamba: bool = False
    full: Mapping[Key, tuple[SlotId, ...]] = field(default_factory=dict)
    swa_live: frozenset[Key] = frozenset()
    mamba_state: Mapping[Key, MambaSlot] = field(default_factory=dict)


@dataclass(frozen=True)
class MatchResult:
    """``length`` matched tokens, their slots and the state at the end; all still the cache's (borrowed)."""

    length: int
    slots: tuple[SlotId, ...]
    mamba: MambaSlot | None


@dataclass(frozen=True)
class InsertResult:
    """The new cache; ``prefix_len`` tokens were already cached (SGLang's return value).

    ``dup_slots`` (token order, whole pages) and ``dup_mamba`` are the
    caller's slots the cache did not take because it already held those
    pages; the caller still owns them and must free them.
    """

    state: PrefixCache
    prefix_len: int
    dup_slots: tuple[SlotId, ...]
    dup_mamba: MambaSlot | None


def new_prefix_cache(page_size: int = 1, window: int | None = None, mamba: bool = False) -> PrefixCache:
    """An empty cache with pages of ``page_size`` tokens, an SWA ``window`` in tokens (or none), Mamba or not."""
    return PrefixCache(page_size, window, mamba, {}, frozenset(), {})


@icontract.require(lambda token, position: 0 <= token < 2**31 and 0 <= position < 2**31, "31-bit token and position")
@icontract.ensure(lambda result: 1 <= result < 2**24, "fingerprint is non-zero and fits 24 bits")
def fingerprint(token: int, position: int) -> int:
    """The value an implementation writes into the KV of ``token`` at ``position``.

    A 32-bit multiply-xorshift mix mapped into ``[1, 2**24)``: never 0, so a
    zeroed slot never passes; exact in float32 and int32; every intermediate
    fits int64, so torch computes the same value elementwise. NOTE: it sees
    (token, position), not the whole prefix: it catches a slot of another token
    or position, a freed or doubly allocated slot, not a slot of another
    sequence with the same token at the same position.
    """
    x = (token * 0x2545F491 + position * 0x4F6CDD1D + 0x6A09E667) & 0xFFFFFFFF
    x ^= x >> 16
    x = (x * 0x045D9F3B) & 0xFFFFFFFF
    x ^= x >> 16
    return 1 + x % 0xFFFFFF


def cached_len(s: PrefixCache, key: Key) -> int:
    """The longest ``m`` (whole pages) with every page of ``key[:m]`` cached (ignoring SWA and Mamba)."""
    m = 0
    while m + s.page_size <= len(key) and key[: m + s.page_size] in s.full:
        m += s.page_size
    return m


def matches(s: PrefixCache, key: Key, i: int) -> bool:
    """The match rule: ``match_prefix`` may return ``key[:i]``.

    Every page of ``key[:i]`` is cached (so ``i % page_size == 0``); with a
    window, every page holding one of the tokens ``[max(0, i - window), i)``
    is SWA-live; with Mamba, ``i == 0`` or a state sits at ``key[:i]``.
    """
    p = s.page_size
    if not (0 <= i <= cached_len(s, key) and i % p == 0):
        return False
    if s.window is not None and not all(key[:j] in s.swa_live for j in range(window_start(i, s.window, p), i + 1, p)):
        return False
    return not s.mamba or i == 0 or key[:i] in s.mamba_state


def match_length(s: PrefixCache, key: Key) -> int:
    """The longest ``i`` with ``matches(s, key, i)``: the length ``match_prefix`` returns. Needs no well-formed
    cache (a law may ask it of the part two caches share); ``matches(s, key, 0)`` always holds.

    >>> c = PrefixCache(2, None, False, {(1, 2): (4, 5), (1, 2, 3, 4): (6, 7)})
    >>> match_length(c, (1, 2, 3, 4, 5)), match_length(c, (1, 2, 3)), match_length(c, (9,))
    (4, 2, 0)
    """
    i = cached_len(s, key)
    while not matches(s, key, i):
        i -= s.page_size
    return i


def cached_in(s: PrefixCache, comp: Component) -> Iterable[Key]:
    """The pages ``comp`` holds: cached pages (FULL), SWA-live ones (SWA), those with a Mamba state (MAMBA)."""
    return {Component.FULL: s.full.keys(), Component.SWA: s.swa_live, Component.MAMBA: s.mamba_state.keys()}[comp]


def evictable_size(s: PrefixCache, locks: LockState, comp: Component) -> int:
    """Tokens (FULL, SWA-live) or states (MAMBA) that ``comp`` holds and no live lock covers."""
    unit = 1 if comp is Component.MAMBA else s.page_size
    return unit * sum(1 for k in cached_in(s, comp) if lock_ref_of(locks, k, comp) == 0)


def protected_size(s: PrefixCache, locks: LockState, comp: Component) -> int:
    """Tokens (FULL, SWA-live) or states (MAMBA) that ``comp`` holds and some live lock covers."""
    unit = 1 if comp is Component.MAMBA else s.page_size
    return unit * sum(1 for k in cached_in(s, comp) if lock_ref_of(locks, k, comp) > 0)


# ---------------------------------------------------------------- invariants


def inv_prefix_closed(s: PrefixCache) -> bool:
    """Every cached key is at least a page, and its one-page-shorter prefix is cached (or the root)."""
    p = s.page_size
    return all(len(k) >= p and (len(k) == p or k[:-p] in s.full) for k in s.full)


def inv_page_aligned(s: PrefixCache) -> bool:
    """Every cached key is whole pages with one slot per token of its last page."""
    p = s.page_size
    return p >= 1 and all(len(k) % p == 0 and len(xs) == p for k, xs in s.full.items())


def inv_swa_live_cached(s: PrefixCache) -> bool:
    """SWA-live pages are cached, and there are none without a (positive) window."""
    window_ok = s.window is None or s.window >= 1
    return window_ok and s.swa_live <= s.full.keys() and (s.window is not None or not s.swa_live)


def inv_mamba_cached(s: PrefixCache) -> bool:
    """Mamba states sit at cached prefixes (never the root), and there are none without Mamba."""
    return s.mamba_state.keys() <= s.full.keys() and (s.mamba or not s.mamba_state)


def inv_slots_distinct(s: PrefixCache) -> bool:
    """No KV slot and no Mamba state is held twice."""
    slots = [x for xs in s.full.values() for x in xs]
    return len(set(slots)) == len(slots) and len(set(s.mamba_state.values())) == len(s.mamba_state)


def inv_prefix(s: PrefixCache) -> bool:
    """All laws of the cache alone."""
    laws = (inv_prefix_closed, inv_page_aligned, inv_swa_live_cached, inv_mamba_cached, inv_slots_distinct)
    return all(law(s) for law in laws)


def inv_locked_cached(s: PrefixCache, locks: LockState) -> bool:
    """Every site a live lock covers is held by its component (locked pages are never evicted)."""
    return all(n == 0 or key in cached_in(s, comp) for (key, comp), n in locks.lock_ref.items())


def inv_content(s: PrefixCache, content: Mapping[SlotId, int]) -> bool:
    """Token ``t`` at position ``i`` of every cached page sits in a slot holding ``fingerprint(t, i)``."""
    p = s.page_size
    return all(content.get(x) == fingerprint(k[i], i) for k, xs in s.full.items() for i, x in enumerate(xs, len(k) - p))


def inv_verify_exact(intact: bool, error: BaseException | None) -> bool:
    """An integrity check (``verify``) flags exactly the content that differs from what was written: it raises
    ``IntegrityError`` when any part of it changed (the KV of one slot among many, one value of one tensor of a
    state) and nothing when all of it is intact.

    >>> inv_verify_exact(False, None), inv_verify_exact(True, None), inv_verify_exact(False, e.IntegrityError("x"))
    (False, True, True)
    """
    return error is None if intact else isinstance(error, e.IntegrityError)


# ---------------------------------------------------------------- predicates


def check_insert(
    s: PrefixCache, key: Key, slots: tuple[SlotId, ...], mamba_slot: MambaSlot | None
) -> e.PrefixError | None:
    """Why ``key`` with ``slots`` (and ``mamba_slot``) may not be inserted, or ``None``."""
    op, p = "insert", s.page_size
    if len(slots) != len(key):
        return e.LengthMismatch(op, key, f"{len(slots)} slots for {len(key)} tokens")
    if len(key) % p:
        return e.UnalignedKey(op, key, f"length {len(key)} is not a multiple of page size {p}")
    if mamba_slot is not None and (not s.mamba or not key):
        why = "the cache has no Mamba component" if not s.mamba else "a Mamba state cannot sit at the root"
        return e.ComponentDisabled(op, key, f"Mamba slot {mamba_slot} offered but {why}")
    if len(set(slots)) != len(slots):
        x = next(x for x in slots if slots.count(x) > 1)
        return e.SlotConflict(op, key, f"slot {x} offered for two positions (double allocation?)")
    where = {x: (k, j) for k, xs in s.full.items() for j, x in enumerate(xs, len(k) - p)}
    for i, x in enumerate(slots):
        page = key[: i - i % p + p]
        if where.get(x, (page, i)) != (page, i):
            at, j = where[x]
            return e.SlotConflict(
                op, key, f"slot {x} for position {i} is cached at position {j} of {at} (use after free?)"
            )
        if page in s.full and x in where and s.full[page] != slots[i - i % p : i - i % p + p]:
            return e.SlotConflict(op, key, f"page ending at {len(page)} is only partly the cache's slots")
    at = next((k for k, x in s.mamba_state.items() if x == mamba_slot), key)
    if mamba_slot is not None and at != key:
        return e.SlotConflict(op, key, f"Mamba slot {mamba_slot} is cached at key {at} (use after free?)")
    return None


def _check_victims(
    op: str, s: PrefixCache, victims: frozenset[Key], locks: LockState, comps: tuple[Component, ...]
) -> e.PrefixError | None:
    for v in sorted(victims):
        if v not in cached_in(s, comps[0]):
            return e.NotCached(op, v, f"not held in {comps[0].value} (evicted twice?)")
        for c in comps:
            if (n := lock_ref_of(locks, v, c)) > 0:
                return e.EvictLockedError(op, v, f"locked in {c.value} by live handles (lock_ref {n}); release first")
    return None


def check_evict_full(s: PrefixCache, victims: frozenset[Key], locks: LockState) -> e.PrefixError | None:
    """Why the pages ``victims`` may not leave the cache, or ``None``."""
    err = _check_victims("evict_full", s, victims, locks, ALL_COMPONENTS)
    if err is not None:
        return err
    stateful = sorted(victims & s.mamba_state.keys())
    if stateful:
        v = stateful[0]
        return e.EvictHoldsStateError("evict_full", v, f"holds Mamba slot {s.mamba_state[v]} (evict_mamba first)")
    for k in sorted(s.full.keys() - victims):
        if k[: -s.page_size] in victims:
            return e.EvictInteriorError("evict_full", k[: -s.page_size], f"its extension {k} stays cached")
    return None


def check_evict_swa(s: PrefixCache, victims: frozenset[Key], locks: LockState) -> e.PrefixError | None:
    """Why the pages ``victims`` may not become SWA tombstones, or ``None``."""
    if s.window is None and victims:
        return e.ComponentDisabled("evict_swa", min(victims), "the cache has no SWA component")
    return _check_victims("evict_swa", s, victims, locks, (Component.SWA,))


def check_evict_mamba(s: PrefixCache, victims: frozenset[Key], locks: LockState) -> e.PrefixError | None:
    """Why the Mamba states at ``victims`` may not be evicted, or ``None``."""
    return _check_victims("evict_mamba", s, victims, locks, (Component.MAMBA,))


# ---------------------------------------------------------------- transitions


def _without(m: Mapping[Key, _V], victims: frozenset[Key]) -> dict[Key, _V]:
    return {k: v for k, v in m.items() if k not in victims}


def _slots_of(s: PrefixCache, key: Key, length: int) -> tuple[SlotId, ...]:
    return tuple(x for i in range(s.page_size, length + 1, s.page_size) for x in s.full[key[:i]])


@icontract.require(lambda s: inv_prefix(s), "cache well-formed")
@icontract.ensure(lambda s, key, result: matches(s, key, result.length), "match obeys the match rule")
@icontract.ensure(
    lambda s, key, result: not any(matches(s, key, i) for i in range(result.length + 1, len(key) + 1)),
    "no longer prefix obeys it",
)
@icontract.ensure(lambda s, key, result: result.slots == _slots_of(s, key, result.length), "slots are the cache's")
def match_prefix(s: PrefixCache, key: Key) -> MatchResult:
    """The longest prefix of ``key`` that obeys the match rule (``matches``); changes nothing.

    The slots and state stay the cache's: the caller may read them only while
    a handle covering ``required_coverage(key[:length], ...)`` is live.
    """
    i = match_length(s, key)
    state = s.mamba_state[key[:i]] if s.mamba and i > 0 else None
    return MatchResult(i, _slots_of(s, key, i), state)


def _grown(s: PrefixCache, key: Key, r: InsertResult) -> bool:
    """The cached keys gain exactly the pages of ``key``, and cached pages keep their slots."""
    pages = {key[:i] for i in range(s.page_size, len(key) + 1, s.page_size)}
    return r.state.full.keys() == s.full.keys() | pages and all(r.state.full[k] == xs for k, xs in s.full.items())


def _offered_accounted(s: PrefixCache, slots: tuple[SlotId, ...], r: InsertResult) -> bool:
    """Each offered slot the cache did not hold is now cached or handed back, not both."""
    before = {x for xs in s.full.values() for x in xs}
    after = {x for xs in r.state.full.values() for x in xs}
    dups = set(r.dup_slots)
    return set(slots) - before == (after - before) | dups and not after & dups


def _mamba_accounted(s: PrefixCache, key: Key, mamba_slot: MambaSlot | None, r: InsertResult) -> bool:
    """An offered Mamba state is stored at ``key``, or handed back when ``key`` already had another."""
    old = s.mamba_state.get(key)
    if mamba_slot is None or old == mamba_slot:
        return r.dup_mamba is None and r.state.mamba_state == s.mamba_state
    if old is None:
        return r.dup_mamba is None and r.state.mamba_state == {**s.mamba_state, key: mamba_slot}
    return r.dup_mamba == mamba_slot and r.state.mamba_state == s.mamba_state


@icontract.require(
    lambda s, key, slots, mamba_slot: check_insert(s, key, slots, mamba_slot) is None,
    "whole pages, one fresh slot per token",
    error=lambda s, key, slots, mamba_slot: e.must(check_insert(s, key, slots, mamba_slot)),
)
@icontract.require(lambda s: inv_prefix(s), "cache well-formed")
@icontract.ensure(lambda result: inv_prefix(result.state), "cache stays well-formed")
@icontract.ensure(lambda s, key, result: _grown(s, key, result), "key cached, cached pages keep their slots")
@icontract.ensure(lambda s, key, result: result.prefix_len == cached_len(s, key), "prefix_len is what was cached")
@icontract.ensure(lambda s, slots, result: _offered_accounted(s, slots, result), "offered slots cached or handed back")
@icontract.ensure(lambda s, key, mamba_slot, result: _mamba_accounted(s, key, mamba_slot, result), "state kept or back")
def insert(s: PrefixCache, key: Key, slots: tuple[SlotId, ...], mamba_slot: MambaSlot | None = None) -> InsertResult:
    """Cache ``key`` with ``slots[i]`` holding token ``i`` (SGLang's ``insert``).

    The cache takes the slots of the pages it did not hold, and ``mamba_slot``
    when ``key`` had no state. Cached pages keep their slots; the caller's
    slots for such a page come back in ``dup_slots`` for the caller to free,
    unless they are the cache's own (a matched prefix, borrowed). New pages are
    SWA-live; insert never revives an SWA tombstone.
    """
    p, m = s.page_size, cached_len(s, key)
    dups = tuple(x for i in range(0, m, p) if s.full[key[: i + p]] != slots[i : i + p] for x in slots[i : i + p])
    new = {key[: i + p]: slots[i : i + p] for i in range(m, len(key), p)}
    swa = s.swa_live | new.keys() if s.window is not None else s.swa_live
    states, dup_mamba = dict(s.mamba_state), None
    if mamba_slot is not None and key not in states:
        states[key] = mamba_slot
    elif mamba_slot is not None and states[key] != mamba_slot:
        dup_mamba = mamba_slot
    cache = dataclasses.replace(s, full={**s.full, **new}, swa_live=frozenset(swa), mamba_state=states)
    return InsertResult(cache, m, dups, dup_mamba)


@icontract.require(
    lambda s, victims, locks: check_evict_full(s, victims, locks) is None,
    "cached, unlocked, stateless leaves",
    error=lambda s, victims, locks: e.must(check_evict_full(s, victims, locks)),
)
@icontract.require(lambda s: inv_prefix(s), "cache well-formed")
@icontract.ensure(lambda result: inv_prefix(result[0]), "cache stays well-formed")
@icontract.ensure(
    lambda s, victims, result: (
        result[0] == dataclasses.replace(s, full=_without(s.full, victims), swa_live=s.swa_live - victims)
    ),
    "exactly the victims leave",
)
@icontract.ensure(
    lambda s, victims, result: result[1] == {x for v in victims for x in s.full[v]}, "victims' slots are freed"
)
def evict_full(s: PrefixCache, victims: frozenset[Key], locks: LockState) -> tuple[PrefixCache, frozenset[SlotId]]:
    """Drop the pages ``victims`` (their SWA KV too); their KV slots pass to the caller, who frees them."""
    freed = frozenset(x for v in victims for x in s.full[v])
    return dataclasses.replace(s, full=_without(s.full, victims), swa_live=s.swa_live - victims), freed


@icontract.require(
    lambda s, victims, locks: check_evict_swa(s, victims, locks) is None,
    "SWA-live and unlocked in SWA",
    error=lambda s, victims, locks: e.must(check_evict_swa(s, victims, locks)),
)
@icontract.require(lambda s: inv_prefix(s), "cache well-formed")
@icontract.ensure(
    lambda s, victims, result: result == dataclasses.replace(s, swa_live=s.swa_live - victims),
    "exactly the victims become SWA tombstones",
)
def evict_swa(s: PrefixCache, victims: frozenset[Key], locks: LockState) -> PrefixCache:
    """Tombstone the pages ``victims`` in SWA: their window KV is freed, their full KV stays cached."""
    return dataclasses.replace(s, swa_live=s.swa_live - victims)


@icontract.require(
    lambda s, victims, locks: check_evict_mamba(s, victims, locks) is None,
    "Mamba states present and unlocked",
    error=lambda s, victims, locks: e.must(check_evict_mamba(s, victims, locks)),
)
@icontract.require(lambda s: inv_prefix(s), "cache well-formed")
@icontract.ensure(
    lambda s, victims, result: result[0] == dataclasses.replace(s, mamba_state=_without(s.mamba_state, victims)),
    "exactly the victims lose their state",
)
@icontract.ensure(lambda s, victims, result: result[1] == {s.mamba_state[v] for v in victims}, "their states are freed")
def evict_mamba(s: PrefixCache, victims: frozenset[Key], locks: LockState) -> tuple[PrefixCache, frozenset[MambaSlot]]:
    """Drop the Mamba states at ``victims``; the slots pass to the caller, who frees them."""
    freed = frozenset(s.mamba_state[v] for v in victims)
    return dataclasses.replace(s, mamba_state=_without(s.mamba_state, victims)), freed
