"""The command the docs give finds what the tests find: ``kvledger check --adapter`` on SGLang's own caches."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kvledger.contracts.adapters.sglang.cpu_import import unavailable_reason
from kvledger.contracts.cli import app

runner = CliRunner()


@pytest.mark.skipif(unavailable_reason("0.5.9") is not None, reason=str(unavailable_reason("0.5.9")))
def test_b1_in_sglang_0_5_9_mamba_is_found_by_the_cli() -> None:
    """A Mamba-only cache adapter is probed with a Mamba model kind, not refused for lacking full attention."""
    result = runner.invoke(app, ["check", "--adapter", "sglang-0.5.9-mamba", "--json"])
    assert result.exit_code == 1, result.output
    payload = json.loads(result.output[result.output.index("{") :])
    assert {v["rule"] for v in payload["violations"]} == {"inv_lru_detached"}, payload["violations"]
    skipped = [r for r in payload["results"] if r["violation"] is None]
    assert skipped and all(r["skipped"] for r in skipped)  # the kinds it cannot build are skipped, not failed


@pytest.mark.skipif(unavailable_reason("0.5.11") is not None, reason=str(unavailable_reason("0.5.11")))
def test_b5_in_sglang_0_5_11_is_found_by_the_cli_past_b1() -> None:
    """B1 first, in every kind; set aside, the same command goes on to B5 and prints a regression that sets it aside."""
    args = ["check", "--adapter", "sglang-0.5.11", "--model", "hybrid", "--json"]
    first = runner.invoke(app, args)
    assert first.exit_code == 1, first.output
    payload = json.loads(first.stdout[first.stdout.index("{") :])
    assert [v["rule"] for v in payload["violations"]] == ["inv_lru_detached"], payload["violations"]
    past = runner.invoke(app, [*args, "--set-aside", "inv_lru_detached"])
    assert past.exit_code == 1, past.output
    payload = json.loads(past.stdout[past.stdout.index("{") :])
    (v,) = [r["violation"] for r in payload["results"] if r["violation"] is not None]
    assert v["rule"] == "implementation crashed: AssertionError" and "lock_ref=0" in v["message"], v
    assert "set_aside(" in v["program"] and "cow=True" in v["program"], v["program"]
