"""The kvledger pytest plugin inside someone else's suite (pytester): the checked cache and conformance_test."""

from __future__ import annotations

import pytest

# NOTE: pytester's in-process runs drop the modules first imported inside them; importing these
# here keeps one copy of each, so a fault switched on inside one run patches the classes the
# next run uses (otherwise a filtered run, e.g. -k, sees two Sessions classes).
import kvledger.impl.faults
import kvledger.impl.session  # noqa: F401

DRIVE = """
def drive(cache):
    a = cache.adapter
    key = (1, 2, 3, 4)
    slots = a.alloc_kv(1, 4)
    a.write_kv(slots, key, 0)
    state = a.alloc_mamba(1) if cache.config.mamba else None
    a.insert(1, key, slots, state)
    m, h = a.lock(key + (5,))
    a.unlock(h)
    from kvledger.spec.types import Component
    a.evict(Component.FULL, 4) if not cache.config.mamba else None
    return m
"""


def test_fixture_default_and_marker(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        DRIVE
        + """
import pytest

def test_default(kvledger_cache):
    assert kvledger_cache.config.kind == "full"
    assert drive(kvledger_cache).length == 4

@pytest.mark.kvledger_cache(model="hybrid", kv_tokens=64)
def test_marker(kvledger_cache):
    assert kvledger_cache.config.window == 2 and kvledger_cache.config.mamba
    assert kvledger_cache.config.kv_tokens == 64
    assert drive(kvledger_cache).mamba is not None

@pytest.mark.kvledger_cache(page_size=2)
def test_paged(kvledger_cache):
    assert kvledger_cache.config.page_size == 2
    drive(kvledger_cache)
"""
    )
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=3)


