"""Turn a shrunk counterexample into a ready-to-paste pytest regression module.

The module replays the exact program Hypothesis printed against the same
suite and model, on the reference implementation or on the adapter that was
checked (``kvledger check --adapter``): the same file either way. With
faults on, one test shows the program fails with them (naming the law) and
one that it passes without; with none, a single test replays the program and
fails until the law holds again.
"""

from __future__ import annotations

import re
import textwrap

from kvledger.contracts.machines.fair import SCHEDULE

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
        if inside and (line.startswith("state.") or re.match(r"^\w+ = state\.", line)):
            if line.startswith(f"state.{SCHEDULE}("):
                continue  # NOTE: how the example was scheduled (drawn by the runner), not a call of the machine's
            out.append(line)
            if line == "state.teardown()":
                break
    return out


def _raises(rule: str, laws: list[str]) -> str:
    """The ``pytest.raises`` call that the failing program must trip: the law's assertion, or the crash."""
    if rule.startswith(("implementation crashed:", "hang", "flaky:")):
        return "pytest.raises(Exception)"
    pattern = "|".join(re.escape(law) for law in laws)
    return f'pytest.raises(AssertionError, match=r"{pattern}")'


def render(
    suite: str,
    model: str,
    faults: list[str],
    rule: str,
    lines: list[str],
    adapter: str | None = None,
    set_aside: frozenset[str] = frozenset(),
) -> str:
    """Source of a pytest module that replays ``lines`` on ``suite``/``model`` (with and without ``faults``).

    ``adapter``: the ``--adapter`` spec the program ran on (``None``: the reference implementation), with
    the capabilities ``set_aside`` (``--set-aside``) taken from it.
    """
    tag = "_".join(f.lower() for f in faults) or re.sub(r"\W+", "_", rule).strip("_").lower()[:40] or "found"
    name = re.sub(r"\W", "_", f"{tag}_{suite}_{model}")
    body = textwrap.indent("\n".join(lines) or "pass", "    ")
    from kvledger.impl.faults import FAULTS

    # NOTE: with contracts on, an incremental contract may name a sibling law of the same family first.
    laws = list(dict.fromkeys([rule, *(law for f in faults if f in FAULTS for law in FAULTS[f].laws)]))
    flags = "".join(f" --fault {f}" for f in faults) + (f" --adapter {adapter}" if adapter else "")
    flags += "".join(f" --set-aside {c}" for c in sorted(set_aside))

    def made(factory: str) -> str:
        return f"set_aside({factory}, frozenset({sorted(set_aside)!r}))" if set_aside else factory

    aside = "\nfrom kvledger.contracts.adapters.protocol import set_aside" if set_aside else ""
    if adapter is None:
        imports = "from kvledger.contracts.machines.suites import SUITES"
        machine = f"SUITES[{suite!r}].models[{model!r}]()"
    elif suite == "system":
        imports = (
            "from kvledger.contracts.adapters.system import load_system_factory\n"
            "from kvledger.contracts.machines.suites import ENGINE_SYSTEM_CONFIGS\n"
            "from kvledger.contracts.machines.system import machine_for_system" + aside
        )
        built = made(f"load_system_factory({adapter!r})(ENGINE_SYSTEM_CONFIGS[{model!r}])")
        machine = f"machine_for_system(lambda: {built})"
    else:
        imports = (
            "from kvledger.contracts.adapters.protocol import load_factory\n"
            "from kvledger.contracts.machines.cache import machine_for_cache\n"
            "from kvledger.contracts.machines.suites import CACHE_MODELS" + aside
        )
        machine = f"machine_for_cache(lambda: {made(f'load_factory({adapter!r})(CACHE_MODELS[{model!r}])')})"
    if faults:
        fault_args = ", ".join(repr(f) for f in faults)
        tests = f"""def test_{name}_fails_with_fault() -> None:
    with faults.injected({fault_args}), {_raises(rule, laws)}:
        program({machine}())


def test_{name}_passes_without_fault() -> None:
    program({machine}())
"""
        imports = f"import pytest\n\n{imports}\nfrom kvledger.impl import faults"
    else:
        tests = f'''def test_{name}() -> None:
    """Fails until the law holds again: {rule}."""
    program({machine}())
'''
    return f'''"""Regression from `kvledger check --suite {suite} --model {model}{flags}`: {rule}."""

{imports}
from kvledger.spec.types import Component, Owner, OwnerKind  # noqa: F401  (names the printout may use)


def program(state) -> None:  # type: ignore[no-untyped-def]
{body}


{tests}'''
