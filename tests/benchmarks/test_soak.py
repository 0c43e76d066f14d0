"""The soak script keeps its promise: the leak check runs after every ``check_every``-th op, whatever the op did."""

from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path
from types import ModuleType

import pytest

from kvledger.impl.memory import MemoryManager
from kvledger.spec.errors import InvalidArgument


def load(name: str) -> ModuleType:
    """Import ``tests/benchmarks/<name>.py`` (not a package) under a private module name."""
    spec = importlib.util.spec_from_file_location(f"kvledger_{name}", Path(__file__).parent / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_periodic_check_runs_exactly_ops_over_check_every() -> None:
    soak = load("soak")
    ticks: list[tuple[int, int, int]] = []
    result = soak.soak(60, 1, True, 0, 7, lambda done, checks, leaky: ticks.append((done, checks, leaky)))
    assert result["periodic_checks"] == 60 // 7
    assert [t[0] for t in ticks] == [7 * k for k in range(1, 60 // 7 + 1)]
    assert [t[1] for t in ticks] == list(range(1, 60 // 7 + 1))


@pytest.mark.parametrize("how", ["returns early", "raises"])
def test_an_op_that_ends_early_does_not_skip_the_check(monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    soak = load("soak")

    def busy(mm: MemoryManager, rng: random.Random, prompts: list[tuple[int, ...]]) -> None:
        if how == "raises":
            raise InvalidArgument("busy", "kv", (), "the session's turn is still running")

    monkeypatch.setattr(soak, "one_op", busy)
    result = soak.soak(10, 1, False, 0, 3)
    assert result["periodic_checks"] == 3 and result["idle_check_ok"]
