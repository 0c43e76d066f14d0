"""The trace schema is strict, and the validator agrees with it: schema-driven fuzzing of every field.

Real traces are recorded (cache traces of two models with every optional
field, system traces of two models); for each event kind, the first event
carrying each field is taken, and the field is mutated to values drawn from
its schema (the bounds ±1, the int64 limits, every wrong JSON type, a
repeat in a set-valued list) and to raw text JSON cannot hold (a 5,000-digit
integer, 100,000-deep nesting, NaN, a key written twice). Each mutation is
replayed end to end, on the trace up to that line:

* the schema (``jsonschema``) rejects it  =>  the replay exits 2 at that line;
* the schema accepts it  =>  the replay does not crash (any verdict), and the
  validator accepts the line (except for the two rules the schema cannot
  state, named in ``schema.py``);
* an unknown sibling field (a misspelling of a real one) or a missing
  required field  =>  exit 2 at that line.

Never a traceback: ``replay`` returns a result for every input.
"""

from __future__ import annotations

import copy
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from kvledger.contracts.adapters.reference import ReferenceAdapter
from kvledger.contracts.machines.suites import CACHE_MODELS, SYSTEM_MODELS
from kvledger.contracts.machines.system import build_manager
from kvledger.contracts.trace.format import OPS, TraceFormatError, validate_event
from kvledger.contracts.trace.recorder import record_workload
from kvledger.contracts.trace.replay import replay
from kvledger.contracts.trace.schema import SCHEMA_PATH, build_schema, schema_text
from kvledger.contracts.trace.system_recorder import record_system_workload

SCHEMA = json.loads(SCHEMA_PATH.read_text())
EVENT = Draft202012Validator({"$defs": SCHEMA["$defs"], "$ref": "#/$defs/event"})
HEADER = Draft202012Validator({"$defs": SCHEMA["$defs"], "$ref": "#/$defs/header"})
BY_OP = {e["title"]: Draft202012Validator(e) for e in SCHEMA["$defs"]["event"]["oneOf"]}


def _schema_valid(ev: dict[str, Any]) -> bool:
    """The schema accepts ``ev`` (its op's branch when the op is one; the whole ``oneOf`` otherwise)."""
    op = ev.get("op")
    return BY_OP[op].is_valid(ev) if isinstance(op, str) and op in BY_OP else EVENT.is_valid(ev)


PLACEHOLDER = '"@@RAW@@"'
RAW = {
    "5000-digit integer": "9" * 5000,
    "25-digit negative integer": "-" + "1" * 25,
    "100000-deep list": "[" * 100_000 + "]" * 100_000,
    "100000-deep object": '{"a":' * 100_000 + "1" + "}" * 100_000,
    "NaN": "NaN",
    "Infinity": "-Infinity",
    "float exponent": "1e400",
}
# NOTE: what the validator may reject although the schema accepts (JSON Schema cannot state it).
BEYOND_SCHEMA = ("to name each item once", "base + capacity", "expected 'step' ")


def test_schema_json_is_built_from_the_format_tables() -> None:
    Draft202012Validator.check_schema(SCHEMA)
    assert SCHEMA_PATH.read_text() == schema_text(), "regenerate: python -m kvledger.contracts.trace.schema"
    assert {e["title"] for e in build_schema()["$defs"]["event"]["oneOf"]} == set(OPS)
    for e in SCHEMA["$defs"]["event"]["oneOf"]:
        assert e["additionalProperties"] is False, e["title"]


# ---------------------------------------------------------------- a corpus of real traces


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


