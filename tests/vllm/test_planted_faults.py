"""Fresh bugs planted in vLLM's own objects are found by a shared-block law (tests/vllm runs inside a vLLM venv).

The faults are ``tests/benchmarks/bench_engine_faults.py``'s (the ``BlockPool``, its free queue, the managers'
tables; one call in three). Each runs the system machine on ``--adapter vllm`` at the ``check`` profile, seed 1,
beside the unplanted control: the fault must break one of the shared-block laws, and sooner than the control
breaks anything (0.6.6.post1's control breaks by its recorded finding, docs/vllm.md). Where a release asserts on
the fault's path, vLLM's own assert may come first; ``python -O tests/benchmarks/bench_engine_faults.py`` measures
the laws alone. On ``vllm`` (full attention) ``evict-keeps-hash`` meets vLLM's assert in the step the law would see
it on every release (``test_adapter.py`` shows the law first on a fixed program); on ``vllm-mamba`` (0.33.0 on) the
reused Mamba state, written in part, carries its old key and the law comes first.
"""

from __future__ import annotations

import sys
from functools import cache
from pathlib import Path

import pytest
from hypothesis import settings

from kvledger.contracts.adapters.protocol import Unsupported
from kvledger.contracts.adapters.vllm.cpu_import import installed_version_or_none, unavailable_reason
from kvledger.contracts.machines.profiles import register_profiles
from kvledger.contracts.machines.runner import CheckResult, run_machine
from kvledger.contracts.machines.shared_laws import SHARED_RULES
from kvledger.contracts.machines.system import RULES, machine_for_system

pytestmark = pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason()))

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_engine_faults as bench  # noqa: E402

register_profiles()
HAVE = installed_version_or_none()


def _v(version: str) -> tuple[int, ...]:
    return tuple(int("".join(c for c in p if c.isdigit()) or 0) for p in version.split("."))


def _run(adapter: str, fault: str | None) -> CheckResult:
    machine = machine_for_system(bench.factory(adapter, "full", fault, 3, frozenset()))
    profile = settings(settings.get_profile("check"))
    return run_machine("system", "full", machine, list(RULES), profile, seed=1, shrink_for=0.5)


@cache
def _control(adapter: str) -> CheckResult:
    return _run(adapter, None)


ASSERTS_FIRST: dict[tuple[str, str], tuple[str, str]] = {
    ("vllm", "queue-remove-drop"): ("0.6.6.post1", "0.8.0"),
}
"""``(adapter, fault) -> (first release, first release not)`` where vLLM's own assert comes before the laws, as
measured (docs/vllm.md: ``_get_new_blocks`` asserts that a block it pops off the free queue is unheld, before 0.8)."""


def _asserts_first(adapter: str, fault: str) -> bool:
    span = ASSERTS_FIRST.get((adapter, fault))
    return HAVE is not None and span is not None and _v(span[0]) <= _v(HAVE) < _v(span[1])


CASES = [("vllm", f) for f in sorted(set(bench.VLLM_FAULTS) - {"evict-keeps-hash"})]
CASES += [("vllm-mamba", f) for f in sorted(bench.VLLM_FAULTS)]


@pytest.mark.parametrize(("adapter", "fault"), CASES)
def test_a_planted_fault_breaks_a_shared_block_law(adapter: str, fault: str) -> None:
    try:
        bench.load_system_factory(adapter)(bench.MODELS["full"])
    except Unsupported as why:  # NOTE: vllm-mamba where the release has no Mamba prefix caching
        pytest.skip(str(why))
    if adapter == "vllm-mamba" and HAVE is not None and _v(HAVE) < _v("0.33.0"):
        pytest.skip(f"vLLM {HAVE}: the control breaks finding 2 (the null block's count) in its first program")
    control = _control(adapter)
    result = _run(adapter, fault)
    v = result.violation
    assert v is not None, f"{fault}: held for {result.examples} programs"
    if _asserts_first(adapter, fault):  # NOTE: the engine's catch, counted apart by the benchmark
        assert v.rule == "implementation crashed: AssertionError", f"{fault}: {v.rule}: {v.message}"
    else:
        assert v.rule in SHARED_RULES, f"{fault}: {v.rule}: {v.message}"
    if (adapter, fault) == ("vllm-mamba", "evict-keeps-hash"):
        assert v.rule == "inv_keys_match_content", v.message  # NOTE: the reused state, written in part, first
    assert control.violation is None or result.examples < control.examples, (fault, control.violation)


