"""The kvledger trace format (version 1): what a radix cache did, one JSON object per line.

A trace is JSON lines (UTF-8, ``\\n``-terminated). Line 1 is the header::

    {"kvledger_trace": 1, "config": {...CacheConfig fields...}, "adapter": "name", "version": "v"}

(optionally ``"capabilities": [...]``, ``"faults": [...]`` and ``"ledgers":
{"kv": [base, capacity], "mamba": [base, capacity]}`` where the pools' slots
lie when not at the defaults: KV ``[page_size, kv_tokens)``, Mamba ``[0, mamba_slots)``). Every further
line is one event: ``{"step": s, "op": name, ...fields}`` where ``step`` counts
events from 1 (line ``s + 1`` of the file). The events and their fields:

==============  ==============================================================
``alloc_kv``     ``req, n, slots`` (token slots, or ``null`` when refused)
``free_kv``      ``req, slots``
``alloc_mamba``  ``req, slot`` (or ``null``)
``free_mamba``   ``req, slot``
``write_kv``     ``slots, tokens, start`` (KV of ``tokens`` at positions ``start..``)
``match_prefix`` ``key, length, slots, mamba`` (what the cache returned)
``lock``         ``key, handle, length, slots, mamba``; optional ``coverage``
                 (``[[key, component], ...]`` the handle raised) and ``lock_delta``
``unlock``       ``handle``; optional ``lock_delta``
``insert``       ``req, key, slots, mamba, prefix_len, dup_slots, dup_mamba``; optional
                 ``dups_freed`` (duplicates the cache freed itself)
``evict``        ``component, n, freed, evicted`` (``freed``: what ``evict`` returned)
``mamba_cow``    ``handle, req, slot``; optional ``evicted`` and ``lock_delta``
``lru``          ``component, order, links`` (``links``: ``[[node, prev, next], ...]``
                 for the nodes whose links changed since the last ``lru`` event of
                 that component; ``prev``/``next`` a node id, ``-1`` for a sentinel
                 seen from outside the list, ``null`` for none)
==============  ==============================================================

A *system* trace (the whole memory manager: requests, admission, sessions,
the leak checker) has ``"pools": {name: [base, capacity], ...}`` in its header
and three events instead of the table above:

==============  ==============================================================
``call``         ``name`` (one of :data:`CALLS`) and what the call was given and
                 returned: optional ``req``, ``session``, ``tokens``, ``n``,
                 ``component``, ``admitted``, ``prefix_len``, ``handles_before``,
                 ``handles_after``, ``committed_len``, ``ok``, ``leaked``
                 (``{pool: [slots]}``), ``error`` (the call raised: nothing may change)
``own``          ``pool, slots, src, dst``: the slots changed owner during the last
                 ``call`` (``src`` ``null``: allocated; ``dst`` ``null``: freed);
                 owners are ``"req:3"``, ``"session:1"``, ``"node:5/full"``
``row``          ``row, start, slots``: request-table row ``row`` holds ``slots``
                 (token slot ids) at positions ``start..`` after the last ``call``
==============  ==============================================================

``evicted`` is ``{"full": [keys], "swa": [keys], "mamba": [keys]}``: the pages
that left the cache, became SWA tombstones, or lost their Mamba state, as
observed (a recorder takes it from a diff of ``snapshot().prefix``).
``lock_delta`` is ``[[key, component, delta], ...]``: how the implementation's
lock counters moved during the operation (from ``snapshot().locks.lock_ref``).
Optional everywhere a tree operation is recorded: ``sizes``
(``{component: [evictable, protected]}``, the implementation's own counters
after the call); on ``lru``: ``cached`` (the nodes holding that component's
content, which the list must hold).
Keys are token lists; components are ``"full"``, ``"swa"``, ``"mamba"``.

:class:`TraceWriter` writes a trace line by line; :func:`read_trace` reads one
as a generator (no whole-file load) and validates each line against the table
above (the same table as ``trace/schema.json``), raising
:class:`TraceFormatError` with the line number and what was expected.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from kvledger.contracts.adapters.protocol import CacheConfig

TRACE_VERSION = 1
"""The only schema version this module reads and writes."""

MAX_POOL = 2**26
"""The largest pool (tokens or states) a replay accepts: the spec ledger holds one entry per slot."""

Event = dict[str, Any]
"""One validated event line: ``step``, ``op`` and the op's fields."""

