"""Contract bindings: zero wrappers when off, incremental laws when on, refinement when slow."""

from __future__ import annotations

from collections.abc import Iterator

import icontract
import pytest
import torch

from kvledger.contracts import bindings
from kvledger.impl.allocators import PagedAllocator, SWATokenAllocator, TokenAllocator
from kvledger.impl.slots import SlotPool
from kvledger.spec.errors import DoubleFree
from kvledger.spec.types import request, session

R1 = request(1)


@pytest.fixture(params=["on", "slow"])
def level(request: pytest.FixtureRequest) -> Iterator[str]:
    saved = bindings.current_level()
    bindings.install(request.param)
    yield str(request.param)
    bindings.install(saved)


def test_off_means_no_wrapper() -> None:
    saved = bindings.current_level()
    bindings.install("off")
    try:
        assert SlotPool.alloc is SlotPool.__dict__["alloc"]
        assert not hasattr(SlotPool.alloc, "__preconditions__") and not hasattr(SlotPool.alloc, "__postconditions__")
    finally:
        bindings.install(saved)


def test_level_from_env_rejects_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(bindings.ENV_VAR, "loud")
    with pytest.raises(ValueError, match="KVLEDGER_CONTRACTS='loud'"):
        bindings.level_from_env()
    monkeypatch.setenv(bindings.ENV_VAR, "SLOW")
    assert bindings.level_from_env() == "slow"


def test_correct_pools_pass(level: str) -> None:
    a = TokenAllocator(16)
    x = a.alloc(5, R1)
    a.transfer(x[:2], R1, session(2))
    a.free(x[2:], R1)
    with pytest.raises(DoubleFree):  # the typed error still surfaces through the wrapper
        a.free(x[2:], R1)
    p = PagedAllocator(4, 2)
    p.free(p.alloc(3, R1), R1)
    s = SWATokenAllocator(8, 4)
    y = s.alloc(3, R1)
    s.free_swa(y[:1], R1)
    s.free(y, R1)


def test_leaky_release_violates_a_named_law(level: str, monkeypatch: pytest.MonkeyPatch) -> None:
    original = bindings._originals[(SlotPool, "release")]

    def leaky(self: SlotPool, idx: torch.Tensor) -> None:
        original(self, idx)
        self._top -= 1  # BUG: one freed slot never reaches the free stack

    bindings._originals[(SlotPool, "release")] = leaky
    try:
        bindings.install(level)  # type: ignore[arg-type]
        a = TokenAllocator(8)
        x = a.alloc(3, R1)
        with pytest.raises(
            icontract.ViolationError,
            match=r"released slots are free-tagged and pushed once|free stack matches tags|ledger laws",
        ):
            a.free(x, R1)
    finally:
        bindings._originals[(SlotPool, "release")] = original
        bindings.install(level)  # type: ignore[arg-type]


def test_alloc_of_held_slot_violates_a_named_law(level: str) -> None:
    a = TokenAllocator(8)
    x = a.alloc(2, R1)
    a.pool._stack[a.pool._top - 1] = x[0]  # corrupt the free stack: a held slot sits on it
    with pytest.raises(
        icontract.ViolationError,
        match=r"alloc hands out exactly the top n free slots|free stack matches tags|ledger laws|abstract\(after\)",
    ):
        a.alloc(1, session(3))


def test_slow_tier_checks_refinement() -> None:
    saved = bindings.current_level()
    bindings.install("slow")
    try:
        a = TokenAllocator(8)
        x = a.alloc(2, R1)
        a.pool.owner_tag[int(x[0])] = 0  # lose an owner behind the pool's back
        with pytest.raises(icontract.ViolationError, match=r"ledger laws|free stack matches tags|abstract"):
            a.alloc(1, R1)
    finally:
        bindings.install(saved)


def test_slow_tier_adds_to_the_incremental_tier() -> None:
    saved = bindings.current_level()
    try:
        bindings.install("on")
        on = {c.description for c in SlotPool.alloc.__postconditions__}  # type: ignore[attr-defined]
        bindings.install("slow")
        slow = {c.description for c in SlotPool.alloc.__postconditions__}  # type: ignore[attr-defined]
        assert on < slow
        assert {"pool obeys the ledger laws", "abstract(after) == spec.allocate(abstract(before))"} <= slow
    finally:
        bindings.install(saved)
    assert bindings.current_level() == saved
