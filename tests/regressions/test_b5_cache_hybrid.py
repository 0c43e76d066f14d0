"""Regression from `kvledger check --suite cache --model hybrid --fault B5`: inv_lock_ref_nonnegative."""

import pytest

from kvledger.contracts.machines.suites import SUITES
from kvledger.impl import faults
from kvledger.spec.types import Component, Owner, OwnerKind  # noqa: F401  (names the printout may use)


def program(state) -> None:  # type: ignore[no-untyped-def]
    state.inv_all_laws()
    keys_0 = state.insert(borrow=False, prompt=1, suffix=())
    state.inv_all_laws()
    keys_1 = state.insert(borrow=False, prompt=0, suffix=())
    state.inv_all_laws()
    handles_0 = state.inc_lock_ref_cached(cow=True, key=keys_1, more=())
    state.inv_all_laws()
    state.teardown()


def test_b5_cache_hybrid_fails_with_fault() -> None:
    with (
        faults.injected("B5"),
        pytest.raises(AssertionError, match=r"inv_lock_ref_nonnegative|inv_lock_ref_counts_handles"),
    ):
        program(SUITES["cache"].models["hybrid"]()())


def test_b5_cache_hybrid_passes_without_fault() -> None:
    program(SUITES["cache"].models["hybrid"]()())
