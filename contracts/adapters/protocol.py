"""The adapter protocol: how the conformance machinery drives *any* radix-cache implementation.

An engine author checks their own cache by writing one class with the
methods of :class:`CacheAdapter` (operations, in the engine's own API) and a
:meth:`CacheAdapter.snapshot` that reports the implementation's state in spec
terms (:class:`Snapshot`). The state machine in
:mod:`kvledger.contracts.machines.cache` calls nothing else: the reference
implementation's adapter (:mod:`kvledger.contracts.adapters.reference`) uses no
private shortcut, so whatever it can be checked for, an engine's cache can be
checked for too.

Requests are plain ints; the adapter maps them to the engine's owners. Slots
are token slot indices (a paged engine reports token indices of whole pages).
What an implementation cannot express is declared in ``capabilities``; the
rules that need it are reported as *skipped*, never silently passed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol, TypeVar, runtime_checkable

from kvledger.spec.ledger import Ledger
from kvledger.spec.locks import LockState
from kvledger.spec.lru import LruState
from kvledger.spec.prefix import PrefixCache
from kvledger.spec.tree import TreeLinks
from kvledger.spec.types import Component, NodeId

CAPABILITIES = frozenset(
    {"lru", "tree", "locks", "ledgers", "content", "sizes", "mamba_cow", "rejects_double_unlock", "stateless_insert"}
    | {"rejects_foreign_insert", "rejects_bad_arguments", "lru_policy", "mamba_content", "reinserts_cached_state"}
    | {f"lru_policy:{c.value}" for c in Component}
)
"""Everything a snapshot or an adapter may provide; an adapter lists what it has.

