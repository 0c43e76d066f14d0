"""Radix prefix cache throughput, cost versus prefix length, and contract overhead (a benchmark, not a test).

    python tests/benchmarks/bench_cache.py [--requests 2000] [--device cpu|cuda] [--json PATH]

1. Workload. A deterministic trace of ``--requests`` requests of 512-2,048
   tokens, each a system prompt (one of ``--prompts``, 256-512 tokens) and a
   fresh suffix, served by a full-attention ``RadixCache`` over a
   ``TokenAllocator`` (page size 1) or a ``PagedAllocator`` (page size 16) of
   ``--capacity`` tokens, far less than the trace, so eviction runs all along.
   Per request: ``match_prefix`` -> ``inc_lock_ref`` -> ``evict`` if the pool
   is short -> ``alloc`` -> write fingerprints and ``verify`` the match (only
   with ``--fingerprint``) -> ``insert`` of the page-aligned key (duplicates
   and the unaligned tail page freed) -> ``dec_lock_ref``. Reported: requests/s,
   tokens/s, match/insert calls per second of time spent inside them, hit
   rate, evicted tokens, and where the time goes.
2. Scaling. For prefix lengths 1k..32k tokens: one ``match_prefix`` of a key
   whose first L tokens are cached as one node and as a path of 256-token
   nodes, and one ``insert`` of an L-token key whose first L/2 tokens are
   cached; best of ``--reps`` calls (the median goes to the JSON). Per-token
   cost and a fit ``t = a + b * L`` show how close to linear it is.
3. Contracts. The workload with the contract bindings ``off`` and ``on``,
   alternating, ``--rounds`` times each; the best round of each is kept and
   the ratio taken within this run. ``on`` checks the cache's incremental
   laws (``contracts/cache_bindings.py``) and the pools' alloc/free/transfer.
   The phase table's ``on/off`` rows give the contract cost of each
   operation (match, lock, evict, alloc, ..., release) as a ratio.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeAlias

import torch
from rich.console import Console
from rich.table import Table

from kvledger.contracts import bindings
from kvledger.impl.allocators import PagedAllocator, TokenAllocator
from kvledger.impl.radix import RadixCache
from kvledger.spec.types import Component, Owner, request

FULL = Component.FULL
VOCAB = 32_000
PHASES = ("match", "lock", "evict", "alloc", "write", "insert", "release")
Allocator: TypeAlias = TokenAllocator | PagedAllocator


# ------------------------------------------------------------------ the trace


@dataclass(frozen=True)
class Trace:
    """Requests of the workload: token ids (int64, on the bench device) and the prompt each one starts with."""

    requests: list[torch.Tensor]
    prompt_of: list[int]
    prompt_lens: list[int]

    @property
    def tokens(self) -> int:
        return sum(r.numel() for r in self.requests)


def make_trace(
    n_requests: int,
    n_prompts: int,
    min_len: int,
    max_len: int,
    prompt_len: tuple[int, int],
    seed: int,
    device: str,
) -> Trace:
    """A deterministic shared-prefix trace: the same ``seed`` gives the same tokens on every device."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    prompts = [
        torch.randint(VOCAB, (rng.randint(*prompt_len),), generator=gen, dtype=torch.int64) for _ in range(n_prompts)
    ]
    requests, prompt_of = [], []
    for _ in range(n_requests):
        p = rng.randrange(n_prompts)
        total = max(rng.randint(min_len, max_len), prompts[p].numel() + 1)
        suffix = torch.randint(VOCAB, (total - prompts[p].numel(),), generator=gen, dtype=torch.int64)
        requests.append(torch.cat([prompts[p], suffix]).to(device))
        prompt_of.append(p)
    return Trace(requests, prompt_of, [p.numel() for p in prompts])


