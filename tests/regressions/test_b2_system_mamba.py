"""Regression from `kvledger check --suite system --model mamba --fault B2`: admission rolls back."""

import pytest

from kvledger.contracts.machines.suites import SUITES
from kvledger.impl import faults
from kvledger.spec.types import Component, Owner, OwnerKind  # noqa: F401  (names the printout may use)


def program(state) -> None:  # type: ignore[no-untyped-def]
    state.inv_all_laws()
    state.add_request(budget=2, prompt=0, sid=None, suffix=[])
    state.teardown()


def test_b2_system_mamba_fails_with_fault() -> None:
    with faults.injected("B2"), pytest.raises(AssertionError, match="admission rolls back"):
        program(SUITES["system"].models["mamba"]()())


def test_b2_system_mamba_passes_without_fault() -> None:
    program(SUITES["system"].models["mamba"]()())
