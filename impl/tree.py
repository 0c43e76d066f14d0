"""Radix tree nodes, match/insert results, the match rule, and the tree's structural operations.

A :class:`TreeNode` holds a run of tokens (``key``) and the full KV slot of
each (``value``); it covers positions ``[start, end)`` of every sequence
through it. Every slot of ``value`` is tagged ``Owner(NODE, id, FULL)`` in the
allocator, its live SWA slots ``Owner(NODE, id, SWA)``, its Mamba state
``Owner(NODE, id, MAMBA)``: tags always name the node that holds the slot (a
split transfers the slots that move). :class:`RadixTree` keeps the nodes, the
per-component LRU lists and the size counters in step with every structural
change; :class:`kvledger.impl.radix.RadixCache` builds the protocol on it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from kvledger.impl.kvview import KVAllocator, KVView
from kvledger.impl.locks import LockTable
from kvledger.impl.lru import Linked, LRUList
from kvledger.impl.mamba import MambaPool
from kvledger.spec.errors import CacheError, ComponentDisabled
from kvledger.spec.types import Component, NodeId, Owner, node

FULL, SWA, MAMBA = Component.FULL, Component.SWA, Component.MAMBA
ChildKey = int | tuple[int, ...]
Sizes = dict[Component, tuple[int, int]]
"""Per component: ``(evictable, protected)``, in tokens (FULL, SWA) or states (MAMBA)."""


class TreeNode(Linked):
    """One radix node. The root (id 0) has an empty key and is never locked, evicted or listed.

    ``children`` are keyed by the first token (``page_size == 1``) or the
    tuple of the first page's tokens; keys are whole pages. ``swa_tombstone``:
    the node's SWA slots were freed (its full slots stay). ``mamba_slot``: the
    Mamba state after the node's last token, ``None`` for a Mamba tombstone.
    ``lock_ref[c]``: live handles covering the node in component ``c``.
    ``lru_prev`` / ``lru_next``: the intrusive LRU links, per component.
    ``last_access``: logical time of the last match or insert through it.
    """

    __slots__ = ("children", "end", "key", "last_access", "lock_ref", "mamba_slot", "parent", "swa_tombstone", "value")

    def __init__(self, ident: int, parent: TreeNode | None, key: torch.Tensor, value: torch.Tensor, end: int) -> None:
        super().__init__(ident)
        self.parent = parent
        self.children: dict[ChildKey, TreeNode] = {}
        self.key = key
        self.value = value
        self.end = end
        self.swa_tombstone = False
        self.mamba_slot: int | None = None
        self.lock_ref: dict[Component, int] = dict.fromkeys(Component, 0)
        self.last_access = 0

    @property
    def start(self) -> int:
        """Position of the node's first token."""
        return self.end - self.key.numel()

    def __len__(self) -> int:
        return self.key.numel()

    def __repr__(self) -> str:
        locks = "".join(f" {c.value}={n}" for c, n in self.lock_ref.items() if n)
        flags = (" T" if self.swa_tombstone else "") + ("" if self.mamba_slot is None else f" M{self.mamba_slot}")
        return f"TreeNode({self.id}, [{self.start},{self.end}){flags}{locks})"


@dataclass(frozen=True)
class MatchResult:
    """A cached prefix of ``length`` tokens ending exactly at ``last_node`` (the root when 0).

    ``indices`` (int64, on the allocator's device) and ``mamba_slot`` stay
    owned by the cache's nodes: the caller may use them only while it holds a
    lock handle on ``last_node`` (``RadixCache.inc_lock_ref``).
    """

    length: int
    indices: torch.Tensor
    last_node: TreeNode
    mamba_slot: int | None


@dataclass(frozen=True)
class InsertResult:
    """What ``insert`` did not take: the caller still owns, and must free, ``dup_indices`` and ``dup_mamba``.

    ``last_node`` ends exactly at the inserted key's end; ``prefix_len``
    positions were cached before (SGLang's return value of ``insert``).
    """

    dup_indices: torch.Tensor
    dup_mamba: int | None
    last_node: TreeNode
    prefix_len: int


