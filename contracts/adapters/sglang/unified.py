"""SGLang 0.5.23's ``UnifiedRadixCache`` behind the adapter protocol: full, +SWA, +Mamba; Python or Rust tree core.

Factories (for ``kvledger check --adapter``): :func:`unified_python_factory`
and :func:`unified_rust_factory`; both take a
:class:`~kvledger.contracts.adapters.protocol.CacheConfig` and return a fresh adapter
whose tree has the components the config names (``tree_components``: FULL,
plus SWA with a ``window``, plus MAMBA with ``mamba``) over the pools of
:mod:`~kvledger.contracts.adapters.sglang.unified_pools`. The tree core is chosen per
cache (``CacheInitParams.tree_core_backend``); the adapter refuses to run
when SGLang silently fell back to another core.

How the protocol maps onto 0.5.23 (SGLang's own names):

* ``alloc_kv`` / ``free_kv``: the allocator's ``alloc`` / ``free`` (with SWA,
  ``free`` returns both the full and the paired SWA slot).
  ``alloc_mamba`` / ``free_mamba``: ``HybridReqToTokenPool.mamba_allocator``.
* ``match_prefix``: ``match_prefix(MatchPrefixParams(key=RadixKey(...)))``
  returns ``device_prefix_len`` and a ``NodeId``; the slots are
  ``path_device_indices(last_device_node)``, the state
  ``tree_core.get_component_device_value(node, MAMBA)``.
* ``lock`` / ``unlock``: ``lock(node_id)`` returns a ``TreeLock`` carrying
  the acquire's receipt (``DecLockRefParams``: the SWA boundary uuid);
  ``unlock`` gives exactly that object back, as the scheduler does.
* ``insert``: ``insert(InsertParams(key, value, mamba_value,
  prev_prefix_len=...))``. 0.5.23 **frees the duplicate slots inside
  insert** (``value[prev_prefix_len:prefix_len]``, ``prev_prefix_len`` being
  the caller's ``cache_protected_len``): the adapter passes the protected
  length (how many leading offered slots are already the tree's own, read
  before the insert) and reports ``value[protected:prefix_len]`` as both
  ``dup_slots`` and ``dups_freed``. A Mamba state is a duplicate when
  ``mamba_exist`` (the caller frees it, as ``cleanup_after_caching_req``
  does). With SWA, the offered slots of pages the tree already caches first
  release their window KV (``free_swa``) and the adapter passes
  ``component_evicted_seqlens[SWA]`` = that cached length: see "not checked"
  below.
* ``evict``: ``evict(EvictParams(num_tokens= / swa_num_tokens= / mamba_num=n))``.
* ``mamba_cow``: ``match_prefix(..., cow_mamba=True, req=...)`` with a
  request that holds no Mamba slot yet, as admission does (SGLang
  allocates the slot, evicting a state if it must); ``None`` when SGLang
  asserts "Can not alloc mamba cache".
* ``snapshot``, Python core: a read-only walk of ``tree_core.root_node``
  (keys; per component ``value`` and ``lock_ref``), the SWA and Mamba
  ``UnifiedLRUList`` walked from ``head`` through ``lru_next[component]``
  with the ``lru_prev`` / ``lru_next`` of every node ever seen, each lock's
  coverage replayed from its receipt (FULL: the path to the root; SWA: up to
  the node stamped with the receipt's uuid; MAMBA: the anchor node), the
  allocators' free lists, the size counters. Rust core: the tree is opaque;
  the cached slots come from SGLang's own KV-canary walk
  (``walk_for_kv_canary``: each cached slot with its position and the slot
  before it; ``swa_resident_only`` for the SWA-live ones), the tokens of each
  chain from the stand-in KV buffer, a Mamba state per cached prefix from
  the read-only ``match_full_device_prefix`` and
  ``get_component_device_value``, and the size counters.

What 0.5.23 cannot express here (skipped and reported):

* Full attention keeps no LRU list (eviction goes through
  ``evictable_device_leaves``): a full-attention cache has no ``lru``; with
  SWA or Mamba, ``lru`` checks their lists.
* Locks carry a receipt but no identity of their own: a second ``unlock`` of
  the same ``TreeLock`` is refused only when it drives a ``lock_ref`` below
  zero (an ``AssertionError``, a Rust panic), not when another lock holds
  the node: no ``rejects_double_unlock``.
* ``MambaComponent.commit_insert_component_data`` asserts a ``mamba_value``:
  a Mamba cache has no ``stateless_insert``.
* Rust core: no node, ``lock_ref`` or list is readable from Python, so no
  ``locks`` and no ``lru``; and since its cached keys are read back through
  the KV buffer, ``content`` would check itself: no ``content``.
* SWA and Mamba at page size 1 only (the static SWA allocator's ``alloc``
  and ``MambaComponent`` without the extra buffer require it).

Not checked (a transition the spec does not have): SGLang's insert revives
an SWA tombstone the caller still holds window KV for
(``SWAComponent.update_component_on_insert_overlap``: the node takes the
caller's fresh slots and its old full slots are freed), while the spec's
insert never revives one. So the adapter inserts as a request whose window
moved past the already-cached prefix: it releases those slots' window KV
(``SWATokenToKVPoolAllocator.free_swa``) and reports the position
(``component_evicted_seqlens[SWA]``, which tells insert "below this, only
FULL is still ours", so it frees their full side only). Every new page stays
SWA-live; only the revival path goes unchecked.
"""