# Field kinds: "int", "int?" (int or null), "ints" (list of int), "ints?" (list or null), "str",
# "comp" (component name), "coverage", "delta", "evicted", "links".
_FIELDS: dict[str, dict[str, str]] = {
    "alloc_kv": {"req": "int", "n": "int", "slots": "ints?"},
    "free_kv": {"req": "int", "slots": "ints"},
    "alloc_mamba": {"req": "int", "slot": "int?"},
    "free_mamba": {"req": "int", "slot": "int"},
    "write_kv": {"slots": "ints", "tokens": "ints", "start": "int"},
    "match_prefix": {"key": "ints", "length": "int", "slots": "ints", "mamba": "int?"},
    "lock": {"key": "ints", "handle": "int", "length": "int", "slots": "ints", "mamba": "int?"},
    "unlock": {"handle": "int"},
    "insert": {
        "req": "int",
        "key": "ints",
        "slots": "ints",
        "mamba": "int?",
        "prefix_len": "int",
        "dup_slots": "ints",
        "dup_mamba": "int?",
    },
    "evict": {"component": "comp", "n": "int", "freed": "int", "evicted": "evicted"},
    "mamba_cow": {"handle": "int", "req": "int", "slot": "int?"},
    "lru": {"component": "comp", "order": "ints", "links": "links"},
    "call": {"name": "call"},
    "own": {"pool": "str", "slots": "ints", "src": "owner?", "dst": "owner?"},
    "row": {"row": "int", "start": "int", "slots": "ints"},
}
_OPTIONAL: dict[str, dict[str, str]] = {
    "lock": {"coverage": "coverage", "lock_delta": "delta", "sizes": "sizes"},
    "unlock": {"lock_delta": "delta", "sizes": "sizes"},
    "mamba_cow": {"evicted": "evicted", "lock_delta": "delta", "sizes": "sizes"},
    "match_prefix": {"sizes": "sizes"},
    "insert": {"sizes": "sizes", "dups_freed": "ints"},
    "evict": {"sizes": "sizes"},
    "lru": {"cached": "ints"},
    "call": {
        "req": "int",
        "session": "int",
        "tokens": "ints",
        "n": "int",
        "component": "comp",
        "admitted": "bool",
        "prefix_len": "int",
        "handles_before": "ints",
        "handles_after": "ints",
        "committed_len": "int",
        "ok": "bool",
        "leaked": "leaked",
        "error": "str",
    },
}
OPS = tuple(_FIELDS)
SYSTEM_OPS = ("call", "own", "row")
"""The events of a system trace (header with ``pools``); the others belong to cache traces."""
CALLS = (
    "add_request",
    "open_session",
    "admit",
    "extend",
    "finish",
    "chunk",
    "retract",
    "abort",
    "close_session",
    "evict",
    "inject_failure",
    "leak_check",
)
"""The memory-manager calls a system trace names."""
OWNER_RE = re.compile(r"(req|session):(\d+)|node:(\d+)/(full|swa|mamba)")
COMPONENTS = ("full", "swa", "mamba")
_KIND_TEXT = {
    "int": "an integer",
    "int?": "an integer or null",
    "ints": "a list of integers",
    "ints?": "a list of integers or null",
    "str": "a string",
    "comp": "one of 'full', 'swa', 'mamba'",
    "coverage": "a list of [key, component] pairs",
    "delta": "a list of [key, component, integer] triples",
    "evicted": "an object {full, swa, mamba} of key lists",
    "links": "a list of [node, prev, next] triples (integers or null)",
    "bool": "true or false",
    "call": "one of " + ", ".join(CALLS),
    "owner?": "an owner ('req:3', 'session:1', 'node:5/full') or null",
    "leaked": "an object {pool: [slots]}",
    "sizes": "an object {component: [evictable, protected]}",
}


class TraceFormatError(Exception):
    """Malformed trace input: ``line`` (1-based) and what was ``expected`` there."""

    def __init__(self, line: int, expected: str, got: str = "") -> None:
        self.line = line
        self.expected = expected
        self.got = got
        super().__init__(f"line {line}: expected {expected}" + (f", got {got}" if got else ""))

    def to_json(self) -> dict[str, object]:
        return {"line": self.line, "expected": self.expected, "got": self.got}


def _is_int(x: object) -> bool:
    return type(x) is int


def _is_ints(x: object) -> bool:
    return type(x) is list and all(type(v) is int for v in x)


def _is_key_comp(x: object, n: int) -> bool:
    return isinstance(x, list) and len(x) == n and _is_ints(x[0]) and x[1] in COMPONENTS and (n == 2 or _is_int(x[2]))