``lru``: the snapshot reports the implementation's LRU lists (those it has:
SGLang 0.5.23 keeps them for SWA and Mamba only). ``lru_policy``: the cache
evicts the least recently used first, where a match or an insert uses the
pages it covers (and may refresh the rest of a node it splits): each LRU list
orders its nodes by last use (``inv_lru_recency``, with ``lru`` and
``ledgers``), an eviction takes nothing used after an evictable page it keeps
(``evicts_lru_first``), frees what it was asked or all it can
(``evicts_enough``) and stops once it has (``evicts_no_more``, with
``ledgers``). ``lru_policy:full`` (``:swa``, ``:mamba``): the same for that
component's list and evictions only (SGLang 0.5.23's Mamba list refreshes only
the state a match consumes, its SWA list only nodes holding window KV, while
its FULL evictions follow the policy). ``tree``: the snapshot
reports the tree's pointers (``Snapshot.tree``). ``rejects_double_unlock``:
a second ``unlock`` of one handle is refused and changes nothing.
``stateless_insert``: ``insert`` accepts ``mamba=None`` (a cache without a
Mamba component has it trivially; SGLang's Mamba caches require a state, so a
request that cannot get one gives up before inserting).
``rejects_foreign_insert``: an ``insert`` offering slots the request does not
hold (another request's, free or cached ones) where the cache would take them,
or a Mamba state it does not hold, is refused with a typed error and changes
nothing (an engine whose cache does not track who holds a slot cannot tell,
and leaves it out).
``rejects_bad_arguments``: a call with an argument outside its domain
(``spec.domains``: ``evict`` of a negative, bool or float count, or of a
component the cache does not have) is refused with a typed error and
changes nothing (``inv_domain_enforced``).
``reinserts_cached_state``: ``insert`` may offer the Mamba state the cache already
holds at the key's end (``spec.prefix.insert``: the state stays, nothing comes
back), as a request that ran on the cached state without copying it would
(SGLang's schedulers copy a matched state first, so its caches leave it out).
``mamba_content``: the snapshot reports what each held Mamba state holds
(``Snapshot.mamba_content``): a cached state holds what its request wrote, and
a copy-on-write's slot what its source held (``inv_mamba_content``).
"""


@dataclass(frozen=True)
class CacheConfig:
    """The model kind and pool sizes a conformance run builds the cache with (tiny, so shrinking is readable)."""

    page_size: int = 1
    window: int | None = None
    mamba: bool = False
    kv_tokens: int = 48
    swa_tokens: int = 32
    mamba_slots: int = 2

    @property
    def kind(self) -> str:
        parts = ["full"] + (["swa"] if self.window is not None else []) + (["mamba"] if self.mamba else [])
        return "+".join(parts) + (f"/page{self.page_size}" if self.page_size > 1 else "")


@dataclass(frozen=True)
class Match:
    """What ``match_prefix`` returned: ``length`` tokens, their slots, the Mamba state at the end (or ``None``)."""

    length: int
    slots: tuple[int, ...]
    mamba: int | None


@dataclass(frozen=True)
class Inserted:
    """What ``insert`` returned: tokens already cached, and the caller's slots the cache did not take.

    ``dup_slots`` are all of them (token order, whole pages), the spec's
    ``dup_slots``. ``dups_freed`` are those among them the cache already gave
    back to the free list itself (SGLang 0.5.23 frees duplicates inside
    ``insert``; 0.5.9 and the reference leave that to the caller): the
    caller frees only the rest, and must not free these again.
    """

    prefix_len: int
    dup_slots: tuple[int, ...]
    dup_mamba: int | None
    dups_freed: tuple[int, ...] = ()


@dataclass(frozen=True)
class Snapshot:
    """The implementation's state in spec terms (the abstraction function's result).

    ``prefix``: cached content. ``locks``: live handles (by ``handle_id``) with
    their coverage and the per-site counters the implementation keeps.
    ``lru``: one list per component, with the links of every node the adapter
    has seen (alive or evicted). ``ledgers``: each pool, owners included
    (``request(r)`` for request ``r``, ``node(id, component)`` for tree nodes).
    ``content``: the fingerprint each cached full slot holds. ``sizes``: the
    implementation's own ``(evictable, protected)`` counters per component.
    ``cached_nodes``: per component, the nodes holding its content (what its
    LRU list must contain). ``tree``: the tree's pointers (parent, children,
    index, cursors) of every node the adapter has seen, alive or evicted
    (capability ``tree``). ``mamba_content``: the value each held Mamba slot's state
    holds (what ``write_mamba`` wrote, or what a copy-on-write copied into it;
    capability ``mamba_content``).
    A field the adapter cannot observe is empty and its capability absent.
    """

    prefix: PrefixCache
    locks: LockState = field(default_factory=LockState)
    lru: Mapping[Component, LruState] = field(default_factory=dict)
    ledgers: Mapping[str, Ledger] = field(default_factory=dict)
    content: Mapping[int, int] = field(default_factory=dict)
    sizes: Mapping[Component, tuple[int, int]] = field(default_factory=dict)
    cached_nodes: Mapping[Component, frozenset[NodeId]] = field(default_factory=dict)
    tree: TreeLinks | None = None
    mamba_content: Mapping[int, int] = field(default_factory=dict)


@runtime_checkable
class CacheAdapter(Protocol):
    """Operations the conformance machine drives, plus ``snapshot``. One instance = one fresh cache."""

    name: str
    version: str
    config: CacheConfig
    capabilities: frozenset[str]

    def alloc_kv(self, req: int, n: int) -> tuple[int, ...] | None:
        """``n`` token slots (whole pages) for request ``req``, or ``None`` (nothing changed) when short."""
        ...

    def free_kv(self, req: int, slots: tuple[int, ...]) -> None:
        """Return request ``req``'s slots (whole pages)."""
        ...

    def alloc_mamba(self, req: int) -> int | None:
        """One Mamba state slot for ``req``, or ``None`` when the pool is empty."""
        ...

    def free_mamba(self, req: int, slot: int) -> None:
        """Return ``req``'s Mamba slot."""
        ...

    def write_kv(self, slots: tuple[int, ...], tokens: tuple[int, ...], start: int) -> None:
        """Fill ``slots`` with the KV of ``tokens`` at positions ``start..`` (a fingerprint where data is fake)."""
        ...

    def write_mamba(self, slot: int, value: int) -> None:
        """Fill Mamba state ``slot`` with a state determined by ``value`` (a fingerprint where data is fake)."""
        ...

    def match_prefix(self, key: tuple[int, ...]) -> Match:
        """The engine's ``match_prefix`` (no lock taken)."""
        ...

    def lock(self, key: tuple[int, ...]) -> tuple[Match, Hashable]:
        """``match_prefix`` then ``inc_lock_ref`` on the match's last node; returns the match and a handle."""
        ...

    def unlock(self, handle: Hashable) -> None:
        """``dec_lock_ref`` with everything ``lock`` returned (a second call must be rejected)."""
        ...

    def handle_id(self, handle: Hashable) -> int:
        """The id under which ``snapshot().locks.handles`` reports ``handle``."""
        ...

    def insert(self, req: int, key: tuple[int, ...], slots: tuple[int, ...], mamba: int | None) -> Inserted:
        """The engine's ``insert`` of ``req``'s sequence; new pages' slots pass from ``req`` to the cache.

        ``mamba`` is ``None`` for a model without Mamba, or (only with
        ``stateless_insert``) a Mamba model's sequence cached without its state.
        """
        ...

    def evict(self, component: Component, n: int) -> int:
        """Evict at least ``n`` tokens (MAMBA: states) of ``component`` if possible; how many went."""
        ...

    def mamba_cow(self, handle: Hashable, req: int) -> int | None:
        """Copy the Mamba state of the locked match into a new slot for ``req`` (``None`` when impossible)."""
        ...

    def snapshot(self) -> Snapshot:
        """The state in spec terms. Must not change the cache."""
        ...


