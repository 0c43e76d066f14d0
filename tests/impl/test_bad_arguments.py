"""Every public entry point of the reference implementation, given bad arguments (issue 17, items 6 and 7).

Each case builds a small world (a memory manager with requests in every state,
a cache with nodes, handles and an open session; an SWA cache; standalone
pools), fingerprints ALL of its state, makes one call with one bad argument
and asserts: a typed ``KVLedgerError`` whose message names the call, and the
fingerprint unchanged. The bad values are classes, not samples: wrong type
(``None``, float, bool, str, object), out of range (negative, capacity, huge),
wrong tensor kind (float, bool, 2-D, sparse, meta), foreign objects (another
manager's request, another cache's node or handle), wrong state (a request
not running, a session not open, a handle released). A Hypothesis property
throws random junk of every class at every entry point.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvledger.contracts.abstraction import abstract
from kvledger.contracts.adapters.reference import snapshot_of
from kvledger.impl import integrity
from kvledger.impl.admission import Attempt, Budget, admit, rollback
from kvledger.impl.allocators import PagedAllocator, SWATokenAllocator, TokenAllocator
from kvledger.impl.leaks import check_leaks, expected_owners
from kvledger.impl.locks import LockHandle
from kvledger.impl.lru import Linked, LRUList
from kvledger.impl.mamba import MambaPool
from kvledger.impl.memory import MemoryManager
from kvledger.impl.owners import MAX_IDENT, encode
from kvledger.impl.radix import RadixCache
from kvledger.impl.req_to_token import ReqToTokenPool
from kvledger.impl.requests import Request, Status
from kvledger.impl.slots import SlotPool
from kvledger.impl.tree import MatchResult, TreeNode
from kvledger.spec.errors import InvalidArgument, KVLedgerError, OutOfRange
from kvledger.spec.types import Component, HandleId, NodeId, Owner, OwnerKind, request, session

FULL, SWA, MAMBA = Component.FULL, Component.SWA, Component.MAMBA
REQ = request(90)


def t(*xs: int) -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.int64)


# ---------------------------------------------------------------- worlds


@dataclass
class World:
    """A memory manager with something in every state, a foreign twin, an SWA cache and standalone pools."""

    mm: MemoryManager
    other: MemoryManager  # the same build: its requests carry the same ids as ours
    running: Request
    waiting: Request
    finished: Request
    aborted: Request
    lent: Request  # a running request that resumed session 1
    node: TreeNode  # a live node of mm's cache
    evicted: TreeNode  # a node mm's cache evicted
    handle: LockHandle  # live
    released: LockHandle
    match: MatchResult  # of a cached prefix ending in a Mamba state
    spare: torch.Tensor  # a KV slot REQ holds
    swa: RadixCache
    swa_kv: SWATokenAllocator
    paged: PagedAllocator
    pool: SlotPool
    lru: LRUList[Linked]
    lru_node: Linked


def build_mm(page: int = 1) -> tuple[MemoryManager, dict[str, Any]]:
    kv: TokenAllocator | PagedAllocator = TokenAllocator(48) if page == 1 else PagedAllocator(24, page)
    mamba = MambaPool(10, ping_pong_size=1)
    mm = MemoryManager(RadixCache(kv, mamba=mamba), ReqToTokenPool(6, 24))
    mm.sessions.open(1)
    mm.sessions.open(2)
    short = mm.add_request((50, 51, 52, 53, 54))
    admit(mm, [short], Budget(64, 4))
    mm.finish(short)
    evicted = mm.cache.match_prefix(t(50, 51, 52, 53, 54)).last_node
    h = mm.cache.inc_lock_ref(evicted)
    mm.cache.dec_lock_ref(h)
    assert mm.cache.evict(FULL, 100) > 0 and evicted.parent is None
    done = mm.add_request((1, 2, 3, 4, 5, 6, 7))
    gone = mm.add_request((40, 41, 42))
    run = mm.add_request((1, 2, 3, 4, 8, 9))
    lent = mm.add_request((20, 21, 22), 1)
    admit(mm, [done, gone], Budget(64, 4))
    mm.finish(done)
    mm.abort(gone)
    admit(mm, [run, lent], Budget(64, 4))
    wait = mm.add_request((30, 31))
    node = mm.cache.match_prefix(t(1, 2, 3, 4, 5, 6, 7)).last_node
    live = mm.cache.inc_lock_ref(node)
    match = mm.cache.match_prefix(t(1, 2, 3, 4, 5, 6, 7))
    assert node.parent is not None and match.mamba_slot is not None
    spare = mm.kv.alloc(1, REQ)
    return mm, {
        "match": match,
        "spare": spare,
        "running": run,
        "waiting": wait,
        "finished": done,
        "aborted": gone,
        "lent": lent,
        "node": node,
        "evicted": evicted,
        "handle": live,
        "released": h,
    }


def build(page: int = 1) -> World:
    mm, parts = build_mm(page)
    other, _ = build_mm(page)
    swa_kv = SWATokenAllocator(16, 16)
    swa = RadixCache(swa_kv, swa_window=2)
    slots = swa_kv.alloc(4, REQ)
    swa.insert(t(1, 2, 3, 4), slots, REQ)
    paged = PagedAllocator(8, 2)
    paged.alloc(3, REQ)
    pool = SlotPool("p", 8, base=1)
    pool.alloc(3, REQ)
    lru: LRUList[Linked] = LRUList(FULL)
    a, b = Linked(1), Linked(2)
    lru.insert_mru(a)
    lru.insert_mru(b)
    return World(mm, other, swa=swa, swa_kv=swa_kv, paged=paged, pool=pool, lru=lru, lru_node=a, **parts)


_PROTOTYPE: list[World] = []


def fresh() -> World:
    """A new world, the same every time: a deep copy of one built once (building costs ten times more)."""
    if not _PROTOTYPE:
        _PROTOTYPE.append(build())
    return copy.deepcopy(_PROTOTYPE[0])


# ---------------------------------------------------------------- the fingerprint of all state


def _tensors(*ts: torch.Tensor) -> tuple[object, ...]:
    return tuple((str(x.dtype), tuple(x.shape), x.flatten().tolist()) for x in ts)


def _pool(p: SlotPool) -> tuple[object, ...]:
    return (p.available_size(), _tensors(p.owner_tag, p.origin, p.free_slots()))


def _cache(c: RadixCache) -> tuple[object, ...]:
    nodes = tuple(
        (
            n.id,
            None if n.parent is None else n.parent.id,
            n.key.tolist(),
            n.value.tolist(),
            tuple(n.refs),
            n.swa_tombstone,
            n.mamba_slot,
            sorted(x.id for x in n.children.values()),
        )
        for n in sorted(c.nodes(), key=lambda n: n.id)
    )
    lrus = tuple((comp, c.lru(comp).order(), len(c.lru(comp))) for comp in c.components)
    handles = sorted(c.live_handles().items())
    return (snapshot_of(c), nodes, lrus, sorted(c.sizes().items(), key=str), handles, c._next_id)


def _kv(kv: object) -> tuple[object, ...]:
    if isinstance(kv, SWATokenAllocator):
        return (_kv(kv.full), _kv(kv.swa), _tensors(kv.full_to_swa))
    assert isinstance(kv, TokenAllocator | PagedAllocator)
    return (_pool(kv.pool), _tensors(kv.data))


def _request(r: Request) -> tuple[object, ...]:
    return tuple(repr(getattr(r, f.name)) for f in fields(r))


def fingerprint_mm(mm: MemoryManager) -> tuple[object, ...]:
    """Everything a memory manager holds: pools (tags, provenance, free stacks, data), the request table, the
    requests' fields, the sessions, the cache (abstract snapshot, nodes, lists, counters, handles), the log."""
    mamba = mm.mamba
    return (
        {name: _pool(p) for name, p in mm.pools().items()},
        _kv(mm.kv),
        _tensors(mm.rows.table),
        None if mamba is None else _tensors(mamba.data, mamba.conv, mamba.temporal),
        {rid: _request(r) for rid, r in mm.requests.items()},
        {sid: repr(s) for sid, s in mm.sessions.slots.items()},
        _cache(mm.cache),
        (mm._next_rid, mm._step, len(mm.events), mm.fail_next),
    )


