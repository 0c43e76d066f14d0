"""icontract bindings for the radix cache, attached from outside like the pool bindings.

Each contract reads as one law and names it first (the conformance machines'
law names), so a violation raised by a contract and one found by a machine
read the same. Tier ``on`` checks only what an operation touched: the
handle it issued or released, the path it locked, the node it removed from a
list. Tier ``slow`` adds whole-cache checks after every public operation:
size counters recompute, every list is one symmetric chain of its members,
every lock counter equals the live handles covering it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import icontract
import numpy as np
import torch

from kvledger.impl.locks import LockHandle
from kvledger.impl.lru import SLOT, Linked, LRUList
from kvledger.impl.owners import encode
from kvledger.impl.radix import RadixCache
from kvledger.impl.slots import I64, _tag_bytes
from kvledger.impl.tree import InsertResult, MatchResult, TreeNode
from kvledger.spec.errors import IntegrityError
from kvledger.spec.types import Component, Owner, OwnerKind

Wrap = Callable[..., None]

_NODE_FULL_BASE = encode(Owner(OwnerKind.NODE, 0, Component.FULL))
"""The tag of ``node(0, FULL)``: a node's full-slot tag is this base with its id in the low bits (``impl.owners``)."""


def _path_locks(cache: RadixCache, n: TreeNode) -> list[tuple[int, int, int]]:
    """(node id, FULL lock_ref, SWA lock_ref) from ``n`` to the root."""
    out = []
    while n.parent is not None:
        out.append((n.id, n.lock_ref[Component.FULL], n.lock_ref[Component.SWA]))
        n = n.parent
        if len(out) > len(cache._nodes):  # NOTE: a parent cycle: the law's walk must not run round it
            raise cache.revisit("a law's walk", n)
    return out


# ---------------------------------------------------------------- incremental laws
# NOTE: each is ``law(self, old, result, *args)`` for ``bindings.checked`` (see there why not icontract).


def match_whole_pages(self: RadixCache, old: None, result: MatchResult, *_: Any) -> bool:
    """results equal the spec's: a match is whole pages ending exactly at its last node."""
    return (
        result.length % self.page_size == 0
        and result.indices.numel() == result.length
        and result.last_node.end == result.length
    )


