"""Fair scheduling: an example may ask that no rule it runs gets far ahead of the others.

Hypothesis picks a machine's next rule by drawing an index into the sorted rule
list, and its draws are far from uniform: measured on the default run
(``tests/benchmarks/rule_counts.py``), the pools suite's ``token`` model ran
``free`` once in about 1,600 steps while ``bad_tensor`` ran 284 times, and two
rules never ran at all. Its swarm testing (a random subset of rules per example)
does not help a rule the index draws avoid.

:func:`fair` gives a machine one more initialisation, :data:`SCHEDULE`, that
draws whether this example is scheduled fairly. In a fair example, a rule may
run only while its count is at most ``slack`` above the least count among the
rules that have already run in the example and could run now (their own
preconditions and bundles allow it). Hypothesis' draws then fall to the rules
behind and to rules not yet run, so every rule the swarm enabled gets its turn.
A rule with the least count is always allowed, so fairness never leaves an
example without a rule to run.

A fair example also turns Hypothesis' swarm off (:func:`unswarmed`): the swarm
switches a random share of the rules off for a whole example (on average half
of them), and a schedule cannot be fair to a rule it cannot run. Measured on the
default run (issue 19's nineteenth round), the swarm had kept the Mamba pool's
``copy_state`` off in 20 of the 21 examples where it could have run. Examples
that are not scheduled fairly keep the swarm, so a rule still gets the long
runs without some other rule that swarm testing is for.

The flag shrinks to ``False`` (unscheduled), so a counterexample that needs one
rule many times in a row still shrinks to its shortest form, and the choice is
part of the example's own draws: replaying an example replays its schedule.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import RULE_MARKER, RuleBasedStateMachine, initialize

from kvledger.contracts.machines.stable import just

try:
    from hypothesis.strategies._internal.featureflags import FeatureFlags as _FeatureFlags

    ALL_ON: object | None = _FeatureFlags()
    """Feature flags made without data: every feature (rule) on, Hypothesis' "example mode"."""
except ImportError:  # pragma: no cover - a Hypothesis without feature flags has no swarm to turn off
    ALL_ON = None

SCHEDULE = "kvl_fair_schedule"
"""The name of the initialisation that draws an example's schedule (left out of printed programs)."""

SLACK = 2
"""How many calls a rule may run ahead of the least-run rule that could run now."""


def _rules(machine: type[RuleBasedStateMachine]) -> dict[str, Any]:
    """The machine's rules by method name (Hypothesis' ``Rule`` objects)."""
    rules: dict[str, Any] = {}
    for name, f in inspect.getmembers(machine):
        rule = getattr(f, RULE_MARKER, None)
        if rule is not None:
            rules[name] = rule
    return rules


def unswarmed(state: RuleBasedStateMachine) -> bool:
    """Turn Hypothesis' swarm off for the rest of ``state``'s example: every rule enabled. ``False`` (nothing done)
    where this Hypothesis draws its rules otherwise.

    NOTE: Hypothesis draws an example's feature flags (which rules are on) lazily, at its first rule after the
    initialisations, from the machine's rule strategy's ``enabled_rules_strategy``; flags made without data enable
    every feature (its "example mode"). It is an internal of ``hypothesis.stateful``, so it is looked up, not
    assumed; ``tests/contracts/test_fair.py`` fails if it stops working.
    """
    strategy = getattr(state, "_rules_strategy", None)
    if ALL_ON is None or strategy is None or not hasattr(strategy, "enabled_rules_strategy"):
        return False
    strategy.enabled_rules_strategy = just(ALL_ON)  # NOTE: read-only once made (no data: nothing is drawn)
    return True


def fair(machine: type[RuleBasedStateMachine], slack: int = SLACK) -> type[RuleBasedStateMachine]:
    """A subclass of ``machine`` whose examples may be scheduled fairly (see the module's text).

    Each rule's function is wrapped to count its calls per example, and gets one more
    precondition; the machine's own rules, laws and printed programs are unchanged.
    """
    rules = _rules(machine)
    if not rules or hasattr(machine, SCHEDULE):
        return machine

    def runnable(state: Any, rule: Any) -> bool:
        """``rule`` could run now, fairness aside: its bundles hold values and its preconditions hold."""
        return all(state.bundle(b.name) for b in rule.bundles) and all(p(state) for p in rule.preconditions)

    def floor(state: Any) -> int | None:
        """The least count among the rules that ran in this example and could run now (once per step)."""
        key = state._kvl_steps
        if state._kvl_floor[0] != key:
            counts = state._kvl_calls
            ran = [counts[name] for name, rule in rules.items() if counts.get(name) and runnable(state, rule)]
            state._kvl_floor = (key, min(ran) if ran else None)
        least: int | None = state._kvl_floor[1]
        return least

    def allowed(name: str) -> Callable[[Any], bool]:
        def fair_turn(state: Any) -> bool:
            if not state._kvl_fair:
                return True
            count = state._kvl_calls.get(name, 0)
            if count == 0:
                return True
            least = floor(state)
            return least is None or count <= least + slack

        fair_turn.__name__ = f"fair_turn_{name}"
        return fair_turn

    def counting(name: str, rule: Any) -> Callable[..., Any]:
        f = rule.function

        @functools.wraps(f)
        def step(state: Any, *args: Any, **kwargs: Any) -> Any:
            state._kvl_calls[name] = state._kvl_calls.get(name, 0) + 1
            state._kvl_steps += 1
            return f(state, *args, **kwargs)

        new_rule = dataclasses.replace(rule, function=step, preconditions=(*rule.preconditions, allowed(name)))
        setattr(step, RULE_MARKER, new_rule)
        return step

    attrs: dict[str, Any] = {name: counting(name, rule) for name, rule in rules.items()}

    def __init__(self: Any) -> None:
        self._kvl_fair = False
        self._kvl_calls = {}  # rule name -> calls in this example
        self._kvl_steps = 0
        self._kvl_floor = (-1, None)  # (the step it was computed at, the least count: see ``floor``)
        machine.__init__(self)

    def schedule(self: Any, fair: bool) -> None:
        """Whether this example is scheduled fairly (drawn; shrinks to ``False``); a fair one runs unswarmed."""
        self._kvl_fair = fair
        if fair:
            unswarmed(self)

    schedule.__name__ = schedule.__qualname__ = SCHEDULE  # NOTE: Hypothesis prints a step by its function's name
    attrs["__init__"] = __init__
    attrs[SCHEDULE] = initialize(fair=st.booleans())(schedule)
    scheduled = type(machine.__name__, (machine,), attrs)
    scheduled.__qualname__ = machine.__qualname__
    scheduled.__module__ = machine.__module__
    return scheduled