def fingerprint(w: World) -> tuple[object, ...]:
    """The state of the whole world."""
    lru = (w.lru.order(), len(w.lru), [(x.id, x.prev[0] is None, x.next[0] is None) for x in (w.lru_node,)])
    return (
        fingerprint_mm(w.mm),
        fingerprint_mm(w.other),
        _cache(w.swa),
        _kv(w.swa_kv),
        _kv(w.paged),
        _pool(w.pool),
        lru,
    )


# ---------------------------------------------------------------- classes of bad values


def sparse(*xs: int) -> torch.Tensor:
    return t(*xs).to_sparse()


def meta(*xs: int) -> torch.Tensor:
    return t(*xs).to("meta")


JUNK = [None, 1.5, True, "1", b"1", object(), [1], {1: 2}]
"""Wrong type for any argument (each a class: nothing, a float, a bool, text, bytes, an object, containers)."""

BAD_AMOUNTS = [*JUNK, -1, -(2**70), float("nan")]
"""What no amount (``spec.domains.is_amount``: ``evict``'s, any size >= 0) is."""
BAD_SIZES = [*BAD_AMOUNTS, 2**63]
"""What no count (``spec.domains.is_count``) is: an amount's junk, and past int64."""
BAD_OWNERS = [
    None,
    1,
    "req:1",
    (OwnerKind.REQUEST, 1),
    Owner(OwnerKind.REQUEST, -1),
    Owner(OwnerKind.REQUEST, MAX_IDENT + 1),
    Owner(OwnerKind.REQUEST, 2**70),
    Owner(OwnerKind.REQUEST, 1.0),  # type: ignore[arg-type]
    Owner(OwnerKind.REQUEST, True),
    Owner(OwnerKind.REQUEST, None),  # type: ignore[arg-type]
    Owner("req", 1),  # type: ignore[arg-type]
    Owner(OwnerKind.REQUEST, 1, "full"),  # type: ignore[arg-type]
]


def bad_ids(size: int) -> list[object]:
    return [*JUNK, -1, size, 2**70, -(2**70)]


def bad_index_tensors(size: int) -> list[object]:
    """Index tensors no pool of ``size`` slots may take (reserved slot 0 aside: it depends on the pool)."""
    return [
        None,
        [1, 2],
        (1, 2),
        torch.tensor([1.0, 2.0]),
        torch.tensor([True, False]),
        torch.tensor([[1, 2]]),
        torch.tensor(1),
        sparse(1, 2),
        meta(1, 2),
        t(-1),
        t(size),
        t(2**62),
        torch.tensor([1 + 0j]),
    ]


BAD_TOKENS = [None, 5, 1.5, "abc", b"\x01\x02", (1.5, 2), (1, None), (-1, 2), (2**64,), (1, "2"), {1, 2}, [[1]]]
BAD_COMPONENTS = [None, "full", 0, 1.5, Component, OwnerKind.NODE]
BAD_SESSIONS = [*JUNK, -1, MAX_IDENT + 1, 2**70]


def other_request(w: World, r: Request) -> Request:
    """The foreign manager's request with ``r``'s id (abort/finish of it must not touch ours)."""
    return w.other.requests[r.rid]


