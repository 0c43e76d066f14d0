"""Found by `kvledger check --profile thorough --seed 1` (system suite, every model; issue 19), no fault on.

A session turn that was resumed and then retracted (or aborted) gave its row
and KV back but left the session claiming its committed tokens; the next turn
resumed from KV the session no longer held and read another request's KV
(``inv_content``). The session's own law, ``inv_committed_within_allocated``,
now checked by the system machine on every snapshot, names it one step after
the retract. Fixed in ``MemoryManager._release_all``: a turn released without
being saved leaves the session holding nothing, committed tokens included.
"""

import pytest

from kvledger.contracts.machines.suites import SUITES, SYSTEM_MODELS


@pytest.mark.parametrize("model", sorted(SYSTEM_MODELS))
@pytest.mark.parametrize("op", ["retract", "abort"])
def test_a_released_session_turn_leaves_the_session_claiming_nothing(model: str, op: str) -> None:
    state = SUITES["system"].models[model]()()
    state.inv_all_laws()
    state.add_request(prompt=0, sid=1, suffix=[], budget=64)
    state.inv_all_laws()
    state.end_or_chunk(op="finish", pick=0)  # the turn is saved: the session holds 4 committed tokens
    state.inv_all_laws()
    state.add_request(prompt=0, sid=1, suffix=[1], budget=64)  # the next turn resumes them
    state.inv_all_laws()
    state.end_or_chunk(op=op, pick=0)  # ... and is released without being saved
    state.inv_all_laws()
    state.add_request(prompt=0, sid=1, suffix=[2], budget=64)  # a third turn resumes what is left
    state.inv_all_laws()
    state.teardown()
