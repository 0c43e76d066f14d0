"""SGLang 0.5.17 to 0.5.21's ``UnifiedRadixCache`` behind the adapter protocol: full, +SWA, +Mamba; Python or Rust core.

Factories (for ``kvledger check --adapter``): :func:`inc_lock_python_factory`
(aliases ``sglang-0.5.17`` to ``sglang-0.5.21``) and
:func:`inc_lock_rust_factory` (``sglang-0.5.19-rust`` to
``sglang-0.5.21-rust``; 0.5.17 and 0.5.18 ship no Rust core). These
releases keep the tree where 0.5.23 does, on a tree core
(``cache.tree_core``: node ids, ``node_by_id``, ``root_node``, the
``lru_lists``; the core chosen per cache by :func:`~kvledger.contracts.adapters.sglang.unified.new_cache`),
so the snapshot, insert, evict and the pools are
:class:`~kvledger.contracts.adapters.sglang.unified.UnifiedAdapter`'s. What is
older is the lock and match API, mapped here:

* ``match_prefix`` returns the matched slots (``device_indices``) with the
  ``last_device_node`` id (0.5.22 returns a length, the slots read from the path);
* ``lock``: ``inc_lock_ref(node_id)`` returns an ``IncLockRefResult``, the
  receipt; ``unlock``: ``dec_lock_ref(node_id, receipt.to_dec_params())``, as
  ``_dec_req_lock`` does (0.5.22: ``lock`` / ``unlock`` with a ``TreeLock``).

What moved inside the range, read from the installed code:

* the receipt: up to 0.5.19 ``swa_uuid_for_lock`` and ``skip_lock_node_ids``;
  0.5.20 ``swa_uuid_for_lock`` and ``skipped_lock_components``; 0.5.21
  ``component_lock_uuids`` and ``skipped_lock_components``, as 0.5.22. The
  lock's coverage is replayed from it as on 0.5.23. NOTE: ``skip_lock_node_ids``
  (the nodes that were tombstones at the acquire, passed over by both walks)
  stays empty for a lock taken where a match ended, since a match ends only
  where every component is live within the window (none in 600 SWA and hybrid
  examples on 0.5.19), so the replay does not read it;
* the insert's "the caller holds no window KV below here":
  ``InsertParams.swa_evicted_seqlen`` up to 0.5.20,
  ``set_evicted_seqlen(SWA, n)`` from 0.5.21;
* the request a copy-on-write match fills: ``req.mamba_pool_idx`` up to
  0.5.18, ``req.kv.mamba_pool_idx`` from 0.5.19 (the adapter's request has
  both, SGLang fills the one it reads);
* the Rust core's read-only ``match_full_device_prefix``, through which the
  Rust snapshot finds the cached Mamba states, from 0.5.20: 0.5.19's Rust core
  with Mamba is refused (``NotExpressible``).

What it cannot express is what 0.5.23's cannot (see that module).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvledger.contracts.adapters.protocol import CacheConfig
from kvledger.contracts.adapters.sglang.common import SWA, KVBuffer, NotExpressible, cow_request
from kvledger.contracts.adapters.sglang.cpu_import import INC_LOCK, TestedRange, import_sglang
from kvledger.contracts.adapters.sglang.unified import CORES, MODULES, UnifiedAdapter, UnifiedLock

__all__ = ["IncLockAdapter", "inc_lock_python_factory", "inc_lock_rust_factory", "tree_cores"]


class IncLockAdapter(UnifiedAdapter):
    """SGLang 0.5.17-0.5.21 ``UnifiedRadixCache`` (FULL, +SWA, +MAMBA as the config says) on one tree core."""

    name = "sglang-0.5.21"
    version = "0.5.21"
    TESTED: TestedRange = INC_LOCK

    def __init__(self, config: CacheConfig, core: str) -> None:
        self._setup(config, core, None, KVBuffer(), self.TESTED)
        if core not in tree_cores():
            raise NotExpressible(
                f"SGLang {self.version} registers no {core} tree core (it has: {', '.join(tree_cores())})"
            )
        self.cache = self._new_cache(tree_core_backend=core)
        if core == "rust" and config.mamba and not hasattr(self.cache.tree_core, "match_full_device_prefix"):
            raise NotExpressible(
                f"SGLang {self.version}'s Rust tree core has no match_full_device_prefix: the cached Mamba "
                "states cannot be read without moving the tree (a Mamba kind on the Python core reads them)"
            )
        self._settle_capabilities()

    # ------------------------------------------------------------ the receipt

    def _receipt(self, h: UnifiedLock) -> tuple[int | None, frozenset[Any]]:
        r = h.tree_lock
        uuids = getattr(r, "component_lock_uuids", None)  # NOTE: 0.5.21; before, swa_uuid_for_lock alone
        if uuids is None:
            uuids = {self.ct[SWA]: r.swa_uuid_for_lock} if SWA in self.comps else {}
        uuid = uuids.get(self.ct[SWA]) if SWA in self.comps else None
        return uuid, frozenset(getattr(r, "skipped_lock_components", ()))  # NOTE: 0.5.20 on

    def _mark_swa_released(self, params: Any, length: int) -> None:
        if hasattr(params, "set_evicted_seqlen"):  # NOTE: 0.5.21 on
            params.set_evicted_seqlen(self.ct[SWA], length)
        else:
            params.swa_evicted_seqlen = length

    # ------------------------------------------------------------ match and lock

    def _acquire(self, matched: Any) -> tuple[Any, Any]:
        receipt = self.cache.inc_lock_ref(matched)
        return receipt, self.cache.tree_core.node_by_id(matched) if self.core == "python" else matched

    def _release(self, h: UnifiedLock) -> None:
        node_id = h.node.id if self.core == "python" else h.node
        self.cache.dec_lock_ref(node_id, h.tree_lock.to_dec_params())

    def _cow_request(self) -> tuple[Any, Callable[[Any], Any]]:
        return cow_request(session=None, to_finish=None)  # NOTE: the slot on the request (0.5.17, 0.5.18) or its kv


def tree_cores() -> tuple[str, ...]:
    """The tree cores the installed SGLang registers (``python``; ``rust`` too from 0.5.19)."""
    import importlib

    import_sglang(INC_LOCK, MODULES)
    registry = importlib.import_module("sglang.srt.mem_cache.unified_cache.tree_core_registry")
    return tuple(c for c in registry.registered_tree_core_backends() if c in CORES)


def inc_lock_python_factory(config: CacheConfig) -> IncLockAdapter:
    """SGLang 0.5.17-0.5.21 ``UnifiedRadixCache`` on its Python tree core (FULL, +SWA, +MAMBA as ``config`` names)."""
    return IncLockAdapter(config, "python")


def inc_lock_rust_factory(config: CacheConfig) -> IncLockAdapter:
    """SGLang 0.5.19-0.5.21 ``UnifiedRadixCache`` on its Rust tree core (FULL, +SWA, +MAMBA as ``config`` names)."""
    return IncLockAdapter(config, "rust")