def bad_requests(w: World) -> list[object]:
    forged = Request(w.running.rid, w.running.tokens)
    forged.status, forged.row = Status.RUNNING, w.running.row
    return [*JUNK, other_request(w, w.running), other_request(w, w.waiting), forged, w.running.rid]


def bad_nodes(w: World) -> list[object]:
    foreign = w.other.cache.match_prefix(t(1, 2, 3, 4, 5, 6, 7)).last_node
    return [*JUNK, 0, w.evicted, foreign, w.lru_node, NodeId(w.node.id)]


def bad_handles(w: World) -> list[object]:
    h = w.handle
    return [
        *JUNK,
        h.id,
        tuple(h),
        w.released,
        w.other.cache.inc_lock_ref(w.other.cache.match_prefix(t(1, 2, 3, 4, 5, 6, 7)).last_node),
        LockHandle(HandleId(999), h.table, h.node_id, h.counters),
        LockHandle(None, h.table, h.node_id, h.counters),  # type: ignore[arg-type]
        LockHandle([1], h.table, h.node_id, h.counters),  # type: ignore[arg-type]
    ]


# ---------------------------------------------------------------- entry points: (name, call, bad values)

Call = Callable[[World, Any], object]
Bad = Callable[[World], list[object]]


def each(values: list[object]) -> Bad:
    return lambda w: values


def kv_args(w: World, x: object, which: int) -> tuple[object, object, object]:
    """(slots, tokens, positions) of a valid KV write of the running request's first two slots, one replaced."""
    r = w.running
    assert r.row is not None
    args: list[object] = [w.mm.rows.table[r.row, 2:4].clone(), t(3, 4), t(2, 3)]
    args[which] = x
    return args[0], args[1], args[2]


def _swa_node(w: World) -> TreeNode:
    return next(n for n in w.swa.nodes() if n.parent is not None)


