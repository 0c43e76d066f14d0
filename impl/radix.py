"""The radix prefix cache with pluggable full / SWA / Mamba components. Refines :mod:`kvledger.spec.prefix`.

One tree serves a full-attention model, full + sliding-window (SWA), full +
Mamba, or all three (SGLang's ``RadixCache``, ``SWARadixCache``,
``MambaRadixCache`` and the unified cache). Abstractly the cache is a
:class:`kvledger.spec.prefix.PrefixCache`: position ``p`` of the sequence
through node ``n`` is cached in slot ``n.value[p - n.start]``, SWA-live
unless ``n`` is an SWA tombstone, and the Mamba state at ``n.end`` is
``n.mamba_slot``. Node boundaries are invisible there: splitting a node
changes the tree's shape, never the abstract content or lock coverage.

Ownership: the cache's nodes own the slots they hold (tags ``Owner(NODE, id,
component)``); ``insert`` takes slots by transfer from the caller's owner and
eviction returns them to the free lists. Locks are taken and released through
immutable handles (:mod:`kvledger.impl.locks`). A rejected operation raises a
typed error and leaves the cache and the pools unchanged.

>>> from kvledger.impl.allocators import TokenAllocator
>>> from kvledger.spec.types import request
>>> kv = TokenAllocator(8)
>>> cache = RadixCache(kv)
>>> slots = kv.alloc(4, request(1))
>>> cache.insert(torch.tensor([5, 6, 7, 8]), slots, request(1)).prefix_len
0
>>> m = cache.match_prefix(torch.tensor([5, 6, 9]))
>>> m.length, m.indices.tolist(), len(m.last_node)
(2, [1, 2], 2)
>>> h = cache.inc_lock_ref(m.last_node)
>>> cache.evict(Component.FULL, 8), cache.protected_size(), cache.evictable_size()
(2, 2, 0)
>>> cache.dec_lock_ref(h)
>>> cache.dec_lock_ref(h)
Traceback (most recent call last):
...
kvledger.spec.errors.DoubleUnlock: dec_lock_ref of handle 1: on node 2: handle already released (double unlock)
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping
from ctypes import string_at

import torch

from kvledger.impl.allocators import PagedAllocator, SWATokenAllocator, TokenAllocator
from kvledger.impl.arguments import check_id, check_int
from kvledger.impl.kvview import KVAllocator
from kvledger.impl.locks import Counter, LockHandle
from kvledger.impl.lru import SLOT
from kvledger.impl.mamba import MambaPool
from kvledger.impl.owners import encode, node_tag
from kvledger.impl.slots import Tokens, host_bytes
from kvledger.impl.tree import (
    FULL,
    I_FULL,
    I_MAMBA,
    I_SWA,
    MAMBA,
    SWA,
    InsertResult,
    Key,
    MatchResult,
    RadixTree,
    TreeNode,
    Walk,
    as_key,
    key_bytes,
    longest_match,
)
from kvledger.spec.errors import (
    CacheError,
    ComponentDisabled,
    IntegrityError,
    LengthMismatch,
    OverAllocation,
    SlotConflict,
    UnalignedKey,
)
from kvledger.spec.types import Component, HandleId, NodeId, Owner, OwnerKind, node


class RadixCache(RadixTree):
    """A radix prefix cache over ``kv`` (a token, paged or SWA allocator) and, optionally, a Mamba pool.

    ``page_size`` (default: the allocator's) is the unit of caching: keys,
    matches and node boundaries are whole pages, and two sequences share a
    page only when they agree on all of it. It must be a multiple of the
    allocator's page size. The
    SWA component is on when ``swa_window`` is set (``kv`` must then be an
    :class:`SWATokenAllocator`); the Mamba component when ``mamba`` is given.
    ``components`` lists those that are on. Tensors live on ``kv.device``.
    """

    def __init__(
        self,
        kv: KVAllocator,
        *,
        page_size: int | None = None,
        swa_window: int | None = None,
        mamba: MambaPool | None = None,
    ) -> None:
        if not isinstance(kv, TokenAllocator | PagedAllocator | SWATokenAllocator):
            raise CacheError(f"create: kv must be a token, paged or SWA allocator, got {type(kv).__name__}")
        if mamba is not None and not isinstance(mamba, MambaPool):
            raise CacheError(f"create: mamba must be a MambaPool or None, got {type(mamba).__name__}")
        if mamba is not None and mamba.device != kv.device:
            raise CacheError(f"create: the Mamba pool is on {mamba.device}, the KV allocator on {kv.device}")
        grain = kv.page_size
        ps = grain if page_size is None else page_size
        if type(ps) is not int or not 0 < ps < 1 << 63 or ps % grain:
            raise CacheError(f"create: page_size {page_size!r} must be a positive multiple of the allocator's {grain}")
        if swa_window is not None and (
            not isinstance(kv, SWATokenAllocator) or type(swa_window) is not int or not 0 < swa_window < 1 << 63
        ):
            raise CacheError(
                f"create: swa_window {swa_window!r} needs an SWATokenAllocator (got {type(kv).__name__}) and >= 1"
            )
        super().__init__(kv, ps, swa_window, mamba)
        self.driven = False
        """Whether a memory manager drives this cache (a second one on it would free the first's slots)."""

    # ------------------------------------------------------------ match / insert

    def match_prefix(self, key: Key) -> MatchResult:
        """The longest cached prefix of ``key`` that obeys the match rule. Refines ``spec.prefix.match_prefix``.

        The rule (``spec.prefix.matches``): every page cached in full, so the
        length is a multiple of ``page_size``; with SWA, every page holding one
        of the positions ``[length - swa_window, length)`` SWA-live; with
        Mamba, length 0 or a state at the prefix end. Effects:
        if the prefix ends inside a node, that node is split so ``last_node``
        ends exactly there (the tree's shape changes, the cached content does
        not); matched nodes move to the MRU end of each list holding them, and
        so does the remainder of a node split here (as SGLang refreshes the node
        it splits). The result is borrowed: lock ``last_node`` before using it.
        ``key``: a 1-D integer tensor or the token ids (``Key``; ``array("q")`` costs no conversion).
        """
        q, raw = as_key("match_prefix", key)
        path, pos = self._descend(q, raw, self._walk_of(raw))
        if self.swa_window is None and self.mamba is None:
            length = pos
        else:
            tombs, ends = [], []
            for n in path:
                if n.swa_tombstone:
                    tombs.append((n.start, min(n.end, pos)))
                if n.end <= pos and n.mamba_slot is not None:
                    ends.append(n.end)
            length = longest_match(pos, self.page_size, self.swa_window, tombs, None if self.mamba is None else ends)
        if not length:
            self._walked = Walk(raw, q, [], b"")  # NOTE: an insert of this key then starts from the root, key checked
            return MatchResult(0, self._empty, self.root, None)
        last, rest, up = self._cut(path, length)
        self._refresh(up, rest)
        slots = self._slots_along(up, length)
        self._walked = Walk(raw, q, up, bytes(slots))  # NOTE: a copy: the caller may write into ``indices``
        indices = self._tensor(slots)
        return MatchResult(length, indices, last, last.mamba_slot if self.mamba is not None else None)

    def insert(self, key: Key, value: torch.Tensor, owner: Owner, *, mamba_slot: int | None = None) -> InsertResult:
        """Cache ``key`` with ``value[i]`` holding token ``i``. Refines ``spec.prefix.insert``.

        Ownership: ``owner`` holds ``value`` (and ``mamba_slot``). Positions not
        cached before take the caller's slots (transferred to the new node, SWA
        slots included, which must still be live); cached positions keep their
        slots and the caller's differing ones come back in ``dup_indices``,
        still the caller's. ``mamba_slot`` becomes the state at the key's end
        unless one is there, else it comes back as ``dup_mamba``. SWA
        tombstones are never revived. Splits so ``last_node`` ends at
        ``len(key)``; touches the path (and the remainder of a split node).
        ``key``: as for ``match_prefix``.
        """
        op = "insert"
        memo = self._walked
        raw_key: bytes | bytearray | None = key.tobytes() if type(key) is array and key.typecode == "q" else None
        if raw_key is None or memo is None or memo.raw != raw_key:
            raw_key = key_bytes(op, key)
            memo = self._walk_of(raw_key)
        # NOTE: else the key of the last match, whose ids were checked there
        value = self._as_tokens(op, value)
        self._kv.pool.code_of(owner, op)  # NOTE: ``encode(owner)``'s check, remembered for the owner last seen
        if mamba_slot is not None and self.mamba is not None:
            check_id(op, "mamba", "mamba_slot", mamba_slot, 0, self.mamba.pool.size)
        q = array("q", raw_key) if memo is None else memo.key  # NOTE: the match's tokens of this key
        n = len(q)
        if value.numel() != n:
            raise LengthMismatch(op, tuple(q), f"{value.numel()} slots for {n} tokens")
        # NOTE: an int64 CPU tensor (``_as_tokens``) of n ids, read at its data pointer as ``host_bytes`` does
        slots = string_at(value.data_ptr(), 8 * n) if self._on_cpu and value.is_contiguous() else host_bytes(value)
        if n % self.page_size:
            raise UnalignedKey(op, tuple(q), f"length {n} is not a multiple of page size {self.page_size}")
        if mamba_slot is not None and (self.mamba is None or n == 0):
            why = "the cache has no Mamba component" if self.mamba is None else "a Mamba state cannot sit at the root"
            raise ComponentDisabled(op, tuple(q), f"Mamba slot {mamba_slot} offered but {why}")
        if n == 0:
            return InsertResult(value, None, self.root, 0)
        path, hit = self._descend(q, raw_key, memo)
        at_end = path[-1].mamba_slot if hit == n and path[-1].end == n else None
        if mamba_slot is not None and mamba_slot != at_end:
            self._check_state(tuple(q), mamba_slot, owner)
        if self.swa_window is not None:
            self._kv.check_swa_live(op, value[hit:])
        cached: bytes | bytearray = (
            memo.slots if memo is not None and 8 * hit == len(memo.slots) else self._slots_along(path, hit)
        )
        # NOTE: fast path: the caller hands back the cached slots for the cached positions (a scheduler's
        # matched prefix) and owns the rest: one pass checks them and hands them to the new leaf (the
        # last step that can fail). Otherwise, or if that pass fails, the checks one by one.
        ident = self._next_id  # NOTE: the new leaf's id, taken below once nothing can fail
        raw = slots[8 * hit :]
        taken = slots.startswith(cached) and self._kv.take(value, hit, owner, node_tag(ident), raw)
        dups = self._empty if taken else self._check_insert(q, value, hit, self._tensor(bytearray(cached)), owner)
        # NOTE: all checks are done; nothing below can fail on the caller's input.
        if hit < n:
            self._next_id = ident + 1  # NOTE: ``ident``, reserved above (``_new_id``)
        last, rest, up = self._cut(path, hit)
        if hit < n:
            last = self._new_leaf(ident, last, q[hit:], value, hit, array("q", raw), owner, taken)
            up.append(last)
        dup_mamba = None
        if mamba_slot is not None and last.mamba_slot is None:
            self._adopt_state(last, mamba_slot, owner)
        elif mamba_slot is not None and mamba_slot != last.mamba_slot:
            dup_mamba = mamba_slot
        self._refresh(up, rest)
        return InsertResult(dups, dup_mamba, last, hit)

    def _check_insert(
        self, q: Tokens, value: torch.Tensor, hit: int, cached: torch.Tensor, owner: Owner
    ) -> torch.Tensor:
        """Every check of ``insert`` on the slots, one at a time; returns the caller's duplicates."""
        op, n, key = "insert", len(q), tuple(q)
        same_slot = value[:hit] == cached
        differs = torch.ones(n, dtype=torch.bool, device=self.device)
        differs[:hit] = ~same_slot
        self._kv.check_fresh(key, value, differs)
        same = same_slot.view(-1, self.page_size)
        offered = torch.ones(n, dtype=torch.bool, device=self.device)
        offered[:hit] = ~same.all(dim=1).repeat_interleave(self.page_size)
        mixed = same.any(dim=1) & ~same.all(dim=1)
        if bool(mixed.any()):
            end = (int(torch.nonzero(mixed)[0]) + 1) * self.page_size
            raise SlotConflict(op, key, f"page ending at {end} is only partly the cache's slots")
        self._kv.check_held(value, offered, owner)
        return value[:hit][offered[:hit]]

    def _check_state(self, key: tuple[int, ...], slot: int, owner: Owner) -> None:
        pool = self._pool("insert")
        idx = pool.pool.as_index("insert", torch.tensor([slot], dtype=torch.int64, device=pool.device))
        holder = pool.pool.owner_of(slot)
        if holder is not None and holder.kind is OwnerKind.NODE:
            raise SlotConflict("insert", key, f"Mamba slot {slot} is cached at {holder}")
        pool.pool.check_held("insert", idx, owner)

    # ------------------------------------------------------------ locks

    def inc_lock_ref(self, n: TreeNode) -> LockHandle:
        """Lock ``n`` and return the handle. Refines ``spec.locks.inc_lock_ref``.

        FULL: ``n`` and its ancestors (not the root). SWA: the nodes from ``n``
        up that overlap positions ``[n.end - swa_window, n.end)`` (whole nodes,
        so possibly a little more; tombstones skipped). MAMBA: ``n`` if it
        holds a state. The caller owns the handle until it passes it to
        ``dec_lock_ref``; while it is live nothing it covers is evicted.
        Locking the root gives a handle that covers nothing.
        """
        self._check_live("inc_lock_ref", n)
        counters = self._raise_full(n)
        if self.swa_window is not None:
            x, lo = n, n.end - self.swa_window
            while x.parent is not None and x.end > lo:  # NOTE: ``end`` falls strictly on the way up: bounded
                if not x.swa_tombstone:
                    counters.append((NodeId(x.id), SWA))
                    self._raise_lock(x, SWA)
                x = x.parent
        if self.mamba is not None and n.mamba_slot is not None:
            counters.append((NodeId(n.id), MAMBA))
            self._raise_lock(n, MAMBA)
        return self._locks.issue(NodeId(n.id), counters)

    def dec_lock_ref(self, handle: LockHandle) -> None:
        """Release ``handle``: lower exactly the counters it covers, once. Refines ``spec.locks.dec_lock_ref``.

        SGLang's ``dec_lock_ref(node, swa_uuid_for_lock)``, with the context
        carried by the handle. A second release, or another cache's handle,
        raises ``DoubleUnlock`` / ``UnknownHandle`` and changes nothing.
        """
        cov = self._locks.covered("dec_lock_ref", handle)
        nodes = self._nodes
        moved = 0  # NOTE: FULL tokens no handle covers any more; the FULL sizes move once, after the loop
        for nid, c in cov:  # NOTE: checked and lowered in one pass; a counter not held undoes what came before
            x = nodes.get(nid)
            if x is None or (held := x.refs[I_FULL if c is FULL else SLOT[c]]) <= 0:
                self._unlower(cov[: cov.index((nid, c))])
                raise IntegrityError(f"dec_lock_ref of handle {handle.id}: node {nid} {c.value} lock_ref is not held")
            if c is FULL:
                x.refs[I_FULL] = held - 1
                if held == 1:
                    moved += len(x.key)
            else:
                self._lower_lock(x, c)
        self._locks.forget(handle)
        self._protected[I_FULL] -= moved
        self._evictable[I_FULL] += moved

    def is_live(self, handle: LockHandle) -> bool:
        """``handle`` came from this cache and is not released yet."""
        return self._locks.is_live(handle)

    def live_handles(self) -> Mapping[HandleId, tuple[Counter, ...]]:
        """Each live handle and the (node, component) counters it covers now (splits extend coverage)."""
        return self._locks.live()

    def handles_covering(self, ident: int, comp: Component) -> int:
        """How many live handles cover ``(node ident, comp)``; equals that node's ``lock_ref[comp]``."""
        if type(ident) is not int:
            raise CacheError(f"handles_covering: node id must be an int, got {type(ident).__name__} {ident!r:.40}")
        return self._locks.covering(NodeId(ident), self._component("handles_covering", comp))

    def evictable_size(self, comp: Component = FULL) -> int:
        """Cached ``comp`` (tokens; MAMBA: states) no live handle covers. Refines ``spec.prefix.evictable_size``."""
        return self._evictable[SLOT[self._require(comp, "evictable_size")]]

    def protected_size(self, comp: Component = FULL) -> int:
        """Cached ``comp`` (tokens; MAMBA: states) a live handle covers. Refines ``spec.prefix.protected_size``."""
        return self._protected[SLOT[self._require(comp, "protected_size")]]

    # ------------------------------------------------------------ eviction

    def evict(self, comp: Component, n: int) -> int:
        """Evict at least ``n`` of ``comp`` (or all that can go), least recently used first; return how much.

        Only content with ``lock_ref[comp] == 0`` goes. FULL refines
        ``spec.prefix.evict_mamba`` then ``spec.prefix.evict_full``: unlocked
        leaves are deleted (full slots, live SWA slots and Mamba state freed)
        and a parent that becomes a leaf may go next. SWA refines
        ``spec.prefix.evict_swa``: nodes become SWA tombstones (SWA slots
        freed, full slots kept; leaves are not deleted). MAMBA refines
        ``spec.prefix.evict_mamba``: states are freed, nodes stay. Evicted
        content leaves its LRU lists with its links cleared.
        """
        self._require(comp, "evict")
        if (type(n) is not int or n <= 0) and check_int("evict", comp.value, "n", n) == 0:
            return 0
        return self._evict_full(n) if comp is FULL else self._evict_component(comp, n)

    def _evict_full(self, n: int) -> int:
        # NOTE: no ancestor is less recent than its descendants (``_refresh``, ``_split``), so a
        # parent that becomes a leaf lies ahead of the cursor: one pass from the LRU end suffices.
        freed, leaves = 0, list[TreeNode]()
        for cur in self._full.iter_lru():
            if freed >= n:
                break
            if not cur.children and not cur.refs[I_FULL]:
                freed += self._delete_leaf(cur, leaves)
        self._free_leaves(leaves)
        return freed

    def _evict_component(self, comp: Component, n: int) -> int:
        lru, freed = self._lru[comp], 0
        for cur in lru.iter_lru():
            if freed >= n:
                break
            if cur.refs[SLOT[comp]]:
                continue
            if comp is SWA:
                assert self._kv.swa is not None
                self._kv.swa.free_swa(cur.value, node(cur.id, FULL))
                cur.swa_tombstone = True
                lru.remove(cur)
                self._evictable[I_SWA] -= len(cur)
                freed += len(cur)
            else:
                self._drop_state(cur)
                freed += 1
        return freed

    # ------------------------------------------------------------ Mamba copy-on-write and integrity

    def mamba_copy_on_write(self, match: MatchResult, owner: Owner) -> int:
        """A fresh Mamba slot for ``owner`` holding a copy of the matched state (SGLang's ``finalize_match_result``).

        If the pool is full, ``match.last_node`` is locked by a temporary handle
        while one Mamba state is evicted and the copy made, then released.
        Ownership: the returned slot is ``owner``'s. Raises ``OverAllocation``
        (nothing changed, no lock left) when no state can be evicted, and
        ``CacheError`` when the match is stale (its state was evicted).
        """
        pool = self._pool("mamba_copy_on_write")
        if not isinstance(match, MatchResult):
            raise CacheError(f"mamba_copy_on_write: expected a MatchResult, got {type(match).__name__}")
        encode(owner, "mamba_copy_on_write", "mamba")
        src = match.last_node
        if self._nodes.get(src.id) is not src or src.mamba_slot is None or src.mamba_slot != match.mamba_slot:
            raise CacheError(f"mamba_copy_on_write: match at node {src.id} is stale or has no Mamba state")
        if pool.available_size() > 0:
            slot = int(pool.alloc(1, owner)[0])
            pool.copy_state(src.mamba_slot, slot, owner)
            return slot
        if self._evictable[I_MAMBA] - (src.refs[I_MAMBA] == 0) < 1:
            raise OverAllocation("mamba_copy_on_write", "mamba", (), f"pool full, no unlocked state to evict ({owner})")
        h = self.inc_lock_ref(src)
        try:
            self.evict(MAMBA, 1)
            slot = int(pool.alloc(1, owner)[0])
            pool.copy_state(src.mamba_slot, slot, owner)
        finally:
            self._release_cow_lock(h)
        return slot

    def _release_cow_lock(self, h: LockHandle) -> None:
        # NOTE: B5 (SGLang PR #27038): this release dropped the lock's SWA extent and walked to the root.
        self.dec_lock_ref(h)

    def verify(self, match: MatchResult, key: torch.Tensor) -> None:
        """Raise ``IntegrityError`` unless the matched slots hold the fingerprints of ``key``'s first tokens.

        ``key`` is a key as ``match_prefix`` takes it, checked whole (a negative token past the match is refused
        too, ``CacheError``), as a tensor."""
        if not isinstance(match, MatchResult):
            raise CacheError(f"verify: expected a MatchResult, got {type(match).__name__}")
        if match.length:
            self._check_live("verify", match.last_node)  # NOTE: another cache's match, or one whose node was evicted
            toks = self._as_tokens("verify", key)
            key_bytes("verify", toks)  # NOTE: every token id, not only the matched ones the check below reads
            toks = toks[: match.length]
            pos = torch.arange(match.length, dtype=torch.int64, device=self.device)
            self.kv.verify(match.indices, toks, pos)
