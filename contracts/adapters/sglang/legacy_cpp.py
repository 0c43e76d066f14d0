"""SGLang's C++ radix tree (``RadixCacheCpp``, 0.5.9 to 0.5.20) behind the adapter protocol.

``--enable-cache-cpp``'s cache: ``RadixCacheCpp`` is a thin Python class over ``radix_tree_cpp.RadixTree``, a C++
tree SGLang compiles on import (``torch.utils.cpp_extension.load``, a C++20 compiler and ninja; about 30 s once,
then cached under ``~/.cache/torch_extensions``). The C++ sources are the same in every release of the range
(``LEGACY_CPP``; 0.5.21 no longer ships them); the Python class around them moves (server args read through
``runtime_context.get_memory()`` from 0.5.19, lock results from 0.5.10), and the adapter follows it.

The tree keeps its nodes in C++: Python sees a node only as its id (``NodeHandle``, what ``match_prefix`` returns
as ``last_device_node``). The abstraction function reads the whole tree from ``RadixTree.debug_print`` (written to
``std::clog``: the adapter captures file descriptor 2 around the call, with ``SGLANG_RADIX_CPP_DEBUG_LIMIT`` raised
so every key is printed): each node's id, depth, lock count, own tokens and device indices, in depth-first order,
so a node's parent is the last node printed one level up. ``debug_print`` checks the tree's own bookkeeping as it
goes (parents, the id map, the evictable size) and raises when it disagrees: that error is a finding, and the
adapter lets it through.

How the protocol maps onto it (SGLang's own names), as :mod:`~kvledger.contracts.adapters.sglang.legacy` maps
``RadixCache``:

* ``alloc_kv`` / ``free_kv``: ``TokenToKVPoolAllocator`` (``PagedTokenToKVPoolAllocator`` for pages) on CPU.
* ``match_prefix``: ``match_prefix(MatchPrefixParams(key=RadixKey(...)))`` (it splits a node a match ends inside
  and stamps the nodes it walks whole with the time, as in SGLang).
* ``lock``: ``match_prefix`` then ``inc_lock_ref(last_device_node)``; the handle keeps the node id for
  ``dec_lock_ref``, and covers the pages from the root to that node, the matched key's (the C++ lock counts every node
  from there to the root).
* ``insert``: ``_insert(RadixKey, value)``, the call ``cache_finished_req`` and ``cache_unfinished_req`` make; it
  returns how many leading tokens were cached before and **leaves the duplicates to the caller**: as
  ``cache_finished_req`` does, the adapter reports ``value[protected:prefix_len]`` as duplicates (``protected``:
  the leading offered slots that are the tree's own, read from the dump before the insert).
* ``evict``: ``evict(EvictParams(num_tokens=n))`` (a heap of unlocked leaves by last access; the freed slots go back
  to the allocator).
* ``snapshot``: the dump's nodes (keys, device indices, lock counts), the allocator's free pages, the tree's
  ``evictable_size`` and ``protected_size``.

What it cannot express (skipped and reported): an LRU list (eviction is a heap of leaves by access time; the order
is checked as the ``lru_policy`` laws state it); SWA and Mamba (no such component); ``rejects_double_unlock``
(a lock is a node id: a second release lowers the counts again, and C++ refuses only at zero).
"""

from __future__ import annotations

import hashlib
import importlib
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from functools import wraps
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ParamSpec, TypeVar

import torch

from kvledger.contracts.adapters.protocol import CacheConfig, Inserted, Match, Snapshot
from kvledger.contracts.adapters.sglang.common import FULL, NotExpressible, node_owner, publish_cpu_args
from kvledger.contracts.adapters.sglang.cpu_import import LEGACY_CPP
from kvledger.contracts.adapters.sglang.legacy import LegacyLock, _LegacyAdapter, _sglang, slots_along
from kvledger.spec.errors import KVLedgerError
from kvledger.spec.locks import Key, LockSite, LockState
from kvledger.spec.prefix import PrefixCache
from kvledger.spec.types import NodeId, Owner

CPP_MODULE = "sglang.srt.mem_cache.radix_cache_cpp"
DEBUG_LIMIT = "SGLANG_RADIX_CPP_DEBUG_LIMIT"
"""The C++ tree's limit on the keys ``debug_print`` prints (read once per process, at its first call)."""

