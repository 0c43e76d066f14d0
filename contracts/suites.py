"""What ``kvledger check`` runs: named suites of conformance machines, one per model kind.

A suite names the laws it checks (for the result table) and builds, for each
model kind, the Hypothesis state machine that drives the implementation and
the spec in lockstep.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from hypothesis.stateful import RuleBasedStateMachine

from kvledger.contracts.pool_machine import KINDS, machine_for


@dataclass(frozen=True)
class Suite:
    """A family of conformance machines."""

    name: str
    description: str
    rules: tuple[str, ...]
    models: dict[str, Callable[[], type[RuleBasedStateMachine]]]


POOL_RULES = (
    "inv_slots_conserved",
    "inv_single_owner",
    "refinement (abstract == spec model)",
    "free stack matches tags",
    "data integrity",
    "rejected call leaves state unchanged",
)


def _pool_model(kind: str) -> Callable[[], type[RuleBasedStateMachine]]:
    return lambda: machine_for(KINDS[kind])


SUITES: dict[str, Suite] = {
    "pools": Suite(
        "pools",
        "every pool (token, paged, SWA pair, request rows, Mamba) against the ownership ledger",
        POOL_RULES,
        {kind: _pool_model(kind) for kind in KINDS},
    ),
}
