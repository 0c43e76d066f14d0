"""Walks through LRU links and tree parents never loop: a revisit raises the law it breaks, at once."""

from __future__ import annotations

import pytest
import torch

from kvledger.impl.allocators import TokenAllocator
from kvledger.impl.lru import Linked, LRUList
from kvledger.impl.radix import RadixCache
from kvledger.spec.errors import IntegrityError
from kvledger.spec.types import Component, request

FULL = Component.FULL
REQ = request(1)


def linked_twice() -> LRUList[Linked]:
    """A list of nodes 1, 2, 3 where node 1 was linked a second time at the head without being unlinked."""
    lst: LRUList[Linked] = LRUList(FULL)
    a, b, c = Linked(1), Linked(2), Linked(3)
    for x in (a, b, c):
        lst.insert_mru(x)
    lst._link_after(lst.head, a)  # hand-broken: a node linked into the list twice (its old neighbours still lead to it)
    return lst


def test_lru_walks_stop_at_a_node_linked_twice() -> None:
    lst = linked_twice()
    with pytest.raises(IntegrityError, match="inv_lru_detached: full LRU list walked from the head"):
        lst.order()
    with pytest.raises(IntegrityError, match="inv_lru_"):
        lst.check()


def test_eviction_walk_stops_at_a_cycle() -> None:
    lst: LRUList[Linked] = LRUList(FULL)
    a, b, c = Linked(1), Linked(2), Linked(3)
    for x in (a, b, c):
        lst.insert_mru(x)
    c.prev[lst.slot] = a  # hand-broken: from the tail the walk goes 1, 2, 3, 1, ...
    with pytest.raises(IntegrityError, match="inv_lru_detached: full LRU list walked from the tail"):
        list(lst.iter_lru())


def test_lru_walks_pass_on_a_sound_list() -> None:
    lst: LRUList[Linked] = LRUList(FULL)
    nodes = [Linked(i) for i in range(1, 5)]
    for x in nodes:
        lst.insert_mru(x)
    lst.remove(nodes[1])
    assert lst.order() == [4, 3, 1]
    assert [x.id for x in lst.iter_lru()] == [1, 3, 4]
    lst.check()


def cache_with_parent_cycle() -> tuple[RadixCache, torch.Tensor]:
    """A cache holding 1,2,3 then 1,2,3,4,5 (two nodes), the upper node hand-linked under the lower one."""
    kv = TokenAllocator(16)
    cache = RadixCache(kv)
    first = kv.alloc(3, REQ)
    cache.insert(torch.tensor([1, 2, 3]), first, REQ)
    second = kv.alloc(2, REQ)
    cache.insert(torch.tensor([1, 2, 3, 4, 5]), torch.cat([first, second]), REQ)
    return cache, second


def test_tree_walks_stop_at_a_parent_cycle() -> None:
    cache, _ = cache_with_parent_cycle()
    m = cache.match_prefix(torch.tensor([1, 2, 3, 4, 5]))
    leaf = m.last_node
    upper = leaf.parent
    assert upper is not None and upper.parent is cache.root
    upper.parent = leaf  # hand-broken: the upper node linked under its own child
    refs = {n.id: list(n.refs) for n in cache.nodes()}
    sizes = cache.sizes()
    with pytest.raises(IntegrityError, match="inv_tree_acyclic: inc_lock_ref"):
        cache.inc_lock_ref(leaf)
    assert {n.id: list(n.refs) for n in cache.nodes()} == refs and cache.sizes() == sizes  # counters untouched
    with pytest.raises(IntegrityError, match="inv_tree_acyclic: prefix"):
        cache.prefix(leaf)


def test_tree_walks_pass_on_a_sound_tree() -> None:
    cache, _ = cache_with_parent_cycle()
    leaf = cache.match_prefix(torch.tensor([1, 2, 3, 4, 5])).last_node
    assert cache.prefix(leaf).tolist() == [1, 2, 3, 4, 5]
    cache.dec_lock_ref(cache.inc_lock_ref(leaf))
