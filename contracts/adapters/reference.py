"""The reference implementation behind the adapter protocol, and the abstraction of its radix tree.

:func:`snapshot_of` is the abstraction function of :class:`RadixCache`: it
walks the tree once and states what it holds as spec values — cached pages
(``spec.prefix.PrefixCache``), lock counters and live handles expanded from
nodes to the pages they cover (``spec.locks.LockState``), the LRU lists with
the links of every node ever seen (``spec.lru.LruState``), the tree's own
pointers of every node seen (``spec.tree.TreeLinks``), and the pools'
ledgers. It is a whole-tree pass: used after each step of a conformance run,
never on a hot path.
"""

from __future__ import annotations

from array import array
from collections.abc import Hashable, Iterable
from dataclasses import dataclass

import torch

from kvledger.contracts.abstraction import abstract, ledger_of
from kvledger.contracts.adapters.protocol import CacheConfig, Inserted, Match, Snapshot
from kvledger.impl.allocators import PagedAllocator, SWATokenAllocator, TokenAllocator
from kvledger.impl.arguments import check_tokens
from kvledger.impl.locks import LockHandle
from kvledger.impl.lru import SENTINEL_ID, Linked
from kvledger.impl.mamba import MambaPool
from kvledger.impl.owners import FREE_TAG
from kvledger.impl.radix import RadixCache
from kvledger.impl.tree import MatchResult, TreeNode
from kvledger.spec.errors import ArgumentError, IntegrityError, LockError, OverAllocation
from kvledger.spec.locks import Coverage, Key, LockSite, LockState
from kvledger.spec.lru import DETACHED, SENTINEL, LruState
from kvledger.spec.prefix import PrefixCache
from kvledger.spec.tree import TreeLinks
from kvledger.spec.types import Component, HandleId, NodeId, request

FULL, SWA, MAMBA = Component.FULL, Component.SWA, Component.MAMBA


