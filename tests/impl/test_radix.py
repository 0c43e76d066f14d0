"""The radix cache: match/insert/evict against ``kvledger.spec.prefix``, ownership tags, LRU detachment, sizes."""

from __future__ import annotations

import random
from array import array
from typing import Any

import pytest
import torch

from kvledger.impl.allocators import PagedAllocator, SWATokenAllocator, TokenAllocator
from kvledger.impl.mamba import MambaPool
from kvledger.impl.owners import FREE_TAG, encode
from kvledger.impl.radix import RadixCache
from kvledger.impl.tree import TreeNode
from kvledger.spec import prefix as spec
from kvledger.spec.errors import (
    CacheError,
    ComponentDisabled,
    IntegrityError,
    LengthMismatch,
    NotOwner,
    OverAllocation,
    PageAlignmentError,
    SlotConflict,
    UnalignedKey,
)
from kvledger.spec.locks import LockState, covers_required, required_coverage
from kvledger.spec.types import Component, HandleId, MambaSlot, SlotId, node, request

FULL, SWA, MAMBA = Component.FULL, Component.SWA, Component.MAMBA
REQ = request(1)
KV = TokenAllocator | PagedAllocator | SWATokenAllocator


def t(*xs: int) -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.int64)


# ---------------------------------------------------------------- abstraction and whole-cache checks


def abstract(cache: RadixCache) -> spec.PrefixCache:
    """The spec content of ``cache``: each page of each node, named by the prefix ending with it."""
    full: dict[tuple[int, ...], tuple[SlotId, ...]] = {}
    swa: set[tuple[int, ...]] = set()
    states: dict[tuple[int, ...], MambaSlot] = {}
    p = cache.page_size
    for n in cache.nodes():
        if n is cache.root:
            continue
        pre, slots = cache.prefix(n).tolist(), n.value.tolist()
        for i in range(0, len(n), p):
            k = tuple(pre[: n.start + i + p])
            full[k] = tuple(SlotId(x) for x in slots[i : i + p])
            if cache.swa_window is not None and not n.swa_tombstone:
                swa.add(k)
        if n.mamba_slot is not None:
            states[tuple(pre)] = MambaSlot(n.mamba_slot)
    return spec.PrefixCache(cache.page_size, cache.swa_window, cache.mamba is not None, full, frozenset(swa), states)


def abstract_locks(cache: RadixCache) -> LockState:
    """The spec lock table: node counters expanded to the positions they cover."""
    handles = {}
    for h, cov in cache.live_handles().items():
        sites = set()
        for nid, c in cov:
            n = cache.node(nid)
            pre = tuple(cache.prefix(n).tolist())
            ends = [n.end] if c is MAMBA else range(n.start + cache.page_size, n.end + 1, cache.page_size)
            sites |= {(pre[:e], c) for e in ends}
        handles[HandleId(h)] = frozenset(sites)
    counts: dict[Any, int] = {}
    for cov in handles.values():
        for site in cov:
            counts[site] = counts.get(site, 0) + 1
    return LockState(handles, counts, frozenset())


def full_pool(kv: KV) -> Any:
    return kv.full.pool if isinstance(kv, SWATokenAllocator) else kv.pool