from __future__ import annotations

import dataclasses
import os
from array import array
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch

from kvledger.contracts.adapters.protocol import CacheConfig, Inserted, Match, Snapshot
from kvledger.contracts.adapters.sglang.common import (
    FULL,
    MAMBA,
    SWA,
    KVBuffer,
    NodeIds,
    NotExpressible,
    copy_on_write,
    evict_component,
    lru_state,
    match_slots,
    node_owner,
    publish_cpu_args,
)
from kvledger.contracts.adapters.sglang.cpu_import import UNIFIED, TestedRange, import_sglang
from kvledger.contracts.adapters.sglang.unified_pools import UnifiedPools
from kvledger.spec.locks import Key, LockSite, LockState
from kvledger.spec.lru import LruState
from kvledger.spec.prefix import PrefixCache
from kvledger.spec.types import Component, HandleId, NodeId, Owner

MODULES = (
    "sglang.srt.mem_cache.unified_radix_cache",
    "sglang.srt.mem_cache.allocator",
    "sglang.srt.mem_cache.allocator.swa",
    "sglang.srt.mem_cache.swa_memory_pool",
    "sglang.srt.mem_cache.memory_pool",
    "sglang.srt.mem_cache.cache_init_params",
    "sglang.srt.runtime_context",
    "sglang.srt.server_args",
)
CORES = {"python": "UnifiedTreeCore", "rust": "RustUnifiedTreeCore"}
_context_ready = False


def _sglang(tested: TestedRange = UNIFIED) -> tuple[str, SimpleNamespace]:
    """Import 0.5.23's memory manager on CPU (once: also publishes the CPU server args the caches read)."""
    global _context_ready
    version = import_sglang(tested, MODULES)
    import sglang.srt.mem_cache.allocator as allocator  # type: ignore[import-not-found]
    import sglang.srt.mem_cache.allocator.swa as swa_allocator  # type: ignore[import-not-found]
    import sglang.srt.mem_cache.base_prefix_cache as base  # type: ignore[import-not-found]
    import sglang.srt.mem_cache.cache_init_params as params  # type: ignore[import-not-found]
    import sglang.srt.mem_cache.memory_pool as pool  # type: ignore[import-not-found]
    import sglang.srt.mem_cache.radix_cache as radix  # type: ignore[import-not-found]
    import sglang.srt.mem_cache.swa_memory_pool as swa_pool  # type: ignore[import-not-found]
    import sglang.srt.mem_cache.unified_radix_cache as unified  # type: ignore[import-not-found]
    from sglang.srt.mem_cache.unified_cache.components import ComponentType  # type: ignore[import-not-found]

    if not _context_ready:
        publish_cpu_args()
        _context_ready = True
    return version, SimpleNamespace(
        allocator=allocator,
        swa_allocator=swa_allocator,
        base=base,
        params=params,
        pool=pool,
        radix=radix,
        swa_pool=swa_pool,
        unified=unified,
        ComponentType=ComponentType,
    )


