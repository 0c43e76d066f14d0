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

import os
import re
import signal
import sys
import sysconfig
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from random import Random
from types import FrameType, TracebackType
from typing import Any

import hypothesis.core
import icontract
from hypothesis import settings as Settings
from hypothesis.database import ExampleDatabase
from hypothesis.errors import Flaky, HypothesisException
from hypothesis.stateful import RuleBasedStateMachine, run_state_machine_as_test

import kvledger.contracts as contracts_package
import kvledger.spec as spec_package
from kvledger.contracts.machines.fair import SCHEDULE, fair
from kvledger.contracts.machines.kept import Kept
from kvledger.contracts.machines.regression import program_lines
from kvledger.contracts.machines.stable import fixed_constants
from kvledger.spec.errors import KVLedgerError, LawBroken

_STEP = re.compile(r"^(?:\w+ = )?state\.(\w+)\((.*)\)$")
_NOISE = ("inv_", "teardown", "check_invariants", SCHEDULE)

STEP_TIMEOUT = 30.0
"""Seconds one step (a rule and the laws checked after it) may run before the watchdog calls it a hang."""

SHRINK_SECONDS = 60.0
"""Seconds Hypothesis may spend shrinking a violation before it reports the shortest program found so far (its own
limit is five minutes: a violation found by a probe of a live manager, whose every replay builds and copies it, has
shrunk that long). ``KVLEDGER_SHRINK_SECONDS`` (``kvledger check --shrink-for``) sets another."""
SHRINK_ENV = "KVLEDGER_SHRINK_SECONDS"
_SLOW_SHRINK = "WARNING: Hypothesis has spent more than"  # NOTE: how Hypothesis words the end of a cut-short shrink


def shrink_seconds() -> float:
    """The shrink budget: ``KVLEDGER_SHRINK_SECONDS`` (a positive number of seconds) or :data:`SHRINK_SECONDS`;
    ``ValueError`` naming the variable for anything else."""
    raw = os.environ.get(SHRINK_ENV, "").strip()
    if not raw:
        return SHRINK_SECONDS
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise ValueError(f"{SHRINK_ENV}={raw!r}: expected a positive number of seconds")
    return value


@contextmanager
def bounded_shrinking(seconds: float) -> Iterator[list[str]]:
    """Within the block, Hypothesis stops shrinking a failure after ``seconds`` (its own module limit, put back
    after); yields a list that receives Hypothesis' report of a shrink so cut short (instead of printing it: it
    names Hypothesis' own five minutes). Hypothesis versions without that limit shrink as they do."""
    from hypothesis.internal.conjecture import engine
    from hypothesis.reporting import current_reporter, with_reporter

    cut: list[str] = []
    outer = current_reporter()

    def report(value: object) -> None:
        if isinstance(value, str) and value.startswith(_SLOW_SHRINK):
            cut.append(value)
        else:
            outer(value)

    saved = getattr(engine, "MAX_SHRINKING_SECONDS", None)
    if saved is not None:
        engine.MAX_SHRINKING_SECONDS = seconds  # type: ignore[assignment]
    try:
        with with_reporter(report):
            yield cut
    finally:
        if saved is not None:
            engine.MAX_SHRINKING_SECONDS = saved


HANG = "hang"
"""The law a step broke when it ran past the watchdog's limit."""

CRASH = "implementation crashed"
"""The law prefix of an untyped exception raised inside the implementation."""

REFUSED = "implementation refused a valid step"
"""The law prefix of a typed error that names no law, raised by a step the machine made inside its domain (a
machine catches the refusals it expects): ``spec.domains.inv_domain_enforced``'s inside half, by the error's type."""


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
    shrink_runs: int = 0
    kept: int = 0
    cut: bool = False
    """The run stopped before the profile's examples were drawn: a campaign's time was up (``--for``)."""

    @property
    def ok(self) -> bool:
        return self.violation is None

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["ok"] = self.ok
        if self.violation is not None:
            out["violation"]["length"] = self.violation.length
        return out


