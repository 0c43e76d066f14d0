"""Time to detection and counterexample length of every named fault, over several seeds (a benchmark, not a test).

    python tests/benchmarks/bench_faults.py [--seeds 10] [--fault B5] [--model hybrid] [--json PATH]

For each fault of ``kvledger.impl.faults.FAULTS`` (new ones are picked up by
themselves), each (suite, model) where it can manifest (``Fault.suites``; a
fault that needs particular components is narrowed by ``MANIFESTS``), and
each seed, the conformance machine runs twice with the fault injected, like
``kvledger check --fault NAME --seed SEED``:

* **detection**: phases explicit + generate, no shrinking. Time from the
  run's start until the failing example is over, and examples run up to and
  including the failing one (Hypothesis' final replay of it is not counted).
* **shrinking**: the same seed with every phase: the shrunk counterexample's
  length (operations, invariant checks left out) and the run's total time.

Each run's violated rule must be one of ``Fault.laws``. A seed whose detection
run finds nothing within the profile's examples counts as missed, and its
shrinking run is skipped (the same seed generates the same examples).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from hypothesis import Phase, settings
from hypothesis.stateful import RuleBasedStateMachine
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

import kvledger.contracts.machines.runner as runner
from kvledger.contracts import bindings
from kvledger.contracts.machines.profiles import PROFILES, register_profiles
from kvledger.contracts.machines.runner import CheckResult, run_machine
from kvledger.contracts.machines.suites import SUITES
from kvledger.impl import faults
from kvledger.impl.faults import FAULTS, Fault

MANIFESTS: dict[str, tuple[tuple[str, str], ...]] = {
    "B2": (("system", "mamba"),),
    "B3": (("system", "mamba"),),
    "B5": (("cache", "hybrid"),),
}
"""The (suite, model) pairs where a fault can manifest, when that is not every model of its ``Fault.suites``.

