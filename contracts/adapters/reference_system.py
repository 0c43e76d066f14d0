"""kvledger's own memory manager behind the request-level protocol, and its abstraction function.

:class:`ReferenceSystemAdapter` is the first
:class:`~kvledger.contracts.adapters.system.SystemAdapter`: it drives
:class:`~kvledger.impl.memory.MemoryManager` through its public paths only
(``add_request``, :func:`~kvledger.impl.admission.admit`, ``extend``,
``finish``, ``chunk``, ``retract``, ``abort``, sessions, ``evict``) and
states its state in spec terms with :func:`system_snapshot_of`, a whole-state
pass used after each step of a conformance run, never on a hot path.
"""

from __future__ import annotations

from kvledger.contracts.abstraction import ledger_of
from kvledger.contracts.adapters.protocol import Unsupported
from kvledger.contracts.adapters.reference import snapshot_of
from kvledger.contracts.adapters.system import (
    SYSTEM_CAPABILITIES,
    SYSTEM_LICENCES,
    IdleVerdict,
    RequestView,
    RowView,
    SessionView,
    StepResult,
    SystemConfig,
    SystemSnapshot,
)
from kvledger.impl.admission import Budget, admit
from kvledger.impl.allocators import PagedAllocator, TokenAllocator
from kvledger.impl.leaks import check_leaks
from kvledger.impl.mamba import MambaPool
from kvledger.impl.memory import MemoryManager
from kvledger.impl.radix import RadixCache
from kvledger.impl.req_to_token import ReqToTokenPool
from kvledger.impl.requests import Request, Status
from kvledger.spec.errors import ArgumentError, InvalidArgument
from kvledger.spec.types import Component, Owner, node

DEFAULT = SystemConfig()


class NoWindowModel(InvalidArgument, Unsupported):
    """A sliding-window config given to the reference memory manager, which has none: a typed refusal to a caller,
    a model kind the adapter declines (reported skipped) to ``kvledger check --adapter reference``."""


