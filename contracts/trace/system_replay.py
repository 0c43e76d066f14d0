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
* ``resume is append-only`` (``spec.session``): a session's next turn resumes
  from no more than the previous turn committed;
* ``rejected call leaves state unchanged``: a call that raised changed nothing;
* ``leak checker agrees with the ledgers``: the implementation's leak checker
  reports exactly what the ledgers say leaked: nothing, since every leak fails
  the call that made it (so a checker that reports a leak is wrong).

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

from kvledger.contracts.trace.format import OWNER_RE, Event, Header, TraceFormatError, first_repeat
from kvledger.contracts.trace.pools import SparseLedger
from kvledger.spec import admission as A
from kvledger.spec import ledger as L
from kvledger.spec.types import Component, HandleId, Owner, OwnerKind, SlotId, node, request, session

ACCOUNT = "inv_owners_account"
ROWS = "inv_rows_held"
UNCHANGED = "rejected call leaves state unchanged"
LEAKS = "leak checker agrees with the ledgers"
ROLLBACK, COMMIT, APPEND = "admission rolls back", "admission commits", "resume is append-only"
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
)
"""What a system replay checks, each when the trace holds its data (the events it needs)."""
SYSTEM_NEEDS = {
    ROWS: "no row event (request-table contents) in the trace",
    ROLLBACK: "no rejected admission in the trace",
    COMMIT: "no admitted request in the trace",
    APPEND: "no session turn admitted with its prefix_len in the trace",
    UNCHANGED: "no call in the trace raised an error",
    LEAKS: "no leak_check call in the trace",
}
_ENDS = {"finish", "retract", "abort"}
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


class SystemReplayer:
    """The spec state of a system trace, advanced one event at a time by :meth:`apply`."""

    def __init__(self, header: Header, note: Callable[[str, int, str], None] | None = None) -> None:
        if header.pools is None:
            raise TraceFormatError(1, "a system trace header (with 'pools')")
        self._notes = note
        self.header = header
        self.page = header.config.page_size
        self.ledgers: dict[str, SparseLedger] = {
            name: SparseLedger(name, cap, base=base) for name, (base, cap) in header.pools.items()
        }
        self.rows: dict[int, list[SlotId]] = {}  # held row -> its live part: the token slot of each position
        self.readers: dict[int, Counter[int]] = {}  # KV unit -> rows whose live part names it (how often)
        self.live: set[int] = set()  # requests added and not finished or aborted
        self.max_req = -1
        self.sessions: dict[int, int] = {}  # open session -> committed length of its last saved turn
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
            raise TraceFormatError(line, f"a pool of the header ({', '.join(self.ledgers)})", repr(name))
        return self.ledgers[name]

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
        handler = getattr(self, "_on_" + ev["op"], None)
        if handler is None:
            raise TraceFormatError(line, "an event of a system trace (call, own, row)", repr(ev["op"]))
        handler(line, ev)

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
        if sid is not None and name == "open_session":
            if sid in self.sessions:
                raise TraceFormatError(line, "open_session of a session not open", f"session {sid}")
            self.sessions[sid] = 0  # a session id may be used again after close
        elif sid is not None and sid not in self.sessions:
            raise TraceFormatError(line, "a session opened earlier in the trace", f"session {sid}")
        for pool in ev.get("leaked", {}):
            self._pool(pool, line)
        before = {} if req is None else {p: led.held_by(request(req)) for p, led in self.ledgers.items()}
        self.call = _Call(ev, line, before)
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
        if name in _ENDS and req is not None and "error" not in ev:
            self._must_hold_nothing(req, f"request {ev['req']} after {name}")
            if name != "retract":
                self.live.discard(req.ident)
        if name == "close_session" and sid is not None and "error" not in ev:
            self._must_hold_nothing(session(sid), f"session {sid} after close_session")
            del self.sessions[sid]
        if name == "finish" and sid is not None and "committed_len" in ev:
            self.sessions[sid] = ev["committed_len"]
        if name == "admit" and req is not None and "admitted" in ev:
            self._admission(call, req, sid)
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
            return
        self.checked[COMMIT] += 1
        if not A.inv_commit_keeps(attempt, after):
            raise Violated(COMMIT, f"admitted request {req.ident} lost slots it held", [str(req)])
        if sid is not None and "prefix_len" in ev:
            self.checked[APPEND] += 1
            if ev["prefix_len"] > self.sessions.get(sid, 0):
                raise Violated(
                    APPEND,
                    f"request {req.ident} resumed session {sid} at {ev['prefix_len']} tokens, "
                    f"beyond the {self.sessions.get(sid, 0)} its last turn committed",
                    [str(req), f"session:{sid}"],
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


def system_unchecked() -> tuple[tuple[str, str], ...]:
    """What a system trace never shows: the cache's internal results, Mamba state references."""
    return (
        ("cache results (match/insert/evict)", "a system trace names no cache result: record a cache trace"),
        ("Mamba state references", "a system trace records no reference to a Mamba state"),
    )


__all__ = ["SYSTEM_LAWS", "SYSTEM_NEEDS", "SystemReplayer", "Violated", "parse_owner", "system_unchecked"]
