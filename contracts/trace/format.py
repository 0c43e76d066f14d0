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
                 (``{pool: [slots]}``), ``ended`` (``{finish|retract|abort:
                 [requests]}``: the requests a finish, retract or abort ended, by
                 how, where the engine's step chose them; without it the call's
                 ``req`` ended), ``error`` (the call raised: nothing may change)
``own``          ``pool, slots, src, dst``: the slots changed owner during the last
                 ``call`` (``src`` ``null``: allocated; ``dst`` ``null``: freed);
                 owners are ``"req:3"``, ``"session:1"``, ``"node:5/full"``
``row``          ``row, start, slots``: request-table row ``row`` holds ``slots``
                 (token slot ids) at positions ``start..`` after the last ``call``,
                 and its live part ends there (``start + len(slots)``, at most the
                 live length before: what lies past it is stale and names nothing)
==============  ==============================================================

A system header's ``pools`` include ``kv`` (pages when ``page_size > 1``);
``req_to_token`` (the request table) is needed by ``row`` events; an event
naming a pool the header does not list is malformed.

*Shared pools.* Some engines let several holders hold one block at once and
count them (vLLM's ``ref_cnt``; :mod:`kvledger.spec.shared`). A system
header's optional ``"shared": {pool: [[sentinel, count], ...]}`` names the
pools of ``pools`` that are shared, each with its sentinel blocks (blocks that
stand in for skipped positions: holders name them, but they are never counted,
freed or queued) and the count each sentinel starts with. A shared pool starts
with every other block unheld, counted 0 and on the pool's free queue. Its
blocks move by four events (never by ``own``, which names only single-owner
pools; these four name only shared pools):

==============  ==============================================================
``join``         ``pool, holder, blocks``: during the last ``call``, ``holder``
                 joined the holder set of each block (once per time a block is
                 named: a table naming a block twice holds it twice)
``leave``        ``pool, holder, blocks``: ``holder`` left it, once per time named
``count``        ``pool, counts``: ``[[block, count], ...]``, the engine's own
                 counter of each block whose counter moved during the last
                 ``call``, as observed after it (any int64: a negative count is
                 a broken law, not a malformed line); each block once
``queue``        ``pool, joined, left``: the blocks that went onto / came off the
                 pool's free queue during the last ``call`` (distinct ids)
==============  ==============================================================

Holders are owners, and a request's holding in one kv-cache group carries
the group's component: ``"req:3"``, ``"req:3/swa"``, ``"session:1"``,
``"node:5/full"``. A system trace without ``shared`` has none of these events.

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

The header's ``capabilities`` say exactly what the trace holds: ``lru`` (``lru``
events), ``locks`` (``coverage`` and ``lock_delta``), ``sizes`` (``sizes``);
data a header with capabilities does not list is malformed.

:class:`TraceWriter` writes a trace line by line; :func:`read_trace` reads one
as a generator (no whole-file load) and validates each line strictly against the
table above (``trace/schema.json`` is built from the same tables): an unknown
field, a wrong type (``true`` is not an integer), a value out of range (ids and
counts in ``[0, 2**63)``, tokens in ``[0, 2**31)``, header sizes in ``[1, MAX_POOL]``),
a repeat in a set-valued list, a key twice in one object, ``NaN``, an integer
of more than 19 digits or nesting deeper than JSON can be parsed raises
:class:`TraceFormatError` with the line number and what was expected.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
from collections.abc import Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from kvledger.contracts.adapters.protocol import CAPABILITIES, CacheConfig
from kvledger.contracts.adapters.system import SYSTEM_CAPABILITIES

TRACE_VERSION = 1
"""The only schema version this module reads and writes."""

MAX_POOL = 2**31
"""The most slots a header may declare for one pool (``base + capacity``): slot ids fit in int32, the
index type engines' request tables use (SGLang's ``req_to_token`` is int32). A replay stores only
held slots, so what a header declares costs nothing until events use it."""

MAX_PAGE = 2**16
"""The largest page size a header may declare."""

MAX_INT = 2**63 - 1
"""The largest integer any field may hold (ids and counts are int64); ``-MAX_INT - 1`` the smallest."""

MAX_TOKEN = 2**31 - 1
"""The largest token id (in a key or ``tokens``)."""

KNOWN_CAPABILITIES = CAPABILITIES | SYSTEM_CAPABILITIES
"""The names a header's ``capabilities`` may list (those of cache and of system adapters)."""

