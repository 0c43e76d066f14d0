"""SGLang 0.5.13 to 0.5.23's components scheduler with the radix cache disabled (``--disable-radix-cache``).

What SGLang's cache registry builds then, and what the adapters here build the same way:

* up to 0.5.21, whenever a chunked-prefill size reaches the cache builder (any setting, ``-1`` included: the
  scheduler reads ``-1`` as chunked prefill off, the builder only asks whether the size is set): a ``ChunkCache``
  (``SWAChunkCache`` for a sliding-window model), which matches nothing, caches nothing and frees a finished
  request's row from ``cache_protected_len``; under ``--enable-streaming-session`` wrapped in the external
  ``StreamingSession`` layer, which then is the only thing that keeps a request's memory between turns;
* otherwise (from 0.5.19 where no size reaches the builder, as for a multimodal model on the transformers backend;
  and from 0.5.22, where ``ChunkCache`` is gone): a ``UnifiedRadixCache`` built with ``disable=True``, its embedded
  session layer included (0.5.13 to 0.5.18 build that one only under ``SGLANG_ENABLE_UNIFIED_RADIX_TREE``, else a
  disabled ``RadixCache``). :func:`nocache_unified_factory` builds it in every release.

The scheduler is told as well (``disable_radix_cache``). Everything else (the loop, the components, the fake worker,
each release's layout) is :mod:`~kvledger.contracts.adapters.sglang.scheduler_components`' and
:mod:`~kvledger.contracts.adapters.sglang.scheduler_components_early`'s. With nothing cached, the laws about cache
reuse (``admission reuses the cache``, ``inv_end_caches``, ``chunk caches its prefix``) have nothing to say and are
reported skipped; every ownership, row, session and content law applies. A ``ChunkCache`` has no tree:
:class:`NoTreeView` reads the pools' ledgers with no tree holder, and the cache's own size counters.

Factories: :func:`nocache_system_factory`, :func:`nocache_chunked_factory` and :func:`nocache_unified_factory`
(aliases ``sglang-0.5.N-system-nocache``, ``-system-chunked-nocache`` and ``-system-nocache-unified``, 0.5.13 to
0.5.23), for every model kind: with a Mamba model a ``ChunkCache`` keeps no Mamba state, and the scheduler frees a
finished request's state itself (``free_mamba_cache``, as SGLang's ``release_kv_cache`` does for a cache that does
not support Mamba); a disabled ``UnifiedRadixCache`` carries its Mamba component.
"""

from __future__ import annotations

import importlib
from typing import Any

from kvledger.contracts.adapters.protocol import Snapshot
from kvledger.contracts.adapters.sglang.common import FULL, chunk_size, evict_component
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
from kvledger.spec.prefix import PrefixCache
from kvledger.spec.types import Component

__all__ = ["NoTreeView", "nocache_chunked_factory", "nocache_system_factory", "nocache_unified_factory"]

CHUNK_MODULE = "sglang.srt.mem_cache.chunk_cache"


class NoTreeView:
    """The abstraction of a cache with no tree (``ChunkCache``): nothing cached, the pools' ledgers (SGLang's free
    lists and the scheduler adapter's record of each request, ``pools.req_kv``), the cache's own size counters."""

    def __init__(self, cache: Any, pools: UnifiedPools, page_size: int) -> None:
        self.cache = cache
        self.pools = pools
        self.ps = page_size

    def snapshot(self) -> Snapshot:
        prefix = PrefixCache(self.ps, None, False, {}, frozenset(), {})
        sizes = {FULL: (int(self.cache.evictable_size()), int(self.cache.protected_size()))}
        return Snapshot(prefix, LockState(), {}, self.pools.ledgers({}, {}, {}), {}, sizes, {})

    def evict(self, component: Component, n: int) -> int:
        """SGLang's ``evict`` of ``component`` on the cache (it has nothing to evict), as the scheduler calls it."""
        params = importlib.import_module("sglang.srt.mem_cache.base_prefix_cache").EvictParams
        return evict_component(self.cache, params, component, n)


