"""icontract bindings for streaming sessions, attached from outside like the pool and cache bindings.

Every operation that hands a session's memory around (``resume``,
``unresume``, ``save``, ``close``, and a request's ``finish``, ``retract`` and
``abort``, which may end a resumed turn) ends with the session laws of
:mod:`kvledger.spec.session` checked on every open session
(:meth:`kvledger.impl.session.Sessions.check`): a session never claims
committed KV it does not hold (``inv_committed_within_allocated``). Sessions
are few, so the check is cheap enough for tier ``on``.
"""

from __future__ import annotations

from collections.abc import Callable

import icontract

from kvledger.impl.memory import MemoryManager
from kvledger.impl.session import Sessions
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


def attach(wrap: Wrap) -> None:
    """Attach the session contracts with ``wrap`` (``kvledger.contracts.bindings._wrap``)."""
    for name in ("resume", "unresume", "save", "close"):
        wrap(Sessions, name, icontract.ensure(sessions_keep_laws, LAW))
    for name in ("finish", "retract", "abort"):
        wrap(MemoryManager, name, icontract.ensure(manager_sessions_keep_laws, LAW))
