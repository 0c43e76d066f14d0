"""The conformance machine for a whole memory manager, driven through any ``SystemAdapter``.

Drives an engine with the paths a scheduler takes — add, admit (under tight
budgets), extend with speculative over-allocation, chunk, finish, retract,
abort, open/resume/save/close sessions, evict, injected allocation failures —
through :class:`~kvledger.contracts.adapters.system.SystemAdapter` only, and
after every step checks on the adapter's snapshot (:func:`check_snapshot`):

* ``inv_slots_conserved`` / ``inv_single_owner`` on every pool;
* ``inv_owners_account``: every owner holds exactly the slots its own
  structures reference (a request its row, owned positions and Mamba state, a
  tree node its value and state, a session what its slot records; finished
  requests and closed sessions nothing);
* ``inv_rows_held`` (``spec.ledger``): every slot a live row names lies in
  the pool, is held by the row's holder or by the cache, and is named once;
* ``inv_released_on_end`` (``spec.ledger``): a finished or aborted request holds
  nothing in any pool (checked even where an engine's own structures still name
  what it kept, which ``inv_owners_account`` then cannot see);
* ``leak checker agrees with the ledgers``: the engine's own idle check and
  the ledgers agree (no false positive, no false negative);
* ``admission rolls back`` / ``admission commits`` (``spec.admission``) on
  every attempt, and an admitted request holds the KV of its whole prompt,
  matched or computed, and computes at least its last token;
  ``admission within budget`` (``spec.admission.fits``): a batch admits no
  more new tokens than its budget; ``admission admits what fits``
  (``spec.admission.inv_batch_work_conserving``, work conservation): in the
  order a step tried its requests, one whose whole prompt fits what is left of
  the budget and finds room left in every pool is admitted;
  ``admission reuses the cache`` (``spec.admission.inv_reuses_cache``): a
  request admitted outside a session runs on the longest prefix of its tokens
  but the last that the cache held through the step;
  ``extend commits``: a decode of ``n`` tokens adds exactly ``n`` and keeps
  the earlier ones; ``resume is append-only``, ``resume reuses the session``
  (a turn resumes on every committed token its tokens but the last repeat) and
  ``inv_committed_within_allocated`` (``spec.session``);
* lock pairing (``inv_lock_ref_counts_handles``, ``inv_lock_ref_nonnegative``)
  and ``inv_handles_owned`` (every live handle is held by a running request or
  an open session);
* ``inv_content``: each running request's row holds the KV of its tokens;
* ``rejected call leaves state unchanged``.

Laws whose data an adapter cannot observe are skipped (its capabilities).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import cast

from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context, target
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvledger.contracts.adapters.reference_system import ReferenceSystemAdapter
from kvledger.contracts.adapters.reference_system import build_manager as _build_reference
from kvledger.contracts.adapters.system import (
    IdleVerdict,
    RequestView,
    StepResult,
    SystemAdapter,
    SystemConfig,
    SystemSnapshot,
)
from kvledger.contracts.machines.shared_laws import SHARED_RULES, check_refused, check_shared_laws, check_transition
from kvledger.contracts.machines.stable import sampled_from
from kvledger.impl.memory import MemoryManager
from kvledger.spec import admission as A
from kvledger.spec import ledger as L
from kvledger.spec import locks as K
from kvledger.spec import session as S
from kvledger.spec.errors import KVLedgerError
from kvledger.spec.locks import LockSite
from kvledger.spec.prefix import fingerprint
from kvledger.spec.types import Component, HandleId, Owner, OwnerKind, SlotId, request, session

PROMPTS: tuple[tuple[int, ...], ...] = ((1, 2, 3, 4), (1, 2, 5, 6), (7, 8), (1,))
"""Shared prompt heads (a suffix is drawn after each); the last, one token, with no suffix is the least valid prompt:
a request that ends with one token computed (kept programs name a head by its index: new heads go last)."""
SESSIONS = (1, 2)
BUDGETS = sampled_from([64, 16, 2]) | st.integers(1, 20)
"""Prefill token budgets: roomy, tight, too small, or any small one (some equal a request's demand exactly: the
boundary an off-by-one budget check gets wrong)."""
SUFFIXES = st.lists(st.integers(1, 3), max_size=4)
LONG_SUFFIXES = st.lists(st.integers(1, 3), min_size=5, max_size=14)  # NOTE: prompts up to 18 of a 24-token row

SWARM = ("sessions", "speculative", "long prompts", "tight budgets")
"""Argument-level features one example may switch off (swarm testing). Hypothesis already switches whole
rules off per example (its feature flags); these reach inside rules: an example without ``sessions`` runs
ordinary requests only, one without ``tight budgets`` admits under the roomy budget, and so on. The
features off are drawn first, so the draw shrinks towards every feature on. The laws are always checked."""

SWARM_OFF = st.tuples(*(st.booleans() for _ in SWARM)).map(
    lambda bs: frozenset(f for f, b in zip(SWARM, bs, strict=True) if b)
)
"""Which features an example switches off: each one on its own coin (a set drawn as a collection kept nearly every
example's ``batches`` off: its draws repeat), shrinking towards every feature on."""

RULES = (
    "inv_slots_conserved",
    "inv_single_owner",
    "inv_owners_account",
    "inv_rows_held",
    "inv_released_on_end",
    "leak checker agrees with the ledgers",
    "admission rolls back",
    "admission commits",
    "admission within budget",
    "admission admits what fits",
    "admission reuses the cache",
    "alloc evicts no more than it is short",
    "extend commits",
    "extend takes what it asked",
    "a running request moves",
    "resume is append-only",
    "resume reuses the session",
    "a turn commits what it computed",
    "inv_committed_within_allocated",
    "inv_lock_ref_counts_handles",
    "inv_lock_ref_nonnegative",
    "inv_handles_owned",
    "inv_lock_covers_prefix",
    "inv_borrowed_under_lock",
    "inv_content",
    "inv_end_caches",
    "chunk caches its prefix",
    "inv_waiting_blank",
    "rejected call leaves state unchanged",
    *SHARED_RULES,
)


def build_manager(page_size: int = 1, mamba: bool = False) -> MemoryManager:
    """A tiny reference memory manager (48 KV tokens, 4 rows of 24, 6 Mamba slots with 1 track buffer each)."""
    return _build_reference(SystemConfig(page_size=page_size, mamba=mamba))


def _fail(law: str, detail: str) -> AssertionError:
    return AssertionError(f"{law}: {detail}")


def owners_differ(snap: SystemSnapshot) -> tuple[dict[str, set[int]], list[str]]:
    """Per pool, the slots held beyond what their holder references (leaked), and one line per owner that differs."""
    leaked: dict[str, set[int]] = {}
    lines: list[str] = []
    for name, lg in snap.ledgers.items():
        refs = snap.references.get(name, {})
        for o in dict.fromkeys([*lg.held, *refs]):
            held, want = set(L.held_by(lg, o)), set(refs.get(o, frozenset()))
            if held != want:
                if held - want:
                    leaked.setdefault(name, set()).update(held - want)
                lines.append(
                    f"pool {name!r}: {o} holds {sorted(held)} but references {sorted(want)} "
                    f"(differ at {sorted(held ^ want)[:4]})"
                )
    return leaked, lines


def rows_unheld(snap: SystemSnapshot) -> list[str]:
    """``spec.ledger.inv_rows_held``'s counterexamples in the snapshot's request table, one line each."""
    kv = snap.ledgers.get("kv")
    if kv is None:
        return []
    rows = {row: (view.holder, cast("tuple[SlotId, ...]", view.slots)) for row, view in snap.rows.items()}
    out = []
    for f in L.row_faults(kv, rows, snap.page_size):
        what = "outside the pool" if f.outside else "named twice" if f.again else f"held by {f.holder or 'free'}"
        out.append(f"row {f.row} ({f.owner}) position {f.position} names slot {f.slot}, {what}")
    return out


def still_holds(ledgers: Mapping[str, L.Ledger], owner: Owner) -> str:
    """What ``owner`` still holds, pool by pool, for a law's message (``kv [1, 2], req_to_token [4]``)."""
    return ", ".join(f"{name} {sorted(xs)}" for name, xs in L.holdings(ledgers, owner).items())


def borrowed_unlocked(snap: SystemSnapshot) -> str | None:
    """``spec.locks.inv_borrowed_under_lock`` over the rows of running requests: the positions before a row's
    ``owned_from`` are borrowed from the cache, so the request's lock (with its session's, for a session's turn)
    must cover their tokens; the first row that breaks it, described, or ``None``."""
    assert snap.locks is not None
    handles = snap.locks.handles
    for row, view in snap.rows.items():
        r = snap.requests.get(view.holder.ident) if view.holder.kind is OwnerKind.REQUEST else None
        if r is None or r.status != "running" or view.owned_from <= 0 or len(r.tokens) < view.owned_from:
            continue
        cover: set[LockSite] = set(handles.get(HandleId(r.handle), ())) if r.handle is not None else set()
        s = snap.sessions.get(r.session) if r.session is not None else None
        if s is not None and s.handle is not None:
            cover |= handles.get(HandleId(s.handle), frozenset())
        borrowed = r.tokens[: view.owned_from]
        if not K.inv_borrowed_under_lock(frozenset(cover), borrowed, snap.page_size):
            return (
                f"running request {r.rid} reads positions [0, {view.owned_from}) of row {row} from the cache, but its "
                f"lock (handle {r.handle}) covers {K.locked_length(frozenset(cover))} tokens of that prefix's path"
            )
    return None


def check_snapshot(
    snap: SystemSnapshot,
    verdict: IdleVerdict | None,
    capabilities: frozenset[str],
    culprit: Callable[[str, int], str] | None = None,
) -> None:
    """Every law of one state, in the order that names the most specific broken one; raises ``law: detail``."""
    for name, lg in snap.ledgers.items():
        if not L.inv_slots_conserved(lg):
            raise _fail("inv_slots_conserved", f"pool {name!r}")
        if not L.inv_single_owner(lg):
            raise _fail("inv_single_owner", f"pool {name!r}")
    if snap.shared is not None and (broken := check_shared_laws(snap.shared)):
        raise _fail(*broken[0])
    leaked, differ = owners_differ(snap)
    ended = [r for r in snap.requests.values() if r.status in ("finished", "aborted")]
    for r in ended:  # NOTE: what an ended request still holds is leaked, named or not
        for name, xs in L.holdings(snap.ledgers, request(r.rid)).items():
            leaked.setdefault(name, set()).update(xs)
    if verdict is not None:
        itemized = "itemized_leaks" in capabilities and verdict.leaked is not None
        found = {p: set(s) for p, s in (verdict.leaked or {}).items() if s}
        if verdict.ok != (not leaked) or (itemized and found != leaked):
            raise _fail(
                "leak checker agrees with the ledgers",
                f"checker says ok={verdict.ok} leaked={found if itemized else '?'}; "
                f"ledgers say leaked={leaked}\n{verdict.message}",
            )
    if differ:
        where = (
            []
            if culprit is None
            else [f"slot {x}: given by {culprit(p, x)}" for p, xs in leaked.items() for x in sorted(xs)[:2]]
        )
        raise _fail("inv_owners_account", f"{differ[0]} {where or ''}".rstrip())
    if "rows" in capabilities and (unheld := rows_unheld(snap)):
        raise _fail("inv_rows_held", "; ".join(unheld[:3]))
    for r in ended:
        if not L.inv_released_on_end(snap.ledgers, request(r.rid)):
            raise _fail(
                "inv_released_on_end",
                f"request {r.rid} has {r.status} and still holds {still_holds(snap.ledgers, request(r.rid))}",
            )
    if "sessions" in capabilities:
        live = {r.rid: r.session for r in snap.requests.values() if r.status in ("waiting", "running")}
        for s in snap.sessions.values():
            if not S.inv_lent_to_a_live_turn(s.sid, s.lent_to, live):
                lender = snap.requests.get(s.lent_to) if s.lent_to is not None else None
                what = "no request" if lender is None else f"{lender.status}, of session {lender.session}"
                raise _fail("inv_lent_to_a_live_turn", f"session {s.sid} is lent to request {s.lent_to} ({what})")
            if s.lent_to is None and not S.inv_committed_within_allocated(
                S.SessionSlot(s.sid, s.row, s.slots, s.committed_len)
            ):
                raise _fail(
                    "inv_committed_within_allocated",
                    f"session {s.sid} records {s.committed_len} committed tokens but holds {s.alloc_len} positions",
                )
    if "locks" in capabilities and snap.locks is not None:
        if not K.inv_lock_ref_nonnegative(snap.locks):
            raise _fail("inv_lock_ref_nonnegative", "a lock_ref went negative")
        if not K.inv_lock_ref_counts_handles(snap.locks):
            raise _fail("inv_lock_ref_counts_handles", "lock_ref differs from the live handles covering it")
        owned = {r.handle for r in snap.requests.values() if r.handle is not None and r.status == "running"}
        kept = {v.handle for v in snap.sessions.values() if v.handle is not None}
        if set(snap.locks.handles) != owned | kept:
            raise _fail(
                "inv_handles_owned",
                f"live handles {sorted(snap.locks.handles)}, held by running requests {sorted(owned)} and open "
                f"sessions {sorted(kept)}",
            )
        if "prefix_locked" in capabilities:
            for r in snap.requests.values():
                if r.status != "running":
                    continue
                cover = snap.locks.handles.get(HandleId(r.handle)) if r.handle is not None else None
                if cover is None and r.session is not None:
                    continue  # NOTE: a resumed turn runs on its session's own KV, which no tree lock covers
                # NOTE: no live handle at all locks nothing: a prefix matched from the tree and left unlocked
                if not K.inv_lock_covers_prefix(cover or frozenset(), r.prefix_len):
                    held = f"its lock (handle {r.handle})" if cover is not None else "it holds no live lock, which"
                    raise _fail(
                        "inv_lock_covers_prefix",
                        f"running request {r.rid} runs on a prefix of {r.prefix_len} tokens, {held} covers "
                        f"{K.locked_length(cover or frozenset())}",
                    )
        if "rows" in capabilities and (unlocked := borrowed_unlocked(snap)):
            raise _fail("inv_borrowed_under_lock", unlocked)
    if "prefill_on_admit" in capabilities:
        for r in snap.requests.values():
            if r.status == "waiting" and not A.inv_waiting_blank(r.kv_len, r.prefix_len):
                raise _fail(
                    "inv_waiting_blank",
                    f"waiting request {r.rid} keeps kv_len {r.kv_len} and prefix_len {r.prefix_len} "
                    "(a refused attempt or a retraction left them)",
                )
    if "content" in capabilities and "rows" in capabilities:
        for r in snap.requests.values():
            if r.status != "running" or r.row is None or not r.kv_len or r.row not in snap.rows:
                continue
            slots = snap.rows[r.row].slots[: r.kv_len]
            got = [snap.content.get(s) for s in slots]
            expect = [fingerprint(t, i) for i, t in enumerate(r.tokens[: r.kv_len])]
            if got != expect:
                bad = next(i for i, (g, w) in enumerate(zip(got, expect, strict=False)) if g != w)
                raise _fail(
                    "inv_content",
                    f"request {r.rid} position {bad} slot {slots[bad]} holds another token's KV (freed while in use?)",
                )


def end_cache_finding(
    before: SystemSnapshot,
    after: SystemSnapshot,
    rid: int,
    content: bool,
    chunk: bool = False,
    in_place: bool = True,
    reach: int | None = None,
) -> str:
    """``inv_end_caches`` for request ``rid``, which ended between ``before`` (running) and ``after`` (a finish, not
    a save into its session): the tree's nodes hold its computed whole pages and, when it held a Mamba state with
    its computed KV whole pages, a Mamba state (``spec.ledger.inv_end_caches``); with ``content`` (the adapter
    shows the KV its slots hold), the tree holds the KV of each of those positions and the Mamba state sits at a
    node that holds the last one (``spec.ledger.inv_end_caches_content``; ledger unit ``u`` of ``"kv"`` is token
    slots ``u * page_size`` to ``u * page_size + page_size - 1``). With ``chunk``, ``rid`` was chunked (it runs
    on): its computed whole pages, no state (a chunk caches KV only). Without ``in_place`` (an engine whose finish
    computes more tokens first: SGLang decodes until EOS) the state belongs past ``before``'s last computed position,
    where no snapshot shows the tokens: it must then sit on the request's path at or past that position and after
    no more than ``reach`` tokens (the most the finish can have computed: ``finish_reach``), which ``after.prefix``
    shows (``mamba_state``'s keys), and is not placed where no snapshot shows the cache's prefixes. What is wrong,
    or ""."""
    was = before.requests.get(rid)
    if was is None or was.session is not None:
        return ""
    m = before.ledgers.get("mamba")
    held_state = not chunk and m is not None and bool(L.held_by(m, request(was.rid)))
    said = f"request {was.rid} {'was chunked' if chunk else 'finished'} with {was.kv_len} tokens computed" + (
        " and a Mamba state" if held_state else ""
    )
    ps = after.page_size
    if not L.inv_end_caches(after.ledgers, ps, was.kv_len, held_state):
        tree = {name: L.tree_holds(lg) for name, lg in after.ledgers.items() if name in ("kv", "mamba")}
        return f"{said} (page {ps}), and the tree holds only {tree}"
    kv, states = after.ledgers.get("kv"), after.ledgers.get("mamba")
    if not content or kv is None:
        return ""
    node_kv = {
        o.ident: frozenset(after.content.get(u * ps + j) for u in units for j in range(ps))
        for o, units in kv.held.items()
        if o.kind is OwnerKind.NODE
    }
    held = states.held.items() if states is not None else ()
    node_states = frozenset(o.ident for o, s in held if o.kind is OwnerKind.NODE and s)
    whole = was.kv_len - was.kv_len % ps
    owed = [fingerprint(t, i) for i, t in enumerate(was.tokens[:whole])]
    state_at = owed[-1] if held_state and owed and whole == was.kv_len else None
    if state_at is not None and not in_place:
        state_at = None
        computed = tuple(was.tokens[:whole])
        cached = after.prefix.mamba_state if after.prefix is not None and after.prefix.mamba else None
        most = len(was.tokens) + 1 if reach is None else reach
        if cached is not None and not any(whole <= len(k) <= most and k[:whole] == computed for k in cached):
            return (
                f"{said} (page {ps}), and no Mamba state in the tree sits on its path at or past its last computed "
                f"position {whole - 1}, within the {most} tokens its finish can have computed (the cache keeps "
                f"states after {sorted(len(k) for k in cached)} tokens)"
            )
    if L.inv_end_caches_content(node_kv, node_states, owed, state_at):
        return ""
    missing = next((i for i, v in enumerate(owed) if all(v not in c for c in node_kv.values())), None)
    if missing is not None:
        return f"{said} (page {ps}), and no tree node holds the KV of its position {missing}"
    return (
        f"{said} (page {ps}), and no tree node that holds a Mamba state holds the KV of its last position "
        f"{whole - 1} (the states sit at nodes {sorted(node_states)}: other prefixes)"
    )


def finish_reach(was: RequestView, queued: int) -> int:
    """The most tokens request ``was`` (running) can have computed when a ``finish`` that computes more first ends
    it: the rest of its prompt (``queued``: the longest sequence a snapshot showed it with while it waited) and
    the tokens shown, then one sampled token (``finish`` makes the next token the engine samples its EOS)."""
    return max(was.kv_len, len(was.tokens), queued) + 1


def machine_for_system(make: Callable[[], SystemAdapter | MemoryManager]) -> type[RuleBasedStateMachine]:
    """A state machine class checking the engines ``make`` builds (a ``SystemAdapter``; a bare reference
    ``MemoryManager`` is wrapped in the reference adapter)."""

    def adapter() -> SystemAdapter:
        made = make()
        return ReferenceSystemAdapter(manager=made) if isinstance(made, MemoryManager) else made

    class SystemConformance(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.sys = adapter()
            self.caps = frozenset(self.sys.capabilities)
            self.last = self.sys.snapshot()
            self.prompts: dict[int, tuple[int, ...]] = {}
            self.queued: dict[int, int] = {}  # rid -> the longest sequence a snapshot showed it with while waiting
            self.failure_pending = False  # NOTE: one injected failure at a time: they must not pile up
            self.off: frozenset[str] = frozenset()  # swarm: the features this example switched off
            self.unspent = 0  # injected failures that may not have met an allocation yet
            self.lifecycle: dict[int, int] = {}  # rid -> lifecycle transitions it went through
            self.pressure = 0.0  # the most of the KV pool held at once (0..1)
            self.refusals = 0  # rejected admissions and refused extends

        def on(self, feature: str) -> bool:
            return feature not in self.off

        def teardown(self) -> None:
            """Guide the search (``hypothesis.target``) towards full pools, refusals and long request lives."""
            if currently_in_test_context():
                target(self.pressure, label="kv pool pressure")
                target(float(max(self.lifecycle.values(), default=0)), label="lifecycle depth")
                target(float(self.refusals), label="refusals")
            super().teardown()

        def _moved(self, rid: int) -> None:
            self.lifecycle[rid] = self.lifecycle.get(rid, 0) + 1

        def _spent(self, pending: bool, before: SystemSnapshot, after: SystemSnapshot, refused: bool, op: str) -> None:
            """An injected failure fails the next allocation (the ``inject_failure`` capability): a step begun with
            one pending that refused nothing must not leave a request holding KV slots that were free before it.
            An injection that never fires leaves every failure path of the machine unchecked."""
            b, a = before.ledgers.get("kv"), after.ledgers.get("kv")
            if not pending or refused or b is None or a is None:
                return
            for owner, slots in a.held.items():
                if owner.kind is OwnerKind.REQUEST and (new := sorted(slots & b.free)):
                    raise _fail(
                        "an injected failure fails the next allocation",
                        f"{op}: with a failure injected and pending, {owner} was given free KV slots {new[:8]} and "
                        "nothing was refused",
                    )

        def has(self, cap: str) -> bool:
            return cap in self.caps

        def some(self, *status: str) -> bool:
            """Some request the engine knows is in one of ``status``."""
            return any(r.status in status for r in self.last.requests.values())

        def ids(self, status: str) -> list[int]:
            return [r.rid for r in self.last.requests.values() if r.status == status]

        # ---------------------------------------------------------- rules

        @initialize(off=SWARM_OFF)
        def swarm(self, off: frozenset[str]) -> None:
            """Swarm testing: this example runs with the features ``off`` switched off."""
            self.off = frozenset(off)

        @rule(
            prompt=st.integers(0, len(PROMPTS) - 1),
            suffix=SUFFIXES,
            sid=sampled_from((None, *SESSIONS)),
            budget=BUDGETS,
        )
        def add_request(self, prompt: int, suffix: list[int], sid: int | None, budget: int) -> None:
            """A request arrives and the scheduler tries to admit it at once (it may be rejected and wait)."""
            self._add(PROMPTS[prompt] + tuple(suffix), sid, budget)

        @precondition(lambda self: len(self.ids("waiting")) < 8)  # NOTE: a queue a scheduler keeps short
        @rule(
            prompt=st.integers(0, len(PROMPTS) - 1),
            suffix=SUFFIXES,
            step=st.booleans(),
            budget=BUDGETS,
            edge=st.none() | st.integers(-1, 1),
        )
        def arrive(
            self, prompt: int, suffix: list[int], step: bool = False, budget: int = 64, edge: int | None = None
        ) -> None:
            """A request arrives while the scheduler is busy: it joins the queue (queues build up). With ``step``,
            the scheduler then runs one prefill step over its whole queue, in its own order: under ``budget``, or
            with ``edge`` under what the whole queue asks (whole prompts) give or take a token."""
            tokens = PROMPTS[prompt] + tuple(suffix)
            rid = self.sys.add_request(tokens, None)
            self.prompts[rid] = tokens
            if not step:
                return
            self.last = self.sys.snapshot()
            if edge is not None:
                budget = self._edge(self.ids("waiting"), edge)
            if not self.on("tight budgets"):
                budget = max(budget, 64)
            self._admit(rid, None, budget, batch=True)

        @precondition(lambda self: "long prompts" not in self.off)
        @rule(
            prompt=st.integers(0, len(PROMPTS) - 1),
            suffix=LONG_SUFFIXES,
            sid=sampled_from((None, *SESSIONS)),
            whole_row=st.booleans(),
        )
        def add_long_request(self, prompt: int, suffix: list[int], sid: int | None, whole_row: bool = False) -> None:
            """A long prompt arrives (most of a row): rows fill, speculative decoding meets the row's end. With
            ``whole_row``, the prompt is padded to exactly a row (``max_context`` tokens): the longest a request may
            be, at the edge an off-by-one length check refuses."""
            tokens = PROMPTS[prompt] + tuple(suffix)
            if whole_row:
                tokens = (tokens + (1,) * self.sys.config.max_context)[: self.sys.config.max_context]
            self._add(tokens, sid, 64)

        @precondition(lambda self: bool(self.prompts))
        @rule(
            pick=st.integers(0, 15),
            finish=st.booleans(),
            branch=st.none() | st.integers(0, 31),
            sid=sampled_from((None, *SESSIONS)),
        )
        def repeat_sequence(self, pick: int, finish: bool, branch: int | None = None, sid: int | None = None) -> None:
            """A request arrives with exactly the sequence of an earlier one (its prompt, or all it holds now:
            prompt and decoded tokens), as a retried or duplicated request does. With ``finish`` it ends at once,
            and a second copy arrives and ends too: that one caches a sequence the cache holds whole (every page,
            and the state at its end, a duplicate), a path of its own.

            With ``branch``, one token of the sequence, at a point inside it, is another: the request leaves a
            known sequence there (a match that stops inside a node, wherever it is). With ``sid`` it is that
            session's next turn, taken from the session's own turns: with ``branch``, a turn that leaves the
            tokens the session committed (a resume must stop where they differ)."""
            if sid is not None and (not self.has("sessions") or not self.on("sessions")):
                sid = None
            own = [v.tokens for v in self.last.requests.values() if v.tokens and v.session == sid and sid is not None]
            known = [v.tokens for v in self.last.requests.values() if v.tokens and v.session is None]
            seqs = own or list(dict.fromkeys([*known, *self.prompts.values()]))
            tokens = seqs[pick % len(seqs)][: self.sys.config.max_context]
            if branch is not None:
                at = branch % len(tokens)
                tokens = (*tokens[:at], tokens[at] % 4 + 1, *tokens[at + 1 :])  # NOTE: not ``tokens[at]`` there
            for _ in range(2 if finish and sid is None else 1):
                self._add(tokens, sid, 64)
                rid = max(self.prompts)
                if finish and rid in self.last.requests and self.last.requests[rid].status == "running":
                    self.end_or_chunk(self.ids("running").index(rid), "finish")
                    self.last = self.sys.snapshot()  # NOTE: the next copy's admission starts from the cache it left

        def _add(self, tokens: tuple[int, ...], sid: int | None, budget: int) -> None:
            if sid is not None and (not self.has("sessions") or not self.on("sessions")):
                sid = None
            if not self.on("tight budgets"):
                budget = max(budget, 64)
            if sid is not None and sid not in self.last.sessions:
                self.sys.open_session(sid)
            rid = self.sys.add_request(tokens, sid)
            self.prompts[rid] = tokens
            if sid is not None and self.has("session_tokens"):
                # NOTE: the turn as the engine queued it (a session may put its context before what the client sent,
                # as SGLang's does): ``resume reuses the session`` judges the turn the engine runs
                self.last = self.sys.snapshot()
                self._note_queued(self.last)
            self._admit(rid, sid, budget)

        def _note_queued(self, snap: SystemSnapshot) -> None:
            for r in snap.requests.values():
                if r.status == "waiting" and len(r.tokens) > self.queued.get(r.rid, 0):
                    self.queued[r.rid] = len(r.tokens)

        def _queued_len(self, rid: int) -> int:
            """The longest sequence request ``rid`` was shown with while it waited, or its prompt."""
            return max(self.queued.get(rid, 0), len(self.prompts.get(rid, ())))

        def _reach(self, was: RequestView) -> int:
            return finish_reach(was, self._queued_len(was.rid))

        @precondition(lambda self: self.some("waiting"))
        @rule(pick=st.integers(0, 7), budget=BUDGETS, batch=st.booleans(), edge=st.none() | st.integers(-1, 1))
        def admit(self, pick: int, budget: int, batch: bool = False, edge: int | None = None) -> None:
            """One prefill step: try one waiting request, or (``batch``) every waiting one in the engine's order.

            ``edge``: the budget is what the first requests of the queue ask in all (their whole prompts), give or
            take a token: the boundary where a budget miscounted by one admits one request more or less."""
            waiting = self.ids("waiting")
            if not waiting:
                return  # NOTE: a kept program replayed where nothing waits
            rid = waiting[pick % len(waiting)]
            if edge is not None:
                budget = self._edge(waiting[: 1 + pick % len(waiting)] if batch else [rid], edge)
            if not self.on("tight budgets"):
                budget = max(budget, 64)
            self._admit(rid, self.last.requests[rid].session, budget, batch)

        def _edge(self, queue: list[int], edge: int) -> int:
            """A budget at the edge of what a step can admit: the whole prompts of the first requests of ``queue``
            (as many as there are free request rows), give or take ``edge`` tokens."""
            rows = self.last.ledgers.get("req_to_token")
            first = queue[: max(1, len(rows.free))] if rows is not None else queue
            return max(1, edge + sum(len(self.last.requests[r].tokens) for r in first))

        def _admit(self, rid: int, sid: int | None, budget: int, batch: bool = False) -> None:
            """One admission step trying ``rid`` (its session ``sid``), checked as a transaction per request."""
            before = self.last  # NOTE: taken before ``rid`` was added when it is new: it held nothing then
            waiting = {r.rid for r in before.requests.values() if r.status == "waiting"} | {rid}
            busy = {s for s, v in before.sessions.items() if v.lent_to is not None}
            if sid in busy:
                return  # one turn of a session at a time
            turns = [sid] + [before.requests[r].session for r in waiting if r in before.requests and r != rid]
            named = [t for t in turns if t is not None]
            if busy & set(named) or len(named) != len(set(named)):
                batch = False  # NOTE: a batch would try a second turn of a session at once
            attempts = {r: A.begin(request(r), before.ledgers, self._handles(before, r)) for r in waiting}
            targeted = self.has("targeted_admission") and not batch
            result = self.sys.admit(budget, rid if targeted else None)
            pending, self.failure_pending = self.failure_pending, False
            after = self.last = self.sys.snapshot()
            self.refusals += len(result.rejected)
            self._spent(pending, before, after, bool(result.rejected), f"admission of {list(result.admitted)}")
            for r in result.admitted:
                self._moved(r)
            left = A.Budget(budget, len(waiting))
            for r in result.admitted:  # NOTE: in the order the engine admitted them
                known = before.requests.get(r)
                new = len(known.tokens if known is not None else self.prompts[r]) - after.requests[r].prefix_len
                if self.has("strict_budget") and not A.fits(left, new):
                    raise _fail("admission within budget", f"request {r} admitted with {new} new tokens, {left} left")
                left = A.take(left, new)
            if not pending:
                self._check_eviction(before, after, f"admission of {list(result.admitted)}")
            tried = result.tried or ((rid,) if targeted else ())
            if tried and self.has("work_conserving"):
                self._check_refusals(before, after, result, tried, budget)
            if any(self.last.requests[r].session is None for r in result.admitted):
                self.unspent = 0  # NOTE: it allocated its last token's KV: no injected failure is left
            for r in result.rejected:
                # NOTE: a reservation forms at a rejected attempt that found the request holding nothing
                forms = r in attempts and not any(attempts[r].before.values())
                if r in attempts and not A.inv_rollback_restores(attempts[r], after.ledgers, self._handles(after, r)):
                    if forms and self.has("reservations"):
                        continue  # NOTE: later attempts must keep the reservation as it is
                    leaked = A.leaked_by_rollback(attempts[r], after.ledgers)
                    raise _fail(
                        "admission rolls back",
                        f"rejected request {r} keeps {leaked} handles {set(self._handles(after, r))}",
                    )
            for r in result.admitted:
                sid = after.requests[r].session
                lenders = (
                    (session(sid),)
                    if sid is not None and sid in after.sessions and after.sessions[sid].lent_to == r
                    else ()
                )
                if r in attempts and not A.inv_commit_keeps(attempts[r], after.ledgers, lenders):
                    raise _fail("admission commits", f"admitted request {r} lost slots it held")
                got = after.requests[r]
                prompt = before.requests[r].tokens if r in before.requests else self.prompts.get(r)
                if (
                    prompt is not None
                    and self.has("prefill_on_admit")
                    and got.status == "running"
                    and (got.kv_len != len(prompt) or tuple(got.tokens[: len(prompt)]) != prompt)
                ):
                    raise _fail(
                        "admission commits",
                        f"admitted request {r} holds the KV of {got.kv_len} tokens {got.tokens[:8]}, "
                        f"it was admitted with {len(prompt)} tokens {prompt[:8]}",
                    )
                states = after.ledgers.get("mamba")
                if (
                    states is not None
                    and self.has("prefill_on_admit")
                    and got.status == "running"
                    and not L.held_by(states, request(r))
                ):
                    raise _fail(
                        "admission commits",
                        f"admitted request {r} holds no Mamba state: a model with a Mamba pool runs each request on "
                        "its own recurrent state",
                    )
                if prompt is not None and self.has("prefill_on_admit") and got.prefix_len >= len(prompt):
                    raise _fail(
                        "admission commits",
                        f"admitted request {r} matched all {len(prompt)} tokens: the last one is always computed "
                        "(its logits sample the next token)",
                    )
                if got.session is None and prompt is not None:
                    self._check_reuse(before, after, r, got.prefix_len, prompt)
                slot = before.sessions.get(got.session) if got.session is not None else None
                if slot is not None and (slot.row is not None or slot.committed_len > 0):
                    # NOTE: a resumed session; a session's first turn may match the prefix cache like any request
                    committed = slot.committed_len
                    if got.prefix_len > committed:
                        raise _fail("resume is append-only", f"request {r} resumed {got.prefix_len} > {committed}")
                    if (
                        self.has("session_tokens")
                        and prompt  # NOTE: empty where the adapter cannot show a turn it has not sent yet
                        and not S.inv_resume_reuses(got.prefix_len, slot.tokens, prompt)
                    ):
                        raise _fail(
                            "resume reuses the session",
                            f"request {r} ({len(prompt)} tokens {list(prompt[:12])}) resumed session {got.session} "
                            f"on {got.prefix_len} tokens; the session committed {committed} tokens "
                            f"{list(slot.tokens[:12])}, {S.reusable_on_resume(slot.tokens, prompt)} of them its own "
                            "but the last repeat",
                        )

        def _check_reuse(
            self, before: SystemSnapshot, after: SystemSnapshot, rid: int, prefix_len: int, tokens: tuple[int, ...]
        ) -> None:
            """``admission reuses the cache`` (``spec.admission.inv_reuses_cache``): request ``rid``, admitted outside
            a session with ``tokens``, runs on the longest prefix the cache offered it through the step."""
            if not self.has("prefix_cache") or before.prefix is None or after.prefix is None:
                return
            if not A.inv_reuses_cache(prefix_len, tokens, before.prefix, after.prefix):
                low, high = A.reuse_bounds(before.prefix, after.prefix, tokens)
                raise _fail(
                    "admission reuses the cache",
                    f"request {rid} ({len(tokens)} tokens {list(tokens[:12])}) was admitted on a prefix of "
                    f"{prefix_len} tokens; the cache offered it {low} (kept through the step) to {high} (held "
                    f"before it) of its tokens but the last (page {before.prefix.page_size})",
                )

        def _check_refusals(
            self, before: SystemSnapshot, after: SystemSnapshot, result: StepResult, tried: tuple[int, ...], budget: int
        ) -> None:
            """``admission admits what fits`` (``spec.admission.inv_batch_work_conserving``): walking the requests in
            the order the step tried them, a refused one had a reason given what earlier admissions left."""
            ps = max(1, before.page_size)
            steps = []
            for r in tried:
                known = before.requests.get(r)
                tokens = len(known.tokens if known is not None else self.prompts[r])
                need = {"req_to_token": 1, "kv": -(-tokens // ps)}
                if "mamba" in before.ledgers:
                    need["mamba"] = 1 + self.sys.config.ping_pong
                admitted = r in result.admitted
                new = tokens - after.requests[r].prefix_len if admitted and r in after.requests else 0
                session = known.session if known is not None else after.requests[r].session
                steps.append(A.Tried(r, admitted, tokens, new, need, judged=session is None))
            free = {name: len(lg.free) for name, lg in before.ledgers.items()}
            refused = A.unreasoned_refusals(A.Budget(budget, len(tried)), steps, free, self.has("reservations"))
            excused = min(len(refused), self.unspent)  # NOTE: each injected failure may refuse one that fit
            self.unspent -= excused
            if len(refused) > excused:
                rid = refused[excused]
                t = next(s for s in steps if s.rid == rid)
                raise _fail(
                    "admission admits what fits",
                    f"request {rid} ({t.tokens} tokens) refused under a budget of {budget} tokens, tried in the order "
                    f"{list(tried)} (admitted {list(result.admitted)}), with free {free} when the step began (it "
                    f"needs at most {dict(t.need)})",
                )

        @staticmethod
        def _handles(snap: SystemSnapshot, rid: int) -> frozenset[HandleId]:
            view = snap.requests.get(rid)
            return frozenset() if view is None or view.handle is None else frozenset({HandleId(view.handle)})

        def _running(self, pick: int) -> int | None:
            running = self.ids("running")
            return running[pick % len(running)] if running else None

        @precondition(lambda self: self.some("running"))
        @rule(pick=st.integers(0, 7), n=st.integers(1, 3), ahead=st.integers(0, 3))
        def extend(self, pick: int, n: int, ahead: int) -> None:
            """One decode step of ``n`` tokens, keeping ``ahead`` speculative slots past them."""
            self._extend(pick, n, ahead)

        @precondition(lambda self: "speculative" not in self.off and self.some("running"))
        @rule(pick=st.integers(0, 7), n=st.integers(1, 8), ahead=st.integers(4, 12))
        def extend_far_ahead(self, pick: int, n: int, ahead: int) -> None:
            """A long speculative step: the over-allocation reaches (or passes) the end of the request's row."""
            self._extend(pick, n, ahead)

        def _extend(self, pick: int, n: int, ahead: int) -> None:
            rid = self._running(pick)
            if rid is None:
                return
            before, pending = self.last, self.failure_pending
            ahead = ahead if self.has("speculative") and self.on("speculative") else 0
            try:
                self.sys.extend(rid, n, ahead)
            except KVLedgerError as err:  # pool exhausted, injected failure, context full: nothing may change
                self.refusals += 1
                after = self.sys.snapshot()
                if after.ledgers != before.ledgers or after.requests.get(rid) != before.requests.get(rid):
                    raise _fail("rejected call leaves state unchanged", f"extend of request {rid}: {err}") from err
                return
            finally:
                self.failure_pending = False
            self._moved(rid)
            snap = self.sys.snapshot()
            self._spent(pending, before, snap, False, f"extend of request {rid} by {n}")
            was, now = before.requests[rid], snap.requests.get(rid)
            if (
                now is not None
                and now.status == "running"
                and (now.kv_len != was.kv_len + n or now.tokens[: was.kv_len] != was.tokens[: was.kv_len])
            ):
                raise _fail(
                    "extend commits",
                    f"request {rid} extended by {n} from {was.kv_len} tokens holds the KV of {now.kv_len} "
                    "(or its earlier tokens changed)",
                )
            if now is not None and now.status == "running" and self.has("speculative") and self.has("rows"):
                self._check_growth(before, snap, rid, ahead)
            if not pending:
                self._check_eviction(before, snap, f"extend of request {rid} by {n} ({ahead} ahead)")

        def _check_eviction(self, before: SystemSnapshot, after: SystemSnapshot, op: str) -> None:
            """``alloc evicts no more than it is short`` (``spec.ledger.inv_evicts_only_short``) over a step that only
            allocates and evicts (an admission or a decode with no failure injected), on the KV pool of a model
            without Mamba states (a Mamba state's eviction takes its leaf's KV along)."""
            b, a = before.ledgers.get("kv"), after.ledgers.get("kv")
            if not self.has("exact_eviction") or b is None or a is None or "mamba" in after.ledgers:
                return
            free, taken, freed, lost = L.step_eviction(b, a)
            if not L.inv_evicts_only_short(free, taken, freed, lost):
                raise _fail(
                    "alloc evicts no more than it is short",
                    f"{op}: {taken} KV units taken with {free} free, and the tree gave up {freed} (nodes lost "
                    f"{sorted(lost, reverse=True)[:6]}): {max(0, taken - free)} were short",
                )

        def _check_growth(self, before: SystemSnapshot, after: SystemSnapshot, rid: int, ahead: int) -> None:
            """``extend takes what it asked`` (``spec.ledger.inv_row_grows_as_asked``): request ``rid``'s row holds
            positions for its computed tokens and the ``ahead`` asked for, in whole pages, and no more than that or
            than it held before."""
            was, now = before.requests[rid], after.requests[rid]
            if was.row is None or now.row != was.row or was.row not in before.rows or now.row not in after.rows:
                return
            held, had = len(after.rows[now.row].slots), len(before.rows[was.row].slots)
            if not L.inv_row_grows_as_asked(had, held, now.kv_len, ahead, after.page_size):
                raise _fail(
                    "extend takes what it asked",
                    f"request {rid} decoded to {now.kv_len} tokens with {ahead} more asked ahead (page "
                    f"{after.page_size}): its row holds {held} positions, it held {had} before",
                )

        def end_or_chunk(self, pick: int, op: str) -> None:
            """``op`` (finish, chunk, retract or abort) on the ``pick``-th running request (kept programs call it).

            An engine that chunks prompts only (``chunk_prompts_only``) is asked to chunk the ``pick``-th request
            still short of what it was queued with, where there is one (the others it refuses)."""
            rid = self._running(pick)
            if op == "chunk" and self.has("chunk_prompts_only"):
                short = [r for r in self.ids("running") if self.last.requests[r].kv_len < self._queued_len(r)]
                rid = short[pick % len(short)] if short else rid
            if rid is None or (op != "finish" and not self.has(op)):
                return
            # NOTE: a snapshot, not ``self.last``: a kept program or ``repeat_sequence`` makes several moves in one
            # step, and the law needs the request as it was just before this finish
            cached = (op == "finish" and self.has("caches_on_finish")) or (
                op == "chunk" and self.has("caches_on_chunk")
            )
            saved = op == "finish" and self.has("session_tokens")
            refusable = op == "chunk" and self.has("chunk_prompts_only")
            before = self.sys.snapshot() if cached or saved or refusable else None
            try:
                getattr(self.sys, op)(rid)
            except KVLedgerError as err:
                # NOTE: an engine that chunks prompts only may refuse a request whose prompt is prefilled (its
                # computed tokens reach every token it was queued with), and nothing may change; a request still
                # short of its prompt could be chunked: refusing it is a finding, as without the licence
                was = before.requests.get(rid) if before is not None else None
                if not refusable or before is None or was is None or was.kv_len < self._queued_len(rid):
                    raise
                now = self.sys.snapshot()
                if now != before:
                    raise _fail("rejected call leaves state unchanged", f"chunk of request {rid}: {err}") from err
                return
            self._moved(rid)
            if before is None:
                return
            after = self.sys.snapshot()
            if saved:
                self._saved_whole(before, after, rid)
            if cached:
                self._end_cached(before, after, rid, op == "chunk")

        def _saved_whole(self, before: SystemSnapshot, after: SystemSnapshot, rid: int) -> None:
            """``a turn commits what it computed`` (``spec.session.inv_turn_saved_whole``): request ``rid``, a
            session's turn that finished between ``before`` and ``after``, left its session committed to every token
            it computed; without ``finish_in_place`` (the finish computes more first, tokens no snapshot shows),
            committed to those and perhaps more (``spec.session.inv_turn_saved_past``)."""
            was = before.requests.get(rid)
            if was is None or was.session is None or was.status != "running":
                return
            slot = after.sessions.get(was.session)
            if slot is None or slot.lent_to is not None:
                return  # NOTE: closed while the turn ran (its close then releases everything), or not saved
            computed = was.tokens[: was.kv_len]
            in_place = self.has("finish_in_place")
            reach = self._reach(was)
            ok = (
                S.inv_turn_saved_whole(computed, slot.tokens)
                if in_place
                else S.inv_turn_saved_past(computed, slot.tokens, reach)
            )
            if not ok:
                more = "" if in_place else f" (and what its finish computed after them, at most {reach} in all)"
                raise _fail(
                    "a turn commits what it computed",
                    f"request {rid}, a turn of session {was.session}, finished with {was.kv_len} tokens computed "
                    f"{list(computed[:12])}{more}; the session committed {slot.committed_len} "
                    f"{list(slot.tokens[:12])}",
                )

        def _end_cached(self, before: SystemSnapshot, after: SystemSnapshot, rid: int, chunk: bool = False) -> None:
            """A finish (no session) between ``before`` and ``after`` leaves the request's computed whole pages
            cached, and a Mamba state with them when it held one (``spec.ledger.inv_end_caches``). A chunk
            (``chunk``) caches them too, and the request runs on them: its prefix is its computed whole pages (the law
            ``chunk caches its prefix``)."""
            was = before.requests.get(rid)
            found = end_cache_finding(
                before,
                after,
                rid,
                "content" in self.caps,
                chunk,
                in_place=self.has("finish_in_place"),
                reach=self._reach(was) if was is not None else None,
            )
            if found:
                raise _fail("chunk caches its prefix" if chunk else "inv_end_caches", found)
            now = after.requests.get(rid)
            if chunk and was is not None and was.session is None and now is not None and now.status == "running":
                whole = was.kv_len - was.kv_len % max(1, after.page_size)
                if now.prefix_len != max(whole, was.prefix_len):
                    raise _fail(
                        "chunk caches its prefix",
                        f"request {rid} was chunked with {was.kv_len} tokens computed on a prefix of "
                        f"{was.prefix_len} (page {after.page_size}) and runs on a prefix of {now.prefix_len}, not "
                        f"its {whole} computed tokens of whole pages",
                    )

        # NOTE: one rule per lifecycle move, so that swarm testing (Hypothesis' feature flags switch whole rules
        # off per example) gives some examples requests that are never finished, or never retracted.

        @precondition(lambda self: self.some("running"))
        @rule(pick=st.integers(0, 7))
        def finish(self, pick: int) -> None:
            """The request ends (EOS): its prefix is cached or saved to its session."""
            self.end_or_chunk(pick, "finish")

        @precondition(lambda self: self.has("chunk") and self.some("running"))
        @rule(pick=st.integers(0, 7))
        def chunk(self, pick: int) -> None:
            """Chunked prefill: the computed prefix is cached, the request runs on."""
            self.end_or_chunk(pick, "chunk")

        @precondition(lambda self: self.has("retract") and self.some("running"))
        @rule(pick=st.integers(0, 7))
        def retract(self, pick: int) -> None:
            """Preemption: the request hands everything back and waits again."""
            self.end_or_chunk(pick, "retract")

        @precondition(lambda self: self.has("abort") and self.some("running", "waiting"))
        @rule(pick=st.integers(0, 7))
        def abort(self, pick: int) -> None:
            """Abort at any stage: a request waiting (new, rejected or retracted) or running."""
            live = [r.rid for r in self.last.requests.values() if r.status in ("running", "waiting")]
            rid = live[pick % len(live)]
            self.sys.abort(rid)
            self._moved(rid)

        @precondition(lambda self: self.has("sessions"))
        @rule(sid=sampled_from(SESSIONS))
        def close_session(self, sid: int) -> None:
            slot = self.last.sessions.get(sid)
            if slot is None:
                return
            lent_to = slot.lent_to
            lender = self.last.requests.get(lent_to) if lent_to is not None else None
            if lent_to is not None and lender is not None and lender.status == "running":
                self._close_in_use(sid, lent_to)
                return
            if self.has("abort"):
                for r in self.ids("waiting"):
                    if self.last.requests[r].session == sid:
                        self.sys.abort(r)
            self.sys.close_session(sid)
            after = self.sys.snapshot()
            turning = [r.rid for r in after.requests.values() if r.session == sid and r.status == "running"]
            if not turning and not S.inv_released_on_close(after.ledgers, sid):
                raise _fail(
                    "inv_released_on_close",
                    f"session {sid} was closed with no turn running and still holds "
                    f"{still_holds(after.ledgers, session(sid))}",
                )

        def _close_in_use(self, sid: int, rid: int) -> None:
            """A close of session ``sid`` while its turn ``rid`` runs on the session's memory: refused, typed, with
            nothing changed, or accepted with the release deferred to the turn's end; either way nothing the
            session or the turn held is freed (``spec.session.inv_close_spares_the_turn``)."""
            before = self.sys.snapshot()
            try:
                self.sys.close_session(sid)
            except KVLedgerError as err:
                after = self.sys.snapshot()
                if after.ledgers != before.ledgers or after.requests != before.requests:
                    raise _fail(
                        "rejected call leaves state unchanged",
                        f"close of session {sid}, in use by running request {rid}, was refused ({err}) and changed "
                        "the state",
                    ) from err
                return
            after = self.sys.snapshot()
            if not S.inv_close_spares_the_turn(before.ledgers, after.ledgers, sid, request(rid)):
                lost = S.taken_from_the_turn(before.ledgers, after.ledgers, sid, request(rid))
                raise _fail(
                    "inv_close_spares_the_turn",
                    f"session {sid} was closed while request {rid} ran on its memory, and "
                    + ", ".join(f"{name} {sorted(xs)}" for name, xs in lost.items())
                    + " left the session and the turn",
                )

        @precondition(lambda self: self.has("evict"))
        @rule(comp=sampled_from([Component.FULL, Component.MAMBA]), n=st.integers(1, 8))
        def evict(self, comp: Component, n: int) -> None:
            self.sys.evict(comp, n)

        @precondition(lambda self: self.has("inject_failure") and not self.failure_pending)
        @rule()
        def inject_allocation_failure(self) -> None:
            """The next allocation fails; no second one until an admission or extend has met it."""
            self.sys.inject_failure()
            self.failure_pending = True
            self.unspent += 1

        # ---------------------------------------------------------- laws

        @invariant()
        def inv_all_laws(self) -> None:
            # NOTE: the engine's idle check first: an engine's check may run its loop's next (empty) iteration, which
            # ends what had ended; the laws then read the state the verdict is of, and the next step starts from it
            verdict = self.sys.idle_check() if self.has("idle_check") else None
            before, snap = self.last, self.sys.snapshot()
            self.last = snap
            self._note_queued(snap)
            kv = snap.ledgers.get("kv")
            if kv is not None and kv.capacity:
                self.pressure = max(self.pressure, 1 - len(kv.free) / kv.capacity)
            culprit = getattr(self.sys, "provenance", None)
            check_snapshot(snap, verdict, self.caps, culprit)
            if (
                before.shared is not None
                and snap.shared is not None
                and (broken := check_transition(before.shared, snap.shared))
            ):
                raise _fail(*broken[0])
            take_refused = getattr(self.sys, "take_refused", None)
            for rid, old, new in take_refused() if take_refused is not None else ():
                if refused := check_refused(rid, old, new):
                    raise _fail(*refused[0])

    SystemConformance.__name__ = "SystemConformance"
    SystemConformance.__qualname__ = "SystemConformance"
    return SystemConformance
