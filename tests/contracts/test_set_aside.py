"""``kvledger check --adapter ... --set-aside NAME``: look past a finding already filed; say what went unchecked."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from kvledger.contracts.adapters.protocol import RULES_NEEDING, capabilities_named, set_aside
from kvledger.contracts.adapters.reference import ReferenceAdapter
from kvledger.contracts.adapters.system import SYSTEM_RULES_NEEDING
from kvledger.contracts.cli import app
from kvledger.contracts.machines.regression import render
from kvledger.contracts.machines.suites import CACHE_MODELS

runner = CliRunner()


def test_a_name_is_a_capability_or_one_of_its_laws() -> None:
    assert capabilities_named("lru", RULES_NEEDING) == {"lru"}
    assert capabilities_named("inv_lru_detached", RULES_NEEDING) == {"lru"}
    assert capabilities_named("double_dec_lock_ref", RULES_NEEDING) == {"rejects_double_unlock"}
    assert capabilities_named("inv_sizes", RULES_NEEDING) == {"locks", "sizes"}  # a law two capabilities need
    assert capabilities_named("no_such_law", RULES_NEEDING) == frozenset()
    assert capabilities_named("sessions", SYSTEM_RULES_NEEDING) == {"sessions"}


def test_set_aside_narrows_the_adapter_it_is_given() -> None:
    a = ReferenceAdapter(CACHE_MODELS["hybrid"])
    before = frozenset(a.capabilities)
    assert set_aside(a, frozenset({"lru"})) is a
    assert a.capabilities == before - {"lru"} and "lru" in before


def test_the_laws_set_aside_are_reported_skipped() -> None:
    args = ["check", "--adapter", "reference", "--model", "swa", "--examples", "3", "--json"]
    plain = runner.invoke(app, args)
    aside = runner.invoke(app, [*args, "--set-aside", "inv_lru_detached"])
    assert plain.exit_code == 0 and aside.exit_code == 0, aside.output
    skipped = json.loads(aside.stdout[aside.stdout.index("{") :])["results"][0]["skipped"]
    assert {"inv_lru_detached", "inv_lru_links_symmetric", "inv_lru_members"} <= set(skipped)
    assert "inv_lru_detached" not in json.loads(plain.stdout[plain.stdout.index("{") :])["results"][0]["skipped"]
    assert "set aside (not checked): lru" in aside.stderr


def test_set_aside_is_a_usage_error_without_an_adapter_or_with_an_unknown_name() -> None:
    no_adapter = runner.invoke(app, ["check", "--set-aside", "lru"])
    assert no_adapter.exit_code == 2 and "--set-aside" in no_adapter.stderr
    unknown = runner.invoke(app, ["check", "--adapter", "reference", "--set-aside", "inv_lru_detatched"])
    assert unknown.exit_code == 2 and "inv_lru_detatched" in unknown.stderr and "lru" in unknown.stderr


def test_the_regression_file_sets_the_same_laws_aside() -> None:
    src = render(
        "cache", "hybrid", [], "inv_x", ["state.inv_all_laws()"], adapter="reference", set_aside=frozenset({"lru"})
    )
    assert "--set-aside lru" in src and "set_aside(load_factory('reference')(CACHE_MODELS['hybrid'])" in src
    namespace: dict[str, object] = {}
    exec(compile(src, "<regression>", "exec"), namespace)  # the file it prints runs
    test = namespace["test_inv_x_cache_hybrid"]
    assert callable(test)
    test()
