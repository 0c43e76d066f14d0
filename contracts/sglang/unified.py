"""SGLang 0.5.23's ``UnifiedRadixCache`` behind the adapter protocol, on its Python or its Rust tree core.

Factories (for ``kvledger check --adapter``): :func:`unified_python_factory`
and :func:`unified_rust_factory`; both take a
:class:`~kvledger.contracts.adapter.CacheConfig` and return a fresh adapter.
The tree core is chosen per cache (``CacheInitParams.tree_core_backend``);
the adapter refuses to run when SGLang silently fell back to another core.

How the protocol maps onto 0.5.23 (SGLang's own names):

* ``alloc_kv`` / ``free_kv``: ``TokenToKVPoolAllocator`` (or
  ``PagedTokenToKVPoolAllocator``) ``alloc`` / ``free``, ``device="cpu"``,
  ``kvcache=None``.
* ``match_prefix``: ``match_prefix(MatchPrefixParams(key=RadixKey(...)))``
  returns ``device_prefix_len`` and a ``NodeId``; the slots are
  ``path_device_indices(last_device_node)``.
* ``lock`` / ``unlock``: ``lock(node_id)`` returns a ``TreeLock`` carrying
  the acquire's receipt (``DecLockRefParams``); ``unlock`` gives exactly that
  object back, as the scheduler does.
* ``insert``: ``insert(InsertParams(key, value, prev_prefix_len=...))``.
  0.5.23 **frees the duplicate slots inside insert** (``value[prev_prefix_len
  :prefix_len]``, ``prev_prefix_len`` being the caller's
  ``cache_protected_len``). The adapter passes the protected length (how many
  leading offered slots are already the tree's own, read before the insert)
  and reports ``value[protected:prefix_len]`` as ``dup_slots``; since SGLang
  already returned them to the allocator, the adapter's ``free_kv`` of those
  slots acknowledges them instead of freeing twice (a protocol flag for this
  is proposed in the report).
* ``evict``: ``evict(EvictParams(num_tokens=n))``.
* ``snapshot``, Python core: a read-only walk of ``tree_core.root_node``
  (keys, ``component_data[FULL].value`` and ``.lock_ref``), the allocator's
  free pages, the size counters. Rust core: the tree is opaque; the cached
  slots come from SGLang's own KV-canary walk (``walk_for_kv_canary``: each
  cached slot with its position and the slot before it), the tokens of each
  chain from the stand-in KV buffer, and the size counters.

What 0.5.23 cannot express here (skipped and reported):

* Full attention keeps no LRU list in 0.5.23 (eviction goes through
  ``evictable_device_leaves``): no ``lru`` for a full-attention cache.
* Locks carry a receipt but no identity of their own: a second ``unlock`` of
  the same ``TreeLock`` is refused only when it drives a ``lock_ref`` below
  zero (an ``AssertionError``, a Rust panic), not when another lock holds
  the node: no ``rejects_double_unlock``.
* Rust core: no node, ``lock_ref`` or list is readable from Python, so no
  ``locks`` and no ``lru``; and since its cached keys are read back through
  the KV buffer, ``content`` would check itself: no ``content``.
* SWA and Mamba configurations are not wired yet (see the report).
"""

from __future__ import annotations

from array import array
from collections.abc import Hashable, Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch

from kvledger.contracts.adapter import CacheConfig, Inserted, Match, Snapshot
from kvledger.contracts.sglang.common import FULL, KVBuffer, NodeIds, NotExpressible, ledger, node_owner
from kvledger.contracts.sglang.cpu_import import UNIFIED, import_sglang
from kvledger.spec.locks import Key, LockSite, LockState
from kvledger.spec.prefix import PrefixCache
from kvledger.spec.types import Component, HandleId, NodeId, Owner

MODULES = (
    "sglang.srt.mem_cache.unified_radix_cache",
    "sglang.srt.mem_cache.allocator",
    "sglang.srt.mem_cache.memory_pool",
    "sglang.srt.mem_cache.cache_init_params",
    "sglang.test.unified_allocator_fixtures",
)
CORES = {"python": "UnifiedTreeCore", "rust": "RustUnifiedTreeCore"}
_context_ready = False


