"""Record and replay: round trips per model, faults caught by the expected rule, malformed input, streaming."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvledger.contracts import bindings
from kvledger.contracts.adapters.reference import ReferenceAdapter
from kvledger.contracts.cli import app
from kvledger.contracts.machines.suites import CACHE_MODELS
from kvledger.contracts.trace.format import OPS
from kvledger.contracts.trace.recorder import record_workload, write_synthetic
from kvledger.contracts.trace.replay import replay, replay_path
from kvledger.impl import faults
from kvledger.impl.faults import FAULTS

runner = CliRunner()


@pytest.mark.parametrize("model", list(CACHE_MODELS))
def test_round_trip_holds(model: str, tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    rec = record_workload(ReferenceAdapter(CACHE_MODELS[model]), 120, seed=1, path=path)
    assert rec.stopped_by is None
    r = replay_path(path)
    assert r.ok, (r.violation, r.error)
    assert r.steps == rec.events


@contextmanager
def faulty(fault: str) -> Iterator[None]:
    """``fault`` on and the live contracts off (this suite runs with them on, but a test's earlier CLI call may have
    taken them off): a recording runs through the fault, and the replay, not a contract, is what catches it."""
    level = bindings.current_level()
    bindings.install("off")
    try:
        with faults.injected(fault):
            yield
    finally:
        bindings.install(level)


@pytest.mark.parametrize(
    ("fault", "model", "ops", "seed"), [("B1", "full", 60, 1), ("B1", "hybrid", 60, 1), ("B5", "hybrid", 80, 0)]
)
def test_fault_fails_replay_with_its_rule(fault: str, model: str, ops: int, seed: int, tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    with faulty(fault):
        record_workload(ReferenceAdapter(CACHE_MODELS[model]), ops, seed=seed, path=path, faults=(fault,))
    r = replay_path(path)
    assert r.violation is not None and r.error is None
    assert r.violation.rule in FAULTS[fault].laws
    assert r.violation.history  # the keys/handles involved, with their last events


def test_b5_caught_without_lru_links(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    with faulty("B5"):
        record_workload(ReferenceAdapter(CACHE_MODELS["hybrid"]), 80, seed=0, path=path, lru=False)
    r = replay_path(path)
    assert r.violation is not None and r.violation.rule == "inv_lock_ref_counts_handles"
    assert r.violation.op == "mamba_cow"


def test_cli_record_and_replay(tmp_path: Path) -> None:
    out = tmp_path / "t.jsonl"
    res = runner.invoke(app, ["record", "--ops", "60", "--seed", "2", "-o", str(out), "--model", "swa"])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["replay", str(out), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["ok"] is True
    bad = tmp_path / "b1.jsonl"
    assert (
        runner.invoke(app, ["record", "--ops", "60", "-o", str(bad), "--fault", "B1", "--model", "full"]).exit_code == 0
    )
    res = runner.invoke(app, ["replay", str(bad)])
    assert res.exit_code == 1 and "inv_lru_detached" in res.output
    assert runner.invoke(app, ["record", "--fault", "B9", "-o", str(bad)]).exit_code == 2
    assert runner.invoke(app, ["record", "--model", "nope", "-o", str(bad)]).exit_code == 2


HEADER = json.dumps({"kvledger_trace": 1, "config": {}, "adapter": "x", "version": "1"})
ALLOC = '{"step":1,"op":"alloc_kv","req":1,"n":2,"slots":[1,2]}'


@pytest.mark.parametrize(
    ("lines", "line", "expected"),
    [
        ([HEADER, '{"step":1,"op":"alloc_kv",'], 2, "truncated"),
        ([HEADER, "{not json}", ALLOC], 2, "valid JSON"),
        ([HEADER, '{"step":1,"op":"teleport"}'], 2, "'op' one of"),
        ([HEADER, '{"step":1,"op":"alloc_kv","req":1,"n":2}'], 2, "field 'slots'"),
        ([HEADER, '{"step":1,"op":"alloc_kv","req":"1","n":2,"slots":null}'], 2, "an integer"),
        ([HEADER, '{"step":3,"op":"alloc_kv","req":1,"n":2,"slots":null}'], 2, "'step' 1"),
        ([HEADER.replace('"kvledger_trace": 1', '"kvledger_trace": 2'), ALLOC], 1, "schema version 1"),
        (['{"hello": 1}'], 1, "a header"),
        ([HEADER, '{"step":1,"op":"unlock","handle":7}'], 2, "handle returned by an earlier lock"),
        ([HEADER, '{"step":1,"op":"free_kv","req":9,"slots":[1]}'], 2, "a request that allocated earlier"),
        ([HEADER, ALLOC, '{"step":2,"op":"free_kv","req":1,"slots":[4000]}'], 3, "slots of pool 'kv'"),
        ([HEADER, '{"step":1,"op":"alloc_mamba","req":1,"slot":0}'], 2, "no Mamba event"),
        ([HEADER.replace("{}", '{"page_size": "x"}')], 1, "config field"),
        # strict: the samples of issue 17 item 5, one per class
        ([HEADER, ALLOC.replace('"slots"', '"slts"')], 2, "unknown field 'slts' (did you mean 'slots'?)"),
        ([HEADER, ALLOC.replace("}", ',"lock_detla":[]}')], 2, "unknown field 'lock_detla'"),
        ([HEADER.replace("{}", '{"window": 0}')], 1, "config field 'window'"),
        ([HEADER.replace("{}", '{"window": -3}')], 1, "config field 'window'"),
        ([HEADER.replace("{}", '{"page_size": 1, "paeg_size": 2}')], 1, "unknown field 'paeg_size'"),
        ([HEADER.replace('"kvledger_trace": 1', '"kvledger_trace": true'), ALLOC], 1, "schema version"),
        ([HEADER.replace('"kvledger_trace": 1', '"kvledger_trace": 1.0'), ALLOC], 1, "schema version"),
        ([HEADER.replace('"version"', '"verison": "1", "version"'), ALLOC], 1, "unknown field 'verison'"),
        ([HEADER, ALLOC.replace('"req":1', '"req":' + "7" * 5000)], 2, "at most 19 digits"),
        ([HEADER, ALLOC.replace('"req":1', '"req":' + "[" * 100_000 + "]" * 100_000)], 2, "nested"),
        ([HEADER, ALLOC.replace('"req":1', '"req":9223372036854775808')], 2, "field 'req'"),
        ([HEADER, ALLOC.replace('"req":1', '"req":true')], 2, "field 'req'"),
        ([HEADER, ALLOC.replace('"req":1', '"req":NaN')], 2, "NaN"),
        ([HEADER, ALLOC.replace('"req":1', '"req":1,"req":2')], 2, "'req' twice"),
        ([HEADER.replace("{}", '{"kv_tokens": 2147483649}')], 1, "config field 'kv_tokens'"),
        (
            [HEADER.replace('"version": "1"', '"version": "1", "ledgers": {"kv": [1, 2147483648]}')],
            1,
            "base + capacity",
        ),
        ([HEADER.replace('"version": "1"', '"version": "1", "capabilities": ["lru", "lru"]')], 1, "'lru' twice"),
        # a set written as a list must not repeat: malformed where the recorder builds it
        (
            [HEADER, '{"step":1,"op":"evict","component":"full","n":1,"freed":0,"evicted":{"full":[[1],[1]]}}'],
            2,
            "each item once",
        ),
    ],
)
def test_malformed_input_exits_2_with_line(lines: list[str], line: int, expected: str, tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    text = "\n".join(lines) + ("" if expected == "truncated" else "\n")
    path.write_text(text)
    res = runner.invoke(app, ["replay", str(path), "--json"])
    assert res.exit_code == 2, res.output
    err = json.loads(res.stdout)["error"]
    assert err["line"] == line and expected in (err["expected"] + err["got"]), err
    assert "Traceback" not in res.output


def test_missing_file_exits_2(tmp_path: Path) -> None:
    assert runner.invoke(app, ["replay", str(tmp_path / "none.jsonl")]).exit_code == 2


def test_violations_by_hand(tmp_path: Path) -> None:
    """A double free and a double unlock are violations (exit 1), not format errors."""
    path = tmp_path / "t.jsonl"
    free = '{"step":2,"op":"free_kv","req":1,"slots":[1,2]}'
    path.write_text("\n".join([HEADER, ALLOC, free, free.replace('"step":2', '"step":3')]) + "\n")
    r = replay_path(path)
    assert r.violation is not None and r.violation.rule == "inv_single_owner" and r.violation.step == 3
    assert any("free_kv by req 1" in e for e in r.violation.history["kv slot 1"])


def test_schema_names_every_op() -> None:
    schema = json.loads((Path(__file__).parents[2] / "contracts" / "trace" / "schema.json").read_text())
    assert {e["title"] for e in schema["$defs"]["event"]["oneOf"]} == set(OPS)


CHILD = """
import json, os, sys
from kvledger.contracts.trace.replay import replay, replay_path
page = os.sysconf("SC_PAGE_SIZE")
samples = []
def rss(n):
    with open("/proc/self/statm") as f:
        samples.append((n, int(f.read().split()[1]) * page))
