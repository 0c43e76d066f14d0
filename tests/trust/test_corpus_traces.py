"""Held-out trust corpus (issue 17), traces: valid recorded traces mutated field by field, line by line.

Three traces are recorded fresh (a cache trace of the reference's hybrid
cache, a system trace of its memory manager, and a shared-pool system trace
of the toy engine of ``tests/trace/test_shared_trace.py``). Each mutation
makes one of them garbage in one way, by class:

* a field of an event or of the header given a value of the wrong type or out of range, or removed;
  an unknown field added;
* a line cut short, doubled, two events swapped (an impossible order), an event moved before the header;
* ids of a list repeated.

A replay of garbage must end in exit 2 (malformed, with the line) or 1 (a law
the change breaks): never 0 (``silent``) and never an exception (``traceback``).
Replays never change state, so the state class does not apply here.
"""

from __future__ import annotations

import importlib.util
import io
import json
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kvledger.contracts.adapters.reference import ReferenceAdapter
from kvledger.contracts.machines.suites import CACHE_MODELS, SYSTEM_MODELS
from kvledger.contracts.machines.system import build_manager
from kvledger.contracts.trace.adapter_recorder import record_adapter_workload
from kvledger.contracts.trace.format import _FIELDS
from kvledger.contracts.trace.recorder import record_workload
from kvledger.contracts.trace.replay import replay
from kvledger.contracts.trace.system_recorder import record_system_workload

Lines = list[str]


