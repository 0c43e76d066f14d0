"""Lock handles: pairing, coverage, splits of locked nodes, and the B5 copy-on-write path."""

from __future__ import annotations

import pytest
import torch

from kvledger.impl.allocators import SWATokenAllocator, TokenAllocator
from kvledger.impl.locks import LockTable
from kvledger.impl.lru import SLOT
from kvledger.impl.mamba import MambaPool
from kvledger.impl.radix import RadixCache
from kvledger.impl.tree import TreeNode
from kvledger.spec.errors import CacheError, DoubleUnlock, IntegrityError, OverAllocation, UnknownHandle
from kvledger.spec.types import Component, HandleId, NodeId, request

FULL, SWA, MAMBA = Component.FULL, Component.SWA, Component.MAMBA
REQ = request(1)


def t(*xs: int) -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.int64)


def lock_state(cache: RadixCache) -> dict[tuple[int, Component], int]:
    return {(n.id, c): n.lock_ref[c] for n in cache.nodes() for c in cache.components if n.lock_ref[c]}


def check_paired(cache: RadixCache) -> None:
    """Per (node, component): lock_ref == live handles covering it, >= 0; counters recompute."""
    for n in cache.nodes():
        for c in cache.components:
            assert n.lock_ref[c] == cache.handles_covering(n.id, c) >= 0, (n, c)
    assert cache.sizes() == cache.recompute_sizes()


def put(cache: RadixCache, kv: TokenAllocator | SWATokenAllocator, key: list[int], state: MambaPool | None = None):
    slots = kv.alloc(len(key), REQ)
    ms = int(state.alloc(1, REQ)[0]) if state is not None else None
    r = cache.insert(t(*key), slots, REQ, mamba_slot=ms)
    if r.dup_indices.numel():
        kv.free(r.dup_indices, REQ)
    return r.last_node


# ---------------------------------------------------------------- the table alone


def test_table_issue_release_double_and_foreign() -> None:
    a, b = LockTable(), LockTable()
    h = a.issue(NodeId(3), [(NodeId(3), FULL), (NodeId(1), FULL)])
    assert a.coverage("dec", h) == ((3, FULL), (1, FULL)) and a.covering(NodeId(1), FULL) == 1
    with pytest.raises(AttributeError):
        h.counters = ()  # type: ignore[misc]
    with pytest.raises(UnknownHandle, match="another cache"):
        b.coverage("dec_lock_ref", h)
    a.forget(h)
    with pytest.raises(DoubleUnlock, match="double unlock"):
        a.coverage("dec_lock_ref", h)
    forged = h._replace(id=HandleId(99))
    with pytest.raises(UnknownHandle, match="never issued"):
        a.coverage("dec_lock_ref", forged)
    assert a.covering(NodeId(1), FULL) == 0 and len(a) == 0


def test_table_extend_on_split() -> None:
    a = LockTable()
    h = a.issue(NodeId(5), [(NodeId(5), FULL), (NodeId(5), SWA)])
    a.extend_on_split(NodeId(5), NodeId(9), [FULL])
    assert a.live()[h.id] == ((5, FULL), (5, SWA), (9, FULL)) and h.counters == ((5, FULL), (5, SWA))
    assert a.coverage("dec_lock_ref", h) == ((5, FULL), (5, SWA), (9, FULL))
    a.forget(h)
    assert a.covering(NodeId(9), FULL) == 0


# ---------------------------------------------------------------- through the cache


def test_double_unlock_and_foreign_handle_change_nothing() -> None:
    kv = TokenAllocator(16)
    cache, other = RadixCache(kv), RadixCache(TokenAllocator(4))
    leaf = put(cache, kv, [1, 2, 3, 4])
    h1 = cache.inc_lock_ref(leaf)
    h2 = cache.inc_lock_ref(leaf)
    cache.dec_lock_ref(h1)
    before = (lock_state(cache), cache.sizes())
    with pytest.raises(DoubleUnlock):
        cache.dec_lock_ref(h1)
    with pytest.raises(UnknownHandle):
        other.dec_lock_ref(h2)
    assert (lock_state(cache), cache.sizes()) == before and cache.is_live(h2) and not cache.is_live(h1)
    cache.dec_lock_ref(h2)
    assert lock_state(cache) == {} and cache.protected_size() == 0
    check_paired(cache)


