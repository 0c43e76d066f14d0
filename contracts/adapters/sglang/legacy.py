"""SGLang 0.5.9's radix caches behind the adapter protocol: ``RadixCache`` and ``MambaRadixCache``.

Written for 0.5.9 and run on every later release that ships them: ``RadixCache`` to 0.5.23 (range ``LEGACY``),
``MambaRadixCache`` to 0.5.20 (``LEGACY_MAMBA``; 0.5.21 drops it), both with 0.5.9's structure (the installed
release is named in ``version``). What moved, and how the adapter follows it, each read from the installed code
rather than from a version number:

* from 0.5.10, ``MambaRadixCache.insert`` frees the duplicates past ``InsertParams.prev_prefix_len``
  itself (``cache_finished_req`` passes ``req.cache_protected_len``): the adapter passes the protected
  length and reports those duplicates as ``dups_freed``, so the caller does not free them again;
* from 0.5.11 a node's child key is the key's own ``child_key``;
* from 0.5.13 Mamba slots come from ``HybridReqToTokenPool.mamba_allocator`` (``MambaPool`` keeps only
  the state tensors), and a copy-on-write match only records its source (``mamba_cow_src_index``: the
  forward pass copies); the slot handed out is the same;
* from 0.5.19 publishing server args resolves them (``ServerArgs.resolve_once``): the Mamba cache gets SGLang's
  own ``ServerArgs`` with the chunk size pre-seeded (:func:`_publish_chunk_size`), and a copy-on-write match
  fills the request's ``kv.mamba_pool_idx`` (a ``ReqKvInfo``) instead of its own (:func:`cow_request`);
* from 0.5.20 a paged allocator stages its frees (``staged_pages``, ``release_pages`` None): its free pages
  are ``get_all_free_pages()`` where it has one (:func:`free_pages`);
* from 0.5.22 a match carries its length only (``device_prefix_len``): its slots are
  ``path_device_indices(last_device_node)`` (:func:`match_slots`).

Factories (for ``kvledger check --adapter``): :func:`radix_cache_factory`
and :func:`mamba_radix_cache_factory`; both take a
:class:`~kvledger.contracts.adapters.protocol.CacheConfig` and return a fresh adapter.
The third legacy cache, ``SWARadixCache``, is read on the same base in
:mod:`~kvledger.contracts.adapters.sglang.legacy_swa`.

How the protocol maps onto 0.5.9 (SGLang's own names):

* ``alloc_kv`` / ``free_kv``: ``TokenToKVPoolAllocator.alloc`` / ``free``
  (``PagedTokenToKVPoolAllocator`` for pages), ``device="cpu"``,
  ``kvcache=None``. ``alloc_mamba`` / ``free_mamba``: ``MambaPool.alloc`` /
  ``free`` of a ``HybridReqToTokenPool``.
* ``match_prefix``: ``match_prefix(MatchPrefixParams(key=RadixKey(...)))``
  (it splits nodes and refreshes LRU order, as in SGLang).
* ``lock``: ``match_prefix`` then ``inc_lock_ref(last_node)``. 0.5.9 returns
  no receipt: the *node* is what ``dec_lock_ref(node)`` must be given back,
  so the adapter's handle holds the node (and, for Mamba, whether the
  node's state was locked).
* ``insert``: ``insert(InsertParams(key, value, mamba_value))``. 0.5.9
  returns only ``prefix_len`` (and ``mamba_exist``) and **leaves the
  duplicates to the caller**: as ``cache_finished_req`` does, the adapter
  reports ``value[cache_protected_len:prefix_len]`` as duplicates (the
  protected length is how many leading offered slots are the tree's own,
  read before the insert), and the machine frees them (``MambaRadixCache``
  from 0.5.10 frees them itself: ``dups_freed``). A duplicate Mamba
  state is the offered one when ``mamba_exist``.
* ``evict``: ``evict(EvictParams(num_tokens=n))`` (``mamba_num=n`` for MAMBA).
* ``mamba_cow``: ``match_prefix(..., cow_mamba=True, req=...)`` with a
  request that has no Mamba slot yet, as admission does; ``None`` when SGLang
  asserts it "Can not alloc mamba cache".
* ``snapshot``: a read-only walk of ``root_node`` (keys, ``value``,
  ``mamba_value``, ``lock_ref`` / ``full_lock_ref`` / ``mamba_lock_ref``);
  the allocators' ``free_pages`` and ``release_pages`` and the Mamba pool's
  ``free_slots``; for ``MambaRadixCache`` its two ``LRUList`` objects
  walked from ``head`` through ``next`` / ``mamba_next``, with the
  ``prev`` / ``next`` pointers of every node the adapter ever saw; the
  size counters.

What 0.5.9 cannot express (those laws are skipped and reported):

* ``RadixCache`` keeps no LRU list (eviction is a heap over
  ``evictable_leaves`` by ``last_access_time``): no ``lru``.
* No SWA component in either class: a config with a window is refused.
* Locks carry no identity (``dec_lock_ref(node)``): a second release of the
  same lock cannot be told from a release of another lock on the same node,
  so ``double_dec_lock_ref`` is skipped (no ``rejects_double_unlock``).
* ``MambaRadixCache.insert`` requires a Mamba state (every request owns one
  from admission on): no ``stateless_insert``.
* ``RadixCache`` has no copy-on-write: no ``mamba_cow``.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch

from kvledger.contracts.adapters.protocol import CacheConfig, Inserted, Match, Snapshot
from kvledger.contracts.adapters.sglang.common import (
    FULL,
    MAMBA,
    KVBuffer,
    NodeIds,
    NotExpressible,
    alloc_state,
    copy_on_write,
    cow_request,
    evict_component,
    free_state,
    hybrid_rows,
    ledger,
    lru_state,
    match_slots,
    node_owner,
)
from kvledger.contracts.adapters.sglang.cpu_import import LEGACY, LEGACY_MAMBA, TestedRange, import_sglang
from kvledger.spec.locks import Key, LockSite, LockState
from kvledger.spec.lru import LruState
from kvledger.spec.prefix import PrefixCache
from kvledger.spec.types import Component, HandleId, NodeId, Owner

MODULES = (
    "sglang.srt.mem_cache.radix_cache",
    "sglang.srt.mem_cache.allocator",
    "sglang.srt.mem_cache.memory_pool",
    "sglang.srt.mem_cache.cache_init_params",
    "sglang.srt.server_args",
)
MAMBA_MODULE = "sglang.srt.mem_cache.mamba_radix_cache"


def _sglang(tested: TestedRange = LEGACY, extra: tuple[str, ...] = ()) -> tuple[str, SimpleNamespace]:
    """Import the installed release's memory manager on CPU, checked against ``tested``; the modules the adapters
    use, by short name.

    ``extra``: more modules the adapter reads (imported with the rest, by the same check), such as
    ``MAMBA_MODULE`` (range ``LEGACY_MAMBA``: 0.5.21 no longer ships it); ``.mamba`` is that module, else None.
    """
    version = import_sglang(tested, (*MODULES, *extra))
    import sglang.srt.mem_cache.allocator as allocator  # type: ignore[import-not-found]
    import sglang.srt.mem_cache.base_prefix_cache as base  # type: ignore[import-not-found]
    import sglang.srt.mem_cache.cache_init_params as params  # type: ignore[import-not-found]
    import sglang.srt.mem_cache.memory_pool as pool  # type: ignore[import-not-found]
    import sglang.srt.mem_cache.radix_cache as radix  # type: ignore[import-not-found]
    import sglang.srt.server_args as server_args  # type: ignore[import-not-found]

    return version, SimpleNamespace(
        allocator=allocator,
        base=base,
        params=params,
        mamba=importlib.import_module(MAMBA_MODULE) if MAMBA_MODULE in extra else None,
        pool=pool,
        radix=radix,
        server_args=server_args,
    )


def _publish_chunk_size(server_args: Any) -> None:
    """Publish global server args that carry Mamba's cache chunk size (``match_prefix`` reads it; nothing else is read).

    Up to 0.5.18 any object with the field will do. From 0.5.19 publishing resolves the args first
    (``ServerArgs.resolve_once``), so they must be SGLang's own, with the chunk size pre-seeded
    (``_mamba_cache_chunk_size``, as its own test fixtures do, so no model config is looked up).
    """
    if hasattr(server_args.ServerArgs, "resolve_once"):
        args = server_args.ServerArgs(model_path="dummy", device="cpu")
        args._mamba_cache_chunk_size = 64
    else:
        args = SimpleNamespace(mamba_cache_chunk_size=64)
    server_args.set_global_server_args_for_scheduler(args)


def free_pages(allocator: Any) -> list[int]:
    """A KV allocator's free pages (slots at page size 1): ``get_all_free_pages()`` where it has one (0.5.20 on:
    a paged allocator stages its frees in ``staged_pages`` and leaves ``release_pages`` None), else its free
    list and the pages it holds back for release."""
    every = getattr(allocator, "get_all_free_pages", None)
    pages = every() if every is not None else torch.cat((allocator.free_pages, allocator.release_pages))
    return [int(x) for x in pages.tolist()]


def slots_along(
    key: tuple[int, ...],
    ps: int,
    root: Any,
    step: Callable[[Any, tuple[int, ...]], tuple[Any, Sequence[int], Sequence[int]] | None],
) -> list[int]:
    """The slots a tree holds along ``key`` as far as it caches it, in whole pages of ``ps``: from ``root``,
    ``step(node, rest)`` gives the child whose edge starts ``rest``, with the edge's tokens and slots (``None``
    where no child does)."""
    out: list[int] = []
    at, rest = root, key
    while rest:
        found = step(at, rest)
        if found is None:
            break
        child, toks, slots = found
        same = 0
        while same < min(len(toks), len(rest)) and toks[same] == rest[same]:
            same += 1
        same -= same % ps
        out.extend(int(x) for x in slots[:same])
        if same < len(toks):
            break
        at, rest = child, rest[same:]
    return out


@dataclass(eq=False)
class LegacyLock:
    """What ``lock`` hands out: the node ``dec_lock_ref`` must get back (0.5.9 returns no receipt)."""

    hid: HandleId
    node: Any
    mamba_locked: bool
    match: Match
    key: tuple[int, ...]
    released: bool = field(default=False)
    receipt: Any = None
    """What ``inc_lock_ref`` returned, for ``dec_lock_ref`` (``SWARadixCache``: the SWA boundary uuid)."""


def _handle(h: Hashable) -> LegacyLock:
    if not isinstance(h, LegacyLock):
        raise TypeError(f"not a handle of an SGLang legacy cache adapter: {h!r}")
    return h


class _LegacyAdapter:
    """Shared by both adapters: pools, the stand-in KV buffer, locks, the tree walk."""

    name = "sglang-0.5.9"
    version = "0.5.9"
    capabilities: frozenset[str] = frozenset()

    def __init__(self, config: CacheConfig) -> None:
        if config.window is not None and not self.takes_window:
            raise NotExpressible(f"SGLang {type(self).__name__}: no SWA component (config {config.kind})")
        self.version, self.sg = self._import(config)
        self.name = f"sglang-{self.version}/{self.cache_class}"
        self.config = config
        self.ps = config.page_size
        self.ids = NodeIds()
        self.kv = KVBuffer()
        self.req_kv: dict[int, set[int]] = {}
        self.req_mamba: dict[int, set[int]] = {}
        self.locks: dict[HandleId, LegacyLock] = {}
        self.next_hid = 1
        self.allocator = self._allocator()
        self.cache = self._build()

    cache_class = ""
    takes_window = False
    """Whether the cache has an SWA component (``SWARadixCache``): a config with a window is refused otherwise."""

    def _import(self, config: CacheConfig) -> tuple[str, SimpleNamespace]:
        return _sglang(LEGACY_MAMBA, (MAMBA_MODULE,)) if config.mamba else _sglang()

    def _allocator(self) -> Any:
        """The KV allocator the cache frees into: SGLang's token allocator (paged for pages)."""
        a = self.sg.allocator
        if self.ps > 1:
            return a.PagedTokenToKVPoolAllocator(self.config.kv_tokens, self.ps, torch.int64, "cpu", None, False)
        return a.TokenToKVPoolAllocator(self.config.kv_tokens, torch.int64, "cpu", None, False)

    def _build(self) -> Any:
        raise NotImplementedError

    # ------------------------------------------------------------ pools

    def alloc_kv(self, req: int, n: int) -> tuple[int, ...] | None:
        got = self.allocator.alloc(n)
        if got is None:
            return None
        slots = tuple(int(x) for x in got.tolist())
        self.req_kv.setdefault(req, set()).update(slots)
        return slots

    def free_kv(self, req: int, slots: tuple[int, ...]) -> None:
        self.allocator.free(torch.tensor(slots, dtype=torch.int64))
        self.req_kv.setdefault(req, set()).difference_update(slots)

    def alloc_mamba(self, req: int) -> int | None:
        raise NotExpressible("SGLang's RadixCache has no Mamba pool")

    def free_mamba(self, req: int, slot: int) -> None:
        raise NotExpressible("SGLang's RadixCache has no Mamba pool")

    def write_mamba(self, slot: int, value: int) -> None:
        raise NotExpressible("SGLang's RadixCache has no Mamba pool")

    def write_kv(self, slots: tuple[int, ...], tokens: tuple[int, ...], start: int) -> None:
        self.kv.write(slots, tokens, start)

    # ------------------------------------------------------------ tree

    def _key(self, key: tuple[int, ...]) -> Any:
        return self.sg.radix.RadixKey(list(key))

    def _raw_match(self, key: tuple[int, ...], **extra: Any) -> tuple[Match, Any]:
        m = self.cache.match_prefix(self.sg.base.MatchPrefixParams(key=self._key(key), **extra))
        node = m.last_device_node
        slots = match_slots(self.cache, m)
        state = self._state_of(node) if slots else None
        return Match(len(slots), slots, state), node

    def _state_of(self, node: Any) -> int | None:
        return None

    def match_prefix(self, key: tuple[int, ...]) -> Match:
        return self._raw_match(key)[0]

    def lock(self, key: tuple[int, ...]) -> tuple[Match, Hashable]:
        m, node = self._raw_match(key)
        mamba_locked, receipt = self._lock_node(node)
        h = LegacyLock(HandleId(self.next_hid), node, mamba_locked, m, key, receipt=receipt)
        self.next_hid += 1
        self.locks[h.hid] = h
        return m, h

    def _lock_node(self, node: Any) -> tuple[bool, Any]:
        """``inc_lock_ref(node)``: whether it locked the node's Mamba state, and what the release must be given."""
        self.cache.inc_lock_ref(node)
        return False, None

    def _release(self, h: LegacyLock) -> None:
        self.cache.dec_lock_ref(h.node)

    def unlock(self, handle: Hashable) -> None:
        h = _handle(handle)
        # NOTE: forwarded even when already released: 0.5.9 has no way to refuse it, and the checker must see that.
        self._release(h)
        h.released = True
        self.locks.pop(h.hid, None)

    def handle_id(self, handle: Hashable) -> int:
        return int(_handle(handle).hid)

    def _child_key(self, key: tuple[int, ...]) -> Any:
        """The key of ``key``'s first edge in ``children``: the cache's function (0.5.9), the key's own (0.5.11+)."""
        radix_key = self._key(key)
        child_key_fn = getattr(self.cache, "get_child_key_fn", None)
        return child_key_fn(radix_key) if child_key_fn is not None else radix_key.child_key(self.ps)

    def _tree_slots(self, key: tuple[int, ...]) -> list[int]:
        """The tree's slots along ``key`` as far as it is cached, read without touching the cache."""

        def step(node: Any, rest: tuple[int, ...]) -> tuple[Any, list[int], list[int]] | None:
            child = node.children.get(self._child_key(rest))
            if child is None or child.value is None:
                return None
            return child, list(child.key.token_ids), child.value.tolist()

        return slots_along(key, self.ps, self.cache.root_node, step)

    def _protected_len(self, key: tuple[int, ...], slots: tuple[int, ...]) -> int:
        """SGLang's ``cache_protected_len``: how many leading offered slots are already the tree's own."""
        n = 0
        for mine, theirs in zip(slots, self._tree_slots(key), strict=False):
            if mine != theirs:
                break
            n += 1
        return n - n % self.ps

    def evict(self, component: Component, n: int) -> int:
        if component is FULL:
            return evict_component(self.cache, self.sg.base.EvictParams, component, n)
        raise NotExpressible(f"SGLang {self.cache_class}: no {component.value} component")

    def mamba_cow(self, handle: Hashable, req: int) -> int | None:
        raise NotExpressible("SGLang's RadixCache has no Mamba copy-on-write")

    # ------------------------------------------------------------ abstraction

    def _nodes(self) -> Iterator[tuple[Any, tuple[int, ...]]]:
        """Every node below the root with the tokens from the root to its end."""
        stack: list[tuple[Any, tuple[int, ...]]] = [(c, ()) for c in self.cache.root_node.children.values()]
        while stack:
            n, above = stack.pop()
            toks = above + tuple(int(t) for t in n.key.token_ids)
            yield n, toks
            stack.extend((c, toks) for c in n.children.values())

    def _pages(self, toks: tuple[int, ...], length: int) -> list[Key]:
        start = len(toks) - length
        return [toks[: start + i + self.ps] for i in range(0, length, self.ps)]

    def _path_sites(self, node: Any, end: dict[int, tuple[int, ...]]) -> list[LockSite]:
        sites: list[LockSite] = []
        while node is not self.cache.root_node and node is not None:
            toks = end.get(id(node))
            if toks is None:  # NOTE: a locked node that left the tree: its lock covers nothing cached
                break
            sites.extend((k, FULL) for k in self._pages(toks, len(node.key)))
            node = node.parent
        return sites

    def _full_lock_ref(self, node: Any) -> int:
        return int(node.lock_ref)

    def lockable(self, last: Any) -> bool:
        """Whether a request's ``last_node`` holds a lock on the tree (a node below the root, not the session
        layer's stand-in)."""
        return last is not None and last is not self.cache.root_node and hasattr(last, "children")

    def node_values(self) -> Iterator[tuple[NodeId, list[int], list[int] | None]]:
        """Each node's id, KV slots and Mamba state (``None`` where it holds none)."""
        for n, _ in self._nodes():
            mamba = getattr(n, "mamba_value", None)
            yield self.ids(n), n.value.tolist(), None if mamba is None else mamba.tolist()

    def _base_snapshot(self) -> tuple[dict[Key, tuple[int, ...]], dict[int, tuple[int, ...]], dict[Owner, set[int]]]:
        full: dict[Key, tuple[int, ...]] = {}
        end: dict[int, tuple[int, ...]] = {}
        owners: dict[Owner, set[int]] = {}
        grain = self.ps if self.ps > 1 else 1
        for n, toks in self._nodes():
            nid = self.ids(n)
            end[id(n)] = toks
            vals = [int(x) for x in n.value.tolist()]
            for i, k in enumerate(self._pages(toks, len(vals))):
                full[k] = tuple(vals[i * self.ps : (i + 1) * self.ps])
            owners.setdefault(node_owner(nid, FULL), set()).update(x // grain for x in vals)
        return full, end, owners

    def _kv_ledger(self, owners: dict[Owner, set[int]]) -> Any:
        a = self.allocator
        free = free_pages(a)
        if self.ps > 1:
            reqs = {r: {x // self.ps for x in xs} for r, xs in self.req_kv.items()}
            return ledger("kv", a.num_pages, 1, free, owners, reqs)
        return ledger("kv", a.size, 1, free, owners, self.req_kv)

    def _locks(self, end: dict[int, tuple[int, ...]], extra: dict[LockSite, int]) -> LockState:
        lock_ref: dict[LockSite, int] = dict(extra)
        for n, toks in self._nodes():
            ref = self._full_lock_ref(n)
            if ref != 0:
                for k in self._pages(toks, len(n.key)):
                    lock_ref[(k, FULL)] = ref
        handles = {hid: frozenset(self._coverage(h, end)) for hid, h in self.locks.items()}
        return LockState(handles, lock_ref, frozenset())

    def _coverage(self, h: LegacyLock, end: dict[int, tuple[int, ...]]) -> set[LockSite]:
        """What releasing ``h`` will lower: the full path to the root, and the node's Mamba state if it locked it."""
        cov = set(self._path_sites(h.node, end))
        if h.mamba_locked and id(h.node) in end:
            cov.add((end[id(h.node)], MAMBA))
        return cov


class LegacyRadixAdapter(_LegacyAdapter):
    """SGLang 0.5.9 to 0.5.23 ``RadixCache`` (full attention, token or paged) behind the adapter protocol."""

    cache_class = "RadixCache"
    # NOTE: ``lru_policy``: measured on 0.5.9 and 0.5.10, full and full-paged, 150 examples a model (and 0.5.11 to
    # 0.5.23 at seeds 1 and 2, 100 each)
    capabilities = frozenset({"locks", "ledgers", "content", "sizes", "stateless_insert", "lru_policy"})

    def __init__(self, config: CacheConfig) -> None:
        if config.mamba:
            raise NotExpressible("SGLang's RadixCache has no Mamba component: use mamba_radix_cache_factory")
        super().__init__(config)

    def _build(self) -> Any:
        params = self.sg.params.CacheInitParams(
            disable=False, req_to_token_pool=None, token_to_kv_pool_allocator=self.allocator, page_size=self.ps
        )
        return self.sg.radix.RadixCache(params)

    def insert(self, req: int, key: tuple[int, ...], slots: tuple[int, ...], mamba: int | None) -> Inserted:
        if mamba is not None:
            raise NotExpressible("SGLang 0.5.9 RadixCache has no Mamba component")
        protected = self._protected_len(key, slots)
        value = torch.tensor(slots, dtype=torch.int64)
        r = self.cache.insert(self.sg.base.InsertParams(key=self._key(key), value=value))
        prefix_len = int(r.prefix_len)
        dups = slots[protected:prefix_len]
        self.req_kv.setdefault(req, set()).difference_update(set(slots) - set(dups))
        return Inserted(prefix_len, dups, None)

    def snapshot(self) -> Snapshot:
        full, end, owners = self._base_snapshot()
        prefix = PrefixCache(self.ps, None, False, full, frozenset(), {})  # type: ignore[arg-type]
        slots = [x for xs in full.values() for x in xs]
        sizes = {FULL: (int(self.cache.evictable_size()), int(self.cache.protected_size()))}
        return Snapshot(
            prefix,
            self._locks(end, {}),
            {},
            {"kv": self._kv_ledger(owners)},
            self.kv.content(slots),
            sizes,
            {},
        )


class _TwoListAdapter(_LegacyAdapter):
    """A cache with a full and a second ``LRUList`` (Mamba's or SWA's), and a ``full_lock_ref`` per node."""

    def _full_lock_ref(self, node: Any) -> int:
        return int(node.full_lock_ref)

    def _lru(self, lst: Any, comp: Component) -> LruState:
        return lru_state(
            comp, lst.head, lst.tail, lambda n: getattr(n, lst.prv), lambda n: getattr(n, lst.nxt), self.ids
        )


class LegacyMambaAdapter(_TwoListAdapter):
    """SGLang 0.5.9 to 0.5.20 ``MambaRadixCache`` (full attention + Mamba states, page size 1), its two ``LRUList``."""

    cache_class = "MambaRadixCache"
    capabilities = frozenset({"lru", "locks", "ledgers", "content", "sizes", "mamba_cow", "mamba_content"})

    def __init__(self, config: CacheConfig) -> None:
        if not config.mamba:
            raise NotExpressible("MambaRadixCache needs a Mamba config: use radix_cache_factory for full attention")
        if config.page_size != 1:
            raise NotExpressible("SGLang 0.5.9 MambaRadixCache supports page size 1 only (without extra buffer)")
        super().__init__(config)
        if getattr(self.req_pool, "mamba_allocator", None) is not None:
            # NOTE: from 0.5.13 a copy-on-write only records its source (the forward pass copies the state), so
            # what the new slot holds is not the cache's to answer for
            self.capabilities = self.capabilities - {"mamba_content"}

    def _build(self) -> Any:
        _publish_chunk_size(self.sg.server_args)
        self.req_pool = hybrid_rows(self.sg.pool.HybridReqToTokenPool, 4, self.config.mamba_slots, 64)
        params = self.sg.params.CacheInitParams(
            disable=False,
            req_to_token_pool=self.req_pool,
            token_to_kv_pool_allocator=self.allocator,
            page_size=self.ps,
        )
        cache = self.sg.mamba.MambaRadixCache(params)
        self.frees_dups = "prev_prefix_len" in inspect.signature(cache._insert_helper).parameters
        """Whether this release's insert frees the duplicates past ``prev_prefix_len`` itself (0.5.10 on)."""
        return cache

    @property
    def mamba_pool(self) -> Any:
        """The state tensors (``MambaPool``)."""
        return self.req_pool.mamba_pool

    @property
    def mamba_allocator(self) -> Any:
        """Where Mamba slots are allocated and freed: ``mamba_allocator`` from 0.5.13, ``MambaPool`` before."""
        return getattr(self.req_pool, "mamba_allocator", None) or self.req_pool.mamba_pool

    def alloc_mamba(self, req: int) -> int | None:
        return alloc_state(self.mamba_allocator, req, self.req_mamba)

    def free_mamba(self, req: int, slot: int) -> None:
        free_state(self.mamba_allocator, req, slot, self.req_mamba)

    def write_mamba(self, slot: int, value: int) -> None:
        self.mamba_pool.mamba_cache.temporal[:, slot] = float(value)

    def _state_of(self, node: Any) -> int | None:
        return None if node.mamba_value is None else int(node.mamba_value[0])

    def _lock_node(self, node: Any) -> tuple[bool, Any]:
        has_state = node is not self.cache.root_node and node.mamba_value is not None
        self.cache.inc_lock_ref(node)
        return has_state, None

    def insert(self, req: int, key: tuple[int, ...], slots: tuple[int, ...], mamba: int | None) -> Inserted:
        if mamba is None:
            raise NotExpressible("SGLang 0.5.9 MambaRadixCache.insert requires a Mamba state (no stateless_insert)")
        protected = self._protected_len(key, slots)
        extra = {"prev_prefix_len": protected} if self.frees_dups else {}
        r = self.cache.insert(
            self.sg.base.InsertParams(
                key=self._key(key),
                value=torch.tensor(slots, dtype=torch.int64),
                mamba_value=torch.tensor([mamba], dtype=torch.int64),
                **extra,
            )
        )
        prefix_len = int(r.prefix_len)
        dups = slots[protected:prefix_len]
        dup_mamba = mamba if r.mamba_exist else None
        held = self.req_kv.setdefault(req, set())
        held.difference_update(set(slots) - set(dups))
        if self.frees_dups:
            held.difference_update(dups)
        if dup_mamba is None:
            self.req_mamba.setdefault(req, set()).discard(mamba)
        return Inserted(prefix_len, dups, dup_mamba, dups if self.frees_dups else ())

    def evict(self, component: Component, n: int) -> int:
        if component is MAMBA:
            return evict_component(self.cache, self.sg.base.EvictParams, component, n)
        return super().evict(component, n)

    def mamba_cow(self, handle: Hashable, req: int) -> int | None:
        h = _handle(handle)
        key = self._key(h.key[: h.match.length])
        request, slot_of = cow_request()
        slot = copy_on_write(
            lambda r: self.cache.match_prefix(self.sg.base.MatchPrefixParams(key=key, cow_mamba=True, req=r)),
            request,
            slot_of,
        )
        if slot is not None:
            self.req_mamba.setdefault(req, set()).add(slot)
        return slot

    def mamba_tree(
        self,
    ) -> tuple[dict[Key, int], dict[Owner, set[int]], dict[LockSite, int], dict[Component, set[NodeId]]]:
        """The tree's Mamba side: states by key, the slot each node holds, Mamba lock counts, cached nodes."""
        states: dict[Key, int] = {}
        mamba_owners: dict[Owner, set[int]] = {}
        mamba_ref: dict[LockSite, int] = {}
        cached: dict[Component, set[NodeId]] = {FULL: set(), MAMBA: set()}
        for n, toks in self._nodes():
            nid = self.ids(n)
            cached[FULL].add(nid)
            if n.mamba_value is not None:
                slot = int(n.mamba_value[0])
                states[toks] = slot
                mamba_owners[node_owner(nid, MAMBA)] = {slot}
                cached[MAMBA].add(nid)
                if n.mamba_lock_ref:
                    mamba_ref[(toks, MAMBA)] = int(n.mamba_lock_ref)
        return states, mamba_owners, mamba_ref, cached

    def snapshot(self) -> Snapshot:
        full, end, owners = self._base_snapshot()
        states, mamba_owners, mamba_ref, cached = self.mamba_tree()
        prefix = PrefixCache(self.ps, None, True, full, frozenset(), states)  # type: ignore[arg-type]
        pool = self.mamba_allocator
        mamba_ledger = ledger(
            "mamba", pool.size, 1, [int(x) for x in pool.free_slots.tolist()], mamba_owners, self.req_mamba
        )
        lru = {FULL: self._lru(self.cache.full_lru_list, FULL), MAMBA: self._lru(self.cache.mamba_lru_list, MAMBA)}
        slots = [x for xs in full.values() for x in xs]
        sizes = {
            FULL: (int(self.cache.full_evictable_size()), int(self.cache.full_protected_size())),
            MAMBA: (int(self.cache.mamba_evictable_size()), int(self.cache.mamba_protected_size())),
        }
        return Snapshot(
            prefix,
            self._locks(end, mamba_ref),
            lru,
            {"kv": self._kv_ledger(owners), "mamba": mamba_ledger},
            self.kv.content(slots),
            sizes,
            {c: frozenset(ns) for c, ns in cached.items()},
            mamba_content=self._mamba_content(
                {x for xs in (*mamba_owners.values(), *self.req_mamba.values()) for x in xs}
            ),
        )

    def _mamba_content(self, held: set[int]) -> dict[int, int]:
        """Each held state's value (``write_mamba`` writes it into every layer's temporal state; SGLang's
        copy-on-write copies the tensors): the value where every layer and element agrees on it, else -1."""
        temporal = self.mamba_pool.mamba_cache.temporal
        out: dict[int, int] = {}
        for slot in sorted(held):
            vals = temporal[:, slot].flatten()
            first = float(vals[0]) if vals.numel() else -1.0
            out[slot] = int(first) if vals.numel() and bool((vals == first).all()) and first.is_integer() else -1
        return out


def radix_cache_factory(config: CacheConfig) -> LegacyRadixAdapter:
    """The installed release's ``RadixCache`` (0.5.9 to 0.5.23) for ``config`` (full attention; page size 1 or more)."""
    return LegacyRadixAdapter(config)


def mamba_radix_cache_factory(config: CacheConfig) -> LegacyMambaAdapter:
    """The installed release's ``MambaRadixCache`` (0.5.9 to 0.5.20) for ``config`` (full attention + Mamba, page
    size 1)."""
    return LegacyMambaAdapter(config)