CORE_VARIABLE = "SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND"
"""Where 0.5.17 to 0.5.20 read the tree core a ``UnifiedRadixCache`` is built on."""


@contextmanager
def _environ(name: str, value: str | None) -> Iterator[None]:
    """``os.environ[name] = value`` inside the block (nothing when ``value`` is ``None``), as it was after."""
    if value is None:
        yield
        return
    was = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if was is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = was


def new_cache(sg: SimpleNamespace, tree_core_backend: str | None = None, **params: Any) -> Any:
    """SGLang's ``UnifiedRadixCache(CacheInitParams(**params))`` on the tree core ``tree_core_backend`` (``None``:
    the release's default, or its only one).

    NOTE: 0.5.17 to 0.5.20 have no ``CacheInitParams.tree_core_backend``; their cache reads its tree core from
    ``SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND`` when it is built, which is set for that moment only. A cache built on
    another core than the one asked for (SGLang falling back silently) is refused: every reading of it assumes the
    core asked for."""
    fields = {f.name for f in dataclasses.fields(sg.params.CacheInitParams)}
    core = tree_core_backend if "tree_core_backend" not in fields else None
    if core is None and tree_core_backend is not None:
        params["tree_core_backend"] = tree_core_backend
    with _environ(CORE_VARIABLE, core):
        cache = sg.unified.UnifiedRadixCache(sg.params.CacheInitParams(**params))
    built = getattr(cache, "tree_core", None)
    if tree_core_backend is not None and built is not None and type(built).__name__ != CORES[tree_core_backend]:
        raise RuntimeError(
            f"SGLang built a {type(built).__name__} where the {tree_core_backend} tree core "
            f"({CORES[tree_core_backend]}) was asked for"
        )
    return cache


@dataclass(eq=False)
class UnifiedLock:
    """What ``lock`` hands out: SGLang's ``TreeLock`` (its receipt), to be given back as it is."""

    hid: HandleId
    tree_lock: Any
    node: Any
    match: Match
    key: tuple[int, ...]


def _handle(h: Hashable) -> UnifiedLock:
    if not isinstance(h, UnifiedLock):
        raise TypeError(f"not a handle of an SGLang 0.5.23 adapter: {h!r}")
    return h