@pytest.mark.parametrize("swa", [False, True], ids=["full", "full+swa"])
def test_a_release_that_finds_a_counter_not_held_raises_and_changes_nothing(swa: bool) -> None:
    # A counter of the handle's path is already 0 (another bug lowered it): the release must refuse
    # before lowering anything, or undo what it lowered, whichever counter it meets first.
    kv: TokenAllocator | SWATokenAllocator = SWATokenAllocator(32, 32) if swa else TokenAllocator(32)
    cache = RadixCache(kv, swa_window=4) if swa else RadixCache(kv)  # the window spans two nodes
    put(cache, kv, [1, 2, 3, 4, 5, 6])
    put(cache, kv, [1, 2, 3, 4, 9])
    put(cache, kv, [1, 2, 7])
    leaf = cache.match_prefix(t(1, 2, 3, 4, 5, 6)).last_node
    h = cache.inc_lock_ref(leaf)
    cov = cache.live_handles()[h.id]
    assert [c for _, c in cov].count(FULL) == 3 and [c for _, c in cov].count(SWA) == (2 if swa else 0)
    for broken, comp in cov:  # FULL counters first, then SWA ones: those before the broken one were lowered
        node = cache.node(broken)
        node.refs[SLOT[comp]] = 0  # as another bug would leave it
        before = (lock_state(cache), cache.sizes(), dict(cache.live_handles()))
        with pytest.raises(IntegrityError, match=f"node {broken} {comp.value} lock_ref is not held"):
            cache.dec_lock_ref(h)
        assert (lock_state(cache), cache.sizes(), dict(cache.live_handles())) == before and cache.is_live(h)
        node.refs[SLOT[comp]] = 1
    cache.dec_lock_ref(h)
    assert lock_state(cache) == {} and cache.protected_size() == 0
    check_paired(cache)


def test_locked_nodes_are_never_evicted_and_sizes_follow_handles() -> None:
    kv = TokenAllocator(16)
    cache = RadixCache(kv)
    a = put(cache, kv, [1, 2, 3, 4])
    put(cache, kv, [1, 2, 9, 9])
    a = cache.node(a.id)
    h = cache.inc_lock_ref(a)
    assert cache.protected_size() == 4 and cache.evictable_size() == 2
    assert cache.evict(FULL, 100) == 2
    assert cache.node(a.id) is a and kv.available_size() == 12
    check_paired(cache)
    cache.dec_lock_ref(h)
    assert cache.evict(FULL, 100) == 4 and kv.available_size() == 16
    check_paired(cache)


def test_lock_survives_a_split_of_the_locked_node() -> None:
    kv = TokenAllocator(16)
    cache = RadixCache(kv)
    leaf = put(cache, kv, [1, 2, 3, 4, 5, 6])
    h = cache.inc_lock_ref(leaf)
    m = cache.match_prefix(t(1, 2, 3))  # splits the locked node
    assert m.last_node is not leaf and m.last_node.lock_ref[FULL] == 1
    assert {nid for nid, _ in cache.live_handles()[h.id]} == {leaf.id, m.last_node.id}
    check_paired(cache)
    cache.dec_lock_ref(h)
    assert lock_state(cache) == {} and cache.protected_size() == 0
    check_paired(cache)


def test_swa_lock_stops_at_the_window_boundary() -> None:
    kv = SWATokenAllocator(32, 32)
    cache = RadixCache(kv, swa_window=3)
    put(cache, kv, [1, 2])
    put(cache, kv, [1, 2, 3, 4])
    leaf = put(cache, kv, [1, 2, 3, 4, 5, 6])  # nodes [0,2) [2,4) [4,6)
    h = cache.inc_lock_ref(leaf)
    swa_nodes = {nid for nid, c in h.counters if c is SWA}
    full_nodes = {nid for nid, c in h.counters if c is FULL}
    assert len(full_nodes) == 3 and len(swa_nodes) == 2  # [4,6) and [2,4) overlap [3,6)
    assert cache.protected_size(SWA) == 4 and cache.evictable_size(SWA) == 2
    assert cache.evict(SWA, 100) == 2  # only the root-side node can be tombstoned
    cache.dec_lock_ref(h)
    check_paired(cache)