_NODE = re.compile(r"^\s*(\d+) \[depth = (\d+)\] \[len = (\d+)\] (.*)\[rc = (\d+)\] \[hit = \d+\]$")
_KEYS = re.compile(r"^Node (\d+): key = \[([^\]]*)\] device_indices = (\[\[N/A\]\]|\[[^\]]*\])")
_SKIPPED = re.compile(r"^Node (\d+): key is too long \((\d+) tokens\), skipping\.\.\.$")


@dataclass(frozen=True)
class CppNode:
    """One node of the C++ tree as ``debug_print`` shows it."""

    nid: int
    parent: int
    tokens: tuple[int, ...]
    """The node's own tokens (its edge), not the path's."""
    slots: tuple[int, ...]
    lock_ref: int
    placement: str
    """Where the node lives and its IO state as printed, ``[gpu] [io = free]`` without a host cache."""


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",")) if text.strip() else ()


def parse_dump(text: str) -> dict[int, CppNode]:
    """The nodes of a ``debug_print`` dump (the root, id 0, left out), by id. A line neither form reads, a node
    without its key line, or a depth with no node above it is a malformed dump (``ValueError``)."""
    order: list[tuple[int, int, int, int, str]] = []
    keys: dict[int, tuple[tuple[int, ...], tuple[int, ...]]] = {}
    for line in text.splitlines():
        if m := _NODE.match(line):
            nid, depth, length, placement, rc = m.groups()
            order.append((int(nid), int(depth), int(length), int(rc), placement.strip()))
        elif m := _KEYS.match(line):
            nid, toks, slots = m.groups()
            keys[int(nid)] = (_ints(toks), () if slots == "[[N/A]]" else _ints(slots[1:-1]))
        elif m := _SKIPPED.match(line):
            raise ValueError(
                f"RadixTree.debug_print: node {m[1]}'s key ({m[2]} tokens) was not printed: {DEBUG_LIMIT} is below it "
                "(the tree reads it once a process, at its first dump)"
            )
        elif line.strip() and not line.startswith(("Evictable size", "Protected size", "Total size", "0 [root]")):
            raise ValueError(f"RadixTree.debug_print: a line the adapter cannot read: {line!r}")
    above = [0]  # NOTE: the last node printed at each depth (preorder: a node's parent is the last one a level up)
    nodes: dict[int, CppNode] = {}
    for nid, depth, length, rc, placement in order:
        if not 1 <= depth <= len(above):
            raise ValueError(f"RadixTree.debug_print: node {nid} at depth {depth} below no printed node")
        del above[depth:]
        if nid not in keys:
            raise ValueError(f"RadixTree.debug_print: node {nid} has no key line (is {DEBUG_LIMIT} too low?)")
        toks, slots = keys[nid]
        if len(toks) != length or len(slots) != length:
            raise ValueError(
                f"RadixTree.debug_print: node {nid} has len {length} but {len(toks)} tokens and {len(slots)} device "
                "indices"
            )
        nodes[nid] = CppNode(nid, above[-1], toks, slots, rc, placement)
        above.append(nid)
    return nodes


_ONE_DUMP: ContextVar[dict[int, tuple[Any, dict[int, CppNode], tuple[int, ...]]] | None] = ContextVar(
    "kvledger_one_dump", default=None
)
P = ParamSpec("P")
R = TypeVar("R")


@contextmanager
def one_dump() -> Iterator[None]:
    """While it is open, each C++ tree is dumped and parsed once (:meth:`LegacyCppAdapter.nodes`), however many
    times it is read: for an abstraction that only reads (a snapshot, the references its ledgers come from), which
    asks for the tree once per request row. Nothing inside may move a tree (no SGLang call that matches, inserts,
    locks or evicts): each read of a kept dump first asks the tree's size counters (total, evictable, protected),
    and a tree that inserted, locked or evicted since its dump raises :class:`StaleDump` rather than be read as it
    was. Nested, the outermost one holds."""
    if _ONE_DUMP.get() is not None:
        yield
        return
    token = _ONE_DUMP.set({})
    try:
        yield
    finally:
        _ONE_DUMP.reset(token)


class StaleDump(KVLedgerError):
    """A read inside :func:`one_dump` found the C++ tree moved since its dump: a tree-moving call ran inside a scope
    that promised to only read (the adapter's error, never SGLang's)."""


