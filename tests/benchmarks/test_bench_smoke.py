"""The benchmark scripts still run, with tiny parameters, and produce results of the right shape.

No timing is asserted here: the numbers are the scripts' business (run them
by hand, see their docstrings). These tests only keep them from rotting.
"""

from __future__ import annotations

import ast
import importlib.util
import io
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from rich.console import Console

from kvledger.contracts import bindings
from kvledger.impl import faults

HERE = Path(__file__).parent
ROOT = HERE.parents[1]


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


def test_detection_margin_measures_where_each_seed_meets_the_bug(tmp_path: Path) -> None:
    bench = load("detection_margin")
    path = tmp_path / "margin.json"
    assert (
        bench.main(
            ["--seeds", "2", "-k", "test_node_that_takes_a_bool_id_is_caught", "--workers", "0", "--json", str(path)]
        )
        == 0
    )
    (row,) = json.loads(path.read_text())
    assert row["test"] == "test_node_that_takes_a_bool_id_is_caught" and row["budget"] == 400
    assert row["within"] == "2/2" and 1 <= row["median"] <= row["largest"] <= 400
    assert isinstance(row["derandomised"], int) and row["derandomised"] >= 1


def test_detection_margin_summary_flags_a_seed_past_the_budget() -> None:
    bench = load("detection_margin")
    row = {"test": "t.py::test_x", "budget": 100, "derandomised": 40, "seeds": [10, 150, "inv_other", None]}
    got = bench.summary(row)
    assert got["within"] == "1/4" and got["largest"] is None and got["other laws"] == ["inv_other"]
    got = bench.summary({**row, "seeds": [10, 150]})
    assert got["within"] == "1/2" and got["largest"] == 150 and got["largest/budget"] == 1.5


def test_fault_targets_cover_every_fault() -> None:
    bench = load("bench_faults")
    for fault in faults.FAULTS.values():
        pairs = bench.targets(fault)
        assert pairs, f"{fault.name}: no (suite, model) to run it on"
        assert all(suite in fault.suites for suite, _ in pairs)


def test_mutation_operators_make_compiling_mutants() -> None:
    mut = load("mutation")
    population = list(mut.mutants(mut.OPERATORS["all"]))
    assert [m for m in population if m.op in mut.CLASSIC] == list(mut.mutants())  # a recorded seed's population
    ids = {m.id for m in population}
    assert len(population) > 100 and set(mut.EQUIVALENT) <= ids  # every mutant set aside by hand still exists
    for op in sorted({m.op for m in population}):
        m = next(x for x in population if x.op == op)
        src = mut.mutated_source(m)
        assert src is not None and src != (mut.ROOT / m.file).read_text()
        compile(src, m.file, "exec")  # a mutant is a program, not a syntax error


def test_mutant_ids_survive_lines_moving() -> None:
    """A mutant's id names its function, operator and source line, not its line number: a blank line or a new
    function above it keeps every id (so a set-aside in ``EQUIVALENT`` keeps matching), a repeated line gets
    ``#2``, and an edit of the mutated line itself gives a new id."""
    mut = load("mutation")
    src = (mut.ROOT / "impl" / "lru.py").read_text()
    ids = [m.id for m in mut.mutants_of("impl/lru.py", src)]
    assert len(ids) == len(set(ids)) > 10
    first = src.index("\ndef ") + 1
    moved = src[:first] + "\n\ndef _added(x: int) -> int:\n    return x\n\n" + src[first:]
    shifted = list(mut.mutants_of("impl/lru.py", "\n" + moved))
    assert [m.id for m in shifted] == ids
    assert [m.line for m in shifted] != [m.line for m in mut.mutants_of("impl/lru.py", src)]
    twice = "def f(a: list[int]) -> None:\n    a.append(1)\n    a.append(1)\n"
    assert [m.id for m in mut.mutants_of("impl/x.py", twice)] == [
        "impl/x.py:f:drop-call:a.append(1)",
        "impl/x.py:f:drop-call:a.append(1)#2",
    ]
    edited = "def f(a: list[int]) -> None:\n    a.append(2)\n"
    assert [m.id for m in mut.mutants_of("impl/x.py", edited)] == ["impl/x.py:f:drop-call:a.append(2)"]
    every = {m.id: m for m in mut.mutants(mut.OPERATORS["all"])}
    for key in mut.EQUIVALENT:  # the --only form by position finds the same mutant
        m = every[key]
        assert m.id == key and mut.mutated_source(m) is not None