class Unsupported(Exception):
    """Raised by an adapter factory for a model kind its engine cannot build (reported as skipped)."""


RULES_NEEDING: dict[str, tuple[str, ...]] = {
    "ledgers": ("inv_slots_conserved", "inv_single_owner", "inv_owners_account"),
    "lru": ("inv_lru_detached", "inv_lru_links_symmetric", "inv_lru_members"),
    "lru_policy": ("inv_lru_recency", "evicts_lru_first", "evicts_enough", "evicts_no_more"),
    "tree": ("inv_tree_detached", "inv_tree_links_symmetric", "inv_tree_acyclic", "inv_tree_index"),
    "locks": (
        "inv_lock_ref_counts_handles",
        "inv_lock_ref_nonnegative",
        "inv_handles_match",
        "inv_locked_cached",
        "inv_sizes",  # sizes are derived from the lock state, so they need it too
    ),
    "sizes": ("inv_sizes",),
    "rejects_double_unlock": ("double_dec_lock_ref (rule)",),
    "content": ("inv_content",),
    "mamba_content": ("inv_mamba_content",),
    "mamba_cow": ("mamba_copy_on_write (rule)",),
    "stateless_insert": ("insert without a Mamba state (rule)",),
    "reinserts_cached_state": ("insert offering the state cached at its key's end (rule)",),
    "rejects_foreign_insert": ("foreign insert refused", "insert_foreign (rule)"),
    "rejects_bad_arguments": ("inv_domain_enforced", "evict_bad (rule)"),
}
"""The rules that are skipped (and reported as skipped) when an adapter lacks a capability."""

ALIASES: dict[str, str] = {
    "reference": "kvledger.contracts.adapters.reference:ReferenceAdapter",
    "sglang": "kvledger.contracts.adapters.sglang.unified:unified_python_factory",
    "sglang-rust": "kvledger.contracts.adapters.sglang.unified:unified_rust_factory",
    "sglang-0.5.23": "kvledger.contracts.adapters.sglang.unified:unified_python_factory",
    "sglang-0.5.23-rust": "kvledger.contracts.adapters.sglang.unified:unified_rust_factory",
    "sglang-0.5.9": "kvledger.contracts.adapters.sglang.legacy:radix_cache_factory",
    "sglang-0.5.9-mamba": "kvledger.contracts.adapters.sglang.legacy:mamba_radix_cache_factory",
    "sglang-0.5.10": "kvledger.contracts.adapters.sglang.legacy:radix_cache_factory",
    **{
        f"sglang-0.5.{n}-mamba": "kvledger.contracts.adapters.sglang.legacy:mamba_radix_cache_factory"
        for n in range(10, 21)
    },
    **{f"sglang-0.5.{n}-radix": "kvledger.contracts.adapters.sglang.legacy:radix_cache_factory" for n in range(9, 24)},
    **{
        f"sglang-0.5.{n}-swa": "kvledger.contracts.adapters.sglang.legacy_swa:swa_radix_cache_factory"
        for n in range(9, 21)
    },
    **{
        f"sglang-0.5.{n}-cpp": "kvledger.contracts.adapters.sglang.legacy_cpp:radix_cache_cpp_factory"
        for n in range(9, 21)
    },
    "sglang-0.5.11": "kvledger.contracts.adapters.sglang.unified_early:early_unified_factory",
    "sglang-0.5.12": "kvledger.contracts.adapters.sglang.unified_early:early_unified_factory",
    **{
        f"sglang-{v}": "kvledger.contracts.adapters.sglang.unified_early:early_unified_factory"
        for v in ("0.5.13", "0.5.14", "0.5.15", "0.5.16")
    },
    **{
        f"sglang-{v}": "kvledger.contracts.adapters.sglang.unified_inc_lock:inc_lock_python_factory"
        for v in ("0.5.17", "0.5.18", "0.5.19", "0.5.20", "0.5.21")
    },
    **{
        f"sglang-{v}-rust": "kvledger.contracts.adapters.sglang.unified_inc_lock:inc_lock_rust_factory"
        for v in ("0.5.19", "0.5.20", "0.5.21")
    },
    "sglang-0.5.22": "kvledger.contracts.adapters.sglang.unified:unified_python_factory",
    "sglang-0.5.22-rust": "kvledger.contracts.adapters.sglang.unified:unified_rust_factory",
}
"""Short names for ``kvledger check --adapter``.

``sglang`` (= ``sglang-0.5.23``) and ``sglang-rust`` (= ``sglang-0.5.23-rust``):
0.5.23's ``UnifiedRadixCache`` on its Python or Rust tree core, built with
the tree components each model kind names (``full``/``full-paged``: FULL;
``swa``: FULL+SWA; ``mamba``: FULL+MAMBA; ``hybrid``: all three), so one run
checks every kind; ``--model swa`` checks one. ``sglang-0.5.9``: 0.5.9's
``RadixCache`` (full attention); ``sglang-0.5.9-mamba``: its ``MambaRadixCache``;
``sglang-0.5.10`` and ``sglang-0.5.10-mamba`` the same in 0.5.10, ``sglang-0.5.11-mamba`` to
``sglang-0.5.20-mamba`` the ``MambaRadixCache`` those releases still ship beside the unified one (0.5.21
drops it), ``sglang-0.5.9-radix`` to ``sglang-0.5.23-radix`` the ``RadixCache`` every release ships (the
plain name is the unified cache from 0.5.11 on), ``sglang-0.5.9-swa`` to ``sglang-0.5.20-swa`` the legacy
``SWARadixCache`` (full attention + SWA, ``--model swa``; 0.5.21 drops it), ``sglang-0.5.9-cpp`` to
``sglang-0.5.20-cpp`` the C++ tree's ``RadixCacheCpp`` (full attention; 0.5.21 drops it).
``sglang-0.5.11`` to ``sglang-0.5.16``: the installed release's first
``UnifiedRadixCache`` (components on the cache; every kind, as ``sglang`` does). ``sglang-0.5.22`` (and
``-rust``): 0.5.22's, read as 0.5.23's. ``sglang-0.5.17`` to ``sglang-0.5.21`` (and ``-rust`` from 0.5.19, the
first release with a Rust core): the installed release's cache on its tree core, locked through ``inc_lock_ref``
(``unified_inc_lock``; every kind, except Mamba on 0.5.19's Rust core).
"""