def insert_dups_stay_callers(
    self: RadixCache, old: None, result: InsertResult, key: Any, value: Any, owner: Owner, **_: Any
) -> bool:
    """inv_owners_account: the duplicates insert hands back are still the caller's."""
    dup = result.dup_indices
    if dup.numel() == 0:
        return True
    pool = self._kv.pool
    return bool((pool.owner_tag[dup // self._kv.grain] == encode(owner)).all())


def insert_caches_key(
    self: RadixCache, old: None, result: InsertResult, key: Any, value: Any, *_: Any, **__: Any
) -> bool:
    """inv_owners_account: the inserted key ends at a cached node whose slots are its own, on a path of listed nodes.

    What insert touched: the node ending at the key (its full slots tagged
    with that node) and its ancestors, each a live node of this tree and a
    member of the FULL LRU list. O(depth + the node's slots).

    NOTE: the node's tag is ``encode(node(id, FULL))`` built from this module's own base (no ``Owner`` made per
    call); on a host tag column the node's slots' tags are gathered once and compared as bytes with the tag's run.
    """
    last = result.last_node
    if last is self.root:
        return len(value) == 0
    if last.end != len(value):
        return False
    kv = self._kv
    grain, pool = kv.grain, kv.pool
    code = _NODE_FULL_BASE | last.id
    ids = np.frombuffer(last.slots, I64)
    if grain != 1:
        ids = ids[::grain] // grain
    tags = pool._tags
    if tags is not None:
        if tags[ids].tobytes() != _tag_bytes(code, len(ids)):
            return False
    elif not bool((pool.owner_tag[torch.from_numpy(ids.copy()).to(pool.device)] == code).all()):  # NOTE: writable
        return False
    members, nodes, n = self._full._members, self._nodes, last  # NOTE: the list's own member set, as ``in`` reads it
    for _step in range(len(nodes)):  # NOTE: a path passes each node once: a longer walk runs round a parent cycle
        if n.parent is None:
            return n is self.root
        if nodes.get(n.id) is not n or n not in members:
            return False
        n = n.parent
    raise self.revisit("insert", n)


def new_handle_raised(self: RadixCache, old: None, result: LockHandle, *_: Any) -> bool:
    """inv_lock_ref_counts_handles: a new handle is live and every counter it covers is raised."""
    nodes = self._nodes
    return self.is_live(result) and all(
        nodes[nid].refs[SLOT[c]] > 0 for nid, c in self._locks.covered("inc_lock_ref", result)
    )


def released_once(self: RadixCache, old: Any, result: None, handle: LockHandle) -> bool:
    """inv_lock_ref_nonnegative: a released handle is gone and the counters it covered stay >= 0."""
    nodes = self._nodes
    return not self.is_live(handle) and all(nid not in nodes or nodes[nid].refs[SLOT[c]] >= 0 for nid, c in old)


def cow_leaves_locks(self: RadixCache, old: Any, result: int, match: MatchResult, owner: Owner) -> bool:
    """inv_lock_ref_counts_handles: copy-on-write leaves the matched path's lock counters as it found them."""
    return old is None or _path_locks(self, match.last_node) == old


def cow_slot_is_owners(self: RadixCache, old: Any, result: int, match: MatchResult, owner: Owner) -> bool:
    """inv_owners_account: the copied state's slot belongs to the requester."""
    assert self.mamba is not None
    return self.mamba.pool.owner_of(result) == owner


def sizes_nonnegative(self: RadixCache, *_: Any) -> bool:
    """inv_sizes: evictable and protected counters never go negative."""
    return all(e >= 0 and p >= 0 for e, p in self.sizes().values())


def evict_moves_sizes(self: RadixCache, old: Any, result: int, comp: Component, n: int) -> bool:
    """inv_sizes: evict lowers ``comp``'s evictable counter by exactly what it returns, leaves the protected one,
    and stops short of ``n`` only when nothing evictable is left."""
    if old is None:
        return True
    e, p = self.sizes()[comp]
    e0, p0 = old[comp]
    return e == e0 - result and p == p0 and (result >= n or e == 0)


def removed_node_detached(self: LRUList[Linked], old: Any, result: None, node: Linked) -> bool:
    """inv_lru_detached: a node taken out of a list holds no pointer of it."""
    i = self.slot
    return node.prev[i] is None and node.next[i] is None


def removal_joins_neighbours(self: LRUList[Linked], old: Any, result: None, node: Linked) -> bool:
    """inv_lru_links_symmetric: the removed node's neighbours now point at each other, and it is no member."""
    if old is None:
        return True
    prev, nxt = old
    i = self.slot
    return prev.next[i] is nxt and nxt.prev[i] is prev and node not in self


def _neighbours(self: LRUList[Linked], node: Any) -> Any:
    try:
        i = self.slot
        prev, nxt = node.prev[i], node.next[i]
    except Exception:  # not a node: remove raises its typed error
        return None
    return None if prev is None or nxt is None else (prev, nxt)


# ---------------------------------------------------------------- whole-cache laws (slow)


def sizes_recompute(self: RadixCache) -> bool:
    """inv_sizes: the size counters equal their recomputation from the tree."""
    return self.sizes() == self.recompute_sizes()


def lists_are_chains(self: RadixCache) -> bool:
    """inv_lru_links_symmetric: every LRU list is one symmetric chain of exactly its members."""
    try:
        for comp in self.components:
            self.lru(comp).check()
    except IntegrityError:
        return False
    return True


def locks_count_handles(self: RadixCache) -> bool:
    """inv_lock_ref_counts_handles: every node's lock_ref equals the live handles covering it."""
    return all(
        n.lock_ref[c] == self.handles_covering(n.id, c)
        for n in self.nodes()
        if n is not self.root
        for c in self.components
    )


def _safe_path(self: RadixCache, match: MatchResult, *_: Any) -> Any:
    try:
        return _path_locks(self, match.last_node)
    except Exception:
        return None


def _safe_coverage(self: RadixCache, handle: LockHandle) -> Any:
    try:
        return tuple(self._locks.covered("dec_lock_ref", handle))
    except Exception:  # not a live handle: dec_lock_ref raises its typed error
        return ()


def _safe_sizes(self: RadixCache, comp: Any, n: Any) -> Any:
    try:
        return self.sizes()
    except Exception:
        return None


def attach(wrap: Wrap, slow: bool) -> None:
    """Attach the radix-cache contracts with ``wrap`` (``kvledger.contracts.bindings._wrap``)."""
    from kvledger.contracts.bindings import check  # NOTE: bindings imports this module when it installs

    ens = icontract.ensure
    wrap(RadixCache, "match_prefix", check(None, (match_whole_pages, "results equal the spec's: match is whole pages")))
    wrap(
        RadixCache,
        "insert",
        check(
            None,
            (insert_dups_stay_callers, "inv_owners_account: duplicates stay the caller's"),
            (insert_caches_key, "inv_owners_account: the key ends at a listed node holding its slots"),
        ),
    )
    wrap(RadixCache, "inc_lock_ref", check(None, (new_handle_raised, "inv_lock_ref_counts_handles: new handle raised")))
    wrap(
        RadixCache,
        "dec_lock_ref",
        check(_safe_coverage, (released_once, "inv_lock_ref_nonnegative: released counters stay >= 0")),
    )
    wrap(
        RadixCache,
        "mamba_copy_on_write",
        check(
            _safe_path,
            (cow_leaves_locks, "inv_lock_ref_counts_handles: copy-on-write leaves locks as found"),
            (cow_slot_is_owners, "inv_owners_account: the copy is the requester's"),
        ),
    )
    wrap(
        RadixCache,
        "evict",
        check(
            _safe_sizes,
            (sizes_nonnegative, "inv_sizes: counters stay non-negative"),
            (evict_moves_sizes, "inv_sizes: evict moves the counters by what it evicted"),
        ),
    )
    wrap(
        LRUList,
        "remove",
        check(
            _neighbours,
            (removed_node_detached, "inv_lru_detached: removed node holds no link"),
            (removal_joins_neighbours, "inv_lru_links_symmetric: removal joins the neighbours"),
        ),
    )
    if slow:
        for name in ("match_prefix", "insert", "inc_lock_ref", "dec_lock_ref", "mamba_copy_on_write", "evict"):
            wrap(RadixCache, name, ens(sizes_recompute, "inv_sizes: counters recompute"))
            wrap(RadixCache, name, ens(lists_are_chains, "inv_lru_links_symmetric: lists are chains"))
            wrap(RadixCache, name, ens(locks_count_handles, "inv_lock_ref_counts_handles: locks count handles"))