def _valid(kind: str, x: object) -> bool:
    if kind == "int":
        return _is_int(x)
    if kind == "int?":
        return x is None or _is_int(x)
    if kind == "ints":
        return _is_ints(x)
    if kind == "ints?":
        return x is None or _is_ints(x)
    if kind == "str":
        return isinstance(x, str)
    if kind == "comp":
        return isinstance(x, str) and x in COMPONENTS
    if kind == "coverage":
        return isinstance(x, list) and all(_is_key_comp(v, 2) for v in x)
    if kind == "delta":
        return isinstance(x, list) and all(_is_key_comp(v, 3) for v in x)
    if kind == "evicted":
        return (
            isinstance(x, dict)
            and set(x) <= set(COMPONENTS)
            and all(isinstance(v, list) and all(_is_ints(k) for k in v) for v in x.values())
        )
    if kind == "bool":
        return type(x) is bool
    if kind == "call":
        return isinstance(x, str) and x in CALLS
    if kind == "owner?":
        return x is None or (isinstance(x, str) and OWNER_RE.fullmatch(x) is not None)
    if kind == "leaked":
        return isinstance(x, dict) and all(isinstance(k, str) and _is_ints(v) for k, v in x.items())
    if kind == "sizes":
        return (
            isinstance(x, dict) and set(x) <= set(COMPONENTS) and all(_is_ints(v) and len(v) == 2 for v in x.values())
        )
    if kind == "links":
        return isinstance(x, list) and all(
            isinstance(v, list) and len(v) == 3 and _is_int(v[0]) and all(p is None or _is_int(p) for p in v[1:])
            for v in x
        )
    raise AssertionError(kind)


def _short(x: object) -> str:
    text = json.dumps(x) if not isinstance(x, str) else repr(x)
    return text if len(text) <= 60 else text[:57] + "..."


def validate_event(obj: object, line: int, step: int) -> Event:
    """``obj`` as an event of step ``step`` at ``line``, or :class:`TraceFormatError` naming what is wrong."""
    if not isinstance(obj, dict):
        raise TraceFormatError(line, "a JSON object (one event)", _short(obj))
    op = obj.get("op")
    if not isinstance(op, str) or op not in _FIELDS:
        raise TraceFormatError(line, f"'op' one of {', '.join(OPS)}", _short(op) if "op" in obj else "no 'op'")
    if obj.get("step") != step or not _is_int(obj.get("step")):
        raise TraceFormatError(line, f"'step' {step}", _short(obj.get("step")) if "step" in obj else "no 'step'")
    for name, kind in _FIELDS[op].items():
        if name not in obj:
            raise TraceFormatError(line, f"field {name!r} ({_KIND_TEXT[kind]}) in {op}", "nothing")
        if not _valid(kind, obj[name]):
            raise TraceFormatError(line, f"field {name!r} of {op} to be {_KIND_TEXT[kind]}", _short(obj[name]))
    for name, kind in _OPTIONAL.get(op, {}).items():
        if name in obj and not _valid(kind, obj[name]):
            raise TraceFormatError(line, f"field {name!r} of {op} to be {_KIND_TEXT[kind]}", _short(obj[name]))
    return obj


def config_from_json(obj: object, line: int = 1) -> CacheConfig:
    """The :class:`CacheConfig` a header's ``config`` names (unknown or mistyped fields are a format error)."""
    if not isinstance(obj, dict):
        raise TraceFormatError(line, "'config' an object of CacheConfig fields", _short(obj))
    names = {f.name for f in dataclasses.fields(CacheConfig)}
    for k, v in obj.items():
        if k not in names:
            raise TraceFormatError(line, f"config fields among {', '.join(sorted(names))}", repr(k))
        ok = (k == "mamba" and isinstance(v, bool)) or (k == "window" and (v is None or _is_int(v)))
        ok = ok or (k not in ("mamba", "window") and _is_int(v) and 0 < v <= MAX_POOL)
        if not ok:
            raise TraceFormatError(line, f"config field {k!r} of the right type (sizes in [1, {MAX_POOL}])", _short(v))
    return CacheConfig(**obj)


@dataclass(frozen=True)
class Header:
    """A trace's first line."""

    config: CacheConfig
    adapter: str
    version: str
    capabilities: frozenset[str] | None = None
    faults: tuple[str, ...] = ()
    pools: dict[str, tuple[int, int]] | None = None  # a system trace: pool name -> (base, capacity)
    ledgers: dict[str, tuple[int, int]] | None = None  # a cache trace: where its kv/mamba slots lie, if not the default

    @property
    def system(self) -> bool:
        """A trace of the whole memory manager (``call``/``own``/``row`` events), not of a cache alone."""
        return self.pools is not None

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "kvledger_trace": TRACE_VERSION,
            "config": dataclasses.asdict(self.config),
            "adapter": self.adapter,
            "version": self.version,
        }
        if self.capabilities is not None:
            out["capabilities"] = sorted(self.capabilities)
        if self.faults:
            out["faults"] = list(self.faults)
        if self.pools is not None:
            out["pools"] = {k: list(v) for k, v in self.pools.items()}
        if self.ledgers:
            out["ledgers"] = {k: list(v) for k, v in self.ledgers.items()}
        return out