class UnifiedAdapter:
    """SGLang 0.5.23 ``UnifiedRadixCache`` (FULL, +SWA, +MAMBA as the config says) on one tree core."""

    name = "sglang-0.5.23"
    version = "0.5.23"
    TESTED: TestedRange = UNIFIED
    """The releases this class reads."""
    capabilities: frozenset[str]
    pools: UnifiedPools
    allocator: Any

    def __init__(self, config: CacheConfig, core: str) -> None:
        self._setup(config, core, None, KVBuffer())
        self.cache = self._new_cache(tree_core_backend=core)

    def _new_cache(self, **extra: Any) -> Any:
        """A ``UnifiedRadixCache`` with this config's components over this adapter's pools."""
        return new_cache(
            self.sg,
            disable=False,
            req_to_token_pool=self.pools.req_pool,
            token_to_kv_pool_allocator=self.allocator,
            page_size=self.ps,
            sliding_window_size=self.config.window,
            tree_components=tuple(self.ct[c] for c in self.comps),
            **extra,
        )

    @classmethod
    def observing(
        cls, cache: Any, pools: UnifiedPools, config: CacheConfig, kv: KVBuffer, tested: TestedRange | None = None
    ) -> UnifiedAdapter:
        """An adapter over a ``UnifiedRadixCache`` built elsewhere (a scheduler's), on ``pools``, Python core.

        Its snapshot reads that cache as this adapter reads its own; the
        requests' holdings are what the caller records in ``pools``.
        """
        self = cls.__new__(cls)
        self._setup(config, "python", pools, kv, tested or cls.TESTED)
        self.cache = cache
        self._settle_capabilities()
        return self

    def _settle_capabilities(self) -> None:
        """Drop what the built cache turns out not to keep (a release may evict a component without a list)."""
        if "lru" in self.capabilities and not self._lru_components():
            self.capabilities = self.capabilities - {"lru"}

    def _setup(
        self, config: CacheConfig, core: str, pools: UnifiedPools | None, kv: KVBuffer, tested: TestedRange = UNIFIED
    ) -> None:
        if core not in CORES:
            raise ValueError(f"unknown tree core {core!r}; expected one of {', '.join(CORES)}")
        if (config.window is not None or config.mamba) and config.page_size != 1:
            raise NotExpressible(
                f"the SGLang 0.5.23 adapter wires SWA and Mamba at page size 1 only (config {config.kind}): "
                "SWATokenToKVPoolAllocator.alloc and MambaComponent without the extra buffer require it"
            )
        self.version, self.sg = self._import(tested)
        self.core = core
        self.config = config
        self.ps = config.page_size
        ct = self.sg.ComponentType
        self.ct = {FULL: ct.FULL, SWA: ct.SWA, MAMBA: ct.MAMBA}
        self.comps = (FULL, *([SWA] if config.window is not None else []), *([MAMBA] if config.mamba else []))
        self.name = f"sglang-{self.version}/UnifiedRadixCache[{core}]"
        caps = {"ledgers", "sizes"}
        if not config.mamba:
            caps.add("stateless_insert")
        else:
            caps.add("mamba_cow")
        if core == "python":
            caps |= {"locks", "content"} | ({"lru"} if self._lru_components() else set())
            # NOTE: FULL evictions follow the path-use LRU policy (the SWA and Mamba lists do not, by design:
            # docs/own-cache.md); measured on 0.5.23 (every kind) and 0.5.11 to 0.5.13 (kinds without Mamba: the
            # early adapter drops it for the others), 150 examples a model
            caps.add("lru_policy:full")
        self.capabilities = frozenset(caps)
        self.ids = NodeIds()
        self.kv = kv
        self.pools = UnifiedPools(config, self.sg) if pools is None else pools
        self.allocator = self.pools.allocator
        self.locks: dict[HandleId, UnifiedLock] = {}
        self.next_hid = 1

    # ------------------------------------------------------------ where this release keeps its tree

    def _import(self, tested: TestedRange) -> tuple[str, SimpleNamespace]:
        return _sglang(tested)

    def _root(self) -> Any:
        return self.cache.tree_core.root_node

    def _lru_components(self) -> tuple[Component, ...]:
        """The components that keep an LRU list (0.5.23: SWA and Mamba; full attention evicts by leaves)."""
        return tuple(c for c in self.comps if c is not FULL)

    def _lru_list(self, comp: Component) -> Any:
        return self.cache.tree_core.lru_lists[self.ct[comp]]

    def _receipt(self, h: UnifiedLock) -> tuple[int | None, frozenset[Any]]:
        """What a lock's release will be given: the SWA boundary uuid, and the components the acquire skipped."""
        receipt = h.tree_lock.receipt
        uuid = receipt.component_lock_uuids.get(self.ct[SWA]) if SWA in self.comps else None
        return uuid, frozenset(receipt.skipped_lock_components)

    def _mark_swa_released(self, params: Any, length: int) -> None:
        """Tell insert that below ``length`` the caller holds no window KV any more."""
        params.set_evicted_seqlen(self.ct[SWA], length)

    # ------------------------------------------------------------ pools

    def alloc_kv(self, req: int, n: int) -> tuple[int, ...] | None:
        return self.pools.alloc_kv(req, n)

    def free_kv(self, req: int, slots: tuple[int, ...]) -> None:
        self.pools.free_kv(req, slots)

    def _need_mamba(self) -> None:
        if not self.config.mamba:
            raise NotExpressible("no Mamba component in this configuration")

    def alloc_mamba(self, req: int) -> int | None:
        self._need_mamba()
        return self.pools.alloc_mamba(req)

    def free_mamba(self, req: int, slot: int) -> None:
        self._need_mamba()
        self.pools.free_mamba(req, slot)

    def write_mamba(self, slot: int, value: int) -> None:
        self._need_mamba()
        self.pools.mamba_data[slot] = value  # NOTE: no law reads Mamba content; kept for a trace's sake

    def write_kv(self, slots: tuple[int, ...], tokens: tuple[int, ...], start: int) -> None:
        self.kv.write(slots, tokens, start)

    # ------------------------------------------------------------ tree

    def _key(self, key: tuple[int, ...]) -> Any:
        return self.sg.radix.RadixKey(array("q", key))

    def _state_at(self, node_id: Any) -> int | None:
        if not self.config.mamba:
            return None
        v = self.cache.tree_core.get_component_device_value(node_id, self.ct[MAMBA])
        return None if v is None else int(v.reshape(-1)[0])

    def _raw_match(self, key: tuple[int, ...], **extra: Any) -> tuple[Match, Any]:
        m = self.cache.match_prefix(self.sg.base.MatchPrefixParams(key=self._key(key), **extra))
        slots = match_slots(self.cache, m)  # NOTE: carried by the match to 0.5.21, read off its path from 0.5.22
        node = m.last_device_node
        return Match(len(slots), slots, self._state_at(node) if slots else None), node

    def match_prefix(self, key: tuple[int, ...]) -> Match:
        return self._raw_match(key)[0]

    def lock(self, key: tuple[int, ...]) -> tuple[Match, Hashable]:
        m, matched = self._raw_match(key)
        receipt, node = self._acquire(matched)
        h = UnifiedLock(HandleId(self.next_hid), receipt, node, m, key)
        self.next_hid += 1
        self.locks[h.hid] = h
        return m, h

    def unlock(self, handle: Hashable) -> None:
        h = _handle(handle)
        self._release(h)
        self.locks.pop(h.hid, None)

    def _acquire(self, matched: Any) -> tuple[Any, Any]:
        """Lock the node a match ended at: SGLang's receipt, and the node as the snapshot reads it."""
        tree_lock = self.cache.lock(matched)
        return tree_lock, self.cache.tree_core.node_by_id(matched) if self.core == "python" else matched

    def _release(self, h: UnifiedLock) -> None:
        """Give the lock's receipt back, as the scheduler does."""
        self.cache.unlock(h.tree_lock)

    def handle_id(self, handle: Hashable) -> int:
        return int(_handle(handle).hid)

    def _tree_prefix_slots(self, key: tuple[int, ...]) -> list[int]:
        """The tree's slots for the leading pages of ``key`` it holds (read-only on both cores)."""
        if self.core == "python":
            out: list[int] = []
            node, rest = self._root(), list(key)
            while rest:
                child = next((c for c in node.children.values() if _tokens(c)[: self.ps] == rest[: self.ps]), None)
                value = None if child is None else child.component_data[self.ct[FULL]].value
                if child is None or value is None:
                    break
                ck = _tokens(child)
                n = 0
                while n < len(ck) and n < len(rest) and ck[n] == rest[n]:
                    n += 1
                n -= n % self.ps
                out.extend(int(x) for x in value[:n].tolist())
                if n < len(ck):
                    break
                node, rest = child, rest[n:]
            return out
        chains = self._canary_chains()
        return [x for k, xs in sorted(chains.items(), key=lambda kv: len(kv[0])) if key[: len(k)] == k for x in xs]

    def insert(self, req: int, key: tuple[int, ...], slots: tuple[int, ...], mamba: int | None) -> Inserted:
        if mamba is None and self.config.mamba:
            raise NotExpressible(
                "SGLang 0.5.23's MambaComponent requires a Mamba state on insert (no stateless_insert)"
            )
        if mamba is not None:
            self._need_mamba()
        tree = self._tree_prefix_slots(key)
        protected = 0
        for mine, theirs in zip(slots, tree, strict=False):
            if mine != theirs:
                break
            protected += 1
        protected -= protected % self.ps
        params = self.sg.base.InsertParams(
            key=self._key(key),
            value=torch.tensor(slots, dtype=torch.int64),
            mamba_value=None if mamba is None else torch.tensor([mamba], dtype=torch.int64),
            prev_prefix_len=protected,
        )
        if self.config.window is not None and len(tree) > protected:
            # NOTE: no tombstone revival inside insert (see the module docstring): the request first releases
            # the window KV of its slots the tree already caches (SGLang's free_swa, as a request whose window
            # moved on does) and says so; insert then frees only their full side.
            self.allocator.free_swa(torch.tensor(slots[protected : len(tree)], dtype=torch.int64))
            self._mark_swa_released(params, len(tree))
        r = self.cache.insert(params)
        prefix_len = int(r.prefix_len)
        dups = slots[protected:prefix_len]
        self.pools.inserted(req, slots, dups)
        dup_mamba = mamba if mamba is not None and r.mamba_exist else None
        if mamba is not None and dup_mamba is None:
            self.pools.req_mamba.setdefault(req, set()).discard(mamba)
        return Inserted(prefix_len, dups, dup_mamba, dups_freed=dups)

    def evict(self, component: Component, n: int) -> int:
        if component not in self.comps:
            raise NotExpressible(f"no {component.value} component in this configuration")
        return evict_component(self.cache, self.sg.base.EvictParams, component, n)

    def mamba_cow(self, handle: Hashable, req: int) -> int | None:
        self._need_mamba()
        h = _handle(handle)
        fake_req, slot_of = self._cow_request()
        slot = copy_on_write(
            lambda r: self._raw_match(h.key[: h.match.length], cow_mamba=True, req=r), fake_req, slot_of
        )
        if slot is not None:
            self.pools.req_mamba.setdefault(req, set()).add(slot)
        return slot

    def _cow_request(self) -> tuple[Any, Callable[[Any], Any]]:
        """A request that holds no Mamba slot yet, as admission matches it, and where the slot lands on it."""
        kv = SimpleNamespace(holds_mamba=False, mamba_pool_idx=None, mamba_cow_src_index=None, mamba_needs_clear=True)
        return SimpleNamespace(session=None, kv=kv), lambda r: r.kv.mamba_pool_idx

    # ------------------------------------------------------------ abstraction

    def _nodes(self) -> Iterator[tuple[Any, tuple[int, ...]]]:
        stack: list[tuple[Any, tuple[int, ...]]] = [(c, ()) for c in self._root().children.values()]
        while stack:
            n, above = stack.pop()
            toks = above + tuple(_tokens(n))
            yield n, toks
            stack.extend((c, toks) for c in n.children.values())

    def _pages(self, toks: tuple[int, ...], length: int) -> list[Key]:
        start = len(toks) - length
        return [toks[: start + i + self.ps] for i in range(0, length, self.ps)]

    def _canary_chains(self) -> dict[Key, tuple[int, ...]]:
        """Rust core: ``page key -> slots`` from SGLang's KV-canary walk and the tokens in the KV buffer."""
        w = self.cache.tree_core.walk_for_kv_canary(False, False)
        slots = [int(x) for x in w.slot_indices.tolist()]
        pos = dict(zip(slots, (int(p) for p in w.positions.tolist()), strict=True))
        prev = dict(zip(slots, (int(p) for p in w.prev_slot_indices.tolist()), strict=True))
        tokens = self.kv.tokens
        full: dict[Key, tuple[int, ...]] = {}
        for x in slots:
            if (pos[x] + 1) % self.ps:
                continue
            chain = [x]
            while prev.get(chain[-1], -1) >= 0:
                chain.append(prev[chain[-1]])
            chain.reverse()
            key = tuple(tokens.get(s, -1) for s in chain)
            full[key] = tuple(chain[-self.ps :])
        return full

    def snapshot(self) -> Snapshot:
        return self._python_snapshot() if self.core == "python" else self._rust_snapshot()

    def _python_snapshot(self) -> Snapshot:
        grain = self.ps if self.ps > 1 else 1
        owners: dict[Component, dict[Owner, set[int]]] = {c: {} for c in (FULL, SWA, MAMBA)}
        full: dict[Key, tuple[int, ...]] = {}
        live: set[Key] = set()
        states: dict[Key, int] = {}
        cached: dict[Component, set[NodeId]] = {c: set() for c in self.comps}
        end: dict[int, tuple[int, ...]] = {}
        lock_ref: dict[LockSite, int] = {}
        for n, toks in self._nodes():
            nid: NodeId = self.ids(n)
            end[id(n)] = toks
            data = {c: n.component_data[self.ct[c]] for c in self.comps}
            if data[FULL].value is None:
                continue
            vals = [int(x) for x in data[FULL].value.tolist()]
            pages = self._pages(toks, len(vals))
            for i, k in enumerate(pages):
                full[k] = tuple(vals[i * self.ps : (i + 1) * self.ps])
            owners[FULL][node_owner(nid, FULL)] = {x // grain for x in vals}
            cached[FULL].add(nid)
            for c in self.comps:
                if data[c].lock_ref:
                    for k in [toks] if c is MAMBA else pages:
                        lock_ref[(k, c)] = int(data[c].lock_ref)
            if SWA in data and data[SWA].value is not None:
                swa = [int(x) for x in data[SWA].value.tolist()]
                live.update(pages[len(pages) - len(swa) :])
                owners[SWA][node_owner(nid, SWA)] = set(swa)
                cached[SWA].add(nid)
            if MAMBA in data and data[MAMBA].value is not None:
                slot = int(data[MAMBA].value.reshape(-1)[0])
                states[toks] = slot
                owners[MAMBA][node_owner(nid, MAMBA)] = {slot}
                cached[MAMBA].add(nid)
        handles = {hid: frozenset(self._coverage(h, end)) for hid, h in self.locks.items()}
        locks = LockState(handles, lock_ref, frozenset())
        lru = {c: self._lru(c) for c in self._lru_components()}
        return self._finish(full, live, states, owners, locks, lru, {c: frozenset(ns) for c, ns in cached.items()})

    def _rust_snapshot(self) -> Snapshot:
        grain = self.ps if self.ps > 1 else 1
        owners: dict[Component, dict[Owner, set[int]]] = {c: {} for c in (FULL, SWA, MAMBA)}
        tree = node_owner(NodeId(0), FULL)  # NOTE: the Rust core exposes no node; "the tree" is one owner
        full = self._canary_chains()
        owners[FULL][tree] = {x // grain for xs in full.values() for x in xs}
        live: set[Key] = set()
        if self.config.window is not None:
            walk = self.cache.tree_core.walk_for_kv_canary(False, True)  # swa_resident_only
            resident = {int(x) for x in walk.slot_indices.tolist()}
            live = {k for k, xs in full.items() if set(xs) <= resident}
            owners[SWA][node_owner(NodeId(0), SWA)] = self.pools.swa_of(x for k in live for x in full[k])
        states: dict[Key, int] = {}
        if self.config.mamba:
            for k in full:
                matched, node_id, pinned = self.cache.tree_core.match_full_device_prefix(self._key(k))
                slot = self._state_at(node_id) if matched == pinned == len(k) else None
                if slot is not None:
                    states[k] = slot
            held = {int(x) for x in self.cache.tree_core.all_mamba_values_flatten().reshape(-1).tolist()}
            owners[MAMBA][node_owner(NodeId(0), MAMBA)] = held
        return self._finish(full, live, states, owners, LockState(), {}, {})

    def _finish(
        self,
        full: dict[Key, tuple[int, ...]],
        live: set[Key],
        states: dict[Key, int],
        owners: dict[Component, dict[Owner, set[int]]],
        locks: LockState,
        lru: dict[Component, LruState],
        cached: dict[Component, frozenset[NodeId]],
    ) -> Snapshot:
        prefix = PrefixCache(self.ps, self.config.window, self.config.mamba, full, frozenset(live), states)  # type: ignore[arg-type]
        ledgers = self.pools.ledgers(owners[FULL], owners[SWA], owners[MAMBA])
        sizes = {FULL: (int(self.cache.full_evictable_size()), int(self.cache.full_protected_size()))}
        if SWA in self.comps:
            sizes[SWA] = (int(self.cache.swa_evictable_size()), int(self.cache.swa_protected_size()))
        if MAMBA in self.comps:
            sizes[MAMBA] = (int(self.cache.mamba_evictable_size()), int(self.cache.mamba_protected_size()))
        slots = [x for xs in full.values() for x in xs]
        content = self.kv.content(slots) if "content" in self.capabilities else {}
        return Snapshot(prefix, locks, lru, ledgers, content, sizes, cached)

    def _coverage(self, h: UnifiedLock, end: dict[int, tuple[int, ...]]) -> list[LockSite]:
        """What releasing ``h`` will lower: SGLang's release walk, replayed from the receipt without running it."""
        sites: list[LockSite] = []
        root = self._root()
        uuid, skipped = self._receipt(h)
        swa_on = SWA in self.comps and self.ct[SWA] not in skipped
        node = h.node
        if MAMBA in self.comps and self.ct[MAMBA] not in skipped and node is not root and id(node) in end:
            sites.append((end[id(node)], MAMBA))
        while node is not None and node is not root:
            toks = end.get(id(node))
            if toks is None:
                break
            pages = self._pages(toks, len(node.key))
            sites.extend((k, FULL) for k in pages)
            if swa_on:
                sites.extend((k, SWA) for k in pages)
                if uuid is not None and node.component_data[self.ct[SWA]].metadata.get("uuid") == uuid:
                    swa_on = False
            node = node.parent
        return sites

    def _lru(self, comp: Component) -> LruState:
        lst = self._lru_list(comp)
        pt = int(self.ct[comp])  # NOTE: device lists thread lru_prev/lru_next[component] (SGLang's README)
        return lru_state(comp, lst.head, lst.tail, lambda n: n.lru_prev[pt], lambda n: n.lru_next[pt], self.ids)


def _tokens(node: Any) -> list[int]:
    key = node.key
    raw = getattr(key, "raw_token_ids", None)  # NOTE: 0.5.23 (a key may be capped); before: token_ids
    return [int(t) for t in (raw() if raw is not None else key.token_ids)]


def unified_python_factory(config: CacheConfig) -> UnifiedAdapter:
    """SGLang 0.5.23 ``UnifiedRadixCache`` on its Python tree core (FULL, +SWA, +MAMBA as ``config`` names)."""
    return UnifiedAdapter(config, "python")


def unified_rust_factory(config: CacheConfig) -> UnifiedAdapter:
    """SGLang 0.5.23 ``UnifiedRadixCache`` on its Rust tree core (FULL, +SWA, +MAMBA as ``config`` names)."""
    return UnifiedAdapter(config, "rust")
