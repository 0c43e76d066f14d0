"""Contract cost per radix-cache operation on the race's trace, off vs on, in one process (a benchmark, not a test).

    python tests/benchmarks/bench_contract_cost.py [--page 1] [--requests 1000] [--rounds 3] [--workload NAME]
                                                   [--clock wall|cpu]

The trace is ``bench_sglang_race.make_workload(WORKLOAD, REQUESTS, seed=1)`` (default
the first of its suite) run through its ``KvledgerOps`` loop in the workload's pool
(eviction all along, with the workload's slack); every operation is
timed; contracts ``off`` and ``on`` take turns ``--rounds`` times and the best of
each is kept. Prints one JSON line: seconds per operation at each level and
their ratio on/off (the contract cost of each operation). ``--workload all``
prints one line per workload of the suite; ``--clock cpu`` times by the process'
CPU time (``time.process_time``), which other jobs on a shared machine disturb less
than the wall clock.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import bench_sglang_race as race

from kvledger.contracts import bindings
from kvledger.impl.radix import RadixCache

OPS = {
    "match": "match_prefix",
    "lock": "inc_lock_ref",
    "unlock": "dec_lock_ref",
    "evict": "evict",
    "insert": "insert",
}


def timed(fn: Callable[..., Any], stats: dict[str, float], name: str) -> Callable[..., Any]:
    """``fn``, adding the seconds each call takes to ``stats[name]``."""

    def call(*args: Any, **kwargs: Any) -> Any:
        t = race.clock()
        try:
            return fn(*args, **kwargs)
        finally:
            stats[name] += race.clock() - t

    return call


def one_run(w: race.Workload, page: int) -> dict[str, float]:
    """Seconds per operation (and the whole loop) for one pass of ``trace`` at the installed tier."""
    stats = dict.fromkeys([*OPS, "alloc"], 0.0)
    saved = {attr: RadixCache.__dict__[attr] for attr in OPS.values()}
    try:
        for name, attr in OPS.items():
            setattr(RadixCache, attr, timed(saved[attr], stats, name))
        ops = race.KvledgerOps(w.pool(page), page)
        ops.kv.alloc = timed(ops.kv.alloc, stats, "alloc")  # type: ignore[method-assign]
        stats["loop"] = race.run_trace(ops, w.requests, page, w.slack(page))["seconds"]
    finally:
        for attr, fn in saved.items():
            setattr(RadixCache, attr, fn)
    return stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--page", type=int, default=1)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--workload", default=next(iter(race.WORKLOADS)), choices=[*race.WORKLOADS, "all"], help="a workload, or all"
    )
    parser.add_argument("--clock", choices=sorted(race.CLOCKS), default="wall", help="wall clock or process CPU time")
    args = parser.parse_args()
    race.clock = race.CLOCKS[args.clock]
    for name in race.WORKLOADS if args.workload == "all" else [args.workload]:
        measure(name, args.page, args.requests, args.rounds, args.clock)


def measure(workload: str, page: int, requests: int, rounds: int, clock: str) -> None:
    """Print one JSON line: ``workload``'s best seconds per operation off and on, and their ratios."""
    trace = race.make_workload(workload, requests, seed=1)
    best: dict[str, dict[str, float]] = {}
    for _ in range(rounds):
        for level in ("off", "on"):
            bindings.install(level)  # type: ignore[arg-type]
            got = one_run(trace, page)
            bindings.uninstall()
            prior = best.get(level)
            best[level] = got if prior is None else {k: min(v, prior[k]) for k, v in got.items()}
    ratio = {k: round(best["on"][k] / best["off"][k], 2) for k in best["off"] if best["off"][k]}
    rounded = {lvl: {k: round(v, 4) for k, v in s.items()} for lvl, s in best.items()}
    print(json.dumps({"workload": workload, "page": page, "clock": clock, **rounded, "on/off": ratio}), flush=True)


if __name__ == "__main__":
    main()
