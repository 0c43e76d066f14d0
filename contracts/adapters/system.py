"""The request-level adapter protocol: how the system machine drives *any* engine's memory manager.

:class:`~kvledger.contracts.adapters.protocol.CacheAdapter` checks a radix
cache through its own API. Most leaks live above it, in the scheduler: the
admission step, retraction, abort, streaming sessions, the engine's idle leak
check. :class:`SystemAdapter` drives that layer by the request lifecycle
(add, admit, extend, finish, retract, abort, sessions, evict, the idle check)
and reports, after every call, the whole memory manager in spec terms
(:class:`SystemSnapshot`): every pool's ledger, what each owner's own
structures reference, the request table, the requests and sessions, the lock
state and size counters. The machine in
:mod:`kvledger.contracts.machines.system` calls nothing else, so the
reference implementation's adapter
(:mod:`kvledger.contracts.adapters.reference_system`) and an engine's adapter
(SGLang's scheduler, vLLM's KV cache manager) are checked by the same laws.

Requests are ints the adapter hands out; it maps them to the engine's own
request objects. An engine whose scheduler picks for itself (which waiting
request to admit, which running one to retract) does so, and says what
happened in the :class:`StepResult`. What an engine cannot express is a
declared capability; the laws that need it are reported as *skipped*.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from kvledger.contracts.adapters.protocol import release_alias
from kvledger.spec.ledger import Ledger
from kvledger.spec.locks import LockState
from kvledger.spec.lru import LruState
from kvledger.spec.prefix import PrefixCache
from kvledger.spec.shared import SharedPool
from kvledger.spec.types import Component, Owner

SYSTEM_CAPABILITIES = frozenset(
    {
        "sessions",
        "chunk",
        "retract",
        "abort",
        "evict",
        "idle_check",
        "itemized_leaks",
        "locks",
        "sizes",
        "content",
        "rows",
        "speculative",
        "inject_failure",
        "targeted_admission",
        "prefill_on_admit",
        "strict_budget",
        "reservations",
        "work_conserving",
        "prefix_locked",
        "caches_on_finish",
        "prefix_cache",
        "session_tokens",
        "caches_on_chunk",
        "chunk_prompts_only",
        "exact_eviction",
        "finish_in_place",
    }
)
"""Everything a system adapter may provide.