class OutOfTime(KeyboardInterrupt):
    """A campaign's time is up: raised before an example starts, so no example is cut in the middle.

    A ``KeyboardInterrupt`` because that is the one exception Hypothesis lets through at once, without
    replaying the example or calling the test flaky; a run that found a violation is never stopped (its
    shrinking goes on to the end).
    """


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


Progress = Callable[[int, int, bool], None]
"""Called after every example: (examples so far, steps so far, shrinking: a violation was found)."""


def counted(
    machine: type[RuleBasedStateMachine],
    progress: Progress | None = None,
    watchdog: Watchdog | None = None,
    stop_at: float | None = None,
) -> tuple[type[RuleBasedStateMachine], dict[str, int]]:
    """A subclass of ``machine`` that counts what ``--examples``/``--steps`` promise.

    ``examples``: programs run to their end, plus the first one that broke a
    law (Hypothesis' invalid examples and its shrinking and replay runs after
    the violation are not examples: they are counted in ``shrink_runs``).
    ``steps``: rules those examples ran. The counting overrides Hypothesis'
    invariant check instead of adding an invariant, so printed programs show
    only the machine's own calls. With ``watchdog``, each example's
    construction and each step (a rule and the laws after it) runs under its deadline. With ``stop_at``
    (a ``time.time()``), no example starts after it unless a violation is being shrunk (:class:`OutOfTime`).
    """
    counts = {"examples": 0, "steps": 0, "shrink_runs": 0, "found": 0}

    class Counted(machine):  # type: ignore[valid-type,misc]
        def __init__(self) -> None:
            if stop_at is not None and not counts["found"] and time.time() >= stop_at:
                raise OutOfTime
            self._kvl_checks = 0
            self._kvl_checking = False
            super().__init__()
            if watchdog is not None:
                # NOTE: armed once the machine is built: building a real engine (imports, a scheduler's set-up)
                # may take longer than any step, and is not a step
                watchdog.arm()

        def check_invariants(self, *args: Any, **kwargs: Any) -> None:
            self._kvl_checks += 1  # NOTE: Hypothesis checks once before the first rule, then after each rule
            self._kvl_checking = True
            super().check_invariants(*args, **kwargs)
            self._kvl_checking = False
            if watchdog is not None:
                watchdog.arm()  # NOTE: the laws of a step held: the next step starts afresh

        def teardown(self) -> None:
            if watchdog is not None:
                watchdog.disarm()
            exc = sys.exc_info()[1]  # teardown runs in Hypothesis' ``finally``: the example's own exception
            if counts["found"]:
                counts["shrink_runs"] += 1
            elif exc is None or (isinstance(exc, Exception) and not isinstance(exc, HypothesisException)):
                counts["examples"] += 1
                broke_in_rule = exc is not None and not self._kvl_checking
                counts["steps"] += max(0, self._kvl_checks - 1) + broke_in_rule
                counts["found"] = int(exc is not None)
                if progress is not None:
                    progress(counts["examples"], counts["steps"], bool(counts["found"]))
            super().teardown()

    Counted.__name__ = machine.__name__
    Counted.__qualname__ = machine.__qualname__
    return Counted, counts


def parse_counterexample(text: str) -> list[str]:
    """The operations of a printed failing program, without invariant checks."""
    steps = []
    for line in text.splitlines():
        m = _STEP.match(line.strip())
        if m and not m.group(1).startswith(_NOISE):
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


_VALUE = re.compile(r"^(\w+) was (.*)$")
_INLINE_VALUE = re.compile(r"^(.*?): (\w+ was .*)$")
_ICONTRACT_NOISE = re.compile(r"^(OLD was a bunch of OLD values|self was <.*>|\w+:)$")


