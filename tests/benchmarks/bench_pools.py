"""Allocator throughput and contract overhead, measured in one run (a benchmark, not a test).

    python tests/benchmarks/bench_pools.py [--device cpu|cuda] [--seconds 1.0]

For each allocator at capacities 10k and 1M: alloc+free cycles per second and
tokens per second with contracts never installed ("plain"), installed then
removed ("off"), incremental ("on"); ratios are taken within this run.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
from rich.console import Console
from rich.table import Table

from kvledger.contracts import bindings
from kvledger.impl.allocators import PagedAllocator, SWATokenAllocator, TokenAllocator
from kvledger.impl.mamba import MambaPool
from kvledger.spec.types import request

R = request(1)


def make_cycle(kind: str, capacity: int, batch: int, device: str) -> Callable[[], None]:
    """One alloc of ``batch`` tokens followed by its free, on a pool of ``capacity`` token slots."""
    if kind == "token":
        a: TokenAllocator | PagedAllocator | SWATokenAllocator | MambaPool = TokenAllocator(capacity, device=device)
    elif kind == "paged16":
        a = PagedAllocator(capacity // 16, 16, device=device)
    elif kind == "swa":
        a = SWATokenAllocator(capacity, capacity // 2, device=device)
    else:
        a = MambaPool(capacity // 64, conv_shape=(1,), temporal_shape=(1,), device=device)
        batch = 1
    # keep the pool half full so frees and allocs work on a realistic free stack
    a.alloc(a.available_size() // 2, R)

    def cycle() -> None:
        x = a.alloc(batch, R)
        a.free(x, R)

    return cycle


def rate(cycle: Callable[[], None], seconds: float, device: str) -> float:
    for _ in range(20):
        cycle()
    n, start = 0, time.perf_counter()
    while True:
        for _ in range(50):
            cycle()
        n += 50
        if device == "cuda":
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return n / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--batch", type=int, default=256, help="tokens per alloc")
    args = parser.parse_args()
    table = Table(
        title=f"allocator alloc+free cycles ({args.batch} tokens each) on {args.device}, torch {torch.__version__}"
    )
    for col in ("allocator", "capacity", "plain cycles/s", "tokens/s", "off/plain", "on/off slowdown"):
        table.add_column(col, justify="right")
    for kind in ("token", "paged16", "swa", "mamba"):
        for capacity in (10_000, 1_000_000):
            batch = args.batch if kind != "mamba" else 1
            bindings.uninstall()
            plain = rate(make_cycle(kind, capacity, batch, args.device), args.seconds, args.device)
            bindings.install("on")
            bindings.uninstall()
            off = rate(make_cycle(kind, capacity, batch, args.device), args.seconds, args.device)
            bindings.install("on")
            on = rate(make_cycle(kind, capacity, batch, args.device), args.seconds, args.device)
            bindings.uninstall()
            table.add_row(
                kind,
                f"{capacity:,}",
                f"{plain:,.0f}",
                f"{plain * batch:,.0f}",
                f"{off / plain:.2f}",
                f"{off / on:.1f}x",
            )
    Console().print(table)


if __name__ == "__main__":
    main()
