"""Allocator throughput against SGLang's, and contract overhead, measured in one run (a benchmark, not a test).

    python tests/benchmarks/bench_pools.py [--device cpu|cuda] [--seconds 1.0] [--rounds 3] [--clock cpu|wall]
                                           [--sglang-venv build/sglang-0.5.9]

1. Against SGLang. kvledger's ``TokenAllocator`` (page size 1) and
   ``PagedAllocator`` (page sizes 16 and 64) against SGLang's ``TokenToKVPoolAllocator``
   and ``PagedTokenToKVPoolAllocator`` (``sglang.srt.mem_cache.allocator``,
   0.5.9; CPU, ``need_sort=False`` as a scheduler without disaggregation runs
   them), at capacities of 1k, 10k, 100k and 1M tokens (``--capacities``), on two workloads:

   * ``cycle``: alloc(256 tokens) then its free, on a pool kept half full;
   * ``mix``: a seeded stream of allocations of 1 page to 4k tokens (prefills)
     and of one page (decode steps) and frees of a random live allocation
     (request ends), holding the pool between 30 % and 90 % full; the stream is
     generated once from ``--seed`` and the pool's capacity, so both sides run
     the very same operations.

   The race runs in one process of the venv that has SGLang (``.ci/sglang_env 0.5.9``
   builds ``build/sglang-0.5.9``; it layers on this checkout's venv, so it runs this
   kvledger), the two sides taking turns on each configuration, ``--rounds`` times,
   best of each kept; without that venv only kvledger is measured.
   Operations per second and the ratio kvledger/SGLang (> 1: kvledger faster).
2. Contract cost. Each kvledger allocator (token, paged16, paged64, SWA, Mamba) at
   1k, 10k and 1M (those of ``--capacities``): alloc+free cycles per second with contracts never installed
   ("plain"), installed then removed ("off"), and the incremental tier
   ("on"), the three taking turns ``--rounds`` times, best of each kept; the
   on/off ratio is the cost of leaving contracts on.

``--clock cpu`` (the default) times this process's CPU time, not the wall clock:
on a machine shared with other jobs the wall clock also counts the time the
process waited for a core, which moves by 2-3x from one measurement to the next.
All ratios are taken within this run; the machine's load average is printed with them.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CAPACITIES = (1_000, 10_000, 100_000, 1_000_000)
PAGES = (1, 16, 64)
WORKLOADS = ("cycle", "mix")

Op = tuple[int, int]
"""One step of a workload: ``(+tokens, slot)`` allocates into live slot ``slot``; ``(-1, slot)`` frees it."""


def make_mix(capacity: int, page: int, ops: int, seed: int) -> list[Op]:
    """A seeded alloc/free stream over ``capacity`` tokens of pages of ``page`` tokens (see the docstring)."""
    rng = random.Random(f"{seed}:{capacity}:{page}")
    pages = capacity // page
    used, live, out = 0, {}, list[Op]()  # live: slot -> pages
    free_slots = list(range(ops))
    for _ in range(ops):
        grow = rng.random() < 0.5
        size = 1 if rng.random() < 0.6 else -(-rng.randint(page, min(4096, capacity // 8)) // page)
        if live and (used + size > 0.9 * pages or (not grow and used > 0.3 * pages)):
            slot = rng.choice(list(live))
            used -= live.pop(slot)
            free_slots.append(slot)
            out.append((-1, slot))
        else:
            slot = free_slots.pop()
            live[slot] = size
            used += size
            out.append((size * page, slot))
    for slot in list(live):  # NOTE: the stream ends with the pool as it began, so it can run again
        out.append((-1, slot))
    return out


# ---------------------------------------------------------------- the two sides, one interface


class KvledgerSide:
    """kvledger's allocator of ``capacity`` tokens, page ``page``."""

    def __init__(self, capacity: int, page: int, device: str) -> None:
        from kvledger.impl.allocators import PagedAllocator, TokenAllocator
        from kvledger.spec.types import request

        self.a: Any = TokenAllocator(capacity, device=device)
        if page > 1:
            self.a = PagedAllocator(capacity // page, page, device=device)
        self.owner = request(1)

    def available(self) -> int:
        return int(self.a.available_size())

    def alloc(self, n: int) -> Any:
        return self.a.alloc(n, self.owner)

    def free(self, x: Any) -> None:
        self.a.free(x, self.owner)


class SGLangSide:
    """SGLang 0.5.9's allocator of ``capacity`` tokens, page ``page`` (CPU, no KV buffer, ``need_sort=False``)."""

    def __init__(self, capacity: int, page: int, device: str) -> None:
        import torch

        from kvledger.contracts.adapters.sglang.legacy import _sglang

        sg = _sglang()[1].allocator
        if page > 1:
            self.a = sg.PagedTokenToKVPoolAllocator(capacity, page, torch.int64, device, None, False)
        else:
            self.a = sg.TokenToKVPoolAllocator(capacity, torch.int64, device, None, False)

    def available(self) -> int:
        return int(self.a.available_size())

    def alloc(self, n: int) -> Any:
        out = self.a.alloc(n)
        if out is None:
            raise RuntimeError(f"SGLang allocator: {n} tokens not available")
        return out

    def free(self, x: Any) -> None:
        self.a.free(x)


def sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


CLOCKS: dict[str, Callable[[], float]] = {"cpu": time.process_time, "wall": time.perf_counter}


def rate(step: Callable[[], int], seconds: float, device: str, clock: str = "cpu") -> float:
    """Operations per second of ``step`` (which returns how many it did), run for about ``seconds`` of ``clock``."""
    now = CLOCKS[clock]
    step()
    n, start = 0, now()
    while True:
        n += step()
        sync(device)
        elapsed = now() - start
        if elapsed >= seconds:
            return n / elapsed


def workload(side: Any, name: str, capacity: int, page: int, batch: int, seed: int) -> Callable[[], int]:
    """One round of workload ``name`` on ``side`` as a step for ``rate``."""
    if name == "cycle":
        side.alloc(side.available() // 2 // page * page)  # NOTE: half full, as before

        def cycle() -> int:
            for _ in range(50):
                side.free(side.alloc(batch))
            return 100

        return cycle
    ops = make_mix(capacity, page, 2000, seed)
    live: dict[int, Any] = {}

    def mix() -> int:
        for size, slot in ops:
            if size > 0:
                live[slot] = side.alloc(size)
            else:
                side.free(live.pop(slot))
        return len(ops)

    return mix


def race(args: argparse.Namespace, sides: dict[str, Callable[[int, int, str], Any]]) -> list[dict[str, Any]]:
    """Every configuration on every side, the sides taking turns (in turn order, then reversed), ``--rounds``
    times: the best operations per second of each side, one row per configuration."""
    best: dict[tuple[str, int, int, str], float] = {}
    for r in range(args.rounds):
        for name in WORKLOADS:
            for page in PAGES:
                for capacity in args.capacities:
                    for side, side_of in sides.items() if r % 2 == 0 else reversed(sides.items()):
                        a = side_of(capacity, page, args.device)
                        step = workload(a, name, capacity, page, args.batch, args.seed)
                        got = rate(step, args.seconds, args.device, args.clock)
                        key = (name, page, capacity, side)
                        best[key] = max(best.get(key, 0.0), got)
    rows = []
    for name in WORKLOADS:
        for page in PAGES:
            for capacity in args.capacities:
                row = {"workload": name, "page": page, "capacity": capacity}
                rows.append(row | {f"{side}_ops_per_s": best[(name, page, capacity, side)] for side in sides})
    return rows


def race_rows(args: argparse.Namespace) -> tuple[list[dict[str, Any]], bool]:
    """The race's rows, and whether SGLang ran: in a worker of the SGLang venv (both sides in one process), else
    kvledger alone here."""
    python = args.sglang_venv / "bin" / "python"
    if not python.exists():
        return race(args, {"kvledger": KvledgerSide}), False
    cmd = [str(python), __file__, "--worker", "--seconds", str(args.seconds), "--batch", str(args.batch)]
    cmd += ["--seed", str(args.seed), "--device", args.device, "--rounds", str(args.rounds), "--clock", args.clock]
    cmd += ["--capacities", ",".join(map(str, args.capacities))]
    env = {**os.environ, "KVLEDGER_CONTRACTS": "off"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if done.returncode:
        sys.stderr.write(done.stderr[-3000:])
        raise RuntimeError(f"the SGLang worker failed ({done.returncode})")
    return [json.loads(line[7:]) for line in done.stdout.splitlines() if line.startswith("RESULT ")], True


# ---------------------------------------------------------------- contract cost


def make_cycle(kind: str, capacity: int, batch: int, device: str) -> Callable[[], int] | None:
    """50 cycles of an alloc of ``batch`` tokens and its free, on a pool of ``capacity`` token slots kept half full
    (``None`` when the half-full pool has fewer than ``batch`` free: the SWA pool at 1k)."""
    from kvledger.impl.allocators import PagedAllocator, SWATokenAllocator, TokenAllocator
    from kvledger.impl.mamba import MambaPool
    from kvledger.spec.types import request

    owner = request(1)
    if kind == "token":
        a: TokenAllocator | PagedAllocator | SWATokenAllocator | MambaPool = TokenAllocator(capacity, device=device)
    elif kind.startswith("paged"):
        page = int(kind[5:])
        a = PagedAllocator(capacity // page, page, device=device)
    elif kind == "swa":
        a = SWATokenAllocator(capacity, capacity // 2, device=device)
    else:
        a = MambaPool(capacity // 64, conv_shape=(1,), temporal_shape=(1,), device=device)
        batch = 1
    a.alloc(a.available_size() // 2, owner)
    if a.available_size() < batch:
        return None

    def cycles() -> int:
        for _ in range(50):
            a.free(a.alloc(batch, owner), owner)
        return 50

    return cycles


def contract_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    from kvledger.contracts import bindings

    rows = []
    for kind in ("token", "paged16", "paged64", "swa", "mamba"):
        for capacity in [c for c in args.capacities if c != 100_000]:
            batch = args.batch if kind != "mamba" else 1
            got: dict[str, float] = {}
            for r in range(args.rounds):
                levels = ("plain", "off", "on") if r % 2 == 0 else ("on", "off", "plain")
                for level in levels:  # NOTE: "off" is installed, then removed
                    bindings.uninstall()
                    if level != "plain":
                        bindings.install("on")
                    if level == "off":
                        bindings.uninstall()
                    step = make_cycle(kind, capacity, batch, args.device)
                    if step is None:
                        break
                    got[level] = max(got.get(level, 0.0), rate(step, args.seconds, args.device, args.clock))
            bindings.uninstall()
            if got:
                rows.append({"allocator": kind, "capacity": capacity, "batch": batch, **got})
    return rows


# ---------------------------------------------------------------- report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seconds", type=float, default=1.0, help="time per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="turns each variant takes; the best is kept")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="cpu", help="this process's CPU time, or wall")
    parser.add_argument("--batch", type=int, default=256, help="tokens per alloc in the cycle workload")
    parser.add_argument("--seed", type=int, default=0, help="seed of the mixed workload")
    parser.add_argument(
        "--capacities",
        type=lambda s: tuple(int(c) for c in s.split(",")),
        default=CAPACITIES,
        help="pool capacities in tokens, comma-separated (the contract cost skips 100k)",
    )
    parser.add_argument("--sglang-venv", type=Path, default=ROOT / "build" / "sglang-0.5.9")
    parser.add_argument("--skip-contracts", action="store_true", help="only the race against SGLang")
    parser.add_argument("--skip-race", action="store_true", help="only the contract cost")
    parser.add_argument("--json", action="store_true", help="print the results as JSON lines too")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        for row in race(args, {"kvledger": KvledgerSide, "sglang": SGLangSide}):
            print("RESULT " + json.dumps(row), flush=True)
        return
    import torch
    from rich.console import Console
    from rich.table import Table

    from kvledger.contracts import bindings

    bindings.uninstall()
    console = Console()
    how = f"{args.clock} clock, best of {args.rounds} rounds of {args.seconds:g} s, torch {torch.__version__}"
    mine: list[dict[str, Any]] = []
    if not args.skip_race:
        load = os.getloadavg()
        mine, with_sglang = race_rows(args)
        load_s = f"load average {load[0]:.1f} before, {os.getloadavg()[0]:.1f} after"
        table = Table(title=f"kvledger vs SGLang 0.5.9 allocators on {args.device}, {how}, {load_s}")
        for col in ("workload", "page", "capacity", "kvledger ops/s", "SGLang ops/s", "kvledger / SGLang"):
            table.add_column(col, justify="right")
        for r in mine:
            other = r.get("sglang_ops_per_s")
            table.add_row(
                r["workload"],
                str(r["page"]),
                f"{r['capacity']:,}",
                f"{r['kvledger_ops_per_s']:,.0f}",
                "—" if other is None else f"{other:,.0f}",
                "—" if other is None else f"{r['kvledger_ops_per_s'] / other:.2f}×",
            )
        console.print(table)
        if not with_sglang:
            console.print(f"(no SGLang venv at {args.sglang_venv}: build it with .ci/sglang_env 0.5.9)")
    rows = []
    if not args.skip_contracts:
        load = os.getloadavg()
        rows = contract_rows(args)
        load_s = f"load average {load[0]:.1f} before, {os.getloadavg()[0]:.1f} after"
        table = Table(title=f"contract cost: alloc+free cycles on {args.device}, {how}, {load_s}")
        for col in ("allocator", "capacity", "plain cycles/s", "off/plain", "on cycles/s", "on/off cost"):
            table.add_column(col, justify="right")
        for r in rows:
            table.add_row(
                r["allocator"],
                f"{r['capacity']:,}",
                f"{r['plain']:,.0f}",
                f"{r['off'] / r['plain']:.2f}",
                f"{r['on']:,.0f}",
                f"{r['off'] / r['on']:.2f}×",
            )
        console.print(table)
    if args.json:
        for r in mine:
            print(json.dumps({"kind": "race", **r}))
        for r in rows:
            print(json.dumps({"kind": "contracts", **r}))


if __name__ == "__main__":
    main()