def readable(err: BaseException) -> tuple[str, str]:
    """The violated law and a message an engine author can read, free of icontract's internals.

    A machine's own assertion reads ``law: detail``. An icontract violation
    (the bindings' postconditions, named ``law: what it checks``) loses its
    ``File ..., line N in attach`` line, the condition function's name, the
    ``OLD`` bundle and ``self``'s address; the call's arguments and result stay,
    one ``name = value`` a line. A :class:`~kvledger.spec.errors.LawBroken` an
    adapter raised inside a call reads as its law, wherever the adapter lives.
    A step past the watchdog's limit is ``hang``; a
    kvledger typed error names its law (an ``inv_*`` head), or is a refusal of a step the machine made inside its
    domain: ``implementation refused a valid step: InvalidArgument``; anything else is a crash of the
    implementation (or the adapter): ``implementation crashed: TypeError``,
    with where it was raised in the message.
    """
    text = str(err).strip()
    if isinstance(err, icontract.ViolationError):
        lines = text.splitlines()
        if lines and lines[0].startswith("File ") and ", line " in lines[0]:
            lines = lines[1:]
        head = (lines[0] if lines else "contract violated").rstrip().rstrip(":").strip()
        inline = _INLINE_VALUE.match(head)  # NOTE: with one value icontract writes it on the head line
        if inline:
            head, lines = inline.group(1), [lines[0], inline.group(2), *lines[1:]]
        # NOTE: icontract writes "<description>: <condition>"; a condition that is a function's name means nothing
        description, _, condition = head.rpartition(": ") if ": " in head else (head, "", "")
        law, _, what = description.partition(":")
        values = []
        for line in lines[1:]:
            if _ICONTRACT_NOISE.match(line.strip()):
                continue
            m = _VALUE.match(line.strip())
            values.append(f"  {m.group(1)} = {m.group(2)}" if m else f"    {line.strip()}")
        message = f"{law.strip()}: {what.strip() or 'violated'}"
        checked = [f"  checked: {condition}"] if condition and not condition.isidentifier() else []
        return law.strip()[:120], "\n".join([message, *checked, *values])
    if isinstance(err, StepTimeout):
        return HANG, text
    if isinstance(err, KVLedgerError) and text:
        law = rule_of(text)
        if not law.startswith("inv_"):  # NOTE: its message's head is where it was refused, not a law
            law = f"{REFUSED}: {type(err).__name__}"
        return law, f"{type(err).__name__}: {text}"
    if isinstance(err, AssertionError) and text and (isinstance(err, LawBroken) or _raised_by_kvledger(err)):
        return rule_of(text), text
    if isinstance(err, Flaky):
        return "flaky: the implementation does not behave the same on the same program", text
    where = _where(err)
    return f"{CRASH}: {type(err).__name__}", f"{type(err).__name__}: {text or '(no message)'} (raised at {where})"


_LAW_DIRS = tuple(str(Path(p).resolve()) + os.sep for p in (*spec_package.__path__, *contracts_package.__path__))


def _raised_by_kvledger(err: BaseException) -> bool:
    """Whether ``err`` was raised by kvledger's own laws (spec/, contracts/), not by an ``assert`` in the engine.

    An engine's own ``assert`` failing inside a step is the engine crashing, whatever it says.
    """
    tb = _raised_at(err)
    if tb is None:
        return True  # NOTE: raised where no frame was recorded: only kvledger builds such errors
    return str(Path(tb.tb_frame.f_code.co_filename).resolve()).startswith(_LAW_DIRS)


def _raised_at(err: BaseException) -> TracebackType | None:
    """The innermost traceback entry of ``err``: where it was raised."""
    tb = err.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb


def _where(err: BaseException) -> str:
    tb = _raised_at(err)
    return f"{tb.tb_frame.f_code.co_filename.rsplit('/', 1)[-1]}:{tb.tb_lineno}" if tb is not None else "?"


def replay_kept(
    machine: type[RuleBasedStateMachine], programs: Sequence[Kept], watchdog: Watchdog
) -> tuple[Kept, BaseException] | None:
    """The regression-first phase: each kept program on a fresh ``machine``, every law checked after each step.

    Returns the first program that breaks a law (or crashes, or hangs past the watchdog) with its exception.
    """
    from kvledger.spec.types import Component, Owner, OwnerKind

    for kept in programs:
        code = compile(kept.source, f"<kept program: {kept.origin}>", "exec")
        try:
            with watchdog:
                state = machine()
                watchdog.arm()
                exec(code, {"state": state, "Component": Component, "Owner": Owner, "OwnerKind": OwnerKind})
                watchdog.disarm()
        except (AssertionError, Exception) as err:
            return kept, err
    return None


