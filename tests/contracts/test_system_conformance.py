"""The memory-manager machine passes on the reference and catches B2, B3, B4 (and their halves) by general laws."""

from __future__ import annotations

import pytest
from hypothesis import Phase, settings

from kvledger.contracts.machines.profiles import register_profiles
from kvledger.contracts.machines.runner import CheckResult, run_machine
from kvledger.contracts.machines.suites import SUITES, SYSTEM_MODELS
from kvledger.impl import faults, leaks
from kvledger.impl.session import Sessions

register_profiles()
FIND = settings(settings.get_profile("ci"), max_examples=300, phases=[Phase.explicit, Phase.generate])


def run(model: str, s: settings = FIND) -> CheckResult:
    return run_machine("system", model, SUITES["system"].models[model](), [], s)


@pytest.mark.parametrize("model", sorted(SYSTEM_MODELS))
def test_reference_memory_manager_conforms(model: str) -> None:
    result = run(model, settings.get_profile("ci"))
    assert result.ok, result.violation and result.violation.message
    assert result.examples >= 50


@pytest.mark.parametrize(("fault", "model"), [("B2", "mamba"), ("B3", "mamba"), ("B4", "full"), ("B4", "paged")])
def test_fault_is_caught_by_a_general_law(fault: str, model: str) -> None:
    with faults.injected(fault):
        result = run(model)
    assert result.violation is not None, f"{fault} not caught on {model}"
    assert result.violation.rule in faults.FAULTS[fault].laws, result.violation.message


def test_b3_close_half_alone_is_caught_by_ownership(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the leak on close (the idle check correct): the closed session still holds its Mamba slots."""
    monkeypatch.setattr(Sessions, "release_state", lambda self, slot: None)
    result = run("mamba")
    laws = ("inv_released_on_close", "inv_owners_account")  # NOTE: at the close itself, or at the next snapshot
    assert result.violation is not None and result.violation.rule in laws, result.violation


def test_b3_checker_half_alone_is_a_false_positive(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the idle check's hard-coded 0: the checker reports a leak the ledgers do not have."""
    monkeypatch.setattr(leaks, "session_mamba_refs", lambda slot: ())
    result = run("mamba")
    assert result.violation is not None and result.violation.rule == "leak checker agrees with the ledgers"


def test_checker_that_misses_a_leak_is_a_false_negative(monkeypatch: pytest.MonkeyPatch) -> None:
    """A checker that trusts tags (everything tagged counts as referenced) misses B4's leak."""
    real = leaks.check_leaks

    def blind(mm: object) -> leaks.LeakReport:
        report = real(mm)  # type: ignore[arg-type]
        report.findings = [f for f in report.findings if f.kind != "leaked"]
        for c in report.pools.values():
            c.waiting += c.capacity - c.accounted
        return report

    monkeypatch.setattr("kvledger.contracts.adapters.reference_system.check_leaks", blind)
    # NOTE: the release-on-close law would see B4's leak at a close first; this test is about the checker
    monkeypatch.setattr("kvledger.spec.session.inv_released_on_close", lambda ledgers, sid: True)
    with faults.injected("B4"):
        result = run("full")
    assert result.violation is not None and result.violation.rule == "leak checker agrees with the ledgers"


@pytest.mark.parametrize("model", ["full", "paged"])
def test_a_resume_that_trusts_every_committed_token_is_caught(monkeypatch: pytest.MonkeyPatch, model: str) -> None:
    """``repeat_sequence`` with ``branch`` and ``sid`` gives a session a turn that leaves its committed tokens: a
    resume that reuses all the committed KV (not only the common prefix) runs the turn on another token's KV. Found
    at ``kvledger check``'s default budget."""
    from kvledger.impl import session

    monkeypatch.setattr(session, "common_prefix", lambda a, b: len(b))  # BUG: the saved tokens taken as the turn's
    result = run(model, settings(settings.get_profile("check"), phases=[Phase.explicit, Phase.generate]))
    assert result.violation is not None, "a resume past the tokens the turn shares went unseen"
