"""Start-up cost of kvledger where it is not asked for (issue 17, item 9), in one run.

Measures, interleaved so that machine load hits every variant alike, the wall
and user+system CPU time of:

* ``kvledger --help`` (and ``python -c pass`` as the interpreter's own floor);
* ``pytest -q`` on an empty project with one trivial test, the plugin loaded but inactive;
* the same with ``-p no:kvledger``.

Prints the medians and the inactive plugin's added cost (with minus without).
Usage: ``python tests/benchmarks/bench_startup.py [--runs 7]``.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def timed(cmd: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, user+system CPU seconds of the child) of one run of ``cmd``; it must exit 0."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {r.returncode}:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7)
    runs = ap.parse_args().runs
    py = sys.executable
    cli = shutil.which("kvledger", path=str(Path(py).parent)) or "kvledger"
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVLEDGER_") and k != "PYTEST_ADDOPTS"}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "test_one.py").write_text("def test_one():\n    assert True\n")
        variants = {
            "python -c pass": [py, "-c", "pass"],
            "kvledger --help": [cli, "--help"],
            "pytest -q (plugin inactive)": [py, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
            "pytest -q -p no:kvledger": [py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:kvledger"],
        }
        times: dict[str, list[tuple[float, float]]] = {k: [] for k in variants}
        for cmd in variants.values():  # NOTE: one warm-up each (file cache)
            timed(cmd, root, env)
        for _ in range(runs):
            for name, cmd in variants.items():
                times[name].append(timed(cmd, root, env))
    med = {k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for k, v in times.items()}
    print(f"median of {runs} interleaved runs; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"{'what':32s} {'wall s':>8s} {'CPU s':>8s}")
    for name, (w, c) in med.items():
        print(f"{name:32s} {w:8.3f} {c:8.3f}")
    on, off = med["pytest -q (plugin inactive)"], med["pytest -q -p no:kvledger"]
    print(f"inactive plugin adds: wall {1000 * (on[0] - off[0]):+.0f} ms, CPU {1000 * (on[1] - off[1]):+.0f} ms")
    print(f"kvledger --help over python -c pass: wall {med['kvledger --help'][0] / med['python -c pass'][0]:.1f}x")


if __name__ == "__main__":
    main()
