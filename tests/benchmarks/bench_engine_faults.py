"""Fresh memory bugs planted in the installed SGLang's own objects: does the system machine find them?

    build/sglang-0.5.23/bin/python tests/benchmarks/bench_engine_faults.py [--seeds 1,2,3] [--model full]
        [--fault kv-free-drop,...] [--set-aside sessions] [--json out.json]

A benchmark, not a test: run it with each release's venv (``.ci/sglang_env``). The five seed bugs are the ones the
machines were built around; these are bugs nobody filed, of the kinds serving engines ship, planted in the real
scheduler's memory objects of every release alike (the KV allocator, the request-to-token pool, the tree cache),
not in kvledger's reference. Each fault fires on one call in ``--every`` (3 by default), so a run also meets the
healthy path:

* ``kv-free-drop``: the KV allocator's ``free`` does nothing (a release that forgets its slots);
* ``kv-free-short``: ``free`` gives back all but the last page (an off-by-one at the end of a range);
* ``kv-free-twice``: ``free`` gives the same slots back twice (a double free);
* ``kv-alloc-hands-back``: an ``alloc`` / ``alloc_extend`` / ``alloc_decode`` puts the first page it handed out back
  on the free list (a slot in use that the allocator counts free);
* ``row-free-drop``: the request-to-token pool's ``free`` does nothing (a row that lost its owner);
* ``lock-dec-drop``: the tree's ``dec_lock_ref`` does nothing (a lock its holder never gives back);
* ``lock-inc-undone``: ``inc_lock_ref`` takes the lock and gives it straight back (a holder running on a prefix
  it does not lock).

Per seed the machine runs at the ``check`` profile on ``sglang-<release>-system`` once unfaulted (the control: a
fault's verdict counts only where the control holds, or breaks later or by another law) and once per fault. It
prints the law that broke first (or ``holds``), the programs and steps run, and the time. A run counts as caught by
a law only when the verdict is one of the system machine's laws; SGLang's own assert (``implementation crashed``)
or another crash is counted apart, as the engine's catch, not kvledger's.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hypothesis import settings
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_lock_faults import plant as plant_lock
from bench_lock_faults import tree_cache

from kvledger.contracts.adapters.protocol import set_aside
from kvledger.contracts.adapters.sglang.cpu_import import installed_version_or_none
from kvledger.contracts.adapters.system import SystemAdapter, load_system_factory
from kvledger.contracts.machines.profiles import register_profiles
from kvledger.contracts.machines.runner import run_machine
from kvledger.contracts.machines.suites import SYSTEM_CONFIGS
from kvledger.contracts.machines.system import RULES, machine_for_system


class Every:
    """Counts calls to one planted site; ``fires()`` is true on every ``n``-th."""

    def __init__(self, n: int) -> None:
        self.n, self.calls = n, 0

    def fires(self) -> bool:
        self.calls += 1
        return self.calls % self.n == 0


def scheduler(adapter: Any) -> Any:
    """The SGLang ``Scheduler`` an adapter drives (the mixin adapters' ``sched``, the components adapters' ``s``)."""
    return getattr(adapter, "sched", None) or adapter.s


def _plant_free(allocator: Any, fault: str, every: Every) -> None:
    free = allocator.free
    unit = max(1, int(getattr(allocator, "page_size", 1)))

    def faulty(free_index: Any, *args: Any, **kwargs: Any) -> Any:
        if free_index is None or len(free_index) == 0 or not every.fires():
            return free(free_index, *args, **kwargs)
        if fault == "kv-free-drop":
            return None
        if fault == "kv-free-short":  # NOTE: a whole page short (a token short of a page frees the page anyway)
            return free(free_index[:-unit], *args, **kwargs) if len(free_index) > unit else None
        free(free_index, *args, **kwargs)
        return free(free_index.clone(), *args, **kwargs)

    allocator.free = faulty


def _plant_alloc(allocator: Any, every: Every) -> None:
    free = allocator.free

    def wrap(name: str) -> None:
        call = getattr(allocator, name, None)
        if call is None:
            return

        def faulty(*args: Any, **kwargs: Any) -> Any:
            got = call(*args, **kwargs)
            if got is not None and len(got) > 0 and every.fires():
                free(got[:1].clone())  # NOTE: the page of the first slot handed out goes back on the free list
            return got

        setattr(allocator, name, faulty)

    for name in ("alloc", "alloc_extend", "alloc_decode"):
        wrap(name)


def _plant_row(pool: Any, every: Every) -> None:
    free = pool.free

    def faulty(req: Any, *args: Any, **kwargs: Any) -> Any:
        return None if every.fires() else free(req, *args, **kwargs)

    pool.free = faulty


FAULTS: dict[str, Callable[[Any, Every], None]] = {
    "kv-free-drop": lambda a, e: _plant_free(scheduler(a).token_to_kv_pool_allocator, "kv-free-drop", e),
    "kv-free-short": lambda a, e: _plant_free(scheduler(a).token_to_kv_pool_allocator, "kv-free-short", e),
    "kv-free-twice": lambda a, e: _plant_free(scheduler(a).token_to_kv_pool_allocator, "kv-free-twice", e),
    "kv-alloc-hands-back": lambda a, e: _plant_alloc(scheduler(a).token_to_kv_pool_allocator, e),
    "row-free-drop": lambda a, e: _plant_row(scheduler(a).req_to_token_pool, e),
    "lock-dec-drop": lambda a, e: plant_lock(tree_cache(a), "no-dec", e.n),  # NOTE: bench_lock_faults' faults
    "lock-inc-undone": lambda a, e: plant_lock(tree_cache(a), "no-inc", e.n),
}
"""Each fault's planting, on a freshly built adapter (the machine builds one per program)."""


