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
