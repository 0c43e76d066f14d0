"""Replay of a *system* trace: the whole memory manager checked against the spec alone.

A system trace (:mod:`kvledger.contracts.trace.format`, header with ``pools``)
records each memory-manager ``call`` (add a request, admit it, extend,
finish, chunk, retract, abort, open or close a session, evict, run the leak
checker) followed by what the call changed: ``own`` events (slots that changed
owner, in every pool: KV, request-table rows, Mamba states) and ``row``
events (what the request table's rows now reference). It names no tree nodes
beyond their owner ids and no implementation detail: any engine that can log
"these slots changed owner" and "this row now points at these slots" can
write one.

:class:`SystemReplayer` keeps one ``spec.ledger.Ledger`` per pool and the
content of each row, applies every ``own`` event as the spec transition it
observes (``allocate``, ``free``, ``transfer`` with their typed errors), and
at the end of each call (the next ``call`` or the end of the trace) checks:

* ``inv_rows_held`` (``spec.ledger``) — every slot the live part of a row
  names lies in the KV pool and is held by the row's owner or by the cache:
  never free (a use after free), never another owner's; and no row event
  writes a row nobody holds. Checked on every row a call wrote, every row
  whose owner changed, and every row that names a KV unit that changed owner;
* ``inv_owners_account`` — a request that finished, was retracted or aborted,
  and a session that closed, hold nothing in any pool; and every KV page a
  request or session holds is referenced by a row it holds (a page held but
  referenced by nothing is leaked: its only reference was overwritten or
  dropped);
* ``admission rolls back`` / ``admission commits`` (``spec.admission``): a
  rejected request holds exactly what it held before the attempt, locks
  included; an admitted one lost nothing;
* ``resume is append-only`` (``spec.session``): once a session has saved a
  turn, its next turn resumes from no more than that turn committed (its
  first turn may match the prefix cache like any request);
* ``rejected call leaves state unchanged``: a call that raised changed nothing;
* ``leak checker agrees with the ledgers``: the implementation's leak checker
  reports exactly what the ledgers say leaked: nothing, since every leak fails
  the call that made it (so a checker that reports a leak is wrong).

A *shared* pool (header field ``shared``: blocks several holders hold at
once, counted by the engine, :mod:`kvledger.spec.shared`) is kept as each
block's holders (a multiset), the engine's count and whether the block is on
the free queue, advanced by ``join``/``leave``/``count``/``queue`` events. At
the end of each call, every block the call touched is checked by the spec's
shared laws, applied to that block (a one-block
:class:`~kvledger.spec.shared.SharedPool`; each law is a conjunction over
blocks): ``inv_refcount_nonnegative``, ``inv_refcount_counts_holders`` (the
count is the number of live holders), ``inv_free_iff_unheld`` (on the queue
iff no holder holds it), ``inv_sentinel_fixed`` and ``sentinel_count_fixed``
(a sentinel is never queued and its count never moves from the header's).
A request that ended and a closed session hold no block (``inv_owners_account``),
a rejected admission leaves its request's blocks as they were
(``admission rolls back``) and an admitted one lost none (``admission commits``).

A ``row`` event sets the row's live part: positions ``start..`` become
``slots`` and the row's live length becomes ``start + len(slots)`` (what lies
past it is stale and names nothing); a freed row has no live part.

Cost: each event costs what it names (the ledgers are
:class:`~kvledger.contracts.trace.pools.SparseLedger`, which store only held
slots, and an index from each KV unit to the rows naming it finds the rows an
ownership change affects); memory is bounded by the slots in use, the live
rows and the live requests: request ids are assumed increasing (as handle ids
in a cache trace), so an id at or below the highest added that is no longer
live has ended.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from kvledger.contracts.trace.format import (
    ENDS,
    HOLDER_RE,
    OWNER_RE,
    SYSTEM_OPS,
    Event,
    Header,
    TraceFormatError,
    first_repeat,
)
from kvledger.contracts.trace.pools import SparseLedger
from kvledger.spec import admission as A
from kvledger.spec import ledger as L
from kvledger.spec import shared as S
from kvledger.spec.shared import SharedPool
from kvledger.spec.types import Component, HandleId, Owner, OwnerKind, SlotId, node, request, session

ACCOUNT = "inv_owners_account"
ROWS = "inv_rows_held"
UNCHANGED = "rejected call leaves state unchanged"
LEAKS = "leak checker agrees with the ledgers"
ROLLBACK, COMMIT, APPEND = "admission rolls back", "admission commits", "resume is append-only"
SHARED_LAWS = (
    "inv_refcount_nonnegative",
    "inv_refcount_counts_holders",
    "inv_free_iff_unheld",
    "inv_sentinel_fixed",
    "sentinel_count_fixed",
)
"""The ``spec.shared`` laws a system replay checks on the blocks of shared pools."""
SYSTEM_LAWS = (
    "inv_single_owner",
    "inv_slots_conserved",
    ROWS,
    ACCOUNT,
    ROLLBACK,
    COMMIT,
    APPEND,
    UNCHANGED,
    LEAKS,
    *SHARED_LAWS,
)
"""What a system replay checks, each when the trace holds its data (the events it needs)."""
_NO_SHARED = "no block of a shared pool (header 'shared') moved in the trace"
SYSTEM_NEEDS = {
    ROWS: "no row event (request-table contents) in the trace",
    ROLLBACK: "no rejected admission in the trace",
    COMMIT: "no admitted request in the trace",
    APPEND: "no session turn admitted with its prefix_len in the trace",
    UNCHANGED: "no call in the trace raised an error",
    LEAKS: "no leak_check call in the trace",
    **dict.fromkeys(SHARED_LAWS[:4], _NO_SHARED),
    "sentinel_count_fixed": "no sentinel block (header 'shared') moved in the trace",
}
LEDGER_RULES = {
    "DoubleFree": "inv_single_owner",
    "OverAllocation": "inv_single_owner",
    "NotOwner": ACCOUNT,
    "OutOfRange": "inv_slots_conserved",
}
"""The rule a ledger transition's typed error breaks (shared with the cache replay)."""
_RULE_OF_ERROR = {**LEDGER_RULES, "InvalidArgument": "inv_single_owner"}  # a transfer to its own source


