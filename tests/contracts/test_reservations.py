"""The ``reservations`` licence: a rejected attempt that found a request holding nothing may leave it a reservation,
and every later attempt must keep that reservation as it is; without the licence, a rejection rolls back exactly."""

from __future__ import annotations

import pytest

from kvledger.contracts.adapters.reference_system import ReferenceSystemAdapter
from kvledger.contracts.adapters.system import SYSTEM_CAPABILITIES, StepResult
from kvledger.contracts.machines.suites import SYSTEM_CONFIGS
from kvledger.contracts.machines.system import machine_for_system
from kvledger.impl.mamba import MambaAlloc


class Reserving(ReferenceSystemAdapter):
    """The reference, plus a Mamba state kept for each request the scheduler rejects (as SGLang 0.5.23 does)."""

    capabilities = SYSTEM_CAPABILITIES
    swap = False
    """A later rejection trades the reservation for another state (the broken variant)."""

    def __init__(self) -> None:
        super().__init__(SYSTEM_CONFIGS["mamba"])
        self.reserved: dict[int, MambaAlloc] = {}

    def admit(self, budget: int, rid: int | None = None) -> StepResult:
        result = super().admit(budget, rid)
        for r in result.rejected:
            owner = self.mm.requests[r].owner
            if r not in self.reserved:
                self.reserved[r] = self.mm.alloc_mamba(owner)
            elif self.swap:
                old, self.reserved[r] = self.reserved[r], self.mm.alloc_mamba(owner)
                self.mm.free_mamba(owner, old)
        return result


def _two_rejections(make: type[Reserving]) -> None:
    state = machine_for_system(make)()
    state.add_request(prompt=0, suffix=[], sid=None, budget=2)  # rejected: the reservation forms
    state.admit(pick=0, budget=2, batch=False)  # rejected again


def test_a_reservation_kept_as_it_is_holds() -> None:
    _two_rejections(Reserving)


def test_a_reservation_changed_by_a_later_attempt_is_caught() -> None:
    class Swapping(Reserving):
        swap = True

    with pytest.raises(AssertionError, match="admission rolls back: rejected request 1 keeps"):
        _two_rejections(Swapping)


def test_without_the_licence_a_reservation_is_a_leak() -> None:
    class Unlicensed(Reserving):
        capabilities = SYSTEM_CAPABILITIES - {"reservations"}

    state = machine_for_system(Unlicensed)()
    with pytest.raises(AssertionError, match="admission rolls back: rejected request 1 keeps"):
        state.add_request(prompt=0, suffix=[], sid=None, budget=2)