class NoCacheSchedulerAdapter(SchedulerSystemAdapter):
    """SGLang 0.5.17 to 0.5.23's components ``Scheduler`` with ``--disable-radix-cache`` (full attention, paged,
    SWA or Mamba)."""

    DISABLED = True
    CHUNK_CACHE = True
    """Build a ``ChunkCache`` where the release ships one (a chunked-prefill size reached the cache builder)."""

    def __init__(self, config: SystemConfig, chunk_tokens: int | None = None) -> None:
        self.chunk_cache: Any = None
        """The ``ChunkCache`` SGLang builds (to 0.5.21); None: a disabled ``UnifiedRadixCache``."""
        super().__init__(config, chunk_tokens)
        tree = "ChunkCache" if self.chunk_cache is not None else "UnifiedRadixCache(disable)"
        self.name = f"sglang-{self.version}/Scheduler+{tree}[{config.kind}]"

    def _new_cache(self) -> Any:
        if not self.CHUNK_CACHE:
            return super()._new_cache()
        try:
            chunk = importlib.import_module(CHUNK_MODULE)
        except ImportError:
            return super()._new_cache()  # NOTE: 0.5.22 on: the registry builds a disabled UnifiedRadixCache
        cls = chunk.SWAChunkCache if self.config.window is not None else chunk.ChunkCache
        params = self.sg.params.CacheInitParams(
            disable=True,
            req_to_token_pool=self.pools.req_pool,
            token_to_kv_pool_allocator=self.pools.allocator,
            page_size=self.config.page_size,
            sliding_window_size=self.config.window,
            chunked_prefill_size=self.chunk_tokens,
        )
        self.chunk_cache = cls(params)
        return streaming_layer(self.chunk_cache)  # NOTE: a chunk cache embeds no session layer

    def _new_view(self) -> TreeView:
        if self.chunk_cache is None:
            return super()._new_view()
        return NoTreeView(self.chunk_cache, self.pools, self.config.page_size)

    @property
    def _session_layer(self) -> Any:
        return self.cache if self.chunk_cache is not None else self.cache.session


class EarlyNoCacheSchedulerAdapter(NoCacheSchedulerAdapter, EarlyComponentsSchedulerAdapter):
    """SGLang 0.5.13 to 0.5.16's components ``Scheduler`` with ``--disable-radix-cache``."""

    TESTED = EarlyComponentsSchedulerAdapter.TESTED


class UnifiedNoCacheSchedulerAdapter(NoCacheSchedulerAdapter):
    """:class:`NoCacheSchedulerAdapter` on a disabled ``UnifiedRadixCache`` in every release."""

    CHUNK_CACHE = False


class EarlyUnifiedNoCacheSchedulerAdapter(EarlyNoCacheSchedulerAdapter):
    """:class:`EarlyNoCacheSchedulerAdapter` on a disabled ``UnifiedRadixCache``."""

    CHUNK_CACHE = False


def _adapter(config: SystemConfig, chunk_tokens: int | None, unified: bool = False) -> NoCacheSchedulerAdapter:
    """The adapter for the installed release's layout (an untested one is refused by the import's range check)."""
    early = early_layout("sglang-system-nocache")
    classes: dict[tuple[bool, bool], type[NoCacheSchedulerAdapter]] = {
        (False, False): NoCacheSchedulerAdapter,
        (True, False): EarlyNoCacheSchedulerAdapter,
        (False, True): UnifiedNoCacheSchedulerAdapter,
        (True, True): EarlyUnifiedNoCacheSchedulerAdapter,
    }
    return classes[early, unified](config, chunk_tokens)


def nocache_system_factory(config: SystemConfig) -> NoCacheSchedulerAdapter:
    """The installed release's (0.5.13 to 0.5.23) components scheduler with the radix cache disabled and chunked
    prefill off (``--chunked-prefill-size -1``: a ``ChunkCache`` to 0.5.21), for ``config`` (full attention, paged,
    SWA, Mamba)."""
    return _adapter(config, None)


def nocache_chunked_factory(config: SystemConfig) -> NoCacheSchedulerAdapter:
    """:func:`nocache_system_factory` with SGLang's chunked prefill on (``chunk_size``)."""
    return _adapter(config, chunk_size(config))


def nocache_unified_factory(config: SystemConfig) -> NoCacheSchedulerAdapter:
    """:func:`nocache_system_factory` on a disabled ``UnifiedRadixCache``, what the registry builds when no
    chunked-prefill size reaches it (and from 0.5.22 always)."""
    return _adapter(config, None, unified=True)