def test_cow_under_full_mamba_pool_keeps_swa_locks_paired() -> None:
    """B5: the COW path's temporary lock must release exactly its own SWA extent."""
    kv = SWATokenAllocator(32, 32)
    pool = MambaPool(3)
    cache = RadixCache(kv, swa_window=2, mamba=pool)
    put(cache, kv, [1, 2], pool)
    put(cache, kv, [1, 2, 3, 4], pool)
    put(cache, kv, [1, 2, 3, 4, 5, 6], pool)
    assert pool.available_size() == 0
    m_short = cache.match_prefix(t(1, 2))
    other = cache.inc_lock_ref(m_short.last_node)  # another request holds the ancestor (SWA too)
    m = cache.match_prefix(t(1, 2, 3, 4, 5, 6, 7))
    assert m.length == 6
    mine = cache.inc_lock_ref(m.last_node)
    before = lock_state(cache)
    slot = cache.mamba_copy_on_write(m, REQ)
    assert lock_state(cache) == before and len(cache.live_handles()) == 2
    assert pool.pool.owner_of(slot) == REQ and int(pool.data[slot]) == int(pool.data[m.mamba_slot or 0])
    assert cache.node(cache.node(m.last_node.id).id).mamba_slot == m.mamba_slot  # the matched state survived
    check_paired(cache)
    cache.dec_lock_ref(mine)
    cache.dec_lock_ref(other)
    assert lock_state(cache) == {}
    pool.free(t(slot), REQ)
    check_paired(cache)


def test_cow_with_nothing_evictable_raises_and_changes_nothing() -> None:
    kv = TokenAllocator(16)
    pool = MambaPool(1)
    cache = RadixCache(kv, mamba=pool)
    put(cache, kv, [1, 2], pool)
    m = cache.match_prefix(t(1, 2))
    before = (lock_state(cache), cache.sizes(), pool.available_size())
    with pytest.raises(OverAllocation, match="no unlocked state"):
        cache.mamba_copy_on_write(m, REQ)
    assert (lock_state(cache), cache.sizes(), pool.available_size()) == before and not cache.live_handles()
    cache.evict(MAMBA, 1)
    with pytest.raises(CacheError, match="stale"):
        cache.mamba_copy_on_write(m, REQ)


def test_lock_of_an_evicted_node_is_rejected() -> None:
    kv = TokenAllocator(8)
    cache = RadixCache(kv)
    leaf: TreeNode = put(cache, kv, [1, 2])
    cache.evict(FULL, 2)
    with pytest.raises(CacheError, match=f"node {leaf.id} is not a live node"):
        cache.inc_lock_ref(leaf)
    h = cache.inc_lock_ref(cache.root)
    assert h.counters == ()
    cache.dec_lock_ref(h)


def test_a_handle_whose_id_is_no_int_was_never_issued() -> None:
    # An id of another type that equals an issued one and hashes as it (True for 1, 1.0, a numpy int) finds the
    # issued handle in a lookup by id: it is no handle the cache gave out, so it is not live and its release is
    # refused, typed, with nothing changed.
    import numpy as np

    kv = TokenAllocator(16)
    cache = RadixCache(kv)
    put(cache, kv, [1, 2, 3])
    h = cache.inc_lock_ref(cache.match_prefix(t(1, 2, 3)).last_node)
    assert h.id == 1 and cache.is_live(h)
    before = (lock_state(cache), cache.sizes())
    for forged in (h._replace(id=True), h._replace(id=1.0), h._replace(id=np.int64(1)), h._replace(id="1")):
        assert not cache.is_live(forged), forged
        with pytest.raises(UnknownHandle):
            cache.dec_lock_ref(forged)
        assert (lock_state(cache), cache.sizes()) == before and cache.is_live(h)
    cache.dec_lock_ref(h)
    check_paired(cache)