# A system trace of a shared pool (blocks held by several holders, counted by the engine): every field of the
# shared header and events, hand-written (the recorders that write them need an engine with shared blocks;
# tests/trace/test_shared_trace.py records them from a toy one, tests/vllm from vLLM).
SHARED_EVENTS: list[dict[str, Any]] = [
    {"op": "call", "name": "add_request", "req": 0, "tokens": [1, 2, 3]},
    {"op": "call", "name": "admit", "req": 0, "admitted": True, "prefix_len": 0},
    {"op": "join", "pool": "kv", "holder": "req:0/swa", "blocks": [1, 2, 0]},
    {"op": "count", "pool": "kv", "counts": [[1, 1], [2, 1]]},
    {"op": "queue", "pool": "kv", "joined": [], "left": [1, 2]},
    {"op": "call", "name": "finish", "req": 0},
    {"op": "leave", "pool": "kv", "holder": "req:0/swa", "blocks": [1, 2, 0]},
    {"op": "count", "pool": "kv", "counts": [[1, 0], [2, 0]]},
    {"op": "queue", "pool": "kv", "joined": [2, 1], "left": []},
]
SHARED_LINES = [
    json.dumps(
        {
            "kvledger_trace": 1,
            "config": {"page_size": 2},
            "adapter": "hand",
            "version": "1",
            "pools": {"kv": [0, 8]},
            "shared": {"kv": [[0, 3]]},
        }
    ),
    *(json.dumps({"step": i, **e}) for i, e in enumerate(SHARED_EVENTS, 1)),
]


def test_the_hand_written_shared_trace_holds() -> None:
    assert _replay(SHARED_LINES)[0] == 0


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> list[list[str]]:
    tmp = tmp_path_factory.mktemp("corpus")
    out = []
    # NOTE: many short traces, so the first event carrying each field comes early (each case replays up to it).
    for seed in range(4):
        for model in ("hybrid", "swa"):
            path = tmp / f"{model}-{seed}.jsonl"
            record_workload(ReferenceAdapter(CACHE_MODELS[model]), 12, seed=seed, path=path)
            out.append(_lines(path))
        for model in ("mamba", "paged"):
            path = tmp / f"system-{model}-{seed}.jsonl"
            record_system_workload(build_manager(*SYSTEM_MODELS[model]), 12, seed, path)
            out.append(_lines(path))
    out.append(SHARED_LINES)
    return out


def _samples(corpus: list[list[str]]) -> Iterator[tuple[list[str], dict[str, Any], str]]:
    """(trace before the event, the event, a field it carries): the earliest event carrying each (op, field)."""
    best: dict[tuple[str, str], tuple[list[str], dict[str, Any], str]] = {}
    for lines in corpus:
        for i, text in enumerate(lines[1:], 1):
            ev = json.loads(text)
            for name in ev:
                if (ev["op"], name) not in best or len(best[ev["op"], name][0]) > i:
                    best[ev["op"], name] = (lines[:i], ev, name)
    yield from best.values()


def _values(prop: dict[str, Any]) -> list[Any]:
    """Values to put in a field whose schema is ``prop``: its bounds ±1, the int64 limits, every JSON type."""
    out: list[Any] = [None, True, False, 0, -1, 1, 1.5, "x", "full", "req:1", [], [1], [1, 1], [-1], [True], [[1]]]
    out += [{}, {"full": [1, 2]}, {"kv": [1, 1]}, [[1], "full"], [[[1], "full"], [[1], "full"]], [[1], "full", 1]]
    out += [2**63, -(2**63) - 1, 2**63 - 1, 2**31, [2**63]]
    for bound in ("minimum", "maximum"):
        if bound in prop:
            out += [prop[bound] - 1, prop[bound] + 1, prop[bound]]
    items = prop.get("items")
    if isinstance(items, dict):
        for bound in ("minimum", "maximum"):
            if bound in items:
                out += [[items[bound] - 1], [items[bound] + 1]]
    return out


_HAND_CALL_FIELDS = (
    "name",
    "ok",
    "leaked",
    "error",
    "component",
    "handles_before",
    "handles_after",
    "committed_len",
    "ended",
    "tokens",
    "n",
    "admitted",
    "prefix_len",
    "req",
    "session",
)


def _replay(lines: list[str]) -> tuple[int, int | None, str]:
    r = replay(io.StringIO("\n".join(lines) + "\n"))  # must return (never raise) whatever the input
    return r.exit_code, r.error.line if r.error is not None else None, str(r.error or r.violation or "")


def _misspelt(name: str) -> str:
    return name[:-2] + name[-1] + name[-2] if len(name) > 2 else name + "_"


