"""Turn a shrunk counterexample into a ready-to-paste pytest regression module.

The module replays the exact program Hypothesis printed against the same
suite and model: one test shows it fails with the fault on (naming the law),
one that it passes with the fault off.
"""

from __future__ import annotations

import re
import textwrap

_MACHINE_LINE = re.compile(r"^state = \w+\(\)$")


def program_lines(notes: str) -> list[str]:
    """The statements of a printed failing program, without the machine's construction line."""
    out: list[str] = []
    inside = False
    for raw in notes.splitlines():
        line = raw.strip()
        if _MACHINE_LINE.match(line):
            inside = True
            continue
        if "zz_count_step" in line:
            continue
        if inside and (line.startswith("state.") or re.match(r"^\w+ = state\.", line)):
            out.append(line)
            if line == "state.teardown()":
                break
    return out


def render(suite: str, model: str, faults: list[str], rule: str, lines: list[str]) -> str:
    """Source of a pytest module that replays ``lines`` on ``suite``/``model`` with and without ``faults``."""
    tag = "_".join(f.lower() for f in faults) or "found"
    name = f"{tag}_{suite}_{model}".replace("-", "_")
    body = textwrap.indent("\n".join(lines) or "pass", "    ")
    fault_args = ", ".join(repr(f) for f in faults)
    # NOTE: with contracts on, an incremental contract may name a sibling law of the same family first.
    from kvledger.impl.faults import FAULTS

    laws = dict.fromkeys([rule, *(law for f in faults if f in FAULTS for law in FAULTS[f].laws)])
    pattern = "|".join(laws)  # law names are words, spaces and underscores: no regex metacharacters
    flag = " ".join(f"--fault {f}" for f in faults)
    return f'''"""Regression from `kvledger check --suite {suite} --model {model} {flag}`: {rule}."""

import pytest

from kvledger.contracts.machines.suites import SUITES
from kvledger.impl import faults
from kvledger.spec.types import Component, Owner, OwnerKind  # noqa: F401  (names the printout may use)


def program(state) -> None:  # type: ignore[no-untyped-def]
{body}


def test_{name}_fails_with_fault() -> None:
    with faults.injected({fault_args}), pytest.raises(AssertionError, match=r"{pattern}"):
        program(SUITES[{suite!r}].models[{model!r}]()())


def test_{name}_passes_without_fault() -> None:
    program(SUITES[{suite!r}].models[{model!r}]()())
'''