B2 and B3 leak Mamba state: only models with a Mamba pool. B5 needs an SWA
component (the ancestors' SWA locks it over-releases) and a Mamba one (the
copy-on-write path it lives on): only the cache's ``hybrid`` model has both.
A fault not listed here (or whose listed pairs no longer exist) runs on every
model of every suite it names; ``--all-models`` ignores this table. A
``models`` attribute on the fault itself (model names or (suite, model)
pairs), should ``Fault`` grow one, takes precedence.
"""


def targets(fault: Fault, everywhere: bool = False) -> list[tuple[str, str]]:
    """The (suite, model) pairs where ``fault`` can manifest (all of its suites' models with ``everywhere``)."""
    pairs = [(suite, model) for suite in fault.suites if suite in SUITES for model in SUITES[suite].models]
    declared = getattr(fault, "models", None) or MANIFESTS.get(fault.name)
    if everywhere or not declared:
        return pairs
    picked = [(s, m) for s, m in pairs if m in declared or (s, m) in declared]
    return picked or pairs


# ------------------------------------------------------------------ one seed


@dataclass
class SeedRun:
    """Both runs of one seed. Fields of the detection run are ``None`` when it found nothing."""

    seed: int
    detected: bool
    detect_s: float | None = None
    examples: int | None = None
    raw_len: int | None = None
    rule: str | None = None
    shrink_s: float | None = None
    shrunk_len: int | None = None
    shrunk_rule: str | None = None
    detect_run_s: float = 0.0


def timed(machine: type[RuleBasedStateMachine]) -> tuple[type[RuleBasedStateMachine], list[float]]:
    """A subclass of ``machine`` that records when each example (machine) starts."""
    starts: list[float] = []

    class Timed(machine):  # type: ignore[valid-type,misc]
        def __init__(self) -> None:
            starts.append(time.perf_counter())
            super().__init__()

    Timed.__name__ = machine.__name__
    Timed.__qualname__ = machine.__qualname__
    return Timed, starts


def run_seed(fault: Fault, suite: str, model: str, seed: int, base: settings, shrink: bool) -> SeedRun:
    """Detection run, then (if it found the fault and ``shrink``) the shrinking run, both with ``fault`` on."""
    find = settings(base, phases=[Phase.explicit, Phase.generate])
    machine, starts = timed(SUITES[suite].models[model]())
    with faults.injected(fault.name):
        t0 = time.perf_counter()
        found: CheckResult = run_machine(suite, model, machine, [], find, seed)
    out = SeedRun(seed, found.violation is not None, detect_run_s=found.seconds)
    if found.violation is None:
        return out
    # NOTE: the last example started is Hypothesis' replay of the failing one: detection is when it starts.
    out.detect_s = starts[-1] - t0
    out.examples = len(starts) - 1
    out.raw_len = found.violation.length
    out.rule = found.violation.rule
    if shrink:
        with faults.injected(fault.name):
            shrunk = run_machine(suite, model, SUITES[suite].models[model](), [], base, seed)
        out.shrink_s = shrunk.seconds
        if shrunk.violation is not None:
            out.shrunk_len = shrunk.violation.length
            out.shrunk_rule = shrunk.violation.rule
    return out


# ------------------------------------------------------------------ per (fault, suite, model)


@dataclass
class FaultResult:
    fault: str
    suite: str
    model: str
    laws: tuple[str, ...]
    runs: list[SeedRun] = field(default_factory=list)

    def values(self, attr: str) -> list[float]:
        return [float(v) for r in self.runs if (v := getattr(r, attr)) is not None]

    @property
    def caught(self) -> int:
        return sum(r.detected for r in self.runs)

    def rules(self) -> Counter[str]:
        return Counter(rule for r in self.runs for rule in (r.rule, r.shrunk_rule) if rule is not None)

    @property
    def rules_expected(self) -> bool:
        return all(rule in self.laws for rule in self.rules())

    def summary(self) -> dict[str, Any]:
        def stats(attr: str) -> dict[str, float | None]:
            xs = self.values(attr)
            return {"median": statistics.median(xs) if xs else None, "max": max(xs) if xs else None}

        return {
            "seeds": len(self.runs),
            "caught": self.caught,
            "detect_s": stats("detect_s"),
            "examples": stats("examples"),
            "raw_len": stats("raw_len"),
            "shrunk_len": stats("shrunk_len"),
            "shrink_s": stats("shrink_s"),
            "rules": dict(self.rules()),
            "rules_expected": self.rules_expected,
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "fault": self.fault,
            "suite": self.suite,
            "model": self.model,
            "laws": list(self.laws),
            "summary": self.summary(),
            "runs": [asdict(r) for r in self.runs],
        }


def _med_max(xs: list[float], fmt: str) -> str:
    if not xs:
        return "—"
    return f"{format(statistics.median(xs), fmt)} / {format(max(xs), fmt)}"


def results_table(results: Sequence[FaultResult], title: str) -> Table:
    table = Table(title=title)
    cols = (
        "fault",
        "suite/model",
        "caught",
        "detect s (med / max)",
        "examples (med / max)",
        "unshrunk steps",
        "shrunk steps (med / max)",
        "shrink run s (med / max)",
        "rules that fired (both runs)",
        "in Fault.laws",
    )
    for col in cols:
        table.add_column(col, justify="left" if col in cols[:2] or col.startswith("rules") else "right")
    for r in results:
        rules = ", ".join(f"{rule} ×{n}" for rule, n in r.rules().most_common())
        table.add_row(
            r.fault,
            f"{r.suite}/{r.model}",
            f"{r.caught}/{len(r.runs)}",
            _med_max(r.values("detect_s"), ".2f"),
            _med_max(r.values("examples"), ".0f"),
            _med_max(r.values("raw_len"), ".0f"),
            _med_max(r.values("shrunk_len"), ".0f"),
            _med_max(r.values("shrink_s"), ".1f"),
            rules or "—",
            ("[green]yes[/green]" if r.rules_expected else "[red]NO[/red]") if r.caught else "—",
        )
    return table


# ------------------------------------------------------------------ main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=10, help="seeds per (fault, model): 0..N-1 (default 10)")
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--fault", action="append", help=f"fault(s) to run (default all: {', '.join(FAULTS)})")
    p.add_argument("--model", action="append", help="only these models (default: where each fault can manifest)")
    p.add_argument("--all-models", action="store_true", help="every model of the fault's suites (ignore MANIFESTS)")
    p.add_argument("--profile", default="ci", choices=PROFILES, help="Hypothesis profile (default ci), randomised")
    p.add_argument("--max-examples", type=int, default=None, help="override the profile's max_examples")
    p.add_argument("--steps", type=int, default=None, help="override the profile's stateful_step_count")
    p.add_argument("--contracts", default="on", choices=bindings.LEVELS, help="contract tier (default on)")
    p.add_argument("--no-shrink", action="store_true", help="skip the shrinking runs")
    p.add_argument("--unfair", action="store_true", help="run without the fair schedule (machines.fair), as before it")
    p.add_argument("--json", type=Path, default=None, metavar="PATH", help="also write the results as JSON")
    args = p.parse_args(argv)
    for name in args.fault or []:
        if name not in FAULTS:
            p.error(f"unknown fault {name!r}; known: {', '.join(FAULTS)}")
    return args


def _console() -> Console:
    wide = not sys.stdout.isatty() and "COLUMNS" not in os.environ
    return Console(width=200) if wide else Console()


def main(argv: Sequence[str] | None = None, console: Console | None = None) -> dict[str, Any]:
    """Run every fault over the seeds, print the table, return (and with ``--json`` write) the results."""
    args = parse_args(argv)
    console = console or _console()
    register_profiles()
    if args.unfair:
        runner.fair = lambda machine, *_, **__: machine  # type: ignore[assignment]
    overrides: dict[str, Any] = {"derandomize": False}
    if args.max_examples is not None:
        overrides["max_examples"] = args.max_examples
    if args.steps is not None:
        overrides["stateful_step_count"] = args.steps
    base = settings(settings.get_profile(args.profile), **overrides)
    names = args.fault or list(FAULTS)
    jobs = [
        (FAULTS[name], suite, model)
        for name in names
        for suite, model in targets(FAULTS[name], args.all_models)
        if not args.model or model in args.model
    ]
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    console.print(
        f"{len(jobs)} (fault, model) pairs x {len(seeds)} seeds; profile {args.profile} randomised "
        f"(max_examples {base.max_examples}, stateful_step_count {base.stateful_step_count}); "
        f"contracts {args.contracts}; torch {torch.__version__}, {os.cpu_count()} CPUs shared with other jobs "
        "(times are indicative)"
    )
    saved = bindings.current_level()
    results: list[FaultResult] = []
    start = time.perf_counter()
    try:
        bindings.install(args.contracts)
        with Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        ) as progress:
            task = progress.add_task("faults", total=len(jobs) * len(seeds))
            for fault, suite, model in jobs:
                res = FaultResult(fault.name, suite, model, fault.laws)
                for seed in seeds:
                    progress.update(task, description=f"{fault.name} {suite}/{model} seed {seed}")
                    res.runs.append(run_seed(fault, suite, model, seed, base, not args.no_shrink))
                    progress.advance(task)
                results.append(res)
    finally:
        bindings.install(saved)
    elapsed = time.perf_counter() - start
    console.print(
        results_table(
            results,
            f"named faults: detection and shrunk counterexamples over seeds {seeds.start}..{seeds.stop - 1} "
            f"({elapsed:,.0f} s in all)",
        )
    )
    payload: dict[str, Any] = {
        "meta": {
            "profile": args.profile,
            "max_examples": base.max_examples,
            "stateful_step_count": base.stateful_step_count,
            "contracts": args.contracts,
            "seeds": list(seeds),
            "shrink": not args.no_shrink,
            "torch": torch.__version__,
            "cpus": os.cpu_count(),
            "seconds": elapsed,
        },
        "results": [r.to_json() for r in results],
    }
    if args.json is not None:
        args.json.write_text(json.dumps(payload, indent=2))
    return payload


if __name__ == "__main__":
    main()
