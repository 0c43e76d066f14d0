"""The request-level adapter protocol: the reference is a SystemAdapter, each law fails on a broken state."""

from __future__ import annotations

import dataclasses

import pytest
from typer.testing import CliRunner

from kvledger.contracts.adapters.reference_system import ReferenceSystemAdapter
from kvledger.contracts.adapters.system import (
    SYSTEM_CAPABILITIES,
    IdleVerdict,
    RowView,
    SessionView,
    SystemAdapter,
    SystemConfig,
    skipped_system_rules,
)
from kvledger.contracts.cli import app
from kvledger.contracts.machines.system import check_snapshot, machine_for_system
from kvledger.spec.types import request, session


def running(page_size: int = 1) -> tuple[ReferenceSystemAdapter, int]:
    """A reference engine with one cached prompt and a second request running on it (prefix borrowed)."""
    sys = ReferenceSystemAdapter(SystemConfig(page_size=page_size))
    first = sys.add_request((1, 2, 3, 4, 5))
    sys.admit(64, first)
    sys.finish(first)
    rid = sys.add_request((1, 2, 3, 4, 9))
    assert sys.admit(64, rid).admitted == (rid,)
    return sys, rid


def laws(sys: ReferenceSystemAdapter) -> None:
    check_snapshot(sys.snapshot(), sys.idle_check(), sys.capabilities, sys.provenance)


def test_reference_is_a_system_adapter_and_declares_known_capabilities() -> None:
    sys = ReferenceSystemAdapter()
    assert isinstance(sys, SystemAdapter)
    assert sys.capabilities <= SYSTEM_CAPABILITIES
    assert skipped_system_rules(sys.capabilities) == []
    assert "inv_rows_held" in skipped_system_rules(frozenset())


def test_snapshot_does_not_change_the_engine() -> None:
    sys, _ = running()
    assert sys.snapshot() == sys.snapshot()


@pytest.mark.parametrize("page_size", [1, 2])
def test_a_healthy_engine_passes_every_law(page_size: int) -> None:
    sys, rid = running(page_size)
    laws(sys)
    view = sys.snapshot().requests[rid]
    assert view.prefix_len > 0 and view.handle is not None and view.status == "running"


def test_a_live_handle_is_owned_by_a_running_request_or_an_open_session() -> None:
    """``inv_handles_owned``: a handle nobody reports holding fails it; the same handle reported as an open session's
    (a streaming slot that keeps its first turn's lock) passes; a session that does not exist owns nothing."""
    sys, rid = running()
    snap = sys.snapshot()
    view = snap.requests[rid]
    assert view.handle is not None and snap.locks is not None and view.handle in snap.locks.handles
    # NOTE: the lock pairing alone, not what each lock covers (``prefix_locked``) nor whose lock covers what a row
    # borrows (``rows``: the handle moved to another session below leaves the request's borrowed prefix unlocked)
    caps = sys.capabilities - {"prefix_locked", "rows"}
    check_snapshot(snap, None, caps)
    unowned = {**snap.requests, rid: dataclasses.replace(view, handle=None)}
    with pytest.raises(AssertionError, match=r"inv_handles_owned: live handles \[\d+\], held by running requests \[\]"):
        check_snapshot(dataclasses.replace(snap, requests=unowned), None, caps)
    kept = {**snap.sessions, 7: SessionView(7, 0, 0, None, handle=view.handle)}
    check_snapshot(dataclasses.replace(snap, requests=unowned, sessions=kept), None, caps)
    stray = {**snap.sessions, 7: SessionView(7, 0, 0, None, handle=view.handle + 1)}
    with pytest.raises(AssertionError, match="inv_handles_owned"):
        check_snapshot(dataclasses.replace(snap, sessions=stray), None, caps)


def test_rows_held_fails_on_a_row_naming_a_free_slot_in_its_borrowed_prefix() -> None:
    """A use after free the ownership ledgers alone cannot see: the borrowed prefix names a free slot."""
    sys, rid = running()
    mm = sys.mm
    row = mm.requests[rid].row
    assert row is not None
    free_slot = int(mm.kv.pool.free_slots()[0])
    snap = sys.snapshot()
    assert free_slot in snap.ledgers["kv"].free
    broken = dict(snap.rows)
    view = broken[row]
    broken[row] = dataclasses.replace(view, slots=(free_slot, *view.slots[1:]))
    with pytest.raises(AssertionError, match=r"inv_rows_held: row \d+ .* held by free"):
        check_snapshot(dataclasses.replace(snap, rows=broken), None, sys.capabilities)
    broken[row] = dataclasses.replace(view, slots=(*view.slots[:-1], 10_000))
    with pytest.raises(AssertionError, match="outside the pool"):
        check_snapshot(dataclasses.replace(snap, rows=broken), None, sys.capabilities)
    broken[row] = RowView(session(7), view.slots, view.owned_from)
    with pytest.raises(AssertionError, match="inv_rows_held"):
        check_snapshot(dataclasses.replace(snap, rows=broken), None, sys.capabilities)


