"""SGLang 0.5.13 to 0.5.20's components scheduler on the C++ radix tree (``RadixCacheCpp``), behind ``SystemAdapter``.

``SGLANG_EXPERIMENTAL_CPP_RADIX_TREE=1`` makes these releases' cache registry build a ``RadixCacheCpp`` (before any
other tree but the chunk cache), and ``--enable-streaming-session`` wraps it in the external ``StreamingSession``
layer (the C++ tree does not embed one, as ``UnifiedRadixCache`` does). The adapters here build the same pair and
hand it to the scheduler that :mod:`~kvledger.contracts.adapters.sglang.scheduler_components` (0.5.17 to 0.5.20)
and :mod:`~kvledger.contracts.adapters.sglang.scheduler_components_early` (0.5.13 to 0.5.16) drive; everything
else (the loop, the components, the fake worker, how each release keeps a request's KV fields) is theirs.

What the tree changes in the abstraction:

* the tree is read from the C++ tree's own dump (:class:`CppTreeView`, the cache adapter
  :class:`~kvledger.contracts.adapters.sglang.legacy_cpp.LegacyCppAdapter` over the scheduler's tree and pools);
* where a request's own KV starts in its row: ``RadixCacheCpp`` never updates ``cache_protected_len``, so where the
  C++ tree itself matched (``last_node`` is its node id) the boundary is read from the tree: the leading row slots
  it holds along the request's tokens (:func:`~kvledger.contracts.adapters.sglang.legacy_cpp.cpp_row_boundary`); a
  session's slot, and a turn resumed from one, keep ``cache_protected_len`` (the session layer's);
* the session layer is the cache itself (``StreamingSession.slots``), not ``cache.session``.

Factories: :func:`cpp_system_factory` and :func:`cpp_chunked_factory` pick the installed release's scheduler
(aliases ``sglang-0.5.N-system-cpp`` and ``sglang-0.5.N-system-chunked-cpp``, 0.5.13 to 0.5.20). The C++ tree has no
SWA or Mamba component: those kinds are not expressible.
"""

from __future__ import annotations

import importlib
from types import SimpleNamespace
from typing import Any

from kvledger.contracts.adapters.protocol import Snapshot
from kvledger.contracts.adapters.sglang.common import NodeIds, NotExpressible, SchedulerError, chunk_size
from kvledger.contracts.adapters.sglang.cpu_import import LEGACY_CPP
from kvledger.contracts.adapters.sglang.legacy import LegacyLock
from kvledger.contracts.adapters.sglang.legacy_cpp import LegacyCppAdapter, cpp_row_boundary, radix_cache_cpp
from kvledger.contracts.adapters.sglang.scheduler import streaming_layer
from kvledger.contracts.adapters.sglang.scheduler_components import (
    SchedulerSystemAdapter,
    TreeView,
    early_layout,
)
from kvledger.contracts.adapters.sglang.scheduler_components_early import EarlyComponentsSchedulerAdapter
from kvledger.contracts.adapters.sglang.unified_pools import UnifiedPools
from kvledger.contracts.adapters.system import SystemConfig
from kvledger.spec.locks import LockState
from kvledger.spec.types import HandleId, Owner

__all__ = ["CppTreeView", "cpp_chunked_factory", "cpp_system_factory"]


class CppTreeView(LegacyCppAdapter):
    """The C++ tree cache adapter's abstraction over a scheduler's ``RadixCacheCpp``: the tree from its dump, the
    free list from the scheduler's allocator, what each request holds from the scheduler adapter's record
    (``pools.req_kv``, set before each snapshot)."""

    pools: UnifiedPools

    @classmethod
    def over(cls, cache: Any, pools: UnifiedPools, adapter: SchedulerSystemAdapter) -> CppTreeView:
        """A view of ``cache`` (the bare ``RadixCacheCpp``) on ``pools``, with ``adapter``'s stand-in KV buffer."""
        self = cls.__new__(cls)
        self.version, self.config, self.ps = adapter.version, adapter.cache_config, adapter.config.page_size
        self.name = f"sglang-{self.version}/{self.cache_class}"
        self.sg = SimpleNamespace(
            base=importlib.import_module("sglang.srt.mem_cache.base_prefix_cache"),
            radix=importlib.import_module("sglang.srt.mem_cache.radix_cache"),
        )
        self.ids = NodeIds()
        self.kv = adapter.kv
        self.req_kv, self.req_mamba = {}, {}
        self.locks = {}  # NOTE: the scheduler adapter names the locks its requests and session slots hold
        self.next_hid = 1
        self.pools = pools
        self.allocator = pools.allocator
        self.cache = cache
        return self

    def snapshot(self) -> Snapshot:
        self.req_kv = self.pools.req_kv
        return super().snapshot()


