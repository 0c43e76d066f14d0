"""Shared ownership: a pool whose blocks several holders may hold at once, counted by a reference count.

:mod:`kvledger.spec.ledger` is single-owner: a slot is free or held by one
owner. Engines that share prefix blocks between requests (vLLM's
``KVCacheBlock.ref_cnt``) let a block be held by *several* holders at once
and keep a count of them; a block no holder holds sits on the engine's free
queue, where it is either free or an evictable cached block. Blocks are named
by a non-owning index (content key -> blocks carrying it, e.g. a hash chain's
block hashes), and a *sentinel* block may stand in for positions a holder
skips (vLLM's null block for tokens outside a sliding window): holders name
it, but it is never counted, freed or indexed.

The abstract state (:class:`SharedPool`) holds, per block, the multiset of its
holders (an owner appears once per table entry naming the block), the
engine's count, the queue's members in queue order, the keys each block
carries and the index. The laws:

* ``inv_refcount_counts_holders``: every non-sentinel block's count equals
  its number of holders (and so is never negative);
* ``inv_refcount_nonnegative``: no count is negative;
* ``inv_free_iff_unheld``: the queue holds each block at most once, and its
  members are exactly the non-sentinel blocks no holder holds;
* ``inv_sentinel_fixed``: a sentinel is never on the queue, never indexed
  and carries no key (``sentinel_count_fixed`` is its transition law: its
  count never moves);
* ``inv_index_names_carriers``: every index entry names a block carrying that
  key, and every key a block carries is indexed to it;
* ``inv_keys_match_content``: a block's key is the key of what its writer
  put in it, where that is known;
* ``inv_counters_recount``: every counter the engine keeps (free blocks,
  queue length, ...) equals a recount of what it counts.

The queue's links are :class:`kvledger.spec.lru.LruState` laws
(``inv_lru``: symmetric links, detached non-members); the queue's members are
``inv_free_iff_unheld``. ``pool_unchanged`` is the transaction law: a refused
operation leaves the abstraction exactly as it found it.

>>> from kvledger.spec.types import request
>>> s = SharedPool("kv", 3, {0: (request(1), request(2))}, {0: 2, 1: 0, 2: 0}, (1, 2))
>>> inv_shared(s)
True
>>> from kvledger.spec.ledger import allocate, new_ledger
>>> inv_shared(from_ledger(allocate(new_ledger("kv", 4), request(1), frozenset({0, 1}))))
True
>>> bad = SharedPool("kv", 3, {0: (request(1),)}, {0: 2, 1: 0, 2: 0}, (1, 2))
>>> inv_refcount_counts_holders(bad), refcount_mismatches(bad)
(False, {0: (2, 1)})
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field

from kvledger.spec.ledger import Ledger
from kvledger.spec.types import Owner

Holders = tuple[Owner, ...]
"""The holders of one block, one entry per table entry naming it (a multiset, sorted)."""


@dataclass(frozen=True)
class SharedPool:
    """Abstract state of one pool of shared blocks.

    The pool's blocks are ``range(base, base + capacity)``. ``holders[b]`` is
    the multiset of owners whose tables name ``b`` (absent: none);
    ``counts[b]`` the engine's reference count; ``queue`` the free queue's
    members from its head; ``sentinels`` the blocks that stand in for skipped
    positions; ``keys[b]`` the content keys ``b`` carries (absent: none);
    ``index[k]`` the blocks the index names under ``k``; ``content[b]`` the
    key of what was last written into ``b``, where the observer knows it.
    """

    name: str
    capacity: int
    holders: Mapping[int, Holders] = field(default_factory=dict)
    counts: Mapping[int, int] = field(default_factory=dict)
    queue: tuple[int, ...] = ()
    sentinels: frozenset[int] = frozenset()
    keys: Mapping[int, frozenset[Hashable]] = field(default_factory=dict)
    index: Mapping[Hashable, frozenset[int]] = field(default_factory=dict)
    content: Mapping[int, Hashable] = field(default_factory=dict)
    base: int = 0


def blocks_of(s: SharedPool) -> range:
    """Every block of the pool."""
    return range(s.base, s.base + s.capacity)


def holders_of(s: SharedPool, block: int) -> Holders:
    """The holders of ``block`` (empty when none)."""
    return s.holders.get(block, ())


def unheld(s: SharedPool) -> frozenset[int]:
    """The non-sentinel blocks no holder holds: what the free queue must hold."""
    return frozenset(b for b in blocks_of(s) if b not in s.sentinels and not holders_of(s, b))


def refcount_mismatches(s: SharedPool) -> dict[int, tuple[int, int]]:
    """``block -> (count, holders)`` for every non-sentinel block whose count is not its number of holders."""
    out: dict[int, tuple[int, int]] = {}
    for b in blocks_of(s):
        if b in s.sentinels:
            continue
        count, held = s.counts.get(b, 0), len(holders_of(s, b))
        if count != held:
            out[b] = (count, held)
    return out


def index_mismatches(s: SharedPool) -> list[tuple[Hashable, int, str]]:
    """``(key, block, why)`` for every index entry naming a non-carrier and every carried key not indexed."""
    out: list[tuple[Hashable, int, str]] = []
    for k, blocks in s.index.items():
        out.extend((k, b, "indexed but does not carry the key") for b in sorted(blocks) if k not in s.keys.get(b, ()))
    for b, keys in s.keys.items():
        out.extend((k, b, "carries the key but is not indexed under it") for k in keys if b not in s.index.get(k, ()))
    return out


def from_ledger(led: Ledger) -> SharedPool:
    """A single-owner pool seen as a shared one: each held slot has one holder and count 1, free slots count 0.

    Single ownership is the special case of shared ownership where no block has
    two holders, so every engine's pools can be checked by these laws; the
    free list becomes the queue (in slot order: a ledger keeps no order).
    """
    holders: dict[int, Holders] = {}
    for owner, slots in led.held.items():
        for x in slots:
            holders[x] = (*holders.get(x, ()), owner)
    counts = {x: (1 if x in holders else 0) for x in range(led.base, led.base + led.capacity)}
    return SharedPool(led.name, led.capacity, holders, counts, tuple(sorted(led.free)), base=led.base)


# ---------------------------------------------------------------- invariants


def inv_refcount_nonnegative(s: SharedPool) -> bool:
    """No block's count is negative."""
    return all(c >= 0 for c in s.counts.values())