def test_the_fault_sites_exist_on_this_release() -> None:
    """Every fault shadows one of vLLM's own methods on this release (a renamed one would leave a run unplanted)."""
    for fault, plant in bench.VLLM_FAULTS.items():
        adapter = bench.load_system_factory("vllm")(bench.MODELS["full"])
        plant(adapter, bench.Every(3))
        objects = (adapter.pool, adapter._queue(), adapter.mgr)
        shadowed = [
            n for o in objects for n, v in vars(o).items() if callable(v) and callable(getattr(type(o), n, None))
        ]
        assert shadowed, fault


def _plant_free_forgets_lookahead(adapter: object) -> None:
    """``free`` forgets the blocks a request holds past its computed tokens (its lookahead and rejected drafts'
    blocks): they are dropped from the request's tables unreleased, so they stay counted with no holder."""
    size = adapter.block_size  # type: ignore[attr-defined]

    def make(call):  # type: ignore[no-untyped-def]
        def faulty(request, *args, **kwargs):  # type: ignore[no-untyped-def]
            keep = -(-request.num_computed_tokens // size)
            for _, tables in adapter._groups():  # type: ignore[attr-defined]
                table = tables.get(request.request_id)
                if table is not None and len(table) > keep:
                    del table[keep:]
            return call(request, *args, **kwargs)

        return faulty

    bench._wrap(adapter.mgr, "free", make)  # type: ignore[attr-defined]


def test_a_fault_only_speculative_decoding_reaches_is_found_with_drafts_and_not_without() -> None:
    """With drafts a request holds blocks past its computed tokens, so a ``free`` that forgets those leaks; without
    them (``speculative`` set aside) no request holds such a block (from 0.8, which preallocates none) and the same
    fault goes unseen for 40 programs. The drafts the system machine asks for are what lets the laws see this class."""
    if "speculative" not in bench.load_system_factory("vllm")(bench.MODELS["full"]).capabilities:
        pytest.skip(f"vLLM {HAVE} decodes no drafts (0.7 on)")

    def run(aside: frozenset[str]) -> CheckResult:
        def make():  # type: ignore[no-untyped-def]
            adapter = bench.factory("vllm", "full", None, 3, aside)()
            _plant_free_forgets_lookahead(adapter)
            return adapter

        # NOTE: 40 programs: the drafts' run breaks by its 5th, so a blind run that holds 8 times as long is a contrast
        profile = settings(settings.get_profile("check"), max_examples=40)
        return run_machine("system", "full", machine_for_system(make), list(RULES), profile, seed=1, shrink_for=0.5)

    found = run(frozenset())
    assert found.violation is not None and found.violation.rule == "inv_refcount_counts_holders", found.violation
    assert "0 holder(s)" in found.violation.message, found.violation.message
    blind = run(frozenset({"speculative"}))
    # NOTE: 0.7.x preallocates blocks past the computed tokens itself (``num_preallocate_blocks``): there the fault
    # is visible without drafts too
    preallocates = getattr(bench.load_system_factory("vllm")(bench.MODELS["full"]).mgr, "num_preallocate_blocks", 0)
    if preallocates:
        assert blind.violation is not None and blind.violation.rule == "inv_refcount_counts_holders", blind.violation
    else:
        assert blind.violation is None, blind.violation