AdapterFactory = Callable[[CacheConfig], CacheAdapter]


def release_alias(spec: str) -> str:
    """``spec`` with a post release named as the release it patches: ``sglang-0.5.12.post1-system`` is
    ``sglang-0.5.12-system`` (a post release ships its release's memory manager)."""
    return _POST_ALIAS.sub(r"\1", spec)


_POST_ALIAS = re.compile(r"^(sglang-\d+\.\d+\.\d+)\.post\d+(?=-|$)")


def load_factory(spec: str) -> AdapterFactory:
    """The factory named by ``spec``: an alias, or ``package.module:callable`` taking a ``CacheConfig``."""
    spec = release_alias(spec)
    target = ALIASES.get(spec, spec)
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"adapter {spec!r}: expected an alias ({', '.join(ALIASES)}) or package.module:factory")
    import importlib

    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"adapter {spec!r}: cannot import {module_name}: {err}") from err
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ValueError(f"adapter {spec!r}: {module_name} has no callable {attr!r}")
    return factory  # type: ignore[no-any-return]


class Capable(Protocol):
    """Anything that declares capabilities: a cache adapter or a system adapter."""

    capabilities: frozenset[str]


A = TypeVar("A", bound=Capable)


def set_aside(adapter: A, capabilities: frozenset[str]) -> A:
    """``adapter`` checked without ``capabilities``: their laws are skipped and reported, as for a missing one.

    For a finding already filed: ``kvledger check --set-aside inv_lru_detached`` goes on looking past it.
    """
    kept = [c for c in adapter.capabilities if c not in capabilities and c.partition(":")[0] not in capabilities]
    adapter.capabilities = frozenset(kept)  # NOTE: setting ``lru_policy`` aside sets aside ``lru_policy:full`` too
    return adapter


def capabilities_named(name: str, needing: Mapping[str, tuple[str, ...]]) -> frozenset[str]:
    """The capabilities ``name`` stands for: itself when it is one, else those whose laws include it (empty: none)."""
    if name in needing:
        return frozenset({name})
    return frozenset(cap for cap, laws in needing.items() if name in laws or f"{name} (rule)" in laws)


def has_capability(capabilities: frozenset[str], cap: str) -> bool:
    """Whether ``capabilities`` hold ``cap`` for some part at least (``lru_policy:full`` holds ``lru_policy``)."""
    return cap in capabilities or any(c.startswith(cap + ":") for c in capabilities)


def policy_components(capabilities: frozenset[str], components: Iterable[Component]) -> frozenset[Component]:
    """Those of a cache's ``components`` whose lists and evictions follow the LRU policy: all of them with
    ``lru_policy``, else those named ``lru_policy:<component>``."""
    every = "lru_policy" in capabilities
    return frozenset(c for c in components if every or f"lru_policy:{c.value}" in capabilities)


def skipped_rules(capabilities: frozenset[str]) -> list[str]:
    """The rules an adapter with ``capabilities`` cannot be checked for (each once; a capability held for one
    component only counts as held: its laws run for that component)."""
    missing = [r for cap, rules in RULES_NEEDING.items() if not has_capability(capabilities, cap) for r in rules]
    return list(dict.fromkeys(missing))
