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

import sys
from array import array
from collections.abc import Iterator, Sequence
from typing import NamedTuple

import numpy as np
import torch

from kvledger.impl.arguments import has_bool, not_ids
from kvledger.impl.kvview import KVAllocator, KVView
from kvledger.impl.locks import Counter, LockTable
from kvledger.impl.lru import SLOT, ByComponent, Linked, LRUList
from kvledger.impl.mamba import MambaPool
from kvledger.impl.owners import node_tag
from kvledger.impl.slots import I64, Tokens, host_bytes
from kvledger.spec.errors import CacheError, ComponentDisabled, IntegrityError
from kvledger.spec.types import Component, NodeId, Owner, node

FULL, SWA, MAMBA = Component.FULL, Component.SWA, Component.MAMBA
I_FULL, I_SWA, I_MAMBA = SLOT[FULL], SLOT[SWA], SLOT[MAMBA]
_LISTS = len(SLOT)
ChildKey = int | bytes
Sizes = dict[Component, tuple[int, int]]
"""Per component: ``(evictable, protected)``, in tokens (FULL, SWA) or states (MAMBA)."""


Key = torch.Tensor | Sequence[int]
"""A radix key: a 1-D integer tensor (any device), or the token ids themselves (``array("q")`` is read as is;
a list or another sequence of ints is converted), as engines keep them."""


def as_key(op: str, t: Key) -> tuple[Tokens, bytes | bytearray]:
    """Key ``t`` as an ``array("q")`` of tokens (a new one), and the same as raw bytes.

    Radix keys are compared on the CPU: ``array`` and ``bytes`` comparisons are
    one ``memcmp``-like loop in C, where a tensor comparison costs a dispatch per node.
    """
    raw = key_bytes(op, t)
    return array("q", raw), raw


def key_bytes(op: str, t: Key) -> bytes | bytearray:
    """Key ``t`` as raw int64 bytes on the host (``as_key`` without the array); ``CacheError`` if it is not one
    (not 1-D integers, a bool or a float among the ids, a negative token id)."""
    if type(t) is array and t.typecode == "q":
        raw: bytes | bytearray = t.tobytes()  # NOTE: the common cases first: ids as an engine keeps them, a CPU tensor
    elif type(t) is torch.Tensor and t.dtype is torch.int64 and t.is_cpu and t.dim() == 1 and t.is_contiguous():
        raw = host_bytes(t)
    elif isinstance(t, torch.Tensor):
        why = not_ids(t)
        if why is not None:
            raise CacheError(f"{op}: expected a 1-D integer tensor, got {why}")
        raw = host_bytes(t)
    elif isinstance(t, (str, bytes, bytearray, memoryview)) or not isinstance(t, Sequence):
        raise CacheError(f"{op}: expected a 1-D integer tensor or a sequence of token ids, got {type(t).__name__}")
    else:
        try:
            raw = array("q", t).tobytes()  # NOTE: refuses floats; bools are refused below
        except (TypeError, OverflowError) as e:
            raise CacheError(f"{op}: token ids must be int64 integers ({e})") from None
        if has_bool(t):
            raise CacheError(f"{op}: token ids must be ints, not bools (True/False)")
    if not (raw[_SIGN::8].isascii() if len(raw) < _SIGN_LONG else int(np.frombuffer(raw, I64).min()) >= 0):
        raise CacheError(f"{op}: token ids must be >= 0, got {min(array('q', raw))}")  # NOTE: a negative id
    return raw


_SIGN = 7 if sys.byteorder == "little" else 0
"""Where the sign bit of each int64 lies in native-order bytes: the ids are >= 0 when those bytes are all below
0x80, which ``isascii`` tells in one C pass (no per-id Python work)."""
_SIGN_LONG = 8 * 4096
"""Keys of at least this many bytes are checked by numpy's ``min`` instead: the strided slice copies byte by byte
(17.5 against 4.0 µs at 20k tokens), numpy's fixed cost (~2 µs) is paid back from about 3k tokens."""


