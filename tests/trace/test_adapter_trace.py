"""Traces of any SystemAdapter, observed through snapshots only: clean runs replay green, B2-B4 fail replay."""

from __future__ import annotations

import io

import pytest
from typer.testing import CliRunner

from kvledger.contracts.adapters.reference_system import ReferenceSystemAdapter
from kvledger.contracts.cli import app
from kvledger.contracts.machines.suites import SYSTEM_CONFIGS
from kvledger.contracts.trace.adapter_recorder import record_adapter_workload
from kvledger.contracts.trace.replay import replay
from kvledger.impl import faults
from kvledger.impl.faults import FAULTS


def recorded(model: str, seed: int, fault: str | None = None) -> io.StringIO:
    buf = io.StringIO()
    with faults.injected(*([fault] if fault else [])):
        record_adapter_workload(ReferenceSystemAdapter(SYSTEM_CONFIGS[model]), 300, seed, buf)
    buf.seek(0)
    return buf


@pytest.mark.parametrize("model", sorted(SYSTEM_CONFIGS))
def test_an_adapter_trace_of_a_healthy_engine_replays_green(model: str) -> None:
    result = replay(recorded(model, 0))
    assert result.ok, result


@pytest.mark.parametrize(("fault", "model"), [("B2", "mamba"), ("B3", "mamba"), ("B4", "full"), ("B4", "paged")])
def test_an_adapter_trace_of_a_faulty_engine_fails_replay_by_a_general_law(fault: str, model: str) -> None:
    result = replay(recorded(model, 1, fault))
    assert not result.ok and result.violation is not None
    assert result.violation.rule in (*FAULTS[fault].laws, "inv_owners_account"), result.violation


def test_record_system_adapter_through_the_cli(tmp_path: object) -> None:
    from pathlib import Path

    out = Path(str(tmp_path)) / "t.jsonl"
    runner = CliRunner()
    rec = runner.invoke(app, ["record", "--system", "--adapter", "reference", "--ops", "200", "-o", str(out)])
    assert rec.exit_code == 0, rec.output
    assert runner.invoke(app, ["replay", str(out)]).exit_code == 0
    bad = runner.invoke(app, ["record", "--system", "--adapter", "no.such.module:f", "-o", str(out)])
    assert bad.exit_code == 2 and "cannot import" in bad.output


STALLING = '''
from kvledger.contracts.adapters.reference_system import ReferenceSystemAdapter
from kvledger.spec.errors import LawBroken


class Stalling(ReferenceSystemAdapter):
    """The reference, but its third extend finds the request it was asked to move stuck (as a scheduler would)."""

    extends = 0

    def extend(self, rid, n, ahead=0):
        Stalling.extends += 1
        if Stalling.extends == 3:
            raise LawBroken(f"a running request moves: extend of request {rid}: still running")
        return super().extend(rid, n, ahead)


def factory(config):
    return Stalling(config)
'''


def test_a_law_an_engine_breaks_while_recording_stops_the_run_as_a_finding(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call that meets a law broken (``LawBroken``, not a refusal) ends the recording there: the trace keeps what
    came before it and replays, the result names the law, and ``kvledger record`` exits 1 saying so (before, the
    error escaped as a traceback)."""
    from pathlib import Path

    tmp = Path(str(tmp_path))
    (tmp / "kvl_stalling.py").write_text(STALLING)
    monkeypatch.syspath_prepend(str(tmp))
    import kvl_stalling

    buf = io.StringIO()
    got = record_adapter_workload(kvl_stalling.factory(SYSTEM_CONFIGS["full"]), 300, 0, buf)
    assert got.broken == "a running request moves" and got.ops < 300, got
    assert got.stopped_by is not None and got.stopped_by.startswith("LawBroken: a running request moves"), got
    buf.seek(0)
    assert replay(buf).ok
    out = tmp / "t.jsonl"
    runner = CliRunner()
    kvl_stalling.Stalling.extends = 0
    rec = runner.invoke(app, ["record", "--system", "--adapter", "kvl_stalling:factory", "-o", str(out)])
    assert rec.exit_code == 1, rec.output
    assert "broke 'a running request moves' at operation" in rec.output, rec.output
    assert runner.invoke(app, ["replay", str(out)]).exit_code == 0
    healthy = record_adapter_workload(ReferenceSystemAdapter(SYSTEM_CONFIGS["full"]), 300, 0, io.StringIO())
    assert healthy.broken is None and healthy.ops == 300