def factory(release: str, model: str, fault: str | None, every: int, aside: frozenset[str]) -> Callable[[], Any]:
    """A fresh adapter per program, with ``fault`` planted (``None``: the control)."""

    def make() -> SystemAdapter:
        adapter = set_aside(load_system_factory(f"sglang-{release}-system")(SYSTEM_CONFIGS[model]), aside)
        if fault is not None:
            FAULTS[fault](adapter, Every(every))
        return adapter

    return make


@dataclass(frozen=True)
class Run:
    fault: str
    seed: int
    verdict: str
    """The law that broke first, or ``holds``."""
    message: str
    examples: int
    steps: int
    seconds: float


def run(release: str, model: str, fault: str | None, seed: int, args: argparse.Namespace) -> Run:
    aside = frozenset(x for x in args.set_aside.split(",") if x)
    machine = machine_for_system(factory(release, model, fault, args.every, aside))
    profile = settings(settings.get_profile("check"))
    start = time.perf_counter()
    result = run_machine("system", model, machine, list(RULES), profile, seed=seed, shrink_for=args.shrink_for)
    v = result.violation
    return Run(
        fault or "(none: control)",
        seed,
        "holds" if v is None else v.rule,
        "" if v is None else str(v.message).splitlines()[0][:160],
        result.examples,
        result.steps,
        round(time.perf_counter() - start, 1),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="1,2,3", help="comma-separated Hypothesis seeds")
    parser.add_argument("--model", default="full", choices=sorted(SYSTEM_CONFIGS))
    parser.add_argument("--fault", default=",".join(FAULTS), help=f"comma-separated, of: {', '.join(FAULTS)}")
    parser.add_argument("--every", type=int, default=3, help="a fault fires on one call in this many")
    parser.add_argument("--set-aside", default="", help="capabilities (or laws) set aside, comma-separated")
    parser.add_argument("--shrink-for", type=float, default=5.0, help="seconds a violation may shrink")
    parser.add_argument("--json", type=Path, default=None, help="also write the runs here")
    args = parser.parse_args()
    release = installed_version_or_none()
    if release is None:
        raise SystemExit("SGLang is not installed: run this with a release's venv (.ci/sglang_env)")
    faults = [f for f in args.fault.split(",") if f]
    unknown = [f for f in faults if f not in FAULTS]
    if unknown:
        raise SystemExit(f"unknown fault(s) {', '.join(unknown)}: the faults are {', '.join(FAULTS)}")
    register_profiles()
    seeds = [int(s) for s in args.seeds.split(",")]
    runs = [run(release, args.model, None, seed, args) for seed in seeds]
    runs += [run(release, args.model, fault, seed, args) for fault in faults for seed in seeds]
    control = {r.seed: r for r in runs if r.fault.startswith("(")}
    table = Table(title=f"SGLang {release}: planted faults, system/{args.model}, one call in {args.every}")
    for col in ("fault", "seed", "verdict", "programs", "steps", "time", "first line"):
        table.add_column(col)
    caught = crashed = 0
    for r in runs:
        c = control[r.seed]
        found = r.verdict != "holds" and (c.verdict != r.verdict or c.examples > r.examples)
        if found and not r.fault.startswith("("):
            caught += r.verdict in RULES
            crashed += r.verdict not in RULES
        table.add_row(r.fault, str(r.seed), r.verdict, str(r.examples), str(r.steps), f"{r.seconds}s", r.message[:80])
    Console().print(table)
    planted = len(runs) - len(control)
    Console().print(
        f"caught by a law in {caught} of {planted} planted runs, by a crash (the engine's own assert) in {crashed} "
        "(a verdict other than the control's, or earlier)"
    )
    if args.json is not None:
        args.json.write_text(json.dumps({"release": release, "model": args.model, "runs": [asdict(r) for r in runs]}))


if __name__ == "__main__":
    main()
