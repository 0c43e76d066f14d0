"""Streaming sessions: a request's row, KV and Mamba state kept between turns (bugs B3, B4).

Refines :mod:`kvledger.spec.session`. A session slot holds, between turns,
the row of the last request, the KV slots in ``row[0:alloc_len]`` (of which
``committed_len`` are final) and its Mamba state with track buffers, all
tagged ``Owner(SESSION, sid)``. Resuming hands them to the next request after
freeing the *tail* ``[start, alloc_len)`` with ``start = prefix_len`` rounded
up to a page; closing frees everything. While a turn runs the slot holds
nothing and claims nothing (``committed_len == 0``): what it lent now belongs
to the request, and returns only through ``save`` (the turn finished) or
``unresume`` (admission rolled back). A turn retracted or aborted takes the
lent memory with it, so the session then holds no committed KV and the next
turn computes its prompt from scratch (``spec.session.inv_committed_within_allocated``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvledger.impl.arguments import check_int
from kvledger.impl.mamba import MambaAlloc
from kvledger.impl.owners import MAX_IDENT
from kvledger.impl.requests import Request, Status
from kvledger.spec import session as S
from kvledger.spec.errors import IntegrityError, InvalidArgument
from kvledger.spec.types import Owner, session

if TYPE_CHECKING:
    from kvledger.impl.memory import MemoryManager


@dataclass
class SessionSlot:
    """What one open session holds (SGLang's ``SessionSlot``)."""

    sid: int
    row: int | None = None
    tokens: tuple[int, ...] = ()  # the committed tokens
    alloc_len: int = 0  # row positions whose slots the session holds (SGLang's kv_allocated_len)
    committed_len: int = 0  # SGLang's kv_committed_len
    mamba: MambaAlloc | None = None
    lent_to: int | None = None  # the request that resumed it and runs now
    lent_fresh: tuple[bool, bool] = (False, False)  # (row, mamba) allocated fresh at resume

    @property
    def owner(self) -> Owner:
        return session(self.sid)


def common_prefix(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class Sessions:
    """The open streaming sessions of one memory manager."""

    def __init__(self, mm: MemoryManager) -> None:
        self.mm = mm
        self.slots: dict[int, SessionSlot] = {}

    def open(self, sid: int) -> None:
        """Open session ``sid`` (an int id in ``[0, MAX_IDENT]``), holding nothing."""
        check_int("open_session", "session", "session id", sid, 0, MAX_IDENT + 1)
        if sid in self.slots:
            raise InvalidArgument("open_session", "session", (), f"session {sid} is already open")
        self.slots[sid] = SessionSlot(sid)

    def _slot(self, op: str, sid: int | None) -> SessionSlot:
        if type(sid) is not int or sid not in self.slots:
            if sid is not None:
                check_int(op, "session", "session id", sid, 0, MAX_IDENT + 1)
            raise InvalidArgument(op, "session", (), f"session {sid} is not open")
        return self.slots[sid]

    def _own_slot(self, op: str, slot: SessionSlot) -> None:
        if not isinstance(slot, SessionSlot) or self.slots.get(slot.sid) is not slot:
            raise InvalidArgument(op, "session", (), f"{slot!r:.60} is not one of this manager's open sessions")

    def save(self, req: Request) -> None:
        """The turn ended: the session takes the request's row, KV and Mamba state (``save_from_req``)."""
        mm, slot = self.mm, self._slot("save", self.mm.own("save", req).session)
        if slot.lent_to != req.rid or req.row is None:
            raise InvalidArgument("save", "session", (), f"session {slot.sid} is not lent to request {req.rid}")
        assert req.row is not None and slot.lent_to == req.rid
        mm.rows.transfer(req.row, req.owner, slot.owner)
        if req.alloc_len:
            mm.kv.transfer(mm.rows.table[req.row, : req.alloc_len].clone(), req.owner, slot.owner)
        if req.mamba is not None:
            mm.mamba.transfer(mm._tensor(req.mamba.slots()), req.owner, slot.owner)  # type: ignore[union-attr]
        slot.row, slot.tokens, slot.alloc_len = req.row, req.tokens[: req.kv_len], req.alloc_len
        slot.committed_len, slot.mamba, slot.lent_to = req.kv_len, req.mamba, None
        req.row, req.mamba, req.alloc_len = None, None, 0

    def resume(self, req: Request) -> None:
        """Hand the session's memory to ``req`` for its next turn (append-only; tail freed first)."""
        mm, slot = self.mm, self._slot("resume", self.mm.own("resume", req).session)
        if slot.lent_to is not None:
            raise InvalidArgument("resume", "session", (), f"session {slot.sid} is in use by request {slot.lent_to}")
        prefix = min(common_prefix(req.tokens[:-1], slot.tokens), slot.committed_len)
        start = min(mm.round_up(prefix), slot.alloc_len)
        # NOTE: everything that can fail is allocated before anything changes.
        fresh_row = mm.rows.alloc(req.owner) if slot.row is None else None
        fresh_state = None
        if mm.mamba is not None and slot.mamba is None:
            try:
                fresh_state = mm.alloc_mamba(req.owner)
            except Exception:
                if fresh_row is not None:
                    mm.rows.free(fresh_row, req.owner)
                raise
        if slot.row is not None:
            self.free_tail(slot, start)
            mm.rows.transfer(slot.row, slot.owner, req.owner)
            if start:
                mm.kv.transfer(mm.rows.table[slot.row, :start].clone(), slot.owner, req.owner)
        if slot.mamba is not None:
            mm.mamba.transfer(mm._tensor(slot.mamba.slots()), slot.owner, req.owner)  # type: ignore[union-attr]
        req.row = fresh_row if fresh_row is not None else slot.row
        req.mamba = fresh_state if fresh_state is not None else slot.mamba
        req.prefix_len, req.own_from, req.kv_len, req.alloc_len = prefix, 0, prefix, start
        slot.lent_to, slot.lent_fresh = req.rid, (fresh_row is not None, fresh_state is not None)
        slot.row, slot.mamba, slot.alloc_len = None, None, 0
        slot.tokens, slot.committed_len = (), 0  # NOTE: the prefix is the request's now; unresume gives it back

    def free_tail(self, slot: SessionSlot, start: int) -> None:
        """Free row positions ``[start, alloc_len)`` before the next turn writes over them (B4's fix)."""
        self._own_slot("free_tail", slot)
        check_int("free_tail", "session", "start", start)
        if slot.row is not None and slot.alloc_len > start:
            self.mm.kv.free(self.mm.rows.table[slot.row, start : slot.alloc_len].clone(), slot.owner)
        slot.alloc_len = min(slot.alloc_len, start)

    def unresume(self, req: Request) -> None:
        """Admission rolled back: give the session back what ``resume`` lent (fresh allocations are freed)."""
        mm, slot = self.mm, self._slot("unresume", self.mm.own("unresume", req).session)
        fresh_row, fresh_state = slot.lent_fresh
        if slot.lent_to != req.rid or req.row is None:
            raise InvalidArgument("unresume", "session", (), f"session {slot.sid} is not lent to request {req.rid}")
        if fresh_row:
            mm.rows.free(req.row, req.owner)
        else:
            mm.rows.transfer(req.row, req.owner, slot.owner)
            if req.alloc_len:
                mm.kv.transfer(mm.rows.table[req.row, : req.alloc_len].clone(), req.owner, slot.owner)
            slot.row, slot.alloc_len = req.row, req.alloc_len
        if req.mamba is not None:
            if fresh_state:
                mm.free_mamba(req.owner, req.mamba)
            else:
                mm.mamba.transfer(mm._tensor(req.mamba.slots()), req.owner, slot.owner)  # type: ignore[union-attr]
                slot.mamba = req.mamba
        slot.lent_to = None
        if slot.row is not None:  # NOTE: the committed prefix comes back with the row that holds its KV
            slot.tokens, slot.committed_len = req.tokens[: req.prefix_len], req.prefix_len
        req.row, req.mamba = None, None
        req.prefix_len = req.own_from = req.kv_len = req.alloc_len = 0

    def extend_resumed(self, req: Request) -> None:
        """Allocate and fill the new turn's KV after the resumed prefix."""
        mm = self.mm
        mm.own("extend_resumed", req)
        if req.row is None or req.session is None:
            raise InvalidArgument("extend_resumed", "session", (), f"request {req.rid} has not resumed a session")
        need = mm.round_up(len(req.tokens)) - req.alloc_len
        if need > 0:
            got = mm.alloc_kv(req.owner, need)
            mm.rows.write(req.row, req.alloc_len, got, req.owner)
            req.alloc_len += need
        mm.write_kv(req, req.prefix_len, len(req.tokens))
        req.kv_len = len(req.tokens)

    def spec_slot(self, slot: SessionSlot) -> S.SessionSlot:
        """The abstraction of ``slot``: what it holds in spec terms (``-1`` for a position without a row).

        A slot that is not one of this manager's open sessions raises ``InvalidArgument``."""
        self._own_slot("spec_slot", slot)
        row = slot.row
        kv = tuple(self.mm.rows.table[row, : slot.alloc_len].tolist()) if row is not None else (-1,) * slot.alloc_len
        mamba = frozenset(slot.mamba.slots()) if slot.mamba is not None else frozenset()
        return S.SessionSlot(slot.sid, row, kv, slot.committed_len, mamba)

    def check(self) -> None:
        """Raise ``IntegrityError`` naming the law and the session unless every open session keeps the session laws.

        ``inv_committed_within_allocated``: a session claims no committed KV it does
        not hold (a lent slot holds and claims nothing); ``inv_kv_needs_row``; and the
        recorded tokens are exactly the committed ones.
        """
        for slot in self.slots.values():
            s = self.spec_slot(slot)
            where = f"session {slot.sid} (row {slot.row}, committed {slot.committed_len}, allocated {slot.alloc_len}"
            where += f", lent to request {slot.lent_to})" if slot.lent_to is not None else ")"
            if not S.inv_committed_within_allocated(s):
                raise IntegrityError(f"inv_committed_within_allocated: {where} claims KV it does not hold")
            if not S.inv_kv_needs_row(s):
                raise IntegrityError(f"inv_kv_needs_row: {where} holds KV slots without their row")
            if len(slot.tokens) != slot.committed_len:
                raise IntegrityError(
                    f"inv_committed_within_allocated: {where} records {len(slot.tokens)} committed tokens"
                )

    def close(self, sid: int) -> None:
        """Close: free the row, every KV slot, the Mamba state and its track buffers."""
        mm, slot = self.mm, self._slot("close_session", sid)
        if slot.lent_to is not None and mm.requests[slot.lent_to].status is Status.RUNNING:
            raise InvalidArgument("close_session", "session", (), f"session {sid} is in use by request {slot.lent_to}")
        mm.event("close_session", f"session {sid}")
        if slot.row is not None:
            self.free_tail(slot, 0)
            mm.rows.free(slot.row, slot.owner)
        self.release_state(slot)
        del self.slots[sid]

    def release_state(self, slot: SessionSlot) -> None:
        """Free the session's Mamba state and track buffers (what B3 forgot)."""
        self._own_slot("release_state", slot)
        if slot.mamba is not None:
            self.mm.free_mamba(slot.owner, slot.mamba)
            slot.mamba = None
