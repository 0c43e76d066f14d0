"""Kept programs: shrunk counterexamples the checker found before, replayed first by every run.

``kvledger check`` replays these before its random search (the regression-first
phase, :func:`kvledger.contracts.machines.runner.replay_kept`): each is a short
program that once broke a law (a seeded fault B1-B5, or a bug found in the
reference and fixed), so it drives the machine straight into a state that
random search reaches rarely (a resumed session turn retracted, a rolled-back
resume, an insert borrowing a copy-on-write lock). A program runs on a fresh
machine of its suite and model with every law checked after each step, as the
search runs its examples; it passes on a correct implementation.

Each is the program ``kvledger check`` printed (``state.<rule>(...)`` lines, the
laws checked between them), kept here as text so it survives changes to the
machines' draws (Hypothesis' example database keeps choice sequences, which
do not). The pytest regressions in ``tests/regressions`` replay the same
programs with and without their fault.
"""

from __future__ import annotations

from dataclasses import dataclass

LAWS = "state.inv_all_laws()"


@dataclass(frozen=True)
class Kept:
    """One kept program: where it came from, the (suite, model) pairs it runs on, its steps."""

    origin: str
    suite: str
    models: tuple[str, ...]
    steps: tuple[str, ...]

    @property
    def source(self) -> str:
        """The program as Python: the laws checked first and after every step, then ``teardown``."""
        lines = [LAWS]
        for step in self.steps:
            lines += [step, LAWS]
        return "\n".join([*lines, "state.teardown()"])


SYSTEM_ALL = ("full", "paged", "mamba")

KEPT: tuple[Kept, ...] = (
    Kept(
        "B1 (--fault B1, cache/full)",
        "cache",
        ("full", "full-paged"),
        (
            "keys_0 = state.insert(borrow=False, prompt=0, suffix=())",
            "state.evict(comp=Component.FULL, n=1)",
        ),
    ),
    Kept(
        "B5 (--fault B5, cache/hybrid)",
        "cache",
        ("mamba", "hybrid"),
        (
            "keys_0 = state.insert(borrow=False, prompt=1, suffix=())",
            "keys_1 = state.insert(borrow=False, prompt=0, suffix=())",
            "handles_0 = state.inc_lock_ref_cached(cow=True, key=keys_1, more=())",
        ),
    ),
    Kept(
        "B2 (--fault B2, system/mamba)",
        "system",
        SYSTEM_ALL,
        ("state.add_request(budget=2, prompt=0, sid=None, suffix=[])",),
    ),
    Kept(
        "B3 (--fault B3, system/mamba)",
        "system",
        SYSTEM_ALL,
        (
            "state.add_request(budget=64, prompt=0, sid=1, suffix=[])",
            'state.end_or_chunk(op="finish", pick=0)',
        ),
    ),
    Kept(
        "B4 (--fault B4, system/paged)",
        "system",
        SYSTEM_ALL,
        (
            "state.close_session(sid=1)",
            "state.add_request(budget=64, prompt=0, sid=1, suffix=[])",
            'state.end_or_chunk(op="finish", pick=0)',
            "state.close_session(sid=1)",
        ),
    ),
    Kept(
        "a running session turn aborted, then a shorter turn (SGLang 0.5.10's B4, found by search, system/paged)",
        "system",
        SYSTEM_ALL,
        (
            "state.add_long_request(prompt=0, sid=2, suffix=[1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1])",
            "state.abort(pick=0)",
            "state.add_request(budget=64, prompt=0, sid=2, suffix=[])",
        ),
    ),
    *(
        Kept(
            f"a resumed session turn, {op}ed, then resumed (--profile thorough --seed 1)",
            "system",
            SYSTEM_ALL,
            (
                "state.add_request(budget=64, prompt=0, sid=1, suffix=[])",
                'state.end_or_chunk(op="finish", pick=0)',
                "state.add_request(budget=64, prompt=0, sid=1, suffix=[1])",
                f'state.end_or_chunk(op="{op}", pick=0)',
                "state.add_request(budget=64, prompt=0, sid=1, suffix=[2])",
            ),
        )
        for op in ("retract", "abort")
    ),
    Kept(
        "a session whose resume failed, rolled back (system/mamba)",
        "system",
        SYSTEM_ALL,
        (
            "state.add_request(budget=16, prompt=0, sid=None, suffix=[])",
            "state.add_request(budget=16, prompt=0, sid=None, suffix=[])",
            "state.add_request(budget=2, prompt=0, sid=None, suffix=[])",
            "state.add_request(budget=16, prompt=0, sid=1, suffix=[])",
            "state.admit(pick=0, budget=16)",
            "state.admit(pick=0, budget=2)",
        ),
    ),
    Kept(
        "an allocation past the cut-offs for short ones, in every form (pools: a state the search never builds)",
        "pools",
        ("token", "paged", "swa", "mamba"),
        tuple(
            f"state.long_alloc(form={form!r}, dst=Owner(kind=OwnerKind.REQUEST, ident={who}, component=None), "
            f"scrambled={scrambled})"
            for form, who, scrambled in (
                ("as handed out", 1, False),
                ("reversed", 2, True),
                ("clone", 1, True),
                ("int32", 2, False),
                ("strided", 2, True),
            )
        ),
    ),
)
"""Every kept program. Add the program ``kvledger check`` printed for a new finding here, once it is fixed (or one
that drives a machine into a state its search never builds, as the long allocations)."""


def kept_for(suite: str, model: str) -> list[Kept]:
    """The kept programs that run on ``suite``/``model``, oldest first."""
    return [k for k in KEPT if k.suite == suite and model in k.models]
