"""SGLang's ``SWARadixCache`` (full attention + a sliding window, 0.5.9 to 0.5.20) behind the adapter protocol.

The legacy hybrid SWA cache SGLang shipped before and beside the unified one (range ``LEGACY_SWA``; 0.5.21
replaces it by ``PureSWARadixCache``, a ``RadixCache`` subclass without tombstones). It is read as
:class:`~kvledger.contracts.adapters.sglang.legacy.LegacyMambaAdapter` reads ``MambaRadixCache`` (the shared
tree walk, two ``LRUList`` objects: ``full_lru_list`` through ``prev`` / ``next`` and ``swa_lru_list`` through
``swa_prev`` / ``swa_next``), over the SWA pools of
:class:`~kvledger.contracts.adapters.sglang.unified_pools.UnifiedPools` (SGLang's static
``SWATokenToKVPoolAllocator`` over a tiny ``SWAKVPool``). Factory: :func:`swa_radix_cache_factory`.

How the protocol maps onto it (SGLang's own names), as the unified adapters map their SWA component:

* ``alloc_kv`` / ``free_kv``: the SWA allocator's ``alloc`` / ``free`` (a full slot and its paired SWA slot,
  ``full_to_swa_index_mapping``).
* ``lock``: ``match_prefix`` then ``inc_lock_ref(last_node)``, which locks the full path to the root and the
  SWA side up to the window, stamping the boundary node's ``swa_uuid``; its receipt (``swa_uuid_for_lock``) is
  what ``dec_lock_ref`` is given back.
* ``insert``: ``insert(InsertParams(key, value, prev_prefix_len=protected, swa_evicted_seqlen=...))``. The
  cache frees the duplicates past ``prev_prefix_len`` itself (``dups_freed``). As the unified adapters do, the
  request first releases the window KV of its slots the tree already caches (``free_swa``) and says so
  (``swa_evicted_seqlen``), so insert revives no tombstone (see "not checked").
* ``evict``: ``evict(EvictParams(num_tokens=n))`` (FULL) or ``EvictParams(num_tokens=0, swa_num_tokens=n)``
  (SWA: tombstones internal nodes, deletes leaves).
* ``snapshot``: the tree walk (a node's pages are SWA-live unless ``swa_tombstone``; its SWA slots are its
  full slots' ``full_to_swa_index_mapping``), both lists with every seen node's pointers, the locks replayed
  from their receipts (SWA: from the node up to the one stamped with the receipt's uuid, or to the root),
  the allocators' free lists and the four size counters.

What moved, read from the installed code:

* 0.5.9's ``inc_lock_ref`` returns the uuid itself and ``dec_lock_ref`` takes ``swa_uuid_for_lock``; from
  0.5.10 an ``IncLockRefResult`` and ``DecLockRefParams`` (:func:`lock_receipt`, :func:`release_args`);
* from 0.5.13 ``SWATokenToKVPoolAllocator`` lives in ``mem_cache.allocator.swa`` (before:
  ``swa_memory_pool``): it is taken from the cache module's own import;
* B1: ``LRUList._remove_node`` clears the removed node's links from 0.5.13 on; 0.5.9 to 0.5.12 fail
  ``inv_lru_detached``.

What it cannot express (skipped and reported): page sizes above 1 (the static allocator's ``alloc`` asserts
page size 1); ``rejects_double_unlock`` (a lock is a node and a uuid; a second release is not refused);
``mamba_cow`` and Mamba content (no Mamba component); ``lru_policy`` for the SWA list (declared for FULL only).

Not checked: SGLang's insert reviving an SWA tombstone the caller still holds window KV for (``_insert_helper``
branches 1 and 2; the spec's insert never revives one), as in the unified adapters.
"""

from __future__ import annotations

import importlib
import inspect
from types import SimpleNamespace
from typing import Any

import torch

