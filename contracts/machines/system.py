"""The conformance machine for the whole memory manager: requests, admission, sessions, leak checker.

Drives :class:`kvledger.impl.memory.MemoryManager` with the paths a scheduler
takes — add, admit (under tight budgets), extend with speculative
over-allocation, chunk, finish, retract, abort, open/resume/save/close
sessions, evict, injected allocation failures — and after every step checks:

* ``inv_slots_conserved`` / ``inv_single_owner`` on every pool;
* ``inv_owners_account``: every owner holds exactly the slots its structure
  references (a request its row and ``row[own_from:alloc_len]`` and Mamba
  state, a tree node its value and state, a session what its slot records;
  finished requests and closed sessions nothing) — computed here from the
  structures, independently of the implementation's leak checker;
* ``leak checker agrees with the ledgers``: the checker's verdict and its
  leaked slots equal what the ledgers say (no false positive, no false
  negative);
* ``admission rolls back`` / ``admission commits`` (``spec.admission``) on
  every attempt; ``resume is append-only`` (``spec.session``);
* lock pairing on the cache (``inv_lock_ref_counts_handles``,
  ``inv_lock_ref_nonnegative``) and ``inv_handles_owned`` (every live handle
  is held by a running request);
* ``inv_content``: each running request's row holds the KV of its tokens.
"""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvledger.contracts.abstraction import ledger_of
from kvledger.contracts.adapters.reference import snapshot_of
from kvledger.impl.admission import Budget, admit
from kvledger.impl.allocators import PagedAllocator, TokenAllocator
from kvledger.impl.leaks import check_leaks
from kvledger.impl.mamba import MambaPool
from kvledger.impl.memory import MemoryManager
from kvledger.impl.radix import RadixCache
from kvledger.impl.req_to_token import ReqToTokenPool
from kvledger.impl.requests import Request, Status
from kvledger.spec import admission as A
from kvledger.spec import ledger as L
from kvledger.spec import locks as K
from kvledger.spec.errors import KVLedgerError
from kvledger.spec.ledger import Ledger
from kvledger.spec.prefix import fingerprint
from kvledger.spec.types import Component, HandleId, Owner, node

PROMPTS: tuple[tuple[int, ...], ...] = ((1, 2, 3, 4), (1, 2, 5, 6), (7, 8))
SESSIONS = (1, 2)
BUDGETS = st.sampled_from([64, 16, 2])  # prefill token budgets: roomy, tight, too small

RULES = (
    "inv_slots_conserved",
    "inv_single_owner",
    "inv_owners_account",
    "leak checker agrees with the ledgers",
    "admission rolls back",
    "admission commits",
    "resume is append-only",
    "inv_lock_ref_counts_handles",
    "inv_lock_ref_nonnegative",
    "inv_handles_owned",
    "inv_content",
    "rejected call leaves state unchanged",
)