def _sglang() -> tuple[str, SimpleNamespace]:
    """Import 0.5.23's memory manager on CPU (once: also publishes the CPU server args the caches read)."""
    global _context_ready
    version = import_sglang(UNIFIED, MODULES)
    import sglang.srt.mem_cache.allocator as allocator  # type: ignore[import-not-found]
    import sglang.srt.mem_cache.base_prefix_cache as base  # type: ignore[import-not-found]
    import sglang.srt.mem_cache.cache_init_params as params  # type: ignore[import-not-found]
    import sglang.srt.mem_cache.memory_pool as pool  # type: ignore[import-not-found]
    import sglang.srt.mem_cache.radix_cache as radix  # type: ignore[import-not-found]
    import sglang.srt.mem_cache.unified_radix_cache as unified  # type: ignore[import-not-found]
    import sglang.test.unified_allocator_fixtures as fixtures  # type: ignore[import-not-found]
    from sglang.srt.mem_cache.unified_cache.components import ComponentType  # type: ignore[import-not-found]

    if not _context_ready:
        fixtures.setup_allocator_context()
        _context_ready = True
    return version, SimpleNamespace(
        allocator=allocator,
        base=base,
        params=params,
        pool=pool,
        radix=radix,
        unified=unified,
        fixtures=fixtures,
        ComponentType=ComponentType,
    )


@dataclass(eq=False)
class UnifiedLock:
    """What ``lock`` hands out: SGLang's ``TreeLock`` (its receipt), to be given back as it is."""

    hid: HandleId
    tree_lock: Any
    node: Any
    match: Match


def _handle(h: Hashable) -> UnifiedLock:
    if not isinstance(h, UnifiedLock):
        raise TypeError(f"not a handle of an SGLang 0.5.23 adapter: {h!r}")
    return h