from kvledger.contracts.adapters.protocol import CacheConfig, Inserted, Snapshot
from kvledger.contracts.adapters.sglang.common import FULL, SWA, NotExpressible, evict_component, node_owner
from kvledger.contracts.adapters.sglang.cpu_import import LEGACY_SWA
from kvledger.contracts.adapters.sglang.legacy import LegacyLock, _sglang, _TwoListAdapter
from kvledger.contracts.adapters.sglang.unified_pools import UnifiedPools
from kvledger.spec.locks import Key, LockSite
from kvledger.spec.prefix import PrefixCache
from kvledger.spec.types import Component, NodeId, Owner

SWA_MODULE = "sglang.srt.mem_cache.swa_radix_cache"
POOL_MODULE = "sglang.srt.mem_cache.swa_memory_pool"


def lock_receipt(result: Any) -> int | None:
    """The SWA boundary uuid an ``inc_lock_ref`` returned: the uuid itself (0.5.9), or an ``IncLockRefResult``'s."""
    return result if result is None or isinstance(result, int) else result.swa_uuid_for_lock


def release_args(dec_lock_ref: Any, base: Any, uuid: int | None) -> tuple[Any, ...]:
    """What ``dec_lock_ref(node, ...)`` takes after the node: the bare uuid (0.5.9: ``swa_uuid_for_lock``), else
    ``DecLockRefParams(swa_uuid_for_lock=uuid)``."""
    if "swa_uuid_for_lock" in inspect.signature(dec_lock_ref).parameters:
        return (uuid,)
    return (base.DecLockRefParams(swa_uuid_for_lock=uuid),)


