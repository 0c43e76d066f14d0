"""Soak benchmark (not a test): a long mixed workload on the memory manager, watching RSS and the leak checker.

    python tests/benchmarks/soak.py [--ops 200000] [--mamba] [--page-size 1] [--fault B3] [--seed 0]

Sessions open, resume and close; requests arrive, are admitted under tight
budgets, extend with speculative over-allocation, chunk, finish, get retracted
or aborted; 1% of allocations fail by injection. After every ``--check-every``-th
op the leak checker runs (exactly ``ops // check_every`` times, whatever the op
did); at the end everything is released and the idle check runs. On a terminal a
live bar shows ops, ops/s, checks and elapsed time; elsewhere each check prints a
line on stderr.
Prints operations run, peak and final RSS, RSS growth per 100k operations
(least squares over the samples after the first 10%), and the checker's verdict.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from collections.abc import Callable

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from kvledger.impl import faults
from kvledger.impl.admission import Budget, admit
from kvledger.impl.allocators import PagedAllocator, TokenAllocator
from kvledger.impl.leaks import check_leaks
from kvledger.impl.mamba import MambaPool
from kvledger.impl.memory import MemoryManager
from kvledger.impl.radix import RadixCache
from kvledger.impl.req_to_token import ReqToTokenPool
from kvledger.impl.requests import Status
from kvledger.spec.errors import KVLedgerError

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE / 2**20


def build(page_size: int, mamba: bool) -> MemoryManager:
    kv = TokenAllocator(8192) if page_size == 1 else PagedAllocator(8192 // page_size, page_size)
    pool = MambaPool(96, conv_shape=(4, 8), temporal_shape=(4, 8), ping_pong_size=1) if mamba else None
    return MemoryManager(RadixCache(kv, mamba=pool), ReqToTokenPool(48, 512))


def one_op(mm: MemoryManager, rng: random.Random, prompts: list[tuple[int, ...]]) -> None:
    """One random scheduler operation (a kvledger error it raises is the workload's business)."""
    r = rng.random()
    running = mm.running()
    if r < 0.25 or not running:
        sid = rng.choice([None, None, 1, 2, 3]) if rng.random() < 0.5 else None
        if sid is not None and sid not in mm.sessions.slots:
            mm.sessions.open(sid)
        slot = mm.sessions.slots.get(sid) if sid is not None else None
        if slot is not None and slot.lent_to is not None:
            return  # the session's turn is still running: nothing to add this op
        base = slot.tokens if slot is not None and slot.tokens else rng.choice(prompts)
        toks = (base + tuple(rng.randint(1, 50) for _ in range(rng.randint(1, 32))))[:400]
        req = mm.add_request(toks, sid)
        admit(mm, [req], Budget(rng.choice([64, 256, 1024]), 1))
        if req.status is Status.WAITING:
            mm.abort(req)
    elif r < 0.7:
        req = rng.choice(running)
        if req.kv_len + 12 < 480:
            mm.extend(req, tuple(rng.randint(1, 50) for _ in range(rng.randint(1, 8))), rng.randint(0, 4))
        else:
            mm.finish(req)
    elif r < 0.85:
        mm.finish(rng.choice(running))
    elif r < 0.9:
        mm.chunk(rng.choice(running))
    elif r < 0.95:
        mm.retract(req := rng.choice(running))
        mm.abort(req)
    else:
        sid = rng.choice([1, 2, 3])
        slot = mm.sessions.slots.get(sid)
        if slot is not None and slot.lent_to is None:
            mm.sessions.close(sid)


def soak(
    ops: int,
    page_size: int,
    mamba: bool,
    seed: int,
    check_every: int,
    tick: Callable[[int, int, int], None] | None = None,
) -> dict[str, object]:
    """Run ``ops`` operations; the leak checker runs after every ``check_every``-th one (``ops // check_every`` times).

    ``tick(ops done, periodic checks, checks that saw leaks)`` is called after each periodic check.
    """
    rng = random.Random(seed)
    mm = build(page_size, mamba)
    prompts = [tuple(rng.randint(1, 50) for _ in range(rng.randint(16, 96))) for _ in range(8)]
    samples: list[tuple[int, float]] = []
    checks = leaks_seen = 0
    start = time.perf_counter()
    for i in range(1, ops + 1):
        # NOTE: the op is a function so that no branch of it can skip the bookkeeping and the periodic check below
        try:
            one_op(mm, rng, prompts)
            if rng.random() < 0.01:
                mm.fail_next += 1
        except KVLedgerError:
            pass
        for rid in [rid for rid, q in mm.requests.items() if q.status in (Status.FINISHED, Status.ABORTED)]:
            del mm.requests[rid]
        if i % check_every == 0:
            checks += 1
            leaks_seen += not check_leaks(mm).ok
            samples.append((i, rss_mib()))
            if tick is not None:
                tick(i, checks, leaks_seen)
    for req in list(mm.requests.values()):
        mm.abort(req)
    for sid in list(mm.sessions.slots):
        mm.sessions.close(sid)
    idle = check_leaks(mm)
    seconds = time.perf_counter() - start
    tail = samples[len(samples) // 10 :] or [(ops, rss_mib())]
    n = len(tail)
    mx = sum(x for x, _ in tail) / n
    my = sum(y for _, y in tail) / n
    var = sum((x - mx) ** 2 for x, _ in tail) or 1.0
    slope = sum((x - mx) * (y - my) for x, y in tail) / var
    return {
        "ops": ops,
        "seconds": round(seconds, 1),
        "ops_per_s": round(ops / seconds),
        "peak_rss_mib": round(max((y for _, y in samples), default=rss_mib()), 1),
        "final_rss_mib": round(rss_mib(), 1),
        "rss_growth_mib_per_100k_ops": round(slope * 100_000, 2),
        "periodic_checks": checks,
        "periodic_checks_with_leaks": leaks_seen,
        "idle_check_ok": idle.ok,
        "idle_leaked_slots": {k: len(v) for k, v in idle.leaked().items()},
        "events": len(mm.events),
    }


def with_progress(ops: int, run: Callable[[Callable[[int, int, int], None]], dict[str, object]]) -> dict[str, object]:
    """Run the soak with a live bar on a terminal (ops, ops/s, checks, elapsed), else one stderr line per check."""
    err = Console(stderr=True, highlight=False)
    start = time.perf_counter()
    with Progress(
        TextColumn("[bold]soak"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("ops  {task.fields[rate]}  {task.fields[checks]} leak checks ({task.fields[leaky]} with leaks)"),
        TimeElapsedColumn(),
        console=err,
        transient=True,
        disable=not err.is_terminal,
    ) as progress:
        task = progress.add_task("soak", total=ops, rate="", checks=0, leaky=0)

        def tick(done: int, checks: int, leaky: int) -> None:
            rate = f"{done / max(time.perf_counter() - start, 1e-9):,.0f} ops/s"
            if err.is_terminal:
                progress.update(task, completed=done, rate=rate, checks=checks, leaky=leaky)
            else:
                print(f"soak: {done}/{ops} ops, {rate}, {checks} leak checks ({leaky} with leaks)", file=sys.stderr)

        return run(tick)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ops", type=int, default=200_000)
    ap.add_argument("--page-size", type=int, default=1)
    ap.add_argument("--mamba", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--check-every", type=int, default=5_000)
    ap.add_argument("--fault", action="append", default=[])
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.ops < 1 or a.check_every < 1:
        ap.error("--ops and --check-every must be at least 1")
    faults.enable(*a.fault)
    result = with_progress(a.ops, lambda tick: soak(a.ops, a.page_size, a.mamba, a.seed, a.check_every, tick))
    result["faults"] = a.fault
    if a.json:
        print(json.dumps(result, indent=2))
        return
    table = Table(title=f"soak: page {a.page_size}, mamba {a.mamba}, faults {a.fault or 'none'}")
    table.add_column("measure")
    table.add_column("value", justify="right")
    for k, v in result.items():
        table.add_row(k, str(v))
    Console().print(table)


if __name__ == "__main__":
    main()
