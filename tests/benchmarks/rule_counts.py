"""How often each rule of each conformance machine runs in ``kvledger check``'s default run (a measurement).

    python tests/benchmarks/rule_counts.py [--suite pools] [--model token] [--examples 60] [--seed N]
                                           [--unfair] [--all] [--json PATH]

A rule the search never runs checks nothing, whatever laws stand behind it. For
each (suite, model) this runs the machine as ``kvledger check`` does (the
``check`` profile: the ``ci`` settings at 100 examples, the runner, kept programs left out) and counts, per rule, the
steps that ran it in the examples the search generated (Hypothesis' rule draws,
counted where the machine's rule strategy returns them). It prints, per model,
the steps, the least-run and most-run rules, and the rules that never ran;
``--all`` prints every count.

``--unfair`` runs without :mod:`kvledger.contracts.machines.fair`'s schedule
(every example unscheduled, as before it existed), for a before/after in one run.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path
from typing import Any

from hypothesis import Phase, stateful
from hypothesis import settings as Settings
from rich.console import Console
from rich.table import Table

import kvledger.contracts.machines.runner as runner
from kvledger.contracts.machines.profiles import register_profiles
from kvledger.contracts.machines.suites import SUITES


def _counting_draws(counts: Counter[str]) -> Any:
    """Patch Hypothesis' rule strategy so each drawn rule is counted; returns the original to restore."""
    original = stateful.RuleStrategy.do_draw

    def do_draw(self: Any, data: Any) -> Any:
        rule, arguments = original(self, data)
        counts[rule.function.__name__] += 1
        return rule, arguments

    stateful.RuleStrategy.do_draw = do_draw  # type: ignore[method-assign]
    return original


def measure(suite: str, model: str, settings: Settings, seed: int | None, unfair: bool) -> dict[str, Any]:
    """Run one machine as the default check does; the count of every rule it has."""
    machine = SUITES[suite].models[model]()
    names = sorted(r.function.__name__ for r in machine.setup_state().rules)
    counts: Counter[str] = Counter()
    original = _counting_draws(counts)
    saved = runner.fair
    if unfair:
        runner.fair = lambda m, *a, **k: m  # type: ignore[assignment]
    try:
        result = runner.run_machine(suite, model, machine, [], settings, seed)
    finally:
        stateful.RuleStrategy.do_draw = original  # type: ignore[method-assign]
        runner.fair = saved
    every = {name: counts.get(name, 0) for name in names}
    return {"suite": suite, "model": model, "steps": result.steps, "ok": result.ok, "counts": every}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", choices=sorted(SUITES))
    parser.add_argument("--model")
    parser.add_argument(
        "--examples", type=int, default=None, help="examples per model (default: the check profile's, 100)"
    )
    parser.add_argument("--seed", type=int, default=None, help="a seed (default: the check profile's fixed draws)")
    parser.add_argument("--unfair", action="store_true", help="leave the fair schedule out")
    parser.add_argument("--no-target", action="store_true", help="leave Hypothesis' targeting phase out")
    parser.add_argument("--all", action="store_true", help="print every rule's count")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    register_profiles()
    overrides: dict[str, Any] = {}
    if args.examples is not None:
        overrides["max_examples"] = args.examples
    if args.seed is not None:
        overrides["derandomize"] = False
    if args.no_target:
        overrides["phases"] = [p for p in Settings.get_profile("check").phases if p is not Phase.target]
    settings = Settings(Settings.get_profile("check"), **overrides)
    jobs = [(s, m) for s in SUITES for m in SUITES[s].models if args.suite in (None, s) and args.model in (None, m)]
    table = Table(title="rule counts in the default run" + (" (unfair)" if args.unfair else ""))
    for column in ("suite", "model", "steps", "least run", "most run", "never ran"):
        table.add_column(column)
    out = []
    for suite, model in jobs:
        row = measure(suite, model, settings, args.seed, args.unfair)
        out.append(row)
        ranked = sorted(row["counts"].items(), key=lambda kv: (kv[1], kv[0]))
        ran = [(n, c) for n, c in ranked if c]
        never = [n for n, c in ranked if not c]
        least = f"{ran[0][0]} {ran[0][1]}" if ran else "-"
        most = f"{ran[-1][0]} {ran[-1][1]}" if ran else "-"
        table.add_row(suite, model, str(row["steps"]), least, most, ", ".join(never) or "-")
        if args.all:
            print(f"{suite}/{model}: " + " ".join(f"{n}:{c}" for n, c in ranked))
    Console().print(table)
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