r = replay_path(sys.argv[1], rss)
print(json.dumps({"ok": r.ok, "steps": r.steps, "samples": samples}))
"""


def test_streaming_memory_flat(tmp_path: Path) -> None:
    """Resident memory while replaying 100k events stays flat after the first 20k (nothing accumulates per step)."""
    path = tmp_path / "s.jsonl"
    write_synthetic(path, 100_000)
    out = subprocess.run([sys.executable, "-c", CHILD, str(path)], capture_output=True, text=True, check=True)
    got = json.loads(out.stdout)
    assert got["ok"] and got["steps"] >= 100_000
    early = max(b for n, b in got["samples"] if n <= 20_000)
    late = max(b for n, b in got["samples"])
    assert late - early < 4 * 2**20, (early, late)


@pytest.mark.parametrize(
    ("evict", "ok"),
    [
        ('{"step":4,"op":"evict","component":"full","n":2,"freed":2,"evicted":{"full":[[1],[1,2]]}}', True),
        ('{"step":4,"op":"evict","component":"full","n":1,"freed":1,"evicted":{"full":[[1,2]]}}', True),
        ('{"step":4,"op":"evict","component":"full","n":2,"freed":0,"evicted":{}}', False),  # nothing went
        ('{"step":4,"op":"evict","component":"full","n":2,"freed":1,"evicted":{"full":[[1,2]]}}', False),  # too little
        ('{"step":4,"op":"evict","component":"full","n":1,"freed":2,"evicted":{"full":[[1,2]]}}', False),  # misreports
    ],
)
def test_eviction_frees_what_was_asked(evict: str, ok: bool, tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    write = '{"step":2,"op":"write_kv","slots":[1,2],"tokens":[1,2],"start":0}'
    insert = (
        '{"step":3,"op":"insert","req":1,"key":[1,2],"slots":[1,2],"mamba":null,'
        '"prefix_len":0,"dup_slots":[],"dup_mamba":null}'
    )
    path.write_text("\n".join([HEADER, ALLOC, write, insert, evict]) + "\n")
    r = replay_path(path)
    assert r.error is None
    assert r.ok is ok, r.violation
    if not ok:
        assert r.violation is not None and r.violation.rule == "eviction frees what was asked (or all it can)"


def test_sizes_and_lru_members_checked(tmp_path: Path) -> None:
    """``sizes`` must equal the spec's counters; an ``lru`` event's list must hold exactly the ``cached`` nodes."""
    write = '{"step":2,"op":"write_kv","slots":[1,2],"tokens":[1,2],"start":0}'

    def run(insert_sizes: str, lru: str) -> str | None:
        insert = (
            '{"step":3,"op":"insert","req":1,"key":[1,2],"slots":[1,2],"mamba":null,'
            f'"prefix_len":0,"dup_slots":[],"dup_mamba":null,"sizes":{insert_sizes}}}'
        )
        path = tmp_path / "t.jsonl"
        path.write_text("\n".join([HEADER, ALLOC, write, insert, lru]) + "\n")
        r = replay_path(path)
        assert r.error is None, r.error
        return None if r.violation is None else r.violation.rule

    good_lru = '{"step":4,"op":"lru","component":"full","order":[1],"links":[],"cached":[1]}'
    assert run('{"full":[2,0]}', good_lru) is None
    assert run('{"full":[1,1]}', good_lru) == "inv_sizes"
    stale = '{"step":4,"op":"lru","component":"full","order":[1,2],"links":[[1,null,2],[2,1,null]],"cached":[1]}'
    assert run('{"full":[2,0]}', stale) == "inv_lru_members"


def test_duplicates_freed_by_the_cache(tmp_path: Path) -> None:
    """``dups_freed``: the cache freed duplicates itself; they must be duplicates and not be freed again."""
    lines = [
        HEADER,
        ALLOC,
        '{"step":2,"op":"write_kv","slots":[1,2],"tokens":[1,2],"start":0}',
        '{"step":3,"op":"insert","req":1,"key":[1,2],"slots":[1,2],"mamba":null,'
        '"prefix_len":0,"dup_slots":[],"dup_mamba":null}',
        '{"step":4,"op":"alloc_kv","req":2,"n":2,"slots":[3,4]}',
        '{"step":5,"op":"write_kv","slots":[3,4],"tokens":[1,2],"start":0}',
    ]

    def run(*tail: str) -> str | None:
        path = tmp_path / "t.jsonl"
        path.write_text("\n".join([*lines, *tail]) + "\n")
        r = replay_path(path)
        assert r.error is None, r.error
        return None if r.violation is None else r.violation.rule

    ins = (
        '{"step":6,"op":"insert","req":2,"key":[1,2],"slots":[3,4],"mamba":null,'
        '"prefix_len":2,"dup_slots":[3,4],"dup_mamba":null'
    )
    assert run(ins + ',"dups_freed":[3,4]}') is None
    assert run(ins + "}", '{"step":7,"op":"free_kv","req":2,"slots":[3,4]}') is None
    assert run(ins + ',"dups_freed":[3,4]}', '{"step":7,"op":"free_kv","req":2,"slots":[3,4]}') == "inv_single_owner"
    assert run(ins + ',"dups_freed":[1]}') == "results equal the spec's"


def _hand(*events: str, header: str = HEADER) -> tuple[int, str]:
    lines = [header, *(json.dumps({"step": i, **json.loads(e)}) for i, e in enumerate(events, 1))]
    r = replay(io.StringIO("\n".join(lines) + "\n"))
    if r.error is not None:
        return 2, str(r.error)
    return (1, r.violation.rule) if r.violation is not None else (0, "")


A12 = '{"op":"alloc_kv","req":1,"n":2,"slots":[1,2]}'
W12 = '{"op":"write_kv","slots":[1,2],"tokens":[1,2],"start":0}'
I12 = '{"op":"insert","req":1,"key":[1,2],"slots":[1,2],"mamba":null,"prefix_len":0,"dup_slots":[],"dup_mamba":null}'
LOCK = (
    '{"op":"lock","key":[1,2],"handle":1,"length":2,"slots":[1,2],"mamba":null,'
    '"coverage":[[[1],"full"],[[1,2],"full"]],"lock_delta":[[[1],"full",1],[[1,2],"full",1]]}'
)


@pytest.mark.parametrize(
    ("events", "want"),
    [
        # what the implementation did or returned, naming a slot twice: the law the repeat breaks (exit 1)
        ([A12, '{"op":"free_kv","req":1,"slots":[1,1]}'], (1, "inv_single_owner")),
        (['{"op":"alloc_kv","req":1,"n":2,"slots":[1,1]}'], (1, "inv_single_owner")),
        ([A12, '{"op":"write_kv","slots":[1,1],"tokens":[1,2],"start":0}'], (1, "inv_content")),
        ([A12, W12, I12.replace('"slots":[1,2]', '"slots":[1,1]')], (1, "inv_slots_distinct")),
        (
            [A12, W12, I12, '{"op":"lru","component":"full","order":[1,1],"links":[[1,null,null]]}'],
            (1, "inv_lru_detached"),
        ),
        (
            [A12, W12, I12, '{"op":"lru","component":"full","order":[1],"links":[],"cached":[1,1]}'],
            (1, "inv_lru_members"),
        ),
        # what a recorder writes as a set, naming an item twice: malformed (exit 2)
        ([A12, W12, I12, LOCK.replace('[[1,2],"full"]]', '[[1,2],"full"],[[1],"full"]]')], (2, "each item once")),
        ([A12, W12, I12, LOCK.replace('[[1,2],"full",1]]', '[[1,2],"full",1],[[1],"full",1]]')], (2, "each item once")),
        (
            [A12, W12, I12, '{"op":"lru","component":"full","order":[1],"links":[[1,null,null],[1,null,null]]}'],
            (2, "once"),
        ),
        ([A12, W12, I12, LOCK], (0, "")),
    ],
)
def test_repeats_are_never_merged(events: list[str], want: tuple[int, str]) -> None:
    code, what = _hand(*events)
    assert code == want[0] and want[1] in what, what


def test_dups_freed_twice_is_a_double_free() -> None:
    base = [
        A12,
        W12,
        I12,
        '{"op":"alloc_kv","req":2,"n":2,"slots":[3,4]}',
        '{"op":"write_kv","slots":[3,4],"tokens":[1,2],"start":0}',
    ]
    ins = (
        '{"op":"insert","req":2,"key":[1,2],"slots":[3,4],"mamba":null,"prefix_len":2,"dup_slots":[3,4],'
        '"dup_mamba":null,"dups_freed":%s}'
    )
    assert _hand(*base, ins % "[3,4]") == (0, "")
    assert _hand(*base, ins % "[3,3]") == (1, "inv_single_owner")


def test_header_says_exactly_what_was_recorded(tmp_path: Path) -> None:
    """``--no-lru``: the header drops 'lru', replay lists the LRU laws as not checked (with the reason)
    and never as checked; an lru event under a header without 'lru' is malformed (the header lies)."""
    path = tmp_path / "t.jsonl"
    res = runner.invoke(app, ["record", "--ops", "60", "-o", str(path), "--fault", "B1", "--model", "full", "--no-lru"])
    assert res.exit_code == 0, res.output
    header = json.loads(path.read_text().splitlines()[0])
    assert "lru" not in header["capabilities"]
    assert not any(json.loads(x)["op"] == "lru" for x in path.read_text().splitlines()[1:])
    res = runner.invoke(app, ["replay", str(path), "--json"])
    out = json.loads(res.stdout)
    skipped = {u["law"]: u["reason"] for u in out["unchecked"]}
    for law in ("inv_lru_detached", "inv_lru_links_symmetric", "inv_lru_members"):
        assert law not in out["checked"] and "lack 'lru'" in skipped[law]
    human = runner.invoke(app, ["replay", str(path)])
    assert "not checked" in human.output and "inv_lru_detached: not recorded" in human.output
    # with LRU links recorded: the laws are checked (and counted)
    full = tmp_path / "full.jsonl"
    assert runner.invoke(app, ["record", "--ops", "60", "-o", str(full), "--model", "full"]).exit_code == 0
    out = json.loads(runner.invoke(app, ["replay", str(full), "--json"]).stdout)
    assert out["checked"]["inv_lru_detached"] > 0 and "inv_lru_detached" not in {u["law"] for u in out["unchecked"]}
    # a header that lists no 'lru' above an lru event: malformed at that line
    lines = full.read_text().splitlines()
    head = json.loads(lines[0])
    head["capabilities"] = [c for c in head["capabilities"] if c != "lru"]
    at = next(i for i, x in enumerate(lines) if json.loads(x).get("op") == "lru")
    r = replay(io.StringIO("\n".join([json.dumps(head), *lines[1:]]) + "\n"))
    assert r.error is not None and r.error.line == at + 1 and "'lru'" in str(r.error)


def test_data_missing_is_reported_not_checked() -> None:
    """A header that claims 'lru' over a trace with no lru event: the LRU laws are not counted as checked."""
    header = json.dumps({"kvledger_trace": 1, "config": {}, "adapter": "x", "version": "1", "capabilities": ["lru"]})
    r = replay(io.StringIO(header + "\n" + json.dumps({"step": 1, **json.loads(A12)}) + "\n"))
    assert r.ok and "inv_lru_detached" not in r.checked
    assert "no event of the trace carried" in dict(r.unchecked)["inv_lru_detached"]
    assert r.checked["inv_single_owner"] == 1


def test_contracts_replay_agrees_with_the_sparse_ledgers(tmp_path: Path) -> None:
    """``contracts=True`` re-runs each ledger transition on the full spec ledger and compares it with the sparse one."""
    path = tmp_path / "t.jsonl"
    record_workload(ReferenceAdapter(CACHE_MODELS["hybrid"]), 60, seed=2, path=path)
    fast, full = replay_path(path), replay_path(path, contracts=True)
    assert fast.ok and full.ok and fast.steps == full.steps and fast.checked == full.checked
