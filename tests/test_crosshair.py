"""CrossHair has teeth: it finds a planted leak in a broken copy of ``allocate``."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from kvledger.contracts.crosshair_check import run_crosshair

BROKEN_ALLOCATE = textwrap.dedent(
    '''
    """A deliberately broken copy of kvledger.spec.ledger.allocate: it forgets one slot (a leak)."""
    import icontract

    from kvledger.spec.ledger import Ledger, Slots, _with, check_allocate, held_by, inv_ledger, inv_slots_conserved
    from kvledger.spec.types import Owner


    @icontract.require(lambda s: inv_ledger(s), "well-formed ledger")
    @icontract.require(lambda s, owner, slots: check_allocate(s, owner, slots) is None, "slots are free")
    @icontract.require(lambda s: s.capacity <= 4 and s.base == 0, "small pool")
    @icontract.require(lambda slots: len(slots) > 0, "something to allocate")  # NOTE: allocating nothing is a no-op
    @icontract.ensure(lambda result: inv_slots_conserved(result), "slots conserved")
    def allocate(s: Ledger, owner: Owner, slots: Slots) -> Ledger:
        kept = frozenset(sorted(slots)[1:])  # BUG: the first slot leaves the free list but nobody gets it
        return Ledger(s.name, s.capacity, s.free - slots, _with(s.held, owner, held_by(s, owner) | kept), s.base)
    '''
)


@pytest.mark.slow
def test_crosshair_finds_planted_leak(tmp_path: Path) -> None:
    broken = tmp_path / "broken_ledger.py"
    broken.write_text(BROKEN_ALLOCATE)
    result = run_crosshair([str(broken)], tmp_path / "view", per_condition_timeout=20, timeout=300)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "slots conserved" in result.stdout or "false when calling allocate" in result.stdout, result.stdout


@pytest.mark.slow
def test_crosshair_accepts_the_real_allocate(tmp_path: Path) -> None:
    fixed = tmp_path / "fixed_ledger.py"
    fixed.write_text(BROKEN_ALLOCATE.replace("frozenset(sorted(slots)[1:])", "slots"))
    result = run_crosshair([str(fixed)], tmp_path / "view", per_condition_timeout=3, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