def inv_refcount_counts_holders(s: SharedPool) -> bool:
    """Every non-sentinel block's count is its number of holders."""
    return not refcount_mismatches(s)


def inv_free_iff_unheld(s: SharedPool) -> bool:
    """The queue holds each block once, and exactly the non-sentinel blocks no holder holds."""
    return len(set(s.queue)) == len(s.queue) and frozenset(s.queue) == unheld(s)


def inv_sentinel_fixed(s: SharedPool) -> bool:
    """A sentinel is never on the queue, never indexed and carries no key."""
    if any(b in s.sentinels for b in s.queue):
        return False
    if any(s.keys.get(b) for b in s.sentinels):
        return False
    return not any(blocks & s.sentinels for blocks in s.index.values())


def inv_index_names_carriers(s: SharedPool) -> bool:
    """Every index entry names a block carrying its key; every carried key is indexed to its block."""
    return not index_mismatches(s)


def inv_keys_match_content(s: SharedPool) -> bool:
    """A block's keys name what was written into it (where the writer's key is known)."""
    return all(s.content[b] in keys for b, keys in s.keys.items() if keys and b in s.content)


def inv_shared(s: SharedPool) -> bool:
    """Every state law of a shared pool."""
    return (
        inv_refcount_nonnegative(s)
        and inv_refcount_counts_holders(s)
        and inv_free_iff_unheld(s)
        and inv_sentinel_fixed(s)
        and inv_index_names_carriers(s)
        and inv_keys_match_content(s)
    )


def inv_counters_recount(counters: Mapping[str, tuple[int, int]]) -> bool:
    """Every counter an engine keeps equals a recount of what it counts (``name -> (kept, recounted)``)."""
    return all(kept == recount for kept, recount in counters.values())


# ---------------------------------------------------------------- transition laws


def sentinel_count_fixed(before: SharedPool, after: SharedPool) -> bool:
    """No sentinel's count moved between two states."""
    return all(before.counts.get(b, 0) == after.counts.get(b, 0) for b in before.sentinels | after.sentinels)


def pool_unchanged(before: SharedPool, after: SharedPool) -> bool:
    """The transaction law of a refused operation: holders, counts, queue order, keys and index all as they were."""
    return (
        dict(before.holders) == dict(after.holders)
        and dict(before.counts) == dict(after.counts)
        and before.queue == after.queue
        and dict(before.keys) == dict(after.keys)
        and dict(before.index) == dict(after.index)
    )


def pool_differences(before: SharedPool, after: SharedPool) -> list[str]:
    """What moved between two states, block by block (for a failure message)."""
    out: list[str] = []
    for b in blocks_of(after):
        if before.counts.get(b, 0) != after.counts.get(b, 0):
            out.append(f"block {b}: count {before.counts.get(b, 0)} -> {after.counts.get(b, 0)}")
        if holders_of(before, b) != holders_of(after, b):
            out.append(
                f"block {b}: holders {list(map(str, holders_of(before, b)))} -> {list(map(str, holders_of(after, b)))}"
            )
    if before.queue != after.queue:
        gone = [b for b in before.queue if b not in after.queue]
        came = [b for b in after.queue if b not in before.queue]
        out.append(f"queue: left {gone}, joined {came}" if gone or came else "queue: reordered")
    if dict(before.keys) != dict(after.keys) or dict(before.index) != dict(after.index):
        out.append("keys or index changed")
    return out
