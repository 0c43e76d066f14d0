"""Regression from `kvledger check --suite system --model paged --fault B4`: inv_owners_account."""

import pytest

from kvledger.contracts.machines.suites import SUITES
from kvledger.impl import faults
from kvledger.spec.types import Component, Owner, OwnerKind  # noqa: F401  (names the printout may use)


def program(state) -> None:  # type: ignore[no-untyped-def]
    state.inv_all_laws()
    state.close_session(sid=1)
    state.inv_all_laws()
    state.add_request(budget=64, prompt=0, sid=1, suffix=[])
    state.inv_all_laws()
    state.end_or_chunk(op="finish", pick=0)
    state.inv_all_laws()
    state.close_session(sid=1)
    state.inv_all_laws()
    state.teardown()


def test_b4_system_paged_fails_with_fault() -> None:
    with faults.injected("B4"), pytest.raises(AssertionError, match=r"inv_owners_account|inv_released_on_close"):
        program(SUITES["system"].models["paged"]()())


def test_b4_system_paged_passes_without_fault() -> None:
    program(SUITES["system"].models["paged"]()())