def _is_range(v: object) -> bool:
    """``[base, capacity]`` of a pool: integers, ``0 <= base`` and ``0 < capacity``, both at most ``MAX_POOL``."""
    return (
        isinstance(v, list)
        and len(v) == 2
        and _is_int(v[0])
        and _is_int(v[1])
        and 0 <= v[0] <= MAX_POOL
        and 0 < v[1] <= MAX_POOL
    )


def parse_header(obj: object) -> Header:
    """The header on line 1, or :class:`TraceFormatError`."""
    if not isinstance(obj, dict) or "kvledger_trace" not in obj:
        raise TraceFormatError(1, 'a header {"kvledger_trace": 1, "config": ..., "adapter": ..., "version": ...}')
    if obj["kvledger_trace"] != TRACE_VERSION:
        raise TraceFormatError(1, f"schema version {TRACE_VERSION}", _short(obj["kvledger_trace"]))
    for name in ("config", "adapter", "version"):
        if name not in obj:
            raise TraceFormatError(1, f"header field {name!r}", "nothing")
    if not isinstance(obj["adapter"], str) or not isinstance(obj["version"], str):
        raise TraceFormatError(1, "header 'adapter' and 'version' to be strings")
    caps = obj.get("capabilities")
    if caps is not None and not (isinstance(caps, list) and all(isinstance(c, str) for c in caps)):
        raise TraceFormatError(1, "header 'capabilities' a list of strings", _short(caps))
    faults = obj.get("faults", [])
    if not (isinstance(faults, list) and all(isinstance(c, str) for c in faults)):
        raise TraceFormatError(1, "header 'faults' a list of strings", _short(faults))
    pools, ledgers = obj.get("pools"), obj.get("ledgers")
    for name, value in (("pools", pools), ("ledgers", ledgers)):
        if value is not None and not (isinstance(value, dict) and all(_is_range(v) for v in value.values())):
            raise TraceFormatError(1, f"header {name!r} an object {{name: [base, capacity]}} (sizes <= {MAX_POOL})")
    return Header(
        config_from_json(obj["config"]),
        obj["adapter"],
        obj["version"],
        frozenset(caps) if caps is not None else None,
        tuple(faults),
        None if pools is None else {k: (v[0], v[1]) for k, v in pools.items()},
        None if ledgers is None else {k: (v[0], v[1]) for k, v in ledgers.items()},
    )


def _loads(text: str, line: int, last: bool) -> object:
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        if last:
            raise TraceFormatError(line, "a complete JSON line (the last line is truncated)", _short(text)) from None
        raise TraceFormatError(line, f"valid JSON ({err.msg} at column {err.colno})", _short(text)) from None


def iter_lines(stream: IO[str]) -> Iterator[tuple[int, str, bool]]:
    """``(line number, text, is_last_and_unterminated)`` for each non-blank line of ``stream``, lazily."""
    number = 0
    for raw in stream:
        number += 1
        if not raw.strip():
            continue
        yield number, raw, not raw.endswith("\n")


def read_trace(stream: IO[str]) -> tuple[Header, Iterator[tuple[int, Event]]]:
    """The header and a generator of ``(line number, event)``; a malformed line raises :class:`TraceFormatError`.

    The header is read at once (so a bad header fails before any event);
    events are parsed one line at a time as the generator is consumed.
    """
    lines = iter_lines(stream)
    first = next(lines, None)
    if first is None:
        raise TraceFormatError(1, "a header line (the trace is empty)")
    number, text, last = first
    if number != 1:
        raise TraceFormatError(1, "a header line (blank line found)")
    header = parse_header(_loads(text, 1, last))

    def events() -> Iterator[tuple[int, Event]]:
        for step, (line, raw, unterminated) in enumerate(lines, 1):
            yield line, validate_event(_loads(raw, line, unterminated), line, step)

    return header, events()


class TraceWriter:
    """Writes a trace: the header at construction, then :meth:`event` per operation (numbered ``step``)."""

    def __init__(self, path: Path | str | IO[str], header: Header) -> None:
        self._own = not hasattr(path, "write")
        self._out: IO[str] = open(path, "w", encoding="utf-8") if self._own else path  # type: ignore[arg-type,assignment]  # noqa: SIM115
        self.step = 0
        self._write(header.to_json())

    def _write(self, obj: Mapping[str, object]) -> None:
        self._out.write(json.dumps(obj, separators=(",", ":")) + "\n")

    def event(self, op: str, **fields: object) -> None:
        """Append one event (``fields`` as in the table of this module's docstring)."""
        self.step += 1
        self._write({"step": self.step, "op": op, **fields})

    def close(self) -> None:
        if self._own:
            self._out.close()
        else:
            self._out.flush()

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