def test_new_operators_mutate_what_they_say() -> None:
    """The second family: each operator makes the one change its name says, where it says, and nowhere else."""
    mut = load("mutation")
    src = (
        "def f(a, b, xs, op, where):\n"
        "    if a == b:\n"
        "        raise ValueError(a, b)\n"
        "    while a is not None and a in xs:\n"
        "        a = g(a, b) + 1\n"
        "        check(op, where)\n"
        "    return xs[0] * min(a, b) * 0x2545F491\n"
    )
    got: dict[str, list[str]] = {}
    for m in mut.mutants_of("impl/x.py", src):
        if m.op in mut.NEW:
            out = mut.mutate(src, m)
            assert out is not None
            got.setdefault(m.op, []).append(ast.unparse(ast.parse(out)))
    base = ast.unparse(ast.parse(src))

    def changed(op: str) -> list[tuple[str, str]]:
        return [
            next((x, y) for x, y in zip(base.splitlines(), out.splitlines(), strict=True) if x != y) for out in got[op]
        ]

    assert [new.strip() for _, new in changed("drop-raise")] == ["pass"]
    assert [new.strip() for _, new in changed("negate-cmp")] == [
        "while a is None and a in xs:",
        "while a is not None and a not in xs:",
    ]  # NOTE: not the ``if``'s whole test: ``negate-if`` has it
    # NOTE: not ``ValueError(a, b)`` (an error's message), nor ``check(op, where)`` (only its words change), nor
    # ``min(a, b)`` (its arguments commute: the same program)
    assert [new.strip() for _, new in changed("swap-args")] == ["a = g(b, a) + 1"]
    assert [new.strip() for _, new in changed("end-index")] == ["return xs[-1] * min(a, b) * 625341585"]
    assert [new.strip() for _, new in changed("const+1")] == ["a = g(a, b) + 2"]  # NOTE: the hash constant stays
    assert [new.strip() for _, new in changed("min-max")] == ["return xs[0] * max(a, b) * 625341585"]


def test_a_checker_that_fails_on_the_unmutated_tree_stops_the_sample(tmp_path: Path) -> None:
    """The tool checks the unmutated tree first: when the checker fails there (here the tree itself is broken, as a
    checker's false finding would look), every mutant would be 'killed' by that failure, so no sample is scored."""
    mut = load("mutation")
    view = mut.make_view(tmp_path)
    target = view / "kvledger" / "impl" / "leaks.py"
    src = target.read_text()
    # NOTE: the leak checker's helper takes anything (the default check's leak audit refuses that in seconds)
    broken = src.replace(
        '        raise InvalidArgument("session_mamba_refs"', '        return ()\n        raise InvalidArgument("x"', 1
    )
    assert broken != src
    target.write_text(broken)
    assert mut.baseline_fails(view, 300).startswith("pools: inv_domain_enforced")


def test_mutation_timeout_is_no_verdict(tmp_path: Path) -> None:
    """The tool's own time budget running out is neither a kill nor a survival (a slow machine is no finding)."""
    mut = load("mutation")
    view = mut.make_view(tmp_path)
    suite, law, _, _ = mut.run_check(view, ["pools"], 0.01)
    assert (suite, law) == ("", mut.TIMEOUT)
    m = next(x for x in mut.mutants() if x.id not in mut.EQUIVALENT)
    out = mut.judge(view, m, 0.01, classify=False)
    assert out.status == "timeout" and mut.report([out])["behaviour_changing"] == 0


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


# ---------------------------------------------------------------- the race's workload suite


def cached_hits(requests: list[list[int]], page: int) -> int:
    """Tokens an unbounded prefix cache serves: each request's longest whole-page common prefix with an earlier one."""
    hits, seen = 0, list[list[int]]()
    for req in requests:
        toks = req[: len(req) - len(req) % page]
        best = 0
        for old in seen:
            k = next((i for i, (a, b) in enumerate(zip(old, toks, strict=False)) if a != b), min(len(old), len(toks)))
            best = max(best, k - k % page)
        hits += best
        seen.append(toks)
    return hits


def forgetful_cache(race: ModuleType, page: int) -> Any:
    """kvledger in the race's loop, but its match reports one page fewer than the cache holds (a broken cache)."""

    class Forgetful(race.KvledgerOps):  # type: ignore[name-defined,misc]
        def match(self, key: Any) -> tuple[int, Any, Any]:
            n, idx, node = super().match(key)
            k = max(0, n - page)
            return k, idx[:k], node

    return Forgetful(1 << 20, page)


