"""Found by `kvledger check --suite system --profile thorough --seed 1` on full, paged and mamba (no fault on).

A session turn was resumed, then retracted (or aborted): the retract freed the
lent row and KV but the session kept its ``committed_len``, so the next turn
resumed from KV it no longer held and read another token's KV
(``inv_content``). The session now claims nothing while a turn runs (what it
lent is the request's) and gets its committed prefix back only with ``save``
or ``unresume``; a retracted turn takes it along, so the next turn computes its
prompt from scratch. ``spec.session.inv_committed_within_allocated`` is now
checked against the implementation (``Sessions.check``, and after every
session-moving operation with contracts on).
"""

from __future__ import annotations

import icontract
import pytest

from kvledger.contracts import bindings
from kvledger.contracts.machines.system import build_manager
from kvledger.impl.admission import Budget, admit
from kvledger.impl.memory import MemoryManager
from kvledger.impl.requests import Request
from kvledger.impl.session import Sessions
from kvledger.spec.errors import IntegrityError
from kvledger.spec.prefix import fingerprint

MODELS = {"full": (1, False), "paged": (2, False), "mamba": (1, True)}


def content_ok(mm: MemoryManager, req: Request) -> bool:
    assert req.row is not None
    got = mm.kv.data[mm.rows.table[req.row, : req.kv_len]].tolist()
    return bool(got == [fingerprint(t, i) for i, t in enumerate(req.tokens[: req.kv_len])])


def program(mm: MemoryManager, end: str) -> Request:
    """Open a session, run one turn, resume a second turn, end it with ``end``, admit a third turn."""
    mm.sessions.open(1)
    first = mm.add_request((1, 2, 3, 4), 1)
    assert admit(mm, [first], Budget(64, 1))[0]
    mm.finish(first)
    second = mm.add_request((1, 2, 3, 4, 5, 6), 1)
    assert admit(mm, [second], Budget(64, 1))[0] and second.prefix_len > 0
    getattr(mm, end)(second)
    mm.sessions.check()
    third = second if end == "retract" else mm.add_request((1, 2, 3, 4, 7), 1)
    assert admit(mm, [third], Budget(64, 1))[0]
    return third


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("end", ["retract", "abort"])
def test_turn_after_a_retracted_resume_reads_its_own_kv(model: str, end: str) -> None:
    mm = build_manager(*MODELS[model])
    req = program(mm, end)
    assert mm.sessions.slots[1].committed_len == 0 or mm.sessions.slots[1].lent_to == req.rid
    assert req.prefix_len == 0  # the session lost its KV with the retracted turn: nothing to resume from
    assert content_ok(mm, req)
    mm.sessions.check()
    mm.finish(req)
    mm.sessions.check()
    assert mm.sessions.slots[1].committed_len == len(req.tokens)


def test_rolled_back_resume_gives_the_committed_prefix_back() -> None:
    mm = build_manager(2, False)
    mm.sessions.open(1)
    first = mm.add_request((1, 2, 3, 4, 5), 1)
    assert admit(mm, [first], Budget(64, 1))[0]
    mm.finish(first)
    second = mm.add_request((1, 2, 3, 4, 5, 6, 7, 8, 9), 1)
    assert not admit(mm, [second], Budget(2, 1))[0]  # over budget: rolled back
    slot = mm.sessions.slots[1]
    assert (slot.committed_len, slot.tokens, slot.lent_to) == (5, (1, 2, 3, 4, 5), None)
    mm.sessions.check()
    assert admit(mm, [second], Budget(64, 1))[0] and second.prefix_len == 5
    assert content_ok(mm, second)


def test_check_names_the_law_on_a_session_claiming_kv_it_lost() -> None:
    mm = build_manager()
    mm.sessions.open(1)
    req = mm.add_request((1, 2, 3), 1)
    assert admit(mm, [req], Budget(64, 1))[0]
    mm.finish(req)
    slot = mm.sessions.slots[1]
    slot.alloc_len = 1  # hand-broken: three tokens committed, one position held
    with pytest.raises(IntegrityError, match="inv_committed_within_allocated: session 1"):
        mm.sessions.check()
    slot.alloc_len, slot.tokens = 3, (1, 2)  # the recorded tokens are not the committed ones
    with pytest.raises(IntegrityError, match="inv_committed_within_allocated: session 1"):
        mm.sessions.check()


def test_contract_fires_on_the_old_resume(contracts_on: None) -> None:
    original = bindings._originals[(Sessions, "resume")]

    def old_resume(self: Sessions, req: Request) -> None:
        slot = self.slots[req.session]  # type: ignore[index]
        tokens = slot.tokens
        original(self, req)
        slot.tokens, slot.committed_len = tokens[: req.prefix_len], req.prefix_len  # BUG: the lent slot still claims

    bindings._originals[(Sessions, "resume")] = old_resume
    try:
        bindings.install("on")
        mm = build_manager()
        mm.sessions.open(1)
        first = mm.add_request((1, 2, 3, 4), 1)
        assert admit(mm, [first], Budget(64, 1))[0]
        mm.finish(first)
        with pytest.raises(icontract.ViolationError, match="inv_committed_within_allocated"):
            admit(mm, [mm.add_request((1, 2, 3, 4, 5), 1)], Budget(64, 1))
    finally:
        bindings._originals[(Sessions, "resume")] = original