class Walk(NamedTuple):
    """The last match's walk: its key (``raw`` bytes, ``key`` tokens), its matched path from the root's child down
    (empty when nothing matched: a walk from the root), and the slots of its matched positions (int64 bytes). It
    stays true while no node on ``path`` changes."""

    raw: bytes | bytearray
    key: Tokens
    path: list[TreeNode]
    slots: bytes


def common_prefix(a: Tokens, b: Tokens, pos: int) -> int:
    """The length of the longest common prefix of ``a`` and ``b[pos:]``.

    NOTE: one numpy comparison of the two runs (views of the arrays, no copy) and the first difference found in
    C: a node's key runs to thousands of tokens, where halving with slices copies half the run at every step.
    """
    hi = min(len(a), len(b) - pos)
    if hi <= 0:
        return 0
    differs = np.frombuffer(a, I64, hi) != np.frombuffer(b, I64, hi, 8 * pos)
    first = int(differs.argmax())
    return first if differs[first] else hi


class TreeNode(Linked):
    """One radix node. The root (id 0) has an empty key and is never locked, evicted or listed.

    ``key``: the node's tokens, an ``array("q")`` on the CPU; ``slots``: their
    KV slot ids, an ``array("q")`` on the CPU (paths are concatenated there);
    ``value``: the same ids as an int64 tensor on the allocator's device (on
    the CPU a view of ``slots``, made when asked: the tree itself works on ``slots``). ``children`` are keyed by
    the first token (``page_size == 1``) or the raw bytes of the first page's
    tokens; keys are whole pages. ``swa_tombstone``: the node's SWA slots were
    freed (its full slots stay). ``mamba_slot``: the Mamba state after the
    node's last token, ``None`` for a Mamba tombstone. ``lock_ref[c]``: live
    handles covering the node in component ``c`` (a view of ``refs``, indexed
    by ``lru.SLOT``). ``lru_prev`` / ``lru_next``: the intrusive LRU links, per
    component (recency is the lists' order; a node keeps no access time).
    """

    __slots__ = (
        "_value",
        "children",
        "end",
        "full_site",
        "key",
        "mamba_slot",
        "parent",
        "refs",
        "slots",
        "swa_tombstone",
    )

    def __init__(
        self, ident: int, parent: TreeNode | None, key: Tokens, value: torch.Tensor | None, slots: Tokens, end: int
    ) -> None:
        # NOTE: ``Linked.__init__`` inlined (a node is made on every insert and split)
        self.id = ident
        self.prev: list[Linked | None] = [None] * _LISTS
        self.next: list[Linked | None] = [None] * _LISTS
        self.parent = parent
        self.children: dict[ChildKey, TreeNode] = {}
        self.key = key
        self._value = value  # NOTE: None on the CPU: ``value`` views ``slots`` when asked
        self.slots = slots
        self.end = end
        self.swa_tombstone = False
        self.mamba_slot: int | None = None
        self.refs = [0] * _LISTS
        self.full_site: Counter = (NodeId(ident), FULL)  # its FULL lock counter, as handles name it

    @property
    def owner(self) -> Owner:
        """Who holds the node's full KV slots in the allocator: ``node(id, FULL)``."""
        return node(self.id, FULL)

    @property
    def value(self) -> torch.Tensor:
        """The node's KV slot ids as an int64 tensor on the allocator's device (on the CPU it shares ``slots``).

        NOTE: ``torch.frombuffer`` does not pin the array's size; nothing resizes a node's ``slots`` in
        place (a split gives both halves new arrays), so the view stays valid.
        """
        v = self._value
        return torch.frombuffer(self.slots, dtype=torch.int64) if v is None else v

    @property
    def lock_ref(self) -> ByComponent[int]:
        """Live handles covering the node, per component (read and written through ``refs``)."""
        return ByComponent(self.refs)

    @property
    def start(self) -> int:
        """Position of the node's first token."""
        return self.end - len(self.key)

    def __len__(self) -> int:
        return len(self.key)

    def __repr__(self) -> str:
        locks = "".join(f" {c.value}={n}" for c, n in self.lock_ref.items() if n)
        flags = (" T" if self.swa_tombstone else "") + ("" if self.mamba_slot is None else f" M{self.mamba_slot}")
        return f"TreeNode({self.id}, [{self.start},{self.end}){flags}{locks})"