def test_ini_model_and_bad_marker(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nkvledger_cache_model = swa\n")
    pytester.makepyfile(
        """
import pytest

def test_ini(kvledger_cache):
    assert kvledger_cache.config.window == 2

@pytest.mark.kvledger_cache(colour="red")
def test_bad(kvledger_cache):
    pass
"""
    )
    res = pytester.runpytest("-p", "no:cacheprovider")
    res.assert_outcomes(passed=1, errors=1)
    res.stdout.fnmatch_lines(["*unknown fields*colour*"])


def test_teardown_catches_a_fault(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        DRIVE
        + """
from kvledger.impl import faults

def test_b1(kvledger_cache):
    with faults.injected("B1"):
        drive(kvledger_cache)
"""
    )
    res = pytester.runpytest("-p", "no:cacheprovider")
    res.assert_outcomes(passed=1, errors=1)
    res.stdout.fnmatch_lines(["*kvledger_cache laws broken*", "*inv_lru_detached*"])


def test_conformance_test_helper(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
from kvledger.contracts.pytest_plugin import conformance_test

test_reference = conformance_test(
    "kvledger.contracts.adapters.reference:ReferenceAdapter", models=("full", "hybrid"), max_examples=3, steps=10
)
"""
    )
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)


def test_conformance_test_schedules_its_machine_fairly(monkeypatch: pytest.MonkeyPatch) -> None:
    """The helper runs the machine ``kvledger check`` runs: scheduled fairly (``fair``'s schedule step), so a rule
    that Hypothesis' draws favour does not starve the others in a user's suite either."""
    import hypothesis.stateful

    from kvledger.contracts.machines.fair import SCHEDULE
    from kvledger.contracts.pytest_plugin import conformance_test

    ran: list[type] = []
    monkeypatch.setattr(hypothesis.stateful, "run_state_machine_as_test", lambda machine, settings: ran.append(machine))
    conformance_test("kvledger.contracts.adapters.reference:ReferenceAdapter", models=("full", "hybrid"))()
    assert len(ran) == 2
    assert all(hasattr(machine, SCHEDULE) for machine in ran)


def test_plugin_options_still_there(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x():\n    pass\n")
    res = pytester.runpytest("-p", "no:cacheprovider", "--kvledger-contracts=on", "--kvledger-profile=dev")
    res.assert_outcomes(passed=1)
    res.stdout.fnmatch_lines(["kvledger: contracts on"])


def test_adapter_option_adds_a_test(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nkvledger_conformance_examples = 2\n")
    pytester.makepyfile("def test_x():\n    pass\n")
    res = pytester.runpytest(
        "-p", "no:cacheprovider", "--kvledger-adapter", "reference", "--kvledger-profile=dev", "-v"
    )
    res.assert_outcomes(passed=2)
    res.stdout.fnmatch_lines(["*kvledger_conformance*reference*PASSED*"])
    bad = pytester.runpytest("-p", "no:cacheprovider", "--kvledger-adapter", "nowhere")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR


MEMORY = """
import pytest
from kvledger.impl import faults

def turns(m):
    rec = m.recorder
    rec.open_session(1)
    first = rec.add_request((1, 2, 3, 4), 1)
    assert rec.admit(first, 64)
    rec.end("finish", first)
    second = rec.add_request((1, 2, 3, 4, 5), 1)
    assert rec.admit(second, 64)
    rec.end("finish", second)
    rec.close_session(1)

@pytest.mark.kvledger_memory(model="mamba")
def test_clean(kvledger_memory):
    turns(kvledger_memory)
    assert not kvledger_memory.mm.sessions.slots

@pytest.mark.kvledger_memory(model="mamba")
def test_b3(kvledger_memory):
    with faults.injected("B3"):
        turns(kvledger_memory)

@pytest.mark.kvledger_memory(model="nope")
def test_bad_model(kvledger_memory):
    pass
"""


def test_memory_fixture_checks_the_system_trace(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(MEMORY)
    res = pytester.runpytest("-p", "no:cacheprovider")
    res.assert_outcomes(passed=2, errors=2)
    res.stdout.fnmatch_lines(["*kvledger_memory laws broken*", "*inv_owners_account*close_session*"])
    res.stdout.fnmatch_lines(["*unknown model 'nope'*"])


# ---------------------------------------------------------------- inactive: costs nothing; bad settings: usage errors

HEAVY = ("torch", "hypothesis", "icontract", "numpy")

REPORT_MODULES = f"""
import sys

def pytest_sessionfinish(session):
    heavy = sorted(m for m in {HEAVY!r} if m in sys.modules)
    print("\\nHEAVY=" + ",".join(heavy))
"""


def test_inactive_plugin_imports_nothing_heavy(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KVLEDGER_CONTRACTS", raising=False)
    monkeypatch.delenv("KVLEDGER_HYPOTHESIS_PROFILE", raising=False)
    pytester.makeconftest(REPORT_MODULES)
    pytester.makepyfile("def test_x():\n    pass\n")
    res = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-s")
    res.assert_outcomes(passed=1)
    res.stdout.fnmatch_lines(["kvledger: contracts off", "HEAVY="])
    on = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-s", "--kvledger-contracts=on")
    on.stdout.fnmatch_lines(["kvledger: contracts on", "HEAVY=*torch*"])  # the same probe sees them when asked


@pytest.mark.parametrize(
    ("env", "value", "message"),
    [
        (
            "KVLEDGER_CONTRACTS",
            "bogus",
            "KVLEDGER_CONTRACTS='bogus': unknown contract tier; expected one of off, on, slow",
        ),
        (
            "KVLEDGER_HYPOTHESIS_PROFILE",
            "thorogh",
            "KVLEDGER_HYPOTHESIS_PROFILE='thorogh': unknown Hypothesis profile; "
            "expected one of check, ci, thorough, dev",
        ),
    ],
)
def test_bad_environment_is_a_usage_error(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, env: str, value: str, message: str
) -> None:
    monkeypatch.setenv(env, value)
    pytester.makepyfile("def test_x():\n    pass\n")
    res = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    res.stderr.fnmatch_lines([f"ERROR: {message}"])
    assert "INTERNALERROR" not in res.stdout.str() + res.stderr.str()
    assert "Traceback" not in res.stdout.str() + res.stderr.str()


def test_profile_from_environment_is_loaded(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVLEDGER_HYPOTHESIS_PROFILE", "thorough")
    pytester.makepyfile(
        "from hypothesis import settings\n\ndef test_x():\n    assert settings.default.max_examples == 1000\n"
    )
    pytester.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(passed=1)


@pytest.mark.parametrize(
    ("ini", "message"),
    [
        ("kvledger_conformance_examples = ten", "kvledger_conformance_examples = 'ten': expected a whole number"),
        ("kvledger_conformance_examples = 0", "kvledger_conformance_examples = '0': expected a whole number"),
        ("kvledger_cache_model = fulll", "kvledger_cache_model = 'fulll': unknown model; expected one of full"),
    ],
)
def test_bad_ini_is_a_usage_error(pytester: pytest.Pytester, ini: str, message: str) -> None:
    pytester.makeini(f"[pytest]\n{ini}\n")
    pytester.makepyfile("def test_x():\n    pass\n")
    res = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    res.stderr.fnmatch_lines([f"ERROR: {message}*"])
