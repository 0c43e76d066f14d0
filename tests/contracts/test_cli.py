"""The `kvledger` command: exit codes, JSON, faults, adapters, bad arguments."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kvledger.contracts.adapters.protocol import CacheConfig, Unsupported
from kvledger.contracts.adapters.reference import ReferenceAdapter
from kvledger.contracts.cli import app

runner = CliRunner()


def invoke(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.output


def test_check_passes_and_prints_json() -> None:
    code, out = invoke("check", "--suite", "pools", "--model", "token", "--examples", "5", "--json")
    assert code == 0, out
    data = json.loads(out[out.index("{") :])
    assert data["ok"] and data["adapter"] == "kvledger-reference" and data["violations"] == []
    assert data["results"][0]["examples"] >= 5 and "inv_slots_conserved" in data["rules_checked"]


def test_fault_exits_1_with_rule_program_and_regression() -> None:
    code, out = invoke("check", "--fault", "B1", "--model", "full", "--examples", "30")
    assert code == 1, out
    assert (
        "inv_lru_detached" in out
        and "shrunk counterexample" in out
        and "def test_b1_cache_full_fails_with_fault" in out
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("check", "--suite", "nope"), "unknown suite 'nope'"),
        (("check", "--model", "nope"), "unknown model 'nope'"),
        (("check", "--fault", "B9"), "unknown fault 'B9'"),
        (("check", "--profile", "slowest"), "unknown profile 'slowest'"),
        (("check", "--contracts", "loud"), "unknown contract tier 'loud'"),
        (("check", "--adapter", "no_such_module:f"), "cannot import no_such_module"),
        (("check", "--adapter", "nocolon"), "package.module:factory"),
        (("check", "--examples", "0"), ""),
    ],
)
def test_bad_arguments_exit_2(args: tuple[str, ...], message: str) -> None:
    code, out = invoke(*args)
    assert code == 2, out
    assert message in out


def test_faults_lists_every_fault() -> None:
    code, out = invoke("faults")
    assert code == 0
    for name in ("B1", "B2", "B3", "B4", "B5"):
        assert name in out


class BlindAdapter(ReferenceAdapter):
    """An engine adapter that cannot observe LRU links or lock counters."""

    name = "blind-engine"
    version = "9.9"
    capabilities = frozenset({"ledgers", "content", "sizes"})


def blind_factory(config: CacheConfig) -> BlindAdapter:
    if config.window is not None:
        raise Unsupported("no sliding window")
    return BlindAdapter(config)


def test_adapter_rules_it_cannot_express_are_reported_skipped() -> None:
    code, out = invoke(
        "check",
        "--adapter",
        f"{__name__}:blind_factory",
        "--model",
        "full",
        "--model",
        "swa",
        "--examples",
        "5",
        "--json",
    )
    assert code == 0, out
    data = json.loads(out[out.index("{") :])
    assert data["adapter"] == "blind-engine" and data["adapter_version"] == "9.9"
    full, swa = data["results"]
    assert "inv_lru_detached" in full["skipped"] and "inv_lock_ref_counts_handles" in full["skipped"]
    assert "inv_lru_detached" not in full["rules"]
    assert swa["skipped"] and "not supported" in swa["skipped"][0] and swa["examples"] == 0


def test_an_adapter_that_builds_only_some_model_kinds_is_probed_with_those() -> None:
    """A factory refusing full attention (a Mamba-only cache) is not a usage error: its kinds are checked."""

    def mamba_only(config: CacheConfig) -> ReferenceAdapter:
        if not config.mamba:
            raise Unsupported("needs a Mamba config")
        return ReferenceAdapter(config)

    import sys
    import types

    mod = types.ModuleType("kvledger_test_mamba_only")
    mod.factory = mamba_only  # type: ignore[attr-defined]
    sys.modules[mod.__name__] = mod
    try:
        result = runner.invoke(app, ["check", "--adapter", f"{mod.__name__}:factory", "--examples", "3", "--json"])
        assert result.exit_code == 0, result.output
        payload = json.loads(result.output[result.output.index("{") :])
        checked = {r["model"] for r in payload["results"] if r["rules"]}
        assert checked == {"mamba", "hybrid"}, payload["results"]
        refused = runner.invoke(app, ["check", "--adapter", f"{mod.__name__}:factory", "--model", "full"])
        assert refused.exit_code == 2 and "needs a Mamba config" in refused.output
    finally:
        del sys.modules[mod.__name__]