ENTRY_POINTS: list[tuple[str, Call, Bad]] = [
    # ---- pools: sizes, owners, index tensors, ids
    ("SlotPool.alloc n", lambda w, x: w.pool.alloc(x, REQ), each(BAD_SIZES)),
    ("SlotPool.alloc owner", lambda w, x: w.pool.alloc(1, x), each(BAD_OWNERS)),
    ("SlotPool.alloc_ids n", lambda w, x: w.pool.alloc_ids(x, REQ), each(BAD_SIZES)),
    ("SlotPool.free indices", lambda w, x: w.pool.free(x, REQ), each([*bad_index_tensors(9), t(0), t(1, 1)])),
    ("SlotPool.free owner", lambda w, x: w.pool.free(t(1), x), each(BAD_OWNERS)),
    ("SlotPool.transfer indices", lambda w, x: w.pool.transfer(x, REQ, request(91)), each(bad_index_tensors(9))),
    ("SlotPool.transfer src", lambda w, x: w.pool.transfer(t(1), x, request(91)), each(BAD_OWNERS)),
    ("SlotPool.transfer dst", lambda w, x: w.pool.transfer(t(1), REQ, x), each(BAD_OWNERS)),
    ("SlotPool.owner_of", lambda w, x: w.pool.owner_of(x), each(bad_ids(9))),
    ("SlotPool.held_by", lambda w, x: w.pool.held_by(x), each(BAD_OWNERS)),
    ("SlotPool.code_of owner", lambda w, x: w.pool.code_of(x, "code_of"), each(BAD_OWNERS)),
    ("SlotPool.free_all_of", lambda w, x: w.pool.free_all_of(x), each(BAD_OWNERS)),
    ("TokenAllocator.alloc n", lambda w, x: w.mm.kv.alloc(x, REQ), each(BAD_SIZES)),
    ("TokenAllocator.alloc owner", lambda w, x: w.mm.kv.alloc(2, x), each(BAD_OWNERS)),
    (
        "TokenAllocator.free indices",
        lambda w, x: w.mm.kv.free(x, w.running.owner),
        each([*bad_index_tensors(49), t(0)]),
    ),
    ("TokenAllocator.free owner", lambda w, x: w.mm.kv.free(t(10), x), each(BAD_OWNERS)),
    (
        "TokenAllocator.write_fingerprint slots",
        lambda w, x: w.mm.kv.write_fingerprint(*kv_args(w, x, 0)),
        each([*bad_index_tensors(49), t(0, 5), t(5, 5), t(5)]),
    ),
    (
        "TokenAllocator.write_fingerprint tokens",
        lambda w, x: w.mm.kv.write_fingerprint(*kv_args(w, x, 1)),
        each([*bad_index_tensors(49)[:9], t(-1, 2), t(1)]),
    ),
    (
        "TokenAllocator.write_fingerprint positions",
        lambda w, x: w.mm.kv.write_fingerprint(*kv_args(w, x, 2)),
        each([*bad_index_tensors(49)[:9], t(-1, 2), t(1, 2, 3)]),
    ),
    ("TokenAllocator.verify slots", lambda w, x: w.mm.kv.verify(*kv_args(w, x, 0)), each(bad_index_tensors(49))),
    ("PagedAllocator.alloc n", lambda w, x: w.paged.alloc(x, REQ), each(BAD_SIZES)),
    ("PagedAllocator.alloc owner", lambda w, x: w.paged.alloc(2, x), each(BAD_OWNERS)),
    (
        "PagedAllocator.free indices",
        lambda w, x: w.paged.free(x, REQ),
        each([*bad_index_tensors(18), t(0, 1), t(2), t(2, 3, 2, 3), t(3, 4)]),
    ),
    ("PagedAllocator.free owner", lambda w, x: w.paged.free(t(2, 3), x), each(BAD_OWNERS)),
    ("PagedAllocator.transfer dst", lambda w, x: w.paged.transfer(t(2, 3), REQ, x), each(BAD_OWNERS)),
    ("PagedAllocator.pages_for", lambda w, x: w.paged.pages_for(x), each(BAD_SIZES)),
    ("PagedAllocator.tokens_of", lambda w, x: w.paged.tokens_of(x), each([*bad_index_tensors(9), t(0)])),
    ("PagedAllocator.fresh_pages", lambda w, x: w.paged.fresh_pages(x), each([None, 1, "ab", [1], t(1)])),
    (
        "PagedAllocator.write_fingerprint slots",
        lambda w, x: w.paged.write_fingerprint(x, t(1, 2), t(0, 1)),
        each([*bad_index_tensors(18), t(0, 1), t(1, 2), t(18, 2)]),
    ),
    ("SWATokenAllocator.alloc n", lambda w, x: w.swa_kv.alloc(x, REQ), each(BAD_SIZES)),
    ("SWATokenAllocator.alloc owner", lambda w, x: w.swa_kv.alloc(1, x), each(BAD_OWNERS)),
    ("SWATokenAllocator.free indices", lambda w, x: w.swa_kv.free(x, REQ), each(bad_index_tensors(17))),
    ("SWATokenAllocator.free owner", lambda w, x: w.swa_kv.free(t(5), x), each(BAD_OWNERS)),
    ("SWATokenAllocator.free_swa indices", lambda w, x: w.swa_kv.free_swa(x, REQ), each(bad_index_tensors(17))),
    ("SWATokenAllocator.free_swa owner", lambda w, x: w.swa_kv.free_swa(t(5), x), each(BAD_OWNERS)),
    ("SWATokenAllocator.transfer dst", lambda w, x: w.swa_kv.transfer(t(5), REQ, x), each(BAD_OWNERS)),
    ("SWATokenAllocator.translate", lambda w, x: w.swa_kv.translate(x), each(bad_index_tensors(17))),
    (
        "SWATokenAllocator.write_fingerprint slots",
        lambda w, x: w.swa_kv.write_fingerprint(x, t(1), t(0)),
        each([*bad_index_tensors(17), t(0)]),
    ),
    ("ReqToTokenPool.alloc owner", lambda w, x: w.mm.rows.alloc(x), each(BAD_OWNERS)),
    ("ReqToTokenPool.free row", lambda w, x: w.mm.rows.free(x, w.running.owner), each(bad_ids(6))),
    ("ReqToTokenPool.free owner", lambda w, x: w.mm.rows.free(w.running.row, x), each(BAD_OWNERS)),
    ("ReqToTokenPool.transfer row", lambda w, x: w.mm.rows.transfer(x, w.running.owner, REQ), each(bad_ids(6))),
    ("ReqToTokenPool.write row", lambda w, x: w.mm.rows.write(x, 0, t(1), w.running.owner), each(bad_ids(6))),
    (
        "ReqToTokenPool.write start",
        lambda w, x: w.mm.rows.write(w.running.row, x, t(1), w.running.owner),
        each([*JUNK, -1, 24, 2**70]),
    ),
    (
        "ReqToTokenPool.write slots",
        lambda w, x: w.mm.rows.write(w.running.row, 0, x, w.running.owner),
        each([*bad_index_tensors(49)[:9], t(-1), t(*range(25))]),
    ),
    (
        "ReqToTokenPool.write owner",
        lambda w, x: w.mm.rows.write(w.running.row, 0, t(1), x),
        each([*BAD_OWNERS, request(1)]),
    ),
    ("ReqToTokenPool.read row", lambda w, x: w.mm.rows.read(x, 0, 1), each(bad_ids(6))),
    ("ReqToTokenPool.read start", lambda w, x: w.mm.rows.read(0, x, 1), each([*JUNK, -1, 2])),
    ("ReqToTokenPool.read end", lambda w, x: w.mm.rows.read(0, 0, x), each([*JUNK, -1, 25])),
    ("MambaPool.alloc n", lambda w, x: w.mm.mamba.alloc(x, REQ), each(BAD_SIZES)),  # type: ignore[union-attr]
    ("MambaPool.alloc_request_state", lambda w, x: w.mm.mamba.alloc_request_state(x), each(BAD_OWNERS)),  # type: ignore[union-attr]
    ("MambaPool.free", lambda w, x: w.mm.mamba.free(x, REQ), each(bad_index_tensors(10))),  # type: ignore[union-attr]
    (
        "MambaPool.copy_state src",
        lambda w, x: w.mm.mamba.copy_state(x, w.running.mamba.state, w.running.owner),  # type: ignore[union-attr]
        each(bad_ids(10)),
    ),
    (
        "MambaPool.copy_state dst",
        lambda w, x: w.mm.mamba.copy_state(w.running.mamba.state, x, w.running.owner),  # type: ignore[union-attr]
        each(bad_ids(10)),
    ),
    (
        "MambaPool.copy_state owner",
        lambda w, x: w.mm.mamba.copy_state(0, w.running.mamba.state, x),  # type: ignore[union-attr]
        each(BAD_OWNERS),
    ),
    ("MambaPool.write_fingerprint slot", lambda w, x: w.mm.mamba.write_fingerprint(x, 7), each(bad_ids(10))),  # type: ignore[union-attr]
    (
        "MambaPool.write_fingerprint value",
        lambda w, x: w.mm.mamba.write_fingerprint(0, x),  # type: ignore[union-attr]
        each([*JUNK, -1, 2**64]),
    ),
    ("MambaPool.verify slot", lambda w, x: w.mm.mamba.verify(x, 7), each(bad_ids(10))),  # type: ignore[union-attr]
    (
        "TokenAllocator.transfer indices",
        lambda w, x: w.mm.kv.transfer(x, w.running.owner, REQ),
        each(bad_index_tensors(49)),
    ),
    ("TokenAllocator.transfer dst", lambda w, x: w.mm.kv.transfer(t(10), w.running.owner, x), each(BAD_OWNERS)),
    ("PagedAllocator.verify slots", lambda w, x: w.paged.verify(x, t(1, 2), t(0, 1)), each(bad_index_tensors(18))),
    ("SWATokenAllocator.verify slots", lambda w, x: w.swa_kv.verify(x, t(1), t(0)), each(bad_index_tensors(17))),
    ("MambaPool.transfer indices", lambda w, x: w.mm.mamba.transfer(x, REQ, request(91)), each(bad_index_tensors(10))),  # type: ignore[union-attr]
    ("MambaPool.transfer dst", lambda w, x: w.mm.mamba.transfer(t(0), REQ, x), each(BAD_OWNERS)),  # type: ignore[union-attr]
    # ---- the radix cache
    (
        "RadixCache.match_prefix",
        lambda w, x: w.mm.cache.match_prefix(x),
        each(BAD_TOKENS[:4] + bad_index_tensors(49)[3:9]),
    ),
    ("RadixCache.insert key", lambda w, x: w.mm.cache.insert(x, t(1, 2), REQ), each(BAD_TOKENS)),
    (
        "RadixCache.insert value",
        lambda w, x: w.mm.cache.insert(t(60, 61), x, w.running.owner),
        each([*bad_index_tensors(49), t(0, 5), t(5, 5), t(3)]),
    ),
    ("RadixCache.insert owner", lambda w, x: w.mm.cache.insert(t(60), t(5), x), each(BAD_OWNERS)),
    (
        "RadixCache.insert mamba_slot",
        lambda w, x: w.mm.cache.insert(t(60), w.spare, REQ, mamba_slot=x),
        each([1.5, True, "1", -1, 10, 2**70, [1]]),
    ),
    ("RadixCache.inc_lock_ref", lambda w, x: w.mm.cache.inc_lock_ref(x), bad_nodes),
    ("RadixCache.dec_lock_ref", lambda w, x: w.mm.cache.dec_lock_ref(x), bad_handles),
    ("RadixCache.is_live", lambda w, x: w.mm.cache.is_live(x), each(JUNK)),
    ("RadixCache.evict component", lambda w, x: w.mm.cache.evict(x, 1), each([*BAD_COMPONENTS, SWA])),
    ("RadixCache.evict n", lambda w, x: w.mm.cache.evict(FULL, x), each(BAD_AMOUNTS)),
    ("RadixCache.evictable_size", lambda w, x: w.mm.cache.evictable_size(x), each([*BAD_COMPONENTS, SWA])),
    ("RadixCache.protected_size", lambda w, x: w.mm.cache.protected_size(x), each([*BAD_COMPONENTS, SWA])),
    ("RadixCache.handles_covering ident", lambda w, x: w.mm.cache.handles_covering(x, FULL), each(JUNK)),
    ("RadixCache.handles_covering comp", lambda w, x: w.mm.cache.handles_covering(1, x), each(BAD_COMPONENTS)),
    ("RadixCache.node", lambda w, x: w.mm.cache.node(x), each([*JUNK, -1, 10**6])),
    ("RadixCache.lru", lambda w, x: w.mm.cache.lru(x), each([*BAD_COMPONENTS, SWA])),
    ("RadixCache.prefix", lambda w, x: w.mm.cache.prefix(x), bad_nodes),
    ("RadixCache.holds node", lambda w, x: w.mm.cache.holds(x, FULL), bad_nodes),
    ("RadixCache.holds comp", lambda w, x: w.mm.cache.holds(w.node, x), each(BAD_COMPONENTS)),
    (
        "RadixCache.mamba_copy_on_write match",
        lambda w, x: w.mm.cache.mamba_copy_on_write(x, REQ),
        each(JUNK),
    ),
    (
        "RadixCache.mamba_copy_on_write owner",
        lambda w, x: w.mm.cache.mamba_copy_on_write(w.match, x),
        each(BAD_OWNERS),
    ),
    ("RadixCache.verify match", lambda w, x: w.mm.cache.verify(x, t(1)), each(JUNK)),
    ("SWA RadixCache.insert value", lambda w, x: w.swa.insert(t(7, 8), x, REQ), each(bad_index_tensors(17))),
    ("SWA RadixCache.inc_lock_ref", lambda w, x: w.swa.inc_lock_ref(x), bad_nodes),
    ("SWA RadixCache.evict", lambda w, x: w.swa.evict(x, 1), each([*BAD_COMPONENTS, MAMBA])),
    # ---- LRU lists
    ("LRUList.insert_mru", lambda w, x: w.lru.insert_mru(x), lambda w: [*JUNK, w.lru_node]),
    ("LRUList.remove", lambda w, x: w.lru.remove(x), each([*JUNK, Linked(7)])),
    ("LRUList.touch", lambda w, x: w.lru.touch(x), each([*JUNK, Linked(7)])),
    (
        "LRUList.place",
        lambda w, x: w.lru.place(x),
        lambda w: [None, 1, "ab", [None], [w.lru_node, w.lru_node], [Linked(7)]],
    ),
    ("LRUList.insert_behind", lambda w, x: w.lru.insert_behind(w.lru_node, x), lambda w: [*JUNK, w.lru_node]),
    ("LRUList.insert_ahead_of anchor", lambda w, x: w.lru.insert_ahead_of(x, Linked(8)), each([*JUNK, Linked(7)])),
    ("LRUList.touch_all", lambda w, x: w.lru.touch_all(x), lambda w: [None, 1, [None], [w.lru_node, w.lru_node]]),
    ("LRUList.more_recent", lambda w, x: w.lru.more_recent(x), each([*JUNK, Linked(7)])),
    # ---- the memory manager: requests, sessions, admission
    ("MemoryManager.add_request tokens", lambda w, x: w.mm.add_request(x), each([*BAD_TOKENS, (), tuple(range(25))])),
    ("MemoryManager.add_request session", lambda w, x: w.mm.add_request((1, 2), x), each([*BAD_SESSIONS[1:], 3])),
    (
        "MemoryManager.extend req",
        lambda w, x: w.mm.extend(x, (5,)),
        lambda w: [*bad_requests(w), w.waiting, w.finished],
    ),
    ("MemoryManager.extend tokens", lambda w, x: w.mm.extend(w.running, x), each(BAD_TOKENS)),
    ("MemoryManager.extend ahead", lambda w, x: w.mm.extend(w.running, (5,), x), each([*JUNK, -1, -100, 2**70])),
    ("MemoryManager.finish", lambda w, x: w.mm.finish(x), lambda w: [*bad_requests(w), w.waiting, w.finished]),
    ("MemoryManager.chunk", lambda w, x: w.mm.chunk(x), lambda w: [*bad_requests(w), w.waiting, w.aborted]),
    ("MemoryManager.retract", lambda w, x: w.mm.retract(x), lambda w: [*bad_requests(w), w.waiting, w.finished]),
    ("MemoryManager.abort", lambda w, x: w.mm.abort(x), lambda w: [*bad_requests(w), w.finished, w.aborted]),
    ("MemoryManager.alloc_kv n", lambda w, x: w.mm.alloc_kv(REQ, x), each([*BAD_SIZES, 2**70])),
    ("MemoryManager.alloc_kv owner", lambda w, x: w.mm.alloc_kv(x, 60), each(BAD_OWNERS)),
    ("MemoryManager.alloc_mamba", lambda w, x: w.mm.alloc_mamba(x), each(BAD_OWNERS)),
    ("MemoryManager.free_mamba", lambda w, x: w.mm.free_mamba(REQ, x), each([*JUNK, (1, ())])),
    ("MemoryManager.write_kv req", lambda w, x: w.mm.write_kv(x, 0, 1), bad_requests),
    ("MemoryManager.write_kv end", lambda w, x: w.mm.write_kv(w.running, 0, x), each([*JUNK, 100])),
    ("MemoryManager.own", lambda w, x: w.mm.own("own", x), bad_requests),
    ("MemoryManager.round_up", lambda w, x: w.mm.round_up(x), each(BAD_SIZES)),
    ("Sessions.open", lambda w, x: w.mm.sessions.open(x), each([*BAD_SESSIONS, 1])),
    ("Sessions.close", lambda w, x: w.mm.sessions.close(x), each([*BAD_SESSIONS, 3, 1])),
    ("Sessions.resume", lambda w, x: w.mm.sessions.resume(x), lambda w: [*bad_requests(w), w.lent]),
    ("Sessions.save", lambda w, x: w.mm.sessions.save(x), lambda w: [*bad_requests(w), w.running]),
    ("Sessions.unresume", lambda w, x: w.mm.sessions.unresume(x), lambda w: [*bad_requests(w), w.running]),
    ("Sessions.extend_resumed", lambda w, x: w.mm.sessions.extend_resumed(x), lambda w: [*bad_requests(w), w.waiting]),
    ("Sessions.free_tail slot", lambda w, x: w.mm.sessions.free_tail(x, 0), each([*JUNK, 1])),
    ("Sessions.free_tail start", lambda w, x: w.mm.sessions.free_tail(w.mm.sessions.slots[2], x), each([*JUNK, -1])),
    ("Sessions.release_state", lambda w, x: w.mm.sessions.release_state(x), each(JUNK)),
    (
        "admit waiting",
        lambda w, x: admit(w.mm, x, Budget(64, 4)),
        lambda w: [*JUNK[:6], [None], [other_request(w, w.waiting)], [w.waiting, 5]],
    ),
    (
        "admit budget",
        lambda w, x: admit(w.mm, [w.waiting], x),
        each([*JUNK, (64, 4), Budget(-1, 4), Budget(64, 1.5), Budget(None, 1)]),
    ),  # type: ignore[arg-type]
    ("admit mm", lambda w, x: admit(x, [w.waiting], Budget(64, 4)), each(JUNK)),
    ("rollback", lambda w, x: rollback(w.mm, x), lambda w: [*JUNK, Attempt(other_request(w, w.running))]),
    ("check_leaks", lambda w, x: check_leaks(x), each(JUNK)),
    ("expected_owners", lambda w, x: expected_owners(x), each(JUNK)),
    # ---- constructors
    ("SlotPool.__init__ capacity", lambda w, x: SlotPool("p", x), each([*BAD_SIZES, 0])),
    ("SlotPool.__init__ base", lambda w, x: SlotPool("p", 4, base=x), each(BAD_SIZES)),
    ("SlotPool.__init__ device", lambda w, x: SlotPool("p", 4, device=x), each([*JUNK[:6], "nope", "cuda:x"])),
    ("SlotPool.__init__ name", lambda w, x: SlotPool(x, 4), each([None, 1, b"p"])),
    ("TokenAllocator.__init__ size", lambda w, x: TokenAllocator(x), each(BAD_SIZES)),
    ("PagedAllocator.__init__ page_size", lambda w, x: PagedAllocator(4, x), each([*BAD_SIZES, 0])),
    ("SWATokenAllocator.__init__ swa_size", lambda w, x: SWATokenAllocator(4, x), each(BAD_SIZES)),
    ("ReqToTokenPool.__init__ size", lambda w, x: ReqToTokenPool(x, 8), each(BAD_SIZES)),
    ("ReqToTokenPool.__init__ max_context_len", lambda w, x: ReqToTokenPool(4, x), each([*BAD_SIZES, 0])),
    ("MambaPool.__init__ size", lambda w, x: MambaPool(x), each(BAD_SIZES)),
    ("MambaPool.__init__ ping_pong_size", lambda w, x: MambaPool(4, ping_pong_size=x), each(BAD_SIZES)),
    ("MambaPool.__init__ conv_shape", lambda w, x: MambaPool(4, conv_shape=x), each([None, 4, (0,), (1.5,), [4]])),
    ("MambaPool.__init__ dtype", lambda w, x: MambaPool(4, dtype=x), each([None, "float32", torch.int64])),
    ("RadixCache.__init__ kv", lambda w, x: RadixCache(x), each([*JUNK, SlotPool("p", 4)])),
    ("RadixCache.__init__ page_size", lambda w, x: RadixCache(TokenAllocator(4), page_size=x), each(BAD_SIZES[1:])),
    (
        "RadixCache.__init__ swa_window",
        lambda w, x: RadixCache(SWATokenAllocator(4, 4), swa_window=x),
        each(BAD_SIZES[1:]),
    ),
    (
        "RadixCache.__init__ mamba",
        lambda w, x: RadixCache(TokenAllocator(4), mamba=x),
        each([*JUNK[1:], MambaPool(2, device="meta")]),
    ),
    ("MemoryManager.__init__ cache", lambda w, x: MemoryManager(x, ReqToTokenPool(2, 4)), lambda w: [*JUNK, w.swa]),
    (
        "MemoryManager.__init__ rows",
        lambda w, x: MemoryManager(RadixCache(TokenAllocator(4)), x),
        each([*JUNK, SlotPool("p", 2)]),
    ),
    ("LRUList.__init__", lambda w, x: LRUList(x), each(BAD_COMPONENTS)),
    ("encode", lambda w, x: encode(x), each(BAD_OWNERS)),
    (
        "fingerprint",
        lambda w, x: integrity.fingerprint(x, t(0)),
        each([None, 1, torch.tensor([1.5]), torch.tensor([True])]),
    ),
    ("fingerprint_one", lambda w, x: integrity.fingerprint_one(x, 0), each(JUNK)),
]