class MatchResult(NamedTuple):
    """A cached prefix of ``length`` tokens ending exactly at ``last_node`` (the root when 0).

    ``indices`` (int64, on the allocator's device) and ``mamba_slot`` stay
    owned by the cache's nodes: the caller may use them only while it holds a
    lock handle on ``last_node`` (``RadixCache.inc_lock_ref``).
    """

    length: int
    indices: torch.Tensor
    last_node: TreeNode
    mamba_slot: int | None


class InsertResult(NamedTuple):
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
        self._on_device = self.device.type != "cpu"  # NOTE: nodes keep a device copy of their slots only there
        self._on_cpu = not self._on_device
        on = (True, swa_window is not None, mamba is not None)
        self.components: tuple[Component, ...] = tuple(c for c, b in zip((FULL, SWA, MAMBA), on, strict=True) if b)
        self._empty = torch.zeros(0, dtype=torch.int64, device=self.device)
        self.root = TreeNode(0, None, array("q"), self._empty, array("q"), 0)
        self._nodes: dict[int, TreeNode] = {0: self.root}
        self._next_id = 1  # the id the next new node gets
        self._lru: dict[Component, LRUList[TreeNode]] = {c: LRUList(c) for c in self.components}
        self._full = self._lru[FULL]
        self._swa = self._lru.get(SWA)
        self._mamba = self._lru.get(MAMBA)
        self._locks = LockTable()
        # NOTE: counters indexed by ``lru.SLOT`` (a list index costs less than hashing an enum member)
        self._evictable = [0] * len(SLOT)
        self._protected = [0] * len(SLOT)
        # NOTE: the last match's walk (``Walk``). A walk of the same key resumes at its path's end, so only
        # a split or a deletion of a node on it can void it (a new leaf is found by the resumed walk); any
        # split forgets it, a deletion only when the node is on the path
        self._walked: Walk | None = None

    # ------------------------------------------------------------ bookkeeping (for the abstraction function)

    def nodes(self) -> Iterator[TreeNode]:
        """Every live node, the root (id 0) included; walk from ``root`` through ``children`` for the shape."""
        return iter(list(self._nodes.values()))

    def node_count(self) -> int:
        """How many live nodes there are, the root included (a walk through the tree passes at most this many)."""
        return len(self._nodes)

    def node(self, ident: int) -> TreeNode:
        """The live node ``ident``; ``CacheError`` if it was evicted or never existed."""
        if type(ident) is not int:
            raise CacheError(f"node: node id must be an int, got {type(ident).__name__} {ident!r:.40}")
        got = self._nodes.get(ident)
        if got is None:
            raise CacheError(f"node {ident}: no such live node (evicted?)")
        return got

    def lru(self, comp: Component) -> LRUList[TreeNode]:
        """The LRU list of ``comp``: its members are exactly the nodes holding ``comp`` content."""
        return self._lru[self._require(comp, "lru")]

    def prefix(self, n: TreeNode) -> torch.Tensor:
        """The tokens from the root to the end of ``n`` (``n``'s key in spec terms), a new int64 tensor."""
        self._check_live("prefix", n)
        parts = []
        while n.parent is not None:
            parts.append(n.key)
            n = n.parent
            if len(parts) > len(self._nodes):
                raise self.revisit("prefix", n)
        toks = array("q")
        for part in reversed(parts):
            toks += part
        out = torch.frombuffer(toks, dtype=torch.int64).clone() if toks else self._empty.cpu()
        return out.to(self.device)

    def revisit(self, op: str, n: TreeNode) -> IntegrityError:
        """The error of a walk up the parents that passed more nodes than the tree has: it revisits ``n``."""
        return IntegrityError(
            f"inv_tree_acyclic: {op}: the walk up from a node passes node {n.id} after {len(self._nodes)} nodes "
            "(a parent cycle: a node linked under its own descendant?)"
        )

    def holds(self, n: TreeNode, comp: Component) -> bool:
        """``n`` (not the root) holds content of ``comp``: always FULL, SWA unless tombstoned, MAMBA with a state."""
        self._check_live("holds", n)
        self._component("holds", comp)
        return comp is FULL or (comp is SWA and not n.swa_tombstone) or (comp is MAMBA and n.mamba_slot is not None)

    def sizes(self) -> Sizes:
        """The maintained counters, shaped like ``recompute_sizes()``."""
        return {c: (self._evictable[SLOT[c]], self._protected[SLOT[c]]) for c in self.components}

    def recompute_sizes(self) -> Sizes:
        """The counters recomputed from the tree (``sizes() == recompute_sizes()`` is an invariant)."""
        out = {c: [0, 0] for c in self.components}
        for n in self._nodes.values():
            for c in self.components:
                if n is not self.root and self.holds(n, c):
                    out[c][int(n.refs[SLOT[c]] > 0)] += _size(n, c)
        return {c: (e, p) for c, (e, p) in out.items()}

    # ------------------------------------------------------------ walking

    def _child_key(self, toks: Tokens, pos: int = 0) -> ChildKey:
        g = self.page_size
        return toks[pos] if g == 1 else toks[pos : pos + g].tobytes()

    def _walk_of(self, raw: bytes | bytearray) -> Walk | None:
        """The last match's walk if it was of the key ``raw`` (and nothing voided it since), else ``None``."""
        memo = self._walked
        return memo if memo is not None and memo.raw == raw else None

    def _descend(self, key: Tokens, raw: bytes | bytearray, memo: Walk | None = None) -> tuple[list[TreeNode], int]:
        """Nodes along ``key``'s path (``raw``: its bytes) and how many tokens match: all of each node but perhaps the
        last (whole pages). Two sequences share a page only when they agree on all of it (``spec.prefix.cached_len``).

        ``memo``: the last match's walk of this key (``_walk_of``): the walk
        resumes at its end (no node it went through has changed since).
        """
        g, n = self.page_size, len(key)
        if memo is not None and memo.path:
            path = list(memo.path)
            x = path[-1]
            pos = x.end
        else:
            path = []
            x, pos = self.root, 0
        # NOTE: ``raw.startswith(node key, offset)`` compares a whole node in C without slicing the key
        rawb = bytes(raw)
        starts, append = rawb.startswith, path.append
        if g == 1:
            while pos < n:  # NOTE: ``pos == x.end`` at each step
                child = x.children.get(key[pos])
                if child is None:
                    break
                append(child)
                if not starts(child.key, pos << 3):  # NOTE: the node runs past the key or differs inside it
                    pos += common_prefix(child.key, key, pos)
                    break
                pos = child.end
                x = child
            return path, pos
        w = 8 * g
        while pos + g <= n:
            child = x.children.get(rawb[8 * pos : 8 * pos + w])
            if child is None:
                break
            append(child)
            if not starts(child.key, 8 * pos):
                k = common_prefix(child.key, key, pos)
                pos += k - k % g
                break
            pos = child.end
            x = child
        return path, pos

    def _slots_along(self, path: list[TreeNode], length: int) -> bytearray:
        """The slots of positions ``[0, length)`` along ``path`` (from ``_descend``), as new int64 bytes."""
        out = bytearray().join([n.slots for n in path])
        del out[8 * length :]
        return out

    def _tensor(self, slots: bytearray) -> torch.Tensor:
        """Int64 bytes ``slots`` as a new tensor on the device (it owns ``slots`` from now on)."""
        if not slots:
            return self._empty
        t = torch.frombuffer(slots, dtype=torch.int64)  # NOTE: on the CPU it shares ``slots``'s memory (no copy)
        return t.to(self.device) if self._on_device else t

    def _cut(self, path: list[TreeNode], length: int) -> tuple[TreeNode, TreeNode | None, list[TreeNode]]:
        """The node ending exactly at ``length`` along ``path``, splitting one if needed; the split's lower part;
        and the nodes from the root's child down to the first (a new list)."""
        for i in range(len(path) - 1, -1, -1):  # NOTE: from the end: the cut is almost always at the last node
            n = path[i]
            start = n.end - len(n.key)
            if start >= length:
                continue
            if n.end <= length:
                return n, None, path[: i + 1]
            p = self._split(n, length - start)
            up = path[:i]
            up.append(p)
            return p, n, up
        return self.root, None, []

    def _refresh(self, up: list[TreeNode], rest: TreeNode | None = None) -> None:
        """Move the path ``up`` (from the root's child down) and ``rest`` to the MRU end of each list holding them:
        ancestors most recent (no ancestor is less recent than a descendant), ``rest`` least.

        ``rest``: the lower part of a node the operation split (a child of
        ``up[-1]``): SGLang refreshes the node it splits, so its remainder stays as recent as the matched part.
        """
        order = up if rest is None else [*up, rest]
        # NOTE: ``_reorder`` skips ``place``'s checks: a path from the root names each node once, and every node
        # holds FULL content (the other lists get only their members)
        self._full._reorder(order)
        if self._swa is not None:
            swa = self._swa
            swa._reorder([x for x in order if x in swa])
        if self._mamba is not None:
            mamba = self._mamba
            mamba._reorder([x for x in order if x in mamba])

    # ------------------------------------------------------------ growing

    def _split(self, c: TreeNode, k: int) -> TreeNode:
        """Split ``c`` after ``k`` tokens: a new node takes the first ``k`` (their slots transferred), ``c`` the rest.

        The new node inherits ``c``'s FULL and SWA lock counts, tombstone and
        recency (it sits just ahead of ``c`` in each list); live handles that
        covered ``c`` cover it too. The Mamba state stays at ``c``'s end.
        """
        parent = c.parent
        assert parent is not None and 0 < k < len(c)
        self._walked = None
        ck = self._child_key(c.key)
        upper = lower = None
        if c._value is not None:
            upper, lower = torch.split(c._value, [k, len(c) - k])
        p = TreeNode(self._new_id(), parent, c.key[:k], upper, c.slots[:k], c.start + k)
        p.swa_tombstone = c.swa_tombstone
        if self._kv.swa is None:
            self._kv.retag(p.slots, node_tag(p.id))
        else:
            self._kv.move(p.value, c.owner, p.owner)
        c.key, c._value, c.slots = c.key[k:], lower, c.slots[k:]
        parent.children[ck] = p
        p.children[self._child_key(c.key)] = c
        c.parent = p
        self._nodes[p.id] = p
        refs = c.refs
        p.refs[I_FULL], p.refs[I_SWA] = refs[I_FULL], refs[I_SWA]
        if refs[I_FULL] or refs[I_SWA]:
            inherited = [comp for comp, i in ((FULL, I_FULL), (SWA, I_SWA)) if refs[i] > 0]
            self._locks.extend_on_split(NodeId(c.id), NodeId(p.id), inherited)
        # NOTE: ``p`` was made just now: linked without ``insert_ahead_of``'s checks (``c`` is a member of each)
        ahead = c.prev[I_FULL]
        assert ahead is not None
        self._full._link_after(ahead, p)
        if self._swa is not None and not p.swa_tombstone:
            ahead = c.prev[I_SWA]
            assert ahead is not None
            self._swa._link_after(ahead, p)
        return p

    def _new_leaf(
        self,
        ident: int,
        parent: TreeNode,
        key: Tokens,
        value: torch.Tensor,
        hit: int,
        slots: Tokens,
        owner: Owner,
        taken: bool,
    ) -> TreeNode:
        """A new SWA-live leaf ``ident`` under ``parent`` taking ``value[hit:]`` (validated: ``owner``'s; ``slots``
        the same on the CPU; ``taken``: already tagged as the new leaf's, by ``KVView.take``)."""
        new = value[hit:] if self._on_device or not taken else None
        value_copy = new.clone() if self._on_device and new is not None else None
        leaf = TreeNode(ident, parent, key, value_copy, slots, parent.end + len(key))
        if not taken:
            assert new is not None
            self._kv.move(new, owner, leaf.owner)
        g = self.page_size
        parent.children[key[0] if g == 1 else key[:g].tobytes()] = leaf  # NOTE: ``_child_key(key)``
        self._nodes[ident] = leaf
        # NOTE: the leaf goes where the insert's path touch puts it, just behind its parent (a parent
        # the match before has touched is then already in place, so the touch moves nothing). It was made
        # just now: linked without ``insert_behind``'s checks (every node but the root holds FULL content,
        # so ``parent`` is a member unless it is the root)
        full = self._full
        full._link_after(full.head if parent.parent is None else parent, leaf)
        self._evictable[I_FULL] += len(key)
        if self._swa is not None:
            swa = self._swa
            swa._link_after(parent if parent in swa else swa.head, leaf)
            self._evictable[I_SWA] += len(key)
        return leaf

    def _new_id(self) -> int:
        ident = self._next_id
        self._next_id += 1
        return ident

    def _adopt_state(self, n: TreeNode, slot: int, owner: Owner) -> None:
        pool = self._pool("insert")
        pool.transfer(torch.tensor([slot], dtype=torch.int64, device=pool.device), owner, node(n.id, MAMBA))
        n.mamba_slot = slot
        self._lru[MAMBA].insert_mru(n)
        self._evictable[I_MAMBA] += 1

    # ------------------------------------------------------------ shrinking

    def _delete_leaf(self, n: TreeNode, freed: list[TreeNode]) -> int:
        """Take unlocked leaf ``n`` out of every list and the tree and free its SWA and Mamba content; ``n`` joins
        ``freed``, whose full slots the caller returns with ``_free_leaves``. Returns its size in tokens."""
        parent = n.parent
        assert parent is not None and not n.children and n.refs[I_FULL] == 0
        if self._walked is not None and n in self._walked.path:
            self._walked = None
        if self._kv.swa is not None:
            self.kv.free(n.value, n.owner)  # NOTE: full and SWA slots together, checked (SWA caches are not batched)
        else:
            freed.append(n)
        if n.mamba_slot is not None:
            self._drop_state(n)
        key = n.key
        size = len(key)
        self._full.remove(n)
        self._evictable[I_FULL] -= size
        if self._swa is not None and not n.swa_tombstone:
            self._swa.remove(n)
            self._evictable[I_SWA] -= size
        del parent.children[key[0] if self.page_size == 1 else key[: self.page_size].tobytes()]
        del self._nodes[n.id]
        n.parent = None
        return size

    def _free_leaves(self, freed: list[TreeNode]) -> None:
        """Return the full slots of deleted leaves (``_delete_leaf``) to the pool, in one batch.

        NOTE: no ownership check: every slot of a node's ``value`` is tagged with that node (the
        tree keeps this on every split, insert and delete; the contracts' ``inv_owners_account``
        checks it), so the per-leaf ``free`` check could only confirm the tree's own bookkeeping.
        """
        if freed:
            self._kv.release(bytearray().join([n.slots for n in freed]))

    def _drop_state(self, n: TreeNode) -> None:
        """Free ``n``'s Mamba state (if any) and take it out of the Mamba list: a Mamba tombstone."""
        if n.mamba_slot is not None and self.mamba is not None:
            self.mamba.free(torch.tensor([n.mamba_slot], device=self.mamba.device), node(n.id, MAMBA))
            self._lru[MAMBA].remove(n)
            self._evictable[I_MAMBA] -= 1
            n.mamba_slot = None

    # ------------------------------------------------------------ counters and checks

    def _raise_lock(self, n: TreeNode, comp: Component) -> None:
        i = I_FULL if comp is FULL else SLOT[comp]
        refs = n.refs
        if not refs[i]:
            size = 1 if comp is MAMBA else len(n.key)
            self._evictable[i] -= size
            self._protected[i] += size
        refs[i] += 1

    def _raise_full(self, n: TreeNode) -> list[Counter]:
        """``_raise_lock(x, FULL)`` for ``n`` and each ancestor (not the root), in one pass; their counters."""
        counters: list[Counter] = []
        moved, x, most = 0, n, len(self._nodes)
        while x.parent is not None:
            if len(counters) >= most:  # NOTE: a parent cycle: undo the raises (the same walk again), then report
                y = n
                for _ in counters:
                    y.refs[I_FULL] -= 1
                    y = y.parent  # type: ignore[assignment]
                raise self.revisit("inc_lock_ref", x)
            counters.append(x.full_site)
            refs = x.refs
            held = refs[I_FULL]
            refs[I_FULL] = held + 1
            if not held:
                moved += len(x.key)
            x = x.parent
        self._evictable[I_FULL] -= moved
        self._protected[I_FULL] += moved
        return counters

    def _unlower(self, counters: list[Counter]) -> None:
        """Undo what a failed ``dec_lock_ref`` lowered: its FULL counters (whose sizes it had not moved yet) and
        the others, with their sizes."""
        for nid, c in counters:
            x = self._nodes[nid]
            if c is FULL:
                x.refs[I_FULL] += 1
            else:
                self._raise_lock(x, c)

    def _lower_lock(self, n: TreeNode, comp: Component) -> None:
        i = I_FULL if comp is FULL else SLOT[comp]
        refs = n.refs
        refs[i] -= 1
        if not refs[i]:
            size = 1 if comp is MAMBA else len(n.key)
            self._protected[i] -= size
            self._evictable[i] += size

    def _component(self, op: str, comp: Component) -> Component:
        if type(comp) is not Component:
            raise CacheError(
                f"{op}: component must be a Component (FULL, SWA, MAMBA), got {type(comp).__name__} {comp!r:.40}"
            )
        return comp

    def _require(self, comp: Component, op: str) -> Component:
        if comp not in self.components:
            self._component(op, comp)
            on = ", ".join(c.value for c in self.components)
            raise ComponentDisabled(op, (), f"the cache has no {comp.value} component (it has {on})")
        return comp

    def _pool(self, op: str) -> MambaPool:
        if self.mamba is None:
            raise ComponentDisabled(op, (), "the cache has no mamba component")
        return self.mamba

    def _check_live(self, op: str, n: TreeNode) -> None:
        if type(n) is not TreeNode:
            raise CacheError(f"{op}: expected a TreeNode of this cache, got {type(n).__name__} {n!r:.40}")
        if self._nodes.get(n.id) is not n:
            raise CacheError(f"{op}: node {n.id} is not a live node of this cache (evicted, or another cache's)")

    def _as_tokens(self, op: str, t: torch.Tensor) -> torch.Tensor:
        if (
            type(t) is torch.Tensor
            and t.dtype is torch.int64
            and t.layout is torch.strided
            and t.dim() == 1
            and (t.is_cpu if self._on_cpu else not t.is_meta and t.device == self.device)
        ):
            return t  # NOTE: the common case, decided without making a device object
        if not isinstance(t, torch.Tensor):
            raise CacheError(f"{op}: expected a 1-D integer tensor, got {type(t).__name__}")
        if t.dtype != torch.int64 or t.dim() != 1 or t.layout != torch.strided or t.is_meta:
            why = not_ids(t)  # NOTE: the full check off the common case only
            if why is not None:
                raise CacheError(f"{op}: expected a 1-D integer tensor, got {why}")
        if t.dtype == torch.int64 and t.device == self.device:
            return t
        return t.to(self.device, torch.int64)


def _size(n: TreeNode, comp: Component) -> int:
    return 1 if comp is MAMBA else len(n)