``sessions``: streaming sessions (open, resume by a request, close).
``chunk``: chunked prefill (``cache_unfinished_req``) on request.
``retract`` / ``abort``: preemption and abort of a running request.
``evict``: explicit eviction from the prefix cache.
``idle_check``: the engine's own leak check (:meth:`SystemAdapter.idle_check`);
``itemized_leaks``: its verdict names the leaked slots, not only a count.
``locks`` / ``sizes``: the cache's lock state / (evictable, protected) counters;
with ``locks`` every live handle is held by a running request (``RequestView.handle``)
or an open session (``SessionView.handle``: SGLang's streaming slot keeps its first
turn's lock on the tree until the session closes).
``content``: the KV each slot holds (fingerprints where the data is fake).
``rows``: the request-to-token table. ``speculative``: ``extend`` keeps
``ahead`` slots allocated past the computed tokens, and (with ``rows``) a row
grows to hold its computed tokens and the ``ahead`` asked, in whole pages, and
no more than that or than it held (``spec.ledger.inv_row_grows_as_asked``: the
law ``extend takes what it asked``). ``inject_failure``: the
next allocation can be made to fail (:meth:`SystemAdapter.inject_failure`).
``targeted_admission``: ``admit(budget, rid)`` tries exactly that request.
``prefill_on_admit``: an admitted request has computed its whole prompt when
``admit`` returns (``admission commits`` then checks its KV, and
``inv_waiting_blank`` that a waiting request keeps no computed or matched
length; an engine that prefills later, or in chunks, leaves it out). ``strict_budget``: no request is
admitted past the step's token budget (SGLang admits the first request of a
batch whatever its size, so it does not starve; ``admission within budget``
is then not checked). ``reservations``: a request rejected by admission may keep
what its first attempt took, as a reservation it uses when admitted and gives
back when it ends (SGLang 0.5.23 keeps a rejected session request's
copy-on-write Mamba slot); ``admission rolls back`` then lets a rejected attempt
that found the request holding nothing leave it a reservation, and checks every
later attempt against it, so a reservation never grows or changes, and the
ledgers see it held by its request. It is a licence, not a feature: the
reference implementation does not declare it. ``work_conserving``: a request
tried alone whose whole prompt fits the budget and finds room in every pool
(free slots, not counting what the cache could evict) is admitted
(``spec.admission.refusal_has_reason``: the law ``admission admits what fits``),
and where a step reports the order it tried its requests (``StepResult.tried``),
each refused one fit neither what earlier admissions left of the budget nor of
the pools (``spec.admission.inv_batch_work_conserving``); an engine that holds
back headroom (SGLang's new-token ratio) leaves it out. ``prefix_locked`` (with
``locks``): a running request's lock handle covers exactly the prefix it runs on,
its ``prefix_len`` tokens (``spec.locks.inv_lock_covers_prefix``: the law
``inv_lock_covers_prefix``); an admission that locks its match and then
recomputes it, or a chunk that moves the lock without the prefix, breaks it.
The SGLang scheduler adapters leave it out: they report the match at admission
as ``prefix_len``, while SGLang caches a prompt once it is prefilled and moves the
request's lock onto it (``cache_unfinished_req`` after the prefill: 0.5.9, a
prefix of 0 and a lock over 9 tokens after one prefill); their chunked twins
follow each chunk's stash in ``prefix_len``, but the last chunk's prefill moves
the lock again. ``caches_on_finish``: a request that finishes (not into its session)
leaves its computed whole pages in the tree, and, holding a Mamba state with its
computed KV whole pages, a Mamba state with them (``spec.ledger.inv_end_caches``:
the law ``inv_end_caches``); the ledgers' ``kv`` unit is the tree's page.
SGLang's components scheduler adapters (0.5.13, 0.5.23), whose Mamba runs
without the extra (ping-pong) buffer, declare it (their snapshot's ``content``
then covers the tree's slots too), and so does the 0.5.9 to 0.5.12 adapter
(which drives Mamba without that buffer too). An adapter of a Mamba cache with a
ping-pong track buffer would leave it out: such a cache keeps the state of the
last track point, and nothing where the request passed none. ``caches_on_chunk`` (with ``chunk``): a chunk
of a request outside a session caches its computed whole pages as a finish does
(no Mamba state), and the request runs on them: its ``prefix_len`` is then its
computed tokens of whole pages (the law ``chunk caches its prefix``). SGLang's
scheduler adapters with chunked prefill on (``sglang-V-system-chunked``, every driven
release) declare it: a chunked request's prefix is what the step's stash cached.
``chunk_prompts_only`` (with ``chunk``): a licence, as ``reservations`` is: the engine chunks a prompt only
while it prefills it (SGLang's chunked prefill, at admission), so ``chunk`` of a request whose prompt is
prefilled is refused with a ``KVLedgerError`` that changes nothing (``rejected call leaves state unchanged``);
without it a refused chunk is a finding. ``prefix_cache``: the snapshot's ``prefix`` is
the radix cache's content in spec terms (``spec.prefix.PrefixCache``), and an
admission step caches nothing (it matches, locks, allocates and evicts), so a
request admitted outside a session runs on the longest prefix of its tokens but
the last that the match rule allows: no shorter than what the cache held both
before and after the step offers, no longer than what it held before
(``spec.admission.inv_reuses_cache``: the law ``admission reuses the cache``).
SGLang's components scheduler adapters (0.5.13, 0.5.23) declare it: their
admission is a whole scheduler step, but it matches every request before it
allocates, and a request it admits finishes in that step only by length (a
page evicted by one admission and cached again, with the same slots, by a
request that finished in the same step would look kept through it; none was
seen in some 3,700 checks over both releases and every kind). The 0.5.9 to
0.5.12 scheduler adapter declares it too. ``session_tokens``: each session's
``SessionView.tokens`` are the tokens it committed, and a turn resumes on all of
them that its own tokens but the last repeat (``spec.session.inv_resume_reuses``:
the law ``resume reuses the session``); a session's first turn, which finds it
holding nothing, is not judged; a turn that finishes into its session leaves it
committed to every token it computed (``spec.session.inv_turn_saved_whole``: the
law ``a turn commits what it computed``; without ``finish_in_place`` it is read as
``spec.session.inv_turn_saved_past``: committed to every token computed when the finish began, and perhaps
more).
SGLang's components scheduler adapters (0.5.13, 0.5.23) show them: the first
``kv_committed_len`` tokens of the turn SGLang's ``Session`` keeps as its last
finished one (SGLang prepends the session's context to a turn's tokens, so the
law judges the turn as the engine queued it); the 0.5.9 to 0.5.12 adapter
leaves it out. ``finish_in_place``: ``finish`` ends a running request
where it stands, computing nothing more, so what it computed is what the snapshot
before the call shows. SGLang's adapters leave it out: their ``finish`` decodes until
the oracle's EOS is sampled, and that decode computes the KV of the token sampled
before it; ``a turn commits what it computed`` and ``inv_end_caches``' Mamba state are then read
in their forms for a finish that computes more. ``exact_eviction``: an allocation
evicts from the cache only what it is short, stopping at the node that makes it
up (no watermark of slack): over an admission or a decode with no failure
injected, on the KV pool of a model without Mamba states, the tree gives up no
more than the step took beyond what was free (``spec.ledger.inv_evicts_only_short``:
the law ``alloc evicts no more than it is short``). SGLang's scheduler keeps
headroom of its own and leaves it out.
"""
SYSTEM_LICENCES = frozenset({"reservations", "chunk_prompts_only"})
"""The capabilities that license an engine's behaviour instead of offering a view or a move: declaring one lets
through what would otherwise be a finding, so an adapter declares it only for an engine that behaves so (the
reference implementation declares none)."""


@dataclass(frozen=True)
class SystemConfig:
    """The model kind and pool sizes a system run builds the engine with (tiny, so shrinking is readable)."""

    page_size: int = 1
    window: int | None = None
    mamba: bool = False
    kv_tokens: int = 48
    rows: int = 4
    max_context: int = 24
    mamba_slots: int = 6
    ping_pong: int = 1

    @property
    def kind(self) -> str:
        parts = ["full"] + (["swa"] if self.window is not None else []) + (["mamba"] if self.mamba else [])
        return "+".join(parts) + (f"/page{self.page_size}" if self.page_size > 1 else "")


@dataclass(frozen=True)
class RequestView:
    """One request the engine knows, as the spec sees it.

    ``tokens``: the tokens whose KV the request holds, in order (prompt and
    output so far); ``kv_len`` of them are computed. ``prefix_len``: positions
    matched at admission (from the cache, or resumed from a session).
    ``handle``: the id of the lock handle it holds on the cache, if any.
    """

    rid: int
    status: str  # "waiting" | "running" | "finished" | "aborted"
    session: int | None
    tokens: tuple[int, ...]
    kv_len: int
    prefix_len: int
    row: int | None
    handle: int | None = None


@dataclass(frozen=True)
class SessionView:
    """One open streaming session: its lengths, its row and slots, and the request it is lent to.

    ``slots``: the KV token slot of each position ``[0, alloc_len)`` as the row
    records it (empty while the session's memory is lent to a request).
    ``tokens``: the tokens it committed, ``committed_len`` of them (capability
    ``session_tokens``; empty while lent, or where the adapter cannot show them).
    ``handle``: the id of the lock handle the session holds on the cache (capability ``locks``), if any.
    """

    sid: int
    committed_len: int
    alloc_len: int
    row: int | None
    slots: tuple[int, ...] = ()
    lent_to: int | None = None
    tokens: tuple[int, ...] = ()
    handle: int | None = None


@dataclass(frozen=True)
class RowView:
    """One row of the request-to-token table held by ``holder``.

    ``slots``: the KV token slots of positions ``[0, len(slots))``;
    ``owned_from``: the first position whose slot ``holder`` owns (the
    positions before it are borrowed from the prefix cache, under a lock).
    """

    holder: Owner
    slots: tuple[int, ...]
    owned_from: int = 0


@dataclass(frozen=True)
class SharedBlocks:
    """Pools whose blocks several requests may hold at once (a reference count per block), as ``spec.shared`` sees them.

    ``pools``: name -> :class:`~kvledger.spec.shared.SharedPool` (holders, counts,
    the free queue's members, sentinels, the hash index). ``queues``: each pool's
    free queue as an intrusive list (``spec.lru``). ``counters``: every counter the
    engine keeps, as (kept, recounted). ``problems``: laws the abstraction
    function itself found broken (a queue walk that loops or leaves the pool).
    Single ownership is the special case of one holder per block
    (:func:`kvledger.spec.shared.from_ledger`).
    """

    pools: Mapping[str, SharedPool]
    queues: Mapping[str, LruState] = field(default_factory=dict)
    counters: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    problems: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class SystemSnapshot:
    """The memory manager's state in spec terms (the abstraction function's result).

    ``ledgers``: every pool (``"kv"``: token slots, or pages of a paged pool;
    ``"req_to_token"``, ``"mamba"``, ``"swa"``, ...), owners ``request(rid)``,
    ``node(id, component)``, ``session(sid)``. ``references``: per pool, what
    each owner's own structures name (a request's owned row positions and
    Mamba state, a tree node's value and state, a session's recorded row and
    slots), in the ledger's units; the law is held == referenced.
    ``page_size``: token slots per ledger unit of ``"kv"``.
    ``shared``: pools with shared blocks (vLLM's ``ref_cnt``), checked by the
    shared-block laws. ``prefix``: the radix cache's content (capability
    ``prefix_cache``). A field the adapter cannot observe is empty and its
    capability absent.
    """

    ledgers: Mapping[str, Ledger]
    references: Mapping[str, Mapping[Owner, frozenset[int]]]
    requests: Mapping[int, RequestView] = field(default_factory=dict)
    sessions: Mapping[int, SessionView] = field(default_factory=dict)
    rows: Mapping[int, RowView] = field(default_factory=dict)
    locks: LockState | None = None
    sizes: Mapping[Component, tuple[int, int]] = field(default_factory=dict)
    content: Mapping[int, int] = field(default_factory=dict)
    page_size: int = 1
    shared: SharedBlocks | None = None
    prefix: PrefixCache | None = None


@dataclass(frozen=True)
class StepResult:
    """What one call did to the requests (an engine's scheduler may act on others than the one named)."""

    admitted: tuple[int, ...] = ()
    rejected: tuple[int, ...] = ()
    finished: tuple[int, ...] = ()
    retracted: tuple[int, ...] = ()
    tried: tuple[int, ...] = ()
    """An admission step's admitted and rejected requests in the order its policy tried them (empty: not
    reported; then ``admission admits what fits`` judges only a request tried alone)."""


@dataclass(frozen=True)
class IdleVerdict:
    """The engine's own leak check: ``ok``, the slots it calls leaked per pool (``None``: only a count), its words."""

    ok: bool
    leaked: Mapping[str, frozenset[int]] | None
    message: str = ""


@runtime_checkable
class SystemAdapter(Protocol):
    """Request-level operations the system machine drives, plus ``snapshot``. One instance = one fresh engine."""

    name: str
    version: str
    engine_class: str
    config: SystemConfig
    capabilities: frozenset[str]

    def add_request(self, tokens: tuple[int, ...], session: int | None = None) -> int:
        """A new request (waiting, holding nothing); returns its id. ``session`` must be open."""
        ...

    def admit(self, budget: int, rid: int | None = None) -> StepResult:
        """One prefill scheduling step with a budget of ``budget`` new tokens.

        With ``targeted_admission`` and a ``rid``, exactly that waiting request
        is tried; otherwise the engine's policy picks from its waiting queue.
        """
        ...

    def extend(self, rid: int, n: int, ahead: int = 0) -> StepResult:
        """Decode ``n`` tokens for running request ``rid`` (``ahead``: slots kept allocated past them).

        All or nothing: on failure a ``KVLedgerError`` is raised and nothing changed. An engine that ran steps and
        stopped moving the request (``a running request moves``) is a finding, not a failure: the adapter raises
        :class:`~kvledger.spec.errors.LawBroken`, since the state may have changed on the way (``finish`` too).
        """
        ...

    def finish(self, rid: int) -> StepResult:
        """The request ends (the model emits EOS): its prefix is cached or saved to its session."""
        ...

    def chunk(self, rid: int) -> StepResult:
        """Chunked prefill: cache the request's computed prefix and keep running on it. With ``chunk_prompts_only``
        (an engine that chunks a prompt only while it prefills it), a request whose prompt is computed may be refused
        with a ``KVLedgerError`` that changes nothing."""
        ...

    def retract(self, rid: int) -> StepResult:
        """Preempt running request ``rid`` (the engine may pick its own victims): it waits again, holding nothing."""
        ...

    def abort(self, rid: int) -> StepResult:
        """Abort ``rid`` at whatever stage it is: everything it holds is returned."""
        ...

    def open_session(self, sid: int) -> None:
        """Open streaming session ``sid`` (holding nothing)."""
        ...

    def close_session(self, sid: int) -> None:
        """Close session ``sid``: everything it holds is returned."""
        ...

    def evict(self, component: Component, n: int) -> int:
        """Evict at least ``n`` tokens (MAMBA: states) of ``component`` from the prefix cache; how many went."""
        ...

    def inject_failure(self) -> None:
        """Make the next allocation fail (``inject_failure`` capability)."""
        ...

    def idle_check(self) -> IdleVerdict | None:
        """Run the engine's own leak check (strict mode); ``None`` when it cannot run now (not idle)."""
        ...

    def snapshot(self) -> SystemSnapshot:
        """The state in spec terms. Must not change the engine."""
        ...

    # NOTE: optional: ``take_refused() -> list[(rid, SharedPool before, SharedPool after)]``, the refused
    # admissions since the last call (an engine whose admission folds matching and allocating into one call).


SYSTEM_RULES_NEEDING: dict[str, tuple[str, ...]] = {
    "idle_check": ("leak checker agrees with the ledgers",),
    "locks": (
        "inv_lock_ref_counts_handles",
        "inv_lock_ref_nonnegative",
        "inv_handles_owned",
        "inv_borrowed_under_lock",
    ),
    "prefix_locked": ("inv_lock_covers_prefix",),
    "content": ("inv_content",),
    "rows": ("inv_rows_held", "inv_borrowed_under_lock", "extend takes what it asked"),
    "speculative": ("extend takes what it asked",),
    "sessions": ("resume is append-only", "inv_committed_within_allocated", "close_session (rule)"),
    "chunk": ("chunk (rule)",),
    "retract": ("retract (rule)",),
    "abort": ("abort (rule)",),
    "evict": ("evict (rule)",),
    "inject_failure": ("inject_allocation_failure (rule)",),
    "caches_on_finish": ("inv_end_caches",),
    "prefix_cache": ("admission reuses the cache",),
    "session_tokens": ("resume reuses the session", "a turn commits what it computed"),
    "caches_on_chunk": ("chunk caches its prefix",),
    "exact_eviction": ("alloc evicts no more than it is short",),
}
"""The laws and rules skipped (and reported as skipped) when a system adapter lacks a capability."""


def skipped_system_rules(capabilities: frozenset[str]) -> list[str]:
    """The laws and rules a system adapter with ``capabilities`` cannot be checked for (each once)."""
    missing = [r for cap, rules in SYSTEM_RULES_NEEDING.items() if cap not in capabilities for r in rules]
    return list(dict.fromkeys(missing))


SystemAdapterFactory = Callable[[SystemConfig], SystemAdapter]

EARLY_COMPONENT_RELEASES = ("0.5.13", "0.5.14", "0.5.15", "0.5.16")
"""SGLang releases whose scheduler is assembled from components over the first ``UnifiedRadixCache`` (nodes on the
cache): ``scheduler_components_early``."""
COMPONENT_RELEASES = ("0.5.17", "0.5.18", "0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23")
"""SGLang releases whose scheduler is assembled from components over a ``UnifiedRadixCache`` on a tree core:
``scheduler_components``."""
CPP_COMPONENT_RELEASES = (*EARLY_COMPONENT_RELEASES, "0.5.17", "0.5.18", "0.5.19", "0.5.20")
"""Components releases that still ship the C++ radix tree (``RadixCacheCpp``): ``scheduler_components_cpp``."""

SYSTEM_ALIASES: dict[str, str] = {
    "reference": "kvledger.contracts.adapters.reference_system:ReferenceSystemAdapter",
    "sglang-system": "kvledger.contracts.adapters.sglang.system_factory:installed_system_factory",
    "sglang-system-chunked": "kvledger.contracts.adapters.sglang.system_factory:installed_chunked_factory",
    **{
        f"sglang-{v}-system": "kvledger.contracts.adapters.sglang.scheduler:scheduler_factory"
        for v in ("0.5.9", "0.5.10", "0.5.11", "0.5.12")
    },
    **{
        f"sglang-{v}-system-chunked": "kvledger.contracts.adapters.sglang.scheduler:chunked_scheduler_factory"
        for v in ("0.5.9", "0.5.10", "0.5.11", "0.5.12")
    },
    **{
        f"sglang-{v}-system-cpp": "kvledger.contracts.adapters.sglang.scheduler:scheduler_cpp_factory"
        for v in ("0.5.9", "0.5.10", "0.5.11", "0.5.12")
    },
    **{
        f"sglang-{v}-system-chunked-cpp": "kvledger.contracts.adapters.sglang.scheduler:chunked_scheduler_cpp_factory"
        for v in ("0.5.9", "0.5.10", "0.5.11", "0.5.12")
    },
    **{
        f"sglang-{v}-system-nocache": "kvledger.contracts.adapters.sglang.scheduler:scheduler_nocache_factory"
        for v in ("0.5.9", "0.5.10", "0.5.11", "0.5.12")
    },
    **{
        f"sglang-{v}-system-chunked-nocache": "kvledger.contracts.adapters.sglang.scheduler:"
        "chunked_scheduler_nocache_factory"
        for v in ("0.5.9", "0.5.10", "0.5.11", "0.5.12")
    },
    **{
        f"sglang-{v}-system-cpp": "kvledger.contracts.adapters.sglang.scheduler_components_cpp:cpp_system_factory"
        for v in CPP_COMPONENT_RELEASES
    },
    **{
        f"sglang-{v}-system-chunked-cpp": "kvledger.contracts.adapters.sglang.scheduler_components_cpp:"
        "cpp_chunked_factory"
        for v in CPP_COMPONENT_RELEASES
    },
    **{
        f"sglang-{v}-system-nocache": "kvledger.contracts.adapters.sglang.scheduler_components_nocache:"
        "nocache_system_factory"
        for v in (*EARLY_COMPONENT_RELEASES, *COMPONENT_RELEASES)
    },
    **{
        f"sglang-{v}-system-chunked-nocache": "kvledger.contracts.adapters.sglang.scheduler_components_nocache:"
        "nocache_chunked_factory"
        for v in (*EARLY_COMPONENT_RELEASES, *COMPONENT_RELEASES)
    },
    **{
        f"sglang-{v}-system-nocache-unified": "kvledger.contracts.adapters.sglang.scheduler_components_nocache:"
        "nocache_unified_factory"
        for v in (*EARLY_COMPONENT_RELEASES, *COMPONENT_RELEASES)
    },
    **{
        f"sglang-{v}-system": "kvledger.contracts.adapters.sglang.scheduler_components_early:early_components_factory"
        for v in EARLY_COMPONENT_RELEASES
    },
    **{
        f"sglang-{v}-system-chunked": "kvledger.contracts.adapters.sglang.scheduler_components_early:"
        "early_chunked_factory"
        for v in EARLY_COMPONENT_RELEASES
    },
    **{
        f"sglang-{v}-system": "kvledger.contracts.adapters.sglang.scheduler_components:scheduler_system_factory"
        for v in COMPONENT_RELEASES
    },
    **{
        f"sglang-{v}-system-chunked": "kvledger.contracts.adapters.sglang.scheduler_components:chunked_system_factory"
        for v in COMPONENT_RELEASES
    },
    "vllm": "kvledger.contracts.adapters.vllm.adapter:vllm_factory",
    "vllm-hybrid": "kvledger.contracts.adapters.vllm.adapter:vllm_hybrid_factory",
    "vllm-mamba": "kvledger.contracts.adapters.vllm.adapter:vllm_mamba_factory",
}
"""Short names for ``kvledger check --suite system --adapter``."""


def load_system_factory(spec: str) -> SystemAdapterFactory:
    """The factory named by ``spec``: an alias, or ``package.module:callable`` taking a ``SystemConfig``."""
    spec = release_alias(spec)
    target = SYSTEM_ALIASES.get(spec, spec)
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(
            f"system adapter {spec!r}: expected an alias ({', '.join(SYSTEM_ALIASES)}) or package.module:factory"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"system adapter {spec!r}: cannot import {module_name}: {err}") from err
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ValueError(f"system adapter {spec!r}: {module_name} has no callable {attr!r}")
    return factory  # type: ignore[no-any-return]