FAULT_NAMES = ("B1", "B2", "B3", "B4", "B5")
"""The names a header's ``faults`` may list: ``kvledger.impl.faults.FAULTS`` (kept equal by a test; this module
imports no torch, so it does not import the faults)."""

MAX_DEPTH = 64
"""How deep a trace line may nest, as stated in messages (a valid line nests at most 5 deep; deeper lines fail
their field types, and lines too deep to parse fail as such)."""

Event = dict[str, Any]
"""One validated event line: ``step``, ``op`` and the op's fields."""

# Field kinds. "id": an integer in [0, MAX_INT] (slot, request, handle, row ids and counts); "int": any
# integer in int64; "ids"/"ids?": a list of ids (or null); "idset": a list of distinct ids (a set: a
# duplicate is malformed); "key"/"tokens": a list of token ids in [0, MAX_TOKEN]; "str", "bool", "comp"
# (component name), "call" (call name), "owner?", "coverage", "delta", "evicted", "links", "leaked",
# "sizes": as _KIND_TEXT says. Lists an implementation returned or accepted ("ids") may repeat an id in
# a trace: the replay reports that as a violation of the law the repeat breaks (a slot freed twice, a
# list holding a node twice), never merges it.
_FIELDS: dict[str, dict[str, str]] = {
    "alloc_kv": {"req": "id", "n": "id", "slots": "ids?"},
    "free_kv": {"req": "id", "slots": "ids"},
    "alloc_mamba": {"req": "id", "slot": "id?"},
    "free_mamba": {"req": "id", "slot": "id"},
    "write_kv": {"slots": "ids", "tokens": "tokens", "start": "id"},
    "match_prefix": {"key": "key", "length": "id", "slots": "ids", "mamba": "id?"},
    "lock": {"key": "key", "handle": "id", "length": "id", "slots": "ids", "mamba": "id?"},
    "unlock": {"handle": "id"},
    "insert": {
        "req": "id",
        "key": "key",
        "slots": "ids",
        "mamba": "id?",
        "prefix_len": "id",
        "dup_slots": "ids",
        "dup_mamba": "id?",
    },
    "evict": {"component": "comp", "n": "id", "freed": "id", "evicted": "evicted"},
    "mamba_cow": {"handle": "id", "req": "id", "slot": "id?"},
    "lru": {"component": "comp", "order": "ids", "links": "links"},
    "call": {"name": "call"},
    "own": {"pool": "str", "slots": "idset", "src": "owner?", "dst": "owner?"},
    "row": {"row": "id", "start": "id", "slots": "ids"},
    "join": {"pool": "str", "holder": "holder", "blocks": "ids"},
    "leave": {"pool": "str", "holder": "holder", "blocks": "ids"},
    "count": {"pool": "str", "counts": "counts"},
    "queue": {"pool": "str", "joined": "idset", "left": "idset"},
}
_OPTIONAL: dict[str, dict[str, str]] = {
    "lock": {"coverage": "coverage", "lock_delta": "delta", "sizes": "sizes"},
    "unlock": {"lock_delta": "delta", "sizes": "sizes"},
    "mamba_cow": {"evicted": "evicted", "lock_delta": "delta", "sizes": "sizes"},
    "match_prefix": {"sizes": "sizes"},
    "insert": {"sizes": "sizes", "dups_freed": "ids"},
    "evict": {"sizes": "sizes"},
    "lru": {"cached": "ids"},
    "call": {
        "req": "id",
        "session": "id",
        "tokens": "tokens",
        "n": "id",
        "component": "comp",
        "admitted": "bool",
        "prefix_len": "id",
        "handles_before": "idset",
        "handles_after": "idset",
        "committed_len": "id",
        "ended": "ended",
        "ok": "bool",
        "leaked": "leaked",
        "error": "str",
    },
}
_ALLOWED = {op: frozenset({"step", "op", *fields, *_OPTIONAL.get(op, {})}) for op, fields in _FIELDS.items()}
_SETS = frozenset({"idset", "coverage", "delta", "evicted", "links", "leaked", "counts", "ended"})
OPS = tuple(_FIELDS)
SHARED_OPS = ("join", "leave", "count", "queue")
"""The events of a system trace's shared pools (header field ``shared``)."""
SYSTEM_OPS = ("call", "own", "row", *SHARED_OPS)
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
ENDS = ("finish", "retract", "abort")
"""The calls that end a request's run (a call's ``ended`` field: the requests it ended, by how)."""
OWNER_RE = re.compile(r"(req|session):(0|[1-9]\d{0,18})|node:(0|[1-9]\d{0,18})/(full|swa|mamba)")
HOLDER_RE = re.compile(r"(req|session):(0|[1-9]\d{0,18})(?:/(full|swa|mamba))?|node:(0|[1-9]\d{0,18})/(full|swa|mamba)")
"""A holder of a shared block: an owner, where a request or session may name its kv-cache group (``req:3/swa``)."""
COMPONENTS = ("full", "swa", "mamba")
HEADER_FIELDS = (
    "kvledger_trace",
    "config",
    "adapter",
    "version",
    "capabilities",
    "faults",
    "pools",
    "ledgers",
    "shared",
)
"""Every field a header may have (any other is malformed)."""
_KIND_TEXT = {
    "id": f"an integer in [0, {MAX_INT}]",
    "id?": f"an integer in [0, {MAX_INT}] or null",
    "int": "an int64 integer",
    "ids": f"a list of integers in [0, {MAX_INT}]",
    "ids?": f"a list of integers in [0, {MAX_INT}] or null",
    "idset": f"a list of distinct integers in [0, {MAX_INT}]",
    "key": f"a list of token ids in [0, {MAX_TOKEN}]",
    "tokens": f"a list of token ids in [0, {MAX_TOKEN}]",
    "str": "a string",
    "comp": "one of 'full', 'swa', 'mamba'",
    "coverage": "a list of distinct [key, component] pairs",
    "delta": "a list of [key, component, integer] triples, one per (key, component)",
    "evicted": "an object {full, swa, mamba} of lists of distinct keys",
    "links": "a list of [node, prev, next] triples (node ids >= 0 distinct; prev/next >= -1 or null)",
    "bool": "true or false",
    "call": "one of " + ", ".join(CALLS),
    "owner?": "an owner ('req:3', 'session:1', 'node:5/full') or null",
    "holder": "a holder ('req:3', 'req:3/swa', 'session:1', 'node:5/full')",
    "counts": "a list of [block, count] pairs (block ids >= 0 distinct; counts int64)",
    "leaked": f"an object {{pool: [distinct slots in [0, {MAX_INT}]]}}",
    "ended": f"an object {{finish, retract, abort: [distinct request ids in [0, {MAX_INT}]]}}",
    "sizes": "an object {component: [evictable, protected]} of integers >= 0",
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


def _is_id(x: object) -> bool:
    return type(x) is int and 0 <= x <= MAX_INT


def _is_int(x: object) -> bool:
    return type(x) is int and -MAX_INT - 1 <= x <= MAX_INT


def _is_ids(x: object) -> bool:
    return type(x) is list and all(type(v) is int and 0 <= v <= MAX_INT for v in x)


def _is_key(x: object) -> bool:
    return type(x) is list and all(type(v) is int and 0 <= v <= MAX_TOKEN for v in x)


def _is_link(x: object) -> bool:
    return x is None or (type(x) is int and -1 <= x <= MAX_INT)


def _is_site(x: object, n: int) -> bool:
    return (
        type(x) is list
        and len(x) == n
        and _is_key(x[0])
        and type(x[1]) is str
        and x[1] in COMPONENTS
        and (n == 2 or _is_int(x[2]))
    )


def _valid(kind: str, x: object) -> bool:
    if kind == "id":
        return _is_id(x)
    if kind == "id?":
        return x is None or _is_id(x)
    if kind == "int":
        return _is_int(x)
    if kind in ("ids", "idset"):
        return _is_ids(x)
    if kind == "ids?":
        return x is None or _is_ids(x)
    if kind in ("key", "tokens"):
        return _is_key(x)
    if kind == "str":
        return type(x) is str
    if kind == "comp":
        return type(x) is str and x in COMPONENTS
    if kind == "coverage":
        return type(x) is list and all(_is_site(v, 2) for v in x)
    if kind == "delta":
        return type(x) is list and all(_is_site(v, 3) for v in x)
    if kind == "evicted":
        return (
            type(x) is dict
            and set(x) <= set(COMPONENTS)
            and all(type(v) is list and all(_is_key(k) for k in v) for v in x.values())
        )
    if kind == "bool":
        return type(x) is bool
    if kind == "call":
        return type(x) is str and x in CALLS
    if kind == "owner?":
        return x is None or (type(x) is str and OWNER_RE.fullmatch(x) is not None)
    if kind == "holder":
        return type(x) is str and HOLDER_RE.fullmatch(x) is not None
    if kind == "counts":
        return type(x) is list and all(type(v) is list and len(v) == 2 and _is_id(v[0]) and _is_int(v[1]) for v in x)
    if kind == "leaked":
        return type(x) is dict and all(_is_ids(v) for v in x.values())
    if kind == "ended":
        return type(x) is dict and set(x) <= set(ENDS) and all(_is_ids(v) for v in x.values())
    if kind == "sizes":
        return type(x) is dict and set(x) <= set(COMPONENTS) and all(_is_ids(v) and len(v) == 2 for v in x.values())
    if kind == "links":
        return type(x) is list and all(
            type(v) is list and len(v) == 3 and _is_id(v[0]) and _is_link(v[1]) and _is_link(v[2]) for v in x
        )
    raise AssertionError(kind)


def _repeated(kind: str, x: Any) -> object | None:
    """The first item a set-valued field (``idset``, ``coverage``, ``delta``, ``evicted``, ``links``,
    ``leaked``) names twice, or ``None``: a set written as a list must not repeat (nothing is merged)."""
    if kind == "idset":
        return first_repeat(x)
    if kind in ("coverage", "delta"):
        return first_repeat((tuple(v[0]), v[1]) for v in x)
    if kind in ("links", "counts"):
        return first_repeat(v[0] for v in x)
    if kind == "evicted":
        return next((r for v in x.values() if (r := first_repeat(tuple(k) for k in v)) is not None), None)
    if kind == "leaked":
        return next((r for v in x.values() if (r := first_repeat(v)) is not None), None)
    if kind == "ended":
        return first_repeat(r for v in x.values() for r in v)
    return None


def first_repeat(items: Iterable[Hashable]) -> Hashable | None:
    """The first item of ``items`` seen before (``None`` when all are distinct)."""
    seen: set[Hashable] = set()
    for x in items:
        if x in seen:
            return x
        seen.add(x)
    return None


def _short(x: object) -> str:
    try:
        text = json.dumps(x) if not isinstance(x, str) else repr(x)
    except (RecursionError, ValueError):
        return "(a value nested too deep to show)"
    return text if len(text) <= 60 else text[:57] + "..."


def _unknown(line: int, where: str, name: str, known: Iterable[str]) -> TraceFormatError:
    names = sorted(known)
    close = difflib.get_close_matches(name, names, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return TraceFormatError(line, f"fields of {where} among {', '.join(names)}", f"unknown field {name!r}{hint}")


def validate_event(obj: object, line: int, step: int) -> Event:
    """``obj`` as an event of step ``step`` at ``line``, or :class:`TraceFormatError` naming what is wrong.

    Strict: every required field present, no unknown field, every value of its
    kind and range, no repeat in a set-valued field.
    """
    if type(obj) is not dict:
        raise TraceFormatError(line, "a JSON object (one event)", _short(obj))
    op = obj.get("op")
    if type(op) is not str or op not in _FIELDS:
        raise TraceFormatError(line, f"'op' one of {', '.join(OPS)}", _short(op) if "op" in obj else "no 'op'")
    if not _is_int(obj.get("step")) or obj["step"] != step:
        raise TraceFormatError(line, f"'step' {step}", _short(obj.get("step")) if "step" in obj else "no 'step'")
    required, optional = _FIELDS[op], _OPTIONAL.get(op, {})
    unknown = obj.keys() - _ALLOWED[op]
    if unknown:
        raise _unknown(line, op, min(unknown), _ALLOWED[op])
    for fields, needed in ((required, True), (optional, False)):
        for name, kind in fields.items():
            if name not in obj:
                if needed:
                    raise TraceFormatError(line, f"field {name!r} ({_KIND_TEXT[kind]}) in {op}", "nothing")
                continue
            if not _valid(kind, obj[name]):
                raise TraceFormatError(line, f"field {name!r} of {op} to be {_KIND_TEXT[kind]}", _short(obj[name]))
            again = _repeated(kind, obj[name]) if kind in _SETS else None
            if again is not None:
                raise TraceFormatError(line, f"field {name!r} of {op} to name each item once", f"{again} twice")
    return obj


_CONFIG_LIMITS = {"page_size": MAX_PAGE, "kv_tokens": MAX_POOL, "swa_tokens": MAX_POOL, "mamba_slots": MAX_POOL}


def config_from_json(obj: object, line: int = 1) -> CacheConfig:
    """The :class:`CacheConfig` a header's ``config`` names (unknown, mistyped or out-of-range fields are a
    format error: sizes and ``window`` in ``[1, limit]``, ``window`` may be null, ``mamba`` a boolean)."""
    if type(obj) is not dict:
        raise TraceFormatError(line, "'config' an object of CacheConfig fields", _short(obj))
    names = {f.name for f in dataclasses.fields(CacheConfig)}
    for k, v in obj.items():
        if k not in names:
            raise _unknown(line, "the header's config", k, names)
        if k == "mamba":
            ok, want = type(v) is bool, "true or false"
        elif k == "window":
            ok, want = v is None or (type(v) is int and 1 <= v <= MAX_POOL), f"null or an integer in [1, {MAX_POOL}]"
        else:
            limit = _CONFIG_LIMITS[k]
            ok, want = type(v) is int and 1 <= v <= limit, f"an integer in [1, {limit}]"
        if not ok:
            raise TraceFormatError(line, f"config field {k!r} to be {want}", _short(v))
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
    shared: dict[str, dict[int, int]] | None = None  # a system trace's shared pools: pool -> {sentinel: its count}

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
        if self.shared is not None:
            out["shared"] = {k: [[b, c] for b, c in sorted(v.items())] for k, v in self.shared.items()}
        return out


def _is_range(v: object) -> bool:
    """``[base, capacity]`` of a pool: integers, ``0 <= base``, ``1 <= capacity``, ``base + capacity <= MAX_POOL``."""
    return type(v) is list and len(v) == 2 and _is_id(v[0]) and _is_id(v[1]) and v[1] >= 1 and v[0] + v[1] <= MAX_POOL


def _strings(line: int, name: str, value: object, known: Iterable[str]) -> tuple[str, ...]:
    """A header list of names, each once and each one of ``known`` (a misspelt name would claim, or hide, data)."""
    if type(value) is not list or not all(type(c) is str for c in value):
        raise TraceFormatError(line, f"header {name!r} a list of strings", _short(value))
    unknown = next((c for c in value if c not in known), None)
    if unknown is not None:
        raise _unknown(line, f"the header's {name!r}", unknown, known)
    again = first_repeat(value)
    if again is not None:
        raise TraceFormatError(line, f"header {name!r} to name each item once", f"{again!r} twice")
    return tuple(value)


def _ranges(line: int, name: str, value: object, allowed: tuple[str, ...] | None) -> dict[str, tuple[int, int]]:
    if type(value) is not dict:
        raise TraceFormatError(line, f"header {name!r} an object {{pool: [base, capacity]}}", _short(value))
    for k, v in value.items():
        if allowed is not None and k not in allowed:
            raise TraceFormatError(line, f"header {name!r} pools among {', '.join(allowed)}", repr(k))
        if not _is_range(v):
            raise TraceFormatError(
                line,
                f"header {name!r}: pool {k!r} as [base, capacity], integers with base >= 0, capacity >= 1 and "
                f"base + capacity <= {MAX_POOL}",
                _short(v),
            )
    return {k: (v[0], v[1]) for k, v in value.items()}


def _shared(line: int, value: object, pools: dict[str, tuple[int, int]] | None) -> dict[str, dict[int, int]]:
    """The header's ``shared``: ``{pool: [[sentinel, count], ...]}``, each pool one of ``pools``, each sentinel once
    and in its pool's range."""
    if pools is None:
        raise TraceFormatError(line, "'shared' only in a system trace header (with 'pools')")
    if type(value) is not dict:
        raise TraceFormatError(line, "header 'shared' an object {pool: [[sentinel, count], ...]}", _short(value))
    out: dict[str, dict[int, int]] = {}
    for name, sentinels in value.items():
        if name not in pools:
            raise TraceFormatError(
                line, f"header 'shared' pools among those of 'pools' ({', '.join(pools)})", repr(name)
            )
        if not _valid("counts", sentinels):
            raise TraceFormatError(
                line, f"header 'shared': pool {name!r} as {_KIND_TEXT['counts']} (sentinels)", _short(sentinels)
            )
        again = _repeated("counts", sentinels)
        if again is not None:
            raise TraceFormatError(line, f"header 'shared': pool {name!r} to name each sentinel once", f"{again} twice")
        base, capacity = pools[name]
        outside = [b for b, _ in sentinels if not base <= b < base + capacity]
        if outside:
            raise TraceFormatError(
                line, f"header 'shared': sentinels of pool {name!r} in [{base}, {base + capacity})", f"{outside[0]}"
            )
        out[name] = {b: c for b, c in sentinels}
    return out


def parse_header(obj: object) -> Header:
    """The header on line 1, or :class:`TraceFormatError` (strict: unknown fields, wrong types, out of range)."""
    if type(obj) is not dict or "kvledger_trace" not in obj:
        raise TraceFormatError(1, 'a header {"kvledger_trace": 1, "config": ..., "adapter": ..., "version": ...}')
    version = obj["kvledger_trace"]
    if type(version) is not int or version != TRACE_VERSION:
        raise TraceFormatError(1, f"'kvledger_trace' schema version {TRACE_VERSION} (an integer)", _short(version))
    for name in obj:
        if name not in HEADER_FIELDS:
            raise _unknown(1, "the header", name, HEADER_FIELDS)
    for name in ("config", "adapter", "version"):
        if name not in obj:
            raise TraceFormatError(1, f"header field {name!r}", "nothing")
    for name in ("adapter", "version"):
        if type(obj[name]) is not str:
            raise TraceFormatError(1, f"header {name!r} a string", _short(obj[name]))
    caps = _strings(1, "capabilities", obj["capabilities"], KNOWN_CAPABILITIES) if "capabilities" in obj else None
    faults = _strings(1, "faults", obj.get("faults", []), FAULT_NAMES)
    pools = _ranges(1, "pools", obj["pools"], None) if "pools" in obj else None
    if pools is not None and "kv" not in pools:
        raise TraceFormatError(1, "header 'pools' with a 'kv' pool", _short(sorted(pools)))
    ledgers = _ranges(1, "ledgers", obj["ledgers"], ("kv", "mamba")) if "ledgers" in obj else None
    if pools is not None and ledgers is not None:
        raise TraceFormatError(1, "'pools' (a system trace) or 'ledgers' (a cache trace), not both")
    shared = _shared(1, obj["shared"], pools) if "shared" in obj else None
    return Header(
        config_from_json(obj["config"]),
        obj["adapter"],
        obj["version"],
        frozenset(caps) if caps is not None else None,
        faults,
        pools,
        ledgers,
        shared,
    )


class _Malformed(Exception):
    """Raised by the JSON hooks below (caught in :func:`_loads`, never escapes)."""

    def __init__(self, expected: str, got: str) -> None:
        self.expected, self.got = expected, got


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        again = first_repeat(k for k, _ in pairs)
        raise _Malformed("each field of an object once", f"{again!r} twice")
    return out


def _constant(name: str) -> Any:
    raise _Malformed("JSON numbers (no NaN or Infinity)", name)


def _bounded_int(text: str) -> int:
    if len(text) > 20:  # NOTE: before int() runs: a long digit string costs quadratic time to convert
        raise _Malformed("integers in int64 (at most 19 digits)", f"{len(text.lstrip('-'))} digits")
    return int(text)


_LONG_DIGITS = re.compile(r"\d{20}")
_DECODER = json.JSONDecoder(object_pairs_hook=_object, parse_constant=_constant)
_DECODER_BOUNDED = json.JSONDecoder(object_pairs_hook=_object, parse_constant=_constant, parse_int=_bounded_int)


def _loads(text: str, line: int, last: bool) -> object:
    """One JSON line, or :class:`TraceFormatError`: bad JSON, a key twice in one object, NaN/Infinity, an
    integer of more than 19 digits, or nesting deeper than the interpreter's recursion limit."""
    try:
        return (_DECODER if _LONG_DIGITS.search(text) is None else _DECODER_BOUNDED).decode(text)
    except _Malformed as err:
        raise TraceFormatError(line, err.expected, err.got) from None
    except RecursionError:
        raise TraceFormatError(line, f"JSON nested at most {MAX_DEPTH} deep", "deeper") from None
    except json.JSONDecodeError as err:
        if last:
            raise TraceFormatError(line, "a complete JSON line (the last line is truncated)", _short(text)) from None
        raise TraceFormatError(line, f"valid JSON ({err.msg} at column {err.colno})", _short(text)) from None
    except ValueError as err:  # e.g. a number json cannot convert
        raise TraceFormatError(line, "valid JSON numbers", str(err)[:60]) from None


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