def _toy() -> Any:
    path = Path(__file__).parents[1] / "trace" / "test_shared_trace.py"
    spec = importlib.util.spec_from_file_location("kvledger_trust_toy_shared", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.ToyShared


def _record(kind: str) -> Lines:
    buf = io.StringIO()
    if kind == "cache":
        record_workload(ReferenceAdapter(CACHE_MODELS["hybrid"]), 60, 3, buf)
    elif kind == "system":
        record_system_workload(build_manager(*SYSTEM_MODELS["mamba"]), 40, 3, buf)
    else:
        record_adapter_workload(_toy()(), 60, 3, buf)
    return buf.getvalue().splitlines()


TRACES = {kind: _record(kind) for kind in ("cache", "system", "shared")}


def verdict(lines: Lines) -> tuple[str, str]:
    """(outcome, detail): ``clean`` for exit 1 or 2, ``silent`` for exit 0, ``traceback`` for an exception."""
    try:
        r = replay(io.StringIO("".join(x + "\n" for x in lines)))
    except Exception as err:
        return "traceback", f"{type(err).__name__}: {err}"
    if r.exit_code == 0:
        return "silent", f"replayed green ({r.steps} events)"
    return "clean", f"exit {r.exit_code}: {r.error or r.violation}"


# ---------------------------------------------------------------- mutations

WRONG: list[tuple[str, object]] = [
    ("text", "7"),
    ("float", 7.5),
    ("bool", True),
    ("null", None),
    ("object", {"x": 1}),
    ("nested", [[7]]),
    ("negative", -7),
    ("past int64", 2**64),
]


def _with(lines: Lines, i: int, obj: dict[str, Any]) -> Lines:
    return [*lines[:i], json.dumps(obj), *lines[i + 1 :]]


@dataclass(frozen=True)
class Mutation:
    trace: str
    label: str
    make: Callable[[], Lines]


def _events_by_op(lines: Lines) -> dict[str, int]:
    """The line index of the first event of each op (and of each system call name) in ``lines``."""
    first: dict[str, int] = {}
    for i, text in enumerate(lines[1:], 1):
        ev = json.loads(text)
        first.setdefault(ev["op"], i)
        if ev["op"] == "call":
            first.setdefault(f"call:{ev['name']}", i)
    return first


def _field_values_that_break(field: str, value: object) -> list[tuple[str, object]]:
    """The wrong values for ``field`` (whose valid value is ``value``): each class that is not of its kind."""
    out = []
    for label, bad in WRONG:
        if type(bad) is type(value) and label != "negative":
            continue  # NOTE: the same kind as the valid value: not wrong by type
        if label == "null" and field in {"slots", "mamba", "slot", "dup_mamba", "src", "dst"}:
            continue  # NOTE: these fields may be null
        if label in ("negative", "past int64") and not isinstance(value, int | list):
            continue
        if label == "negative" and isinstance(value, list):
            bad = [-7]
        if label == "past int64" and isinstance(value, list):
            bad = [2**64]
        out.append((label, bad))
    return out


def mutations() -> Iterator[Mutation]:
    rng = random.Random(17)
    for kind, lines in TRACES.items():
        by_op = _events_by_op(lines)
        # field by field, on the first event of each op
        for op, i in sorted(by_op.items()):
            ev = json.loads(lines[i])
            for field, value in ev.items():
                if field == "op":
                    for bad in ("Alloc_kv", "", 7):
                        yield Mutation(
                            kind, f"{op}.op={bad!r}", lambda ln=lines, i=i, ev=ev, b=bad: _with(ln, i, {**ev, "op": b})
                        )
                    continue
                if field == "step" and op != next(iter(by_op)):
                    continue
                for label, bad in _field_values_that_break(field, value):
                    if isinstance(value, list) and not value and label in ("negative", "past int64"):
                        continue
                    if field in ("name", "pool", "holder", "component") and label not in ("float", "null", "nested"):
                        continue
                    yield Mutation(
                        kind,
                        f"{op}.{field}={label}",
                        lambda ln=lines, i=i, ev=ev, f=field, b=bad: _with(ln, i, {**ev, f: b}),
                    )
                if field != "step" and field in _FIELDS.get(ev["op"], {}):  # NOTE: optional fields may be left out
                    yield Mutation(
                        kind,
                        f"{op}.{field} removed",
                        lambda ln=lines, i=i, ev=ev, f=field: _with(ln, i, {k: v for k, v in ev.items() if k != f}),
                    )
            yield Mutation(kind, f"{op}+unknown field", lambda ln=lines, i=i, ev=ev: _with(ln, i, {**ev, "slots_": []}))
            yield Mutation(
                kind, f"{op} cut short", lambda ln=lines, i=i: [*ln[:i], ln[i][: len(ln[i]) // 2], *ln[i + 1 :]]
            )
        # a repeated id in the first list of slots an event names
        for op, i in sorted(by_op.items()):
            ev = json.loads(lines[i])
            for field in ("slots", "blocks", "joined", "freed_slots"):
                v = ev.get(field)
                if isinstance(v, list) and v and isinstance(v[0], int):
                    yield Mutation(
                        kind,
                        f"{op}.{field} repeats an id",
                        lambda ln=lines, i=i, ev=ev, f=field, v=v: _with(ln, i, {**ev, f: [*v, v[0]]}),
                    )
        # impossible orders: the first allocation-like event done twice, two neighbours swapped at random places
        for op in ("alloc_kv", "insert", "own", "join", "call:admit", "call:finish"):
            if op in by_op:
                i = by_op[op]
                yield Mutation(kind, f"{op} doubled", lambda ln=lines, i=i: [*ln[: i + 1], ln[i], *ln[i + 1 :]])
        for _ in range(4):
            i = rng.randrange(2, len(lines) - 1)
            yield Mutation(
                kind,
                f"swap {i}",
                lambda ln=lines, i=i: [*ln[:i], ln[i + 1], ln[i], *ln[i + 2 :]] if ln[i] != ln[i + 1] else ["{}"],
            )
        yield Mutation(kind, "event before the header", lambda ln=lines: [ln[1], ln[0], *ln[2:]])
        yield Mutation(
            kind,
            "steps renumbered from 0",
            lambda ln=lines: [ln[0], *(json.dumps({**json.loads(x), "step": j}) for j, x in enumerate(ln[1:]))],
        )
        # the header
        head = json.loads(lines[0])
        for field, value in head.items():
            for label, bad in WRONG:
                if type(bad) is type(value):
                    continue
                yield Mutation(
                    kind,
                    f"header.{field}={label}",
                    lambda ln=lines, h=head, f=field, b=bad: [json.dumps({**h, f: b}), *ln[1:]],
                )
        for field, value in head["config"].items():
            for label, bad in [("zero", 0), ("text", "4"), ("float", 4.0), ("huge", 2**40)]:
                if field == "mamba" or (field == "window" and value is None and label == "huge"):
                    continue
                yield Mutation(
                    kind,
                    f"config.{field}={label}",
                    lambda ln=lines, h=head, f=field, b=bad: [
                        json.dumps({**h, "config": {**h["config"], f: b}}),
                        *ln[1:],
                    ],
                )
        yield Mutation(
            kind,
            "header capability misspelt",
            lambda ln=lines, h=head: [
                json.dumps({**h, "capabilities": [*h.get("capabilities", []), "lru_links"]}),
                *ln[1:],
            ],
        )
        yield Mutation(
            kind, "header fault unknown", lambda ln=lines, h=head: [json.dumps({**h, "faults": ["B9"]}), *ln[1:]]
        )
        yield Mutation(kind, "no header", lambda ln=lines: ln[1:])


MUTATIONS = list(mutations())


def test_the_recorded_traces_replay_green() -> None:
    """The mutations start from traces that hold (so a verdict of exit 1 or 2 is the mutation's doing)."""
    for kind, lines in TRACES.items():
        assert verdict(lines)[0] == "silent", f"the recorded {kind} trace does not replay green"


@pytest.mark.parametrize("m", MUTATIONS, ids=[f"{m.trace}-{m.label}" for m in MUTATIONS])
def test_corpus_trace_is_refused(m: Mutation) -> None:
    outcome, why = verdict(m.make())
    assert outcome == "clean", f"{outcome}: {m.trace} trace, {m.label}: {why}"


def test_the_fault_names_a_header_may_list_are_the_faults() -> None:
    from kvledger.contracts.trace.format import FAULT_NAMES
    from kvledger.impl.faults import FAULTS

    assert tuple(sorted(FAULTS)) == FAULT_NAMES


def test_the_trace_verdict_names_each_defect_class(monkeypatch: pytest.MonkeyPatch) -> None:
    """A green replay is ``silent`` (the recorded traces are), a replay that raises is a ``traceback``, a mutation
    the replay refuses is ``clean``: each outcome the corpus counts can be produced."""
    lines = TRACES["cache"]
    assert verdict(lines)[0] == "silent"
    assert verdict([lines[0], "{"])[0] == "clean"

    def broken(*args: object, **kw: object) -> None:
        raise RuntimeError("a replay that crashes")

    monkeypatch.setitem(globals(), "replay", broken)
    assert verdict(lines)[0] == "traceback"