class UnifiedAdapter:
    """SGLang 0.5.23 ``UnifiedRadixCache`` (full attention, token or paged) on one tree core."""

    name = "sglang-0.5.23"
    version = "0.5.23"

    def __init__(self, config: CacheConfig, core: str) -> None:
        if config.window is not None or config.mamba:
            raise NotExpressible(f"the SGLang 0.5.23 adapter wires full attention only (config {config.kind})")
        if core not in CORES:
            raise ValueError(f"unknown tree core {core!r}; expected one of {', '.join(CORES)}")
        self.version, self.sg = _sglang()
        self.core = core
        self.name = f"sglang-{self.version}/UnifiedRadixCache[{core}]"
        self.config = config
        self.ps = config.page_size
        caps = {"ledgers", "sizes"} | ({"locks", "content"} if core == "python" else set())
        self.capabilities = frozenset(caps)
        self.ids = NodeIds()
        self.kv = KVBuffer()
        self.req_kv: dict[int, set[int]] = {}
        self.freed_by_insert: dict[int, set[int]] = {}
        self.locks: dict[HandleId, UnifiedLock] = {}
        self.next_hid = 1
        a = self.sg.allocator
        if self.ps > 1:
            self.allocator = a.PagedTokenToKVPoolAllocator(config.kv_tokens, self.ps, torch.int64, "cpu", None, False)
        else:
            self.allocator = a.TokenToKVPoolAllocator(config.kv_tokens, torch.int64, "cpu", None, False)
        req_pool = self.sg.pool.ReqToTokenPool(size=4, max_context_len=64, device="cpu", enable_memory_saver=False)
        params = self.sg.params.CacheInitParams(
            disable=False,
            req_to_token_pool=req_pool,
            token_to_kv_pool_allocator=self.allocator,
            page_size=self.ps,
            tree_components=(self.sg.ComponentType.FULL,),
            tree_core_backend=core,
        )
        self.cache = self.sg.unified.UnifiedRadixCache(params)
        got = type(self.cache.tree_core).__name__
        if got != CORES[core]:
            raise RuntimeError(f"SGLang built a {got} where the {core} tree core ({CORES[core]}) was asked for")

    # ------------------------------------------------------------ pools

    def alloc_kv(self, req: int, n: int) -> tuple[int, ...] | None:
        got = self.allocator.alloc(n)
        if got is None:
            return None
        slots = tuple(int(x) for x in got.tolist())
        self.req_kv.setdefault(req, set()).update(slots)
        return slots

    def free_kv(self, req: int, slots: tuple[int, ...]) -> None:
        done = self.freed_by_insert.get(req, set())
        rest = [x for x in slots if x not in done]
        done.difference_update(slots)  # NOTE: insert already freed these: acknowledged, not freed twice
        if rest:
            self.allocator.free(torch.tensor(rest, dtype=torch.int64))
        self.req_kv.setdefault(req, set()).difference_update(slots)

    def alloc_mamba(self, req: int) -> int | None:
        raise NotExpressible("no Mamba component in this configuration")

    def free_mamba(self, req: int, slot: int) -> None:
        raise NotExpressible("no Mamba component in this configuration")

    def write_mamba(self, slot: int, value: int) -> None:
        raise NotExpressible("no Mamba component in this configuration")

    def write_kv(self, slots: tuple[int, ...], tokens: tuple[int, ...], start: int) -> None:
        self.kv.write(slots, tokens, start)

    # ------------------------------------------------------------ tree

    def _key(self, key: tuple[int, ...]) -> Any:
        return self.sg.radix.RadixKey(array("q", key))

    def _raw_match(self, key: tuple[int, ...]) -> tuple[Match, Any]:
        m = self.cache.match_prefix(self.sg.base.MatchPrefixParams(key=self._key(key)))
        n = int(m.device_prefix_len)
        slots = tuple(int(x) for x in self.cache.path_device_indices(m.last_device_node)[:n].tolist()) if n else ()
        return Match(n, slots, None), m.last_device_node

    def match_prefix(self, key: tuple[int, ...]) -> Match:
        return self._raw_match(key)[0]

    def lock(self, key: tuple[int, ...]) -> tuple[Match, Hashable]:
        m, node_id = self._raw_match(key)
        tree_lock = self.cache.lock(node_id)
        node = self.cache.tree_core.node_by_id(node_id) if self.core == "python" else node_id
        h = UnifiedLock(HandleId(self.next_hid), tree_lock, node, m)
        self.next_hid += 1
        self.locks[h.hid] = h
        return m, h

    def unlock(self, handle: Hashable) -> None:
        h = _handle(handle)
        self.cache.unlock(h.tree_lock)
        self.locks.pop(h.hid, None)

    def handle_id(self, handle: Hashable) -> int:
        return int(_handle(handle).hid)

    def _tree_prefix_slots(self, key: tuple[int, ...]) -> list[int]:
        """The tree's slots for the leading pages of ``key`` it holds (read-only on the Python core)."""
        if self.core == "python":
            out: list[int] = []
            node, rest = self.cache.tree_core.root_node, list(key)
            while rest:
                child = next((c for c in node.children.values() if _tokens(c)[: self.ps] == rest[: self.ps]), None)
                value = None if child is None else child.component_data[self.sg.ComponentType.FULL].value
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
        if mamba is not None:
            raise NotExpressible("no Mamba component in this configuration")
        protected = 0
        for mine, theirs in zip(slots, self._tree_prefix_slots(key), strict=False):
            if mine != theirs:
                break
            protected += 1
        protected -= protected % self.ps
        r = self.cache.insert(
            self.sg.base.InsertParams(
                key=self._key(key), value=torch.tensor(slots, dtype=torch.int64), prev_prefix_len=protected
            )
        )
        prefix_len = int(r.prefix_len)
        dups = slots[protected:prefix_len]
        self.freed_by_insert.setdefault(req, set()).update(dups)
        self.req_kv.setdefault(req, set()).difference_update(slots)
        return Inserted(prefix_len, dups, None)

    def evict(self, component: Component, n: int) -> int:
        if component is not FULL:
            raise NotExpressible(f"no {component.value} component in this configuration")
        return int(self.cache.evict(self.sg.base.EvictParams(num_tokens=n)).num_tokens_evicted)

    def mamba_cow(self, handle: Hashable, req: int) -> int | None:
        raise NotExpressible("no Mamba component in this configuration")

    # ------------------------------------------------------------ abstraction

    def _nodes(self) -> Iterator[tuple[Any, tuple[int, ...]]]:
        stack: list[tuple[Any, tuple[int, ...]]] = [(c, ()) for c in self.cache.tree_core.root_node.children.values()]
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
        grain = self.ps if self.ps > 1 else 1
        owners: dict[Owner, set[int]] = {}
        full: dict[Key, tuple[int, ...]] = {}
        locks = LockState()
        if self.core == "python":
            end: dict[int, tuple[int, ...]] = {}
            lock_ref: dict[LockSite, int] = {}
            for n, toks in self._nodes():
                nid: NodeId = self.ids(n)
                end[id(n)] = toks
                data = n.component_data[self.sg.ComponentType.FULL]
                if data.value is None:
                    continue
                vals = [int(x) for x in data.value.tolist()]
                for i, k in enumerate(self._pages(toks, len(vals))):
                    full[k] = tuple(vals[i * self.ps : (i + 1) * self.ps])
                    if data.lock_ref:
                        lock_ref[(k, FULL)] = int(data.lock_ref)
                owners.setdefault(node_owner(nid, FULL), set()).update(x // grain for x in vals)
            handles = {hid: frozenset(self._path_sites(h.node, end)) for hid, h in self.locks.items()}
            locks = LockState(handles, lock_ref, frozenset())
        else:
            full = self._canary_chains()
            # NOTE: the Rust core exposes no node; the cached slots are held by "the tree" as one owner
            owners[node_owner(NodeId(0), FULL)] = {x // grain for xs in full.values() for x in xs}
        a = self.allocator
        free_pages = self.allocator.get_all_free_pages() if self.ps > 1 else torch.cat((a.free_pages, a.release_pages))
        free = [int(x) for x in free_pages.tolist()]
        if self.ps > 1:
            reqs = {r: {x // self.ps for x in xs} for r, xs in self.req_kv.items()}
            kv = ledger("kv", a.num_pages, 1, free, owners, reqs)
        else:
            kv = ledger("kv", a.size, 1, free, owners, self.req_kv)
        prefix = PrefixCache(self.ps, None, False, full, frozenset(), {})  # type: ignore[arg-type]
        sizes = {FULL: (int(self.cache.full_evictable_size()), int(self.cache.full_protected_size()))}
        slots = [x for xs in full.values() for x in xs]
        content = self.kv.content(slots) if "content" in self.capabilities else {}
        return Snapshot(prefix, locks, {}, {"kv": kv}, content, sizes, {})

    def _path_sites(self, node: Any, end: dict[int, tuple[int, ...]]) -> list[LockSite]:
        sites: list[LockSite] = []
        root = self.cache.tree_core.root_node
        while node is not None and node is not root:
            toks = end.get(id(node))
            if toks is None:
                break
            sites.extend((k, FULL) for k in self._pages(toks, len(node.key)))
            node = node.parent
        return sites


def _tokens(node: Any) -> list[int]:
    return [int(t) for t in node.key.raw_token_ids()]


def unified_python_factory(config: CacheConfig) -> UnifiedAdapter:
    """SGLang 0.5.23 ``UnifiedRadixCache`` on its Python tree core (full attention; page size 1 or more)."""
    return UnifiedAdapter(config, "python")


def unified_rust_factory(config: CacheConfig) -> UnifiedAdapter:
    """SGLang 0.5.23 ``UnifiedRadixCache`` on its Rust tree core (full attention; page size 1 or more)."""
    return UnifiedAdapter(config, "rust")