def build_cache(config: CacheConfig, device: str = "cpu") -> RadixCache:
    """The reference cache for ``config`` (token, paged or SWA allocator; optional Mamba pool)."""
    kv: TokenAllocator | PagedAllocator | SWATokenAllocator
    if config.window is not None:
        kv = SWATokenAllocator(config.kv_tokens, config.swa_tokens, device=device)
    elif config.page_size > 1:
        kv = PagedAllocator(config.kv_tokens // config.page_size, config.page_size, device=device)
    else:
        kv = TokenAllocator(config.kv_tokens, device=device)
    mamba = MambaPool(config.mamba_slots, conv_shape=(2,), temporal_shape=(2,), device=device) if config.mamba else None
    return RadixCache(kv, page_size=config.page_size, swa_window=config.window, mamba=mamba)


def _link(x: Linked | None, member: bool) -> NodeId | None:
    if x is None:
        return None
    if x.id == SENTINEL_ID:
        return None if member else SENTINEL
    return NodeId(x.id)


def mamba_states(pool: MambaPool) -> dict[int, int]:
    """Each held Mamba slot's state: the value it was written for, when its fingerprint and every value of its conv
    and temporal tensors agree on it (``MambaPool.verify``'s test), else -1 (no value's state)."""
    held = torch.nonzero(pool.pool.owner_tag != FREE_TAG).flatten()
    held = held[held >= pool.pool.base]
    if not held.numel():
        return {}
    value = pool.data[held]
    k = held.numel()
    conv = (pool.conv[held].reshape(k, -1) == (value % 1000).unsqueeze(1).to(pool.conv.dtype)).all(dim=1)
    temporal = (pool.temporal[held].reshape(k, -1) == (value % 997).unsqueeze(1).to(pool.temporal.dtype)).all(dim=1)
    value = torch.where(conv & temporal, value, torch.full_like(value, -1))
    return dict(zip(held.tolist(), value.tolist(), strict=True))


def snapshot_of(cache: RadixCache, seen: dict[int, TreeNode] | None = None) -> Snapshot:
    """The abstraction of ``cache`` (``seen``: every node observed so far, evicted ones included, for LRU links)."""
    ps = cache.page_size
    full: dict[Key, tuple[int, ...]] = {}
    swa_live: set[Key] = set()
    states: dict[Key, int] = {}
    pages_of: dict[int, list[Key]] = {}
    end_key: dict[int, Key] = {}
    stack: list[tuple[TreeNode, tuple[int, ...]]] = [(c, ()) for c in cache.root.children.values()]
    walked: set[int] = set()
    while stack:
        n, above = stack.pop()
        if n.id in walked:  # NOTE: a node reached twice: never walk a cycle of children
            raise IntegrityError(f"inv_tree_acyclic: node {n.id} is reached twice from the root through children")
        walked.add(n.id)
        toks = above + tuple(n.key.tolist())
        vals = n.value.tolist()
        keys = [toks[: len(above) + i + ps] for i in range(0, len(n), ps)]
        pages_of[n.id] = keys
        end_key[n.id] = toks
        for i, k in enumerate(keys):
            full[k] = tuple(vals[i * ps : (i + 1) * ps])
            if cache.swa_window is not None and not n.swa_tombstone:
                swa_live.add(k)
        if n.mamba_slot is not None:
            states[toks] = n.mamba_slot
        stack.extend((c, toks) for c in n.children.values())
    prefix = PrefixCache(ps, cache.swa_window, cache.mamba is not None, full, frozenset(swa_live), states)  # type: ignore[arg-type]

    def sites(nid: int, comp: Component) -> list[LockSite]:
        if comp is MAMBA:
            return [(end_key[nid], MAMBA)] if nid in end_key else []
        return [(k, comp) for k in pages_of.get(nid, [])]

    lock_ref: dict[LockSite, int] = {}
    for n in cache.nodes():
        for comp in cache.components:
            if n.lock_ref[comp] != 0:
                for site in sites(n.id, comp):
                    lock_ref[site] = n.lock_ref[comp]
    handles: dict[HandleId, Coverage] = {
        h: frozenset(s for nid, comp in cov for s in sites(nid, comp)) for h, cov in cache.live_handles().items()
    }
    locks = LockState(handles, lock_ref, frozenset())

    nodes = dict(seen) if seen is not None else {}
    nodes.update((n.id, n) for n in cache.nodes() if n is not cache.root)
    lru: dict[Component, LruState] = {}
    for comp in cache.components:
        lst = cache.lru(comp)
        order = tuple(NodeId(i) for i in lst.order())
        links = {
            NodeId(i): (_link(n.lru_prev[comp], n in lst), _link(n.lru_next[comp], n in lst)) for i, n in nodes.items()
        }
        lru[comp] = LruState(order, links, comp)

    ledgers = abstract(cache.kv)
    if cache.mamba is not None:
        ledgers["mamba"] = ledger_of(cache.mamba.pool)
    data = cache.kv.full.data if isinstance(cache.kv, SWATokenAllocator) else cache.kv.data
    slots = [x for xs in full.values() for x in xs]
    content = dict(zip(slots, data[torch.tensor(slots, dtype=torch.int64)].tolist(), strict=True)) if slots else {}
    cached = {c: cached_node_ids(cache, c) for c in cache.components}
    held = mamba_states(cache.mamba) if cache.mamba is not None else {}
    tree = tree_links(cache, nodes.values())
    return Snapshot(prefix, locks, lru, ledgers, content, cache.sizes(), cached, tree, held)


def tree_links(cache: RadixCache, nodes: Iterable[TreeNode]) -> TreeLinks:
    """The tree's pointers (``spec.tree.TreeLinks``) of the root and of ``nodes`` (live and evicted ones)."""
    parent: dict[NodeId, NodeId | None] = {}
    children: dict[NodeId, frozenset[NodeId]] = {}
    for n in [cache.root, *nodes]:
        parent[NodeId(n.id)] = NodeId(n.parent.id) if n.parent is not None else None
        children[NodeId(n.id)] = frozenset(NodeId(c.id) for c in n.children.values())
    memo = cache._walked  # NOTE: the cache's cursor: the last match's walk, reused by the next match of its key
    cursors = frozenset(NodeId(n.id) for n in memo.path) if memo is not None else frozenset()
    index = frozenset(NodeId(n.id) for n in cache.nodes())
    return TreeLinks(NodeId(cache.root.id), parent, children, index, cursors)


def tree_detached(n: TreeNode) -> bool:
    """Evicted node ``n`` holds no tree pointer (``spec.tree.detached``)."""
    return n.parent is None and not n.children


def cached_node_ids(cache: RadixCache, comp: Component) -> frozenset[NodeId]:
    """The nodes holding ``comp`` content (what that component's LRU list must contain)."""
    return frozenset(NodeId(n.id) for n in cache.nodes() if n is not cache.root and cache.holds(n, comp))


@dataclass(frozen=True, eq=False)
class _Locked:
    """What ``lock`` hands out: the cache's handle and the match it locked (for copy-on-write)."""

    handle: LockHandle
    match: MatchResult


def _locked(op: str, h: Hashable) -> _Locked:
    if not isinstance(h, _Locked):
        raise LockError(f"{op}: not a handle of the reference adapter: {h!r:.60}")
    return h


class ReferenceAdapter:
    """kvledger's own :class:`RadixCache` behind :class:`kvledger.contracts.adapters.protocol.CacheAdapter`."""

    name = "kvledger-reference"
    version = "0.1.0"
    capabilities = frozenset(
        {"lru", "lru_policy", "tree", "locks", "ledgers", "content", "sizes", "mamba_cow", "mamba_content"}
        | {"rejects_double_unlock", "stateless_insert", "rejects_foreign_insert", "rejects_bad_arguments"}
        | {"reinserts_cached_state"}
    )

    def __init__(self, config: CacheConfig, device: str = "cpu") -> None:
        if not isinstance(config, CacheConfig):
            raise ArgumentError(
                "create", "config", f"must be a CacheConfig, got {type(config).__name__} {config!r:.40}"
            )
        self.config = config
        self.cache = build_cache(config, device)
        self.device = self.cache.device
        self._seen: dict[int, TreeNode] = {}

    def _t(self, op: str, xs: Iterable[int]) -> torch.Tensor:
        """Token or slot ids as an int64 tensor: ints >= 0 only (a float would be truncated by ``torch.tensor``)."""
        ids = check_tokens(op, "kv", xs)
        return torch.tensor(ids, dtype=torch.int64, device=self.device)

    def alloc_kv(self, req: int, n: int) -> tuple[int, ...] | None:
        try:
            return tuple(self.cache.kv.alloc(n, request(req)).tolist())
        except OverAllocation:
            return None

    def free_kv(self, req: int, slots: tuple[int, ...]) -> None:
        self.cache.kv.free(self._t("free", slots), request(req))

    def alloc_mamba(self, req: int) -> int | None:
        assert self.cache.mamba is not None
        try:
            return int(self.cache.mamba.alloc(1, request(req))[0])
        except OverAllocation:
            return None

    def free_mamba(self, req: int, slot: int) -> None:
        assert self.cache.mamba is not None
        self.cache.mamba.free(self._t("free", [slot]), request(req))

    def write_kv(self, slots: tuple[int, ...], tokens: tuple[int, ...], start: int) -> None:
        pos = torch.arange(start, start + len(tokens), dtype=torch.int64, device=self.device)
        self.cache.kv.write_fingerprint(self._t("write_fingerprint", slots), self._t("write_fingerprint", tokens), pos)

    def write_mamba(self, slot: int, value: int) -> None:
        assert self.cache.mamba is not None
        self.cache.mamba.write_fingerprint(slot, value)

    def _key(self, op: str, key: tuple[int, ...]) -> torch.Tensor | array[int]:
        """``key`` as the cache takes it, a tensor or an ``array("q")`` (half the keys each): a scheduler hands it ids
        (the array form, read without a copy, has the cache's fast paths: the match's walk reused by the insert of
        its key), so both forms and both orders (an insert after a match of the same key or of another) are met."""
        ids = check_tokens(op, "kv", key)
        as_array = sum(ids) % 2  # NOTE: by content, not by a count: a refused call changes nothing here either
        return array("q", ids) if as_array else torch.tensor(ids, dtype=torch.int64, device=self.device)

    def _match(self, key: tuple[int, ...]) -> tuple[Match, MatchResult]:
        m = self.cache.match_prefix(self._key("match_prefix", key))
        return Match(m.length, tuple(m.indices.tolist()), m.mamba_slot), m

    def match_prefix(self, key: tuple[int, ...]) -> Match:
        return self._match(key)[0]

    def lock(self, key: tuple[int, ...]) -> tuple[Match, Hashable]:
        m, raw = self._match(key)
        return m, _Locked(self.cache.inc_lock_ref(raw.last_node), raw)

    def unlock(self, handle: Hashable) -> None:
        self.cache.dec_lock_ref(_locked("dec_lock_ref", handle).handle)

    def handle_id(self, handle: Hashable) -> int:
        return int(_locked("handle_id", handle).handle.id)

    def insert(self, req: int, key: tuple[int, ...], slots: tuple[int, ...], mamba: int | None) -> Inserted:
        r = self.cache.insert(self._key("insert", key), self._t("insert", slots), request(req), mamba_slot=mamba)
        return Inserted(r.prefix_len, tuple(r.dup_indices.tolist()), r.dup_mamba)

    def evict(self, component: Component, n: int) -> int:
        return self.cache.evict(component, n)

    def mamba_cow(self, handle: Hashable, req: int) -> int | None:
        try:
            return self.cache.mamba_copy_on_write(_locked("mamba_cow", handle).match, request(req))
        except OverAllocation:
            return None

    def snapshot(self) -> Snapshot:
        snap = snapshot_of(self.cache, self._seen)
        alive = {n.id: n for n in self.cache.nodes() if n is not self.cache.root}
        # NOTE: an evicted node seen detached in every list has shown all it can (it is never
        # relinked), so it is forgotten; one that keeps a link stays, so each snapshot shows it.
        for i in [i for i in self._seen if i not in alive]:
            lists_ok = all(lst.links.get(NodeId(i), DETACHED) == DETACHED for lst in snap.lru.values())
            if lists_ok and tree_detached(self._seen[i]):
                del self._seen[i]
        self._seen.update(alive)
        return snap
