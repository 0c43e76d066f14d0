"""Replay speed and peak memory versus trace length (a benchmark, not a test).

    python tests/benchmarks/bench_replay.py [--sizes 10000 1000000] [--recorded 10000] [--json PATH]

For each size, a synthetic trace (``recorder.write_synthetic``: allocate,
write, insert, lock, match, unlock, evict, repeated; valid by construction)
is written to a temporary file and replayed in a child process, so each
measurement starts from a fresh interpreter. Reported per size: events,
file size, replay time, events/s, and peak RSS (``VmHWM`` of the child)
with the RSS at the first progress sample, so growth is visible. With
``--recorded N``, a trace of N random operations of the reference hybrid
cache (``record_workload``, richer events: evictions, copy-on-write, LRU
links) is recorded and replayed too; with ``--system N``, a system trace of N
random scheduler steps of the reference memory manager (Mamba model:
``record_system_workload``), with its recording speed. ``--contracts`` replays with the spec's
full contracts (postconditions re-checked each step).

``--capacities 48 1048576 2097152`` replays the same recorded traces (a
system trace of ``--system`` steps, default 600, and a cache trace of
``--recorded`` ops, default 300) with their headers rewritten to declare a KV
pool of each capacity: replay time and memory must not grow with what a header
declares, only with what the events name. A header alone declaring ``2**26``
slots is replayed too.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

CHILD = """
import json, os, sys, time
from kvledger.contracts.trace.replay import replay_path
page = os.sysconf("SC_PAGE_SIZE")
first = []
def tick(n):
    if not first:
        with open("/proc/self/statm") as f:
            first.append(int(f.read().split()[1]) * page)
t = time.perf_counter()
r = replay_path(sys.argv[1], tick, contracts=sys.argv[2] == "1")
dt = time.perf_counter() - t
with open("/proc/self/status") as f:  # VmHWM: this process's peak RSS (ru_maxrss would keep the parent's across exec)
    peak = next(int(x.split()[1]) * 1024 for x in f if x.startswith("VmHWM:"))
early = first[0] if first else 0
print(json.dumps({"ok": r.ok, "events": r.steps, "seconds": dt, "peak_rss": peak, "early_rss": early}))
"""


def run_child(path: Path, contracts: bool) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(path), "1" if contracts else "0"], capture_output=True, text=True, check=True
    )
    got: dict[str, float] = json.loads(out.stdout)
    return got


def _header_declaring(header: dict[str, Any], capacity: int) -> dict[str, Any]:
    """``header`` with its KV pool (system: ``pools``; cache: ``ledgers`` and ``config``) ``capacity`` slots."""
    out = dict(header)
    if "pools" in out:
        out["pools"] = {**out["pools"], "kv": [out["pools"]["kv"][0], capacity]}
    else:
        cfg = out["config"]
        out["ledgers"] = {**out.get("ledgers", {}), "kv": [cfg.get("page_size", 1), capacity]}
    return out


def _declaring(path: Path, capacity: int) -> Path:
    head, rest = path.read_text().split("\n", 1)
    out = path.with_name(f"{path.stem}-{capacity}.jsonl")
    out.write_text(json.dumps(_header_declaring(json.loads(head), capacity)) + "\n" + rest)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 1_000_000])
    ap.add_argument("--recorded", type=int, default=0, help="also record and replay N random reference operations")
    ap.add_argument("--system", type=int, default=0, help="also record and replay N memory-manager steps")
    ap.add_argument("--contracts", action="store_true")
    ap.add_argument("--capacities", type=int, nargs="*", default=[], help="KV pool sizes to declare (see above)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    from kvledger.contracts.adapters.reference import ReferenceAdapter
    from kvledger.contracts.machines.suites import CACHE_MODELS
    from kvledger.contracts.trace.recorder import record_workload, write_synthetic

    rows = []
    if args.capacities:
        args.sizes = []
        args.system = args.system or 600
        args.recorded = args.recorded or 300
    with tempfile.TemporaryDirectory() as tmp:
        jobs: list[tuple[str, Path]] = []
        for n in args.sizes:
            path = Path(tmp) / f"synthetic-{n}.jsonl"
            write_synthetic(path, n)
            jobs.append((f"synthetic {n}", path))
        if args.recorded:
            path = Path(tmp) / "recorded.jsonl"
            t = time.perf_counter()
            rec = record_workload(ReferenceAdapter(CACHE_MODELS["hybrid"]), args.recorded, 0, path)
            print(f"recorded {rec.ops} ops ({rec.events} events) in {time.perf_counter() - t:.1f}s", flush=True)
            jobs.append((f"recorded hybrid {args.recorded} ops", path))
        if args.system:
            from kvledger.contracts.machines.system import build_manager
            from kvledger.contracts.trace.system_recorder import record_system_workload

            path = Path(tmp) / "system.jsonl"
            t = time.perf_counter()
            srec = record_system_workload(build_manager(1, True), args.system, 0, path)
            dt = time.perf_counter() - t
            print(
                f"recorded {srec.ops} memory-manager steps ({srec.events} events) in {dt:.1f}s: "
                f"{srec.ops / dt:.0f} steps/s, {srec.events / dt:.0f} events/s",
                flush=True,
            )
            jobs.append((f"system mamba {args.system} steps", path))
        if args.capacities:
            jobs = [
                (f"{name} declaring {cap} KV slots", _declaring(path, cap))
                for name, path in jobs
                for cap in args.capacities
            ]
            bare = Path(tmp) / "header-only.jsonl"
            bare.write_text(json.dumps(_header_declaring(json.loads(jobs[0][1].read_text().split("\n", 1)[0]), 2**26)))
            jobs.append((f"a header alone declaring {2**26} KV slots ({bare.stat().st_size} bytes)", bare))
        for name, path in jobs:
            got = run_child(path, args.contracts)
            row = {
                "trace": name,
                "events": got["events"],
                "mib": round(path.stat().st_size / 2**20, 1),
                "seconds": round(got["seconds"], 2),
                "events_per_s": round(got["events"] / got["seconds"]),
                "peak_rss_mib": round(got["peak_rss"] / 2**20, 1),
                "early_rss_mib": round(got["early_rss"] / 2**20, 1),
                "ok": got["ok"],
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
