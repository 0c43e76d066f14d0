"""The benchmark scripts still run, with tiny parameters, and produce results of the right shape.

No timing is asserted here: the numbers are the scripts' business (run them
by hand, see their docstrings). These tests only keep them from rotting.
"""

from __future__ import annotations

import importlib.util
import io
import json
import sys
from pathlib import Path
from types import ModuleType

import torch
from rich.console import Console

from kvledger.contracts import bindings
from kvledger.impl import faults

HERE = Path(__file__).parent


def load(name: str) -> ModuleType:
    """Import ``tests/benchmarks/<name>.py`` (not a package) under a private module name."""
    spec = importlib.util.spec_from_file_location(f"kvledger_{name}", HERE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # NOTE: dataclasses look their module up while the class is built
    spec.loader.exec_module(mod)
    return mod


def quiet() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, width=200), out


def test_bench_cache_runs(tmp_path: Path) -> None:
    bench = load("bench_cache")
    level, threads = bindings.current_level(), torch.get_num_threads()
    path = tmp_path / "cache.json"
    argv = ["--requests", "12", "--min-len", "64", "--max-len", "160", "--prompt-len", "16,48", "--prompts", "3"]
    argv += ["--capacity", "512", "--page-sizes", "1,4", "--lengths", "64,128", "--chunk", "32", "--reps", "2"]
    argv += ["--rounds", "2"]
    console, out = quiet()
    payload = bench.main([*argv, "--fingerprint", "--json", str(path)], console=console)

    assert json.loads(path.read_text()) == json.loads(json.dumps(payload))
    assert payload["meta"]["requests"] == 12
    rows = payload["workload"]
    assert [(r["page_size"], r["contracts"]) for r in rows] == [(1, "off"), (1, "on"), (4, "off"), (4, "on")]
    for r in rows:
        assert r["requests"] == r["match_calls"] == r["insert_calls"] == 12
        assert r["seconds"] > 0 and r["requests_per_s"] > 0 and 0 <= r["hit_rate"] <= 1
        assert r["evicted_tokens"] > 0  # the pool is far smaller than the trace
        assert set(r["phase_seconds"]) == set(bench.PHASES)
    assert set(payload["contract_cost"]) == {"1", "4"}
    assert all(set(c) == {*bench.PHASES, "total"} and min(c.values()) > 0 for c in payload["contract_cost"].values())
    assert len(payload["workload_rounds"]) == 8
    assert [(r["page_size"], r["length"]) for r in payload["scaling"]] == [(1, 64), (1, 128), (4, 64), (4, 128)]
    assert all(r["match_one_node_s"] > 0 and r["insert_s"] > 0 for r in payload["scaling"])
    assert {f["operation"] for f in payload["fit"]} == {"match, 1 node", "match, 32-token nodes", "insert, L/2 cached"}
    assert "shared-prefix workload" in out.getvalue() and "cost versus cached prefix length" in out.getvalue()
    assert (bindings.current_level(), torch.get_num_threads()) == (level, threads)  # put back as found


def test_bench_faults_runs(tmp_path: Path) -> None:
    bench = load("bench_faults")
    level = bindings.current_level()
    path = tmp_path / "faults.json"
    argv = ["--seeds", "1", "--fault", "B1", "--model", "full", "--steps", "6", "--max-examples", "30"]
    console, out = quiet()
    payload = bench.main([*argv, "--json", str(path)], console=console)

    assert json.loads(path.read_text()) == json.loads(json.dumps(payload))
    assert payload["meta"]["seeds"] == [0] and payload["meta"]["shrink"] is True
    (result,) = payload["results"]
    assert (result["fault"], result["suite"], result["model"]) == ("B1", "cache", "full")
    summary = result["summary"]
    assert set(summary) >= {"caught", "detect_s", "examples", "shrunk_len", "shrink_s", "rules", "rules_expected"}
    (run,) = result["runs"]
    assert run["seed"] == 0
    if run["detected"]:
        assert run["examples"] >= 1 and run["detect_s"] > 0 and isinstance(run["rule"], str)
        assert run["shrink_s"] > 0
    assert "named faults" in out.getvalue()
    assert bindings.current_level() == level and faults.active() == frozenset()


def test_fault_targets_cover_every_fault() -> None:
    bench = load("bench_faults")
    for fault in faults.FAULTS.values():
        pairs = bench.targets(fault)
        assert pairs, f"{fault.name}: no (suite, model) to run it on"
        assert all(suite in fault.suites for suite, _ in pairs)


def test_mutation_operators_make_compiling_mutants() -> None:
    mut = load("mutation")
    population = list(mut.mutants())
    ids = {m.id for m in population}
    assert len(population) > 100 and set(mut.EQUIVALENT) <= ids  # every mutant set aside by hand still exists
    for op in sorted({m.op for m in population}):
        m = next(x for x in population if x.op == op)
        src = mut.mutated_source(m)
        assert src is not None and src != (mut.ROOT / m.file).read_text()
        compile(src, m.file, "exec")  # a mutant is a program, not a syntax error


def test_bench_pools_mix_is_a_balanced_seeded_stream() -> None:
    """The mixed allocator workload is the same for a seed, stays within the pool, and ends with everything freed;
    both workloads run on kvledger's allocators (SGLang's side runs the same ``workload`` in its own venv)."""
    bench = load("bench_pools")
    for page in (1, 16):
        ops = bench.make_mix(4096, page, 300, seed=3)
        assert ops == bench.make_mix(4096, page, 300, seed=3) != bench.make_mix(4096, page, 300, seed=4)
        live: dict[int, int] = {}
        for size, slot in ops:
            if size > 0:
                assert slot not in live and size % page == 0
                live[slot] = size
                assert sum(live.values()) <= 4096
            else:
                live.pop(slot)
        assert not live and any(size > 0 for size, _ in ops)
        for name in bench.WORKLOADS:
            side = bench.KvledgerSide(4096, page, "cpu")
            before = side.available()
            step = bench.workload(side, name, 4096, page, 64, 0)
            assert step() > 0
            assert side.available() == (before if name == "mix" else before - before // 2 // page * page)
