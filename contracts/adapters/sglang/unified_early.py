"""SGLang 0.5.11 to 0.5.16's ``UnifiedRadixCache`` behind the adapter protocol: full, +SWA, +Mamba.

Factory (for ``kvledger check --adapter``): :func:`early_unified_factory`
(aliases ``sglang-0.5.11`` to ``sglang-0.5.16``: the installed release of
that range). The first unified cache has the same
components and the same pools as 0.5.23's (:mod:`~kvledger.contracts.adapters.sglang.unified`,
whose mapping this adapter reuses), but keeps its tree on the cache itself:

* the nodes: ``cache.root_node`` (``UnifiedTreeNode``: ``children``,
  ``parent``, ``key``, ``component_data[c].value`` / ``lock_ref`` /
  ``metadata``), and one ``UnifiedLRUList`` per component in
  ``cache.lru_lists`` (full attention too) threading ``lru_prev[c]`` /
  ``lru_next[c]``;
* ``match_prefix`` returns ``device_indices`` and the ``last_device_node``
  itself (no node ids);
* ``lock``: ``inc_lock_ref(node)`` returns an ``IncLockRefResult`` whose
  ``swa_uuid_for_lock`` (the node where the SWA lock stopped, at the window)
  is what ``dec_lock_ref(node, DecLockRefParams(swa_uuid_for_lock=...))``
  must be given back, as ``cache_finished_req`` does; ``unlock`` gives it back;
* ``mamba_cow``: ``match_prefix(..., cow_mamba=True, req=...)`` with a
  request that has no ``mamba_pool_idx`` yet, as admission does;
* insert tells the SWA component which prefix the caller holds no window KV
  for through ``InsertParams.swa_evicted_seqlen``;
* the Mamba slots come from ``HybridReqToTokenPool.mamba_pool`` (0.5.11,
  0.5.12) or ``mamba_allocator`` (0.5.13).

What it cannot express is what 0.5.23's Python core cannot (see that module):
no ``rejects_double_unlock``, no ``stateless_insert`` with Mamba, SWA and
Mamba at page size 1; and the same SWA revival path is left unchecked.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from kvledger.contracts.adapters.protocol import CacheConfig
from kvledger.contracts.adapters.sglang.common import FULL, MAMBA, KVBuffer
from kvledger.contracts.adapters.sglang.cpu_import import EARLY_UNIFIED, TestedRange, import_sglang
from kvledger.contracts.adapters.sglang.unified import UnifiedAdapter, UnifiedLock
from kvledger.spec.types import Component

MODULES = (
    "sglang.srt.mem_cache.unified_radix_cache",
    "sglang.srt.mem_cache.allocator",
    "sglang.srt.mem_cache.swa_memory_pool",
    "sglang.srt.mem_cache.memory_pool",
    "sglang.srt.mem_cache.cache_init_params",
    "sglang.srt.mem_cache.base_prefix_cache",
    "sglang.srt.server_args",
)


def _sglang(tested: TestedRange = EARLY_UNIFIED) -> tuple[str, SimpleNamespace]:
    """Import 0.5.11 to 0.5.16's memory manager on CPU; publish the one server argument the Mamba match reads."""
    import importlib

    version = import_sglang(tested, MODULES)
    allocator = importlib.import_module("sglang.srt.mem_cache.allocator")
    swa_pool = importlib.import_module("sglang.srt.mem_cache.swa_memory_pool")
    try:  # NOTE: 0.5.13 moved the SWA allocator into the allocator package
        swa_allocator = importlib.import_module("sglang.srt.mem_cache.allocator.swa")
    except ImportError:
        swa_allocator = swa_pool
    tree = importlib.import_module("sglang.srt.mem_cache.unified_cache_components.tree_component")
    server_args = importlib.import_module("sglang.srt.server_args")
    # NOTE: MambaComponent.finalize_match_result reads mamba_cache_chunk_size from the global server args.
    server_args.set_global_server_args_for_scheduler(SimpleNamespace(mamba_cache_chunk_size=64))
    return version, SimpleNamespace(
        allocator=allocator,
        swa_allocator=swa_allocator,
        base=importlib.import_module("sglang.srt.mem_cache.base_prefix_cache"),
        params=importlib.import_module("sglang.srt.mem_cache.cache_init_params"),
        pool=importlib.import_module("sglang.srt.mem_cache.memory_pool"),
        radix=importlib.import_module("sglang.srt.mem_cache.radix_cache"),
        swa_pool=swa_pool,
        unified=importlib.import_module("sglang.srt.mem_cache.unified_radix_cache"),
        ComponentType=tree.ComponentType,
    )