def test_owners_account_fails_when_a_structure_forgets_a_slot() -> None:
    sys, rid = running()
    snap = sys.snapshot()
    refs = {pool: dict(owners) for pool, owners in snap.references.items()}
    owned = set(refs["kv"][request(rid)])
    refs["kv"][request(rid)] = frozenset(sorted(owned)[1:])
    with pytest.raises(AssertionError, match="inv_owners_account"):
        check_snapshot(dataclasses.replace(snap, references=refs), None, sys.capabilities)


@pytest.mark.parametrize("status", ["finished", "aborted"])
def test_a_request_that_ended_holding_a_row_breaks_released_on_end(status: str) -> None:
    """``inv_released_on_end``: the running request is reported ended while the ledgers still credit it its row and
    KV, and its references name them (an engine whose record keeps naming a row it forgot to free, as SGLang's
    components keep ``req_pool_idx``): every other law holds, this one names the request and what it kept. The
    same request reported running passes."""
    sys, rid = running()
    snap = sys.snapshot()
    laws(sys)
    ended = {**snap.requests, rid: dataclasses.replace(snap.requests[rid], status=status)}
    rows = {row: v for row, v in snap.rows.items() if v.holder != request(rid)}  # NOTE: no live row names it
    with pytest.raises(AssertionError, match=rf"inv_released_on_end: request {rid} has {status} and still holds kv \["):
        check_snapshot(dataclasses.replace(snap, requests=ended, rows=rows), None, sys.capabilities - {"locks"})


@pytest.mark.parametrize("status", ["FINISHED", "ABORTED"])
def test_the_reference_leak_checker_counts_what_an_ended_request_kept_as_leaked(status: str) -> None:
    """An engine marks a running request ended and frees nothing. The reference's own leak check reports each slot
    the request kept as leaked (its row still names them, but an ended request owns nothing), so it agrees with the
    ledgers and the law that names the request is the one that breaks."""
    from kvledger.impl.leaks import check_leaks
    from kvledger.impl.requests import Status

    sys, rid = running()
    laws(sys)
    req = sys.mm.requests[rid]
    row = req.row
    req.status = Status[status]  # BUG: ended without releasing its row, its KV or its lock
    report = check_leaks(sys.mm)
    assert not report.ok
    assert row in report.leaked()["req_to_token"]
    assert {f.owner for f in report.findings} == {str(request(rid))}
    assert "no live structure references it" in str(report)
    with pytest.raises(AssertionError, match=rf"inv_released_on_end: request {rid} has {status.lower()} and still"):
        laws(sys)


def test_leak_checker_disagreement_is_a_violation_both_ways() -> None:
    sys, _ = running()
    snap = sys.snapshot()
    with pytest.raises(AssertionError, match="leak checker agrees"):
        check_snapshot(snap, IdleVerdict(False, None, "false positive"), sys.capabilities)
    with pytest.raises(AssertionError, match="leak checker agrees"):
        check_snapshot(snap, IdleVerdict(True, {"kv": frozenset({3})}, "itemized wrongly"), sys.capabilities)


def test_session_claiming_more_than_it_holds_is_caught() -> None:
    sys = ReferenceSystemAdapter()
    sys.open_session(1)
    rid = sys.add_request((1, 2, 3), 1)
    sys.admit(64, rid)
    sys.finish(rid)
    snap = sys.snapshot()
    view = snap.sessions[1]
    broken = {1: dataclasses.replace(view, committed_len=view.alloc_len + 1)}
    with pytest.raises(AssertionError, match="inv_committed_within_allocated"):
        check_snapshot(dataclasses.replace(snap, sessions=broken), None, sys.capabilities)


class Minimal:
    """The reference seen through a poor engine API: no sessions, locks, rows, content, retract or idle check."""

    name, version, engine_class = "minimal", "0", "Minimal"
    capabilities = frozenset({"abort", "targeted_admission"})

    def __init__(self, config: SystemConfig) -> None:
        self.inner = ReferenceSystemAdapter(config)
        self.config = config

    def __getattr__(self, attr: str) -> object:
        return getattr(self.inner, attr)


def test_machine_drives_an_adapter_with_few_capabilities() -> None:
    from hypothesis import settings
    from hypothesis.stateful import run_state_machine_as_test

    machine = machine_for_system(lambda: Minimal(SystemConfig()))  # type: ignore[arg-type,return-value]
    run_state_machine_as_test(machine, settings=settings(max_examples=10, stateful_step_count=20, database=None))


def test_cli_checks_a_system_adapter_and_names_its_engine_class() -> None:
    result = CliRunner().invoke(
        app, ["check", "--suite", "system", "--adapter", "reference", "--model", "full", "--examples", "5", "--json"]
    )
    assert result.exit_code == 0, result.output
    assert '"engine_class": "kvledger.impl.memory.MemoryManager"' in result.output
    assert '"suite": "system"' in result.output
