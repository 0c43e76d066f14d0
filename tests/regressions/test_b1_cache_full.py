"""Regression from `kvledger check --suite cache --model full --fault B1`: inv_lru_detached."""

import pytest

from kvledger.contracts.machines.suites import SUITES
from kvledger.impl import faults
from kvledger.spec.types import Component, Owner, OwnerKind  # noqa: F401  (names the printout may use)


def program(state) -> None:  # type: ignore[no-untyped-def]
    state.inv_all_laws()
    keys_0 = state.insert(borrow=False, prompt=0, suffix=())
    state.inv_all_laws()
    state.evict(comp=Component.FULL, n=1)
    state.inv_all_laws()
    state.teardown()


def test_b1_cache_full_fails_with_fault() -> None:
    with faults.injected("B1"), pytest.raises(AssertionError, match="inv_lru_detached"):
        program(SUITES["cache"].models["full"]()())


def test_b1_cache_full_passes_without_fault() -> None:
    program(SUITES["cache"].models["full"]()())
