"""The trace format's JSON Schema (``schema.json`` beside this module), built from :mod:`.format`'s tables.

:func:`build_schema` turns the field tables the validator reads
(``format._FIELDS``, ``format._OPTIONAL``, the header's fields and every
bound) into a JSON Schema (draft 2020-12), so the two cannot drift:
``tests/trace/test_trace_schema.py`` checks that ``schema.json`` is what this
builds, and that the validator rejects every line the schema rejects.
Regenerate the file with ``python -m kvledger.contracts.trace.schema``.

Four rules of the validator go beyond what JSON Schema can say: an event's
``step`` is its number (line - 1); a ``lock_delta`` names each (key,
component) once, ``links`` each node once and ``counts`` each block once
(``uniqueItems`` compares whole items); a pool's ``base + capacity`` is at
most ``MAX_POOL``; a header's ``shared`` names pools of its ``pools`` and
sentinels in their range. The schema's ``description`` says so where they
apply.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from kvledger.contracts.adapters.protocol import CacheConfig
from kvledger.contracts.trace import format as F

SCHEMA_PATH = Path(__file__).with_name("schema.json")

_ID = {"type": "integer", "minimum": 0, "maximum": F.MAX_INT}
_TOKEN = {"type": "integer", "minimum": 0, "maximum": F.MAX_TOKEN}
_KEY = {"type": "array", "items": _TOKEN}
_COMP = {"enum": list(F.COMPONENTS)}
_LINK = {"type": ["integer", "null"], "minimum": -1, "maximum": F.MAX_INT}
_INT = {"type": "integer", "minimum": -F.MAX_INT - 1, "maximum": F.MAX_INT}


def _kind(kind: str) -> dict[str, Any]:
    """The JSON Schema of one field kind of :mod:`.format`."""
    ids = {"type": "array", "items": _ID}
    kinds: dict[str, dict[str, Any]] = {
        "id": _ID,
        "id?": {**_ID, "type": ["integer", "null"]},
        "int": _INT,
        "ids": ids,
        "ids?": {**ids, "type": ["array", "null"]},
        "idset": {**ids, "uniqueItems": True},
        "key": _KEY,
        "tokens": _KEY,
        "str": {"type": "string"},
        "comp": _COMP,
        "call": {"enum": list(F.CALLS)},
        "bool": {"type": "boolean"},
        "owner?": {"type": ["string", "null"], "pattern": "^(" + F.OWNER_RE.pattern + ")$"},
        "holder": {"type": "string", "pattern": "^(" + F.HOLDER_RE.pattern + ")$"},
        "counts": _counts("one pair per block"),
        "coverage": {
            "type": "array",
            "items": {"type": "array", "prefixItems": [_KEY, _COMP], "items": False, "minItems": 2},
            "uniqueItems": True,
        },
        "delta": {
            "type": "array",
            "description": "one triple per (key, component)",
            "items": {
                "type": "array",
                "prefixItems": [_KEY, _COMP, _INT],
                "items": False,
                "minItems": 3,
            },
            "uniqueItems": True,
        },
        "evicted": {
            "type": "object",
            "properties": {c: {"type": "array", "items": _KEY, "uniqueItems": True} for c in F.COMPONENTS},
            "additionalProperties": False,
        },
        "links": {
            "type": "array",
            "description": "one triple per node",
            "items": {"type": "array", "prefixItems": [_ID, _LINK, _LINK], "items": False, "minItems": 3},
            "uniqueItems": True,
        },
        "leaked": {"type": "object", "additionalProperties": {**ids, "uniqueItems": True}},
        "ended": {
            "type": "object",
            "properties": {e: {**ids, "uniqueItems": True} for e in F.ENDS},
            "additionalProperties": False,
        },
        "sizes": {
            "type": "object",
            "propertyNames": _COMP,
            "additionalProperties": {**ids, "minItems": 2, "maxItems": 2},
        },
    }
    return kinds[kind]


def _counts(description: str) -> dict[str, Any]:
    """``[[block, count], ...]``: block ids >= 0, counts int64."""
    pair = {"type": "array", "prefixItems": [_ID, _INT], "items": False, "minItems": 2}
    return {"type": "array", "description": description, "items": pair, "uniqueItems": True}


def _range(names: list[str] | None) -> dict[str, Any]:
    pair = {
        "type": "array",
        "description": f"[base, capacity] with base + capacity <= {F.MAX_POOL}",
        "prefixItems": [
            {"type": "integer", "minimum": 0, "maximum": F.MAX_POOL - 1},
            {"type": "integer", "minimum": 1, "maximum": F.MAX_POOL},
        ],
        "items": False,
        "minItems": 2,
    }
    out: dict[str, Any] = {"type": "object", "additionalProperties": pair}
    if names is not None:
        out["propertyNames"] = {"enum": names}
    return out


def _config() -> dict[str, Any]:
    props: dict[str, Any] = {}
    for f in dataclasses.fields(CacheConfig):
        if f.name == "mamba":
            props[f.name] = {"type": "boolean"}
        elif f.name == "window":
            props[f.name] = {"type": ["integer", "null"], "minimum": 1, "maximum": F.MAX_POOL}
        else:
            props[f.name] = {"type": "integer", "minimum": 1, "maximum": F._CONFIG_LIMITS[f.name]}
    return {"type": "object", "properties": props, "additionalProperties": False}


def build_schema() -> dict[str, Any]:
    """The JSON Schema of one trace line (line 1: ``$defs/header``; every other line: ``$defs/event``)."""
    strings = {"type": "array", "items": {"type": "string"}, "uniqueItems": True}
    header = {
        "type": "object",
        "required": ["kvledger_trace", "config", "adapter", "version"],
        "properties": {
            "kvledger_trace": {"type": "integer", "const": F.TRACE_VERSION},
            "config": _config(),
            "adapter": {"type": "string"},
            "version": {"type": "string"},
            "capabilities": {
                **strings,
                "items": {"enum": sorted(F.KNOWN_CAPABILITIES)},
                "description": "exactly the kinds of data the trace holds",
            },
            "faults": {**strings, "items": {"enum": list(F.FAULT_NAMES)}},
            "pools": {
                **_range(None),
                "required": ["kv"],
                "description": "a system trace: pool name -> [base, capacity]",
            },
            "ledgers": {**_range(["kv", "mamba"]), "description": "a cache trace: where kv/mamba slots lie"},
            "shared": {
                "type": "object",
                "description": "a system trace's shared pools (each one of 'pools') -> [[sentinel, count], ...]",
                "additionalProperties": _counts("each sentinel once, in its pool's range"),
            },
        },
        "additionalProperties": False,
        "not": {"required": ["pools", "ledgers"]},
        "dependentRequired": {"shared": ["pools"]},
    }
    events = []
    for op, fields in F._FIELDS.items():
        optional = F._OPTIONAL.get(op, {})
        props: dict[str, Any] = {
            "step": {"type": "integer", "minimum": 1, "maximum": F.MAX_INT},
            "op": {"const": op},
        }
        props.update({name: _kind(kind) for name, kind in {**fields, **optional}.items()})
        events.append(
            {
                "title": op,
                "type": "object",
                "required": ["step", "op", *fields],
                "properties": props,
                "additionalProperties": False,
            }
        )
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://kvledger/trace/schema.json",
        "title": f"kvledger trace, version {F.TRACE_VERSION} (JSON lines: line 1 is the header, "
        "every further line one event)",
        "$defs": {"header": header, "event": {"oneOf": events}},
        "oneOf": [{"$ref": "#/$defs/header"}, {"$ref": "#/$defs/event"}],
    }


def schema_text() -> str:
    """``schema.json`` as it must read."""
    return json.dumps(build_schema(), indent=2) + "\n"


if __name__ == "__main__":
    sys.stdout.write(schema_text())
