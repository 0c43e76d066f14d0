"""Reproducible draws (``kvledger.contracts.machines.stable``): the derandomised check draws the same examples in
every process, because no strategy a machine draws is labelled by the identity of its elements."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from hypothesis import find, settings
from hypothesis import strategies as st
from hypothesis.internal.conjecture.data import ConjectureData

from kvledger.contracts import bindings
from kvledger.contracts.machines.profiles import register_profiles
from kvledger.contracts.machines.runner import run_machine
from kvledger.contracts.machines.stable import just, sampled_from
from kvledger.contracts.machines.suites import SUITES


def test_a_stable_strategy_is_labelled_by_its_size_not_by_what_it_holds() -> None:
    a, b = torch.tensor([1]), torch.tensor([1])
    # NOTE: the premise: Hypothesis labels its own by the elements' hashes, which for a tensor is its identity
    assert st.just(a).label != st.just(b).label
    assert st.sampled_from([a, object()]).label != st.sampled_from([b, object()]).label
    assert just(a).label == just(b).label == just(object()).label
    assert sampled_from([a, object()]).label == sampled_from([b, "x"]).label
    assert sampled_from([a, b]).label != sampled_from([a, b, a]).label  # NOTE: the size still tells them apart


def test_stable_strategies_draw_and_shrink_as_hypothesis_own_do() -> None:
    xs = [object(), object(), object()]
    assert find(sampled_from(xs), lambda x: True) is xs[0], "a sample must shrink to the first element"
    assert find(sampled_from(xs), lambda x: x is xs[2]) is xs[2], "every element must be drawn"
    assert find(just(xs[1]), lambda x: True) is xs[1], "just draws the value itself, not a copy"
    assert find(sampled_from(iter(xs[:1])), lambda x: True) is xs[0], "any iterable, drawn in its order"
    assert sampled_from([]).is_empty, "nothing to sample: an empty strategy, as Hypothesis' own"


def _identity_hashed(x: object) -> bool:
    """``x`` hashes by identity (``object``'s hash, ``id >> 4``, or ``id`` itself: a tensor) and can die: ``None``
    and classes live as long as the process, so their labels never pass to another object."""
    if x is None or isinstance(x, type):
        return False
    try:
        h = hash(x)
    except TypeError:
        return False  # NOTE: unhashable: Hypothesis leaves it out of the label
    return h in (object.__hash__(x), id(x))


def _samples(strategy: Any) -> Iterator[Any]:
    """The elements of ``strategy`` where it is a ``sampled_from`` (or a ``just``), else nothing."""
    strategy = getattr(strategy, "wrapped_strategy", strategy)
    elements = getattr(strategy, "elements", None)
    if elements is not None and not isinstance(elements, range):
        # NOTE: a strategy among them (``one_of`` samples its branches) is labelled by its own label
        yield from (x for x in elements if not isinstance(x, st.SearchStrategy))


@pytest.mark.parametrize("suite", sorted(SUITES))
def test_no_strategy_a_machine_draws_is_labelled_by_identity(suite: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every strategy drawn in a few examples of each model of ``suite`` (rule arguments, ``data.draw`` in rules,
    and every strategy inside them): none samples an object that hashes by identity. Such a label changes with the
    heap (a freed tensor's address given to the next one makes two labels one), and with it Hypothesis' mutations,
    so the same seed draws other examples in another process."""
    seen: list[str] = []
    draw = ConjectureData.draw

    def recording(self: ConjectureData, strategy: Any, *args: Any, **kwargs: Any) -> Any:
        for x in _samples(strategy):
            if _identity_hashed(x):
                seen.append(f"{type(x).__name__} in {strategy!r:.120}")
        return draw(self, strategy, *args, **kwargs)

    monkeypatch.setattr(ConjectureData, "draw", recording)
    register_profiles()
    bindings.install("on")
    try:
        for model, make in SUITES[suite].models.items():
            run_machine(suite, model, make(), [], settings(settings.get_profile("check"), max_examples=4), None)
    finally:
        bindings.uninstall()
    assert not seen, f"{len(seen)} draws labelled by identity, e.g. {sorted(set(seen))[:5]}"


DIGEST = """
import hashlib, sys
from hypothesis import settings
from hypothesis.internal.conjecture import engine
from kvledger.contracts import bindings
from kvledger.contracts.machines.profiles import register_profiles
from kvledger.contracts.machines.runner import run_machine
from kvledger.contracts.machines.suites import SUITES

h = hashlib.sha256()
test_function = engine.ConjectureRunner.test_function

def recording(self, data):
    try:
        return test_function(self, data)
    finally:
        h.update(repr((data.status, list(data.choices))).encode())

engine.ConjectureRunner.test_function = recording
register_profiles()
bindings.install("on")
suite, model = sys.argv[1], sys.argv[2]
r = run_machine(suite, model, SUITES[suite].models[model](), [], settings.get_profile("check"), None)
print(r.examples, h.hexdigest())
"""


def test_the_default_check_draws_the_same_examples_in_every_process() -> None:
    """The check's draws of one model (the default run: ``check`` profile, derandomised), in two processes with
    other hash seeds (and other heaps): every example's choices and outcome alike. Before ``stable``, one run in
    two or three of this model drew other examples from about the 75th on."""
    out = []
    for hash_seed in ("0", "1"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        proc = subprocess.run(
            [sys.executable, "-c", DIGEST, "pools", "paged"], env=env, capture_output=True, text=True, check=True
        )
        out.append(proc.stdout.strip().splitlines()[-1])
    assert out[0] == out[1], f"two processes drew other examples: {out}"
