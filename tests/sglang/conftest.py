"""What the SGLang adapter tests share: the two arms of a planted-bug test (a capability kept, or set aside)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

Licensed = Callable[[Any, str, bool], Any]
"""``licensed_machine(adapter, cap, licensed)``: the system machine on ``adapter``, its first laws checked."""


@pytest.fixture
def licensed_machine() -> Licensed:
    """The system machine on a fresh ``adapter`` with capability ``cap`` kept (``licensed``) or set aside (the
    same program must then pass every other law, so the law that ``cap`` enables is shown to catch the bug alone)."""
    from kvledger.contracts.machines.system import machine_for_system

    def make(adapter: Any, cap: str, licensed: bool) -> Any:
        assert cap in adapter.capabilities, (cap, sorted(adapter.capabilities))
        if not licensed:
            adapter.capabilities = adapter.capabilities - {cap}
        state = machine_for_system(lambda: adapter)()
        state.inv_all_laws()
        return state

    return make


@pytest.fixture
def crash_on_a_full_mamba_pool() -> Callable[[Any], None]:
    """:func:`mamba_pool_crash`, for the tests of each scheduler adapter."""
    return mamba_pool_crash


def mamba_pool_crash(state: Any) -> None:
    """The shrunk program of the Mamba-pool finding (``test_finding_a_mamba_pool_with_every_state_held_crashes_the_
    scheduler``, every release from 0.5.11 to 0.5.23), on a fresh system machine ``state`` of a Mamba kind: a
    request runs, a session's turn on a branch of its prompt runs and finishes, another request starts on the
    first prompt (every law holds so far, the pool nearly full); a new session's first turn then makes SGLang
    assert ``Can not alloc mamba cache`` inside the step."""
    state.swarm(off=frozenset())
    state.inv_all_laws()
    state.add_request(budget=64, prompt=3, sid=None, suffix=[])
    state.inv_all_laws()
    state.repeat_sequence(branch=0, finish=True, pick=0, sid=2)
    state.inv_all_laws()
    state.repeat_sequence(branch=None, finish=False, pick=0, sid=None)
    state.inv_all_laws()
    assert len(state.last.ledgers["mamba"].free) <= 2, "the Mamba pool is nearly full before the last request"
    with pytest.raises(AssertionError, match="Can not alloc mamba cache"):
        state.add_request(budget=64, prompt=0, sid=1, suffix=[])
