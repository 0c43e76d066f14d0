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

:func:`sampled_from` and :func:`just` draw exactly the choices Hypothesis' own
do (an index; nothing for one element), shrink the same way (towards the first
element), and are labelled by the number of elements only. Every machine draws
through them; ``tests/contracts/test_stable.py`` runs each machine twice in one
process with the heap moved in between and compares every drawn label.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar

from hypothesis import strategies as st

__all__ = ["just", "sampled_from"]

T = TypeVar("T")


def sampled_from(elements: Iterable[T]) -> st.SearchStrategy[T]:
    """``st.sampled_from(elements)`` labelled by ``len(elements)``: it draws an index into a ``range`` (whose hash
    is its bounds) and maps it to the element. Empty: ``st.nothing()``, as Hypothesis does."""
    xs = tuple(elements)
    if not xs:
        return st.nothing()
    return st.sampled_from(range(len(xs))).map(xs.__getitem__)


def just(value: T) -> st.SearchStrategy[T]:
    """``st.just(value)`` with a label of its own kind, not ``hash(value)``'s; draws nothing."""
    return st.just(0).map(lambda _: value)