def parse_owner(text: str, line: int) -> Owner:
    """The owner a trace string names (``req:3``, ``session:1``, ``node:5/full``)."""
    m = OWNER_RE.fullmatch(text)
    if m is None:
        raise TraceFormatError(line, "an owner 'req:N', 'session:N' or 'node:N/component'", repr(text))
    if m.group(1) == "req":
        return request(int(m.group(2)))
    if m.group(1) == "session":
        return session(int(m.group(2)))
    return node(int(m.group(3)), Component(m.group(4)))


def parse_holder(text: str, line: int) -> Owner:
    """The holder a trace string names (an owner; a request or session may carry its group: ``req:3/swa``)."""
    m = HOLDER_RE.fullmatch(text)
    if m is None:
        raise TraceFormatError(
            line, "a holder 'req:N', 'req:N/component', 'session:N' or 'node:N/component'", repr(text)
        )
    if m.group(1) is not None:
        kind = OwnerKind.REQUEST if m.group(1) == "req" else OwnerKind.SESSION
        return Owner(kind, int(m.group(2)), Component(m.group(3)) if m.group(3) else None)
    return node(int(m.group(4)), Component(m.group(5)))


_GROUPS: tuple[Component | None, ...] = (None, *Component)
_K = TypeVar("_K")


def _drop(counter: Counter[_K], key: _K) -> None:
    """One ``key`` less in ``counter`` (which holds it), leaving no zero entry."""
    counter[key] -= 1
    if not counter[key]:
        del counter[key]


class SharedState:
    """One shared pool as a replay keeps it, sparsely: holders, counts and queue membership of the blocks that moved.

    A block absent from ``holders`` has none, absent from ``counts`` counts 0
    (a sentinel: its count in the header), and a non-sentinel block is on the
    free queue unless it is in ``off_queue`` (a sentinel never is). Memory is
    proportional to the blocks in use, not to the pool's size.
    """

    def __init__(self, name: str, base: int, capacity: int, sentinels: dict[int, int]) -> None:
        self.name, self.base, self.capacity = name, base, capacity
        self.sentinels = dict(sentinels)  # sentinel -> the count it started with (and must keep)
        self.holders: dict[int, Counter[Owner]] = {}
        self.by_holder: dict[Owner, Counter[int]] = {}
        self.counts: dict[int, int] = dict(sentinels)
        self.off_queue: set[int] = set()

    def in_range(self, block: int) -> bool:
        return self.base <= block < self.base + self.capacity

    def queued(self, block: int) -> bool:
        return block not in self.sentinels and block not in self.off_queue

    def holders_of(self, block: int) -> list[Owner]:
        """``block``'s holders, each once per time it holds the block, in a stable order."""
        return sorted(self.holders.get(block, Counter()).elements(), key=str)

    def holder_count(self, block: int) -> int:
        """How many times holders hold ``block`` (what its count must read)."""
        return sum(self.holders.get(block, Counter()).values())

    def join(self, holder: Owner, block: int) -> None:
        self.holders.setdefault(block, Counter())[holder] += 1
        self.by_holder.setdefault(holder, Counter())[block] += 1

    def leave(self, holder: Owner, block: int) -> bool:
        """``holder`` stops holding ``block`` once; ``False`` (nothing changed) when it did not hold it."""
        mine = self.by_holder.get(holder)
        if mine is None or not mine[block]:
            return False
        _drop(mine, block)
        _drop(self.holders[block], holder)
        if not mine:
            del self.by_holder[holder]
        if not self.holders[block]:
            del self.holders[block]
        return True

    def block(self, block: int) -> SharedPool:
        """The pool restricted to ``block``: a one-block :class:`SharedPool`, on which each ``spec.shared`` law is
        that block's part of the pool's law."""
        held = self.holders_of(block)
        sentinel = block in self.sentinels
        return SharedPool(
            self.name,
            1,
            {block: tuple(held)} if held else {},
            {block: self.counts.get(block, 0)},
            (block,) if self.queued(block) else (),
            frozenset({block}) if sentinel else frozenset(),
            base=block,
        )

    def at_start(self, block: int) -> SharedPool:
        """A sentinel ``block`` as the header states it (for ``sentinel_count_fixed``)."""
        return SharedPool(self.name, 1, counts={block: self.sentinels[block]}, sentinels=frozenset({block}), base=block)