class LegacySWAAdapter(_TwoListAdapter):
    """SGLang 0.5.9 to 0.5.20 ``SWARadixCache`` (full attention + SWA, page size 1), its two ``LRUList``."""

    cache_class = "SWARadixCache"
    takes_window = True
    # NOTE: ``lru_policy:full`` (FULL evictions take the least recently used unlocked leaf first; the SWA list is
    # not a use order, as in the unified caches): measured on 0.5.9 to 0.5.13, 0.5.16 and 0.5.20, 60 examples at
    # seeds 1 and 2 (0.5.9 to 0.5.12 with B1's two lines patched in, since B1 stops every run first)
    capabilities = frozenset({"lru", "lru_policy:full", "locks", "ledgers", "content", "sizes", "stateless_insert"})

    def __init__(self, config: CacheConfig) -> None:
        if config.window is None or config.mamba:
            raise NotExpressible(f"SWARadixCache is full attention + SWA only (config {config.kind})")
        if config.page_size != 1:
            raise NotExpressible("SGLang's SWATokenToKVPoolAllocator.alloc supports page size 1 only")
        super().__init__(config)

    def _import(self, config: CacheConfig) -> tuple[str, SimpleNamespace]:
        version, sg = _sglang(LEGACY_SWA, (POOL_MODULE, SWA_MODULE))
        sg.swa = importlib.import_module(SWA_MODULE)
        sg.swa_pool = importlib.import_module(POOL_MODULE)
        # NOTE: the allocator moved to mem_cache.allocator.swa in 0.5.13; the cache module imports it either way
        sg.swa_allocator = SimpleNamespace(SWATokenToKVPoolAllocator=sg.swa.SWATokenToKVPoolAllocator)
        return version, sg

    def _allocator(self) -> Any:
        self.pools = UnifiedPools(self.config, self.sg)
        self.req_kv = self.pools.req_kv
        return self.pools.allocator

    def _build(self) -> Any:
        params = self.sg.params.CacheInitParams(
            disable=False,
            req_to_token_pool=self.pools.req_pool,
            token_to_kv_pool_allocator=self.allocator,
            page_size=self.ps,
            sliding_window_size=self.config.window,
        )
        return self.sg.swa.SWARadixCache(params)

    # ------------------------------------------------------------ locks

    def _lock_node(self, node: Any) -> tuple[bool, Any]:
        return False, lock_receipt(self.cache.inc_lock_ref(node))

    def _release(self, h: LegacyLock) -> None:
        self.cache.dec_lock_ref(h.node, *release_args(self.cache.dec_lock_ref, self.sg.base, h.receipt))

    def _coverage(self, h: LegacyLock, end: dict[int, tuple[int, ...]]) -> set[LockSite]:
        """The full path to the root, and SWA from the node up to the one stamped with the receipt (or the root)."""
        cov = super()._coverage(h, end)
        node = h.node
        while node is not self.cache.root_node and node is not None and id(node) in end:
            cov.update((k, SWA) for k in self._pages(end[id(node)], len(node.key)))
            if h.receipt is not None and node.swa_uuid == h.receipt:
                break
            node = node.parent
        return cov

    # ------------------------------------------------------------ insert and evict

    def insert(self, req: int, key: tuple[int, ...], slots: tuple[int, ...], mamba: int | None) -> Inserted:
        if mamba is not None:
            raise NotExpressible("SGLang SWARadixCache has no Mamba component")
        protected = self._protected_len(key, slots)
        cached = len(self._tree_slots(key))
        evicted = 0
        if cached > protected:
            # NOTE: no tombstone revival inside insert (module docstring): the request first releases the window
            # KV of its slots the tree already caches and says so; insert then frees only their full side
            self.allocator.free_swa(torch.tensor(slots[protected:cached], dtype=torch.int64))
            evicted = cached
        r = self.cache.insert(
            self.sg.base.InsertParams(
                key=self._key(key),
                value=torch.tensor(slots, dtype=torch.int64),
                prev_prefix_len=protected,
                swa_evicted_seqlen=evicted,
            )
        )
        prefix_len = int(r.prefix_len)
        dups = slots[protected:prefix_len]
        self.req_kv.setdefault(req, set()).difference_update(slots)
        return Inserted(prefix_len, dups, None, dups)

    def evict(self, component: Component, n: int) -> int:
        if component is SWA:
            return evict_component(self.cache, self.sg.base.EvictParams, component, n)
        return super().evict(component, n)

    # ------------------------------------------------------------ abstraction

    def snapshot(self) -> Snapshot:
        full: dict[Key, tuple[int, ...]] = {}
        live: set[Key] = set()
        end: dict[int, tuple[int, ...]] = {}
        owners: dict[Component, dict[Owner, set[int]]] = {FULL: {}, SWA: {}}
        cached: dict[Component, set[NodeId]] = {FULL: set(), SWA: set()}
        swa_ref: dict[LockSite, int] = {}
        for n, toks in self._nodes():
            nid = self.ids(n)
            end[id(n)] = toks
            vals = [int(x) for x in n.value.tolist()]
            pages = self._pages(toks, len(vals))
            full.update((k, (v,)) for k, v in zip(pages, vals, strict=True))
            owners[FULL][node_owner(nid, FULL)] = set(vals)
            cached[FULL].add(nid)
            if not n.swa_tombstone:
                live.update(pages)
                owners[SWA][node_owner(nid, SWA)] = self.pools.swa_of(vals)
                cached[SWA].add(nid)
            if n.swa_lock_ref:
                swa_ref.update(((k, SWA), int(n.swa_lock_ref)) for k in pages)
        prefix = PrefixCache(self.ps, self.config.window, False, full, frozenset(live), {})  # type: ignore[arg-type]
        sizes = {
            FULL: (int(self.cache.full_evictable_size()), int(self.cache.full_protected_size())),
            SWA: (int(self.cache.swa_evictable_size()), int(self.cache.swa_protected_size())),
        }
        lru = {FULL: self._lru(self.cache.full_lru_list, FULL), SWA: self._lru(self.cache.swa_lru_list, SWA)}
        return Snapshot(
            prefix,
            self._locks(end, swa_ref),
            lru,
            self.pools.ledgers(owners[FULL], owners[SWA], {}),
            self.kv.content(x for xs in full.values() for x in xs),
            sizes,
            {c: frozenset(ns) for c, ns in cached.items()},
        )


def swa_radix_cache_factory(config: CacheConfig) -> LegacySWAAdapter:
    """The installed release's ``SWARadixCache`` (0.5.9 to 0.5.20) for ``config`` (full attention + SWA, page
    size 1)."""
    return LegacySWAAdapter(config)