def _sizes(tree: Any) -> tuple[int, int, int]:
    """The C++ tree's size counters: what an insert, a lock or an eviction moves."""
    return int(tree.total_size()), int(tree.evictable_size()), int(tree.protected_size())


def reads_one_dump(fn: Callable[P, R]) -> Callable[P, R]:
    """``fn`` run inside :func:`one_dump` (for a method that only reads SGLang's state)."""

    @wraps(fn)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        with one_dump():
            return fn(*args, **kwargs)

    return run


def dump(tree: Any) -> str:
    """What ``tree.debug_print()`` writes to ``std::clog`` (file descriptor 2, captured around the call)."""
    sys.stderr.flush()
    with tempfile.TemporaryFile() as out:
        saved = os.dup(2)
        os.dup2(out.fileno(), 2)
        try:
            tree.debug_print()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        out.seek(0)
        return out.read().decode()


def _server_args(module: Any) -> Any:
    """What ``RadixCacheCpp`` reads its host-cache settings from: from 0.5.19 the published ``runtime_context``
    (published here, as the unified adapters do; the argument is then unused), before that its ``server_args``."""
    if hasattr(module, "get_memory"):
        publish_cpu_args()
    return SimpleNamespace(hicache_write_policy="write_through", enable_hierarchical_cache=False)


CPP_EXTENSION = "radix_tree_cpp"
"""The name SGLang's ``cpp_radix_tree/radix_tree.py`` builds its C++ tree under (``torch.utils.cpp_extension.load``,
when the module is imported)."""
SOURCE_SUFFIXES = frozenset({".cpp", ".cc", ".h", ".hpp"})


def _shared_sources(sources: Sequence[str]) -> Path:
    """A copy of the C++ tree's source directory (every source and header in it) at a path named by their content,
    under torch's extension directory (``TORCH_EXTENSIONS_DIR``, else ``~/.cache/torch_extensions``): releases
    that ship the same sources, each installed in its own environment, then name the same files."""
    here = Path(sources[0]).parent
    files = sorted(p for p in here.iterdir() if p.suffix in SOURCE_SUFFIXES)
    digest = hashlib.sha256()
    for f in files:
        digest.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    root = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or Path.home() / ".cache" / "torch_extensions")
    where = root / "kvledger" / f"{CPP_EXTENSION}-{digest.hexdigest()[:16]}"
    if not where.is_dir():
        where.parent.mkdir(parents=True, exist_ok=True)
        staged = Path(tempfile.mkdtemp(dir=where.parent, prefix=".staging-"))
        for f in files:
            shutil.copy2(f, staged / f.name)
        try:
            staged.rename(where)
        except OSError:  # NOTE: another process put the same copy there first
            shutil.rmtree(staged, ignore_errors=True)
    (where / "build").mkdir(exist_ok=True)
    return where


@contextmanager
def one_build_per_source() -> Iterator[None]:
    """While SGLang's C++ tree module is imported: its extension is built from :func:`_shared_sources`, in a build
    directory of that copy's own, so the same sources are compiled once however many environments (SGLang
    releases layered on one torch) load them, and not again while the build is there. Only the paths the compiler
    is given change (``load``'s other arguments are SGLang's own): a release whose sources differ gets a copy and a
    build of its own."""
    ext: Any = importlib.import_module("torch.utils.cpp_extension")
    original = ext.load

    def load(name: str, sources: list[str], *args: Any, **kwargs: Any) -> Any:
        if name != CPP_EXTENSION or "build_directory" in kwargs or not sources:
            return original(name, sources, *args, **kwargs)
        where = _shared_sources(sources)
        shared = [str(where / Path(s).name) for s in sources]
        return original(name, shared, *args, build_directory=str(where / "build"), **kwargs)

    ext.load = load
    try:
        yield
    finally:
        ext.load = original


def sglang_cpp() -> tuple[str, SimpleNamespace]:
    """The installed release (range ``LEGACY_CPP``) imported on CPU, with the legacy adapters' modules and the module
    of ``RadixCacheCpp`` (its C++ tree built by :func:`one_build_per_source`)."""
    with one_build_per_source():
        return _sglang(LEGACY_CPP, (CPP_MODULE,))