class CppComponentsSchedulerAdapter(SchedulerSystemAdapter):
    """SGLang 0.5.17 to 0.5.20's components ``Scheduler`` over ``StreamingSession(RadixCacheCpp)``."""

    def __init__(self, config: SystemConfig, chunk_tokens: int | None = None) -> None:
        if config.window is not None or config.mamba:
            raise NotExpressible(f"SGLang's RadixCacheCpp has no SWA or Mamba component (config {config.kind})")
        super().__init__(config, chunk_tokens)
        self.name = f"sglang-{self.version}/Scheduler+RadixCacheCpp[{config.kind}]"

    def _new_cache(self) -> Any:
        if not LEGACY_CPP.contains(self.version):
            raise SchedulerError(
                f"SGLang {self.version} ships no C++ radix tree (RadixCacheCpp: {LEGACY_CPP.describe()})"
            )
        self.tree = radix_cache_cpp(
            self.sg.params.CacheInitParams(
                disable=False,
                req_to_token_pool=self.pools.req_pool,
                token_to_kv_pool_allocator=self.pools.allocator,
                page_size=self.config.page_size,
            )
        )
        return streaming_layer(self.tree)  # NOTE: the C++ tree embeds no session layer

    def _new_view(self) -> TreeView:
        self.cpp_view = CppTreeView.over(self.tree, self.pools, self)
        return self.cpp_view

    @property
    def _session_layer(self) -> Any:
        return self.cache

    def _lockable(self, node: Any) -> bool:
        return self.cpp_view.lockable(node)

    def _prime_locks(self, held: dict[Owner, tuple[HandleId, Any]]) -> None:
        self.cpp_view.locks = {hid: LegacyLock(hid, node, False, None, ()) for hid, node in held.values()}  # type: ignore[arg-type]

    def _lock_state(self, tree: Snapshot, held: dict[Owner, tuple[HandleId, Any]]) -> LockState:
        return tree.locks  # NOTE: the dump's counts, and each handle's path in the dump (full attention only)

    def _protected(self, rid: int | None, kv: Any) -> int:
        kept = int(kv.cache_protected_len)
        return kept if rid is None else cpp_row_boundary(self.cpp_view, self.reqs[rid], self._row(kv), kept)


class EarlyCppComponentsSchedulerAdapter(CppComponentsSchedulerAdapter, EarlyComponentsSchedulerAdapter):
    """SGLang 0.5.13 to 0.5.16's components ``Scheduler`` over ``StreamingSession(RadixCacheCpp)`` (the release's
    own layout from :class:`EarlyComponentsSchedulerAdapter`, the tree from :class:`CppComponentsSchedulerAdapter`)."""

    TESTED = EarlyComponentsSchedulerAdapter.TESTED


def _adapter(config: SystemConfig, chunk_tokens: int | None) -> CppComponentsSchedulerAdapter:
    """The adapter for the installed release's layout (an untested one is refused by the import's range check)."""
    cls = EarlyCppComponentsSchedulerAdapter if early_layout("sglang-system-cpp") else CppComponentsSchedulerAdapter
    return cls(config, chunk_tokens)


def cpp_system_factory(config: SystemConfig) -> CppComponentsSchedulerAdapter:
    """The installed release's (0.5.13 to 0.5.20) components scheduler on the C++ radix tree, for ``config`` (full
    attention, any page size)."""
    return _adapter(config, None)


def cpp_chunked_factory(config: SystemConfig) -> CppComponentsSchedulerAdapter:
    """:func:`cpp_system_factory` with SGLang's chunked prefill on (``chunk_size``)."""
    return _adapter(config, chunk_size(config))
