"""The conformance machine for engines whose blocks are shared (a reference count per block, one free queue).

Drives any adapter with the request-level operations of
:class:`~kvledger.contracts.adapters.system.SystemAdapter` (add, admit under
tight budgets, extend, finish, abort, retract) that also reports
``shared_snapshot()`` (pools of :class:`~kvledger.spec.shared.SharedPool`,
free queues as :class:`~kvledger.spec.lru.LruState`, counters beside their
recounts) and ``take_refused()`` (each refused admission with the pool before
and after it). After every step it checks
:func:`~kvledger.contracts.machines.shared_laws.check_shared_laws`, the
sentinel's transition law, and the transaction law of every refused
admission. Prompts share prefixes so blocks are shared, cached, evicted and
hit again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvledger.contracts.adapters.system import StepResult
from kvledger.contracts.machines.shared_laws import (
    SharedView,
    Violation,
    check_refused,
    check_shared_laws,
    check_transition,
)
from kvledger.contracts.machines.stable import sampled_from
from kvledger.spec.shared import SharedPool

__all__ = ["PROMPTS", "SharedAdapter", "SharedLawBroken", "machine_for_shared"]

PROMPTS: tuple[tuple[int, ...], ...] = (
    (1, 2, 3, 4, 5, 6, 7, 8, 9),
    (1, 2, 3, 4, 5, 6, 7, 8, 2, 2),
    (1, 2, 3, 4, 9, 9, 9, 9),
    (3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3),
    (5, 4),
)
"""Prompts sharing one- and two-block prefixes (block size 4), a long one that crowds the pool, a short one."""

BUDGETS = sampled_from([64, 8, 2])


class SharedLawBroken(AssertionError):
    """A shared-block law failed: ``law`` names it, the message the blocks."""

    def __init__(self, violations: Sequence[Violation], step: str) -> None:
        self.violations = tuple(violations)
        self.law = violations[0][0]
        super().__init__(f"after {step}: " + "; ".join(f"{law}: {detail}" for law, detail in violations))


class SharedAdapter(Protocol):
    """What the machine drives."""

    capabilities: frozenset[str]

    def add_request(self, tokens: tuple[int, ...], session: int | None = None) -> int: ...
    def admit(self, budget: int, rid: int | None = None) -> StepResult: ...
    def extend(self, rid: int, n: int, ahead: int = 0) -> StepResult: ...
    def finish(self, rid: int) -> StepResult: ...
    def abort(self, rid: int) -> StepResult: ...
    def retract(self, rid: int) -> StepResult: ...
    def shared_snapshot(self) -> Any: ...
    def take_refused(self) -> list[tuple[int, SharedPool, SharedPool]]: ...


def machine_for_shared(make: Callable[[], SharedAdapter]) -> type[RuleBasedStateMachine]:
    """A state machine class checking the adapters ``make`` builds."""

    class SharedBlockConformance(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.a = make()
            self.running: list[int] = []
            self.waiting: list[int] = []
            self.last: SharedView = self.a.shared_snapshot()

        def _after(self, step: str, result: StepResult | None = None) -> None:
            if result is not None:
                for rid in result.admitted:
                    self.waiting.remove(rid)
                    self.running.append(rid)
                for rid in result.finished:
                    for queue in (self.running, self.waiting):
                        if rid in queue:
                            queue.remove(rid)
                for rid in result.retracted:
                    self.running.remove(rid)
                    self.waiting.insert(0, rid)
            snap = self.a.shared_snapshot()
            broken = check_shared_laws(snap) + check_transition(self.last, snap)
            for rid, before, after in self.a.take_refused():
                broken += check_refused(rid, before, after)
            self.last = snap
            if broken:
                raise SharedLawBroken(broken, step)

        @rule(prompt=sampled_from(PROMPTS))
        def add(self, prompt: tuple[int, ...]) -> None:
            self.waiting.append(self.a.add_request(prompt))
            self._after(f"add_request({prompt})")

        @precondition(lambda self: bool(self.waiting))
        @rule(budget=BUDGETS)
        def admit(self, budget: int) -> None:
            self._after(f"admit({budget})", self.a.admit(budget))

        @precondition(lambda self: bool(self.running))
        @rule(data=st.data(), n=st.integers(1, 5))
        def extend(self, data: st.DataObject, n: int) -> None:
            rid = data.draw(sampled_from(self.running))
            self._after(f"extend({rid}, {n})", self.a.extend(rid, n))

        @precondition(lambda self: bool(self.running))
        @rule(data=st.data())
        def finish(self, data: st.DataObject) -> None:
            rid = data.draw(sampled_from(self.running))
            self._after(f"finish({rid})", self.a.finish(rid))

        @precondition(lambda self: bool(self.running or self.waiting))
        @rule(data=st.data())
        def abort(self, data: st.DataObject) -> None:
            rid = data.draw(sampled_from(self.running + self.waiting))
            self._after(f"abort({rid})", self.a.abort(rid))

        @precondition(lambda self: bool(self.running) and "retract" in self.a.capabilities)
        @rule(data=st.data())
        def retract(self, data: st.DataObject) -> None:
            rid = data.draw(sampled_from(self.running))
            self._after(f"retract({rid})", self.a.retract(rid))

        @invariant()
        def laws_hold_initially(self) -> None:
            broken = check_shared_laws(self.last)
            if broken:
                raise SharedLawBroken(broken, "construction")

    return SharedBlockConformance
