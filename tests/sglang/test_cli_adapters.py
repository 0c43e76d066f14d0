"""The command the docs give finds what the tests find: ``kvledger check --adapter`` on SGLang's own caches."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from typer.testing import CliRunner

from kvledger.contracts.adapters.sglang.cpu_import import installed_version_or_none, release_tuple, unavailable_reason
from kvledger.contracts.cli import app

runner = CliRunner()


@pytest.mark.skipif(unavailable_reason("0.5.9") is not None, reason=str(unavailable_reason("0.5.9")))
def test_b1_in_sglang_0_5_9_mamba_is_found_by_the_cli() -> None:
    """A Mamba-only cache adapter is probed with a Mamba model kind, not refused for lacking full attention."""
    result = runner.invoke(app, ["check", "--adapter", "sglang-0.5.9-mamba", "--json", "--shrink-for", "2s"])
    assert result.exit_code == 1, result.output
    payload = json.loads(result.output[result.output.index("{") :])
    assert {v["rule"] for v in payload["violations"]} == {"inv_lru_detached"}, payload["violations"]
    skipped = [r for r in payload["results"] if r["violation"] is None]
    assert skipped and all(r["skipped"] for r in skipped)  # the kinds it cannot build are skipped, not failed


@pytest.mark.skipif(unavailable_reason("0.5.11") is not None, reason=str(unavailable_reason("0.5.11")))
def test_b5_in_sglang_0_5_11_is_found_by_the_cli_past_b1() -> None:
    """B1 first, in every kind; set aside, the same command goes on to B5 and prints a regression that sets it aside."""
    # NOTE: the laws met and the program's steps are asserted, not its length: a short shrink (each took 60 s)
    args = ["check", "--adapter", "sglang-0.5.11", "--model", "hybrid", "--json", "--shrink-for", "2s"]
    first = runner.invoke(app, args)
    assert first.exit_code == 1, first.output
    payload = json.loads(first.stdout[first.stdout.index("{") :])
    assert [v["rule"] for v in payload["violations"]] == ["inv_lru_detached"], payload["violations"]
    past = runner.invoke(app, [*args, "--set-aside", "inv_lru_detached"])
    assert past.exit_code == 1, past.output
    payload = json.loads(past.stdout[past.stdout.index("{") :])
    (v,) = [r["violation"] for r in payload["results"] if r["violation"] is not None]
    verdict = r"inv_lock_ref_counts_handles|release_component_lock\(swa\) on node with lock_ref=0"
    assert re.search(verdict, f"{v['rule']}: {v['message']}") and "swa" in v["message"], v
    assert "set_aside(" in v["program"] and re.search(r"cow=True|mamba_copy_on_write", v["program"]), v["program"]


@pytest.mark.skipif(
    installed_version_or_none() not in ("0.5.13", "0.5.23"), reason="needs a components release (0.5.13 or 0.5.23)"
)
def test_sglang_system_drives_the_installed_components_scheduler_from_the_cli() -> None:
    """``--adapter sglang-system`` picks the installed release's scheduler adapter; ``--json`` names it."""
    args = ["check", "--suite", "system", "--adapter", "sglang-system", "--model", "full", "--examples", "2", "--json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout[result.stdout.index("{") :])
    assert payload["adapter_version"] == installed_version_or_none(), payload["adapter"]
    assert payload["engine_class"] == "sglang.srt.managers.scheduler.Scheduler"
    assert payload["adapter"].startswith(f"sglang-{installed_version_or_none()}/Scheduler"), payload["adapter"]


WINDOW_KINDS = ["--model", "swa", "--model", "hybrid"]
"""The system model kinds with a sliding window (``ENGINE_SYSTEM_CONFIGS``): an engine's only, not the reference's."""


def _wires_a_window() -> bool:
    """SGLang's schedulers wire a sliding window from 0.5.13 (the components schedulers)."""
    release = installed_version_or_none()
    return release is not None and release_tuple(release) >= (0, 5, 13)


@pytest.mark.skipif(installed_version_or_none() is None, reason="needs an SGLang release (.ci/sglang_env)")
def test_the_window_kinds_run_where_the_scheduler_wires_a_window_and_are_declined_where_it_does_not() -> None:
    """``--model swa`` / ``hybrid`` reach the scheduler adapter with their window (its name says ``full+swa``); a
    release with no window declines both, which is a usage error naming why, never a run of full attention."""
    args = ["check", "--suite", "system", "--adapter", "sglang-system", *WINDOW_KINDS, "--examples", "3", "--json"]
    result = runner.invoke(app, [*args, "--jobs", "1"])
    if not _wires_a_window():
        assert result.exit_code == 2, result.output
        assert "no sliding-window model" in result.output, result.output
        return
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout[result.stdout.index("{") :])
    rows = {r["model"]: r for r in payload["results"]}
    assert set(rows) == {"swa", "hybrid"}, rows
    assert all(r["examples"] >= 1 and r["violation"] is None for r in rows.values()), rows
    assert "full+swa" in payload["adapter"], payload["adapter"]


def swa_release_dropped(config: Any) -> Any:
    """The installed release's scheduler adapter with SWA's lock release made a no-op: a window lock never lets go
    (``--adapter <this module>:swa_release_dropped``; a factory outside kvledger, as an engine author writes one)."""
    from kvledger.contracts.adapters.sglang.system_factory import installed_system_factory

    made = installed_system_factory(config)
    components = getattr(made.cache, "components", {})
    for kind, component in components.items():
        if kind.name == "SWA":
            component.release_component_lock = lambda *args, **kwargs: None
    return made


@pytest.mark.skipif(not _wires_a_window(), reason=f"a sliding window from SGLang 0.5.13; {installed_version_or_none()}")
def test_a_window_lock_that_never_lets_go_is_found_by_the_cli_in_the_swa_kind() -> None:
    """The same run, once through SGLang's own adapter and once through a factory whose SWA release does nothing:
    the first holds, the second exits 1 with a lock or leak law (found only in a kind with a window)."""
    common = ["check", "--suite", "system", "--model", "swa", "--seed", "1", "--examples", "30", "--json"]
    common += ["--shrink-for", "2s", "--jobs", "1"]
    control = runner.invoke(app, [*common, "--adapter", "sglang-system"])
    assert control.exit_code == 0, control.output
    planted = runner.invoke(app, [*common, "--adapter", f"{__name__}:swa_release_dropped"])
    assert planted.exit_code == 1, planted.output
    payload = json.loads(planted.stdout[planted.stdout.index("{") :])
    (v,) = payload["violations"]
    assert v["model"] == "swa" and re.search(r"lock_ref|leak", f"{v['rule']} {v.get('message', '')}"), v


@pytest.mark.skipif(installed_version_or_none() is None, reason="needs an SGLang release (.ci/sglang_env)")
def test_record_takes_the_window_kinds_to_the_scheduler_adapter(tmp_path: Any) -> None:
    """``kvledger record --system --adapter sglang-system --model swa`` records the scheduler with its window (the
    header says so) where the release wires one, and is a usage error naming the missing window where not."""
    out = tmp_path / "swa.jsonl"
    args = ["record", "--system", "--adapter", "sglang-system", "--model", "swa", "--ops", "60", "-o", str(out)]
    result = runner.invoke(app, args)
    if not _wires_a_window():
        assert result.exit_code == 2 and "cannot build the swa model" in result.output, result.output
        return
    assert result.exit_code == 0, result.output
    header = json.loads(out.read_text().splitlines()[0])
    assert header["config"]["window"] == 4 and "full+swa" in header["adapter"], header
