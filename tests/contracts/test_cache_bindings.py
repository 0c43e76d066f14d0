"""Radix-cache contracts: silent on a correct cache, and each law fails on a broken one."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import icontract
import pytest
import torch

from kvledger.contracts import bindings
from kvledger.contracts.adapters.protocol import CacheConfig
from kvledger.contracts.adapters.reference import build_cache
from kvledger.impl import faults
from kvledger.impl.owners import encode
from kvledger.impl.radix import RadixCache
from kvledger.impl.tree import RadixTree
from kvledger.spec.types import Component, request

R = request(1)


@pytest.fixture
def level(request: pytest.FixtureRequest) -> Iterator[str]:
    saved = bindings.current_level()
    yield str(request.param)
    # NOTE: unwind in reverse: contracts off (their originals may be a fault's twin), faults off, contracts back.
    bindings.install("off")
    faults.disable()
    bindings.install(saved)


def put(cache: RadixCache, toks: list[int]) -> Any:
    slots = cache.kv.alloc(len(toks), R)
    res = cache.insert(torch.tensor(toks), slots, R)
    if res.dup_indices.numel():
        cache.kv.free(res.dup_indices, R)
    return res


@pytest.mark.parametrize("level", ["on", "slow"], indirect=True)
def test_correct_cache_is_silent(level: str) -> None:
    bindings.install(level)  # type: ignore[arg-type]
    cache = build_cache(CacheConfig(window=2, mamba=True))
    put(cache, [1, 2, 3, 4])
    put(cache, [1, 2, 5, 6])
    m = cache.match_prefix(torch.tensor([1, 2, 3, 4, 9]))
    h = cache.inc_lock_ref(m.last_node)
    cache.evict(Component.FULL, 100)
    cache.dec_lock_ref(h)
    cache.evict(Component.FULL, 100)


@pytest.mark.parametrize("level", ["on"], indirect=True)
def test_b1_breaks_the_detachment_contract(level: str) -> None:
    bindings.install("off")
    faults.enable("B1")
    bindings.install("on")  # wraps the buggy removal
    cache = build_cache(CacheConfig())
    put(cache, [1, 2, 3])
    with pytest.raises(icontract.ViolationError, match="inv_lru_detached"):
        cache.evict(Component.FULL, 3)


@pytest.mark.parametrize("level", ["on"], indirect=True)
def test_b5_breaks_the_lock_contract(level: str) -> None:
    bindings.install("on")
    faults.enable("B5")
    cache = build_cache(CacheConfig(window=2, mamba=True))
    assert cache.mamba is not None
    for toks in ([1, 2, 5, 6], [1, 2, 3, 4]):
        slots = cache.kv.alloc(4, R)
        state = int(cache.mamba.alloc(1, R)[0])
        cache.insert(torch.tensor(toks), slots, R, mamba_slot=state)
    m = cache.match_prefix(torch.tensor([1, 2, 3, 4]))
    h = cache.inc_lock_ref(m.last_node)
    with pytest.raises(icontract.ViolationError, match="inv_lock_ref_counts_handles"):
        cache.mamba_copy_on_write(m, request(2))
    del h


@pytest.mark.parametrize("level", ["slow"], indirect=True)
def test_size_drift_breaks_the_slow_tier(level: str, monkeypatch: pytest.MonkeyPatch) -> None:
    def raise_full(self: RadixTree, n: Any) -> list[Any]:
        counters = []
        while n.parent is not None:
            counters.append(n.full_site)
            n.lock_ref[Component.FULL] += 1  # BUG: evictable/protected counters not moved
            n = n.parent
        return counters

    monkeypatch.setattr(RadixTree, "_raise_full", raise_full)
    bindings.install("slow")
    cache = build_cache(CacheConfig())
    res = put(cache, [1, 2, 3])
    with pytest.raises(icontract.ViolationError, match="inv_sizes"):
        cache.inc_lock_ref(res.last_node)


# ---------------------------------------------------------------- the incremental laws of what a call touched


@pytest.mark.parametrize("level", ["on"], indirect=True)
def test_removal_that_skips_the_neighbours_is_caught(level: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from kvledger.impl.lru import LRUList

    def unlink(self: LRUList[Any], node: Any) -> None:
        self._members.discard(node)  # BUG: the neighbours still point at the removed node

    monkeypatch.setattr(LRUList, "_unlink", unlink)
    bindings.install("on")
    cache = build_cache(CacheConfig())
    put(cache, [1, 2, 3])
    with pytest.raises(icontract.ViolationError, match="inv_lru_links_symmetric: removal joins the neighbours"):
        cache.evict(Component.FULL, 3)


@pytest.mark.parametrize("level", ["on"], indirect=True)
@pytest.mark.parametrize(
    "broken",
    [
        lambda original: lambda self, n: original(self, n) + 1,  # BUG: reports one token too many
        lambda original: lambda self, n: 0,  # BUG: evicts nothing though it could
    ],
    ids=["misreports", "stops-early"],
)
def test_evict_that_misreports_or_stops_early_is_caught(
    level: str, broken: Callable[[Any], Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(RadixCache, "_evict_full", broken(RadixCache._evict_full))
    bindings.install("on")
    cache = build_cache(CacheConfig())
    put(cache, [1, 2, 3])
    with pytest.raises(icontract.ViolationError, match="inv_sizes: evict moves the counters by what it evicted"):
        cache.evict(Component.FULL, 1)


@pytest.mark.parametrize("level", ["on", "slow"], indirect=True)
def test_calls_by_keyword_are_checked_as_calls_by_position(level: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """An engine may name any argument by keyword: the contracts take the call as they take it by position (no
    ``TypeError`` from a law), and a broken law still fires."""
    bindings.install(level)  # type: ignore[arg-type]
    cache = build_cache(CacheConfig())
    slots = cache.kv.alloc(n=3, owner=R)
    res = cache.insert(key=torch.tensor([1, 2, 3]), value=slots, owner=R)
    assert not res.dup_indices.numel()
    handle = cache.inc_lock_ref(n=cache.match_prefix(key=[1, 2, 3]).last_node)
    cache.dec_lock_ref(handle=handle)
    more = cache.kv.alloc(2, owner=R)
    cache.kv.transfer(indices=more, src=R, dst=request(2))
    cache.kv.free(indices=more, owner=request(2))
    assert cache.evict(comp=Component.FULL, n=1) == 3
    put(cache, [4, 5])
    bindings.install("off")
    monkeypatch.setattr(RadixCache, "_evict_full", lambda self, n: 0)  # BUG: evicts nothing though it could
    bindings.install(level)  # type: ignore[arg-type]
    with pytest.raises(icontract.ViolationError, match="inv_sizes: evict moves the counters by what it evicted"):
        cache.evict(comp=Component.FULL, n=1)


@pytest.mark.parametrize("level", ["on"], indirect=True)
def test_insert_of_an_unlisted_node_is_caught(level: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from kvledger.impl.lru import LRUList

    original = LRUList._reorder  # NOTE: how the tree places its paths (``place`` without the checks)

    def reorder(self: LRUList[Any], order: list[Any]) -> None:
        original(self, order)
        for n in order:
            if n in self and n.end == 4:
                self._unlink(n)  # BUG: the new leaf drops out of its list
                n.prev[self.slot] = n.next[self.slot] = None

    monkeypatch.setattr(LRUList, "_reorder", reorder)
    bindings.install("on")
    cache = build_cache(CacheConfig())
    with pytest.raises(icontract.ViolationError, match="inv_owners_account: the key ends at a listed node"):
        put(cache, [1, 2, 3, 4])


@pytest.mark.parametrize("level", ["on"], indirect=True)
def test_insert_that_leaves_slots_with_the_caller_is_caught(level: str) -> None:
    bindings.install("on")
    cache = build_cache(CacheConfig())
    res = put(cache, [1, 2, 3])
    cache.kv.pool.owner_tag[res.last_node.value[:1]] = encode(R)  # BUG (hand-made): a cached slot is the caller's
    with pytest.raises(icontract.ViolationError, match="inv_owners_account: the key ends at a listed node"):
        cache.insert(torch.tensor([1, 2, 3]), res.last_node.value.clone(), R)


@pytest.mark.parametrize("level", ["on"], indirect=True)
def test_lock_that_raises_nothing_is_caught(level: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(RadixTree, "_raise_full", lambda self, n: [n.full_site])  # BUG: claims, raises nothing
    bindings.install("on")
    cache = build_cache(CacheConfig())
    res = put(cache, [1, 2, 3])
    with pytest.raises(icontract.ViolationError, match="inv_lock_ref_counts_handles: new handle raised"):
        cache.inc_lock_ref(res.last_node)