def longest_match(
    cached: int,
    page_size: int,
    window: int | None,
    tombstones: Sequence[tuple[int, int]],
    mamba_ends: Sequence[int] | None,
) -> int:
    """The match rule of ``kvledger.spec.prefix.matches``, over node spans instead of token prefixes.

    ``cached``: positions ``[0, cached)`` are cached in full; ``tombstones``:
    the spans ``[s, e)`` (ascending, clipped to ``cached``) without SWA;
    ``mamba_ends``: the ends (ascending) of matched nodes holding a state, or
    ``None`` without Mamba. Returns the largest ``L <= cached`` with
    ``L % page_size == 0``, no tombstone overlapping ``[L - window, L)`` (spans
    are whole pages, so this is the spec's "every page in the window is
    SWA-live"), and (Mamba) ``L == 0`` or a state at ``L``. A tombstone
    ``[s, e)`` forbids exactly the ``L`` in ``(s, e + window)``.

    >>> longest_match(9, 1, 2, [(3, 5)], None), longest_match(6, 1, 2, [(3, 5)], None)
    (9, 3)
    >>> longest_match(9, 2, None, [], [3, 6, 7])
    6
    """

    def swa_ok(length: int) -> bool:
        return window is None or all(not s < length < e + window for s, e in tombstones)

    if mamba_ends is not None:
        return next((e for e in reversed(mamba_ends) if e % page_size == 0 and swa_ok(e)), 0)
    hi = cached
    for s, e in reversed(tombstones if window is not None else ()):
        cand = hi - hi % page_size
        if cand >= e + (window or 0):
            return cand
        hi = min(hi, s)
    return hi - hi % page_size


