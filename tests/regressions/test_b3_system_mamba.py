"""Regression from `kvledger check --suite system --model mamba --fault B3`: leak checker agrees with the ledgers."""

import pytest

from kvledger.contracts.machines.suites import SUITES
from kvledger.impl import faults
from kvledger.spec.types import Component, Owner, OwnerKind  # noqa: F401  (names the printout may use)


def program(state) -> None:  # type: ignore[no-untyped-def]
    state.inv_all_laws()
    state.add_request(budget=64, prompt=0, sid=1, suffix=[])
    state.inv_all_laws()
    state.end_or_chunk(op="finish", pick=0)
    state.inv_all_laws()
    state.teardown()


def test_b3_system_mamba_fails_with_fault() -> None:
    with faults.injected("B3"), pytest.raises(AssertionError, match="leak checker agrees with the ledgers"):
        program(SUITES["system"].models["mamba"]()())


def test_b3_system_mamba_passes_without_fault() -> None:
    program(SUITES["system"].models["mamba"]()())
