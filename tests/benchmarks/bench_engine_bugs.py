"""Time to detection and shrunk length of the seed bugs in the real SGLang releases that shipped them.

    build/sglang-0.5.11/bin/python tests/benchmarks/bench_engine_bugs.py [--seeds 10] [--first-seed 0] [--bug B5]

A benchmark, not a test: run it with each release's venv (``.ci/sglang_env``);
it checks the bugs :data:`BUGS` lists for the installed release, as
``kvledger check --adapter SPEC --model MODEL --seed S [--set-aside ...]`` would,
per seed:

* **detection**: phases explicit + generate, no shrinking; the time from the
  run's start until the failing example starts, and the examples run before it;
* **shrinking**: the same seed with every phase; the shrunk program's length.

A seed that finds nothing within the profile's examples counts as missed.
A run that breaks another law than the bug's is reported as such (a
different finding), never counted as the bug.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from hypothesis import Phase, settings
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_faults import timed

from kvledger.contracts.adapters.protocol import load_factory, set_aside
from kvledger.contracts.adapters.sglang.cpu_import import installed_version_or_none
from kvledger.contracts.adapters.system import load_system_factory
from kvledger.contracts.machines.cache import machine_for_cache
from kvledger.contracts.machines.profiles import register_profiles
from kvledger.contracts.machines.runner import run_machine
from kvledger.contracts.machines.suites import CACHE_MODELS, SYSTEM_CONFIGS
from kvledger.contracts.machines.system import machine_for_system


@dataclass(frozen=True)
class Bug:
    """One seed bug in one release: where kvledger looks for it and the laws that name it."""

    name: str
    release: str
    suite: str
    model: str
    adapter: str
    laws: tuple[str, ...]
    set_aside: frozenset[str] = frozenset()


B5_LAWS = ("inv_lock_ref_counts_handles", "implementation crashed: AssertionError")
"""B5's SWA over-release lowers counts a live lock covers (the law), or drives one below zero (SGLang's assert)."""

LOST_OWNER_LAWS = ("inv_owners_account", "inv_slots_conserved", "inv_single_owner")
"""The ledger laws that see a slot lose its owner: B4's overwritten row entries are a slot still held by the
session and named by nothing (``inv_owners_account``), or, when the overwrite and the loss fall in one step, a
slot in use that no owner ever named (``inv_slots_conserved``)."""

BUGS: tuple[Bug, ...] = (
    Bug("B1", "0.5.9", "cache", "mamba", "sglang-0.5.9-mamba", ("inv_lru_detached",)),
    Bug("B1", "0.5.11", "cache", "full", "sglang-0.5.11", ("inv_lru_detached",)),
    Bug("B1", "0.5.12", "cache", "swa", "sglang-0.5.12", ("inv_lru_detached",)),
    Bug("B5", "0.5.11", "cache", "hybrid", "sglang-0.5.11", B5_LAWS, frozenset({"lru"})),
    Bug("B5", "0.5.12", "cache", "hybrid", "sglang-0.5.12", B5_LAWS, frozenset({"lru"})),
    Bug("B2", "0.5.9", "system", "mamba", "sglang-0.5.9-system", ("admission rolls back",)),
    Bug("B3", "0.5.10", "system", "mamba", "sglang-0.5.10-system", ("leak checker agrees with the ledgers",)),
    Bug("B4", "0.5.10", "system", "paged", "sglang-0.5.10-system", LOST_OWNER_LAWS),
)
"""The seed bugs per release (``ENGINES.md``); B5's search sets B1's laws aside (0.5.11 ships both)."""


@dataclass
class SeedRun:
    seed: int
    detected: bool = False
    rule: str | None = None
    detect_s: float | None = None
    examples: int | None = None
    shrunk_len: int | None = None
    run_s: float = 0.0


@dataclass
class BugResult:
    bug: Bug
    runs: list[SeedRun] = field(default_factory=list)

    def caught(self) -> int:
        return sum(r.detected and r.rule in self.bug.laws for r in self.runs)


def _machine(bug: Bug) -> type:
    if bug.suite == "system":
        factory = load_system_factory(bug.adapter)
        cfg = SYSTEM_CONFIGS[bug.model]
        return machine_for_system(lambda: set_aside(factory(cfg), bug.set_aside))
    make = load_factory(bug.adapter)
    return machine_for_cache(lambda: set_aside(make(CACHE_MODELS[bug.model]), bug.set_aside))


def run_seed(bug: Bug, seed: int, base: settings) -> SeedRun:
    machine, starts = timed(_machine(bug))
    t0 = time.perf_counter()
    found = run_machine(
        bug.suite, bug.model, machine, [], settings(base, phases=[Phase.explicit, Phase.generate]), seed
    )
    out = SeedRun(seed, found.violation is not None, run_s=found.seconds)
    if found.violation is None:
        return out
    out.rule = found.violation.rule
    out.detect_s = starts[-1] - t0  # NOTE: the last example started is Hypothesis' replay of the failing one
    out.examples = len(starts) - 1
    shrunk = run_machine(bug.suite, bug.model, _machine(bug), [], base, seed)
    if shrunk.violation is not None:
        out.shrunk_len = shrunk.violation.length
    return out


def _med_max(xs: list[float], fmt: str) -> str:
    return f"{format(statistics.median(xs), fmt)} / {format(max(xs), fmt)}" if xs else "—"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--first-seed", type=int, default=0, help="seeds FIRST .. FIRST+SEEDS-1 (to split a run)")
    ap.add_argument("--bug", action="append", help="only these bugs (B1..B5)")
    ap.add_argument("--profile", default="ci")
    ap.add_argument("--examples", type=int, help="examples per seed (overrides the profile)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    release = installed_version_or_none()
    bugs = [b for b in BUGS if b.release == release and (not args.bug or b.name in args.bug)]
    if not bugs:
        print(f"no listed bug for the installed SGLang ({release}); run this with a release's venv", file=sys.stderr)
        return 2
    register_profiles()
    base = settings(settings.get_profile(args.profile), derandomize=False)  # NOTE: else the seed is not used
    if args.examples:
        base = settings(base, max_examples=args.examples)
    console = Console()
    results = []
    for bug in bugs:
        res = BugResult(bug)
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            run = run_seed(bug, seed, base)
            res.runs.append(run)
            console.print(f"{bug.name} {release} {bug.suite}/{bug.model} seed {seed}: {run}", highlight=False)
        results.append(res)
    table = Table(title=f"seed bugs in SGLang {release} ({args.seeds} seeds, profile {args.profile})")
    for col in (
        "bug",
        "adapter / model",
        "caught",
        "detect s (med / max)",
        "examples (med / max)",
        "shrunk (med / max)",
    ):
        table.add_column(col)
    for res in results:
        hit = [r for r in res.runs if r.detected and r.rule in res.bug.laws]
        table.add_row(
            res.bug.name,
            f"{res.bug.adapter} / {res.bug.model}"
            + (f" (set aside: {', '.join(sorted(res.bug.set_aside))})" if res.bug.set_aside else ""),
            f"{res.caught()}/{len(res.runs)}",
            _med_max([r.detect_s for r in hit if r.detect_s is not None], ".1f"),
            _med_max([float(r.examples) for r in hit if r.examples is not None], ".0f"),
            _med_max([float(r.shrunk_len) for r in hit if r.shrunk_len is not None], ".0f"),
        )
    console.print(table)
    if args.json:
        args.json.write_text(
            json.dumps(
                [
                    {"bug": asdict(r.bug) | {"set_aside": sorted(r.bug.set_aside)}, "runs": [asdict(x) for x in r.runs]}
                    for r in results
                ],
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
