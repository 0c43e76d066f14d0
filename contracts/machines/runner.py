"""Run conformance state machines and turn the outcome into a result a person or a program can read.

Used by ``kvledger check`` and by tests. A run counts its examples and
steps, times itself, and on failure keeps the violated law and the shrunk
counterexample (the numbered operations Hypothesis printed).

Every finding is a verdict, never a tool error: a step that runs past the
watchdog's limit fails as a ``hang`` (Hypothesis shrinks it like any other
failure), and an untyped exception from inside the implementation (an
``IndexError``, a numpy or torch error) is reported as ``implementation
crashed: <type>`` with where it was raised and the shrunk program.
"""

from __future__ import annotations

import re
import signal
import sysconfig
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import hypothesis.core
import icontract
from hypothesis import settings as Settings
from hypothesis.database import ExampleDatabase
from hypothesis.errors import Flaky
from hypothesis.stateful import RuleBasedStateMachine, invariant, run_state_machine_as_test

from kvledger.contracts.machines.regression import program_lines
from kvledger.spec.errors import KVLedgerError

_STEP = re.compile(r"^(?:\w+ = )?state\.(\w+)\((.*)\)$")
_NOISE = ("inv_", "teardown")

STEP_TIMEOUT = 10.0
"""Seconds one step (a rule and the laws checked after it) may run before the watchdog calls it a hang."""

HANG = "hang"
"""The law a step broke when it ran past the watchdog's limit."""

CRASH = "implementation crashed"
"""The law prefix of an untyped exception raised inside the implementation."""


class StepTimeout(Exception):
    """A step ran past the watchdog's limit (raised in the main thread by the watchdog's alarm)."""


_HYPOTHESIS = str(Path(hypothesis.__file__).parent)
_STDLIB = sysconfig.get_paths()["stdlib"]


def in_step(frame: FrameType | None) -> bool:
    """``frame`` runs a machine's own code (a rule, a law, what they call), not Hypothesis' machinery.

    The innermost Hypothesis frame on the stack decides: the code it called (past
    standard-library frames) is the machine's unless it is Hypothesis' own.
    """
    callee: FrameType | None = None
    while frame is not None:
        name = frame.f_code.co_filename
        if name.startswith(_HYPOTHESIS):
            return callee is not None
        if not name.startswith(_STDLIB):
            callee = frame
        frame = frame.f_back
    return True


class Watchdog:
    """A per-step deadline: ``arm`` before a step, ``disarm`` after the example; ``SIGALRM`` raises ``StepTimeout``.

    Works in the main thread of a POSIX process (where ``kvledger check`` runs);
    elsewhere it does nothing and a hang is left to the caller's own timeout.
    After the first hang the limit drops to ``retry`` seconds, so shrinking a
    hang (each candidate that still hangs runs to the limit) stays short. The
    alarm repeats every ``retry`` seconds until disarmed, in case one lands
    where Python cannot raise (a garbage-collector callback swallows it).
    """

    def __init__(self, limit: float, retry: float = 1.0) -> None:
        self.limit = limit
        self.retry = min(retry, limit)
        self.fired = 0
        self.usable = (
            limit > 0 and hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
        )
        self._saved: Any = None

    def __enter__(self) -> Watchdog:
        if self.usable:
            self._saved = signal.signal(signal.SIGALRM, self._fire)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.usable:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self._saved)

    def arm(self) -> None:
        if self.usable:
            signal.setitimer(signal.ITIMER_REAL, self.retry if self.fired else self.limit, self.retry)

    def disarm(self) -> None:
        if self.usable:
            signal.setitimer(signal.ITIMER_REAL, 0)

    def _fire(self, signum: int, frame: FrameType | None) -> None:
        if not in_step(frame):
            return  # NOTE: Hypothesis' own machinery (a draw, a gc callback): the alarm repeats after ``retry``
        limit = self.retry if self.fired else self.limit
        self.fired += 1
        raise StepTimeout(
            f"{HANG}: a step ran past {limit:g} s without returning (a walk that never ends, or a lock never released?)"
        )


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


def counted(
    machine: type[RuleBasedStateMachine], watchdog: Watchdog | None = None
) -> tuple[type[RuleBasedStateMachine], dict[str, int]]:
    """A subclass of ``machine`` that counts examples (machines built) and steps (rules run).

    With ``watchdog``, each example's construction and each step (rule and laws) runs under its deadline.
    """
    counts = {"examples": 0, "checks": 0}

    class Counted(machine):  # type: ignore[valid-type,misc]
        def __init__(self) -> None:
            counts["examples"] += 1
            if watchdog is not None:
                watchdog.arm()
            super().__init__()

        @invariant()
        def zz_count_step(self) -> None:
            counts["checks"] += 1
            if watchdog is not None:
                watchdog.arm()  # NOTE: the laws run in name order, so this one is last: the next step starts afresh

        def teardown(self) -> None:
            if watchdog is not None:
                watchdog.disarm()
            super().teardown()

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


def law_of(err: BaseException) -> str:
    """The law a failure broke: a law's own message names it; a hang is ``hang``; any other exception is a crash.

    Laws speak through ``AssertionError`` (the machines), kvledger's typed errors
    and icontract violations. Anything else raised inside the implementation (an
    ``IndexError``, a numpy or torch error) is ``implementation crashed: <type>``.
    """
    text = str(err).strip()
    if isinstance(err, StepTimeout):
        return HANG
    if isinstance(err, AssertionError | KVLedgerError | icontract.ViolationError | Flaky) and text:
        return rule_of(text)
    return f"{CRASH}: {type(err).__name__}"


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
    step_timeout: float = STEP_TIMEOUT,
    database: ExampleDatabase | None = None,
) -> CheckResult:
    """Run ``machine`` under ``settings``; return what happened (never raises for a violation).

    ``step_timeout``: seconds a step may run before it fails as a hang (0: no watchdog).
    ``database``: Hypothesis' example database (failures found before are replayed first and new ones kept).
    """
    result = CheckResult(suite, model, rules)
    watchdog = Watchdog(step_timeout)
    counted_machine, counts = counted(machine, watchdog)
    saved_seed = hypothesis.core.global_force_seed
    hypothesis.core.global_force_seed = seed  # type: ignore[assignment]
    start = time.perf_counter()
    try:
        with watchdog:
            run_state_machine_as_test(
                counted_machine,
                settings=Settings(settings, database=database, print_blob=False, report_multiple_bugs=False),
            )
    except (AssertionError, Exception, Flaky) as err:
        notes = "\n".join(getattr(err, "__notes__", []))
        steps = parse_counterexample(notes)
        message = f"{type(err).__name__}: {err}" if not isinstance(err, AssertionError) else str(err)
        rule = law_of(err)
        if rule.startswith(CRASH):
            message = f"{message} (raised at {_where(err)})"
        program = regression(rule, program_lines(notes)) if regression else notes
        result.violation = Violation(rule, message, steps, program)
    finally:
        hypothesis.core.global_force_seed = saved_seed
    result.seconds = time.perf_counter() - start
    result.examples = counts["examples"]
    result.steps = max(0, counts["checks"] - counts["examples"])
    return result