class Violated(Exception):
    """A spec rule the trace breaks: the rule's name, what happened, and the subjects whose history explains it."""

    def __init__(self, rule: str, message: str, subjects: Iterable[str] = ()) -> None:
        super().__init__(message)
        self.rule, self.message, self.subjects = rule, message, list(subjects)


@dataclass
class _Call:
    ev: Event
    line: int
    before: dict[str, frozenset[int]]  # what the call's request held in each pool when it began
    owners: set[Owner] = field(default_factory=set)
    rows: dict[int, int] = field(default_factory=dict)  # rows to check at its end -> line that made them dirty
    shared_before: dict[str, Counter[tuple[str, int]]] = field(default_factory=dict)  # the request's blocks
    blocks: dict[tuple[str, int], int] = field(default_factory=dict)  # (pool, block) it touched -> line


class SystemReplayer:
    """The spec state of a system trace, advanced one event at a time by :meth:`apply`."""

    def __init__(self, header: Header, note: Callable[[str, int, str], None] | None = None) -> None:
        if header.pools is None:
            raise TraceFormatError(1, "a system trace header (with 'pools')")
        self._notes = note
        self.header = header
        self.page = header.config.page_size
        shared = header.shared or {}
        self.ledgers: dict[str, SparseLedger] = {
            name: SparseLedger(name, cap, base=base) for name, (base, cap) in header.pools.items() if name not in shared
        }
        self.shared: dict[str, SharedState] = {
            name: SharedState(name, *header.pools[name], sentinels) for name, sentinels in shared.items()
        }
        self.rows: dict[int, list[SlotId]] = {}  # held row -> its live part: the token slot of each position
        self.readers: dict[int, Counter[int]] = {}  # KV unit -> rows whose live part names it (how often)
        self.live: set[int] = set()  # requests added and not finished or aborted
        self.max_req = -1
        self.sessions: dict[int, int] = {}  # open session -> committed length of its last saved turn
        self.saved: set[int] = set()  # open sessions that have saved a turn (their next turn is a resume)
        self.call: _Call | None = None
        self.checked: Counter[str] = Counter()  # law -> how many times this replay checked it
        self.step = 0
        self.line = 1
        self.op = ""

    # ------------------------------------------------------------ helpers

    def _note(self, subject: str, text: str) -> None:
        if self._notes is not None:
            self._notes(subject, self.step, text)

    def _pool(self, name: str, line: int) -> SparseLedger:
        if name not in self.ledgers:
            if name in self.shared:
                raise TraceFormatError(
                    line,
                    f"a single-owner pool ({', '.join(self.ledgers) or 'none'}): pool {name!r} is shared, "
                    "its blocks move by join/leave events",
                    repr(name),
                )
            raise TraceFormatError(line, f"a pool of the header ({', '.join(self.ledgers)})", repr(name))
        return self.ledgers[name]

    def _shared_pool(self, name: str, line: int) -> SharedState:
        if name not in self.shared:
            raise TraceFormatError(
                line, f"a shared pool of the header's 'shared' ({', '.join(self.shared) or 'none'})", repr(name)
            )
        return self.shared[name]

    def _blocks(self, st: SharedState, blocks: list[int], line: int) -> None:
        bad = [b for b in blocks if not st.in_range(b)]
        if bad:
            raise TraceFormatError(
                line, f"blocks of pool {st.name!r} in [{st.base}, {st.base + st.capacity})", f"block {bad[0]}"
            )

    def _shared_held(self, kind: OwnerKind, ident: int) -> dict[str, Counter[tuple[str, int]]]:
        """What the owner ``kind:ident`` holds in each shared pool, in every group: ``(holder, block)`` counted."""
        out: dict[str, Counter[tuple[str, int]]] = {}
        for name, st in self.shared.items():
            got: Counter[tuple[str, int]] = Counter()
            for comp in _GROUPS:
                holder = Owner(kind, ident, comp)
                for b, n in st.by_holder.get(holder, Counter()).items():
                    got[str(holder), b] += n
            if got:
                out[name] = got
        return out

    def _slots(self, led: SparseLedger, slots: list[int], line: int) -> frozenset[int]:
        out = frozenset(slots)
        if len(out) != len(slots):
            raise TraceFormatError(line, "distinct slots", f"slot {first_repeat(slots)} twice")
        bad = [x for x in out if not led.in_range(x)]
        if bad:
            raise TraceFormatError(
                line, f"slots of pool {led.name!r} in [{led.base}, {led.base + led.capacity})", f"slot {min(bad)}"
            )
        return out

    def _held(self, owner: Owner) -> dict[str, frozenset[int]]:
        out = {}
        for name, led in self.ledgers.items():
            got = led.held_by(owner)
            if got:
                out[name] = got
        return out

    def referenced(self, owner: Owner) -> frozenset[int]:
        """KV units (pages when ``page_size > 1``) the live parts of the rows ``owner`` holds name."""
        rows = self.ledgers.get("req_to_token")
        if rows is None:
            return frozenset()
        out: set[int] = set()
        for r in rows.held.get(owner, ()):
            out.update(x // self.page for x in self.rows.get(r, ()))
        return frozenset(out)

    def _unreferenced(self, owner: Owner) -> frozenset[int]:
        kv = self.ledgers.get("kv")
        if kv is None or owner.kind is OwnerKind.NODE:
            return frozenset()
        return kv.held_by(owner) - self.referenced(owner)

    def ended(self, owner: Owner) -> bool:
        """A request that finished or aborted, or a session that is not open (closed)."""
        if owner.kind is OwnerKind.REQUEST:
            return owner.ident <= self.max_req and owner.ident not in self.live
        return owner.kind is OwnerKind.SESSION and owner.ident not in self.sessions

    def _handles(self, ev: Event, name: str) -> frozenset[HandleId]:
        return frozenset(HandleId(h) for h in ev.get(name, ()))

    def _set_row(self, row: int, start: int, slots: list[int]) -> None:
        """The live part of ``row`` becomes ``old[:start] + slots`` (``slots`` empty and ``start`` 0: no row)."""
        old = self.rows.get(row, [])
        for x in old[start:]:
            unit = x // self.page
            readers = self.readers[unit]
            readers[row] -= 1
            if not readers[row]:
                del readers[row]
                if not readers:
                    del self.readers[unit]
        new = old[:start] + [SlotId(x) for x in slots]
        for y in slots:
            self.readers.setdefault(y // self.page, Counter())[row] += 1
        if new:
            self.rows[row] = new
        else:
            self.rows.pop(row, None)

    # ------------------------------------------------------------ events

    def apply(self, line: int, ev: Event) -> None:
        """Apply one event; raises :class:`Violated` or :class:`TraceFormatError`."""
        self.step, self.line, self.op = ev["step"], line, ev["op"]
        if ev["op"] not in SYSTEM_OPS:
            raise TraceFormatError(line, f"an event of a system trace ({', '.join(SYSTEM_OPS)})", repr(ev["op"]))
        getattr(self, "_on_" + ev["op"])(line, ev)

    def finish(self) -> None:
        """The trace ended: check the last call."""
        self._end_call()

    def _on_call(self, line: int, ev: Event) -> None:
        self._end_call()
        name = ev["name"]
        req, sid = ev.get("req"), ev.get("session")
        if req is not None:
            if name == "add_request":
                if req <= self.max_req:
                    raise TraceFormatError(line, "a new request id (increasing) in add_request", f"request {req}")
                self.live.add(req)
                self.max_req = req
            elif req > self.max_req:
                raise TraceFormatError(line, "a request added earlier in the trace", f"request {req}")
        for ids in ev.get("ended", {}).values():
            for i in ids:
                if i > self.max_req:
                    raise TraceFormatError(line, "a request added earlier in the trace (ended)", f"request {i}")
        if sid is not None and name == "open_session":
            if sid in self.sessions:
                raise TraceFormatError(line, "open_session of a session not open", f"session {sid}")
            self.sessions[sid] = 0  # a session id may be used again after close
            self.saved.discard(sid)
        elif sid is not None and sid not in self.sessions:
            raise TraceFormatError(line, "a session opened earlier in the trace", f"session {sid}")
        for pool in ev.get("leaked", {}):
            if pool not in self.shared:
                self._pool(pool, line)
        before = {} if req is None else {p: led.held_by(request(req)) for p, led in self.ledgers.items()}
        self.call = _Call(ev, line, before)
        if req is not None and self.shared:
            self.call.shared_before = self._shared_held(OwnerKind.REQUEST, req)
        if req is not None:
            self.call.owners.add(request(req))
        if sid is not None:
            self.call.owners.add(session(sid))
        what = " ".join(f"{k}={ev[k]}" for k in ("req", "session", "admitted", "prefix_len", "error") if k in ev)
        for o in self.call.owners:
            self._note(str(o), f"{name} {what}".strip())

    def _current(self, line: int, op: str) -> _Call:
        if self.call is None:
            raise TraceFormatError(line, f"a call before the first {op} event")
        if "error" in self.call.ev:
            self.checked[UNCHANGED] += 1
            raise Violated(
                UNCHANGED,
                f"{self.call.ev['name']} raised {self.call.ev['error']!r} but changed state ({op} event)",
                [str(o) for o in self.call.owners],
            )
        return self.call

    def _on_own(self, line: int, ev: Event) -> None:
        call = self._current(line, "own")
        name = ev["pool"]
        led = self._pool(name, line)
        slots = self._slots(led, ev["slots"], line)
        src = None if ev["src"] is None else parse_owner(ev["src"], line)
        dst = None if ev["dst"] is None else parse_owner(ev["dst"], line)
        if src is None and dst is None:
            raise TraceFormatError(line, "an own event with a source or a destination owner", "both null")
        subjects = [*(str(o) for o in (src, dst) if o is not None), *(f"{name} slot {x}" for x in sorted(slots)[:4])]
        for o in (src, dst):
            if o is not None:
                call.owners.add(o)
        if dst is not None and self.ended(dst):
            raise Violated(
                ACCOUNT, f"{call.ev['name']} gave {name} slots {sorted(slots)} to {dst}, which ended", subjects
            )
        self.checked["inv_single_owner"] += 1
        self.checked["inv_slots_conserved"] += 1
        err = led.apply(src, dst, slots)
        if err is not None:
            rule = _RULE_OF_ERROR.get(type(err).__name__, ACCOUNT)
            raise Violated(rule, f"{call.ev['name']}: the spec forbids it: {type(err).__name__}: {err}", subjects)
        if name == "req_to_token":
            for r in slots:
                call.rows[r] = line
                if dst is None:
                    self._set_row(r, 0, [])  # a freed row names nothing
        elif name == "kv":
            for x in slots:
                for r in self.readers.get(x, ()):
                    call.rows.setdefault(r, line)
        for x in sorted(slots):
            self._note(f"{name} slot {x}", f"{call.ev['name']}: {src or 'free'} -> {dst or 'free'}")

    def _on_row(self, line: int, ev: Event) -> None:
        call = self._current(line, "row")
        rows = self._pool("req_to_token", line)
        row, start, slots = ev["row"], ev["start"], ev["slots"]
        self._slots(rows, [row], line)
        live = len(self.rows.get(row, ()))
        if start > live:
            raise TraceFormatError(line, f"a row start within the row's live part (<= {live})", str(start))
        holder = rows.owner_of(row)
        self.checked[ROWS] += 1
        if holder is None:
            raise Violated(
                ROWS,
                f"{call.ev['name']} wrote row {row}, which nobody holds",
                [f"row {row}", f"req_to_token slot {row}"],
            )
        self._set_row(row, start, slots)
        call.owners.add(holder)
        call.rows[row] = line
        self._note(f"row {row}", f"{call.ev['name']}: positions {start}.. = {slots[:8]} (live {start + len(slots)})")

    def _shared_event(self, line: int, ev: Event) -> tuple[_Call, SharedState]:
        call = self._current(line, ev["op"])
        return call, self._shared_pool(ev["pool"], line)

    def _touch(self, call: _Call, st: SharedState, block: int, line: int, text: str) -> None:
        call.blocks.setdefault((st.name, block), line)
        self._note(f"{st.name} block {block}", f"{call.ev['name']}: {text}")

    def _on_join(self, line: int, ev: Event) -> None:
        call, st = self._shared_event(line, ev)
        holder = parse_holder(ev["holder"], line)
        self._blocks(st, ev["blocks"], line)
        call.owners.add(holder)
        if self.ended(holder):
            blocks = sorted(set(ev["blocks"]))
            raise Violated(
                ACCOUNT,
                f"{call.ev['name']} gave {st.name} blocks {blocks} to {holder}, which ended",
                [str(holder), *(f"{st.name} block {b}" for b in blocks[:4])],
            )
        for b in ev["blocks"]:
            st.join(holder, b)
            self._touch(call, st, b, line, f"{holder} joins ({st.holder_count(b)} holders)")

    def _on_leave(self, line: int, ev: Event) -> None:
        call, st = self._shared_event(line, ev)
        holder = parse_holder(ev["holder"], line)
        self._blocks(st, ev["blocks"], line)
        call.owners.add(holder)
        for b in ev["blocks"]:
            self.checked[ACCOUNT] += 1
            if not st.leave(holder, b):
                raise Violated(
                    ACCOUNT,
                    f"{call.ev['name']}: {holder} left {st.name} block {b}, which it does not hold "
                    f"(its holders: {[str(o) for o in st.holders_of(b)]})",
                    [f"{st.name} block {b}", str(holder)],
                )
            self._touch(call, st, b, line, f"{holder} leaves ({st.holder_count(b)} holders)")

    def _on_count(self, line: int, ev: Event) -> None:
        call, st = self._shared_event(line, ev)
        self._blocks(st, [b for b, _ in ev["counts"]], line)
        for b, c in ev["counts"]:
            old = st.counts.get(b, 0)
            st.counts[b] = c
            self._touch(call, st, b, line, f"the engine's count {old} -> {c}")

    def _on_queue(self, line: int, ev: Event) -> None:
        call, st = self._shared_event(line, ev)
        self._blocks(st, [*ev["joined"], *ev["left"]], line)
        for b in ev["left"]:
            if not st.queued(b):
                self.checked["inv_free_iff_unheld"] += 1
                raise Violated(
                    "inv_free_iff_unheld",
                    f"{call.ev['name']}: {st.name} block {b} came off the free queue, but it was not on it "
                    + ("(a sentinel is never queued)" if b in st.sentinels else "(it was taken out already)"),
                    [f"{st.name} block {b}"],
                )
            st.off_queue.add(b)
            self._touch(call, st, b, line, "off the free queue")
        for b in ev["joined"]:
            if st.queued(b):
                self.checked["inv_free_iff_unheld"] += 1
                raise Violated(
                    "inv_free_iff_unheld",
                    f"{call.ev['name']}: {st.name} block {b} went onto the free queue, which holds it already "
                    "(a block queued twice is handed out twice)",
                    [f"{st.name} block {b}"],
                )
            if b in st.sentinels:
                self.checked["inv_sentinel_fixed"] += 1
                raise Violated(
                    "inv_sentinel_fixed",
                    f"{call.ev['name']}: sentinel {st.name} block {b} went onto the free queue",
                    [f"{st.name} block {b}"],
                )
            st.off_queue.discard(b)
            self._touch(call, st, b, line, "onto the free queue")

    def _check_blocks(self, call: _Call) -> None:
        """The ``spec.shared`` laws on every block of a shared pool the call touched, each block as a one-block pool."""
        name = call.ev["name"]
        for (pool, b), line in sorted(call.blocks.items()):
            st = self.shared[pool]
            one = st.block(b)
            held = [str(o) for o in S.holders_of(one, b)]
            count = one.counts[b]
            subjects = [f"{pool} block {b}", *dict.fromkeys(held)]
            where = f"after {name}: {pool} block {b}"
            since = f" (last moved at line {line})"
            laws: list[tuple[str, bool, str]] = [
                (
                    "inv_refcount_nonnegative",
                    S.inv_refcount_nonnegative(one),
                    f"the engine counts {count} holders (a count below zero)",
                ),
                (
                    "inv_refcount_counts_holders",
                    S.inv_refcount_counts_holders(one),
                    f"the engine counts {count} holder(s), but {len(held)} hold it: {held}",
                ),
                (
                    "inv_free_iff_unheld",
                    S.inv_free_iff_unheld(one),
                    f"on the free queue while {held} hold it (it can be handed out again)"
                    if held
                    else "held by nobody, yet not on the free queue (lost: never allocated again)",
                ),
                ("inv_sentinel_fixed", S.inv_sentinel_fixed(one), "a sentinel, yet on the free queue"),
            ]
            if b in st.sentinels:
                start = st.at_start(b)
                laws.append(
                    (
                        "sentinel_count_fixed",
                        S.sentinel_count_fixed(start, one),
                        f"a sentinel, yet its count moved from {start.counts[b]} to {count}",
                    )
                )
            for law, ok, what in laws:
                self.checked[law] += 1
                if not ok:
                    raise Violated(law, f"{where}: {what}{since}", subjects)

    def _shared_account(self, owner: Owner, what: str) -> None:
        """``owner`` (in every group) holds no block of any shared pool."""
        for pool, got in self._shared_held(owner.kind, owner.ident).items():
            blocks = sorted({b for _, b in got})
            holders = sorted({h for h, _ in got})
            raise Violated(
                ACCOUNT,
                f"{what} still holds {', '.join(f'{pool} block {b}' for b in blocks[:8])} (as {', '.join(holders)}; "
                "nobody will return them: leaked)",
                [*holders, *(f"{pool} block {b}" for b in blocks[:4])],
            )

    # ------------------------------------------------------------ laws at the end of a call

    def _check_rows(self, call: _Call) -> None:
        """``spec.ledger.inv_rows_held`` on the rows the call wrote or whose owner or KV changed owner."""
        kv, rows = self.ledgers.get("kv"), self.ledgers.get("req_to_token")
        if kv is None or rows is None or not call.rows:
            return
        live: dict[int, tuple[Owner, Sequence[SlotId]]] = {}
        for r in sorted(call.rows):
            holder = rows.owner_of(r)
            if holder is not None and r in self.rows:
                live[r] = (holder, self.rows[r])
        self.checked[ROWS] += 1
        fault = next(L.row_faults(kv.view, live, self.page), None)
        if fault is not None:
            unit = fault.slot // self.page
            what = (
                "named at an earlier position too (two tokens' KV in one slot)"
                if fault.again
                else "outside the KV pool"
                if fault.outside
                else ("free (a use after free)" if fault.holder is None else f"held by {fault.holder}")
            )
            raise Violated(
                ROWS,
                f"after {call.ev['name']}: row {fault.row} (held by {fault.owner}) names KV slot {fault.slot} at "
                f"position {fault.position}, which is {what}; a row may name only KV its owner holds or borrows "
                f"from the cache (row last changed at line {call.rows[fault.row]})",
                [f"row {fault.row}", str(fault.owner), f"kv slot {unit}"],
            )

    def _end_call(self) -> None:
        call, self.call = self.call, None
        if call is None:
            return
        ev = call.ev
        name = ev["name"]
        self.step, self.line, self.op = ev["step"], call.line, "call " + name
        if "error" in ev:
            self.checked[UNCHANGED] += 1
        req = request(ev["req"]) if "req" in ev else None
        sid = ev.get("session")
        if name in ENDS and req is not None and "error" not in ev:
            # NOTE: ``ended`` names the requests the call ended, by how (an engine's step may pick others);
            # without it the call's own request ended
            for how, ids in ev.get("ended", {name: [ev["req"]]}).items():
                for i in ids:
                    self._must_hold_nothing(request(i), f"request {i} after {how}")
                    if how != "retract":
                        self.live.discard(i)
        if name == "close_session" and sid is not None and "error" not in ev:
            self._must_hold_nothing(session(sid), f"session {sid} after close_session")
            del self.sessions[sid]
        if name in ENDS and sid is not None and "committed_len" in ev and "error" not in ev:
            self.sessions[sid] = ev["committed_len"]
            # NOTE: as the machine reads a session: its next turn resumes if it committed tokens or keeps memory
            # (a session an end left with nothing starts over, and may match the prefix cache like any request)
            if ev["committed_len"] > 0 or any(led.held_by(session(sid)) for led in self.ledgers.values()):
                self.saved.add(sid)
            else:
                self.saved.discard(sid)
        if name == "admit" and req is not None and "admitted" in ev:
            self._admission(call, req, sid)
        self._check_blocks(call)
        self._check_rows(call)
        for o in sorted(call.owners, key=str):
            self.checked[ACCOUNT] += 1
            lost = self._unreferenced(o)
            if lost:
                raise Violated(
                    ACCOUNT,
                    f"after {name}: {o} holds KV {'pages' if self.page > 1 else 'slots'} {sorted(lost)[:8]} "
                    "that no row it holds references (the only reference was overwritten or dropped: leaked)",
                    [str(o), *(f"kv slot {x}" for x in sorted(lost)[:4])],
                )
        if name == "leak_check" and "ok" in ev:
            self._leak_check(ev)

    def _must_hold_nothing(self, owner: Owner, what: str) -> None:
        self.checked[ACCOUNT] += 1
        held = self._held(owner)
        if held:
            pools = ", ".join(f"{p} {sorted(s)[:8]}" for p, s in held.items())
            subjects = [str(owner), *(f"{p} slot {x}" for p, s in held.items() for x in sorted(s)[:3])]
            raise Violated(ACCOUNT, f"{what} still holds {pools} (nobody will return them: leaked)", subjects)
        self._shared_account(owner, what)

    def _admission(self, call: _Call, req: Owner, sid: int | None) -> None:
        ev = call.ev
        attempt = A.Attempt(req, call.before, self._handles(ev, "handles_before"))
        after = {name: led.view for name, led in self.ledgers.items()}
        handles = self._handles(ev, "handles_after")
        if not ev["admitted"]:
            self.checked[ROLLBACK] += 1
            if not A.inv_rollback_restores(attempt, after, handles):
                leaked = {p: sorted(s) for p, s in A.leaked_by_rollback(attempt, after).items()}
                lost = {
                    p: sorted(attempt.before.get(p, frozenset()) - led.held_by(req)) for p, led in self.ledgers.items()
                }
                lost = {p: s for p, s in lost.items() if s}
                raise Violated(
                    ROLLBACK,
                    f"request {req.ident} was rejected but keeps {leaked or 'no slot'}"
                    + (f", lost {lost}" if lost else "")
                    + f"; handles before {sorted(attempt.handles_before)}, after {sorted(handles)}",
                    [str(req), *(f"{p} slot {x}" for p, s in leaked.items() for x in s[:3])],
                )
            self._shared_rollback(call, req)
            return
        self.checked[COMMIT] += 1
        if not A.inv_commit_keeps(attempt, after):
            raise Violated(COMMIT, f"admitted request {req.ident} lost slots it held", [str(req)])
        dropped = self._shared_change(call, req)[1] if self.shared else []
        if dropped:
            raise Violated(
                COMMIT,
                f"admitted request {req.ident} lost shared blocks it held: "
                f"{[f'{h}: {p} block {x}' for h, p, x in dropped[:6]]}",
                [str(req), *(f"{p} block {x}" for _, p, x in dropped[:4])],
            )
        if sid is not None and "prefix_len" in ev and sid in self.saved:
            # NOTE: a session's first turn may match the prefix cache like any request (the machine's rule too)
            self.checked[APPEND] += 1
            if ev["prefix_len"] > self.sessions.get(sid, 0):
                raise Violated(
                    APPEND,
                    f"request {req.ident} resumed session {sid} at {ev['prefix_len']} tokens, "
                    f"beyond the {self.sessions.get(sid, 0)} its last turn committed",
                    [str(req), f"session:{sid}"],
                )

    def _shared_change(self, call: _Call, req: Owner) -> tuple[list[tuple[str, str, int]], list[tuple[str, str, int]]]:
        """``(holder, pool, block)`` the call's request came to hold, and those it stopped holding, in shared pools."""
        now = self._shared_held(req.kind, req.ident)
        gained: list[tuple[str, str, int]] = []
        lost: list[tuple[str, str, int]] = []
        for pool in sorted(set(now) | set(call.shared_before)):
            a, b = now.get(pool, Counter()), call.shared_before.get(pool, Counter())
            gained += [(h, pool, x) for h, x in sorted((a - b).elements())]
            lost += [(h, pool, x) for h, x in sorted((b - a).elements())]
        return gained, lost

    def _shared_rollback(self, call: _Call, req: Owner) -> None:
        if not self.shared:
            return
        gained, lost = self._shared_change(call, req)
        if gained or lost:
            show = [f"{h}: {p} block {x}" for h, p, x in gained[:6]]
            raise Violated(
                ROLLBACK,
                f"request {req.ident} was rejected but came to hold {show or 'nothing'}"
                + (f" and let go of {[f'{h}: {p} block {x}' for h, p, x in lost[:6]]}" if lost else ""),
                [str(req), *(f"{p} block {x}" for _, p, x in (gained + lost)[:4])],
            )

    def _leak_check(self, ev: Event) -> None:
        # NOTE: every leak fails the call that made it (ended owners, unreferenced KV), so at a
        # leak check the ledgers show none: the checker must say so, no more and no less.
        self.checked[LEAKS] += 1
        got = {p: sorted(s) for p, s in ev.get("leaked", {}).items() if s}
        if not ev["ok"] or got:
            raise Violated(
                LEAKS,
                f"the leak checker says ok={ev['ok']} leaked={got}; the ledgers say nothing leaked",
                [f"{p} slot {x}" for p, s in got.items() for x in s[:3]],
            )


def system_unchecked(header: Header | None = None) -> tuple[tuple[str, str], ...]:
    """What a system trace never shows: the cache's internal results, Mamba state references; with shared pools,
    the blocks' keys and the hash index, the free queue's order and links, the engine's other counters."""
    out = [
        ("cache results (match/insert/evict)", "a system trace names no cache result: record a cache trace"),
        ("Mamba state references", "a system trace records no reference to a Mamba state"),
    ]
    if header is not None and header.shared:
        out += [
            ("inv_index_names_carriers", "a system trace records no block keys or hash index"),
            ("inv_keys_match_content", "a system trace records no block keys or content"),
            ("inv_lru_detached, inv_lru_links_symmetric", "a system trace records free-queue membership, not links"),
            ("inv_counters_recount", "a system trace records each block's count, not the engine's other counters"),
        ]
    return tuple(out)


__all__ = [
    "SHARED_LAWS",
    "SYSTEM_LAWS",
    "SYSTEM_NEEDS",
    "SharedState",
    "SystemReplayer",
    "Violated",
    "parse_holder",
    "parse_owner",
    "system_unchecked",
]
