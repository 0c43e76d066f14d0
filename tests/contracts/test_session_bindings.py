"""The session bindings hold ``Sessions.resume`` to ``spec.session.resume``'s plan (``inv_resume_frees_tail``)."""

from __future__ import annotations

from collections.abc import Callable

import icontract
import pytest

from kvledger.contracts import bindings
from kvledger.contracts.machines.system import build_manager
from kvledger.impl.admission import Budget, admit
from kvledger.impl.requests import Request
from kvledger.impl.session import Sessions, common_prefix


def keeping_the_tail(original: Callable[[Sessions, Request], None]) -> Callable[[Sessions, Request], None]:
    """``Sessions.resume`` (``original``) with the tail's start taken as the larger of the rounded prefix and what
    the session had allocated (``max`` for ``min``): the turn takes every position the session held, none is
    freed."""

    def resume(self: Sessions, req: Request) -> None:
        mm, slot = self.mm, self._slot("resume", self.mm.own("resume", req).session)
        if slot.row is None:
            return original(self, req)  # NOTE: a first turn: nothing to keep
        prefix = min(common_prefix(req.tokens[:-1], slot.tokens), slot.committed_len)
        start = max(mm.round_up(prefix), slot.alloc_len)  # BUG: keeps the whole tail
        assert mm.mamba is None
        self.free_tail(slot, start)
        mm.rows.transfer(slot.row, slot.owner, req.owner)
        if start:
            mm.kv.transfer(mm.rows.table[slot.row, :start].clone(), slot.owner, req.owner)
        req.row, req.mamba = slot.row, None
        req.prefix_len, req.own_from, req.kv_len, req.alloc_len = prefix, 0, prefix, start
        slot.lent_to, slot.lent_fresh = req.rid, (False, False)
        slot.row, slot.mamba, slot.alloc_len = None, None, 0
        slot.tokens, slot.committed_len = (), 0
        return None

    return resume


def _resume_after_a_turn(mm_page: int) -> None:
    """A session's turn of 8 tokens finished, then a turn that shares only its first 2: the tail from the
    rounded prefix on must be freed on resume."""
    mm = build_manager()
    assert mm.page == mm_page
    mm.sessions.open(1)
    first = mm.add_request((1, 2, 3, 4, 5, 6, 7, 8), 1)
    assert admit(mm, [first], Budget(64, 1))[0]
    mm.finish(first)
    admit(mm, [mm.add_request((1, 2, 9, 9, 9), 1)], Budget(64, 1))


def test_a_resume_as_planned_keeps_the_law(contracts_on: None) -> None:
    _resume_after_a_turn(1)


def test_a_resume_that_keeps_the_sessions_tail_breaks_the_plan(contracts_on: None) -> None:
    original = bindings._originals[(Sessions, "resume")]
    bindings._originals[(Sessions, "resume")] = keeping_the_tail(original)
    try:
        bindings.install("on")
        with pytest.raises(icontract.ViolationError, match="inv_resume_frees_tail"):
            _resume_after_a_turn(1)
    finally:
        bindings._originals[(Sessions, "resume")] = original
        bindings.install("on")