def radix_cache_cpp(params: Any) -> Any:
    """SGLang's ``RadixCacheCpp`` over ``params`` (a ``CacheInitParams``), with every key printed by its dump
    (``DEBUG_LIMIT``, set before the tree's first dump reads it). Importing its module builds the C++ tree, or loads
    the cached build."""
    os.environ[DEBUG_LIMIT] = str(1 << 40)
    with one_build_per_source():
        module = importlib.import_module(CPP_MODULE)
    return module.RadixCacheCpp(params, _server_args(module))


class LegacyCppAdapter(_LegacyAdapter):
    """SGLang 0.5.9 to 0.5.20 ``RadixCacheCpp`` (the C++ tree; full attention, token or paged)."""

    cache_class = "RadixCacheCpp"
    capabilities = frozenset({"locks", "ledgers", "content", "sizes", "stateless_insert", "lru_policy"})

    def __init__(self, config: CacheConfig) -> None:
        if config.mamba:
            raise NotExpressible("SGLang's RadixCacheCpp has no Mamba component")
        super().__init__(config)

    def _import(self, config: CacheConfig) -> tuple[str, SimpleNamespace]:
        return sglang_cpp()

    def _build(self) -> Any:
        params = self.sg.params.CacheInitParams(
            disable=False, req_to_token_pool=None, token_to_kv_pool_allocator=self.allocator, page_size=self.ps
        )
        return radix_cache_cpp(params)

    # ------------------------------------------------------------ the tree, read from its dump

    def nodes(self) -> dict[int, CppNode]:
        """The tree's nodes (root left out), read from a fresh dump; inside :func:`one_dump`, from its first."""
        tree = self.cache.tree
        memo = _ONE_DUMP.get()
        if memo is None:
            return parse_dump(dump(tree))
        got, sizes = memo.get(id(tree)), _sizes(tree)
        if got is None:  # NOTE: the tree is kept with its parse, so its id names no other tree while the memo lives
            got = memo[id(tree)] = (tree, parse_dump(dump(tree)), sizes)
        elif got[2] != sizes:
            raise StaleDump(
                f"one_dump: the C++ tree moved inside a read-only scope (total, evictable, protected sizes "
                f"{got[2]} at its dump, {sizes} now): a call that inserts, locks or evicts ran inside one_dump"
            )
        return got[1]

    def _paths(self, nodes: dict[int, CppNode]) -> dict[int, tuple[int, ...]]:
        """Each node's tokens from the root to its end."""
        paths: dict[int, tuple[int, ...]] = {0: ()}
        for n in nodes.values():  # NOTE: preorder: a parent comes before its children
            paths[n.nid] = paths[n.parent] + n.tokens
        return paths

    def _tree_slots(self, key: tuple[int, ...]) -> list[int]:
        """The tree's slots along ``key`` as far as it is cached, read from a dump (no call that moves the tree)."""
        children: dict[int, list[CppNode]] = {}
        for node in self.nodes().values():
            children.setdefault(node.parent, []).append(node)

        def step(at: int, rest: tuple[int, ...]) -> tuple[int, tuple[int, ...], tuple[int, ...]] | None:
            child = next((c for c in children.get(at, []) if c.tokens[: self.ps] == rest[: self.ps]), None)
            return None if child is None else (child.nid, child.tokens, child.slots)

        return slots_along(key, self.ps, 0, step)

    def tree_prefix_len(self, key: tuple[int, ...], slots: tuple[int, ...]) -> int:
        """How many leading ``slots`` (whole pages) are the tree's own along ``key``, read from a dump."""
        return self._protected_len(key, slots)

    # ------------------------------------------------------------ operations

    def _raw_match(self, key: tuple[int, ...], **extra: Any) -> tuple[Match, Any]:
        m = self.cache.match_prefix(self.sg.base.MatchPrefixParams(key=self._key(key), **extra))
        slots = tuple(int(x) for x in m.device_indices.tolist())
        return Match(len(slots), slots, None), m.last_device_node

    def insert(self, req: int, key: tuple[int, ...], slots: tuple[int, ...], mamba: int | None) -> Inserted:
        if mamba is not None:
            raise NotExpressible("SGLang's RadixCacheCpp has no Mamba component")
        protected = self._protected_len(key, slots)
        prefix_len = int(self.cache._insert(self._key(key), torch.tensor(slots, dtype=torch.int64)))
        dups = slots[protected:prefix_len]
        self.req_kv.setdefault(req, set()).difference_update(set(slots) - set(dups))
        return Inserted(prefix_len, dups, None)

    # ------------------------------------------------------------ abstraction

    def lockable(self, last: Any) -> bool:
        """A request's ``last_node`` is a node id; the root (0) and the session layer's stand-in hold no lock."""
        return isinstance(last, int) and last != 0

    def node_values(self) -> Iterator[tuple[NodeId, list[int], list[int] | None]]:
        for n in self.nodes().values():
            yield NodeId(n.nid), list(n.slots), None

    def _base_snapshot(self) -> tuple[dict[Key, tuple[int, ...]], dict[int, tuple[int, ...]], dict[Owner, set[int]]]:
        """The cached pages with their slots, each node's tokens from the root (by node id), the slots each node
        holds (by ledger owner), from one dump."""
        nodes = self.nodes()
        end = self._paths(nodes)
        full: dict[Key, tuple[int, ...]] = {}
        owners: dict[Owner, set[int]] = {}
        grain = self.ps if self.ps > 1 else 1
        for n in nodes.values():
            for i, k in enumerate(self._pages(end[n.nid], len(n.tokens))):
                full[k] = n.slots[i * self.ps : (i + 1) * self.ps]
            owners.setdefault(node_owner(NodeId(n.nid), FULL), set()).update(x // grain for x in n.slots)
        return full, end, owners

    def _locks(self, end: dict[int, tuple[int, ...]], extra: dict[LockSite, int]) -> LockState:
        """Each locked node's count on its pages (from a dump, as the Python adapters walk the tree again), and each
        handle's coverage."""
        lock_ref = dict(extra)
        for n in self.nodes().values():
            if n.lock_ref:
                lock_ref.update(((k, FULL), n.lock_ref) for k in self._pages(end[n.nid], len(n.tokens)))
        handles = {hid: frozenset(self._coverage(h, end)) for hid, h in self.locks.items()}
        return LockState(handles, lock_ref, frozenset())

    def _coverage(self, h: LegacyLock, end: dict[int, tuple[int, ...]]) -> set[LockSite]:
        """The pages from the root to the handle's node: the C++ lock counts the node and every node above it
        (a node that left the tree covers nothing cached)."""
        toks = end.get(h.node, ())
        return {(toks[: i + self.ps], FULL) for i in range(0, len(toks), self.ps)}

    @reads_one_dump
    def snapshot(self) -> Snapshot:
        full, end, owners = self._base_snapshot()
        prefix = PrefixCache(self.ps, None, False, full, frozenset(), {})  # type: ignore[arg-type]
        slots = [x for xs in full.values() for x in xs]
        return Snapshot(
            prefix,
            self._locks(end, {}),
            {},
            {"kv": self._kv_ledger(owners)},
            self.kv.content(slots),
            {FULL: (int(self.cache.evictable_size()), int(self.cache.protected_size()))},
            {},
        )


def cpp_row_boundary(view: LegacyCppAdapter, req: Any, row: Sequence[int], otherwise: int) -> int:
    """Where the C++ tree's own slots end in ``req``'s row (the rest is the request's own): where the tree itself
    matched the request (its ``last_node`` is a node id), how many leading ``row`` slots the tree holds along the
    request's tokens, in whole pages, read from a dump; elsewhere ``otherwise`` (``cache_protected_len``: a turn
    resumed from its session's slot, whose ``last_node`` is the session layer's).

    Neither of the request's own fields says it: ``RadixCacheCpp`` never updates ``cache_protected_len`` after its
    match (``cache_unfinished_req`` moves ``prefix_indices`` and the lock onto the prefilled prompt instead), and
    ``prefix_indices`` may name slots the tree does not hold (a streaming turn mid-chunk: the session layer points it
    at the chunks computed so far and keeps them out of the tree)."""
    if not isinstance(getattr(req, "last_node", None), int):
        return otherwise
    tokens = tuple(int(t) for t in [*req.origin_input_ids, *req.output_ids])
    return view.tree_prefix_len(tokens, tuple(int(x) for x in row))


def radix_cache_cpp_factory(config: CacheConfig) -> LegacyCppAdapter:
    """The installed release's ``RadixCacheCpp`` (0.5.9 to 0.5.20) for ``config`` (full attention; any page size)."""
    return LegacyCppAdapter(config)