def _op(name: str) -> str:
    """The call a message must name: the method's own name, as errors write it."""
    method = name.removeprefix("SWA ").split(" ")[0].split(".")[-1]
    return {
        "alloc_ids": "alloc",
        "alloc_request_state": "alloc",
        "insert_mru": "lru_insert_mru",
        "insert_behind": "lru_insert",
        "insert_ahead_of": "lru_insert",
        "remove": "lru_remove",
        "touch": "lru_touch",
        "place": "lru_touch",
        "touch_all": "lru_touch",
        "open": "open_session",
        "close": "close_session",
        "admit": "admit",
        "alloc_mamba": "alloc_mamba",
        "alloc_kv": "alloc",
        "__init__": "create",
    }.get(method, method)


def cases() -> Iterator[Any]:
    probe = fresh()
    for name, call, bad in ENTRY_POINTS:
        for i, value in enumerate(bad(probe)):
            yield pytest.param(name, call, bad, i, id=f"{name}-{i}-{type(value).__name__}")


ALL_CASES = list(cases())


@pytest.mark.parametrize(("name", "call", "bad", "i"), ALL_CASES)
def test_bad_argument_is_refused_with_state_unchanged(name: str, call: Call, bad: Bad, i: int) -> None:
    w = fresh()
    value = bad(w)[i]
    before = fingerprint(w)
    with pytest.raises(KVLedgerError) as info:
        call(w, value)
    assert _op(name) in str(info.value), f"{name}: the message does not name the call: {info.value}"
    assert fingerprint(w) == before, f"{name}({value!r:.60}): a rejected call changed state"