def build_manager(config: SystemConfig = DEFAULT, device: str = "cpu") -> MemoryManager:
    """The reference memory manager for ``config`` (token or paged KV; Mamba pool with track buffers).

    ``config``: a ``SystemConfig`` whose sizes are ints >= 1 (``ping_pong`` >= 0) and whose ``kv_tokens`` are whole
    pages; anything else is an ``ArgumentError`` naming the field (the pools themselves check their sizes too).
    """
    if not isinstance(config, SystemConfig):
        raise ArgumentError("create", "config", f"must be a SystemConfig, got {type(config).__name__} {config!r:.40}")
    for name in ("page_size", "kv_tokens", "rows", "max_context", "mamba_slots", "ping_pong"):
        value = getattr(config, name)
        if type(value) is not int or value < (0 if name == "ping_pong" else 1):
            raise ArgumentError("create", f"config.{name}", f"must be an int >= 1, got {value!r:.40}")
    if type(config.mamba) is not bool:
        raise ArgumentError("create", "config.mamba", f"must be a bool, got {config.mamba!r:.40}")
    if config.kv_tokens % config.page_size:
        raise ArgumentError(
            "create", "config.kv_tokens", f"{config.kv_tokens} is not whole pages of {config.page_size} tokens"
        )
    if config.window is not None:
        raise NoWindowModel("create", "kv", (), "the reference memory manager has no sliding-window model")
    ps = config.page_size
    kv = TokenAllocator(config.kv_tokens, device=device) if ps == 1 else PagedAllocator(config.kv_tokens // ps, ps)
    pool = (
        MambaPool(
            config.mamba_slots, conv_shape=(2,), temporal_shape=(2,), ping_pong_size=config.ping_pong, device=device
        )
        if config.mamba
        else None
    )
    return MemoryManager(RadixCache(kv, mamba=pool), ReqToTokenPool(config.rows, config.max_context))


def references(mm: MemoryManager) -> dict[str, dict[Owner, frozenset[int]]]:
    """Per pool, what each owner's own structures name (pages for a paged pool).

    A request: its row, its owned positions ``row[own_from:alloc_len]`` and its
    Mamba state; a tree node: its value and state; a session: its row,
    ``row[:alloc_len]`` and its state. Computed from the structures, never
    from the pools' tags, so it is independent of what the pools believe.
    """
    page = mm.page
    out: dict[str, dict[Owner, set[int]]] = {name: {} for name in mm.pools()}

    def add(pool: str, owner: Owner, slots: list[int] | tuple[int, ...], unit: int = 1) -> None:
        if slots:
            out[pool].setdefault(owner, set()).update(x // unit for x in slots)

    for r in mm.requests.values():
        if r.row is not None:
            add("req_to_token", r.owner, [r.row])
            add("kv", r.owner, mm.rows.table[r.row, r.own_from : r.alloc_len].tolist(), page)
        if r.mamba is not None:
            add("mamba", r.owner, r.mamba.slots())
    for n in mm.cache.nodes():
        if n is not mm.cache.root:
            add("kv", node(n.id, Component.FULL), n.value.tolist(), page)
            if n.mamba_slot is not None:
                add("mamba", node(n.id, Component.MAMBA), [n.mamba_slot])
    for s in mm.sessions.slots.values():
        if s.row is not None:
            add("req_to_token", s.owner, [s.row])
            add("kv", s.owner, mm.rows.table[s.row, : s.alloc_len].tolist(), page)
        if s.mamba is not None:
            add("mamba", s.owner, s.mamba.slots())
    return {pool: {o: frozenset(x) for o, x in owners.items()} for pool, owners in out.items()}


def system_snapshot_of(mm: MemoryManager) -> SystemSnapshot:
    """The abstraction of ``mm``: ledgers, references, rows, requests, sessions, locks, sizes, content."""
    cache = snapshot_of(mm.cache)
    requests: dict[int, RequestView] = {}
    rows: dict[int, RowView] = {}
    content: dict[int, int] = {}
    data = mm.kv.data
    for r in mm.requests.values():
        requests[r.rid] = RequestView(
            r.rid,
            r.status.value,
            r.session,
            r.tokens[: r.kv_len] if r.status is Status.RUNNING else r.tokens,
            r.kv_len,
            r.prefix_len,
            r.row,
            None if r.handle is None else r.handle.id,
        )
        if r.row is not None:
            slots = tuple(mm.rows.table[r.row, : r.alloc_len].tolist())
            rows[r.row] = RowView(r.owner, slots, r.own_from)
            if r.status is Status.RUNNING and r.kv_len:
                for s in slots[: r.kv_len]:
                    content[s] = int(data[s])
    root = mm.cache.root
    for n in mm.cache.nodes():  # NOTE: and the KV the tree holds (what a finish leaves cached)
        if n is not root and n.value.numel():
            content.update(zip(n.value.tolist(), data[n.value].tolist(), strict=True))
    sessions: dict[int, SessionView] = {}
    for s in mm.sessions.slots.values():
        slots = tuple(mm.rows.table[s.row, : s.alloc_len].tolist()) if s.row is not None else ()
        sessions[s.sid] = SessionView(
            s.sid, s.committed_len, s.alloc_len, s.row, slots, s.lent_to, tuple(s.tokens[: s.committed_len])
        )
        if s.row is not None:
            rows[s.row] = RowView(s.owner, slots, 0)
    return SystemSnapshot(
        ledgers={name: ledger_of(p) for name, p in mm.pools().items()},
        references=references(mm),
        requests=requests,
        sessions=sessions,
        rows=rows,
        locks=cache.locks,
        sizes=cache.sizes,
        content=content,
        page_size=mm.page,
        prefix=cache.prefix,
    )


class ReferenceSystemAdapter:
    """kvledger's :class:`MemoryManager` as a :class:`~kvledger.contracts.adapters.system.SystemAdapter`."""

    name = "kvledger"
    engine_class = "kvledger.impl.memory.MemoryManager"
    # NOTE: the reference expresses everything the protocol names; 'reservations' is a licence, not a feature
    # (the reference rolls every rejected attempt back, so it is held to the strict law)
    capabilities = SYSTEM_CAPABILITIES - SYSTEM_LICENCES

    def __init__(self, config: SystemConfig = DEFAULT, manager: MemoryManager | None = None) -> None:
        """A fresh reference manager for ``config``, or ``manager`` as it is (its config read off it)."""
        from importlib.metadata import version

        self.version = version("kvledger")
        if manager is not None:
            config = SystemConfig(
                page_size=manager.page,
                mamba=manager.mamba is not None,
                kv_tokens=manager.kv.pool.capacity * manager.page,
                rows=manager.rows.pool.capacity,
                max_context=manager.rows.max_context_len,
            )
        self.config = config
        self.mm = manager if manager is not None else build_manager(config)

    def _req(self, rid: int) -> Request:
        req = self.mm.requests.get(rid)
        if req is None:
            raise InvalidArgument("request", "req_to_token", (), f"no request {rid}")
        return req

    def add_request(self, tokens: tuple[int, ...], session: int | None = None) -> int:
        return self.mm.add_request(tokens, session).rid

    def admit(self, budget: int, rid: int | None = None) -> StepResult:
        if rid is not None:
            waiting = [self._req(rid)]
        else:
            waiting = [r for r in self.mm.requests.values() if r.status is Status.WAITING]
        admitted, rejected, _ = admit(self.mm, waiting, Budget(budget, max(1, len(waiting))))
        done = {r.rid for r in admitted} | {r.rid for r in rejected}
        return StepResult(
            admitted=tuple(r.rid for r in admitted),
            rejected=tuple(r.rid for r in rejected),
            tried=tuple(r.rid for r in waiting if r.rid in done),  # NOTE: admit tries ``waiting`` in its order
        )

    def extend(self, rid: int, n: int, ahead: int = 0) -> StepResult:
        if type(n) is not int or n < 1:
            raise InvalidArgument(
                "extend", "req_to_token", (), f"n (tokens to decode) must be an int >= 1, got {n!r:.40}"
            )
        self.mm.extend(self._req(rid), tuple(range(1, n + 1)), ahead)
        return StepResult()

    def finish(self, rid: int) -> StepResult:
        self.mm.finish(self._req(rid))
        return StepResult(finished=(rid,))

    def chunk(self, rid: int) -> StepResult:
        self.mm.chunk(self._req(rid))
        return StepResult()

    def retract(self, rid: int) -> StepResult:
        self.mm.retract(self._req(rid))
        return StepResult(retracted=(rid,))

    def abort(self, rid: int) -> StepResult:
        self.mm.abort(self._req(rid))
        return StepResult()

    def open_session(self, sid: int) -> None:
        self.mm.sessions.open(sid)

    def close_session(self, sid: int) -> None:
        self.mm.sessions.close(sid)

    def evict(self, component: Component, n: int) -> int:
        if type(component) is not Component:
            raise InvalidArgument("evict", "kv", (), f"component must be a Component, got {component!r:.40}")
        if component not in self.mm.cache.components:
            return 0
        return self.mm.cache.evict(component, n)

    def inject_failure(self) -> None:
        self.mm.fail_next += 1

    def idle_check(self) -> IdleVerdict:
        report = check_leaks(self.mm)
        leaked = {p: frozenset(s) for p, s in report.leaked().items() if s}
        return IdleVerdict(report.ok, leaked, str(report))

    def provenance(self, pool: str, slot: int) -> str:
        """The operation that gave ``slot`` of ``pool`` its current owner (for violation messages)."""
        event = self.mm.events.get(int(self.mm.pools()[pool].origin[slot]))
        return event.op if event is not None else "?"

    def snapshot(self) -> SystemSnapshot:
        return system_snapshot_of(self.mm)
