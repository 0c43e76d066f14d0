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

from kvledger.impl.locks import LockHandle
from kvledger.impl.lru import Linked, LRUList
from kvledger.impl.owners import encode
from kvledger.impl.radix import RadixCache
from kvledger.impl.tree import MatchResult, TreeNode
from kvledger.spec.errors import IntegrityError
from kvledger.spec.types import Component, Owner

Wrap = Callable[..., None]


def _path_locks(cache: RadixCache, n: TreeNode) -> list[tuple[int, int, int]]:
    """(node id, FULL lock_ref, SWA lock_ref) from ``n`` to the root."""
    out = []
    while n.parent is not None:
        out.append((n.id, n.lock_ref[Component.FULL], n.lock_ref[Component.SWA]))
        n = n.parent
    return out


# ---------------------------------------------------------------- incremental laws


def match_whole_pages(self: RadixCache, result: MatchResult) -> bool:
    """results equal the spec's: a match is whole pages ending exactly at its last node."""
    return (
        result.length % self.page_size == 0
        and result.indices.numel() == result.length
        and result.last_node.end == result.length
    )


def insert_dups_stay_callers(self: RadixCache, owner: Owner, result: Any) -> bool:
    """inv_owners_account: the duplicates insert hands back are still the caller's."""
    dup = result.dup_indices
    if dup.numel() == 0:
        return True
    pool = self._kv.pool
    return bool((pool.owner_tag[dup // self._kv.grain] == encode(owner)).all())


def new_handle_raised(self: RadixCache, result: LockHandle) -> bool:
    """inv_lock_ref_counts_handles: a new handle is live and every counter it covers is raised."""
    return self.is_live(result) and all(self._nodes[nid].lock_ref[c] > 0 for nid, c in self.live_handles()[result.id])


def released_once(self: RadixCache, handle: LockHandle, OLD: Any) -> bool:
    """inv_lock_ref_nonnegative: a released handle is gone and the counters it covered stay >= 0."""
    return not self.is_live(handle) and all(
        nid not in self._nodes or self._nodes[nid].lock_ref[c] >= 0 for nid, c in OLD.coverage
    )


def cow_leaves_locks(self: RadixCache, match: MatchResult, OLD: Any) -> bool:
    """inv_lock_ref_counts_handles: copy-on-write leaves the matched path's lock counters as it found them."""
    return OLD.path is None or _path_locks(self, match.last_node) == OLD.path


def cow_slot_is_owners(self: RadixCache, owner: Owner, result: int) -> bool:
    """inv_owners_account: the copied state's slot belongs to the requester."""
    assert self.mamba is not None
    return self.mamba.pool.owner_of(result) == owner


def sizes_nonnegative(self: RadixCache) -> bool:
    """inv_sizes: evictable and protected counters never go negative."""
    return all(e >= 0 and p >= 0 for e, p in self.sizes().values())


def removed_node_detached(self: LRUList[Linked], node: Linked) -> bool:
    """inv_lru_detached: a node taken out of a list holds no pointer of it."""
    return node.lru_prev[self.component] is None and node.lru_next[self.component] is None


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


def _safe_path(self: RadixCache, match: MatchResult) -> Any:
    try:
        return _path_locks(self, match.last_node)
    except Exception:
        return None


def _safe_coverage(self: RadixCache, handle: LockHandle) -> Any:
    try:
        return self.live_handles().get(handle.id, ())
    except Exception:
        return ()


def attach(wrap: Wrap, slow: bool) -> None:
    """Attach the radix-cache contracts with ``wrap`` (``kvledger.contracts.bindings._wrap``)."""
    snap, ens = icontract.snapshot, icontract.ensure
    wrap(RadixCache, "match_prefix", ens(match_whole_pages, "results equal the spec's: match is whole pages"))
    wrap(RadixCache, "insert", ens(insert_dups_stay_callers, "inv_owners_account: duplicates stay the caller's"))
    wrap(RadixCache, "inc_lock_ref", ens(new_handle_raised, "inv_lock_ref_counts_handles: new handle raised"))
    wrap(
        RadixCache,
        "dec_lock_ref",
        snap(lambda self, handle: _safe_coverage(self, handle), name="coverage"),
        ens(released_once, "inv_lock_ref_nonnegative: released counters stay >= 0"),
    )
    wrap(
        RadixCache,
        "mamba_copy_on_write",
        snap(lambda self, match: _safe_path(self, match), name="path"),
        ens(cow_leaves_locks, "inv_lock_ref_counts_handles: copy-on-write leaves locks as found"),
        ens(cow_slot_is_owners, "inv_owners_account: the copy is the requester's"),
    )
    wrap(RadixCache, "evict", ens(sizes_nonnegative, "inv_sizes: counters stay non-negative"))
    wrap(LRUList, "remove", ens(removed_node_detached, "inv_lru_detached: removed node holds no link"))
    if slow:
        for name in ("match_prefix", "insert", "inc_lock_ref", "dec_lock_ref", "mamba_copy_on_write", "evict"):
            wrap(RadixCache, name, ens(sizes_recompute, "inv_sizes: counters recompute"))
            wrap(RadixCache, name, ens(lists_are_chains, "inv_lru_links_symmetric: lists are chains"))
            wrap(RadixCache, name, ens(locks_count_handles, "inv_lock_ref_counts_handles: locks count handles"))
