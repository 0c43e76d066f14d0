"""Every finding is a verdict: a hang fails as ``hang``, an untyped crash inside the implementation as a crash.

(That the watchdog leaves a sound machine alone is shown by every conformance test: it is on by default.)
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule

from kvledger.contracts.machines.profiles import register_profiles
from kvledger.contracts.machines.runner import CRASH, HANG, run_machine
from kvledger.contracts.machines.suites import SUITES
from kvledger.impl.lru import Linked, LRUList
from kvledger.impl.memory import MemoryManager
from kvledger.spec.types import Component

register_profiles()
FIND = settings(settings.get_profile("ci"), max_examples=200, phases=[Phase.explicit, Phase.generate, Phase.shrink])
NO_SHRINK = settings(FIND, phases=[Phase.explicit, Phase.generate])


def walk_without_bound(lst: LRUList[Linked]) -> int:
    """An eviction walk as it was written before walks were bounded: it trusts the links to end."""
    x, n = lst.tail.prev[lst.slot], 0
    while x is not None and x is not lst.head:
        n += 1
        x = x.prev[lst.slot]
    return n


class CycleMachine(RuleBasedStateMachine):
    """Links nodes into a list; after three, one is hand-broken into a cycle, and the next walk never ends."""

    def __init__(self) -> None:
        super().__init__()
        self.lst: LRUList[Linked] = LRUList(Component.FULL)
        self.nodes: list[Linked] = []

    @rule(k=st.integers(0, 3))
    def link(self, k: int) -> None:
        node = Linked(len(self.nodes) + 1)
        self.nodes.append(node)
        self.lst.insert_mru(node)
        if len(self.nodes) == 3:
            self.nodes[-1].prev[self.lst.slot] = self.nodes[0]  # hand-broken: a cycle towards the head

    @rule()
    def walk(self) -> None:
        walk_without_bound(self.lst)


def test_a_step_that_never_returns_is_a_hang_with_its_program() -> None:
    result = run_machine("toy", "cycle", CycleMachine, [], FIND, seed=1, step_timeout=0.25)
    assert result.violation is not None
    assert result.violation.rule == HANG, result.violation.message + result.violation.program
    assert result.violation.steps[-1] == "walk()" and sum(s.startswith("link") for s in result.violation.steps) == 3
    assert "shrinking stopped" not in result.violation.message  # NOTE: shrunk within the default budget


def test_an_untyped_crash_inside_the_implementation_is_a_finding(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken_chunk(self: MemoryManager, req: object) -> None:
        raise np.exceptions.AxisError(1, 1)  # hand-broken: the numpy error an engine's index arithmetic raises

    monkeypatch.setattr(MemoryManager, "chunk", broken_chunk)
    result = run_machine("system", "full", SUITES["system"].models["full"](), [], NO_SHRINK, seed=1)
    assert result.violation is not None
    assert result.violation.rule == f"{CRASH}: AxisError", result.violation.message
    assert "raised at" in result.violation.message and result.violation.steps[-1].startswith("chunk(")


def test_an_engines_own_assert_is_a_crash_and_a_law_is_a_law() -> None:
    """An ``AssertionError`` is a law only when kvledger's spec/ or contracts/ raised it; the engine's is a crash."""
    from pathlib import Path

    import kvledger.contracts as contracts_package
    from kvledger.contracts.machines.runner import readable

    def raised_in(filename: str) -> AssertionError:
        try:
            exec(compile("raise AssertionError('inv_x: the law broke')", filename, "exec"))
        except AssertionError as err:
            return err
        raise RuntimeError("not raised")

    inside = str(Path(contracts_package.__path__[0]) / "machines" / "some_law.py")
    assert readable(raised_in(inside)) == ("inv_x", "inv_x: the law broke")
    rule, message = readable(raised_in("/site-packages/engine/cache.py"))  # an engine's own assert
    assert rule == f"{CRASH}: AssertionError"
    assert "inv_x: the law broke" in message and "raised at cache.py:1" in message


def test_a_typed_refusal_of_a_valid_step_is_named_as_one() -> None:
    """A typed error that escapes a step names its law when its message starts with one (an implementation's own
    self-check); otherwise it is a refusal of a step the machine made inside its domain, named by its type, and
    the message keeps where it was refused (never a 'law' made of the message's head)."""
    from kvledger.contracts.machines.runner import REFUSED, readable
    from kvledger.spec.errors import CacheError, IntegrityError, InvalidArgument

    assert readable(IntegrityError("inv_tree_acyclic: node 3 twice")) == (
        "inv_tree_acyclic",
        "IntegrityError: inv_tree_acyclic: node 3 twice",
    )
    rule, message = readable(InvalidArgument("write", "req_to_token", [0], "a KV slot named twice"))
    assert rule == f"{REFUSED}: InvalidArgument"
    assert message.startswith("InvalidArgument: write on pool 'req_to_token' slots [0]"), message
    assert readable(CacheError("insert of key (1,): no"))[0] == f"{REFUSED}: CacheError"


class SlowMachine(RuleBasedStateMachine):
    """Each step takes 20 ms; a law breaks once a drawn total passes 40, which long programs reach first, so
    shrinking replays many slow programs."""

    def __init__(self) -> None:
        super().__init__()
        self.total = 0

    @rule(k=st.integers(0, 9))
    def add(self, k: int) -> None:
        import time

        time.sleep(0.02)
        self.total += k
        assert self.total <= 40, f"inv_total: {self.total}"


SLOW = settings(FIND, max_examples=50, stateful_step_count=40)


def test_shrinking_stops_at_its_budget_and_says_so() -> None:
    from hypothesis.internal.conjecture import engine

    limit = engine.MAX_SHRINKING_SECONDS
    result = run_machine("toy", "slow", SlowMachine, [], SLOW, seed=3, shrink_for=0.5)
    assert limit == engine.MAX_SHRINKING_SECONDS  # NOTE: Hypothesis' own limit is put back
    assert (
        result.violation is not None and "inv_total" in result.violation.message
    )  # NOTE: a test-module assert: a crash
    assert "shrinking stopped after 0.5 s" in result.violation.message, result.violation.message
    assert result.seconds < 30


@pytest.mark.parametrize("raw", ["0", "-1", "soon", "inf", "nan"])
def test_a_shrink_budget_from_the_environment_must_be_positive_seconds(
    monkeypatch: pytest.MonkeyPatch, raw: str
) -> None:
    from kvledger.contracts.machines.runner import SHRINK_ENV, shrink_seconds

    monkeypatch.setenv(SHRINK_ENV, raw)
    with pytest.raises(ValueError, match=SHRINK_ENV):
        shrink_seconds()
    monkeypatch.setenv(SHRINK_ENV, "2.5")
    assert shrink_seconds() == 2.5


@pytest.mark.parametrize("raised", ["law", "refusal"])
def test_a_law_an_adapter_meets_inside_a_call_is_that_law_never_a_refusal(raised: str) -> None:
    """An adapter whose extend moved the engine and then met a broken law (here: decoded, then raised as a stalled
    engine would) raises ``LawBroken``: the run reads that law, wherever the adapter's file lives, and the machine
    never takes it for a refusal. The same stop raised as a typed refusal is caught by the refusal's own law, since
    the call changed the state."""
    from kvledger.contracts.adapters.reference_system import ReferenceSystemAdapter
    from kvledger.contracts.adapters.system import StepResult
    from kvledger.contracts.machines.suites import SYSTEM_CONFIGS
    from kvledger.contracts.machines.system import RULES, machine_for_system
    from kvledger.spec.errors import CacheError, LawBroken

    class Stalls(ReferenceSystemAdapter):
        def extend(self, rid: int, n: int, ahead: int = 0) -> StepResult:
            super().extend(rid, n, ahead)
            if raised == "law":
                raise LawBroken(f"a running request moves: extend of request {rid}: still running")
            raise CacheError(f"extend of request {rid}: the engine did not move it")

    machine = machine_for_system(lambda: Stalls(SYSTEM_CONFIGS["full"]))
    result = run_machine("system", "full", machine, list(RULES), NO_SHRINK, seed=1)
    v = result.violation
    assert v is not None and v.steps[-1].startswith(("extend(", "extend_far_ahead(")), v
    if raised == "law":
        assert v.rule == "a running request moves", v.message
        assert v.message.startswith("a running request moves: extend of request"), v.message
    else:
        assert v.rule == "rejected call leaves state unchanged", v.message
