"""icontract bindings for streaming sessions, attached from outside like the pool and cache bindings.

Every operation that hands a session's memory around (``resume``,
``unresume``, ``save``, ``close``, and a request's ``finish``, ``retract`` and
``abort``, which may end a resumed turn) ends with the session laws of
:mod:`kvledger.spec.session` checked on every open session
(:meth:`kvledger.impl.session.Sessions.check`): a session never claims
committed KV it does not hold (``inv_committed_within_allocated``). Sessions
are few, so the check is cheap enough for tier ``on``.

``resume`` is also held to the plan :func:`kvledger.spec.session.resume`
states (``inv_resume_frees_tail``): the turn takes the session's row up to
the prefix it resumes from, rounded up to a page (no further than the
session had allocated), and the tail past it is freed, not handed on.
"""

from __future__ import annotations

from collections.abc import Callable

import icontract

from kvledger.impl.memory import MemoryManager
from kvledger.impl.requests import Request
from kvledger.impl.session import Sessions
from kvledger.spec import session as S
from kvledger.spec.errors import IntegrityError

Wrap = Callable[..., None]

LAW = "inv_committed_within_allocated: every session holds the KV it commits"


def sessions_keep_laws(self: Sessions) -> bool:
    """Every open session keeps the session laws (``Sessions.check`` raises nothing)."""
    try:
        self.check()
    except IntegrityError:
        return False
    return True


def manager_sessions_keep_laws(self: MemoryManager) -> bool:
    """``sessions_keep_laws`` on the manager's sessions."""
    return sessions_keep_laws(self.sessions)


PLAN = "inv_resume_frees_tail: a resumed turn takes the row up to the page-aligned prefix; the tail is freed"


def allocated_before(self: Sessions, req: Request) -> int | None:
    """How many row positions the session ``req`` resumes had allocated (``None``: no such session)."""
    sid = getattr(req, "session", None)  # NOTE: taken before the call refuses junk: it must not raise itself
    slot = self.slots.get(sid) if type(sid) is int else None
    return None if slot is None else slot.alloc_len


def resumes_as_planned(self: Sessions, req: Request, OLD: object) -> bool:
    """After ``resume(req)``: ``req`` holds the positions ``spec.session.resume`` keeps, no more and no fewer."""
    allocated = getattr(OLD, "allocated", None)
    if allocated is None:
        return True
    return bool(req.alloc_len == S.tail_start(req.prefix_len, allocated, self.mm.page))


def attach(wrap: Wrap) -> None:
    """Attach the session contracts with ``wrap`` (``kvledger.contracts.bindings._wrap``)."""
    for name in ("unresume", "save", "close"):
        wrap(Sessions, name, icontract.ensure(sessions_keep_laws, LAW))
    wrap(
        Sessions,
        "resume",
        icontract.snapshot(allocated_before, name="allocated"),
        icontract.ensure(sessions_keep_laws, LAW),
        icontract.ensure(resumes_as_planned, PLAN),
    )
    for name in ("finish", "retract", "abort"):
        wrap(MemoryManager, name, icontract.ensure(manager_sessions_keep_laws, LAW))
