"""Lock bugs planted in the installed SGLang's scheduler: what the system machine finds with the lock laws and without.

    build/sglang-0.5.23/bin/python tests/benchmarks/bench_lock_faults.py [--seeds 1,2,3] [--model full] [--fault no-dec]

A benchmark, not a test: run it with each release's venv (``.ci/sglang_env``). A fault wraps the scheduler's tree
cache (under its session layer on 0.5.10 to 0.5.12), one call in three:

* ``no-dec``: ``dec_lock_ref`` does nothing (a lock its holder never gives back: the KV under it stays protected);
* ``no-inc``: ``inc_lock_ref`` takes the lock and gives it straight back (a holder that runs on a prefix it does not
  lock; its later release drives the counts below what the other holders hold).

Per seed, the machine runs at the ``check`` profile on ``sglang-<release>-system`` twice: as declared (lock laws on),
and with ``locks`` taken out of the adapter's capabilities (what the laws without them see). It prints the law that
broke first (or ``holds``), the examples and steps run, and the time.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from hypothesis import settings
from rich.console import Console
from rich.table import Table

from kvledger.contracts.adapters.sglang.cpu_import import installed_version_or_none
from kvledger.contracts.adapters.system import SystemAdapter, load_system_factory
from kvledger.contracts.machines.profiles import register_profiles
from kvledger.contracts.machines.runner import run_machine
from kvledger.contracts.machines.suites import SYSTEM_CONFIGS
from kvledger.contracts.machines.system import RULES, machine_for_system

FAULTS = ("no-dec", "no-inc")


def tree_cache(adapter: Any) -> Any:
    """The cache object whose lock calls the scheduler makes: the components adapter's ``cache``, else the mixin
    scheduler's tree under its session layer."""
    cache = getattr(adapter, "cache", None)
    if cache is not None:
        return cache
    tree = adapter.sched.tree_cache
    return getattr(tree, "inner", tree)


def plant(cache: Any, fault: str, every: int = 3, fires: Callable[[], bool] | None = None) -> None:
    """Wrap ``cache``'s lock calls so that one in ``every`` carries ``fault`` (or each call where ``fires()`` says so:
    ``bench_engine_faults`` counts every fault's fires alike)."""
    inc, dec = cache.inc_lock_ref, cache.dec_lock_ref
    if fires is None:
        calls = [0]

        def fires() -> bool:
            calls[0] += 1
            return calls[0] % every == 0

    def faulty_inc(node: Any, *args: Any, **kwargs: Any) -> Any:
        fire = fires()
        got = inc(node, *args, **kwargs)
        if fire:
            receipt = got.to_dec_params() if hasattr(got, "to_dec_params") else None
            dec(node, receipt) if receipt is not None else dec(node)
        return got

    def faulty_dec(node: Any, *args: Any, **kwargs: Any) -> Any:
        return None if fires() else dec(node, *args, **kwargs)

    if fault == "no-inc":
        cache.inc_lock_ref = faulty_inc
    else:
        cache.dec_lock_ref = faulty_dec


def factory(release: str, model: str, fault: str, locks: bool) -> Callable[[], SystemAdapter]:
    def make() -> SystemAdapter:
        adapter = load_system_factory(f"sglang-{release}-system")(SYSTEM_CONFIGS[model])
        plant(tree_cache(adapter), fault)
        if not locks:
            adapter.capabilities = frozenset(adapter.capabilities) - {"locks"}  # type: ignore[misc]
        return adapter

    return make


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="1,2,3", help="comma-separated Hypothesis seeds")
    parser.add_argument("--model", default="full", choices=sorted(SYSTEM_CONFIGS))
    parser.add_argument("--fault", default="no-dec", choices=FAULTS)
    parser.add_argument("--shrink-for", type=float, default=20.0, help="seconds a violation may shrink")
    args = parser.parse_args()
    release = installed_version_or_none()
    if release is None:
        raise SystemExit("SGLang is not installed: run this with a release's venv (.ci/sglang_env)")
    register_profiles()
    profile = settings(settings.get_profile("check"))
    table = Table(title=f"SGLang {release}: {args.fault} planted, system/{args.model}")
    for col in ("seed", "lock laws", "verdict", "examples", "steps", "time"):
        table.add_column(col)
    for seed in (int(s) for s in args.seeds.split(",")):
        for locks in (True, False):
            machine = machine_for_system(factory(release, args.model, args.fault, locks))
            start = time.perf_counter()
            result = run_machine(
                "system", args.model, machine, list(RULES), profile, seed=seed, shrink_for=args.shrink_for
            )
            v = result.violation
            table.add_row(
                str(seed),
                "on" if locks else "off",
                "holds" if v is None else v.rule,
                str(result.examples),
                str(result.steps),
                f"{time.perf_counter() - start:.1f}s",
            )
    Console().print(table)


if __name__ == "__main__":
    main()
