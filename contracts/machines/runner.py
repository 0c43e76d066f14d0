"""Run conformance state machines and turn the outcome into a result a person or a program can read.

Used by ``kvledger check`` and by tests. A run counts its examples and
steps, times itself, and on failure keeps the violated law and the shrunk
counterexample (the numbered operations Hypothesis printed).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from random import Random
from typing import Any

import hypothesis.core
from hypothesis import settings as Settings
from hypothesis.database import ExampleDatabase
from hypothesis.errors import Flaky
from hypothesis.stateful import RuleBasedStateMachine, invariant, run_state_machine_as_test

from kvledger.contracts.machines.regression import program_lines

_STEP = re.compile(r"^(?:\w+ = )?state\.(\w+)\((.*)\)$")
_NOISE = ("inv_", "teardown")


@dataclass
class Violation:
    """The first broken law of a run and its shrunk counterexample."""

    rule: str
    message: str
    steps: list[str]
    program: str

    @property
    def length(self) -> int:
        return len(self.steps)


@dataclass
class CheckResult:
    """One checked (suite, model) pair."""

    suite: str
    model: str
    rules: list[str]
    examples: int = 0
    steps: int = 0
    seconds: float = 0.0
    violation: Violation | None = None
    skipped: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.violation is None

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["ok"] = self.ok
        if self.violation is not None:
            out["violation"]["length"] = self.violation.length
        return out


class Scoped(ExampleDatabase):
    """``inner`` with every key under ``scope`` (one database shared by many machines keeps their examples apart)."""

    def __init__(self, inner: ExampleDatabase, scope: bytes) -> None:
        super().__init__()
        self.inner, self.scope = inner, scope

    def save(self, key: bytes, value: bytes) -> None:
        self.inner.save(self.scope + key, value)

    def fetch(self, key: bytes) -> Iterable[bytes]:
        return self.inner.fetch(self.scope + key)

    def delete(self, key: bytes, value: bytes) -> None:
        self.inner.delete(self.scope + key, value)

    def move(self, src: bytes, dest: bytes, value: bytes) -> None:
        self.inner.move(self.scope + src, self.scope + dest, value)


def counted(machine: type[RuleBasedStateMachine]) -> tuple[type[RuleBasedStateMachine], dict[str, int]]:
    """A subclass of ``machine`` that counts examples (machines built) and steps (rules run)."""
    counts = {"examples": 0, "checks": 0}

    class Counted(machine):  # type: ignore[valid-type,misc]
        def __init__(self) -> None:
            counts["examples"] += 1
            super().__init__()

        @invariant()
        def zz_count_step(self) -> None:
            counts["checks"] += 1

    Counted.__name__ = machine.__name__
    Counted.__qualname__ = machine.__qualname__
    return Counted, counts


def parse_counterexample(text: str) -> list[str]:
    """The operations of a printed failing program, without invariant checks."""
    steps = []
    for line in text.splitlines():
        m = _STEP.match(line.strip())
        if m and not m.group(1).startswith(_NOISE) and m.group(1) != "zz_count_step":
            steps.append(f"{m.group(1)}({m.group(2)})")
    return steps


def rule_of(message: str) -> str:
    """The law a failure message names: the ``inv_*``/law text before the first colon.

    An icontract violation starts with a ``File ..., line N in ...:`` line; its
    law is the contract's description on the next line.
    """
    lines = message.strip().splitlines() or ["unknown"]
    first = lines[1] if lines[0].startswith("File ") and len(lines) > 1 else lines[0]
    return first.split(":", 1)[0].strip()[:120]


def _where(err: BaseException) -> str:
    tb = err.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return f"{tb.tb_frame.f_code.co_filename.rsplit('/', 1)[-1]}:{tb.tb_lineno}" if tb is not None else "?"


def run_machine(
    suite: str,
    model: str,
    machine: type[RuleBasedStateMachine],
    rules: list[str],
    settings: Settings,
    seed: int | None = None,
    regression: Callable[[str, list[str]], str] | None = None,
    *,
    database: ExampleDatabase | None = None,
) -> CheckResult:
    """Run ``machine`` under ``settings``; return what happened (never raises for a violation).

    ``database``: where Hypothesis keeps failing examples between runs (``None``: nowhere).
    """
    result = CheckResult(suite, model, rules)
    counted_machine, counts = counted(machine)
    saved_seed = hypothesis.core.global_force_seed
    saved_random = hypothesis.core.threadlocal._hypothesis_global_random
    if database is None:
        hypothesis.core.global_force_seed = seed  # type: ignore[assignment]
    else:
        # NOTE: Hypothesis ignores the database when a seed is forced, so with a database the run's randomness
        # is seeded instead (the same draws for the same seed); failures are kept per suite and model.
        hypothesis.core.global_force_seed = None
        hypothesis.core.threadlocal._hypothesis_global_random = None if seed is None else Random(seed)
        database = Scoped(database, f"{suite}/{model}/".encode())
        settings = Settings(settings, derandomize=False)
    start = time.perf_counter()
    try:
        run_state_machine_as_test(
            counted_machine,
            settings=Settings(settings, database=database, print_blob=False, report_multiple_bugs=False),
        )
    except (AssertionError, Exception, Flaky) as err:
        notes = "\n".join(getattr(err, "__notes__", []))
        steps = parse_counterexample(notes)
        message = f"{type(err).__name__}: {err}" if not isinstance(err, AssertionError) else str(err)
        rule = rule_of(str(err)) if str(err).strip() else f"crash: {type(err).__name__} in {_where(err)}"
        program = regression(rule, program_lines(notes)) if regression else notes
        result.violation = Violation(rule, message, steps, program)
    finally:
        hypothesis.core.global_force_seed = saved_seed
        hypothesis.core.threadlocal._hypothesis_global_random = saved_random
    result.seconds = time.perf_counter() - start
    result.examples = counts["examples"]
    result.steps = max(0, counts["checks"] - counts["examples"])
    return result
