"""The regression-first phase: kept programs pass on the reference, and a kept program that breaks a law is the
verdict of ``kvledger check``, before any search."""

from __future__ import annotations

import pytest
from hypothesis import settings

from kvledger.contracts.machines.kept import KEPT, kept_for
from kvledger.contracts.machines.profiles import register_profiles
from kvledger.contracts.machines.runner import Watchdog, replay_kept, run_machine
from kvledger.contracts.machines.suites import SUITES
from kvledger.impl import faults

register_profiles()


@pytest.mark.parametrize("kept", KEPT, ids=lambda k: k.origin)
def test_every_kept_program_passes_on_the_reference(kept: object) -> None:
    from kvledger.contracts.machines.kept import Kept

    assert isinstance(kept, Kept)
    for model in kept.models:
        assert replay_kept(SUITES[kept.suite].models[model](), [kept], Watchdog(30)) is None, (kept.origin, model)


@pytest.mark.parametrize(("fault", "suite", "model"), [("B1", "cache", "full"), ("B3", "system", "mamba")])
def test_a_kept_program_that_breaks_a_law_is_the_verdict(fault: str, suite: str, model: str) -> None:
    one = settings(settings.get_profile("ci"), max_examples=1)
    with faults.injected(fault):
        result = run_machine(suite, model, SUITES[suite].models[model](), [], one, kept=kept_for(suite, model))
    assert result.violation is not None and result.violation.rule in faults.FAULTS[fault].laws, result.violation
    assert "(kept program: " in result.violation.message and result.examples == 0
    assert result.violation.steps and "state." in result.violation.program


@pytest.mark.parametrize("model", ["token", "paged"])
def test_a_memo_of_long_results_that_vouches_by_its_last_ids_is_caught(
    model: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A path taken only past a size cut-off: kvledger's pools remember alloc results of more than 8,192 slots apart
    (``RecentAllocs``), keyed by their last ids. A lookup that skips the full comparison for those vouches for any
    ids ending like a remembered result, and a free naming a slot twice is then taken as distinct slots. The
    pools' machines hold a dozen slots; the kept program of long allocations meets it before any search."""
    from kvledger.impl import slots

    def find(self: slots.RecentAllocs[object], raw: bytes | bytearray) -> tuple[bytes, object] | None:
        if len(raw) > slots._SHORT_BYTES:
            return self._long.get(bytes(raw[-64:]))  # BUG: no full comparison for a long result
        hit = self._items.get(bytes(raw[-64:]))
        return hit if hit is not None and hit[0] == raw else None

    (long,) = (k for k in KEPT if "long_alloc" in k.steps[0])
    assert replay_kept(SUITES["pools"].models[model](), [long], Watchdog(60)) is None
    monkeypatch.setattr(slots.RecentAllocs, "find", find)
    found = replay_kept(SUITES["pools"].models[model](), [long], Watchdog(60))
    assert found is not None, "the long allocations met no broken law"


@pytest.mark.parametrize("model", ["token", "mamba"])
def test_a_long_allocation_that_is_no_run_of_slots_is_met(model: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 19, new family, seed 24: ``SlotPool.alloc`` remembering a long result that is no run of slots as
    ``None`` (a ``TypeError``). A fresh pool hands out one run; the kept program of long allocations scrambles the
    pool's free slots first in some of its steps, so a long allocation that is no run is met too."""
    import numpy as np

    from kvledger.impl import slots

    real = slots.RecentAllocs.add

    def add(self: slots.RecentAllocs[object], raw: bytes | bytearray, value: object) -> None:
        ids = np.frombuffer(bytes(raw), dtype=np.int64)
        if len(ids) > slots.HANDED_MAX and not bool((np.diff(ids) == ids[1] - ids[0]).all()):
            raise TypeError("cannot convert 'NoneType' object to bytes")  # BUG: a long result that is no run
        real(self, raw, value)

    (long,) = (k for k in KEPT if "long_alloc" in k.steps[0])
    assert replay_kept(SUITES["pools"].models[model](), [long], Watchdog(60)) is None
    monkeypatch.setattr(slots.RecentAllocs, "add", add)
    found = replay_kept(SUITES["pools"].models[model](), [long], Watchdog(60))
    assert found is not None and isinstance(found[1], TypeError), found