def check_cache(cache: RadixCache, kv: KV, seen: dict[int, TreeNode], pool: MambaPool | None = None) -> None:
    """Every law the cache keeps, checked from scratch."""
    live = {n.id: n for n in cache.nodes()}
    seen.update(live)
    grain = kv.page_size if isinstance(kv, PagedAllocator) else 1
    # LRU detachment: lists well formed, members exactly the holders, everyone else detached (B1)
    for c in cache.components:
        lst = cache.lru(c)
        lst.check()
        holders = {i for i, n in live.items() if n is not cache.root and cache.holds(n, c)}
        assert set(lst.order()) == holders and len(lst) == len(holders), c
    for n in seen.values():
        for c in Component:
            if n.id not in live or c not in cache.components or not cache.holds(n, c) or n is cache.root:
                assert n.lru_prev[c] is None and n.lru_next[c] is None, (n, c)
    # shape: children keyed by their first page, contiguous positions, nodes are whole pages
    ps = cache.page_size
    for n in live.values():
        for ck, ch in n.children.items():
            first = ch.key[:ps]
            assert ch.parent is n and ch.end == n.end + len(ch) and ck == (first[0] if ps == 1 else first.tobytes())
        assert n.end % ps == 0 and len(n) % ps == 0, n
    # recency: no ancestor less recent than its descendant (eviction relies on it)
    pos = {i: k for k, i in enumerate(cache.lru(FULL).order())}
    for n in live.values():
        if n.parent is not None and n.parent is not cache.root:
            assert pos[n.parent.id] < pos[n.id]
    # ownership: every node-tagged slot is in the node the tag names, and conservation
    fp = full_pool(kv)
    node_units = 0
    for n in live.values():
        if n is cache.root:
            continue
        units = torch.unique(n.value // grain)
        assert units.numel() * grain == len(n)
        assert bool((fp.owner_tag[units] == encode(node(n.id, FULL))).all()), n
        node_units += units.numel()
        if isinstance(kv, SWATokenAllocator):
            s = kv.translate(n.value)
            if n.swa_tombstone:
                assert bool((s == 0).all())
            else:
                assert bool((s != 0).all()) and bool((kv.swa.pool.owner_tag[s] == encode(node(n.id, SWA))).all())
        if n.mamba_slot is not None:
            assert pool is not None and pool.pool.owner_of(n.mamba_slot) == node(n.id, MAMBA)
    tags = fp.owner_tag[fp.base :]
    held_req = int((tags == encode(REQ)).sum())
    assert int((tags >> 60 == 2).sum()) == node_units
    assert fp.available_size() + node_units + held_req == fp.capacity
    assert int((tags == FREE_TAG).sum()) == fp.available_size()
    if isinstance(kv, SWATokenAllocator):
        live_swa = sum(len(n) for n in live.values() if n is not cache.root and not n.swa_tombstone)
        stags = kv.swa.pool.owner_tag[kv.swa.pool.base :]
        if cache.swa_window is not None:
            assert int((stags >> 60 == 2).sum()) == live_swa
        assert kv.swa.available_size() + int((stags != FREE_TAG).sum()) == kv.swa.capacity
    if pool is not None:
        states = sum(n.mamba_slot is not None for n in live.values())
        assert int((pool.pool.owner_tag >> 60 == 2).sum()) == states
    # lock pairing and the "recomputes to" counters
    for n in live.values():
        for c in cache.components:
            assert n.lock_ref[c] == cache.handles_covering(n.id, c) >= 0
    assert cache.sizes() == cache.recompute_sizes()


def snapshot(cache: RadixCache, kv: KV, pool: MambaPool | None = None) -> Any:
    """Everything an invalid call must leave untouched."""
    nodes = sorted(
        (n.id, n.key.tolist(), n.value.tolist(), n.swa_tombstone, n.mamba_slot, dict(n.lock_ref)) for n in cache.nodes()
    )
    lists = {c: cache.lru(c).order() for c in cache.components}
    pools = [full_pool(kv).owner_tag.clone().tolist(), full_pool(kv).available_size()]
    if pool is not None:
        pools += [pool.pool.owner_tag.tolist()]
    return nodes, lists, pools, cache.sizes(), dict(cache.live_handles())


def put(cache: RadixCache, kv: KV, key: list[int], pool: MambaPool | None = None) -> Any:
    """Insert ``key`` as a request would: fresh slots (fingerprinted), then free what came back."""
    slots = kv.alloc(len(key), REQ)
    kv.write_fingerprint(slots, t(*key), torch.arange(len(key)))
    ms = int(pool.alloc(1, REQ)[0]) if pool is not None else None
    r = cache.insert(t(*key), slots, REQ, mamba_slot=ms)
    if r.dup_indices.numel():
        kv.free(r.dup_indices, REQ)
    if r.dup_mamba is not None and pool is not None:
        pool.free(t(r.dup_mamba), REQ)
    return r


# ---------------------------------------------------------------- insert / match


@pytest.mark.parametrize("page_size", [1, 2, 4])
def test_shared_prefixes_split_and_match(page_size: int) -> None:
    kv = TokenAllocator(64)
    cache, seen = RadixCache(kv, page_size=page_size), {}
    a = [1, 2, 3, 4, 5, 6, 7, 8]
    b = [1, 2, 3, 4, 9, 9, 9, 9]
    ra = put(cache, kv, a)
    rb = put(cache, kv, b)
    assert (ra.prefix_len, rb.prefix_len, rb.dup_indices.numel()) == (0, 4, 4)
    check_cache(cache, kv, seen)
    m = cache.match_prefix(t(*a[:6], 0, 0))
    assert m.length == 6 - 6 % page_size and m.last_node.end == m.length
    assert m.indices.tolist() == list(range(1, m.length + 1))  # a's slots: a fresh pool hands out 1, 2, ...
    cache.verify(m, t(*a))
    check_cache(cache, kv, seen)
    assert cache.match_prefix(t(7, 7)).length == 0


def test_match_splits_inside_a_node_and_moves_tags() -> None:
    kv = TokenAllocator(16)
    cache, seen = RadixCache(kv), {}
    r = put(cache, kv, [1, 2, 3, 4, 5])
    leaf = r.last_node
    m = cache.match_prefix(t(1, 2, 3))
    assert m.length == 3 and m.last_node is not leaf and leaf.parent is m.last_node
    assert [full_pool(kv).owner_of(int(s)) for s in m.indices] == [node(m.last_node.id)] * 3
    assert cache.lru(FULL).order() == [m.last_node.id, leaf.id]
    check_cache(cache, kv, seen)


def test_an_insert_after_a_match_walks_the_tree_as_it_is_now() -> None:
    # An insert resumes the walk of the last match of the same key: every change to that path must void it.
    kv = TokenAllocator(32)
    cache, seen = RadixCache(kv), {}
    key = (1, 2, 3, 4, 5, 6)
    for change in ("evict the matched path", "split it", "add a leaf below it", "nothing"):
        put(cache, kv, [1, 2, 3, 4])
        put(cache, kv, [1, 2, 7, 8])
        assert cache.match_prefix(t(*key)).length == 4
        if change == "evict the matched path":
            cache.evict(FULL, 32)
        elif change == "split it":
            put(cache, kv, [1, 9])  # an insert of another key splits [1, 2]
        elif change == "add a leaf below it":
            put(cache, kv, [*key[:5], 9])
        a = abstract(cache)
        length = spec.cached_len(a, key)  # what the tree holds now, read without walking it
        cached = [s for i in range(1, length + 1) for s in a.full[key[:i]]]
        value = torch.cat([t(*cached), kv.alloc(len(key) - length, REQ)])
        r = cache.insert(t(*key), value, REQ)
        assert r.prefix_len == length and r.last_node.end == len(key) and not r.dup_indices.numel(), change
        assert cache.match_prefix(t(*key)).length == len(key), change
        check_cache(cache, kv, seen)
        cache.evict(FULL, 32)


def test_an_insert_sees_what_the_caller_wrote_into_its_matched_indices() -> None:
    # The insert compares the caller's prefix with the cached slots it remembers from the match: a caller
    # that wrote its own slot into the returned indices gets that slot back as a duplicate.
    kv = TokenAllocator(16)
    cache = RadixCache(kv)
    put(cache, kv, [1, 2, 3, 4])
    m = cache.match_prefix(t(1, 2, 3, 4, 5, 6))
    cached = m.indices.tolist()
    mine = kv.alloc(3, REQ)
    m.indices[0] = mine[0]  # the caller's own slot for a cached position
    r = cache.insert(t(1, 2, 3, 4, 5, 6), torch.cat((m.indices, mine[1:])), REQ)
    assert r.prefix_len == 4 and r.dup_indices.tolist() == [int(mine[0])]
    assert cache.match_prefix(t(1, 2, 3, 4, 5, 6)).indices.tolist() == [*cached, *mine[1:].tolist()]
    assert kv.pool.owner_of(int(mine[0])) == REQ  # still the caller's, to free


def test_insert_returns_duplicates_but_not_borrowed_slots() -> None:
    kv = TokenAllocator(16)
    cache = RadixCache(kv)
    put(cache, kv, [1, 2, 3])
    m = cache.match_prefix(t(1, 2, 3))
    mine = kv.alloc(2, REQ)
    dup = kv.alloc(1, REQ)
    value = torch.cat([m.indices[:2], dup, mine])  # borrowed, borrowed, duplicate, new, new
    r = cache.insert(t(1, 2, 3, 4, 5), value, REQ)
    assert r.prefix_len == 3 and r.dup_indices.tolist() == dup.tolist()
    assert full_pool(kv).owner_of(int(dup[0])) == REQ
    kv.free(r.dup_indices, REQ)
    check_cache(cache, kv, {})


def test_invalid_inserts_raise_and_change_nothing() -> None:
    kv = TokenAllocator(32)
    pool = MambaPool(4)
    cache = RadixCache(kv, page_size=2, mamba=pool)
    put(cache, kv, [1, 2, 3, 4], pool)
    other = request(2)
    mine, theirs = kv.alloc(2, REQ), kv.alloc(2, other)
    cached = cache.match_prefix(t(1, 2, 3, 4)).indices
    cases: list[tuple[type[Exception], Any]] = [
        (LengthMismatch, (t(5, 6), mine[:1])),
        (UnalignedKey, (t(5, 6, 7), torch.cat([mine, theirs[:1]]))),
        (SlotConflict, (t(5, 6), torch.cat([mine[:1], mine[:1]]))),
        (SlotConflict, (t(5, 6), cached[2:])),  # slots cached at another position
        (NotOwner, (t(5, 6), theirs)),
    ]
    before = snapshot(cache, kv, pool)
    for err, (key, value) in cases:
        with pytest.raises(err):
            cache.insert(key, value, REQ)
        assert snapshot(cache, kv, pool) == before, err
    state = cache.match_prefix(t(1, 2, 3, 4)).mamba_slot
    with pytest.raises(SlotConflict, match="Mamba slot"):
        cache.insert(t(1, 2, 9, 9), torch.cat([cached[:2], mine]), REQ, mamba_slot=state)
    with pytest.raises(ComponentDisabled):
        RadixCache(kv).insert(t(5, 6), mine, REQ, mamba_slot=1)
    assert snapshot(cache, kv, pool) == before


@pytest.mark.parametrize("page_size", [1, 2])
def test_keys_as_tensors_token_arrays_and_lists_are_one_key(page_size: int) -> None:
    # The same random requests on three caches, keys given as int64 tensors, array("q") and lists: the
    # same results, tree, slots and lists in each (allocators are deterministic).
    rng = random.Random(page_size)
    forms = [lambda xs: t(*xs), lambda xs: array("q", xs), list]
    kvs = [TokenAllocator(512) for _ in forms]
    caches = [RadixCache(kv, page_size=page_size) for kv in kvs]
    stems = [[rng.randrange(1, 9) for _ in range(24)] for _ in range(3)]
    for _ in range(40):
        toks = rng.choice(stems)[: rng.randrange(0, 24)] + [rng.randrange(1, 9) for _ in range(rng.randrange(0, 6))]
        toks = toks[: len(toks) - len(toks) % page_size]
        seen = []
        for form, kv, cache in zip(forms, kvs, caches, strict=True):
            m = cache.match_prefix(form(toks))
            h = cache.inc_lock_ref(m.last_node)
            if kv.available_size() < len(toks):
                cache.evict(FULL, len(toks))
            new = kv.alloc(len(toks) - m.length, REQ) if len(toks) > m.length else t()
            r = cache.insert(form(toks), torch.cat((m.indices, new)), REQ)
            if r.dup_indices.numel():
                kv.free(r.dup_indices, REQ)
            cache.dec_lock_ref(h)
            seen.append((m.length, m.indices.tolist(), r.prefix_len, snapshot(cache, kv)))
        assert seen[0] == seen[1] == seen[2], toks


def test_a_token_array_changed_between_match_and_insert_is_read_again() -> None:
    # The match remembers its walk by the key's bytes, not by the caller's array: an array written in place
    # after the match is a new key for the insert.
    kv = TokenAllocator(32)
    cache = RadixCache(kv)
    put(cache, kv, [1, 2, 3, 4])
    key = array("q", [1, 2, 3, 4, 5])
    m = cache.match_prefix(key)
    assert m.length == 4
    key[1] = 9  # now [1, 9, 3, 4, 5]: only [1] is cached
    value = torch.cat((m.indices[:1], kv.alloc(4, REQ)))
    r = cache.insert(key, value, REQ)
    assert r.prefix_len == 1 and cache.match_prefix([1, 9, 3, 4, 5]).length == 5
    assert cache.match_prefix([1, 2, 3, 4]).length == 4
    check_cache(cache, kv, {})


@pytest.mark.parametrize(
    "key",
    [
        [1.5, 2.0],
        [1, 2**63],
        "ab",
        b"ab",
        {1: 2},
        torch.tensor([1.0, 2.0]),
        torch.tensor([[1, 2]]),
        torch.tensor([True, False]),
        torch.tensor([1 + 2j, 2 + 0j]),
        torch.tensor([2**63], dtype=torch.uint64),
        torch.tensor([1, 2]).to_sparse(),
        torch.empty(2, dtype=torch.int64, device="meta"),
        [1, -2],
        [7] * 5000 + [-1],  # NOTE: a long key's sign is checked another way (numpy's min)
        array("q", [3] * 4095 + [-(2**63)]),
    ],
    ids=str.split(
        "floats past-int64 str bytes dict float-tensor 2-d bool complex uint64-past-int64 sparse meta negative "
        "long-negative long-array-negative"
    ),
)
def test_keys_that_are_not_token_ids_raise_and_change_nothing(key: Any) -> None:
    kv = TokenAllocator(16)
    cache = RadixCache(kv)
    put(cache, kv, [1, 2])
    mine = kv.alloc(2, REQ)
    before = snapshot(cache, kv)
    with pytest.raises(CacheError, match="match_prefix"):
        cache.match_prefix(key)
    with pytest.raises(CacheError, match="insert"):
        cache.insert(key, mine, REQ)
    if isinstance(key, torch.Tensor):  # the same tensor offered as the slot ids
        with pytest.raises(CacheError, match="insert"):
            cache.insert(t(5, 6), key, REQ)
    assert snapshot(cache, kv) == before


def test_paged_allocator_keys_children_by_page_and_owns_pages() -> None:
    kv = PagedAllocator(16, 2)
    cache, seen = RadixCache(kv), {}
    assert cache.page_size == 2
    put(cache, kv, [1, 2, 3, 4, 5, 6])
    r = put(cache, kv, [1, 2, 3, 9, 5, 6])  # diverges inside the second page: the whole page is new
    assert r.prefix_len == 2 and r.dup_indices.numel() == 2
    assert set(cache.root.children) == {array("q", [1, 2]).tobytes()}  # keyed by the first page's raw bytes
    check_cache(cache, kv, seen)
    m = cache.match_prefix(t(1, 2, 3, 4, 5))
    assert m.length == 4
    cache.verify(m, t(1, 2, 3, 4, 5))
    bad = kv.alloc(4, REQ)
    with pytest.raises(PageAlignmentError):
        cache.insert(t(7, 7, 7, 7), torch.cat([bad[2:], bad[:2]]).flip(0), REQ)
    assert cache.evict(FULL, 100) == 10
    kv.free(bad, REQ)
    check_cache(cache, kv, seen)
    assert kv.available_size() == kv.capacity


@pytest.mark.parametrize("page", [3, 4])  # page numbers by division and by shift
def test_paged_splits_and_evictions_keep_pages_owned(page: int) -> None:
    kv = PagedAllocator(12, page)
    cache, seen = RadixCache(kv), {}
    a = [1] * page + [2] * page + [3] * page
    put(cache, kv, a)
    m = cache.match_prefix(t(*a[: 2 * page], *[9] * page))  # ends inside the node: a split, its pages retagged
    assert m.length == 2 * page and m.last_node.end == 2 * page
    check_cache(cache, kv, seen)
    put(cache, kv, [*a[: 2 * page], *[9] * page])
    check_cache(cache, kv, seen)
    assert cache.evict(FULL, 1) == page  # the least recent leaf goes: one page back to the pool
    check_cache(cache, kv, seen)
    assert cache.evict(FULL, 100) == 3 * page and kv.available_size() == kv.capacity
    check_cache(cache, kv, seen)


def test_verify_catches_a_use_after_free() -> None:
    kv = TokenAllocator(8)
    cache = RadixCache(kv)
    put(cache, kv, [4, 5, 6])
    m = cache.match_prefix(t(4, 5, 6))
    kv.data[m.indices[1]] = 0  # someone else wrote into a cached slot
    with pytest.raises(IntegrityError, match="position 1"):
        cache.verify(m, t(4, 5, 6))


# ---------------------------------------------------------------- SWA and Mamba rules


def test_swa_tombstones_shorten_matches_by_the_window_rule() -> None:
    kv = SWATokenAllocator(32, 32)
    cache, seen = RadixCache(kv, swa_window=2), {}
    put(cache, kv, [1, 2])
    put(cache, kv, [1, 2, 3, 4])
    put(cache, kv, [1, 2, 3, 4, 5, 6, 7, 8])
    mid = cache.match_prefix(t(1, 2, 3, 4)).last_node
    for n in cache.nodes():  # make [2, 4) the least recent
        if n is not mid and n is not cache.root:
            cache.lru(SWA).touch(n)
    assert cache.evict(SWA, 1) == 2 and mid.swa_tombstone
    check_cache(cache, kv, seen)
    key = t(1, 2, 3, 4, 5, 6, 7, 8)
    assert cache.match_prefix(key).length == 8  # [6, 8) is live
    assert cache.match_prefix(key[:5]).length == 2  # 5 needs position 3; 4 and 3 too; 2 is fine
    assert cache.match_prefix(key[:6]).length == 6  # window [4, 6) live
    assert spec.match_prefix(abstract(cache), tuple(key[:5].tolist())).length == 2
    r = put(cache, kv, [1, 2, 3, 4])
    assert r.prefix_len == 4 and cache.node(mid.id).swa_tombstone  # never revived
    check_cache(cache, kv, seen)


def test_mamba_matches_end_only_at_states() -> None:
    kv = TokenAllocator(32)
    pool = MambaPool(8)
    cache, seen = RadixCache(kv, mamba=pool), {}
    put(cache, kv, [1, 2, 3, 4], pool)
    r = put(cache, kv, [1, 2, 3, 4, 5, 6], pool)
    assert r.dup_mamba is None
    put(cache, kv, [1, 2, 9], None)  # splits [1, 2 | 3, 4]; the new node has no state
    check_cache(cache, kv, seen, pool)
    assert cache.match_prefix(t(1, 2, 3, 4, 5)).length == 4
    assert cache.match_prefix(t(1, 2, 9)).length == 0
    m = cache.match_prefix(t(1, 2, 3, 4, 5, 6))
    assert m.length == 6 and m.mamba_slot == m.last_node.mamba_slot
    again = put(cache, kv, [1, 2, 3, 4, 5, 6], pool)
    assert again.dup_mamba is not None and again.prefix_len == 6
    assert cache.evict(MAMBA, 1) == 1
    check_cache(cache, kv, seen, pool)


# ---------------------------------------------------------------- eviction


def test_full_eviction_is_lru_leaves_first_and_detaches() -> None:
    kv = TokenAllocator(32)
    cache, seen = RadixCache(kv), {}
    put(cache, kv, [1, 1, 1, 1])
    put(cache, kv, [1, 1, 2, 2])
    put(cache, kv, [3, 3])
    cache.match_prefix(t(1, 1, 1, 1))  # [1,1,2,2] is now the LRU leaf
    check_cache(cache, kv, seen)
    assert cache.evict(FULL, 1) == 2
    assert cache.match_prefix(t(1, 1, 2, 2)).length == 2
    check_cache(cache, kv, seen)
    assert cache.evict(FULL, 3) == 4  # [3,3], then [1,1 | 1,1] leaf
    check_cache(cache, kv, seen)
    gone = [n for n in seen.values() if n.id not in {x.id for x in cache.nodes()}]
    assert gone and all(n.lru_prev[FULL] is None and n.lru_next[FULL] is None and n.parent is None for n in gone)
    assert cache.evict(FULL, 100) == 2 and kv.available_size() == kv.capacity


def test_pages_are_shared_only_when_whole() -> None:
    kv = TokenAllocator(32)
    cache, seen = RadixCache(kv, page_size=2), {}
    put(cache, kv, [5, 6, 7, 8])
    r = put(cache, kv, [5, 6, 7, 9])  # agrees on token 7 but not on its page
    assert r.prefix_len == 2 and r.dup_indices.numel() == 2
    assert set(cache.root.children) == {array("q", [5, 6]).tobytes()}
    assert cache.match_prefix(t(5, 6, 7)).length == 2
    m = cache.match_prefix(t(5, 6, 7, 8))
    mine = kv.alloc(2, REQ)
    with pytest.raises(SlotConflict, match="only partly"):  # borrows half of a cached page
        cache.insert(t(5, 6, 7, 8), torch.cat([m.indices[:3], mine[:1]]), REQ)
    before, locks = abstract(cache), abstract_locks(cache)
    assert cache.evict(FULL, 1) == 2 and cache.evict(FULL, 1) == 2 and cache.evict(FULL, 1) == 2
    assert spec.check_evict_full(before, frozenset(before.full.keys() - abstract(cache).full.keys()), locks) is None
    kv.free(mine, REQ)
    check_cache(cache, kv, seen)


# ---------------------------------------------------------------- differential run against the spec


CONFIGS = {
    "token-p1": dict(kind="token", page=1, window=None, mamba=False),
    "token-p2": dict(kind="token", page=2, window=None, mamba=False),
    "swa-w3": dict(kind="swa", page=1, window=3, mamba=False),
    "mamba-p2": dict(kind="token", page=2, window=None, mamba=True),
    "all-three": dict(kind="swa", page=1, window=2, mamba=True),
    "paged-p2": dict(kind="paged", page=2, window=None, mamba=False),
}


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_random_operations_refine_the_spec(name: str, seed: int) -> None:
    """Seeded random programs; after every step the cache is compared with the spec and fully checked."""
    cfg: dict[str, Any] = CONFIGS[name]
    rng = random.Random(f"{name}/{seed}")
    kv: KV
    if cfg["kind"] == "swa":
        kv = SWATokenAllocator(24, 20)
    elif cfg["kind"] == "paged":
        kv = PagedAllocator(12, 2)
    else:
        kv = TokenAllocator(24)
    pool = MambaPool(4) if cfg["mamba"] else None
    cache = RadixCache(kv, page_size=cfg["page"], swa_window=cfg["window"], mamba=pool)
    exact = True
    seen: dict[int, TreeNode] = {}
    handles: list[Any] = []
    ps = cfg["page"]

    def evict(comp: Component, n: int) -> None:
        before, locks = abstract(cache), abstract_locks(cache)
        cache.evict(comp, n)
        after = abstract(cache)
        if not exact:
            return
        if comp is FULL:  # NOTE: a leaf's state goes with it: evict_mamba, then evict_full
            states = frozenset(before.mamba_state.keys() - after.mamba_state.keys())
            victims = frozenset(before.full.keys() - after.full.keys())
            assert states <= victims and spec.check_evict_mamba(before, states, locks) is None
            mid = spec.evict_mamba(before, states, locks)[0]
            assert spec.check_evict_full(mid, victims, locks) is None
            assert spec.evict_full(mid, victims, locks)[0] == after
        elif comp is SWA:
            victims = frozenset(before.swa_live - after.swa_live)
            assert spec.check_evict_swa(before, victims, locks) is None
            assert spec.evict_swa(before, victims, locks) == after
        else:
            victims = frozenset(before.mamba_state.keys() - after.mamba_state.keys())
            assert spec.check_evict_mamba(before, victims, locks) is None
            assert spec.evict_mamba(before, victims, locks)[0] == after

    for _ in range(150):
        op = rng.choice(["insert", "insert", "match", "match", "unlock", "evict", "cow"])
        key = [rng.randrange(3) for _ in range(ps * rng.randint(1, 8 // ps))]
        if op == "insert":
            if kv.available_size() < len(key):
                evict(FULL, len(key))
            if isinstance(kv, SWATokenAllocator) and kv.swa.available_size() < len(key):
                evict(SWA, len(key))
            if pool is not None and pool.available_size() == 0:
                evict(MAMBA, 1)
            if kv.available_size() < len(key) or (pool is not None and pool.available_size() == 0):
                continue
            slots = kv.alloc(len(key), REQ)
            kv.write_fingerprint(slots, t(*key), torch.arange(len(key)))
            ms = int(pool.alloc(1, REQ)[0]) if pool is not None and rng.random() < 0.7 else None
            before = abstract(cache)
            r = cache.insert(t(*key), slots, REQ, mamba_slot=ms)
            if exact:
                want = spec.insert(before, tuple(key), tuple(SlotId(s) for s in slots.tolist()), ms)
                assert (r.prefix_len, tuple(r.dup_indices.tolist()), r.dup_mamba) == (
                    want.prefix_len,
                    want.dup_slots,
                    want.dup_mamba,
                )
                assert abstract(cache) == want.state
            if r.dup_indices.numel():
                kv.free(r.dup_indices, REQ)
            if r.dup_mamba is not None and pool is not None:
                pool.free(t(r.dup_mamba), REQ)
        elif op in ("match", "cow"):
            before = abstract(cache)
            m = cache.match_prefix(t(*key))
            if exact:
                want = spec.match_prefix(before, tuple(key))
                assert (m.length, tuple(m.indices.tolist()), m.mamba_slot) == (want.length, want.slots, want.mamba)
                assert abstract(cache) == before  # a split changes the shape, not the content
            cache.verify(m, t(*key))
            h = cache.inc_lock_ref(m.last_node)
            cov = abstract_locks(cache).handles[HandleId(h.id)]
            need = required_coverage(tuple(key[: m.length]), cfg["window"], cfg["mamba"], ps)
            assert covers_required(cov, need)
            handles.append(h)
            if op == "cow" and pool is not None and m.mamba_slot is not None:
                locks = dict(cache.live_handles())
                pool_before = abstract(cache)
                try:
                    slot = cache.mamba_copy_on_write(m, REQ)
                except OverAllocation as e:  # only a full pool with nothing evictable refuses
                    assert "pool full" in str(e) and pool.available_size() == 0
                else:
                    pool.free(t(slot), REQ)
                assert dict(cache.live_handles()) == locks
                gone = frozenset(pool_before.mamba_state.keys() - abstract(cache).mamba_state.keys())
                assert len(gone) <= 1
        elif op == "unlock" and handles:
            cache.dec_lock_ref(handles.pop(rng.randrange(len(handles))))
        elif op == "evict":
            evict(rng.choice(cache.components), rng.randint(1, 6))
        check_cache(cache, kv, seen, pool)
        now, locks = abstract(cache), abstract_locks(cache)
        for c in cache.components:
            assert cache.evictable_size(c) == spec.evictable_size(now, locks, c)
            assert cache.protected_size(c) == spec.protected_size(now, locks, c)
        if len(handles) > 3:
            cache.dec_lock_ref(handles.pop(0))
    for h in handles:
        cache.dec_lock_ref(h)
    assert cache.protected_size() == 0
    for c in cache.components:
        evict(c, 10**6)
    evict(FULL, 10**6)
    check_cache(cache, kv, seen, pool)
    assert full_pool(kv).available_size() == full_pool(kv).capacity and (pool is None or pool.available_size() == 4)
    if isinstance(kv, SWATokenAllocator):
        assert kv.swa.available_size() == kv.swa.capacity
    assert all(n.lru_prev[c] is None and n.lru_next[c] is None for n in seen.values() for c in Component)


def test_eviction_leaves_no_reference_cycles() -> None:
    """B1's symptom: evicted nodes that kept their links formed cycles only the cycle collector could free.

    A cycle needs two lists: the parent is tombstoned in SWA while its child is
    its SWA neighbour, then both leave the full list, child first.
    """
    import gc

    kv = SWATokenAllocator(32, 32)
    cache = RadixCache(kv, swa_window=2)
    put(cache, kv, [1, 2, 3, 4])
    child_id = put(cache, kv, [1, 2, 3, 4, 5, 6]).last_node.id
    cache.lru(SWA).touch(cache.node(child_id))  # the parent is now the SWA list's LRU end
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        assert cache.evict(SWA, 1) == 4 and cache.evict(FULL, 10**6) == 6
        gc.collect()
        leaked = [x for x in gc.garbage if isinstance(x, TreeNode)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert leaked == [] and [n.id for n in cache.nodes()] == [0]


def test_verify_refuses_a_match_that_is_not_this_caches() -> None:
    """Another cache's match, or one whose node was evicted since: a typed error, not a check of the wrong slots."""
    kv, other_kv = TokenAllocator(8), TokenAllocator(8)
    cache, other = RadixCache(kv), RadixCache(other_kv)
    put(cache, kv, [4, 5, 6])
    put(other, other_kv, [4, 5, 6])
    mine, theirs = cache.match_prefix(t(4, 5, 6)), other.match_prefix(t(4, 5, 6))
    cache.verify(mine, t(4, 5, 6))
    with pytest.raises(CacheError, match=r"verify: node .* is not a live node of this cache"):
        cache.verify(theirs, t(4, 5, 6))
    assert cache.evict(FULL, 100) == 3
    with pytest.raises(CacheError, match=r"verify: node .* is not a live node of this cache"):
        cache.verify(mine, t(4, 5, 6))


@pytest.mark.parametrize("n", [3, 100, 5000])
def test_verify_checks_its_whole_key_not_only_the_matched_tokens(n: int) -> None:
    """Found by the cross sweep (``calls.cross``): ``verify`` read only the matched tokens of its key, so a key with a
    negative token past the match was accepted, where ``match_prefix`` and ``insert`` refuse it."""
    kv = TokenAllocator(16)
    cache = RadixCache(kv)
    owner = request(1)
    slots = kv.alloc(2, owner)
    kv.write_fingerprint(slots, torch.tensor([1, 2]), torch.arange(2))
    cache.insert(torch.tensor([1, 2]), slots, owner)
    match = cache.match_prefix(torch.tensor([1, 2]))
    key = torch.ones(n, dtype=torch.int64)
    key[1] = 2
    cache.verify(match, key[:2])
    key[-1] = -1
    with pytest.raises(CacheError, match="token ids must be >= 0"):
        cache.verify(match, key)