UNCHECKED = {
    "SlotPool.release": "no checks by design: callers validate first (documented)",
    "SlotPool.retag": "no checks by design (documented)",
    "SlotPool.retag_code": "no checks by design (documented)",
    "SlotPool.check_held": "takes indices as_index validated (documented)",
    "SlotPool.has_duplicates": "takes in-range indices (documented)",
    "SlotPool.claim": "returns False for anything it does not show (then callers validate)",
    "SlotPool.as_index": "the index validation itself (tested through every free/transfer)",
    "SlotPool.check_alloc": "the size validation itself (tested through every alloc)",
    "PagedAllocator.whole_pages": "a query; None for anything that is not shown to be whole pages",
    "PagedAllocator.pages_of": "the paged index validation itself (tested through free/transfer)",
    "MemoryManager.event": "the provenance log (an op name and a label)",
    "RadixCache.live_handles": "no arguments",
    "RadixTree.nodes": "no arguments",
    "RadixCache.revisit": "builds the error a bounded walk raises (an op name and the node it met again)",
    "Sessions.spec_slot": "the abstraction of one of this manager's own session slots (called by Sessions.check)",
}


def test_every_public_entry_point_is_in_the_table() -> None:
    """A public method that takes arguments is in ``ENTRY_POINTS`` or named, with its reason, in ``UNCHECKED``."""
    import inspect

    from kvledger.impl.session import Sessions

    covered = {name.split(" ")[0].removeprefix("SWA ") for name, _, _ in ENTRY_POINTS} | set(UNCHECKED)
    classes = [SlotPool, TokenAllocator, PagedAllocator, SWATokenAllocator, ReqToTokenPool, MambaPool]
    classes += [RadixCache, LRUList, MemoryManager, Sessions]
    missing = []
    for cls in classes:
        for attr, fn in inspect.getmembers(cls, inspect.isfunction):
            params = list(inspect.signature(fn).parameters)[1:]
            if attr.startswith("_") or not params:
                continue
            owner = next(c.__name__ for c in cls.__mro__ if attr in c.__dict__)
            if f"{cls.__name__}.{attr}" not in covered and f"{owner}.{attr}" not in covered:
                missing.append(f"{cls.__name__}.{attr}")
    assert not missing, f"public entry points with no bad-argument case: {missing}"