def test_every_field_of_every_event_fuzzed(corpus: list[list[str]]) -> None:
    props = {e["title"]: e["properties"] for e in SCHEMA["$defs"]["event"]["oneOf"]}
    required = {e["title"]: e["required"] for e in SCHEMA["$defs"]["event"]["oneOf"]}
    cases = malformed = fields = valid = 0
    covered: set[tuple[str, str]] = set()
    for before, ev, name in _samples(corpus):
        line = len(before) + 1
        fields += 1
        covered.add((ev["op"], name))
        mutations: list[str] = []
        for value in _values(props[ev["op"]][name]):
            bad = {**ev, name: value}
            text = json.dumps(bad)
            if _schema_valid(bad):
                valid += 1
                code, _, why = _replay([*before, text])
                assert code in (0, 1, 2), why
                try:
                    validate_event(bad, line, ev["step"])
                except TraceFormatError as err:
                    assert any(b in str(err) for b in BEYOND_SCHEMA), (text, err)
                continue
            mutations.append(text)
        for raw in RAW.values():
            mutations.append(json.dumps({**ev, name: "@@RAW@@"}).replace(PLACEHOLDER, raw))
        if name not in ("step", "op"):
            mutations.append(json.dumps({**ev, _misspelt(name): ev[name]}))  # an unknown sibling field
            mutations.append(json.dumps(ev)[:-1] + f', "{name}": {json.dumps(ev[name])}}}')  # the key twice
        if name in required[ev["op"]]:
            mutations.append(json.dumps({k: v for k, v in ev.items() if k != name}))
        for text in mutations:
            cases += 1
            code, at, why = _replay([*before, text])
            assert (code, at) == (2, line), (text[:200], why)
            malformed += 1
    every = {(e["title"], p) for e in SCHEMA["$defs"]["event"]["oneOf"] for p in e["properties"]}
    missing = every - covered
    # NOTE: every field the recorders write is fuzzed; the rest are fuzzed on hand-made events below.
    assert missing <= HAND_MADE_FIELDS, sorted(missing - HAND_MADE_FIELDS)
    assert cases > 1000 and malformed == cases
    print(
        f"fuzzed {fields} fields of recorded events: {cases} malformed lines, all exit 2 at their line; {valid} valid"
    )


# Fields the short recorded corpus may lack (a call's error, a session's committed length, whom an engine's
# step ended, the cache freeing duplicates itself): fuzzed on hand-written events below.
HAND_MADE_FIELDS = {("call", name) for name in _HAND_CALL_FIELDS} | {("insert", "dups_freed")}

HAND_HEADER = json.dumps(
    {
        "kvledger_trace": 1,
        "config": {"page_size": 1, "mamba": True},
        "adapter": "hand",
        "version": "1",
        "pools": {"kv": [1, 16], "req_to_token": [0, 2], "mamba": [0, 4]},
    }
)
HAND_CALL = {
    "step": 1,
    "op": "call",
    "name": "leak_check",
    "ok": True,
    "leaked": {"kv": [1]},
    "error": "x",
    "component": "full",
    "handles_before": [1],
    "handles_after": [2],
    "committed_len": 1,
    "ended": {"abort": []},
    "tokens": [1],
    "n": 1,
    "admitted": True,
    "prefix_len": 0,
}


def test_every_optional_field_fuzzed_on_hand_made_events() -> None:
    """The fields the recorded corpus lacks, mutated on a hand-written call (all exit 2 at line 2)."""
    props = {e["title"]: e["properties"] for e in SCHEMA["$defs"]["event"]["oneOf"]}["call"]
    cases = 0
    for name in HAND_CALL:
        for value in _values(props[name]):
            bad = {**HAND_CALL, name: value}
            if _schema_valid(bad):
                assert _replay([HAND_HEADER, json.dumps(bad)])[0] in (0, 1, 2)
                continue
            cases += 1
            assert _replay([HAND_HEADER, json.dumps(bad)])[:2] == (2, 2), bad
    assert cases > 100
    print(f"fuzzed {len(HAND_CALL)} fields of a hand-made call: {cases} malformed lines, all exit 2 at line 2")