def build_manager(page_size: int = 1, mamba: bool = False) -> MemoryManager:
    """A tiny memory manager (48 KV tokens, 4 rows, 6 Mamba slots with 1 track buffer each)."""
    kv = TokenAllocator(48) if page_size == 1 else PagedAllocator(48 // page_size, page_size)
    pool = MambaPool(6, conv_shape=(2,), temporal_shape=(2,), ping_pong_size=1) if mamba else None
    return MemoryManager(RadixCache(kv, mamba=pool), ReqToTokenPool(4, 24))


def _fail(law: str, detail: str) -> AssertionError:
    return AssertionError(f"{law}: {detail}")


def references(mm: MemoryManager) -> dict[str, dict[Owner, set[int]]]:
    """The abstraction of the structures: per pool, what each owner references (pages for a paged pool)."""
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
    return out


def machine_for_system(make: Callable[[], MemoryManager]) -> type[RuleBasedStateMachine]:
    """A state machine class checking the memory managers ``make`` builds."""

    class SystemConformance(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.mm = make()

        def ledgers(self) -> dict[str, Ledger]:
            return {name: ledger_of(p) for name, p in self.mm.pools().items()}

        def live(self, status: Status) -> list[Request]:
            return [r for r in self.mm.requests.values() if r.status is status]

        # ---------------------------------------------------------- rules

        @rule(
            prompt=st.integers(0, len(PROMPTS) - 1),
            suffix=st.lists(st.integers(1, 3), max_size=4),
            sid=st.sampled_from((None, *SESSIONS)),
            budget=BUDGETS,
        )
        def add_request(self, prompt: int, suffix: list[int], sid: int | None, budget: int) -> None:
            """A request arrives and the scheduler tries to admit it at once (it may be rejected and wait)."""
            if sid is not None and sid not in self.mm.sessions.slots:
                self.mm.sessions.open(sid)
            req = self.mm.add_request(PROMPTS[prompt] + tuple(suffix), sid)
            self._admit(req, budget)

        @precondition(lambda self: any(r.status is Status.WAITING for r in self.mm.requests.values()))
        @rule(pick=st.integers(0, 7), budget=BUDGETS)
        def admit(self, pick: int, budget: int) -> None:
            waiting = self.live(Status.WAITING)
            self._admit(waiting[pick % len(waiting)], budget)

        def _admit(self, req: Request, tokens: int) -> None:
            if req.session is not None and self.mm.sessions.slots[req.session].lent_to is not None:
                return  # one turn of a session at a time
            committed = self.mm.sessions.slots[req.session].committed_len if req.session is not None else 0
            before = self.ledgers()
            attempt = A.begin(req.owner, before, frozenset())
            admitted, _, _ = admit(self.mm, [req], Budget(tokens, 1))
            after = self.ledgers()
            handles = frozenset({HandleId(req.handle.id)} if req.handle is not None else set())
            if not admitted and not A.inv_rollback_restores(attempt, after, handles):
                leaked = A.leaked_by_rollback(attempt, after)
                raise _fail("admission rolls back", f"rejected request {req.rid} keeps {leaked} handles {set(handles)}")
            if admitted:
                if not A.inv_commit_keeps(attempt, after):
                    raise _fail("admission commits", f"admitted request {req.rid} lost slots it held")
                if req.session is not None and req.prefix_len > committed:
                    raise _fail("resume is append-only", f"request {req.rid} resumed {req.prefix_len} > {committed}")

        def _running(self, pick: int) -> Request | None:
            running = self.live(Status.RUNNING)
            return running[pick % len(running)] if running else None

        @rule(pick=st.integers(0, 7), n=st.integers(1, 3), ahead=st.integers(0, 3))
        def extend(self, pick: int, n: int, ahead: int) -> None:
            req = self._running(pick)
            if req is None:
                return
            before, fields = self.ledgers(), repr(req)
            try:
                self.mm.extend(req, tuple(range(1, n + 1)), ahead)
            except KVLedgerError as err:  # pool exhausted, injected failure, context full: nothing may change
                if self.ledgers() != before or repr(req) != fields:
                    raise _fail("rejected call leaves state unchanged", f"extend of request {req.rid}: {err}") from err

        @rule(pick=st.integers(0, 7), op=st.sampled_from(["finish", "finish", "chunk", "retract", "abort"]))
        def end_or_chunk(self, pick: int, op: str) -> None:
            req = self._running(pick)
            if req is None:
                return
            getattr(self.mm, op)(req)

        @rule(sid=st.sampled_from(SESSIONS))
        def close_session(self, sid: int) -> None:
            slot = self.mm.sessions.slots.get(sid)
            if slot is None:
                return
            lender = self.mm.requests.get(slot.lent_to) if slot.lent_to is not None else None
            if lender is not None and lender.status is Status.RUNNING:
                return
            for r in self.live(Status.WAITING):
                if r.session == sid:
                    self.mm.abort(r)
            self.mm.sessions.close(sid)

        @rule(comp=st.sampled_from([Component.FULL, Component.MAMBA]), n=st.integers(1, 8))
        def evict(self, comp: Component, n: int) -> None:
            if comp in self.mm.cache.components:
                self.mm.cache.evict(comp, n)

        @rule()
        def inject_allocation_failure(self) -> None:
            self.mm.fail_next += 1

        # ---------------------------------------------------------- laws

        @invariant()
        def inv_all_laws(self) -> None:
            mm = self.mm
            led = self.ledgers()
            for name, lg in led.items():
                if not L.inv_slots_conserved(lg):
                    raise _fail("inv_slots_conserved", f"pool {name!r}")
                if not L.inv_single_owner(lg):
                    raise _fail("inv_single_owner", f"pool {name!r}")
            refs = references(mm)
            truly_leaked: dict[str, set[int]] = {}
            for name, lg in led.items():
                owners = set(lg.held) | set(refs[name])
                for o in owners:
                    held, want = set(L.held_by(lg, o)), refs[name].get(o, set())
                    if held != want:
                        truly_leaked.setdefault(name, set()).update(held - want)
                        first = sorted(held ^ want)[:4]
                        culprit = [
                            f"slot {x}: given by {getattr(mm.events.get(int(mm.pools()[name].origin[x])), 'op', '?')}"
                            for x in sorted(held - want)[:2]
                        ]
                        self._pending = _fail(
                            "inv_owners_account",
                            f"pool {name!r}: {o} holds {sorted(held)} but "
                            f"references {sorted(want)} (differ at {first}) {culprit}",
                        )
            report = check_leaks(mm)
            found = {p: s for p, s in report.leaked().items() if s}
            if report.ok != (not truly_leaked) or found != truly_leaked:
                raise _fail(
                    "leak checker agrees with the ledgers",
                    f"checker says ok={report.ok} leaked={found}; ledgers say leaked={truly_leaked}\n{report}",
                )
            if truly_leaked:
                raise self._pending
            snap = snapshot_of(mm.cache)
            if not K.inv_lock_ref_nonnegative(snap.locks):
                raise _fail("inv_lock_ref_nonnegative", "a lock_ref went negative")
            if not K.inv_lock_ref_counts_handles(snap.locks):
                raise _fail("inv_lock_ref_counts_handles", "lock_ref differs from the live handles covering it")
            owned = {r.handle.id for r in mm.requests.values() if r.handle is not None and r.status is Status.RUNNING}
            if set(snap.locks.handles) != owned:
                raise _fail(
                    "inv_handles_owned",
                    f"live handles {sorted(snap.locks.handles)}, held by running requests {sorted(owned)}",
                )
            for r in self.live(Status.RUNNING):
                if r.row is None or not r.kv_len:
                    continue
                slots = mm.rows.table[r.row, : r.kv_len]
                got: list[int] = mm.kv.data[slots].tolist()
                expect = [fingerprint(t, i) for i, t in enumerate(r.tokens[: r.kv_len])]
                if got != expect:
                    bad = next(i for i, (g, w) in enumerate(zip(got, expect, strict=True)) if g != w)
                    raise _fail(
                        "inv_content",
                        f"request {r.rid} position {bad} slot {int(slots[bad])} holds another "
                        "token's KV (freed while in use?)",
                    )

    SystemConformance.__name__ = "SystemConformance"
    SystemConformance.__qualname__ = "SystemConformance"
    return SystemConformance