class EarlyUnifiedAdapter(UnifiedAdapter):
    """SGLang 0.5.11 to 0.5.16 ``UnifiedRadixCache`` (FULL, +SWA, +MAMBA as the config says)."""

    name = "sglang-0.5.11"
    version = "0.5.11"
    TESTED = EARLY_UNIFIED

    def __init__(self, config: CacheConfig) -> None:
        self._setup(config, "python", None, KVBuffer(), self.TESTED)
        self.cache = self._new_cache()  # NOTE: no tree core to choose before 0.5.23
        self.name = f"sglang-{self.version}/UnifiedRadixCache"
        if config.mamba:
            # NOTE: 0.5.11's FULL eviction with a Mamba component also drops the parent it leaves as a leaf
            # without a state (``evicts_no_more``: evict(full, 1) frees four tokens), as MambaRadixCache does
            self.capabilities = self.capabilities - {"lru_policy:full"}
        self._settle_capabilities()

    # ------------------------------------------------------------ where this release keeps its tree

    def _import(self, tested: TestedRange) -> tuple[str, SimpleNamespace]:
        return _sglang(tested)

    def _root(self) -> Any:
        return self.cache.root_node

    def _lru_components(self) -> tuple[Component, ...]:
        # NOTE: 0.5.11 evicts full attention through its own UnifiedLRUList; from 0.5.12 full attention evicts
        # by leaves (the cache's evictable_device_leaves) and its list in lru_lists stays empty.
        if hasattr(getattr(self, "cache", None), "evictable_device_leaves"):
            return tuple(c for c in self.comps if c is not FULL)
        return self.comps

    def _lru_list(self, comp: Component) -> Any:
        return self.cache.lru_lists[self.ct[comp]]

    def _receipt(self, h: UnifiedLock) -> tuple[int | None, frozenset[Any]]:
        return h.tree_lock.swa_uuid_for_lock, frozenset()

    def _mark_swa_released(self, params: Any, length: int) -> None:
        params.swa_evicted_seqlen = length

    # ------------------------------------------------------------ tree

    def _state_at(self, node: Any) -> int | None:
        if not self.config.mamba:
            return None
        v = node.component_data[self.ct[MAMBA]].value
        return None if v is None else int(v.reshape(-1)[0])

    def _acquire(self, matched: Any) -> tuple[Any, Any]:
        return self.cache.inc_lock_ref(matched), matched  # NOTE: the receipt is the IncLockRefResult

    def _release(self, h: UnifiedLock) -> None:
        # NOTE: the receipt's SWA boundary only, as the scheduler releases a request's lock up to 0.5.16
        # (``_req_inc_lock_ref`` keeps ``req.swa_uuid_for_lock`` alone; ``cache_finished_req`` passes it back).
        # Its short-lived locks pass the whole receipt (``to_dec_params()``, from 0.5.12) and 0.5.17's requests
        # keep ``skip_lock_node_ids`` too; a lock taken right after its match skips no node (measured on 0.5.16,
        # swa and hybrid, seeds 1 and 2), so either release lowers the same counts here.
        params = self.sg.base.DecLockRefParams(swa_uuid_for_lock=h.tree_lock.swa_uuid_for_lock)
        self.cache.dec_lock_ref(h.node, params)

    def _cow_request(self) -> tuple[Any, Callable[[Any], Any]]:
        req = SimpleNamespace(
            session=None, mamba_pool_idx=None, mamba_cow_src_index=None, mamba_needs_clear=True, to_finish=None
        )
        return req, lambda r: r.mamba_pool_idx


def early_unified_factory(config: CacheConfig) -> EarlyUnifiedAdapter:
    """SGLang 0.5.11 to 0.5.16 ``UnifiedRadixCache`` (FULL, +SWA, +MAMBA as ``config`` names)."""
    return EarlyUnifiedAdapter(config)