def run_machine(
    suite: str,
    model: str,
    machine: type[RuleBasedStateMachine],
    rules: list[str],
    settings: Settings,
    seed: int | None = None,
    regression: Callable[[str, list[str]], str] | None = None,
    progress: Progress | None = None,
    *,
    database: ExampleDatabase | None = None,
    step_timeout: float = STEP_TIMEOUT,
    kept: Sequence[Kept] = (),
    stop_at: float | None = None,
    shrink_for: float | None = None,
) -> CheckResult:
    """Run ``machine`` under ``settings``; return what happened (never raises for a violation).

    ``regression`` turns the violated law and the printed program's lines into
    a pytest module (without it, the program's lines are kept as they are);
    ``progress`` is told about every example; ``database``: where Hypothesis
    keeps failing examples between runs (``None``: nowhere); ``step_timeout``:
    seconds a step may run before it fails as a hang (0: no watchdog); ``kept``: programs replayed before the
    search (:mod:`kvledger.contracts.machines.kept`); the first one that breaks a law is the verdict.
    ``stop_at``: a ``time.time()`` after which no new example starts (a campaign's ``--for``); a run
    stopped so holds with what it ran, marked ``cut``. ``shrink_for``: seconds a violation may shrink (default
    :func:`shrink_seconds`); a program whose shrinking was cut short says so in the violation's message.
    """
    result = CheckResult(suite, model, rules)
    watchdog = Watchdog(step_timeout)
    start = time.perf_counter()
    failed = replay_kept(machine, kept, watchdog)
    result.kept = len(kept)
    if failed is not None:
        first, err = failed
        rule, message = readable(err)
        lines = program_lines("state = Machine()\n" + first.source)
        text = regression(rule, lines) if regression else "\n".join(lines)
        steps = parse_counterexample(first.source)
        result.violation = Violation(rule, f"{message}\n(kept program: {first.origin})", steps, text)
        result.seconds = time.perf_counter() - start
        return result
    counted_machine, counts = counted(fair(machine), progress, watchdog, stop_at)
    saved_seed = hypothesis.core.global_force_seed
    saved_random = hypothesis.core.threadlocal._hypothesis_global_random
    if seed is not None or database is not None:
        # NOTE: a profile's ``derandomize`` wins over a forced seed in Hypothesis (every seed would draw the
        # derandomised examples) and keeps the database from being read: either one turns it off
        settings = Settings(settings, derandomize=False)
    if database is None:
        hypothesis.core.global_force_seed = seed  # type: ignore[assignment]
    else:
        # NOTE: Hypothesis ignores the database when a seed is forced, so with a database the run's randomness
        # is seeded instead (the same draws for the same seed); failures are kept per suite and model.
        hypothesis.core.global_force_seed = None
        hypothesis.core.threadlocal._hypothesis_global_random = None if seed is None else Random(seed)
        database = Scoped(database, f"{suite}/{model}/".encode())
    budget = shrink_seconds() if shrink_for is None else shrink_for
    cut: list[str] = []
    try:
        with watchdog, fixed_constants(), bounded_shrinking(budget) as cut:
            run_state_machine_as_test(
                counted_machine,
                settings=Settings(settings, database=database, print_blob=False, report_multiple_bugs=False),
            )
    except OutOfTime:
        result.cut = True
    except (AssertionError, Exception, Flaky) as err:
        notes = "\n".join(getattr(err, "__notes__", []))
        steps = parse_counterexample(notes)
        rule, message = readable(err)
        lines = program_lines(notes)
        program = regression(rule, lines) if regression else "\n".join(lines)
        if cut:
            message += (
                f"\n(shrinking stopped after {budget:g} s: the program may not be the shortest; "
                f"--shrink-for or {SHRINK_ENV} gives it longer)"
            )
        result.violation = Violation(rule, message, steps, program)
    finally:
        hypothesis.core.global_force_seed = saved_seed
        hypothesis.core.threadlocal._hypothesis_global_random = saved_random
    result.seconds = time.perf_counter() - start
    result.examples = counts["examples"]
    result.steps = counts["steps"]
    result.shrink_runs = counts["shrink_runs"]
    return result
