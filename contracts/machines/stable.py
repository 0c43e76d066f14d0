"""Strategies whose Hypothesis labels do not depend on the objects they draw.

Hypothesis labels a ``sampled_from`` (and a ``just``, which is one) by the
``hash`` of its elements, and most objects a machine draws hash by identity:
tensors, tree nodes, list nodes, junk objects. A label is more than a name: in
its generation phase Hypothesis mutates an example by copying one span of its
choices over another span *of the same label*. When a freed tensor's address is
reused by the next one, two spans that had two labels share one, and the
example Hypothesis draws next depends on where the allocator put things. So the
derandomised check was not reproducible: the same checker on the same code drew
other examples in another process (a mutant of ``Sessions.close`` was killed in
one run of three, issue 19's nineteenth round).

:func:`sampled_from` and :func:`just` are Hypothesis' own, labelled by the
number of elements only: the same choices, shrinking and printed programs.
Every machine draws through them; ``tests/contracts/test_stable.py`` checks that no machine draws a
strategy labelled by identity.

Hypothesis also draws, now and then, a constant found in the source of the
"local" modules the process has loaded (not the standard library's, not
site-packages'). Which those are depends on the process: the tests a pytest
worker collected before, an editable install of kvledger (local) or a wheel
(in site-packages), the adapter a user's module imports. :func:`fixed_constants`
(every machine run is inside it) gives Hypothesis the constants of kvledger's
spec and implementation, whatever else is loaded.
"""

from __future__ import annotations

import hashlib
import importlib
import pkgutil
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from functools import lru_cache
from typing import Any, TypeVar

from hypothesis import strategies as st

__all__ = ["elements_of", "fixed_constants", "just", "sampled_from"]

OWN_PACKAGES = ("kvledger.spec", "kvledger.impl")
"""The packages whose source constants Hypothesis draws from in a machine run."""

T = TypeVar("T")


_ELEMENTS = "_kvledger_elements"
"""Where a strategy of :func:`sampled_from` keeps its elements (read by :func:`elements_of`)."""


def sampled_from(elements: Iterable[T]) -> st.SearchStrategy[T]:
    """``st.sampled_from(elements)`` labelled by the number of elements (see ``_labelled``). Empty:
    ``st.nothing()``, as Hypothesis does."""
    xs = tuple(elements)
    if not xs:
        return st.nothing()
    strategy = _labelled(st.sampled_from(xs), len(xs))
    setattr(strategy, _ELEMENTS, xs)
    return strategy


def elements_of(strategy: st.SearchStrategy[Any]) -> tuple[object, ...] | None:
    """Every value ``strategy`` draws, when it is a :func:`sampled_from` or a union (``|``) of them; else ``None``.

    NOTE: a union's parts are read from Hypothesis' ``original_strategies``: where it is gone, a union answers
    ``None`` (``tests/contracts/test_stable.py`` then fails)."""
    own = getattr(strategy, _ELEMENTS, None)
    if own is not None:
        return tuple(own)
    parts = getattr(strategy, "original_strategies", None)
    if not parts:
        return None
    out: list[object] = []
    for part in parts:
        xs = elements_of(part)
        if xs is None:
            return None
        out.extend(xs)
    return tuple(out)


def just(value: T) -> st.SearchStrategy[T]:
    """``st.just(value)`` labelled as every ``just`` is, not by ``hash(value)``."""
    strategy = _labelled(st.just(value), 1)
    setattr(strategy, _ELEMENTS, (value,))
    return strategy


_LABEL = "_SearchStrategy__label"
"""Where a Hypothesis strategy keeps its label once computed (``SearchStrategy.label`` reads it first)."""


def _labelled(strategy: st.SearchStrategy[T], n: int) -> st.SearchStrategy[T]:
    """``strategy`` (a sample of ``n`` elements) with its label set from ``n`` alone; drawn, shrunk and printed
    as Hypothesis' own (a drawn element prints as itself).

    NOTE: the label's slot is an internal of Hypothesis, looked up, not assumed: where it is gone, the strategy
    keeps Hypothesis' label (``tests/contracts/test_stable.py`` then fails)."""
    if hasattr(strategy, _LABEL):
        digest = hashlib.sha256(f"kvledger.stable sample of {n}".encode()).digest()
        setattr(strategy, _LABEL, int.from_bytes(digest[:8], "big"))
    return strategy


@lru_cache(maxsize=1)
def _own_constants() -> Any:
    """The constants of every module of ``OWN_PACKAGES``, as Hypothesis collects a local module's (sorted sets:
    its draws from them do not depend on the hash seed)."""
    from hypothesis.internal.constants_ast import Constants, constants_from_module
    from hypothesis.internal.floats import float_to_int
    from sortedcontainers import SortedSet  # type: ignore[import-untyped]

    out = Constants(integers=SortedSet(), floats=SortedSet(key=float_to_int), bytes=SortedSet(), strings=SortedSet())
    for package in OWN_PACKAGES:
        root = importlib.import_module(package)
        names = [package, *sorted(m.name for m in pkgutil.walk_packages(root.__path__, f"{package}."))]
        for name in names:
            out |= constants_from_module(importlib.import_module(name))
    return out


@contextmanager
def fixed_constants() -> Iterator[bool]:
    """Within it, Hypothesis' "local constants" are kvledger's own (:data:`OWN_PACKAGES`); yields whether it could
    (``False``: this Hypothesis collects them otherwise; nothing changed).

    NOTE: ``providers._get_local_constants`` and ``CONSTANTS_CACHE`` are internals of Hypothesis, looked up, not
    assumed; ``tests/contracts/test_stable.py`` fails if they stop working."""
    try:
        from hypothesis.internal.conjecture import providers

        constants = _own_constants()
    except (ImportError, AttributeError, TypeError):
        yield False
        return
    collect = getattr(providers, "_get_local_constants", None)
    cache = getattr(providers, "CONSTANTS_CACHE", None)
    if collect is None or cache is None:
        yield False
        return
    providers._get_local_constants = lambda: constants
    cache.cache.clear()  # NOTE: it holds, per draw's constraints, the constants of the last set collected
    try:
        yield True
    finally:
        providers._get_local_constants = collect
        cache.cache.clear()