def test_dups_freed_fuzzed_on_a_hand_made_insert() -> None:
    header = json.dumps({"kvledger_trace": 1, "config": {}, "adapter": "hand", "version": "1"})
    events = [
        {"op": "alloc_kv", "req": 1, "n": 2, "slots": [1, 2]},
        {"op": "write_kv", "slots": [1, 2], "tokens": [1, 2], "start": 0},
        {"op": "insert", "req": 1, "key": [1, 2], "slots": [1, 2], "mamba": None, "prefix_len": 0}
        | {"dup_slots": [], "dup_mamba": None},
        {"op": "alloc_kv", "req": 2, "n": 2, "slots": [3, 4]},
        {"op": "write_kv", "slots": [3, 4], "tokens": [1, 2], "start": 0},
    ]
    before = [header, *(json.dumps({"step": i, **e}) for i, e in enumerate(events, 1))]
    last = {"step": 6, "op": "insert", "req": 2, "key": [1, 2], "slots": [3, 4], "mamba": None, "prefix_len": 2}
    last |= {"dup_slots": [3, 4], "dup_mamba": None, "dups_freed": [3, 4]}
    assert _replay([*before, json.dumps(last)])[0] == 0
    cases = 0
    for value in _values(BY_OP["insert"].schema["properties"]["dups_freed"]):
        bad = {**last, "dups_freed": value}
        if _schema_valid(bad):
            assert _replay([*before, json.dumps(bad)])[0] in (0, 1, 2)
            continue
        cases += 1
        assert _replay([*before, json.dumps(bad)])[:2] == (2, 7), bad
    assert cases > 10


# ---------------------------------------------------------------- the header


def _header_paths(obj: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield (*path, k)
            yield from _header_paths(v, (*path, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield (*path, i)
            yield from _header_paths(v, (*path, i))


def _set(obj: Any, path: tuple[Any, ...], value: Any) -> Any:
    out = copy.deepcopy(obj)
    at = out
    for k in path[:-1]:
        at = at[k]
    at[path[-1]] = value
    return out


@pytest.mark.parametrize("kind", ["cache", "system", "shared"])
def test_every_header_field_fuzzed(kind: str, tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    if kind == "cache":
        record_workload(ReferenceAdapter(CACHE_MODELS["hybrid"]), 10, seed=1, path=path)
        lines = _lines(path)
    elif kind == "system":
        record_system_workload(build_manager(*SYSTEM_MODELS["mamba"]), 10, 1, path)
        lines = _lines(path)
    else:
        lines = SHARED_LINES
    header = json.loads(lines[0])
    header.setdefault("faults", ["B1"])
    header.setdefault("capabilities", ["locks"])
    cases = 0
    for where in _header_paths(header):
        for value in _values({}):
            bad = _set(header, where, value)
            if HEADER.is_valid(bad):
                assert _replay([json.dumps(bad), *lines[1:]])[0] in (0, 1, 2)
                continue
            cases += 1
            code, at, why = _replay([json.dumps(bad), *lines[1:]])
            assert (code, at) == (2, 1), (where, value, why)
        if isinstance(where[-1], str) and where[:-1] != ("pools",):  # NOTE: pool names are open (an extra one is legal)
            cases += 1
            misspelt = {**header, _misspelt(str(where[-1])): 1} if len(where) == 1 else _set(header, where[:-1], {})
            if len(where) > 1:
                parent = header
                for k in where[:-1]:
                    parent = parent[k]
                misspelt = _set(header, where[:-1], {**parent, _misspelt(str(where[-1])): parent[where[-1]]})
            assert _replay([json.dumps(misspelt), *lines[1:]])[:2] == (2, 1), (where, misspelt)
    for raw in RAW.values():
        cases += 1
        text = json.dumps({**header, "version": "@@RAW@@"}).replace(PLACEHOLDER, raw)
        assert _replay([text, *lines[1:]])[:2] == (2, 1)
    assert cases > 100
    print(f"fuzzed the {kind} header: {cases} malformed headers, all exit 2 at line 1")