def make_allocator(page_size: int, capacity: int, device: str) -> Allocator:
    if page_size == 1:
        return TokenAllocator(capacity, device=device)
    return PagedAllocator(capacity // page_size, page_size, device=device)


def sync(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


# ------------------------------------------------------------------ 1. the workload


@dataclass
class WorkloadResult:
    page_size: int
    contracts: str
    requests: int
    tokens: int
    seconds: float
    matched_tokens: int = 0
    match_calls: int = 0
    insert_calls: int = 0
    evict_calls: int = 0
    evicted_tokens: int = 0
    dup_tokens: int = 0
    phase_seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.seconds

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds

    @property
    def hit_rate(self) -> float:
        return self.matched_tokens / self.tokens

    def calls_per_s(self, phase: str, calls: int) -> float:
        t = self.phase_seconds[phase]
        return calls / t if t > 0 else math.inf

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out |= {
            "requests_per_s": self.requests_per_s,
            "tokens_per_s": self.tokens_per_s,
            "hit_rate": self.hit_rate,
            "match_calls_per_s": self.calls_per_s("match", self.match_calls),
            "insert_calls_per_s": self.calls_per_s("insert", self.insert_calls),
        }
        return out


def run_workload(trace: Trace, page_size: int, capacity: int, device: str, fingerprint: bool) -> WorkloadResult:
    """Serve ``trace`` once through a fresh cache; time every phase of every request."""
    kv = make_allocator(page_size, capacity, device)
    cache = RadixCache(kv)
    res = WorkloadResult(page_size, bindings.current_level(), len(trace.requests), trace.tokens, 0.0)
    ph = res.phase_seconds
    clock = time.perf_counter
    gc.collect()
    sync(device)
    start = clock()
    for i, key in enumerate(trace.requests):
        owner: Owner = request(i + 1)
        n = key.numel()
        t0 = clock()
        m = cache.match_prefix(key)
        t1 = clock()
        h = cache.inc_lock_ref(m.last_node)
        t2 = clock()
        need = n - m.length
        want = -(-need // page_size) * page_size
        short = want - kv.available_size()
        if short > 0:
            res.evicted_tokens += cache.evict(FULL, short)
            res.evict_calls += 1
        t3 = clock()
        new = kv.alloc(need, owner) if need else m.indices[:0]
        t4 = clock()
        if fingerprint:
            cache.verify(m, key)
            pos = torch.arange(m.length, n, dtype=torch.int64, device=kv.device)
            kv.write_fingerprint(new[:need], key[m.length :], pos)
        t5 = clock()
        aligned = n - n % page_size
        slots = torch.cat([m.indices, new[: aligned - m.length]])
        ins = cache.insert(key[:aligned], slots, owner)
        t6 = clock()
        if ins.dup_indices.numel():
            kv.free(ins.dup_indices, owner)
            res.dup_tokens += ins.dup_indices.numel()
        if aligned < n:
            kv.free(new[aligned - m.length :], owner)  # the unaligned tail page: not cached
        cache.dec_lock_ref(h)
        t7 = clock()
        res.matched_tokens += m.length
        res.match_calls += 1
        res.insert_calls += 1
        for name, a, b in zip(PHASES, (t0, t1, t2, t3, t4, t5, t6), (t1, t2, t3, t4, t5, t6, t7), strict=True):
            ph[name] += b - a
    sync(device)
    res.seconds = clock() - start
    return res


# ------------------------------------------------------------------ 2. cost versus prefix length


def times_of(fn: Callable[[], object], reps: int, device: str) -> list[float]:
    """Seconds of each of ``reps`` calls of ``fn`` (after one warm-up call)."""
    fn()
    times = []
    for _ in range(reps):
        sync(device)
        t = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t)
    return times


@dataclass
class ScalingRow:
    """Best-of-``reps`` seconds per call (the shared machine only ever adds time), and the medians."""

    page_size: int
    length: int
    path_nodes: int
    match_one_node_s: float
    match_path_s: float
    insert_s: float
    match_one_node_median_s: float
    match_path_median_s: float
    insert_median_s: float


def measure_length(length: int, page_size: int, chunk: int, reps: int, device: str, seed: int) -> ScalingRow:
    """Times of ``match_prefix`` (one node / a path of ``chunk``-token nodes) and ``insert`` at prefix ``length``."""
    gen = torch.Generator().manual_seed(seed + length)
    base = torch.randint(VOCAB, (length,), generator=gen, dtype=torch.int64).to(device)
    tail = torch.randint(VOCAB, (page_size * 16,), generator=gen, dtype=torch.int64).to(device)
    query = torch.cat([base, tail])  # its first ``length`` tokens are cached
    owner = request(1)

    # match against one node of ``length`` tokens
    kv = make_allocator(page_size, 2 * length, device)
    cache = RadixCache(kv)
    cache.insert(base, kv.alloc(length, owner), owner)
    assert cache.match_prefix(query).length == length
    one = times_of(lambda: cache.match_prefix(query), reps, device)

    # match against a path of ``chunk``-token nodes (as a multi-turn or chunked-prefill history leaves it)
    kv = make_allocator(page_size, 2 * length, device)
    cache = RadixCache(kv)
    slots = kv.alloc(length, owner)
    for end in range(chunk, length + 1, chunk):
        dup = cache.insert(base[:end], slots[:end], owner).dup_indices
        assert dup.numel() == 0
    nodes = sum(1 for _ in cache.nodes()) - 1
    assert cache.match_prefix(query).length == length
    path = times_of(lambda: cache.match_prefix(query), reps, device)

    # insert of an L-token key whose first L/2 tokens are cached (fresh second halves, so each call adds a leaf)
    half = length // 2
    kv = make_allocator(page_size, length + (reps + 1) * half + page_size, device)
    cache = RadixCache(kv)
    cache.insert(base, kv.alloc(length, owner), owner)
    prefix = cache.match_prefix(base[:half])
    ins = []
    for _ in range(reps + 1):
        rest = torch.randint(VOCAB, (half,), generator=gen, dtype=torch.int64).to(device)
        key = torch.cat([base[:half], rest])
        value = torch.cat([prefix.indices, kv.alloc(half, owner)])
        sync(device)
        t = time.perf_counter()
        got = cache.insert(key, value, owner)
        sync(device)
        ins.append(time.perf_counter() - t)
        assert got.prefix_len == half and got.dup_indices.numel() == 0
    ins = ins[1:]  # the first call is the warm-up
    med = statistics.median
    return ScalingRow(page_size, length, nodes, min(one), min(path), min(ins), med(one), med(path), med(ins))


def fit(rows: Sequence[ScalingRow], attr: str) -> tuple[float, float, float]:
    """Least-squares ``t = a + b * L`` over ``rows``: (a seconds, b seconds/token, log-log slope of the last two)."""
    xs = [float(r.length) for r in rows]
    ys = [float(getattr(r, attr)) for r in rows]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0
    a = my - b * mx
    slope = math.log(ys[-1] / ys[-2]) / math.log(xs[-1] / xs[-2]) if len(xs) > 1 and ys[-2] > 0 else math.nan
    return a, b, slope


# ------------------------------------------------------------------ reporting


def _us(s: float) -> str:
    return f"{s * 1e6:,.1f}"


def _ns_per_token(s: float, n: int) -> str:
    return f"{s * 1e9 / n:,.1f}"


def workload_table(results: Sequence[WorkloadResult], title: str) -> Table:
    table = Table(title=title)
    cols = (
        "page",
        "contracts",
        "requests/s",
        "tokens/s",
        "match calls/s",
        "insert calls/s",
        "hit rate",
        "evict calls",
        "evicted tokens",
        "on/off slowdown",
    )
    for col in cols:
        table.add_column(col, justify="right")
    off = {r.page_size: r for r in results if r.contracts == "off"}
    for r in results:
        base = off.get(r.page_size)
        ratio = f"{base.requests_per_s / r.requests_per_s:.2f}x" if base is not None and r is not base else ""
        table.add_row(
            str(r.page_size),
            r.contracts,
            f"{r.requests_per_s:,.0f}",
            f"{r.tokens_per_s:,.0f}",
            f"{r.calls_per_s('match', r.match_calls):,.0f}",
            f"{r.calls_per_s('insert', r.insert_calls):,.0f}",
            f"{r.hit_rate:.1%}",
            f"{r.evict_calls:,}",
            f"{r.evicted_tokens:,}",
            ratio,
        )
    return table


def phase_table(results: Sequence[WorkloadResult], title: str) -> Table:
    table = Table(title=title)
    for col in ("page", "contracts", *PHASES, "total"):
        table.add_column(col, justify="right")
    off = {r.page_size: r for r in results if r.contracts == "off"}
    for r in results:
        per = [r.phase_seconds[p] / r.requests for p in PHASES]
        table.add_row(str(r.page_size), r.contracts, *(_us(x) for x in per), _us(sum(per)))
        base = off.get(r.page_size)
        if r.contracts == "on" and base is not None:  # NOTE: the contract cost of each operation, as a ratio
            ratios = contract_cost(base, r)
            table.add_row(str(r.page_size), "on/off", *(f"{ratios[p]:.2f}x" for p in (*PHASES, "total")))
    return table


def contract_cost(off: WorkloadResult, on: WorkloadResult) -> dict[str, float]:
    """Per phase (operation) and in total, time with contracts on over time with them off (same run)."""
    out = {p: on.phase_seconds[p] / off.phase_seconds[p] if off.phase_seconds[p] else 1.0 for p in PHASES}
    out["total"] = sum(on.phase_seconds.values()) / max(sum(off.phase_seconds.values()), 1e-12)
    return out


def scaling_table(rows: Sequence[ScalingRow], title: str) -> Table:
    table = Table(title=title)
    cols = (
        "page",
        "prefix L",
        "match (1 node) µs",
        "ns/token",
        "match (path) µs",
        "nodes",
        "ns/token",
        "insert (L/2 cached) µs",
        "ns/token",
    )
    for col in cols:
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            str(r.page_size),
            f"{r.length:,}",
            _us(r.match_one_node_s),
            _ns_per_token(r.match_one_node_s, r.length),
            _us(r.match_path_s),
            str(r.path_nodes),
            _ns_per_token(r.match_path_s, r.length),
            _us(r.insert_s),
            _ns_per_token(r.insert_s, r.length),
        )
    return table


def fit_table(fits: dict[tuple[int, str], tuple[float, float, float]], title: str) -> Table:
    table = Table(title=title)
    for col in ("page", "operation", "a (fixed) µs", "b ns/token", "log-log slope, last two L"):
        table.add_column(col, justify="right")
    for (ps, op), (a, b, slope) in fits.items():
        table.add_row(str(ps), op, _us(a), f"{b * 1e9:,.2f}", f"{slope:.2f}")
    return table


# ------------------------------------------------------------------ main


def _console() -> Console:
    wide = not sys.stdout.isatty() and "COLUMNS" not in os.environ
    return Console(width=170) if wide else Console()


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=2000, help="requests in the trace (default 2000)")
    p.add_argument("--prompts", type=int, default=10, help="shared system prompts (default 10)")
    p.add_argument("--min-len", type=int, default=512, help="shortest request, tokens (default 512)")
    p.add_argument("--max-len", type=int, default=2048, help="longest request, tokens (default 2048)")
    p.add_argument("--prompt-len", type=_ints, default=[256, 512], help="system prompt length range (default 256,512)")
    p.add_argument("--capacity", type=int, default=65_536, help="KV pool size in tokens (default 65536)")
    p.add_argument("--rounds", type=int, default=3, help="workload runs per contract level, best kept (default 3)")
    p.add_argument("--page-sizes", type=_ints, default=[1, 16], help="page sizes (default 1,16)")
    p.add_argument(
        "--lengths",
        type=_ints,
        default=[1024, 2048, 4096, 8192, 16384, 32768],
        help="prefix lengths for the scaling section (default 1k..32k)",
    )
    p.add_argument("--chunk", type=int, default=256, help="node length of the multi-node path (default 256)")
    p.add_argument("--reps", type=int, default=20, help="calls per scaling point (best and median; default 20)")
    p.add_argument("--fingerprint", action="store_true", help="write KV fingerprints and verify every match")
    p.add_argument("--device", default="cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads (default 1: on a shared machine OpenMP regions stall for 100+ ms; 0 = torch's default)",
    )
    p.add_argument("--json", type=Path, default=None, metavar="PATH", help="also write the results as JSON")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None, console: Console | None = None) -> dict[str, Any]:
    """Run all three sections, print the tables, return (and with ``--json`` write) the results."""
    args = parse_args(argv)
    console = console or _console()
    lo, hi = args.prompt_len
    if min(args.reps, args.requests, args.rounds) < 1:
        raise SystemExit("--reps, --requests and --rounds must be >= 1")
    for ps in args.page_sizes:
        if args.chunk % ps or any(n % args.chunk or n % (2 * ps) for n in args.lengths):
            raise SystemExit(f"--chunk must be a multiple of page size {ps}; --lengths of --chunk and of {2 * ps}")
    saved_level, saved_threads = bindings.current_level(), torch.get_num_threads()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    trace = make_trace(args.requests, args.prompts, args.min_len, args.max_len, (lo, hi), args.seed, args.device)
    console.print(
        f"trace: {len(trace.requests):,} requests, {trace.tokens:,} tokens, {args.prompts} prompts of "
        f"{min(trace.prompt_lens)}-{max(trace.prompt_lens)} tokens; KV pool {args.capacity:,} tokens; "
        f"fingerprints {'on' if args.fingerprint else 'off'}; {args.device}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} torch thread(s), {os.cpu_count()} CPUs shared with other jobs "
        "(absolute numbers are indicative; ratios come from this one run)"
    )
    results: list[WorkloadResult] = []
    rounds: list[WorkloadResult] = []
    rows: list[ScalingRow] = []
    threads = torch.get_num_threads()
    try:
        for ps in args.page_sizes:
            best: dict[str, WorkloadResult] = {}
            for _ in range(args.rounds):
                for level in ("off", "on"):
                    bindings.install(level)
                    r = run_workload(trace, ps, args.capacity, args.device, args.fingerprint)
                    rounds.append(r)
                    if level not in best or r.seconds < best[level].seconds:
                        best[level] = r
            results += [best["off"], best["on"]]
        bindings.install("off")
        title = f"RadixCache shared-prefix workload on {args.device} (best of {args.rounds} rounds, off/on alternating)"
        console.print(workload_table(results, title))
        console.print(phase_table(results, "where a request's time goes (µs per request, wall clock per phase)"))
        for ps in args.page_sizes:
            for n in args.lengths:
                rows.append(measure_length(n, ps, args.chunk, args.reps, args.device, args.seed))
    finally:
        bindings.install(saved_level)
        torch.set_num_threads(saved_threads)
    console.print(
        scaling_table(
            rows,
            f"cost versus cached prefix length on {args.device}, contracts off (best of {args.reps}); "
            f"path = nodes of {args.chunk} tokens",
        )
    )
    fits = {
        (ps, op): fit([r for r in rows if r.page_size == ps], attr)
        for ps in args.page_sizes
        for op, attr in (
            ("match, 1 node", "match_one_node_s"),
            (f"match, {args.chunk}-token nodes", "match_path_s"),
            ("insert, L/2 cached", "insert_s"),
        )
        if sum(1 for r in rows if r.page_size == ps) > 1
    }
    if fits:
        console.print(fit_table(fits, "least-squares t = a + b*L (near-linear: slope ~1.0, a small)"))
    payload: dict[str, Any] = {
        "meta": {
            "device": args.device,
            "torch": torch.__version__,
            "cpus": os.cpu_count(),
            "torch_threads": threads,
            "seed": args.seed,
            "requests": len(trace.requests),
            "tokens": trace.tokens,
            "prompts": args.prompts,
            "capacity": args.capacity,
            "fingerprint": args.fingerprint,
        },
        "workload": [r.to_json() for r in results],
        "contract_cost": {
            str(on.page_size): contract_cost(off, on)
            for on in results
            if on.contracts == "on"
            for off in results
            if off.contracts == "off" and off.page_size == on.page_size
        },
        "workload_rounds": [r.to_json() for r in rounds],
        "scaling": [asdict(r) for r in rows],
        "fit": [
            {"page_size": ps, "operation": op, "a_s": a, "b_s_per_token": b, "loglog_slope": s}
            for (ps, op), (a, b, s) in fits.items()
        ],
    }
    if args.json is not None:
        args.json.write_text(json.dumps(payload, indent=2))
    return payload


if __name__ == "__main__":
    main()
