"""Suite-wide set-up: kvledger's Hypothesis profiles, ``ci`` by default (derandomised).

Contracts are switched on by ``--kvledger-contracts=on`` in pyproject's
``addopts`` (the plugin attaches them before any test module is imported).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import settings

from kvledger.contracts.machines.profiles import register_profiles

pytest_plugins = ["pytester"]  # the plugin's own tests (tests/trace) run child suites

register_profiles()
settings.load_profile(os.environ.get("KVLEDGER_HYPOTHESIS_PROFILE", "ci"))

TEST_SHRINK_SECONDS = 60.0
"""How long a failure found inside a test may shrink: ``kvledger check``'s default bound (``--shrink-for``), for the
machines a test runs itself. A test that expects a machine to fail asserts which law it names, and a shrink cut
short still names it: without this bound one such test shrank for Hypothesis' whole five minutes. A test that
asserts the shape of the shrunk program is marked ``full_shrink`` and shrinks without the bound."""


@pytest.fixture
def contracts_on() -> Iterator[None]:
    """Contracts at tier ``on`` for the test (whatever the run's tier), the run's tier back after it."""
    from kvledger.contracts import bindings

    saved = bindings.current_level()
    bindings.install("on")
    yield
    bindings.install(saved)


@pytest.fixture(autouse=True)
def _own_constants_only(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every test draws with Hypothesis' "local constants" fixed to kvledger's own (``stable.fixed_constants``, as
    every machine run is): without it, which constants a test's examples may draw depends on which test modules the
    pytest process loaded before, and a derandomised test that passes alone can draw other examples, and miss its
    bug, in the whole suite (issue 19: two detection tests did so in CI). A test marked ``local_constants`` (one of
    ``fixed_constants`` itself) runs with Hypothesis' own."""
    from kvledger.contracts.machines.stable import fixed_constants

    if request.node.get_closest_marker("local_constants") is not None:
        yield
        return
    with fixed_constants():
        yield


@pytest.fixture(autouse=True)
def _bounded_shrinking(request: pytest.FixtureRequest) -> Iterator[None]:
    from hypothesis.internal.conjecture import engine

    if request.node.get_closest_marker("full_shrink") is not None:
        yield
        return
    saved = engine.MAX_SHRINKING_SECONDS
    engine.MAX_SHRINKING_SECONDS = TEST_SHRINK_SECONDS  # type: ignore[assignment]
    try:
        yield
    finally:
        engine.MAX_SHRINKING_SECONDS = saved


# ---------------------------------------------------------------- hand-breaks of a shared-pool system trace
# (used by tests/trace/test_shared_trace.py on a toy engine's traces and tests/vllm/test_traces.py on vLLM's)

Lines = list[str]


@dataclass(frozen=True)
class SharedBreak:
    """A hand-break of a recorded system trace of a shared pool: ``apply(lines) -> (broken lines, block, holder)``
    (the block and the holder the replay's verdict must name), and the laws that verdict may cite."""

    apply: Callable[[Lines], tuple[Lines, int, str]]
    laws: frozenset[str]


def _events(lines: Lines) -> list[dict[str, Any]]:
    return [json.loads(t) for t in lines[1:]]


def _renumbered(lines: Lines) -> Lines:
    return [lines[0], *(json.dumps({**json.loads(t), "step": i}) for i, t in enumerate(lines[1:], 1))]


def _sentinels(lines: Lines) -> set[int]:
    return {b for pairs in json.loads(lines[0]).get("shared", {}).values() for b, _ in pairs}


def drop_a_leave(lines: Lines) -> tuple[Lines, int, str]:
    """The first ``leave`` of a non-sentinel block loses that block: its holder keeps it."""
    skip = _sentinels(lines)
    for i, ev in enumerate(_events(lines), 1):
        block = next((b for b in ev.get("blocks", ()) if b not in skip), None) if ev["op"] == "leave" else None
        if block is not None:
            rest = list(ev["blocks"])
            rest.remove(block)
            out = [*lines[:i], *([json.dumps({**ev, "blocks": rest})] if rest else []), *lines[i + 1 :]]
            return _renumbered(out), block, ev["holder"]
    raise AssertionError("no leave event of a non-sentinel block")


def count_off_by_one(lines: Lines) -> tuple[Lines, int, str]:
    """The first count of a held non-sentinel block reads one more."""
    skip = _sentinels(lines)
    holders: dict[int, str] = {}
    for i, ev in enumerate(_events(lines), 1):
        if ev["op"] == "join":
            holders.update(dict.fromkeys(ev["blocks"], ev["holder"]))
        block = next((b for b, c in ev["counts"] if c > 0 and b not in skip), None) if ev["op"] == "count" else None
        if block is not None:
            counts = [[b, c + 1 if b == block else c] for b, c in ev["counts"]]
            return [*lines[:i], json.dumps({**ev, "counts": counts}), *lines[i + 1 :]], block, holders[block]
    raise AssertionError("no count event of a held block")


def free_while_held(lines: Lines) -> tuple[Lines, int, str]:
    """At the end of the first call that gives a holder a non-sentinel block, that block goes back onto the queue."""
    skip = _sentinels(lines)
    events = _events(lines)
    for i, ev in enumerate(events, 1):
        block = next((b for b in ev.get("blocks", ()) if b not in skip), None) if ev["op"] == "join" else None
        if block is not None:
            end = next((j for j in range(i + 1, len(lines)) if events[j - 1]["op"] == "call"), len(lines))
            freed = {"step": 0, "op": "queue", "pool": ev["pool"], "joined": [block], "left": []}
            return _renumbered([*lines[:end], json.dumps(freed), *lines[end:]]), block, ev["holder"]
    raise AssertionError("no join event of a non-sentinel block")


@pytest.fixture(scope="session")
def shared_breaks() -> dict[str, SharedBreak]:
    """The three hand-breaks of a shared-pool system trace, by name."""
    return {
        "a holder dropped": SharedBreak(drop_a_leave, frozenset({"inv_refcount_counts_holders", "inv_owners_account"})),
        "a counter off by one": SharedBreak(count_off_by_one, frozenset({"inv_refcount_counts_holders"})),
        "a block freed while held": SharedBreak(free_while_held, frozenset({"inv_free_iff_unheld"})),
    }