# ---------------------------------------------------------------- random junk


def junk(w: World) -> st.SearchStrategy[object]:
    """Random bad (and sometimes good) values of every class."""
    return st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**70), 2**70),
        st.integers(-3, 60),
        st.floats(allow_nan=True),
        st.text(max_size=3),
        st.binary(max_size=3),
        st.lists(st.integers(-3, 60), max_size=3),
        st.tuples(st.integers(-3, 60), st.floats()),
        st.sampled_from([*BAD_OWNERS, REQ, w.running.owner, request(1), session(1)]),
        st.sampled_from([*BAD_COMPONENTS, FULL, SWA, MAMBA]),
        st.lists(st.integers(-3, 60), min_size=1, max_size=4).flatmap(
            lambda xs: st.sampled_from(
                [
                    t(*xs),
                    t(*xs).to(torch.int32),
                    t(*xs).float(),
                    t(*xs).view(1, -1),
                    t(*xs).to_sparse(),
                    t(*xs).to("meta"),
                    t(*xs).to(torch.uint8) if min(xs) >= 0 else t(*xs),
                ]
            )
        ),
        st.sampled_from(bad_requests(w) + bad_handles(w) + bad_nodes(w)),
    )


@settings(max_examples=400, deadline=None)
@given(data=st.data(), entry=st.sampled_from(ENTRY_POINTS))
def test_random_junk_gets_a_typed_error_and_changes_nothing(data: st.DataObject, entry: tuple[str, Call, Bad]) -> None:
    name, call, _ = entry
    w = fresh()
    value = data.draw(junk(w), label="value")
    before = fingerprint(w)
    try:
        call(w, value)
    except KVLedgerError:
        assert fingerprint(w) == before, f"{name}({value!r:.60}): a rejected call changed state"