def test_race_workloads_are_seeded_and_shaped() -> None:
    race = load("bench_sglang_race")
    small = race.SMALL
    for name in race.WORKLOADS:
        w = race.make_workload(name, small["requests"], scale=small["scale"])
        again = race.make_workload(name, small["requests"], scale=small["scale"])
        other = race.make_workload(name, small["requests"], seed=1, scale=small["scale"])
        assert w.requests == again.requests and w.requests != other.requests, name
        longest = max(map(len, w.requests))
        assert w.pool(16) % 16 == 0 and w.pool(1) >= 3 * longest, name
        assert (w.slack(1) == 0) == name.endswith("-exact"), name
    # the variants of one trace share its stream: the same requests, only the eviction differs
    exact, batched = (race.make_workload(f"prefix-{e}", 30, scale=0.1) for e in ("exact", "batched"))
    assert exact.requests == batched.requests and exact.slack(1) == 0 < batched.slack(1)
    # multi-turn chat: every later turn of a session starts with the session's whole previous turn
    chat = race.make_workload("chat", 60, scale=0.1).requests
    extends = sum(any(len(old) < len(req) and req[: len(old)] == old for old in chat[:i]) for i, req in enumerate(chat))
    assert extends > len(chat) // 2
    # long contexts at full scale: 8k..32k tokens
    assert all(8192 <= len(r) <= 32_768 for r in race.make_workload("long-context", 30).requests)


def test_race_kvledger_loop_matches_an_unbounded_oracle() -> None:
    race = load("bench_sglang_race")
    level = bindings.current_level()
    try:
        for page in (1, 16):
            for name in ("prefix-exact", "chat", "fanout", "many-short-whole"):
                w = race.make_workload(name, 24, scale=race.SMALL["scale"])
                reqs = [r for r in w.requests if len(r) >= page]
                unbounded = race.run_trace(race.build("kvledger", 1 << 20, page), reqs, page)
                assert unbounded["evicted_tokens"] == 0
                assert unbounded["hit_tokens"] == cached_hits(reqs, page), (name, page)
            # the check can fail: a cache that reports one page fewer than it holds is caught
            w = race.make_workload("chat", 24, scale=race.SMALL["scale"])
            reqs = [r for r in w.requests if len(r) >= page]
            forgetful = forgetful_cache(race, page)
            assert race.run_trace(forgetful, reqs, page)["hit_tokens"] < cached_hits(reqs, page)
            exact, batched = (
                race.run_workload("kvledger", race.make_workload(f"prefix-{e}", 48, scale=race.SMALL["scale"]), page)
                for e in ("exact", "batched")
            )
            assert 0 < exact["evicted_tokens"] <= batched["evicted_tokens"]  # the watermark evicts more at once
    finally:
        bindings.install(level)


def test_race_phases_time_every_step_of_the_same_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    race = load("bench_sglang_race")
    level = bindings.current_level()
    try:
        w = race.make_workload("prefix-exact", 48, scale=race.SMALL["scale"])
        r = race.run_workload("kvledger", w, 1, phases=True)
        assert set(r["phase_seconds"]) == set(race.PHASES) and r["evicted_tokens"] > 0
        assert all(r["phase_seconds"][p] > 0 for p in ("match", "lock", "evict", "alloc", "insert", "unlock"))
        # the phase-timed loop must reproduce the timed loop's hits and evictions, or the run stops
        real = race.run_phases

        def off_by_one(*args: Any) -> dict[str, Any]:
            out = real(*args)
            return {**out, "phase_hits": out["phase_hits"] + 1}

        monkeypatch.setattr(race, "run_phases", off_by_one)
        with pytest.raises(RuntimeError, match="disagrees"):
            race.run_workload("kvledger", w, 1, phases=True)
    finally:
        bindings.install(level)


ENGINES = [ROOT / "build" / f"sglang-{v}" / "bin" / "python" for v in ("0.5.9", "0.5.23")]


@pytest.mark.skipif(not all(p.exists() for p in ENGINES), reason="no SGLang 0.5.9/0.5.23 venvs (.ci/sglang_env)")
def test_race_sglang_variants_agree_with_kvledger(capsys: pytest.CaptureFixture[str]) -> None:
    race = load("bench_sglang_race")
    names = ["prefix-exact", "chat", "fanout"]
    argv = ["--small", "--pages", "16", "--workload", ",".join(names), "--variants", "0.5.9,0.5.23"]
    results = race.main(argv)
    out = capsys.readouterr().out
    by = {(r["variant"], r["workload"]): r for r in results}
    sglang = [v for v in race.VARIANTS if v.startswith("sglang") and ("0.5.9" in v or "0.5.23" in v)]
    assert {v for v, _ in by} == {"kvledger", *sglang}, out  # every variant ran every workload
    for name in names:
        k = by[("kvledger", name)]
        assert k["hit_tokens"] > 0, name
        for v in sglang:
            assert (by[(v, name)]["hit_tokens"], by[(v, name)]["evicted_tokens"]) == (
                k["hit_tokens"],
                k["evicted_tokens"],
            ), (v, name)
    assert sum(by[("kvledger", n)]["evicted_tokens"] for n in names) > 0
    assert "geometric mean" in out and "UNEXPECTED" not in out