class RadixTree:
    """Nodes, LRU lists, lock counters and size counters of one radix cache, kept in step.

    Methods here change the tree's shape or content and keep every piece of
    bookkeeping exact (tags, LRU membership, ``evictable``/``protected``);
    they assume their caller checked the request.
    """

    def __init__(self, kv: KVAllocator, page_size: int, swa_window: int | None, mamba: MambaPool | None) -> None:
        self.kv = kv
        self._kv = KVView(kv)
        self.page_size = page_size
        self.swa_window = swa_window
        self.mamba = mamba
        self.device = kv.device
        on = (True, swa_window is not None, mamba is not None)
        self.components: tuple[Component, ...] = tuple(c for c, b in zip((FULL, SWA, MAMBA), on, strict=True) if b)
        empty = torch.zeros(0, dtype=torch.int64, device=self.device)
        self.root = TreeNode(0, None, empty, empty, 0)
        self._nodes: dict[int, TreeNode] = {0: self.root}
        self._ids = itertools.count(1)
        self._lru: dict[Component, LRUList[TreeNode]] = {c: LRUList(c) for c in self.components}
        self._locks = LockTable()
        self._evictable = dict.fromkeys(self.components, 0)
        self._protected = dict.fromkeys(self.components, 0)
        self._clock = 0

    # ------------------------------------------------------------ bookkeeping (for the abstraction function)

    def nodes(self) -> Iterator[TreeNode]:
        """Every live node, the root (id 0) included; walk from ``root`` through ``children`` for the shape."""
        return iter(list(self._nodes.values()))

    def node(self, ident: int) -> TreeNode:
        """The live node ``ident``; ``CacheError`` if it was evicted or never existed."""
        got = self._nodes.get(ident)
        if got is None:
            raise CacheError(f"node {ident}: no such live node (evicted?)")
        return got

    def lru(self, comp: Component) -> LRUList[TreeNode]:
        """The LRU list of ``comp``: its members are exactly the nodes holding ``comp`` content."""
        return self._lru[self._require(comp, "lru")]

    def prefix(self, n: TreeNode) -> torch.Tensor:
        """The tokens from the root to the end of ``n`` (``n``'s key in spec terms)."""
        parts = []
        while n.parent is not None:
            parts.append(n.key)
            n = n.parent
        return torch.cat([self.root.key, *reversed(parts)])

    def holds(self, n: TreeNode, comp: Component) -> bool:
        """``n`` (not the root) holds content of ``comp``: always FULL, SWA unless tombstoned, MAMBA with a state."""
        return comp is FULL or (comp is SWA and not n.swa_tombstone) or (comp is MAMBA and n.mamba_slot is not None)

    def sizes(self) -> Sizes:
        """The maintained counters, shaped like ``recompute_sizes()``."""
        return {c: (self._evictable[c], self._protected[c]) for c in self.components}

    def recompute_sizes(self) -> Sizes:
        """The counters recomputed from the tree (``sizes() == recompute_sizes()`` is an invariant)."""
        out = {c: [0, 0] for c in self.components}
        for n in self._nodes.values():
            for c in self.components:
                if n is not self.root and self.holds(n, c):
                    out[c][int(n.lock_ref[c] > 0)] += _size(n, c)
        return {c: (e, p) for c, (e, p) in out.items()}

    # ------------------------------------------------------------ walking

    def _child_key(self, toks: list[int], pos: int = 0) -> ChildKey:
        p = self.page_size
        return toks[pos] if p == 1 else tuple(toks[pos : pos + p])

    def _descend(self, key: torch.Tensor, toks: list[int]) -> tuple[list[TreeNode], list[int]]:
        """Nodes along ``key``'s path and how many tokens of each match (whole pages; only the last may be partial).

        Two sequences share a page only when they agree on all of it (``spec.prefix.cached_len``).
        """
        path: list[TreeNode] = []
        counts: list[int] = []
        x, pos, g = self.root, 0, self.page_size
        while pos + g <= len(toks):
            child = x.children.get(self._child_key(toks, pos))
            if child is None:
                break
            m = min(len(child), len(toks) - pos)
            eq = (child.key[:m] == key[pos : pos + m]).to(torch.int64)
            k = int(eq.cumprod(0).sum())  # NOTE: the leading run of equal tokens, in one device sync
            k -= k % g
            path.append(child)
            counts.append(k)
            pos += k
            if k < len(child):
                break
            x = child
        return path, counts

    def _slots_along(self, path: list[TreeNode], counts: list[int]) -> torch.Tensor:
        return torch.cat([self.root.value, *(n.value[:k] for n, k in zip(path, counts, strict=True))])

    def _cut(self, path: list[TreeNode], length: int) -> TreeNode:
        """The node ending exactly at ``length`` along ``path``, splitting one if needed."""
        last = self.root
        for n in path:
            if n.end <= length:
                last = n
                continue
            if length > n.start:
                last = self._split(n, length - n.start)
            break
        return last

    def _touch_path(self, n: TreeNode) -> None:
        """Move ``n`` and its ancestors to the MRU end, ancestors last (so no ancestor is less recent)."""
        self._clock += 1
        while n.parent is not None:
            n.last_access = self._clock
            for comp in self.components:
                if n in self._lru[comp]:
                    self._lru[comp].touch(n)
            n = n.parent

    # ------------------------------------------------------------ growing

    def _split(self, c: TreeNode, k: int) -> TreeNode:
        """Split ``c`` after ``k`` tokens: a new node takes the first ``k`` (their slots transferred), ``c`` the rest.

        The new node inherits ``c``'s FULL and SWA lock counts, tombstone and
        recency (it sits just ahead of ``c`` in each list); live handles that
        covered ``c`` cover it too. The Mamba state stays at ``c``'s end.
        """
        parent = c.parent
        assert parent is not None and 0 < k < len(c)
        p = TreeNode(next(self._ids), parent, c.key[:k].clone(), c.value[:k].clone(), c.start + k)
        p.swa_tombstone, p.last_access = c.swa_tombstone, c.last_access
        self.kv.transfer(p.value, node(c.id, FULL), node(p.id, FULL))
        c.key, c.value = c.key[k:].clone(), c.value[k:].clone()
        parent.children[self._child_key(p.key.tolist())] = p
        p.children[self._child_key(c.key.tolist())] = c
        c.parent = p
        self._nodes[p.id] = p
        inherited = [comp for comp in (FULL, SWA) if comp in self.components and c.lock_ref[comp] > 0]
        for comp in inherited:
            p.lock_ref[comp] = c.lock_ref[comp]
        self._locks.extend_on_split(NodeId(c.id), NodeId(p.id), inherited)
        for comp in self.components:
            if comp is not MAMBA and self.holds(p, comp):
                self._lru[comp].insert_ahead_of(c, p)
        return p

    def _new_leaf(self, parent: TreeNode, key: torch.Tensor, value: torch.Tensor, owner: Owner) -> TreeNode:
        """A new SWA-live leaf under ``parent`` taking ``value`` from ``owner``."""
        leaf = TreeNode(next(self._ids), parent, key.clone(), value.clone(), parent.end + key.numel())
        self.kv.transfer(leaf.value, owner, node(leaf.id, FULL))
        parent.children[self._child_key(leaf.key.tolist())] = leaf
        self._nodes[leaf.id] = leaf
        for comp in self.components:
            if comp is not MAMBA:
                self._lru[comp].insert_mru(leaf)
                self._evictable[comp] += len(leaf)
        return leaf

    def _adopt_state(self, n: TreeNode, slot: int, owner: Owner) -> None:
        pool = self._pool("insert")
        pool.transfer(torch.tensor([slot], dtype=torch.int64, device=pool.device), owner, node(n.id, MAMBA))
        n.mamba_slot = slot
        self._lru[MAMBA].insert_mru(n)
        self._evictable[MAMBA] += 1

    # ------------------------------------------------------------ shrinking

    def _delete_leaf(self, n: TreeNode) -> int:
        """Free everything unlocked leaf ``n`` holds, take it out of every list and the tree; its size in tokens."""
        parent = n.parent
        assert parent is not None and not n.children and n.lock_ref[FULL] == 0
        self.kv.free(n.value, node(n.id, FULL))
        self._drop_state(n)
        for comp in self.components:
            if comp is not MAMBA and self.holds(n, comp):
                self._lru[comp].remove(n)
                self._evictable[comp] -= len(n)
        del parent.children[self._child_key(n.key.tolist())]
        del self._nodes[n.id]
        n.parent = None
        return len(n)

    def _drop_state(self, n: TreeNode) -> None:
        """Free ``n``'s Mamba state (if any) and take it out of the Mamba list: a Mamba tombstone."""
        if n.mamba_slot is not None and self.mamba is not None:
            self.mamba.free(torch.tensor([n.mamba_slot], device=self.mamba.device), node(n.id, MAMBA))
            self._lru[MAMBA].remove(n)
            self._evictable[MAMBA] -= 1
            n.mamba_slot = None

    # ------------------------------------------------------------ counters and checks

    def _raise_lock(self, n: TreeNode, comp: Component) -> None:
        if n.lock_ref[comp] == 0:
            self._evictable[comp] -= _size(n, comp)
            self._protected[comp] += _size(n, comp)
        n.lock_ref[comp] += 1

    def _lower_lock(self, n: TreeNode, comp: Component) -> None:
        n.lock_ref[comp] -= 1
        if n.lock_ref[comp] == 0:
            self._protected[comp] -= _size(n, comp)
            self._evictable[comp] += _size(n, comp)

    def _require(self, comp: Component, op: str) -> Component:
        if comp not in self.components:
            on = ", ".join(c.value for c in self.components)
            raise ComponentDisabled(op, (), f"the cache has no {comp.value} component (it has {on})")
        return comp

    def _pool(self, op: str) -> MambaPool:
        if self.mamba is None:
            raise ComponentDisabled(op, (), "the cache has no mamba component")
        return self.mamba

    def _check_live(self, op: str, n: TreeNode) -> None:
        if self._nodes.get(n.id) is not n:
            raise CacheError(f"{op}: node {n.id} is not a live node of this cache (evicted, or another cache's)")

    def _as_tokens(self, op: str, t: torch.Tensor) -> torch.Tensor:
        if not isinstance(t, torch.Tensor) or t.dim() != 1 or t.dtype.is_floating_point or t.dtype == torch.bool:
            raise CacheError(f"{op}: expected a 1-D integer tensor, got {getattr(t, 'dtype', type(t).__name__)}")
        return t.to(self.device, torch.int64)


def _size(n: TreeNode, comp: Component) -> int:
    return 1 if comp is MAMBA else len(n)