# ---------------------------------------------------------------- alloc(0) (item 7)


@pytest.mark.parametrize(
    "make",
    [
        lambda: TokenAllocator(4),
        lambda: PagedAllocator(4, 2),
        lambda: SWATokenAllocator(4, 4),
        lambda: MambaPool(4),
        lambda: SlotPool("p", 4),
    ],
    ids=["token", "paged", "swa", "mamba", "slot_pool"],
)
def test_alloc_zero_is_empty_and_negative_refused(make: Callable[[], Any]) -> None:
    a = make()
    a.alloc(1, REQ)
    free = a.available_size()
    got = a.alloc(0, REQ)
    assert isinstance(got, torch.Tensor) and got.numel() == 0 and got.dtype == torch.int64
    assert a.available_size() == free
    with pytest.raises(KVLedgerError, match="alloc"):
        a.alloc(-1, REQ)
    assert a.available_size() == free


def test_alloc_zero_when_full_and_through_the_manager() -> None:
    w = fresh()
    mm = w.mm
    mm.kv.alloc(mm.kv.available_size(), REQ)  # NOTE: full, and nothing evictable needed for 0
    before = fingerprint_mm(mm)
    mm.fail_next = 0
    assert mm.alloc_kv(w.running.owner, 0).numel() == 0
    assert mm.kv.alloc(0, REQ).numel() == 0
    assert fingerprint_mm(mm) == before
    with pytest.raises(KVLedgerError, match="alloc"):
        mm.alloc_kv(REQ, -1)
    assert fingerprint_mm(mm) == before


def test_the_foreign_request_class_is_what_freed_ours() -> None:
    """Without the ownership check, aborting another manager's request with our running request's id freed ours."""
    w = fresh()
    before = fingerprint_mm(w.mm)
    with pytest.raises(KVLedgerError, match="abort"):
        w.mm.abort(other_request(w, w.running))
    assert fingerprint_mm(w.mm) == before and w.running.status is Status.RUNNING


@pytest.mark.parametrize("make", [lambda: TokenAllocator(8), lambda: PagedAllocator(4, 2), lambda: MambaPool(4)])
@pytest.mark.parametrize("form", ["ndarray", "list"])
def test_a_transfer_of_host_ids_is_refused_with_the_pool_unchanged(make: Callable[[], Any], form: str) -> None:
    """Found by the pool machine's non-tensor sweep: ``transfer`` took a numpy array through the pool's fast path for
    its own host ids, where ``free`` (and a paged pool's ``transfer``) refuse it; a caller's ids are a tensor."""
    pool = make()
    got = pool.alloc(2, request(1))
    host = got.numpy().copy() if form == "ndarray" else got.tolist()
    before = abstract(pool)
    with pytest.raises(InvalidArgument, match="must be a"):
        pool.transfer(host, request(1), request(2))
    assert abstract(pool) == before


@pytest.mark.parametrize("value", [-(1 << 100), -(1 << 80) - 1, -1, 4, 1 << 63, 1 << 100])
@pytest.mark.parametrize(
    "call",
    [
        lambda v: SlotPool("p", 4).owner_of(v),
        lambda v: MambaPool(4).verify(v, 1),
        lambda v: ReqToTokenPool(4, 8).read(v, 0, 1),
    ],
    ids=["owner_of", "mamba_verify", "req_to_token_read"],
)
def test_an_int_id_outside_the_pool_is_out_of_range_however_far(call: Callable[[int], object], value: int) -> None:
    """An int that names no slot, row or state is ``OutOfRange`` naming it, at any distance from the pool (the class
    of the refusal once changed with the id's size: below -2**80 it was ``InvalidArgument``)."""
    with pytest.raises(OutOfRange) as err:
        call(value)
    assert str(value) in str(err.value)


@pytest.mark.parametrize("value", [None, 1.0, True, "1", torch.tensor(1)])
def test_an_id_that_is_no_int_is_an_invalid_argument(value: object) -> None:
    with pytest.raises(InvalidArgument, match="must be an int"):
        SlotPool("p", 4).owner_of(value)  # type: ignore[arg-type]
