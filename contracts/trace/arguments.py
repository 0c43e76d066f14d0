"""Argument checks of the trace library's entry points (recorders, replay): misuse is a typed ``ArgumentError``.

A bad *trace* is not misuse: a replay reports it (exit 2, with the line). A
bad *call* (a count that is not an int, a sink that cannot be written, an
adapter that is not one, a fault no header may name) raises
:class:`~kvledger.spec.errors.ArgumentError` naming the call and the argument
before anything is written.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from kvledger.contracts.trace.format import FAULT_NAMES
from kvledger.spec.errors import ArgumentError


def _what(value: object) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


def check_count(op: str, name: str, value: object, lo: int = 0) -> int:
    """``value`` as an int >= ``lo`` (not a bool, a float, ``None``)."""
    if type(value) is not int or value < lo:
        raise ArgumentError(op, name, f"must be an int >= {lo}, got {_what(value)}")
    return value


def check_faults(op: str, faults: object) -> tuple[str, ...]:
    """``faults`` as a tuple of fault names (each one of ``FAULT_NAMES``, once)."""
    if isinstance(faults, str) or not isinstance(faults, Iterable):
        raise ArgumentError(op, "faults", f"must be a tuple of fault names, got {_what(faults)}")
    names = tuple(faults)
    bad = next((f for f in names if f not in FAULT_NAMES), None)
    if bad is not None:
        raise ArgumentError(op, "faults", f"names an unknown fault {bad!r}; expected among {', '.join(FAULT_NAMES)}")
    if len(set(names)) != len(names):
        raise ArgumentError(op, "faults", f"names a fault twice: {names}")
    return names


def check_sink(op: str, out: object) -> None:
    """``out`` is a path (``str``/``os.PathLike``) or a text stream to write the trace to."""
    if isinstance(out, str | os.PathLike):
        return
    if not callable(getattr(out, "write", None)) or isinstance(out, bytes | bytearray):
        raise ArgumentError(op, "out", f"must be a path or a text stream, got {_what(out)}")


CACHE_CORE = ("name", "version", "config", "capabilities", "snapshot", "match_prefix", "insert")
"""What every cache adapter has (the rest of ``CacheAdapter`` may depend on its capabilities)."""
SYSTEM_CORE = ("name", "version", "config", "capabilities", "snapshot", "add_request", "admit", "extend", "finish")
"""What every system adapter has (the rest of ``SystemAdapter`` may depend on its capabilities)."""


def check_members(op: str, name: str, obj: object, members: tuple[str, ...], kind: str) -> None:
    """``obj`` has every one of ``members`` (what every ``kind`` has), else ``ArgumentError`` naming the missing."""
    missing = [m for m in members if not hasattr(obj, m)]
    if missing:
        raise ArgumentError(op, name, f"is a {type(obj).__name__}, not a {kind} (missing {', '.join(missing)})")
