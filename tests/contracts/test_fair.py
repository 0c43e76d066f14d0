"""Fair scheduling (``kvledger.contracts.machines.fair``): in a fair example no rule runs far ahead of the others."""

from __future__ import annotations

from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, precondition, rule

from kvledger.contracts.machines.fair import SCHEDULE, SLACK, fair
from kvledger.contracts.machines.regression import program_lines
from kvledger.contracts.machines.runner import parse_counterexample, run_machine


class Toy(RuleBasedStateMachine):
    """Four rules; ``take`` needs a value in the bundle, ``gated`` runs only while ``open``."""

    things = Bundle("things")

    def __init__(self) -> None:
        super().__init__()
        self.open = False
        self.log: list[str] = []

    @rule(target=things, n=st.integers(0, 3))
    def make(self, n: int) -> int:
        self.log.append("make")
        return n

    @rule(thing=consumes(things))
    def take(self, thing: int) -> None:
        self.log.append("take")

    @rule()
    def toggle(self) -> None:
        self.log.append("toggle")
        self.open = not self.open

    @precondition(lambda self: self.open)
    @rule()
    def gated(self) -> None:
        self.log.append("gated")


def _allowed(state: Any, name: str) -> bool:
    """Whether Hypothesis would let ``name`` run now (its bundles, its preconditions, the fair turn among them)."""
    r = getattr(type(state), name).hypothesis_stateful_rule
    return all(state.bundle(b.name) for b in r.bundles) and all(p(state) for p in r.preconditions)


def test_a_fair_example_holds_a_rule_that_ran_ahead_and_lets_the_least_run_one_go() -> None:
    state = fair(Toy)()
    getattr(state, SCHEDULE)(fair=True)
    for _ in range(SLACK + 2):
        state.toggle()  # NOTE: direct calls bypass preconditions: the counts run ahead as a biased draw would
    state.make(1)
    assert state._kvl_calls == {"toggle": SLACK + 2, "make": 1}
    assert not _allowed(state, "toggle"), "a rule more than SLACK ahead of the least-run runnable rule was allowed"
    assert _allowed(state, "make"), "the least-run rule must always be allowed"
    take_turn = type(state).take.hypothesis_stateful_rule.preconditions[-1]
    assert take_turn(state), "a rule not yet run must be allowed its turn"
    state.make(2)
    assert _allowed(state, "toggle"), "the floor rose: toggle is within SLACK again"


def test_a_rule_that_cannot_run_now_does_not_hold_the_floor() -> None:
    state = fair(Toy)()
    getattr(state, SCHEDULE)(fair=True)
    state.toggle()
    state.gated()  # NOTE: ran once while open
    state.toggle()  # closed again: gated cannot run, so its count of 1 must not cap the others
    for _ in range(SLACK + 3):
        state.make(0)
    assert not state.open
    assert _allowed(state, "toggle"), "toggle is the least run of the rules that can run now"
    assert not _allowed(state, "make"), "make ran SLACK+ ahead of toggle, the least-run runnable rule"


def test_an_unscheduled_example_allows_every_rule() -> None:
    state = fair(Toy)()
    getattr(state, SCHEDULE)(fair=False)
    for _ in range(10):
        state.toggle()
    state.make(0)
    assert _allowed(state, "toggle") and _allowed(state, "make")


def test_fair_keeps_the_rules_names_and_laws() -> None:
    scheduled = fair(Toy)
    names = {r.function.__name__ for r in scheduled.setup_state().rules}
    assert names == {"make", "take", "toggle", "gated"}
    assert [r.function.__name__ for r in scheduled.setup_state().initializers] == [SCHEDULE]
    assert fair(scheduled) is scheduled, "scheduling twice must not stack a second schedule"


def test_a_run_draws_the_schedule_per_example() -> None:
    """Through the runner, as ``kvledger check`` runs a machine: the run holds, and both schedules were drawn."""
    seen: list[bool] = []

    class Spy(Toy):
        def teardown(self) -> None:
            seen.append(bool(getattr(self, "_kvl_fair", False)))
            super().teardown()

    result = run_machine("toy", "toy", Spy, [], settings(max_examples=40, stateful_step_count=20, database=None), 1)
    assert result.ok, result.violation
    assert any(seen) and not all(seen), "the schedule is drawn per example: some fair, some not"


def test_the_schedule_is_left_out_of_printed_programs() -> None:
    notes = f"state = Toy()\nstate.{SCHEDULE}(fair=True)\nthings_0 = state.make(n=0)\nstate.take(thing=things_0)\n"
    notes += "state.teardown()\n"
    assert program_lines(notes) == ["things_0 = state.make(n=0)", "state.take(thing=things_0)", "state.teardown()"]
    assert parse_counterexample(notes) == ["make(n=0)", "take(thing=things_0)"]


def test_a_seed_given_to_a_derandomised_profile_draws_its_own_examples() -> None:
    """``run_machine(seed=s)`` under the ``ci`` profile (derandomised, as the tests and the mutation tool run it):
    each seed draws its own examples, the same ones again for the same seed. Hypothesis lets ``derandomize`` win
    over a forced seed, so without the runner's override every seed ran the one derandomised sample."""
    from kvledger.contracts.machines.profiles import register_profiles

    register_profiles()
    ci = settings(settings.get_profile("ci"), max_examples=10, stateful_step_count=10)

    def logs(seed: int | None) -> list[list[str]]:
        seen: list[list[str]] = []

        class Spy(Toy):
            def teardown(self) -> None:
                seen.append(list(self.log))
                super().teardown()

        result = run_machine("toy", "toy", Spy, [], ci, seed)
        assert result.ok, result.violation
        return seen

    one, two = logs(1), logs(2)
    assert one == logs(1), "the same seed draws the same examples"
    assert one != two, "another seed draws other examples"
    assert logs(None) == logs(None), "no seed: the profile's derandomised examples"


class Eight(RuleBasedStateMachine):
    """Eight rules that can always run, each logging its name."""

    def __init__(self) -> None:
        super().__init__()
        self.ran: set[str] = set()


for _i in range(8):

    def _step(self: Eight, _name: str = f"r{_i}") -> None:
        self.ran.add(_name)

    _step.__name__ = f"r{_i}"
    setattr(Eight, f"r{_i}", rule()(_step))


def test_a_fair_example_runs_unswarmed() -> None:
    """Hypothesis' swarm switches about half the rules off for a whole example; a fair schedule cannot be fair to a
    rule it cannot run, so a fair example runs with every rule on (``fair.unswarmed``). Counted per example: the
    rules that ran in fair and in unscheduled examples of at least 24 steps."""
    from kvledger.contracts.machines.profiles import register_profiles

    register_profiles()
    runs: dict[bool, list[int]] = {True: [], False: []}

    class Spy(Eight):
        def teardown(self) -> None:
            if self._kvl_steps >= 24:  # type: ignore[attr-defined]  # NOTE: room for every rule three times
                runs[bool(self._kvl_fair)].append(len(self.ran))  # type: ignore[attr-defined]
            super().teardown()

    ci = settings(settings.get_profile("ci"), max_examples=60, stateful_step_count=30)
    result = run_machine("toy", "eight", Spy, [], ci)
    assert result.ok, result.violation
    fair_runs, swarmed = runs[True], runs[False]
    assert len(fair_runs) >= 10 and len(swarmed) >= 10, runs
    assert sum(n == 8 for n in fair_runs) >= 0.75 * len(fair_runs), f"fair examples that missed a rule: {fair_runs}"
    assert sum(n < 8 for n in swarmed) >= 0.3 * len(swarmed), f"the swarm no longer switches rules off: {swarmed}"
