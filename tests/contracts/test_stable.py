"""Reproducible draws (``kvledger.contracts.machines.stable``): the derandomised check draws the same examples in
every process, because no strategy a machine draws is labelled by the identity of its elements."""

from __future__ import annotations

import hashlib
import importlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import find, settings
from hypothesis import strategies as st
from hypothesis.internal.conjecture import engine
from hypothesis.internal.conjecture.data import ConjectureData

from kvledger.contracts import bindings
from kvledger.contracts.machines.profiles import register_profiles
from kvledger.contracts.machines.runner import run_machine
from kvledger.contracts.machines.stable import _own_constants, elements_of, fixed_constants, just, sampled_from
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


def _labelled_by_identity(strategy: Any) -> list[object]:
    """The identity-hashed elements of ``strategy`` where it is a ``sampled_from`` (or a ``just``) whose label is
    the one Hypothesis computes from its elements' hashes (``calc_label``); else nothing."""
    strategy = getattr(strategy, "wrapped_strategy", strategy)
    elements = getattr(strategy, "elements", None)
    if elements is None or isinstance(elements, range) or strategy.label != strategy.calc_label():
        return []
    # NOTE: a strategy among them (``one_of`` samples its branches) is labelled by its own label
    return [x for x in elements if not isinstance(x, st.SearchStrategy) and _identity_hashed(x)]


@pytest.mark.parametrize("suite", sorted(SUITES))
def test_no_strategy_a_machine_draws_is_labelled_by_identity(suite: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every strategy drawn in a few examples of each model of ``suite`` (rule arguments, ``data.draw`` in rules,
    and every strategy inside them): none samples an object that hashes by identity. Such a label changes with the
    heap (a freed tensor's address given to the next one makes two labels one), and with it Hypothesis' mutations,
    so the same seed draws other examples in another process."""
    seen: list[str] = []
    draw = ConjectureData.draw

    def recording(self: ConjectureData, strategy: Any, *args: Any, **kwargs: Any) -> Any:
        for x in _labelled_by_identity(strategy):
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


def _digest(suite: str, model: str) -> str:
    """A digest of every example the default check (``check`` profile, derandomised) draws for ``model``: each
    example's choices and outcome, as Hypothesis' engine saw them."""
    h = hashlib.sha256()
    test_function = engine.ConjectureRunner.test_function

    def recording(self: Any, data: Any) -> Any:
        try:
            return test_function(self, data)
        finally:
            h.update(repr((data.status, list(data.choices))).encode())

    engine.ConjectureRunner.test_function = recording  # type: ignore[method-assign]
    register_profiles()
    bindings.install("on")
    try:
        r = run_machine(suite, model, SUITES[suite].models[model](), [], settings.get_profile("check"), None)
    finally:
        engine.ConjectureRunner.test_function = test_function  # type: ignore[method-assign]
        bindings.uninstall()
    return f"{r.examples} {h.hexdigest()}"


def _digest_elsewhere(suite: str, model: str, hash_seed: str) -> str:
    """:func:`_digest` in a fresh process with ``PYTHONHASHSEED=hash_seed`` (another heap, other string hashes,
    none of this test run's modules loaded)."""
    code = f"import runpy; print(runpy.run_path({__file__!r})['_digest']({suite!r}, {model!r}))"
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return proc.stdout.strip().splitlines()[-1]


def test_the_default_check_draws_the_same_examples_in_every_process() -> None:
    """The check's draws of one model in this process and in a fresh one with a fixed hash seed (another heap,
    other string hashes, other modules loaded; this worker's hash seed is random): every example alike. Before
    ``stable``, about one run in two of this model drew other examples from about the 75th on.

    NOTE: one fresh process, not two (CI time: each is a whole default check of the model, ~27 s)."""
    here = _digest("pools", "paged")
    assert _digest_elsewhere("pools", "paged", "0") == here


@pytest.mark.local_constants  # NOTE: the suite's autouse fixture fixes them for every other test
def test_hypothesis_draws_kvledger_own_constants_in_a_machine_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Within ``fixed_constants`` (every machine run), the constants Hypothesis may draw are those of kvledger's
    spec and implementation, not those of a module the process happened to load (a pytest worker's test modules,
    a user's script and its adapter); outside it, Hypothesis' own collection is back."""
    from hypothesis.internal.conjecture import providers
    from hypothesis.internal.constants_ast import constants_from_module

    import kvledger.impl.memory
    import kvledger.spec.session

    (tmp_path / "kvl_user_module.py").write_text(f"SIZES = {list(range(100, 400, 3))}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    theirs = constants_from_module(importlib.import_module("kvl_user_module"))
    collect = providers._get_local_constants
    assert 103 in theirs and 103 in collect(), "premise: Hypothesis draws a loaded local module's constants"
    with fixed_constants() as fixed:
        assert fixed, "this Hypothesis collects its local constants otherwise: fixed_constants must follow it"
        inside = providers._get_local_constants()
    assert providers._get_local_constants is collect
    assert inside is _own_constants() and 103 not in inside.integers
    for module in (kvledger.impl.memory, kvledger.spec.session):
        mine = constants_from_module(module)
        assert len(mine) and all(x in inside for x in mine), f"{module.__name__}'s constants are not drawn"


def test_a_finite_strategy_names_every_value_it_draws() -> None:
    """``elements_of`` (the catalogue a sweep meets when an argument names none): a sample, a ``just`` and a union
    of them name their values; a strategy drawing from a range does not (it is not a catalogue)."""
    junk = sampled_from([True, 1.5]) | just(None) | sampled_from(["1"])
    assert elements_of(junk) == (True, 1.5, None, "1")
    assert elements_of(st.integers(0, 3)) is None and elements_of(sampled_from([1]) | st.integers()) is None
    drawn = {find(junk, lambda x, v=v: x == v and type(x) is type(v)) for v in (True, 1.5, "1")}
    assert drawn == {True, 1.5, "1"}  # the values are the ones the strategy draws
