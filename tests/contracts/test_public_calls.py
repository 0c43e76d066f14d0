"""The public-call probes of the radix cache and the memory manager (``contracts/machines/calls.py``) and the pool
machine's ownership probe: they hold on the reference and fail, naming the law, on a hand-broken object."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import os
import pkgutil
import time
from array import array
from collections.abc import Callable
from copy import copy, deepcopy
from typing import Any

import hypothesis
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import kvledger.impl
from kvledger.contracts import bindings
from kvledger.contracts.adapters.reference_system import build_manager
from kvledger.contracts.adapters.system import SystemConfig
from kvledger.contracts.machines import calls as C
from kvledger.contracts.machines import stable
from kvledger.contracts.machines.pool import KINDS, Chunk, machine_for
from kvledger.impl import integrity
from kvledger.impl.admission import Budget, admit
from kvledger.impl.allocators import TokenAllocator
from kvledger.impl.arguments import not_ids
from kvledger.impl.lru import SLOT
from kvledger.impl.mamba import MambaAlloc, MambaPool
from kvledger.impl.memory import MemoryManager
from kvledger.impl.owners import encode
from kvledger.impl.radix import RadixCache
from kvledger.impl.req_to_token import ReqToTokenPool
from kvledger.impl.session import Sessions, SessionSlot
from kvledger.impl.tree import MatchResult, RadixTree, TreeNode
from kvledger.spec import domains as D
from kvledger.spec.errors import CacheError, IntegrityError, KVLedgerError, OverAllocation
from kvledger.spec.types import Component, Owner, OwnerKind, request

Maker = Callable[[str, C.Draw], C.Scenario]
CASES = [(kind, make) for kind, makes in sorted(C.SCENARIOS.items()) for make in makes]


def run_probes(
    kind: str, make: Maker, examples: int, sweeps: int = 1, *, seed: int | None = None, first: list[int] | None = None
) -> None:
    """Probe scenarios of ``kind`` (``make``), a few calls and ``sweeps`` sweeps each; the first law broken is
    raised. Derandomised, or drawn from ``seed``; ``first`` (if given) gets the number of the first example that
    broke a law."""
    count = 0

    @settings(
        max_examples=examples,
        derandomize=seed is None,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        report_multiple_bugs=False,
        suppress_health_check=list(HealthCheck),
    )
    @given(st.data())
    def check(data: st.DataObject) -> None:
        nonlocal count
        count += 1
        try:
            scenario = make(kind, data.draw)
            for _ in range(4):
                C.probe(scenario, data.draw)
            for _ in range(sweeps):
                C.sweep(scenario, data.draw)
        except AssertionError:
            if first is not None and not first:
                first.append(count)
            raise

    (check if seed is None else hypothesis.seed(seed)(check))()


MARGIN = os.environ.get("KVLEDGER_DETECTION_MARGIN")
"""A file that ``tests/benchmarks/detection_margin.py`` sets: each detection test (:func:`fails`) then also runs
its planted bug from ``KVLEDGER_DETECTION_SEEDS`` seeds (default 10) at twice its budget, and appends where each
met the bug (a JSON line). A derandomised test meets its bug at one fixed example; a change anywhere in what the
probes draw moves that example, and the margin over seeds says how likely the budget is to still cover it."""


def fails(kind: str, make: Maker, law: str, examples: int = 400) -> str:
    """The probes of ``kind`` break ``law`` within ``examples`` derandomised examples; the message.

    A budget covers one and a half times the largest example at which ten seeds met the bug
    (``tests/benchmarks/detection_margin.py``), not the one example the derandomised run meets it at: a change to
    what the probes draw moves that example (issue 19: two tests failed in CI for it). A budget costs nothing
    where the bug is met early: the run stops at the first failure."""
    at: list[int] = []
    try:
        with pytest.raises(AssertionError) as got:
            run_probes(kind, make, examples, first=at)
    finally:
        if MARGIN:  # NOTE: measured whether or not this budget met the bug
            measure_margin(kind, make, law, examples, at[0] if at else None)
    assert str(got.value).startswith(law), got.value
    return str(got.value)


def measure_margin(kind: str, make: Maker, law: str, examples: int, derandomised: int | None) -> None:
    """Append to :data:`MARGIN`, for the running test, the example at which each seed met ``law`` (``None``: not
    within twice the budget; a law's name: another law broken first)."""
    found: list[int | str | None] = []
    for s in range(int(os.environ.get("KVLEDGER_DETECTION_SEEDS", "10"))):
        at: list[int] = []
        try:
            run_probes(kind, make, 2 * examples, seed=s, first=at)
            found.append(None)
        except AssertionError as e:
            found.append(at[0] if str(e).startswith(law) and at else str(e).split(":")[0])
    test = os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0]
    row = {"test": test, "budget": examples, "derandomised": derandomised, "seeds": found}
    with open(str(MARGIN), "a") as f:
        f.write(json.dumps(row) + "\n")


@pytest.mark.parametrize(("kind", "make"), CASES, ids=[f"{k}-{m.__name__}" for k, m in CASES])
def test_public_calls_obey_the_domain_law_on_the_reference(kind: str, make: Maker) -> None:
    run_probes(kind, make, 120)


def over_scenarios(
    examples: int, each: Callable[[C.Scenario, st.DataObject], None], cases: list[Any] | None = None
) -> None:
    """``each`` of ``examples`` scenarios drawn from every pool kind's (derandomised; ``cases``: only those)."""

    @settings(max_examples=examples, derandomize=True, database=None, deadline=None, phases=[Phase.generate])
    @given(st.data())
    def run(data: st.DataObject) -> None:
        kind, make = data.draw(stable.sampled_from(cases or CASES))
        each(make(kind, data.draw), data)

    run()


def test_every_public_call_is_probed() -> None:
    """Each method of each scenario is drawn and made (a probe that never runs is no probe)."""
    seen: set[str] = set()

    def collect(scenario: C.Scenario, data: st.DataObject) -> None:
        for _ in range(4):
            what = C.probe(scenario, data.draw)
            if "(" in what:  # NOTE: a call made (not a valid one left to the rules, not one with no value here)
                seen.add(what.split("(")[0])

    over_scenarios(300, collect)
    wanted = {"MemoryManager." + m for m in ("alloc_kv", "add_request", "extend", "finish", "abort", "write_kv")}
    wanted |= {"RadixCache." + m for m in ("insert", "verify", "node", "match_prefix", "inc_lock_ref", "evict")}
    assert wanted <= seen, sorted(wanted - seen)


PROBED_AS = {"open_session": "Sessions.open", "close_session": "Sessions.close"}


def test_every_public_method_is_in_a_scenario_or_set_aside_with_a_reason() -> None:
    """Each public method of the memory manager, its sessions and the radix cache is a scenario's method or in
    ``NOT_PROBED`` (with a reason); a name in ``NOT_PROBED`` is a real public method that no scenario has."""
    listed: set[str] = set()

    def collect(scenario: C.Scenario, data: st.DataObject) -> None:
        for m in scenario.methods:
            if m.what in PROBED_AS:
                listed.add(PROBED_AS[m.what])
            elif m.what.startswith("sessions."):
                listed.add("Sessions." + m.what.removeprefix("sessions."))
            else:
                listed.add(f"{scenario.what}.{m.what}")

    for case in CASES:  # NOTE: every kind's scenario, not as many as the draws happen to meet
        over_scenarios(10, collect, [case])
    public = {
        f"{cls.__name__}.{name}"
        for cls in (MemoryManager, Sessions, RadixCache)
        for name, v in inspect.getmembers(cls, inspect.isfunction)
        if not name.startswith("_")
    }
    assert not public - listed - set(C.NOT_PROBED), sorted(public - listed - set(C.NOT_PROBED))
    assert set(C.NOT_PROBED) <= public - listed, sorted(set(C.NOT_PROBED) - (public - listed))
    assert all(len(why) > 20 for why in C.NOT_PROBED.values())


def manager(fail_next: int) -> C.Scenario:
    """A manager with one running request and ``fail_next`` allocation failures pending."""
    mm = build_manager(SystemConfig(kv_tokens=16, rows=3, max_context=12))
    admit(mm, [mm.add_request((1, 2, 3))], Budget(24, 1))
    mm.fail_next = fail_next
    return C.manager_scenario_of(mm, ["request 1 admitted"])


@pytest.mark.parametrize("n", [-1, 1.5, True])
def test_a_refused_alloc_that_spends_an_injected_failure_is_caught(monkeypatch: pytest.MonkeyPatch, n: object) -> None:
    """An alloc_kv that counts an injected failure before it checks its count changes the state it refuses."""
    scenario = manager(1)
    alloc = {m.what: m for m in scenario.methods}["alloc_kv"]
    C.judge(scenario, alloc, {"owner": request(5), "n": n}, inside=False)  # the reference refuses, unchanged
    original = MemoryManager.alloc_kv

    def spends(self: MemoryManager, owner: Any, n: Any) -> torch.Tensor:
        if self.fail_next > 0:
            self.fail_next -= 1
            raise OverAllocation("alloc", "kv", (), "injected")
        return original(self, owner, n)

    monkeypatch.setattr(MemoryManager, "alloc_kv", spends)
    broken = manager(1)
    alloc = {m.what: m for m in broken.methods}["alloc_kv"]
    with pytest.raises(AssertionError, match="rejected call leaves state unchanged: a rejected call, MemoryManager"):
        C.judge(broken, alloc, {"owner": request(5), "n": n}, inside=False)


def test_verify_that_reads_past_the_match_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A verify that reads one token of the key past the match refuses a longer key it must accept."""
    original = RadixCache.verify

    def too_far(self: RadixCache, match: Any, key: Any) -> None:
        if isinstance(key, torch.Tensor) and isinstance(match, MatchResult) and key.numel() > match.length > 0:
            raise IntegrityError("verify: slots and tokens differ")  # NOTE: what comparing key[: length + 1] meets
        original(self, match, key)

    monkeypatch.setattr(RadixCache, "verify", too_far)
    fails("token", C.cache_scenario, "inv_domain_enforced")


def lax_not_ids(t: torch.Tensor) -> str | None:
    """``impl.arguments.not_ids`` that reads a sparse or a meta tensor of integer ids as ids."""
    dt = t.dtype
    if t.dim() != 1 or dt.is_floating_point or dt.is_complex or dt == torch.bool:
        return f"{dt} of {t.dim()} dimensions"
    return None


def test_a_key_check_that_lets_a_sparse_or_meta_tensor_through_is_caught_by_the_sweep(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A key of int64 ids in a sparse or a meta tensor has the right dtype and shape and no readable values: a
    check that lets one through crashes later, untyped. A probe draws that kind of junk now and then; the sweep
    meets every kind of junk of the argument it draws, and so catches it in a few examples."""
    import kvledger.impl.tree as tree

    run_probes("token", C.cache_scenario, 30, sweeps=3)  # NOTE: the reference holds
    monkeypatch.setattr(tree, "not_ids", lax_not_ids)
    with pytest.raises(AssertionError) as got:
        run_probes("token", C.cache_scenario, 30, sweeps=3)
    assert str(got.value).startswith("inv_domain_enforced"), got.value
    assert "a meta tensor" in str(got.value) or "a torch.sparse_coo tensor" in str(got.value), got.value


def test_an_insert_that_takes_a_sparse_value_is_caught_by_the_sweep(monkeypatch: pytest.MonkeyPatch) -> None:
    """The insert's value catalogue holds the slots in a sparse and in a meta tensor (int64 ids, no readable
    values), as the keys' does: a value check that lets one through fails untyped later, or caches nothing real."""
    real = RadixTree._as_tokens

    def as_tokens(self: RadixTree, op: str, t: Any) -> Any:
        if isinstance(t, torch.Tensor) and t.layout != torch.strided and t.dtype == torch.int64:
            return t  # BUG: a sparse tensor of the right dtype taken as ids
        return real(self, op, t)

    run_probes("token", C.cache_scenario, 30, sweeps=3)  # NOTE: the reference holds
    monkeypatch.setattr(RadixTree, "_as_tokens", as_tokens)
    with pytest.raises(AssertionError) as got:
        run_probes("token", C.cache_scenario, 30, sweeps=3)
    assert str(got.value).startswith("inv_domain_enforced"), got.value


def test_a_sign_check_that_reads_the_wrong_byte_is_caught_by_the_sweep(monkeypatch: pytest.MonkeyPatch) -> None:
    """The key's catalogue holds ids at the edges of the range (the largest int64, ids whose low byte is 0x80 or
    more) and negatives whose low byte is small (``-2**63``, ``-256``): a sign test that reads each id's low byte
    refuses those valid keys and lets those negatives in."""
    import kvledger.impl.tree as tree

    run_probes("token", C.cache_scenario, 30, sweeps=3)  # NOTE: the reference holds
    monkeypatch.setattr(tree, "_SIGN", 7 - tree._SIGN)  # BUG: the byte order read the wrong way round
    with pytest.raises(AssertionError) as got:
        run_probes("token", C.cache_scenario, 30, sweeps=3)
    assert str(got.value).startswith("inv_domain_enforced"), got.value


def test_a_release_that_takes_a_handle_of_another_id_type_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """``dec_lock_ref``'s catalogue holds each live handle with its id in another type that equals it (a numpy
    int, a float, ``True`` for 1) or as its string: a release that skips the id's type check finds the issued
    handle by that id and releases it."""
    from kvledger.impl.locks import LockTable

    real = LockTable.covered

    def covered(self: LockTable, op: str, handle: Any) -> Any:
        if not isinstance(getattr(handle, "id", None), (int, float, np.integer)):
            return real(self, op, handle)
        cov = self._live.get(handle.id) if handle.table == self.ident else None  # BUG: the id's type unchecked:
        return cov if cov is not None else real(self, op, handle)  # 1.0 or np.int64(1) finds handle 1

    run_probes("token", C.cache_scenario, 40, sweeps=3)  # NOTE: the reference holds
    monkeypatch.setattr(LockTable, "covered", covered)
    with pytest.raises(AssertionError) as got:
        run_probes("token", C.cache_scenario, 40, sweeps=3)
    assert str(got.value).startswith("inv_domain_enforced"), got.value
    assert "dec_lock_ref" in str(got.value), got.value


def uint64_not_ids(t: torch.Tensor) -> str | None:
    """``impl.arguments.not_ids`` whose test of uint64 ids past int64 is off by one: it also refuses a uint64
    tensor holding the id 0."""
    if t.dtype == torch.uint64 and t.dim() == 1 and t.numel() and int(t.view(torch.int64).min()) < 1:
        return "uint64 values past int64"
    return not_ids(t)


def test_a_uint64_bound_off_by_one_is_caught_by_the_sweep(monkeypatch: pytest.MonkeyPatch) -> None:
    """The key's catalogue holds uint64 tensors at both ends of the id range (0 and the largest int64: valid,
    made on a copy of the cache) and one past it (``2**63``: junk). A bound of the uint64 test off by one refuses
    a valid key."""
    import kvledger.impl.tree as tree

    run_probes("token", C.cache_scenario, 30, sweeps=3)  # NOTE: the reference holds
    monkeypatch.setattr(tree, "not_ids", uint64_not_ids)
    with pytest.raises(AssertionError) as got:
        run_probes("token", C.cache_scenario, 30, sweeps=3)
    assert str(got.value).startswith("inv_domain_enforced"), got.value
    assert "uint64" in str(got.value), got.value


@settings(max_examples=5, derandomize=True, database=None, deadline=None, phases=[Phase.generate])
@given(st.data())
def test_the_sweep_makes_each_value_of_the_catalogue_once(data: st.DataObject) -> None:
    """A sweep of ``match_prefix``'s key calls it with every junk key of the catalogue, in turn (each refused,
    typed, and nothing changed: else the sweep raises)."""
    scenario = C.cache_scenario("token", data.draw)
    calls: list[object] = []

    def spy(f: Callable[..., object]) -> Callable[..., object]:
        def call(key: object) -> object:
            calls.append(key)
            return f(key)

        return call

    methods = tuple(C.Method(m.what, spy(m.call), m.args) for m in scenario.methods if m.what == "match_prefix")
    what = C.sweep(C.Scenario(scenario.what, methods, scenario.fingerprint, scenario.story), data.draw)
    edges = (*C.junk_key_values(2), *C.long_junk_keys([1, 2]))
    assert what == f"RadixCache.match_prefix: {len(edges)} junk key"  # NOTE: its one argument with a catalogue

    def shown(x: object) -> str:  # NOTE: a memoryview's repr names its address: show its bytes
        return f"memoryview {bytes(x)!r}" if isinstance(x, memoryview) else C._show(x)

    assert [shown(x) for x in calls] == [shown(x) for x in edges]


@settings(max_examples=20, derandomize=True, database=None, deadline=None, phases=[Phase.generate])
@given(st.data())
def test_a_verify_that_reads_as_many_slots_as_it_likes_is_caught(data: st.DataObject) -> None:
    """Issue 19, new family, seed 5: ``integrity.verify`` without its length check compares one slot with every
    token (a broadcast), or the first slots only. The allocators check lengths before they call it, so only a
    probe of the function itself meets it: the sweep of its slots holds on the reference and fails without."""
    scenario = C.cache_scenario("token", data.draw)
    (method,) = (m for m in scenario.methods if m.what == "integrity.verify")
    C.sweep(C.Scenario(scenario.what, (method,), scenario.fingerprint, scenario.story), data.draw)
    C.probe(C.Scenario(scenario.what, (method,), scenario.fingerprint, scenario.story), data.draw)
    slots_only = {k: a if k == "slots" else dataclasses.replace(a, edges=None) for k, a in method.args.items()}
    swept = C.Method(method.what, method.call, slots_only, reads=True)
    one = C.Scenario(scenario.what, (swept,), scenario.fingerprint, scenario.story)
    C.sweep(one, data.draw)  # NOTE: the reference holds: every junk refused typed, every valid call passes

    def lax(what: str, stored: torch.Tensor, slots: Any, tokens: Any, positions: Any) -> None:
        if isinstance(slots, torch.Tensor) and slots.dim() == 1 and isinstance(tokens, torch.Tensor):
            n = min(slots.numel(), tokens.numel())  # BUG: extra slots (or tokens) are never read
            slots = slots[:n] if slots.numel() > 1 or n == 0 else slots.expand(n)
        integrity.verify(what, stored, slots, tokens, positions)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(C, "verify", lax)
        with pytest.raises(AssertionError, match=r"inv_domain_enforced: .*integrity\.verify"):
            C.sweep(one, data.draw)


def test_an_insert_that_refuses_a_partly_cached_page_with_another_class_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 19, new family, seed 7: without its partial-page check, a paged cache's insert of a page only partly
    its own cached slots is still refused, but by the ownership check (``NotOwner``); the spec gives
    ``SlotConflict``, the class callers catch. The insert's value catalogue holds such a page where the key's
    first page is cached, and the refusal's class is the spec's (``spec.prefix.check_insert``)."""
    from kvledger.spec.errors import NotOwner, SlotConflict

    original = RadixCache.insert

    def other_class(self: RadixCache, key: Any, value: Any, owner: Any, **kw: Any) -> Any:
        try:
            return original(self, key, value, owner, **kw)
        except SlotConflict as err:
            if "only partly" not in str(err):
                raise
            raise NotOwner("insert", "kv", [0], "held by the cache, not by the caller") from None  # BUG: wrong class

    monkeypatch.setattr(RadixCache, "insert", other_class)
    msg = fails("paged", C.cache_scenario, "inv_domain_enforced", examples=600)
    assert "not SlotConflict" in msg, msg


def test_a_walk_to_the_root_without_its_cycle_guard_fails_the_audit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 19, new family, seed 7: ``prefix`` without its revisit guard walks a parent cycle for ever. The cache
    audit plants one and makes every public call that takes a node on it, each bounded to a second: each must
    answer or fail typed at once (the reference raises ``IntegrityError`` for the walks to the root)."""
    kv = TokenAllocator(8)
    cache = RadixCache(kv)
    cache.insert(torch.tensor([1, 2, 3]), kv.alloc(3, request(1)), request(1))
    cache.insert(torch.tensor([1, 2, 4]), kv.alloc(3, request(2)), request(2))
    assert C._planted_cycle(cache) == ""  # the reference holds
    original = RadixTree.prefix

    def unguarded(self: RadixTree, n: TreeNode) -> torch.Tensor:
        x = n
        while x.parent is not None:  # BUG: no revisit guard: a parent cycle is walked for ever
            x = x.parent
        return original(self, n)

    monkeypatch.setattr(RadixTree, "prefix", unguarded)
    got = C._planted_cycle(cache)
    assert got.startswith("prefix of node") and "_Walked" in got, got
    assert cache.prefix(cache.match_prefix(torch.tensor([1, 2, 4])).last_node).tolist() == [1, 2, 4]  # put back


def test_node_that_takes_a_bool_id_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    original = RadixTree.node

    def lax(self: RadixTree, ident: Any) -> Any:
        return original(self, int(ident) if isinstance(ident, bool | float) else ident)

    monkeypatch.setattr(RadixTree, "node", lax)
    msg = fails("token", C.cache_scenario, "inv_domain_enforced")
    assert "RadixCache.node" in msg


def test_insert_that_crashes_on_a_repeated_slot_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """An insert offered one slot for two positions must refuse it typed, not crash (the kvview check_fresh)."""
    original = RadixCache.insert

    def crashes(self: RadixCache, key: Any, value: Any, owner: Any, **kw: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.dim() == 1 and value.unique().numel() < value.numel():
            raise RuntimeError("shape mismatch")
        return original(self, key, value, owner, **kw)

    monkeypatch.setattr(RadixCache, "insert", crashes)
    msg = fails("token", C.cache_scenario, "inv_domain_enforced", 600)
    assert "RadixCache.insert" in msg and "RuntimeError" in msg


def test_a_copy_on_write_without_its_component_check_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 19, new family, seed 8: ``RadixTree._pool`` without its refusal hands a cache without Mamba ``None``
    for a pool; its ``mamba_copy_on_write`` is then refused further on (the match carries no state), by another
    class. The spec's refusal of a call on a component the cache has not is ``ComponentDisabled``: the call is
    probed on caches without Mamba too, with matches of their own."""

    def no_check(self: RadixTree, op: str) -> Any:
        return self.mamba  # BUG: no ComponentDisabled when there is no Mamba pool

    run_probes("token", C.cache_scenario, 200)  # the reference refuses each with ComponentDisabled
    monkeypatch.setattr(RadixTree, "_pool", no_check)
    msg = fails("token", C.cache_scenario, "inv_domain_enforced")
    assert "mamba_copy_on_write" in msg and "not ComponentDisabled" in msg, msg


def test_a_component_refused_with_another_class_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A component the cache has not, refused as a malformed argument (``InvalidArgument``) rather than as a
    disabled component: the spec's class is ``ComponentDisabled``."""
    from kvledger.spec.errors import ComponentDisabled, InvalidArgument

    original = RadixCache.evictable_size

    def other_class(self: RadixCache, comp: Any = Component.FULL) -> int:
        try:
            return original(self, comp)
        except ComponentDisabled:
            raise InvalidArgument("evictable_size", "cache", (), f"component {comp!r}") from None  # BUG: the class

    monkeypatch.setattr(RadixCache, "evictable_size", other_class)
    msg = fails("token", C.cache_scenario, "inv_domain_enforced", examples=500)
    assert "evictable_size" in msg and "not ComponentDisabled" in msg, msg


def test_copy_on_write_that_evicts_before_checking_its_owner_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    original = RadixCache.mamba_copy_on_write

    def evicts_first(self: RadixCache, match: Any, owner: Any) -> int:
        if self.mamba is not None and not self.mamba.available_size():
            self.evict(self.components[-1], 1)
        return original(self, match, owner)

    monkeypatch.setattr(RadixCache, "mamba_copy_on_write", evicts_first)
    msg = fails("mamba", C.cache_scenario, "rejected call leaves state unchanged", 800)
    assert "mamba_copy_on_write" in msg


def test_a_node_lookup_must_not_refuse_a_live_id(monkeypatch: pytest.MonkeyPatch) -> None:
    """A reading call inside its domain that is refused breaks the law too."""

    def refuses(self: RadixTree, ident: Any) -> Any:
        raise CacheError("node: refused")

    monkeypatch.setattr(RadixTree, "node", refuses)
    msg = fails("token", C.cache_scenario, "inv_domain_enforced")
    assert "lies in its domain and was refused" in msg


def test_is_tokens_is_the_key_domain() -> None:
    assert C.tokens_of(torch.tensor([1, 2])) == [1, 2]
    assert C.tokens_of(torch.tensor([1, 2], dtype=torch.int32)[::1]) == [1, 2]
    assert C.tokens_of(torch.tensor([1.0])) is None
    assert C.tokens_of([1, -1]) is None and C.tokens_of("ab") is None
    assert D.is_tokens((1, 2)) and not D.is_tokens([True])


# ---------------------------------------------------------------- the pool machine's ownership probe


def chunk_of(m: Any, n: int = 2) -> Chunk:
    return m.allocate(request(1), n)  # type: ignore[no-any-return]


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("how", ["free", "give", "use"])
def test_a_call_by_an_owner_that_holds_nothing_is_refused_by_the_reference(kind: str, how: str) -> None:
    m = machine_for(KINDS[kind])()
    m.foreign_free(chunk_of(m, 1 if kind == "req_to_token" else 2), request(2), how)


@pytest.mark.parametrize(
    ("kind", "cls", "name"),
    [("mamba", MambaPool, "copy_state"), ("req_to_token", ReqToTokenPool, "write")],
)
def test_a_use_without_the_holder_check_is_caught(
    monkeypatch: pytest.MonkeyPatch, kind: str, cls: type, name: str
) -> None:
    """``copy_state`` into, or ``write`` of, a slot the caller does not hold: the holder check forgotten."""
    from kvledger.impl.slots import SlotPool

    m = machine_for(KINDS[kind])()
    chunk = chunk_of(m, 1 if kind == "req_to_token" else 2)
    original = SlotPool.check_held

    def lax(self: SlotPool, op: str, idx: Any, owner: Any) -> Any:
        return None if op == name else original(self, op, idx, owner)

    monkeypatch.setattr(SlotPool, "check_held", lax)
    with pytest.raises(AssertionError, match=r"invalid call accepted|rejected call leaves state unchanged"):
        m.foreign_free(chunk, request(2), "use")


def _choosing(name: str, n: int = 1) -> C.Draw:
    """A draw that picks pool ``name`` from the audit's ``sampled_from`` of (name, pool), and plants ``n`` slots
    (any other ``sampled_from``: its first element)."""

    def draw(strategy: Any) -> Any:
        elements = getattr(strategy, "elements", None)
        return n if elements is None else next((p for p in elements if p[0] == name), elements[0])

    return draw


def _running_manager(mamba: bool) -> MemoryManager:
    mm = build_manager(SystemConfig(mamba=mamba, kv_tokens=16, rows=3, max_context=12, mamba_slots=4))
    admit(mm, [mm.add_request((1, 2, 3))], Budget(24, 1))
    return mm


def _locked_manager(mamba: bool) -> MemoryManager:
    """A manager with (1, 2) cached and request 2, (1, 2, 3), running on it: its lock covers the cached node."""
    mm = build_manager(SystemConfig(mamba=mamba, kv_tokens=16, rows=3, max_context=12, mamba_slots=4))
    first = mm.add_request((1, 2))
    admit(mm, [first], Budget(24, 1))
    mm.finish(first)
    admit(mm, [mm.add_request((1, 2, 3))], Budget(24, 1))
    return mm


def _unbounded_path(self: MemoryManager, n: Any) -> torch.Tensor:
    parts = []
    while n.parent is not None:  # BUG: no bound: a parent cycle is walked for ever
        parts.append(n.value)
        n = n.parent
    return torch.cat([self.cache.root.value, *reversed(parts)])


@pytest.mark.parametrize("mamba", [False, True])
def test_a_manager_walk_round_a_parent_cycle_is_caught(monkeypatch: pytest.MonkeyPatch, mamba: bool) -> None:
    """Issue 19, new family, seed 2: ``chunk``'s walk up the tree (the row's slots from the root) without its bound.
    With the contracts on, the insert's own law meets the cycle first; with none, the walk runs round it."""
    with bindings.installed("on"):  # NOTE: whatever tier an earlier test in this worker left installed
        _walk_round_a_parent_cycle_is_caught(monkeypatch, mamba)


def _walk_round_a_parent_cycle_is_caught(monkeypatch: pytest.MonkeyPatch, mamba: bool) -> None:
    mm = _locked_manager(mamba)
    before = C._manager_fingerprint(mm)
    assert C.cycle_audit(mm) == "cycle audit: request 2's abort, chunk, finish, retract (contracts on, off)"
    assert C._manager_fingerprint(mm) == before  # the plants are made on copies
    monkeypatch.setattr(MemoryManager, "_path_slots", _unbounded_path)
    with pytest.raises(AssertionError, match=r"^inv_tree_acyclic: chunk of running request 2 .*contracts off.*_Walked"):
        C.cycle_audit(mm)

    @settings(
        max_examples=300,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(st.data())
    def audits(data: st.DataObject) -> None:  # NOTE: the manager scenarios reach the state (a request shares a prefix)
        C.audit(C.manager_scenario("token", data.draw), data.draw)

    with pytest.raises(AssertionError, match=r"inv_tree_acyclic: chunk of running request"):
        audits()


def test_a_contract_walk_up_the_tree_fails_typed_at_a_parent_cycle() -> None:
    """The contracts' own walks up the tree are bounded too: an insert's law over a path with a parent cycle planted
    fails ``inv_tree_acyclic`` at once (it walked round it for ever)."""
    with bindings.installed("on"):
        mm = _locked_manager(False)
        req = mm.requests[2]
        assert req.handle is not None
        n = mm.cache._nodes[req.handle.node_id]
        n.parent = n
        err = C._bounded(lambda: mm.chunk(req), 2.0)
    assert isinstance(err, IntegrityError) and str(err).startswith("inv_tree_acyclic: insert"), err


def test_a_bounded_call_is_stopped_by_the_cpu_it_spends_never_by_the_wall_clock() -> None:
    """``_bounded`` stops a walk round a cycle, which spends CPU all the while, and lets a healthy call that a loaded
    machine slows in wall time only (here: one that sleeps past the bound) answer: a busy machine is never a
    finding."""

    def spin() -> None:
        while True:
            pass

    assert C._bounded(lambda: time.sleep(0.6), 0.3) is None
    err = C._bounded(spin, 0.3)
    assert isinstance(err, C._Walked) and "CPU time" in str(err), err

    def inner_then_spin() -> None:  # NOTE: a bounded call inside one puts the enclosing alarm back
        C._bounded(lambda: None, 5.0)
        spin()

    err = C._bounded(inner_then_spin, 0.3)
    assert isinstance(err, C._Walked) and "0.3 s" in str(err), err


def test_a_finish_that_caches_a_one_token_prefix_without_its_state_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 19, new family, seed 2: ``finish`` caching a Mamba state only past one computed token. The tree still
    holds another request's state, so the ledgers alone (a state is held by some node) pass; the KV content shows
    the state is not at the request's prefix (``spec.ledger.inv_end_caches_content``)."""
    from kvledger.contracts.adapters.reference_system import system_snapshot_of
    from kvledger.contracts.machines.system import end_cache_finding
    from kvledger.spec import ledger as L

    def run(bug: bool) -> tuple[Any, Any, int]:
        mm = build_manager(SystemConfig(mamba=True, kv_tokens=16, rows=3, max_context=12, mamba_slots=4))
        other = mm.add_request((2, 3))
        admit(mm, [other], Budget(24, 1))
        mm.finish(other)  # NOTE: a state cached at (2, 3)
        req = mm.add_request((1,))
        admit(mm, [req], Budget(24, 1))
        before = system_snapshot_of(mm)
        mm.finish(req)
        return before, system_snapshot_of(mm), req.rid

    assert end_cache_finding(*run(False), content=True) == ""
    assert end_cache_finding(*run(False), content=True, in_place=False) == ""
    real = MemoryManager._cache_into_tree
    monkeypatch.setattr(
        MemoryManager,
        "_cache_into_tree",
        lambda self, req, state: real(self, req, None if req.kv_len == 1 else state),  # BUG: a 1-token state dropped
    )
    before, after, rid = run(True)
    assert L.inv_end_caches(after.ledgers, 1, 1, True)  # the ledgers alone: a state is in the tree (another's)
    assert end_cache_finding(before, after, rid, content=False) == ""
    assert "no tree node that holds a Mamba state holds the KV of its last position 0" in end_cache_finding(
        before, after, rid, content=True
    )
    # an engine whose finish computes more first (``finish_in_place`` absent): the state may sit further along the
    # request's path, but on it; the cache's prefixes show it is on another
    assert "no Mamba state in the tree sits on its path at or past its last computed position 0" in (
        end_cache_finding(before, after, rid, content=True, in_place=False)
    )
    msg = fails("mamba", C.manager_scenario, "inv_end_caches")
    assert "finish" in msg, msg


@pytest.mark.parametrize("kind", ["token", "mamba"])
def test_a_rollback_that_takes_any_attempt_is_caught(monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    """Issue 19, new family, seed 10: the admission's undo without its check that the attempt's state is the
    request's own. ``rollback`` and ``release_attempt_state`` are public functions: they are probed with attempts
    that are none to undo (another manager's request, a request that is not waiting, a state that is another's)."""
    from kvledger.impl import admission

    real = admission._attempted

    def lax(op: str, mm: MemoryManager, a: object) -> Any:
        if isinstance(a, admission.Attempt) and mm.requests.get(getattr(a.req, "rid", None)) is a.req:
            return a.req  # BUG: no check of the request's stage or of the attempt's state
        return real(op, mm, a)

    run_probes(kind, C.manager_scenario, 100)  # the reference refuses each
    monkeypatch.setattr(admission, "_attempted", lax)
    msg = fails(kind, C.manager_scenario, "inv_domain_enforced")
    assert "admission." in msg, msg


def _pressed_manager() -> MemoryManager:
    """A Mamba manager with room in KV and rows, and one state cached besides the one the cow audit caches."""
    mm = build_manager(SystemConfig(mamba=True, kv_tokens=64, rows=4, max_context=16, mamba_slots=6))
    r = mm.add_request((21, 22, 23))
    admit(mm, [r], Budget(10**6, 10**6))
    mm.finish(r)
    return mm


def test_the_cow_audit_holds_on_the_reference() -> None:
    mm = _pressed_manager()
    before = C._manager_fingerprint(mm)
    assert "1 free: admitted" in C.cow_audit(mm)  # a cached state is evicted for the track buffers
    assert C._manager_fingerprint(mm) == before


def test_track_buffers_that_do_not_evict_fail_the_cow_audit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 19, new family, seed 10, found in the reference by this audit: the admission's copy-on-write path took
    its track buffers straight from the Mamba pool, so a request was refused with a cached state it could evict."""
    from kvledger.impl import admission

    monkeypatch.setattr(MemoryManager, "_make_room", lambda self, comp, short, what: None)  # BUG: no eviction
    monkeypatch.setattr(admission.MemoryManager, "_make_room", lambda self, comp, short, what: None)
    with pytest.raises(AssertionError, match=r"alloc evicts before it refuses: admission of .* 1 Mamba slots free"):
        C.cow_audit(_pressed_manager())


def test_an_admission_that_swallows_a_failed_track_alloc_fails_the_cow_audit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 19, new family, seed 10: the copy-on-write path's ``raise`` dropped after a failed track alloc: the
    failure is swallowed and the attempt goes on with no track buffers (an untyped crash)."""
    from kvledger.impl import admission

    real = admission._acquire

    def swallows(mm: MemoryManager, a: Any) -> None:
        try:
            real(mm, a)
        except OverAllocation:
            raise UnboundLocalError("track") from None  # BUG: as the attempt without its raise crashes

    monkeypatch.setattr(admission, "_acquire", swallows)
    with pytest.raises(AssertionError, match=r"inv_domain_enforced: admission of .* raised UnboundLocalError"):
        C.cow_audit(_pressed_manager())


def test_a_refusal_for_want_of_room_that_names_no_pool_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 19, new family, seed 10: the manager's eviction step names the component that was short ("full")
    where it means the pool ("kv"), and the Mamba pool as "kv". An ``OverAllocation`` must name what was short: one
    of the object's pools (or an admission's budget)."""
    real = MemoryManager._make_room

    def names_the_component(self: MemoryManager, comp: Component, short: int, what: str) -> None:
        try:
            real(self, comp, short, what)
        except OverAllocation as err:
            raise OverAllocation(err.operation, comp.value, err.slots, err.detail) from None  # BUG: not a pool

    run_probes("token", C.manager_scenario, 100)  # the reference names the pool
    monkeypatch.setattr(MemoryManager, "_make_room", names_the_component)
    msg = fails("token", C.manager_scenario, "inv_names_culprit")
    assert "short of 'full'" in msg, msg


def test_a_close_of_a_session_in_use_that_is_accepted_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 19, new family, seed 9: ``close`` with its in-use test negated frees a session's memory while its turn
    runs on it. A session lent to a running turn is outside ``close``'s domain: refused, nothing changed."""
    real = Sessions.close

    def lax(self: Sessions, sid: Any) -> None:
        slot = self.slots.get(sid) if type(sid) is int else None
        if slot is not None and slot.lent_to is not None:
            slot.lent_to = None  # BUG: the turn running on it is not looked at
        real(self, sid)

    monkeypatch.setattr(Sessions, "close", lax)
    msg = fails("token", C.manager_scenario, "inv_domain_enforced", examples=1000)
    assert "close_session" in msg, msg


@pytest.mark.parametrize("law", ["inv_committed_within_allocated", "inv_kv_needs_row", "the tokens"])
def test_a_session_self_check_that_misses_a_law_fails_the_audit(monkeypatch: pytest.MonkeyPatch, law: str) -> None:
    """Issue 19, new family, seed 9: ``Sessions.check`` with one of its raises dropped. The checker trusts it after
    each release it makes on a copy, so the audit plants each law broken and wants the check to name it."""
    from kvledger.impl.session import S as spec_session

    mm = _running_manager(False)
    before = C._manager_fingerprint(mm)
    assert C.session_audit(mm) == "session audit: 3 plants"
    assert C._manager_fingerprint(mm) == before  # the plants are made on copies
    if law == "the tokens":
        monkeypatch.setattr(Sessions, "check", lambda self: None)  # BUG: nothing is checked
    else:
        monkeypatch.setattr(spec_session, law, lambda s: True)  # BUG: the law never fails
    with pytest.raises(AssertionError, match=r"self-checks agree with the state: Sessions.check\(\) with session"):
        C.session_audit(mm)


@pytest.mark.parametrize("mamba", [False, True])
def test_the_leak_audit_plants_a_leak_in_each_pool_and_takes_it_back(mamba: bool) -> None:
    mm = _running_manager(mamba)
    before = C._manager_fingerprint(mm)
    for name in mm.pools():
        assert C.leak_audit(mm, _choosing(name)).startswith(f"leak audit: {name} slots [")
        for pool in mm.pools().values():
            pool.run_min = 1  # NOTE: a plant of three is then a run, tagged and stamped through slices
        assert C.leak_audit(mm, _choosing(name, 3)).startswith(f"leak audit: {name} slots [")
        assert C._manager_fingerprint(mm) == before


def test_a_leak_checker_that_reports_nothing_fails_the_audit(monkeypatch: pytest.MonkeyPatch) -> None:
    from kvledger.impl import leaks

    mm = _running_manager(False)
    real = leaks.check_leaks
    # BUG: the checker counts every pool, then finds nothing
    monkeypatch.setattr(C, "check_leaks", lambda mm: leaks.LeakReport(pools=real(mm).pools))
    with pytest.raises(AssertionError, match=r"leak checker agrees with the ledgers: kv slots \[\d+\] planted for"):
        C.leak_audit(mm, _choosing("kv"))


def test_a_leak_report_whose_counts_are_not_the_ledgers_fails_the_audit(monkeypatch: pytest.MonkeyPatch) -> None:
    from dataclasses import replace

    from kvledger.impl import leaks

    mm = _running_manager(False)
    real = leaks.check_leaks

    def swapped(mm: MemoryManager) -> leaks.LeakReport:
        # BUG: slots of running requests counted as waiting ones, and the other way round
        report = real(mm)
        report.pools = {n: replace(c, running=c.waiting, waiting=c.running) for n, c in report.pools.items()}
        return report

    assert any(c.running for c in real(mm).pools.values()), "the manager has a running request holding slots"
    C.leak_audit(mm, _choosing("kv"))  # NOTE: the real checker's counts pass
    monkeypatch.setattr(C, "check_leaks", swapped)
    with pytest.raises(AssertionError, match=r"leak checker agrees with the ledgers: pool \w+'s counts in the report"):
        C.leak_audit(mm, _choosing("kv"))


def test_a_leak_report_whose_leaked_view_drops_its_findings_fails_the_audit(monkeypatch: pytest.MonkeyPatch) -> None:
    """An idle check reads ``leaked()`` and ``ok``: a report whose findings name the leak but whose ``leaked()``
    reads empty tells the engine nothing leaked."""
    from kvledger.impl import leaks

    mm = _running_manager(False)
    C.leak_audit(mm, _choosing("kv"))  # NOTE: the real report's views agree
    monkeypatch.setattr(leaks.LeakReport, "leaked", lambda self: {})  # BUG: the view drops every finding
    with pytest.raises(AssertionError, match=r"leak checker agrees with the ledgers: .* but the report reads"):
        C.leak_audit(mm, _choosing("kv"))


def test_a_leak_finding_that_names_someone_expecting_a_leaked_slot_fails_the_audit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 19, new family, seed 23: ``check_leaks`` with its "expected" column negated reports a leaked slot as
    expected by ``None`` (and a lost one as expected by nobody). Every field of a finding must be true: a slot
    nothing references is expected by nobody."""
    from dataclasses import replace

    from kvledger.impl import leaks

    mm = _running_manager(False)
    C.leak_audit(mm, _choosing("kv"))  # NOTE: the real report says nobody
    real = leaks.check_leaks

    def negated(mm: MemoryManager) -> leaks.LeakReport:
        report = real(mm)
        report.findings = [replace(f, expected="None") if f.kind == "leaked" else f for f in report.findings]
        return report  # BUG: a leaked slot reported as expected by ``str(None)``

    monkeypatch.setattr(C, "check_leaks", negated)
    with pytest.raises(AssertionError, match=r"leak checker agrees with the ledgers: .* expected by 'None'"):
        C.leak_audit(mm, _choosing("kv"))


def test_a_leak_checker_that_reports_a_healthy_manager_fails_the_audit(monkeypatch: pytest.MonkeyPatch) -> None:
    from kvledger.impl import leaks

    mm = _running_manager(False)
    real = leaks.check_leaks

    def noisy(m: MemoryManager) -> leaks.LeakReport:
        report = real(m)
        report.findings.append(leaks.Finding("kv", 1, "leaked", "req:1", "nobody", "alloc", 0))  # BUG: a false alarm
        return report

    monkeypatch.setattr(C, "check_leaks", noisy)
    with pytest.raises(AssertionError, match="leak checker agrees with the ledgers: a healthy manager was reported"):
        C.leak_audit(mm, _choosing("kv"))


def test_a_pool_that_stops_recording_provenance_fails_the_audit(monkeypatch: pytest.MonkeyPatch) -> None:
    """A leak reported without the operation that made it (the pool never writes ``origin``) fails the audit."""
    from kvledger.impl.slots import SlotPool

    def lose(self: SlotPool, value: int) -> None:
        self._stamp = value  # BUG: never marks the pool as stamped, so no origin is ever written

    monkeypatch.setattr(SlotPool, "stamp", property(lambda self: self._stamp, lose))
    mm = _running_manager(False)
    with pytest.raises(AssertionError, match=r"stamped the provenance of slots \[\]|attributed to 'init' at step 0"):
        C.leak_audit(mm, _choosing("kv"))


def test_an_alloc_that_stamps_a_slot_it_does_not_hand_out_fails_the_audit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Provenance names the operation that handed a slot out: an alloc that also stamps its neighbour (a slice one
    too long) gives that slot another operation's story."""
    from kvledger.impl.slots import SlotPool

    real = SlotPool.alloc

    def alloc(self: SlotPool, n: object, owner: Owner) -> torch.Tensor:
        out = real(self, n, owner)
        hi = int(out.max()) + 1
        if hi < self.size:
            self.origin[hi] = self.stamp  # BUG: the stamp runs one slot past what was handed out
        return out

    monkeypatch.setattr(SlotPool, "alloc", alloc)
    mm = _running_manager(False)
    with pytest.raises(AssertionError, match=r"stamped the provenance of slots \[.*\]: an alloc stamps exactly"):
        C.leak_audit(mm, _choosing("kv"))


def test_event_ids_that_do_not_grow_fail_the_audit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Provenance orders operations by their event ids: an id that does not grow fails the audit."""
    mm = _running_manager(False)
    real = MemoryManager.event

    def back(self: MemoryManager, op: str, who: str) -> int:
        self._step -= 2  # BUG: the step counter moved the wrong way
        return real(self, op, who)

    monkeypatch.setattr(MemoryManager, "event", back)
    with pytest.raises(AssertionError, match="leak checker agrees with the ledgers: event ids must grow"):
        C.leak_audit(mm, _choosing("kv"))


def _cached(kind: str = "token") -> RadixCache:
    return C._build_cache(kind, _first_choice).cache


def _first_choice(strategy: Any) -> Any:
    """A deterministic draw: each strategy's simplest example (Hypothesis' own minimal value)."""
    from hypothesis import find

    return find(strategy, lambda _: True, settings=settings(database=None, max_examples=1))


def test_a_session_walk_that_takes_anything_fails_the_leak_audit(monkeypatch: pytest.MonkeyPatch) -> None:
    """The leak checker's own helpers get its junk too: a session walk that reads any object as a session with
    nothing to reference (no typed refusal) is an untyped answer outside its domain."""
    mm = _running_manager(False)
    # BUG: no check that it is a session slot: junk reads as a session holding no Mamba slots
    monkeypatch.setattr(C, "session_mamba_refs", lambda slot: getattr(getattr(slot, "mamba", None), "slots", tuple)())
    with pytest.raises(AssertionError, match=r"inv_domain_enforced: <lambda>\(None\) lies outside its domain"):
        C.leak_audit(mm, _choosing("kv"))


def test_the_cache_audit_holds_on_a_healthy_cache() -> None:
    c = _cached()
    assert C.cache_audit(c).startswith("cache audit: ")


def test_a_node_view_that_drops_a_delete_in_silence_fails_the_audit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 19, new family, seed 8: a node's per-component view whose ``del`` does nothing (its refusal dropped):
    ``pop`` then answers without removing, and ``clear`` never ends. The audit wants each refused, bounded."""
    from kvledger.impl.lru import ByComponent

    c = _cached()
    assert C._fixed_views(c) == ""
    monkeypatch.setattr(ByComponent, "__delitem__", lambda self, comp: None)  # BUG: the delete dropped
    with pytest.raises(
        AssertionError, match=r"self-checks agree with the state: del of an entry of node \d+'s lock_ref"
    ):
        C.cache_audit(c)


def test_a_self_check_that_raises_on_a_healthy_list_fails_the_audit(monkeypatch: pytest.MonkeyPatch) -> None:
    from kvledger.impl.lru import LRUList
    from kvledger.spec.errors import IntegrityError

    c = _cached()

    def check(self: Any) -> None:
        raise IntegrityError("inv_lru_links_symmetric: broken")  # BUG: the list's own check misreads a good list

    monkeypatch.setattr(LRUList, "check", check)
    with pytest.raises(AssertionError, match=r"self-checks agree with the state: full LRU list's check\(\) raised"):
        C.cache_audit(c)


@pytest.mark.parametrize("how", ["members only", "links only", "no walk"])
def test_a_self_check_that_misses_a_broken_link_fails_the_audit(monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    """A check that passes a list with a broken link (it compares only the member set, or only the links, or
    nothing) fails the audit's planted breaks; the links are put back either way."""
    from kvledger.impl.lru import LRUList
    from kvledger.spec.errors import IntegrityError

    c = _cached()
    order = {comp: c.lru(comp).order() for comp in c.components}

    def lax(self: LRUList[Any]) -> None:
        if how == "members only":  # BUG: walks the next pointers and never looks at prev
            seen, x = [], self.head.next[self.slot]
            while x is not None and x is not self.tail:
                seen.append(x.id)
                x = x.next[self.slot]
            if sorted(seen) != sorted(n.id for n in self._members):
                raise IntegrityError("inv_lru_detached: walk differs from members")
        if how == "links only":  # BUG: every link symmetric is taken for a whole list; the members never compared
            x = self.head
            while x is not self.tail:
                nxt = x.next[self.slot]
                if nxt is None or nxt.prev[self.slot] is not x:
                    raise IntegrityError("inv_lru_links_symmetric: broken")
                x = nxt

    monkeypatch.setattr(LRUList, "check", lax)
    with pytest.raises(AssertionError, match=r"self-checks agree with the state: full LRU list's check\(\) passed"):
        C.cache_audit(c)
    monkeypatch.undo()
    assert {comp: c.lru(comp).order() for comp in c.components} == order
    C.cache_audit(c)


def test_a_node_count_off_by_one_fails_the_audit(monkeypatch: pytest.MonkeyPatch) -> None:
    c = _cached()
    real = RadixTree.node_count
    monkeypatch.setattr(RadixTree, "node_count", lambda self: real(self) + 1)  # BUG: counts one node too many
    with pytest.raises(
        AssertionError, match=r"self-checks agree with the state: (node_count\(\) is \d+, a walk|a fresh cache has 2)"
    ):
        C.cache_audit(c)


def test_an_insert_that_takes_a_state_at_the_root_silently_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """No Mamba state sits at the root: ``insert`` of the empty key offering one must be refused, typed. One that
    returns the root and leaves the state with its holder, without a word, is caught by the probe."""
    original = RadixCache.insert

    def insert(self: RadixCache, key: Any, value: Any, owner: Any, **kw: Any) -> Any:
        if isinstance(key, torch.Tensor) and key.numel() == 0 and kw.get("mamba_slot") is not None and self.mamba:
            return original(self, key, value, owner)  # BUG: the state offered is dropped, not refused
        return original(self, key, value, owner, **kw)

    monkeypatch.setattr(RadixCache, "insert", insert)
    fails("mamba", C.cache_scenario, "inv_domain_enforced: RadixCache.insert of the empty key(", examples=200)


def test_a_walk_that_passes_a_node_twice_before_it_stops_fails_the_audit(monkeypatch: pytest.MonkeyPatch) -> None:
    """``iter_lru``'s guard against a cycle one step late: on a list with a cycle it yields a node a second time
    before it raises. The audit plants a cycle for each walk and wants the error before any node comes round."""
    from kvledger.impl.lru import LRUList

    def iter_lru(self: LRUList[Any]) -> Any:
        i, left, x = self.slot, len(self._members) + 1, self.tail.prev[self.slot]  # BUG: one step too many
        while x is not None and x is not self.head:
            left -= 1
            if left < 0:
                raise self._revisit("tail", x)
            nxt = x.prev[i]
            yield x
            x = nxt

    c = _cached()
    assert len(c.lru(Component.FULL)), "the audited cache has a member to plant a cycle through"
    C.cache_audit(c)  # NOTE: the real walk passes
    monkeypatch.setattr(LRUList, "iter_lru", iter_lru)
    with pytest.raises(AssertionError, match=r"agree with the state: iter_lru of the full list with a cycle planted"):
        C.cache_audit(c)


def test_a_node_view_that_does_not_write_through_fails_the_audit(monkeypatch: pytest.MonkeyPatch) -> None:
    """A node's per-component views (``lru_prev``, ``lru_next``, ``lock_ref``) are live: a write through one is the
    link or the count. The audit plants its cycle through ``lru_prev``; a view whose writes go nowhere (seed 39's
    ``ByComponent.__setitem__`` survivor) leaves no cycle, so the walk passes where it must raise."""
    from kvledger.impl.lru import ByComponent

    c = _cached()
    C.cache_audit(c)  # NOTE: the live view writes through
    monkeypatch.setattr(ByComponent, "__setitem__", lambda self, comp, x: None)  # BUG: a write that goes nowhere
    with pytest.raises(AssertionError, match=r"agree with the state: iter_lru of the full list with a cycle planted"):
        C.cache_audit(c)


def test_a_list_built_without_its_tail_link_fails_the_audit_on_a_fresh_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """A list whose constructor leaves the tail sentinel's back link unset is a chain only once a member is linked:
    the audited cache (with members) passes, a cache built afresh like it does not."""
    from kvledger.impl.lru import LRUList

    c = _cached()
    original = LRUList.__init__

    def init(self: LRUList[Any], component: Component) -> None:
        original(self, component)
        self.tail.prev[self.slot] = None  # BUG: the tail's back link is never set

    monkeypatch.setattr(LRUList, "__init__", init)
    with pytest.raises(AssertionError, match=r"agree with the state: a fresh cache's full LRU list's check"):
        C.cache_audit(c)


def _split_mamba_cache() -> RadixCache:
    """A Mamba cache of two keys that share their first two tokens, each with a state: the split leaves a node with
    no state (MAMBA holds nothing there)."""
    kv, mamba = TokenAllocator(16), MambaPool(3, conv_shape=(2,), temporal_shape=(2,))
    cache = RadixCache(kv, mamba=mamba)
    for r, key in ((1, [1, 2, 3]), (2, [1, 2, 4])):
        slots = kv.alloc(3, request(r))
        state = int(mamba.alloc(1, request(r))[0])
        cache.insert(torch.tensor(key), slots, request(r), mamba_slot=state)
    return cache


def test_sizes_that_recompute_otherwise_fail_the_audit(monkeypatch: pytest.MonkeyPatch) -> None:
    """``recompute_sizes`` that counts every node for every component (a stateless one too) differs from the
    maintained counters: the audit compares the two."""
    c = _split_mamba_cache()
    assert C.cache_audit(c).startswith("cache audit: ")

    def lax(self: RadixTree) -> Any:
        out = {comp: [0, 0] for comp in self.components}
        for n in self._nodes.values():
            for comp in self.components:
                if n is not self.root or self.holds(n, comp):  # BUG: or for and
                    out[comp][int(n.refs[SLOT[comp]] > 0)] += 1 if comp is Component.MAMBA else len(n)
        return {comp: (e, p) for comp, (e, p) in out.items()}

    monkeypatch.setattr(RadixTree, "recompute_sizes", lax)
    with pytest.raises(AssertionError, match=r"self-checks agree with the state: recompute_sizes\(\) of the cache"):
        C.cache_audit(c)


def test_an_empty_write_that_crashes_on_a_request_without_a_row_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """``write_kv(req, 0, 0)`` writes nothing and is inside the domain for any of the manager's requests, with a row
    or not: the probe makes it on a copy, where an untyped crash is a domain violation."""
    original = MemoryManager.write_kv

    def write(self: MemoryManager, req: Any, start: Any, end: Any) -> None:
        self.own("write_kv", req)  # NOTE: a stranger is refused typed, as the reference refuses it
        if type(start) is int and type(end) is int and end == start:  # NOTE: inside the domain only
            assert req.row is not None  # BUG: an empty range still needs a row
        original(self, req, start, end)

    monkeypatch.setattr(MemoryManager, "write_kv", write)
    fails("token", C.manager_scenario, "inv_domain_enforced: MemoryManager.write_kv(")


def test_a_lock_that_keeps_its_raises_on_a_parent_cycle_fails_the_audit(monkeypatch: pytest.MonkeyPatch) -> None:
    """A lock that meets a parent cycle must fail typed and leave every count as it was (a failed operation
    changes nothing); one that reports the cycle but keeps the counts it raised fails the audit."""
    c = _cached()
    real = RadixTree._raise_full

    def keeps(self: RadixTree, n: Any) -> Any:
        saved = [list(x.refs) for x in self._nodes.values()]
        try:
            return real(self, n)
        except IntegrityError:
            for x, refs in zip(self._nodes.values(), saved, strict=True):
                x.refs[:] = [r + 1 for r in refs]  # BUG: the undo moved the counts the wrong way
            raise

    monkeypatch.setattr(RadixTree, "_raise_full", keeps)
    with pytest.raises(AssertionError, match="parent cycle planted changed the lock counts"):
        C.cache_audit(c)


def _full_with_evictable() -> MemoryManager:
    """A manager whose KV pool is all held or cached, with a finished request's tokens evictable."""
    mm = build_manager(SystemConfig(kv_tokens=16, rows=3, max_context=12))
    req = mm.add_request((1, 2, 3, 4, 5, 6))
    admit(mm, [req], Budget(24, 1))
    mm.finish(req)
    mm.alloc_kv(request(50), mm.kv.available_size())
    assert mm.kv.available_size() == 0 and mm.cache.evictable_size(C.Component.FULL) > 0
    return mm


def test_the_room_audit_allocates_on_a_copy() -> None:
    mm = _full_with_evictable()
    before = C._manager_fingerprint(mm)
    assert C.room_audit(mm) == "room audit: 1 tokens with 0 free"
    assert C._manager_fingerprint(mm) == before


def test_an_alloc_that_refuses_what_it_could_evict_fails_the_room_audit(monkeypatch: pytest.MonkeyPatch) -> None:
    mm = _full_with_evictable()
    monkeypatch.setattr(MemoryManager, "_make_room", lambda self, comp, short, what: None)  # BUG: never evicts
    with pytest.raises(AssertionError, match=r"alloc evicts before it refuses: alloc_kv of 1 tokens with 0 free"):
        C.room_audit(mm)


def _mamba_with_evictable(short: bool) -> MemoryManager:
    """A Mamba manager with cached states evictable and (``short``) fewer Mamba slots free than a request state
    takes (else the audit makes the copy short itself)."""
    mm = build_manager(SystemConfig(kv_tokens=32, rows=4, max_context=12, mamba=True, mamba_slots=8))
    assert mm.mamba is not None
    for toks in ((1, 2, 3, 4), (5, 6, 7, 8)):
        req = mm.add_request(toks)
        admit(mm, [req], Budget(24, 1))
        mm.finish(req)
    need = 1 + mm.mamba.ping_pong_size
    if short:
        mm.mamba.pool.alloc(mm.mamba.available_size() - need + 1, request(50))
    assert (mm.mamba.available_size() < need) is short and mm.cache.evictable_size(C.Component.MAMBA) > 0
    return mm


@pytest.mark.parametrize("short", [True, False])
def test_the_room_audit_allocates_a_mamba_state_on_a_copy(short: bool) -> None:
    mm = _mamba_with_evictable(short)
    before = C._manager_fingerprint(mm)
    assert "a Mamba state with" in C.room_audit(mm)
    assert C._manager_fingerprint(mm) == before


def _fresh_mamba_manager() -> MemoryManager:
    """A Mamba manager with nothing cached (the room audit grows a copy of it)."""
    return build_manager(SystemConfig(kv_tokens=32, rows=4, max_context=12, mamba=True, mamba_slots=8))


@pytest.mark.parametrize(
    "story", ["evictable and short", "evictable", "nothing cached"], ids=["short", "not-short", "nothing-cached"]
)
def test_a_mamba_alloc_that_refuses_what_it_could_evict_fails_the_room_audit(
    monkeypatch: pytest.MonkeyPatch, story: str
) -> None:
    mm = _fresh_mamba_manager() if story == "nothing cached" else _mamba_with_evictable(story.endswith("short"))
    real = MemoryManager._make_room

    def kv_only(self: MemoryManager, comp: C.Component, short: int, what: str) -> None:
        if comp is C.Component.FULL:  # BUG: a Mamba state is never evicted for
            real(self, comp, short, what)

    monkeypatch.setattr(MemoryManager, "_make_room", kv_only)
    with pytest.raises(AssertionError, match=r"alloc evicts before it refuses: alloc_mamba"):
        C.room_audit(mm)


def test_a_story_with_nothing_evictable_is_audited_on_a_copy_with_a_request_more_cached() -> None:
    """A fresh manager has nothing cached: the audit runs one request to its end on a copy, so both pools have
    something to evict and both allocations are made; the manager itself is unchanged."""
    mm = _fresh_mamba_manager()
    assert not mm.cache.evictable_size(C.Component.MAMBA) and not mm.cache.evictable_size(C.Component.FULL)
    before = C._manager_fingerprint(mm)
    told = C.room_audit(mm)
    assert "on a copy with one request more cached" in told and "a Mamba state with" in told, told
    assert "nothing to evict for" not in told, told
    assert C._manager_fingerprint(mm) == before


def test_an_insert_that_refuses_a_repeated_slot_with_another_class_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The spec gives ``SlotConflict`` for an insert naming one slot at two positions; a cache that leaves it to the
    pool (which refuses with ``InvalidArgument``) is caught, by the class of its refusal."""
    from kvledger.impl.kvview import KVView

    monkeypatch.setattr(KVView, "check_fresh", lambda self, key, value, offered: None)  # BUG: no freshness check
    msg = fails("token", C.cache_scenario, "inv_domain_enforced")
    assert "not SlotConflict" in msg, msg


def test_a_batch_refusal_that_names_another_request_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """``admit`` of a batch naming a request twice after another one: the refusal must name the repeated request."""
    from kvledger.impl import admission
    from kvledger.spec.errors import InvalidArgument

    mm = build_manager(SystemConfig(kv_tokens=16, rows=3, max_context=12))
    a, b = mm.add_request((1, 2)), mm.add_request((3, 4))
    scenario = C.manager_scenario_of(mm, ["two waiting requests"])
    batch = {m.what: m for m in scenario.methods}["admit"]
    args = {"mm": mm, "waiting": [a, b, b], "budget": Budget(24, 1)}
    C.judge(scenario, batch, args, inside=False)  # the reference names request 2

    def first(mm: MemoryManager, reqs: list[Any]) -> None:
        if len({id(r) for r in reqs}) != len(reqs):  # BUG: names the batch's first request
            raise InvalidArgument("admit", "req_to_token", (), f"request {reqs[0].rid} named twice in one batch")

    monkeypatch.setattr(admission, "_own_each_once", first)
    with pytest.raises(AssertionError, match=r"inv_names_culprit: .* was refused without naming request 2"):
        C.judge(scenario, batch, args, inside=False)


def test_caching_a_slot_whose_swa_slot_was_freed_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A cache that no longer checks a new position's SWA slot is still live accepts an insert outside its domain."""
    from kvledger.impl.kvview import KVView

    monkeypatch.setattr(KVView, "check_swa_live", lambda self, op, idx: None)  # BUG: the SWA-live check dropped
    msg = fails("swa", C.cache_scenario, "inv_domain_enforced", examples=600)
    assert "RadixCache.insert" in msg and "was accepted" in msg, msg


def _locked(kind: str = "token") -> RadixCache:
    """A healthy cache with at least two nodes in its FULL list and a live handle on a path of two nodes."""
    c = _cached(kind)
    for key in ([9, 9, 8], [9, 9, 7]):
        m = c.match_prefix(torch.tensor(key))
        slots = torch.cat([m.indices, c.kv.alloc(3 - m.length, request(77))])
        c.insert(torch.tensor(key), slots, request(77))
    c.inc_lock_ref(c.match_prefix(torch.tensor([9, 9, 8])).last_node)
    return c


def test_the_lru_audit_holds_on_a_healthy_cache_and_changes_nothing() -> None:
    c = _locked()
    before = C._cache_fingerprint(c)
    assert C.lru_audit(c, _first_choice).startswith("lru audit: full")
    assert C._cache_fingerprint(c) == before and C.cache_audit(c).startswith("cache audit: ")


def test_an_empty_list_that_hands_out_its_sentinel_fails_the_audit(monkeypatch: pytest.MonkeyPatch) -> None:
    from kvledger.impl.lru import LRUList

    def lru_first(self: LRUList[Any]) -> Any:
        x = self.tail.prev[self.slot]
        return None if x is self.head and x is None else x  # BUG: an empty list answers its head sentinel

    monkeypatch.setattr(LRUList, "lru_first", lru_first)
    with pytest.raises(AssertionError, match=r"results equal the spec's: full list emptied reads"):
        C.lru_audit(_locked(), _first_choice)


def test_an_lru_refusal_that_names_another_node_fails_the_audit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each refusal of an LRU list names the node it refused (-1 for a value that is no node): an error that names
    none sends its reader to the wrong node (``inv_names_culprit``)."""
    from kvledger.impl import lru

    monkeypatch.setattr(lru, "_ident", lambda node: -1)  # BUG: every refusal names no node
    with pytest.raises(AssertionError, match=r"inv_names_culprit: full list: place naming a member twice named node"):
        C.lru_audit(_locked(), _first_choice)


def test_a_place_that_drops_a_repeated_node_fails_the_audit(monkeypatch: pytest.MonkeyPatch) -> None:
    from kvledger.impl.lru import LRUList

    real = LRUList.place
    monkeypatch.setattr(LRUList, "place", lambda self, order: real(self, list(dict.fromkeys(order))))  # BUG: no refusal
    with pytest.raises(AssertionError, match="inv_domain_enforced: full list: place naming a member twice raised None"):
        C.lru_audit(_locked(), _first_choice)


def test_a_place_without_its_list_check_fails_the_audit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 19, new family, seed 9: ``place`` without its test that it was given a list: a string still fails later
    (a character is no node), but a lone node or ``None`` crashes untyped and a set is placed in no order. The
    audit gives each call that takes a list of nodes each kind of value that is no list."""
    from kvledger.impl.lru import LRUList

    C.lru_audit(_locked(), _first_choice)  # the reference refuses each
    real = LRUList.place

    def lax(self: Any, order: Any) -> None:
        if not isinstance(order, list | tuple | str):
            return self._reorder(order)  # type: ignore[no-any-return]  # BUG: no list check before the walk
        return real(self, order)  # type: ignore[no-any-return]

    monkeypatch.setattr(LRUList, "place", lax)
    law = r"inv_domain_enforced: full list: place of one member, not a list raised TypeError"
    with pytest.raises(AssertionError, match=law):
        C.lru_audit(_locked(), _first_choice)


def test_a_place_that_misorders_fails_the_audit(monkeypatch: pytest.MonkeyPatch) -> None:
    from kvledger.impl.lru import LRUList

    real = LRUList._place_runs

    def place_runs(self: Any, pos: Any, rest: list[Any]) -> None:
        real(self, pos, rest[::-1])  # BUG: the run is put in place in reverse

    monkeypatch.setattr(LRUList, "_place_runs", place_runs)
    c = _locked()
    chain = c.lru(Component.FULL).order()

    def draw(strategy: Any) -> Any:  # NOTE: a selection of two or more members, the first not at the head
        from hypothesis import find

        def out_of_place(x: object) -> bool:  # NOTE: by id: the audit draws from its deep copy's nodes
            return not isinstance(x, list) or (len(x) >= 2 and x[0].id != chain[0])

        return find(strategy, out_of_place, settings=settings(database=None, max_examples=200))

    with pytest.raises(AssertionError, match=r"results equal the spec's: full list after place\("):
        C.lru_audit(c, draw)


def test_a_place_that_refuses_an_order_whose_head_is_in_place_fails_the_audit(monkeypatch: pytest.MonkeyPatch) -> None:
    """``place`` of an order whose first node already heads the list (it need move only what follows) is inside its
    domain: one that refuses it as a node named twice fails the audit, which keeps a drawn head of the list in place."""
    from kvledger.impl.lru import Linked, LRUList
    from kvledger.spec.errors import AlreadyInList

    real = LRUList.place

    def place(self: Any, order: list[Any]) -> None:
        listed = isinstance(order, list | tuple)
        members = listed and all(isinstance(n, Linked) and n in self for n in order) and len(set(order)) == len(order)
        placed = self._in_place(order) if members else None  # NOTE: other orders are refused as before
        if placed is not None and placed[1] > 0:  # BUG: counts the first node out of place among those in place
            raise AlreadyInList("lru_touch", self.component.value, -1, "a node named twice in one touch")
        real(self, order)

    monkeypatch.setattr(LRUList, "place", place)
    c = _locked()
    chain = c.lru(Component.FULL).order()

    def draw(strategy: Any) -> Any:  # NOTE: the head kept in place, then a member that does not follow it
        from hypothesis import find

        def wanted(x: object) -> bool:
            if isinstance(x, int):
                return x == 1
            return not isinstance(x, list) or (len(x) >= 1 and x[0].id != chain[1])

        return find(strategy, wanted, settings=settings(database=None, max_examples=200))

    with pytest.raises(AssertionError, match=r"spec.s: full list: place\(.* inside its domain raised"):
        C.lru_audit(c, draw)


def test_a_failed_release_that_keeps_what_it_lowered_fails_the_audit(monkeypatch: pytest.MonkeyPatch) -> None:
    """``dec_lock_ref`` that finds a count lost must put back what it lowered before; one that does not fails."""
    monkeypatch.setattr(RadixTree, "_unlower", lambda self, counters: None)  # BUG: the undo is skipped
    c = _locked()
    with pytest.raises(AssertionError, match=r"count of node .* planted lost failed and changed the other lock counts"):
        C.cache_audit(c)
    monkeypatch.undo()
    assert C.cache_audit(c).startswith("cache audit: ")


def test_a_session_call_that_takes_a_twin_of_its_request_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A twin (every field of one of the manager's requests, row and session included, in another object) is not
    its request: a session call without the ownership check acts on it."""
    from copy import copy

    mm = build_manager(SystemConfig(kv_tokens=16, rows=3, max_context=12))
    mm.sessions.open(1)
    req = mm.add_request((1, 2, 3), session=1)
    admit(mm, [req], Budget(24, 1))
    scenario = C.manager_scenario_of(mm, ["a session's request admitted"])
    method = {m.what: m for m in scenario.methods}["sessions.extend_resumed"]
    twin = copy(req)
    twin.tokens = (*req.tokens, 4, 5)  # NOTE: its turn grew past what the request holds: the call allocates for it
    C.judge(scenario, method, {"req": twin}, inside=False)  # the reference refuses it, unchanged
    real = MemoryManager.own
    monkeypatch.setattr(MemoryManager, "own", lambda self, op, r: r if op == "extend_resumed" else real(self, op, r))
    with pytest.raises(AssertionError, match=r"invalid call accepted|rejected call leaves state unchanged"):
        C.judge(scenario, method, {"req": twin}, inside=False)


@pytest.mark.parametrize("mamba", [False, True])
def test_the_rollback_audit_holds_on_the_reference_and_changes_nothing(mamba: bool) -> None:
    mm = _running_manager(mamba)
    before = C._manager_fingerprint(mm)
    assert C.rollback_audit(mm) == "rollback audit: session 1's second turn refused, nothing changed"
    assert C._manager_fingerprint(mm) == before


@pytest.mark.parametrize("mamba", [False, True])
def test_the_injection_audit_holds_on_the_reference_and_changes_nothing(mamba: bool) -> None:
    mm = _running_manager(mamba)
    before = C._manager_fingerprint(mm)
    calls = "alloc_kv(1), alloc_mamba" if mamba else "alloc_kv(1)"
    assert C.injection_audit(mm) == f"injection audit: {calls} refused on an injected failure"
    assert C._manager_fingerprint(mm) == before


def test_an_allocation_that_skips_an_injected_failure_fails_the_audit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 19, new family, seed 15: ``alloc_mamba`` meeting a pending failure only when two are pending (its
    injection off by one). Admission then fails on the KV allocation after it instead, so no step of the system
    machine tells; the audit injects one failure before each allocation entry point."""
    real = MemoryManager.alloc_mamba

    def alloc_mamba(self: MemoryManager, owner: Any) -> Any:
        if self.fail_next == 1:  # BUG: one pending failure is not met here
            self.fail_next, kept = 0, self.fail_next
            try:
                return real(self, owner)
            finally:
                self.fail_next = kept
        return real(self, owner)

    monkeypatch.setattr(MemoryManager, "alloc_mamba", alloc_mamba)
    C.injection_audit(_running_manager(False))  # NOTE: no Mamba pool: nothing to skip
    with pytest.raises(AssertionError, match="an injected failure fails the next allocation: alloc_mamba with a"):
        C.injection_audit(_running_manager(True))


def test_a_call_that_takes_free_slots_past_a_pending_failure_is_caught() -> None:
    """A call on a copy that began with a failure injected and pending, took free KV or Mamba slots and left the
    failure pending skipped an injection (``_spent_if_it_took``); one that spent it, or took nothing, did not."""
    mm = _running_manager(True)
    mm.fail_next = 1
    took = deepcopy(mm)
    took.fail_next = 0
    took.alloc_mamba(request(77))  # NOTE: a state taken...
    took.fail_next = 1  # ... and the failure left pending
    with pytest.raises(AssertionError, match=r"an injected failure fails the next allocation: .* free mamba slots"):
        C._spent_if_it_took(mm, took, "alloc_mamba")
    spent = deepcopy(took)
    spent.fail_next = 0
    C._spent_if_it_took(mm, spent, "alloc_mamba")  # the failure was spent: no finding
    C._spent_if_it_took(mm, deepcopy(mm), "a read")  # nothing taken: no finding


def test_a_rollback_that_forgets_the_sessions_prefix_fails_the_audit(monkeypatch: pytest.MonkeyPatch) -> None:
    """``unresume`` must give the session back its committed prefix with the row; one that keeps only the row
    leaves a session that holds KV it no longer counts as committed."""
    from kvledger.impl.session import Sessions

    real = Sessions.unresume

    def unresume(self: Sessions, req: Any) -> None:
        slot = self.slots[req.session]
        real(self, req)
        slot.tokens, slot.committed_len = (), 0  # BUG: the committed prefix is not given back

    monkeypatch.setattr(Sessions, "unresume", unresume)
    with pytest.raises(AssertionError, match="admission rolls back: session 1's second turn"):
        C.rollback_audit(_running_manager(False))


@pytest.mark.parametrize("junk", [b"\x01" + bytes(7), bytearray(8), memoryview(bytes(8)), {1, 2}, {1: 1}])
def test_a_key_that_is_a_buffer_or_unordered_is_refused_by_the_reference(junk: object) -> None:
    c = _cached()
    before = C._cache_fingerprint(c)
    with pytest.raises(CacheError, match="expected a 1-D integer tensor or a sequence of token ids"):
        c.match_prefix(junk)  # type: ignore[arg-type]
    assert C._cache_fingerprint(c) == before


def test_a_key_check_that_reads_a_buffer_as_ids_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    import kvledger.impl.radix as radix
    import kvledger.impl.tree as tree

    real = tree.key_bytes

    def lax(op: str, t: Any) -> Any:
        return bytes(t) if isinstance(t, bytes | bytearray | memoryview) else real(op, t)  # BUG: a buffer read as ids

    monkeypatch.setattr(tree, "key_bytes", lax)
    monkeypatch.setattr(radix, "key_bytes", lax, raising=False)
    fails("token", C.cache_scenario, "inv_domain_enforced")


def test_a_fingerprint_without_its_position_range_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    import kvledger.impl.integrity as integrity

    monkeypatch.setattr(C, "fingerprint", integrity.fingerprint_unchecked)  # BUG: no checks at all
    fails("token", C.cache_scenario, "inv_domain_enforced")


def test_a_pool_that_remembers_a_hand_out_after_the_slots_changed_hands_fails_the_audit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The pool's memo of its last alloc lets a free of exactly those slots skip reading their tags; a claim that
    hands some of them over and keeps the memo lets their old owner free slots the cache now holds."""
    from kvledger.impl.slots import SlotPool

    real = SlotPool.claim

    def claim(self: SlotPool, *args: Any, **kwargs: Any) -> bool:
        memo = self._last
        got = real(self, *args, **kwargs)
        self._last = memo  # BUG: the memo outlives the hand-over
        return got

    monkeypatch.setattr(SlotPool, "claim", claim)
    want = r"self-checks agree with the state: req:98.s slots .*, cached whole, then freed"
    with pytest.raises(AssertionError, match=want):
        C.cache_audit(_cached())


def test_an_insert_that_caches_slots_whose_window_moved_past_them_fails_the_audit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A fresh owner's slots whose SWA slots it freed (the window moved past them) cannot be cached as new
    positions: the cache audit hands them over that way on a copy and wants the insert refused."""
    from kvledger.impl.kvview import KVView

    c = _cached("swa")
    assert C.cache_audit(c).startswith("cache audit: ")
    monkeypatch.setattr(KVView, "check_swa_live", lambda self, op, idx: None)  # BUG: the SWA-live check dropped
    want = r"self-checks agree with the state: req:98.s slots .*, SWA slots freed, then cached by it: None"
    with pytest.raises(AssertionError, match=want):
        C.cache_audit(c)


def test_a_decode_that_reads_a_tag_no_encode_writes_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Owner tags are probed as a reading call: a tag outside int64, or one naming a component where its kind has
    none, must be refused, typed."""
    from kvledger.impl import owners

    real = owners.decode

    def lenient(tag: int) -> object:
        # BUG: a tag past int64 read as a free slot, as an unchecked cast would
        return None if isinstance(tag, int) and not isinstance(tag, bool) and abs(tag) >= 2**63 else real(tag)

    monkeypatch.setattr(C, "decode", lenient)
    msg = fails("token", C.cache_scenario, "inv_domain_enforced", examples=200)
    assert "decode(" in msg and "was accepted" in msg, msg


def test_decode_refuses_every_tag_no_encode_writes() -> None:
    from kvledger.impl.owners import decode

    for tag in C.TAG_EDGES:
        assert not C._is_tag(tag)
        with pytest.raises(KVLedgerError):
            decode(tag)  # type: ignore[arg-type]
    for o in (request(3), Owner(OwnerKind.NODE, 5, Component.SWA)):
        assert C._is_tag(encode(o)) and decode(encode(o)) == o


@pytest.mark.parametrize("start", [1.5, True])
def test_a_free_tail_that_takes_a_junk_start_is_caught(monkeypatch: pytest.MonkeyPatch, start: object) -> None:
    """``free_tail`` with a start that is no row position (a float, a bool): the reference refuses it, unchanged;
    without its argument check it frees the tail from position 1 or crashes untyped."""
    mm = build_manager(SystemConfig(kv_tokens=16, rows=3, max_context=12))
    mm.sessions.open(1)
    req = mm.add_request((1, 2, 3), session=1)
    admit(mm, [req], Budget(24, 1))
    mm.finish(req)  # NOTE: the session holds the turn's row and KV
    scenario = C.manager_scenario_of(mm, ["a session's first turn finished"])
    method = {m.what: m for m in scenario.methods}["sessions.free_tail"]
    slot = mm.sessions.slots[1]
    C.judge(scenario, method, {"slot": slot, "start": start}, inside=False)

    def lenient(self: Sessions, slot: SessionSlot, start: int) -> None:
        if slot.row is not None and slot.alloc_len > start:
            self.mm.kv.free(self.mm.rows.table[slot.row, start : slot.alloc_len].clone(), slot.owner)
        slot.alloc_len = min(slot.alloc_len, start)

    monkeypatch.setattr(Sessions, "free_tail", lenient)
    scenario = C.manager_scenario_of(mm, ["a session's first turn finished"])
    method = {m.what: m for m in scenario.methods}["sessions.free_tail"]
    with pytest.raises(AssertionError, match=r"inv_domain_enforced|rejected call leaves state unchanged"):
        C.judge(scenario, method, {"slot": slot, "start": start}, inside=False)


def test_a_session_call_that_takes_another_managers_slot_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A copy of an open session's slot is not that session: ``release_state`` without its ownership check frees
    the state the copy names, and the session is left pointing at freed slots."""
    mm = build_manager(SystemConfig(kv_tokens=16, rows=3, max_context=12, mamba=True, mamba_slots=4))
    mm.sessions.open(1)
    req = mm.add_request((1, 2, 3), session=1)
    admit(mm, [req], Budget(24, 1))
    mm.finish(req)
    slot = mm.sessions.slots[1]
    assert slot.mamba is not None
    scenario = C.manager_scenario_of(mm, ["a session's first turn finished"])
    method = {m.what: m for m in scenario.methods}["sessions.release_state"]
    twin = copy(slot)
    C.judge(scenario, method, {"slot": twin}, inside=False)

    def lenient(self: Sessions, slot: SessionSlot) -> None:
        if slot.mamba is not None:
            self.mm.free_mamba(slot.owner, slot.mamba)
            slot.mamba = None

    monkeypatch.setattr(Sessions, "release_state", lenient)
    scenario = C.manager_scenario_of(mm, ["a session's first turn finished"])
    method = {m.what: m for m in scenario.methods}["sessions.release_state"]
    with pytest.raises(AssertionError, match=r"invalid call accepted|rejected call leaves state unchanged|inv_domain"):
        C.judge(scenario, method, {"slot": twin}, inside=False)


def test_the_log_audit_holds_on_the_reference_and_changes_nothing() -> None:
    mm = _full_with_evictable()
    before = (C._manager_fingerprint(mm), dict(mm.events), mm.events_keep)
    assert C.log_audit(mm, "law").startswith("log audit: ")
    assert (C._manager_fingerprint(mm), dict(mm.events), mm.events_keep) == before


def test_a_log_that_never_forgets_fails_the_audit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(MemoryManager, "_prune_events", lambda self: None)  # BUG: the log grows with every operation
    with pytest.raises(AssertionError, match=r"law: the event log holds \d+ events .* it does not forget"):
        C.log_audit(_full_with_evictable(), "law")


def test_a_log_that_forgets_a_named_event_fails_the_audit(monkeypatch: pytest.MonkeyPatch) -> None:
    def prune(self: MemoryManager) -> None:
        self.events = {k: v for k, v in self.events.items() if k == self._step}  # BUG: forgets what slots name

    monkeypatch.setattr(MemoryManager, "_prune_events", prune)
    with pytest.raises(AssertionError, match=r"law: events \[.*\], which slots' provenance names, were forgotten"):
        C.log_audit(_full_with_evictable(), "law")


def _deciding(op: str) -> C.Draw:
    """A draw that picks operation ``op`` (on the first request it may act on) from the provenance audit's choices."""

    def draw(strategy: Any) -> Any:
        return next(p for p in getattr(strategy, "elements", ()) if p[0] == op)

    return draw


@pytest.mark.parametrize("op", ["finish", "extend", "retract", "abort"])
def test_the_provenance_audit_holds_on_the_reference_and_changes_nothing(op: str) -> None:
    mm = _running_manager(False)
    before = C._manager_fingerprint(mm)
    assert C.provenance_audit(mm, _deciding(op), "law").startswith("provenance audit: ")
    assert C._manager_fingerprint(mm) == before


def test_an_operation_that_logs_no_event_fails_the_provenance_audit(monkeypatch: pytest.MonkeyPatch) -> None:
    """``finish`` that logs nothing: the slots it hands the tree keep the stamp of the operation before it."""
    real = MemoryManager.event
    silent = lambda self, op, who: self._step if op == "finish" else real(self, op, who)  # noqa: E731
    monkeypatch.setattr(MemoryManager, "event", silent)
    with pytest.raises(AssertionError, match=r"law: finish of request \d+ gave \w+ slots .* owners, logging \[\]"):
        C.provenance_audit(_running_manager(False), _deciding("finish"), "law")


def test_an_operation_that_stamps_the_wrong_slots_fails_the_provenance_audit(monkeypatch: pytest.MonkeyPatch) -> None:
    """An extend whose new slot keeps the stamp of an older event (the stamp set after the allocation)."""
    real = MemoryManager.extend

    def extend(self: MemoryManager, req: Any, new_tokens: tuple[int, ...], ahead: int = 0) -> None:
        step = self._step
        real(self, req, new_tokens, ahead)
        for p in self.pools().values():
            p.origin[p.origin == self._step] = step  # BUG: what extend handed out names the event before it

    monkeypatch.setattr(MemoryManager, "extend", extend)
    with pytest.raises(AssertionError, match=r"law: extend of request \d+ \(event \d+\) gave"):
        C.provenance_audit(_running_manager(False), _deciding("extend"), "law")


def _mamba_session_manager() -> MemoryManager:
    mm = build_manager(SystemConfig(kv_tokens=16, rows=3, max_context=12, mamba=True, mamba_slots=4))
    mm.sessions.open(1)
    req = mm.add_request((1, 2, 3), session=1)
    admit(mm, [req], Budget(24, 1))
    mm.finish(req)
    assert mm.sessions.slots[1].mamba is not None
    return mm


def test_a_release_made_on_a_copy_balances_on_the_reference() -> None:
    mm = _mamba_session_manager()
    before = C._manager_fingerprint(mm)
    scenario = C.manager_scenario_of(mm, ["a session's first turn finished"])
    assert scenario.on_copy is not None
    for what, args in (("sessions.release_state", {"slot": mm.sessions.slots[1]}), ("close_session", {"sid": 1})):
        method = {m.what: m for m in scenario.methods}[what]
        assert method.releases and "the books balance" in scenario.on_copy(method, args)
    assert C._manager_fingerprint(mm) == before


def test_a_release_that_keeps_pointing_at_what_it_freed_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """``release_state`` that frees the session's state but keeps its reference: the copy's books do not balance."""

    def release(self: Sessions, slot: SessionSlot) -> None:
        self._own_slot("release_state", slot)
        if slot.mamba is not None:
            self.mm.free_mamba(slot.owner, slot.mamba)  # BUG: slot.mamba still names the freed slots

    monkeypatch.setattr(Sessions, "release_state", release)
    mm = _mamba_session_manager()
    scenario = C.manager_scenario_of(mm, ["a session's first turn finished"])
    assert scenario.on_copy is not None
    method = {m.what: m for m in scenario.methods}["sessions.release_state"]
    with pytest.raises(AssertionError, match=r"leak checker agrees with the ledgers: MemoryManager.sessions.release_"):
        scenario.on_copy(method, {"slot": mm.sessions.slots[1]})


def _with_an_unlocked_leaf() -> RadixCache:
    cache = RadixCache(TokenAllocator(12))
    owner = request(1)
    slots = cache.kv.alloc(3, owner)
    key = torch.tensor([1, 2, 3])
    cache.kv.write_fingerprint(slots, key, torch.arange(3))
    cache.insert(key, slots, owner)
    return cache


def test_the_stale_match_audit_holds_on_the_reference_and_changes_nothing() -> None:
    cache = _with_an_unlocked_leaf()
    before = C._cache_fingerprint(cache)
    assert C._stale_match(cache) == ""
    assert C._cache_fingerprint(cache) == before


def test_a_verify_of_an_evicted_match_that_is_accepted_fails_the_audit(monkeypatch: pytest.MonkeyPatch) -> None:
    """``verify`` that does not ask whether the match's node is still cached reads freed slots (a use after evict)."""
    real = RadixCache._check_live
    monkeypatch.setattr(RadixCache, "_check_live", lambda self, op, n: None if op == "verify" else real(self, op, n))
    assert "was evicted was accepted" in C._stale_match(_with_an_unlocked_leaf())
    with pytest.raises(AssertionError, match="self-checks agree with the state: verify of a match"):
        C.cache_audit(_with_an_unlocked_leaf())


def test_every_public_function_is_probed_or_set_aside_with_a_reason() -> None:
    """Each public function of ``kvledger.impl``'s modules is a scenario's method (``PROBED_FUNCTIONS``, found in a
    scenario under that name) or in ``NOT_PROBED_FUNCTIONS`` with a reason, not both; each name there is real."""
    names: set[str] = set()

    def collect(scenario: C.Scenario, data: st.DataObject) -> None:
        names.update(m.what for m in scenario.methods)

    over_scenarios(60, collect)
    public = set()
    for info in pkgutil.iter_modules(kvledger.impl.__path__):
        mod = importlib.import_module(f"kvledger.impl.{info.name}")
        public |= {
            f"{info.name}.{name}"
            for name, f in inspect.getmembers(mod, inspect.isfunction)
            if not name.startswith("_") and f.__module__ == mod.__name__
        }
    probed, set_aside = set(C.PROBED_FUNCTIONS), set(C.NOT_PROBED_FUNCTIONS)
    assert not public - probed - set_aside, sorted(public - probed - set_aside)
    assert probed | set_aside <= public, sorted((probed | set_aside) - public)
    assert not probed & set_aside, sorted(probed & set_aside)
    assert set(C.PROBED_FUNCTIONS.values()) <= names, sorted(set(C.PROBED_FUNCTIONS.values()) - names)
    assert all(len(why) > 20 for why in C.NOT_PROBED_FUNCTIONS.values())


@pytest.mark.parametrize("what", ["remove", "more_recent"])
def test_a_list_call_that_skips_its_node_check_fails_the_audit(monkeypatch: pytest.MonkeyPatch, what: str) -> None:
    """A call that takes its node to the membership test unchecked misnames a non-node (``NotInList``) or crashes
    on one that cannot be hashed; the audit gives each call that takes a node every kind of non-node."""
    from kvledger.impl import lru

    real, ops = lru._check_node, {what, f"lru_{what}"}
    monkeypatch.setattr(lru, "_check_node", lambda op, comp, node: None if op in ops else real(op, comp, node))
    with pytest.raises(AssertionError, match=rf"inv_domain_enforced: full list: {what} of .* not UnknownNode"):
        C.lru_audit(_locked(), _first_choice)


def test_a_tag_of_a_node_id_past_the_tag_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """``node_tag`` of an id with no room in a tag would tag another node's slots: the probe wants it refused."""
    from kvledger.impl import owners

    monkeypatch.setattr(owners, "node_tag", lambda ident: owners._NODE_FULL | int(ident))  # BUG: no range check
    monkeypatch.setattr(C, "node_tag", owners.node_tag)
    msg = fails("token", C.cache_scenario, "inv_domain_enforced")
    assert "node_tag" in msg


def test_a_long_key_check_that_refuses_token_zero_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A check that takes another path for long keys (here numpy's ``min``) meets only keys past its cut-off; the
    cache audit's long keys hold the smallest id, which a bound off by one refuses."""
    from kvledger.impl import tree

    real = tree.key_bytes

    def strict(op: str, t: object) -> bytes | bytearray:
        raw = real(op, t)
        if len(raw) >= tree._SIGN_LONG and int(np.frombuffer(raw, np.int64).min()) <= 0:  # BUG: `> 0`, not `>= 0`
            raise CacheError(f"{op}: token ids must be >= 0")
        return raw

    monkeypatch.setattr(tree, "key_bytes", strict)
    assert _locked().match_prefix(torch.tensor([0, 9, 9])).length == 0  # NOTE: a short key with a 0 is still taken
    with pytest.raises(AssertionError, match=r"inv_domain_enforced: match_prefix of a key of 10000 tokens"):
        C.cache_audit(_locked())


def test_a_long_key_matched_past_its_cached_head_fails_the_audit(monkeypatch: pytest.MonkeyPatch) -> None:
    """A long key's rest is cached nowhere: a match of it that reaches further than its head's breaks the law."""
    real = RadixCache.match_prefix

    def longer(self: RadixCache, key: Any) -> Any:
        m = real(self, key)
        if len(key) >= C.LONG_KEY and m.length:
            return real(self, key[: m.length - 1])  # BUG: a long key is matched one page short
        return m

    monkeypatch.setattr(RadixCache, "match_prefix", longer)
    with pytest.raises(AssertionError, match=r"results equal the spec's: match_prefix of a key of 10000 tokens"):
        C.cache_audit(_locked())


def test_a_covering_count_kept_stale_after_a_lock_fails_the_cache_audit(monkeypatch: pytest.MonkeyPatch) -> None:
    """``handles_covering`` answers from a count it keeps between calls; a lock that does not refresh it answers the
    count from before the lock (mutation seed 24)."""
    from kvledger.impl.locks import LockTable

    c = _cached()
    assert C._covering_answers(c) == ""
    real = LockTable.issue

    def issue(self: LockTable, node_id: Any, counters: Any) -> Any:
        index = self._index
        h = real(self, node_id, counters)
        self._index = index  # BUG: the count kept between calls is not refreshed
        return h

    monkeypatch.setattr(LockTable, "issue", issue)
    with pytest.raises(AssertionError, match=r"self-checks agree with the state: handles_covering\(\d+, full\) after"):
        C.cache_audit(c)


def test_a_page_size_that_is_no_power_of_two_is_checked_on_its_own_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """A paged pool's scenarios draw a page size that is not a power of two too (its page numbers are divisions,
    not shifts): an eviction that takes the shift's path for every page size fails the room audit there (mutation
    seed 26)."""
    from kvledger.impl.kvview import KVView

    assert any(p & (p - 1) for p in C.PAGE_SIZES), "no page size that is not a power of two is drawn"
    mm = build_manager(SystemConfig(page_size=3, kv_tokens=15, rows=3, max_context=12))
    req = mm.add_request((1, 2, 3, 4, 5, 6, 7))
    admit(mm, [req], Budget(24, 1))
    mm.finish(req)
    mm.alloc_kv(request(50), mm.kv.available_size())
    assert "tokens with 0 free" in C.room_audit(mm)

    def shifted(self: KVView, slots: Any) -> Any:
        ids = np.frombuffer(slots, np.int64)
        return ids if self.grain == 1 else ids[:: self.grain] >> self._shift  # BUG: a shift for any page size

    monkeypatch.setattr(KVView, "_host_units", shifted)
    with pytest.raises(AssertionError, match=r"alloc evicts before it refuses: alloc_kv of \d+ tokens"):
        C.room_audit(mm)


def _pick_counts(pick: Callable[[C.Scenario, st.DataObject, list[int]], int], n: int = 40) -> list[int]:
    """How often each of ``n`` choices is taken by ``pick``, over 200 derandomised examples of 10 picks each, each
    example on a scenario whose story differs (as built scenarios' do)."""
    counts = [0] * n

    @settings(max_examples=200, derandomize=True, database=None, deadline=None, phases=[Phase.generate])
    @given(st.data())
    def run(data: st.DataObject) -> None:
        story = [f"built from {data.draw(st.lists(st.integers(0, 9), max_size=4))}"]
        scenario = C.Scenario("toy", (), lambda: None, story)
        for _ in range(10):
            counts[pick(scenario, data, list(range(n)))] += 1

    run()
    return counts


def test_a_fair_pick_does_not_favour_the_first_choice() -> None:
    """Hypothesis draws index 0 far more often than any other; a plain ``sampled_from`` of the methods gives the
    first listed that share, ``fair_pick`` spreads it over all of them (its turn slot)."""
    plain = _pick_counts(lambda _s, data, xs: data.draw(st.sampled_from(xs)))
    fair = _pick_counts(lambda s, data, xs: C.fair_pick(s, data.draw, xs, "probe"))
    assert plain[0] > 2.5 * sum(plain) / len(plain), plain  # NOTE: the bias this is for (3.3x the mean here)
    mean = sum(fair) / len(fair)
    assert fair[0] < 1.5 * mean and max(fair) < 2.5 * mean, fair  # NOTE: 1.06x and 1.9x here


def test_a_fair_pick_replays_the_same_choices_from_the_same_draws() -> None:
    """The turn slot's choice depends only on the scenario's story and what was drawn before: the same draws give
    the same picks (a failing example replays, and shrinks, as found)."""
    draws = iter([0, 0, 3, 0, 7, 0] * 2)

    def draw(_strategy: object) -> object:
        return next(draws)

    def picks() -> list[int]:
        scenario = C.Scenario("toy", (), lambda: None, ["built from [1, 2]"])
        return [C.fair_pick(scenario, draw, list(range(9)), "probe") for _ in range(6)]

    first, again = picks(), picks()
    assert first == again and first[2] == 2 and first[4] == 6, first
    assert len({first[0], first[1], first[3], first[5]}) == 4, first  # NOTE: the turn slot takes each in turn


def test_a_write_by_a_request_without_a_row_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """``write_kv``'s end is drawn up to the request's own limit (its slots and tokens, if it holds a row: else 0)
    and one past it: a write that forgets that a request without a row can write nothing (accepting an end an
    engine would pass, not only an absurd one) is met."""
    original = MemoryManager.write_kv

    def write(self: MemoryManager, req: Any, start: Any, end: Any) -> None:
        self.own("write_kv", req)
        if type(start) is int and type(end) is int and 0 <= start < end < 1 << 63 and req.row is None:
            return  # BUG: a request with no row and a plausible end: nothing written, nothing refused
        original(self, req, start, end)

    monkeypatch.setattr(MemoryManager, "write_kv", write)
    fails("token", C.manager_scenario, "inv_domain_enforced: MemoryManager.write_kv(", examples=1200)


def test_a_value_crossed_to_every_call_that_takes_it_meets_a_check_one_call_forgot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``cross`` gives one value of an argument several calls take to each of them: a key with a negative token past
    its first tokens (a junk key of ``match_prefix``'s catalogue) reaches ``verify``, whose own catalogue has no such
    key. A ``verify`` that checks only the matched tokens of its key accepts it (the reference refused nothing there
    either, until the cross sweep met it)."""
    from kvledger.impl.tree import MatchResult

    original = RadixCache.verify

    def verify(self: RadixCache, match: Any, key: Any) -> None:
        if isinstance(match, MatchResult) and isinstance(key, torch.Tensor) and key.dim() == 1 and match.length:
            key = key[: match.length]  # BUG: the tokens past the match go unchecked
        original(self, match, key)

    monkeypatch.setattr(RadixCache, "verify", verify)

    @settings(max_examples=300, derandomize=True, database=None, deadline=None, phases=[Phase.generate])
    @given(st.data())
    def check(data: st.DataObject) -> None:
        scenario = C.cache_scenario("token", data.draw)
        for _ in range(4):
            C.cross(scenario, data.draw)

    with pytest.raises(AssertionError, match=r"inv_domain_enforced: RadixCache\.verify"):
        check()


def _catalogue(method: C.Method, name: str) -> tuple[object, ...]:
    """The values of ``method``'s sweep catalogue for argument ``name`` (one that needs no earlier argument)."""
    edges = method.args[name].edges
    assert edges is not None, f"{method.what}'s {name} has no catalogue"
    return tuple(edges({}))


def _judge_catalogue(scenario: C.Scenario, method: C.Method, name: str) -> Callable[[], None]:
    """A sweep made by hand: each value of ``method``'s ``name`` catalogue that lies outside the domain, the other
    arguments valid, held to the law (``C.judge``: refused, typed, nothing changed)."""

    def judged() -> None:
        for v in _catalogue(method, name):
            got, inside, missing = C._draw_args(method, _first_choice, name, lambda _a, _d, v=v: st.just(v))
            if missing is None and not inside:
                C.judge(scenario, method, got, inside)

    return judged


def _token_call(call: str) -> tuple[C.Scenario, C.Method, str]:
    """A manager holding one running request, its public ``call`` (``add_request`` or ``extend``) and the name of
    that call's token-id argument."""
    mm = build_manager(SystemConfig(kv_tokens=16, rows=3, max_context=12))
    req = mm.add_request((1, 2))
    admit(mm, [req], Budget(24, 1))
    scenario = C.manager_scenario_of(mm)
    (method,) = [m for m in scenario.methods if m.what == call]
    return scenario, method, "tokens" if call == "add_request" else "new_tokens"


def test_an_extend_of_a_resumed_turn_still_waiting_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A session turn resumed and not yet admitted holds a row but is not running: ``extend`` must refuse it. Every
    request argument's sweep catalogue (what ``sweep`` and ``cross`` give) holds one request per stage of life, so
    that stage reaches ``extend``; one that checks the row but not the status (seed 33's class) is caught."""
    from kvledger.impl.requests import Status

    mm = build_manager(SystemConfig(kv_tokens=16, rows=3, max_context=12))
    mm.sessions.open(0)
    turn = mm.add_request((1, 2), session=0)
    mm.sessions.resume(turn)
    assert turn.status is Status.WAITING and turn.row is not None
    scenario = C.manager_scenario_of(mm)
    (ext,) = [m for m in scenario.methods if m.what == "extend"]
    assert turn in _catalogue(ext, "req"), "the catalogue holds the resumed turn"
    judged = _judge_catalogue(scenario, ext, "req")
    judged()  # NOTE: the reference refuses every request outside extend's domain
    original = MemoryManager.extend

    def extend(self: MemoryManager, req: Any, new_tokens: Any, ahead: Any = 0) -> None:
        if req is turn:
            req.status = Status.RUNNING  # BUG: a turn that holds a row is extended as if it were running
            try:
                original(self, req, new_tokens, ahead)
            finally:
                req.status = Status.WAITING
            return
        original(self, req, new_tokens, ahead)

    monkeypatch.setattr(MemoryManager, "extend", extend)
    with pytest.raises(
        AssertionError, match=r"inv_domain_enforced: MemoryManager\.extend\(req=request \d+ \(waiting\)"
    ):
        judged()


def test_the_manager_scenario_leaves_requests_at_every_stage_of_life() -> None:
    """Each stage of a request's life (waiting, running, finished, aborted, and a session's turn resumed but still
    waiting) is in at least a quarter of the built manager scenarios: a call's law meets a rare stage only where a
    scenario holds it. Each request takes another move (a permutation) and a resume has a session open; with
    independent draws of the move a resumed turn still waiting was in one scenario in twenty (seed 33's ``extend``
    survivor, refused for no other stage, was then not met at the default budget)."""
    shares = stage_shares(request_stages, ("WAITING", "RUNNING", "FINISHED", "ABORTED", "resumed, waiting"))
    # NOTE: over eight seeds each stage is in 25 % of the scenarios or more: a fifth leaves a margin for moved draws
    assert min(shares.values()) >= 0.2, f"a stage of life is rare in the manager scenarios: {shares}"


def stage_shares(stages_of: Callable[[MemoryManager], set[str]], stages: tuple[str, ...]) -> dict[str, float]:
    """The share of 300 derandomised token manager scenarios that hold each of ``stages`` (``stages_of``)."""
    seen: dict[str, int] = {}
    built = 0

    @settings(max_examples=300, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
    @given(st.data())
    def build(data: st.DataObject) -> None:
        nonlocal built
        mm, _ = C._build_manager("token", data.draw)
        built += 1
        for stage in stages_of(mm):
            seen[stage] = seen.get(stage, 0) + 1

    build()
    return {stage: seen.get(stage, 0) / built for stage in stages}


def request_stages(mm: MemoryManager) -> set[str]:
    """The stages the manager's requests are at: their status, or a session's turn resumed but still waiting."""
    from kvledger.impl.requests import Status

    return {
        "resumed, waiting" if r.status is Status.WAITING and r.row is not None else r.status.name
        for r in mm.requests.values()
    }


def session_stages(mm: MemoryManager) -> set[str]:
    """The stages the manager's open sessions are at: idle (no memory, no turn), saved (memory kept between turns),
    lent to a turn that waits, lent to a turn that runs."""
    from kvledger.impl.requests import Status

    out = set()
    for slot in mm.sessions.slots.values():
        turn = mm.requests.get(slot.lent_to) if slot.lent_to is not None else None
        if turn is not None:
            out.add("turn running" if turn.status is Status.RUNNING else "turn waiting")
        else:
            out.add("saved" if slot.row is not None else "idle")
    return out


def test_the_manager_scenario_leaves_sessions_at_every_stage() -> None:
    """As requests are, sessions are left at each stage (idle, saved between turns, lent to a turn that waits, lent
    to a turn that runs: whose close must be refused) in enough scenarios for a call's law to meet each. Issue 19:
    with one session at most and no turn preferred, a saved session was in 2.7 % of the token scenarios (a turn
    running, in 9.3 %); now, over eight seeds, saved 15-35 %, a turn running 11-35 %, the others more."""
    shares = stage_shares(session_stages, ("idle", "saved", "turn waiting", "turn running"))
    assert min(shares.values()) >= 1 / 12, f"a stage of a session is rare in the manager scenarios: {shares}"


@pytest.mark.parametrize("call", ["add_request", "extend"])
def test_token_ids_given_as_a_buffer_or_a_tensor_are_caught(monkeypatch: pytest.MonkeyPatch, call: str) -> None:
    """The manager's token-id arguments get the keys' junk catalogue: the ids' bytes in each buffer type and the ids
    as tensors are no token sequence (``array("q", ...)`` reads a buffer's raw bytes, and a tensor's elements, as
    ints). A token check that lets them through (seed 34's ``and``/``or`` survivor in ``check_tokens``) is caught by
    the sweep of that argument; the old catalogue (lists, floats, a string) did not hold them."""
    from kvledger.impl import memory as memory_module
    from kvledger.impl.arguments import check_tokens

    scenario, method, name = _token_call(call)
    judged = _judge_catalogue(scenario, method, name)

    judged()  # NOTE: the reference refuses every one

    def weak(op: str, where: str, tokens: object, **kw: Any) -> tuple[int, ...]:
        if isinstance(tokens, bytes | bytearray | memoryview | torch.Tensor):
            return tuple(int(t) for t in (tokens.tolist() if isinstance(tokens, torch.Tensor) else tokens))  # BUG
        return check_tokens(op, where, tokens, **kw)

    monkeypatch.setattr(memory_module, "check_tokens", weak)
    with pytest.raises(AssertionError, match=rf"inv_domain_enforced: MemoryManager\.{call}\("):
        judged()


@pytest.mark.parametrize("call", ["add_request", "extend"])
def test_a_token_id_just_past_its_range_is_caught(monkeypatch: pytest.MonkeyPatch, call: str) -> None:
    """The manager's token-id catalogue holds the first id past the 31-bit range (``VALUE_END``, a KV fingerprint's
    domain), and the domain says so: a token check whose bound is one off (seed 42's ``max(ids) > hi``) is caught
    by the sweep of that argument."""
    from kvledger.impl import memory as memory_module
    from kvledger.impl.arguments import check_tokens

    scenario, method, name = _token_call(call)
    assert (1, C.VALUE_END) in _catalogue(method, name)
    judged = _judge_catalogue(scenario, method, name)

    judged()

    def off_by_one(op: str, where: str, tokens: object, **kw: Any) -> tuple[int, ...]:
        return check_tokens(op, where, tokens, **{**kw, "hi": C.VALUE_END + 1})  # BUG: the range's end let in

    monkeypatch.setattr(memory_module, "check_tokens", off_by_one)
    # NOTE: add_request takes the id (outside its domain, accepted); extend takes it and fails later, at the KV write
    # (a refusal that changed the state, or that names another culprit than the id): each law names the call
    law = r"(inv_domain_enforced: |rejected call leaves state unchanged: a rejected call, |inv_names_culprit: )"
    with pytest.raises(AssertionError, match=rf"{law}MemoryManager\.{call}\("):
        judged()


@pytest.mark.parametrize("call", ["add_request", "extend"])
def test_a_refusal_that_names_another_token_id_is_caught(monkeypatch: pytest.MonkeyPatch, call: str) -> None:
    """A refusal of token ids with one bad id names that id (``inv_names_culprit``, ``calls.bad_token``): a check
    that refuses the right call, typed, but names the smallest id instead of the one past the range (seed 40's
    ``max(ids)`` -> ``min(ids)`` in the message) misleads its reader, and the sweep of that argument says so."""
    from kvledger.impl import memory as memory_module
    from kvledger.impl.arguments import check_tokens
    from kvledger.spec.errors import InvalidArgument

    scenario, method, name = _token_call(call)
    judged = _judge_catalogue(scenario, method, name)
    judged()

    def misnamed(op: str, where: str, tokens: object, **kw: Any) -> tuple[int, ...]:
        got = check_tokens(op, where, tokens, **kw)
        if got and max(got) >= C.VALUE_END:
            raise InvalidArgument(op, where, (), f"token id {min(got)} outside [0, {C.VALUE_END})")  # BUG: min
        return got

    monkeypatch.setattr(
        memory_module,
        "check_tokens",
        lambda op, where, tokens, **kw: misnamed(op, where, tokens, **{**kw, "hi": C.VALUE_END + 1}),
    )
    with pytest.raises(AssertionError, match=rf"inv_names_culprit: MemoryManager\.{call}\(.*token id {C.VALUE_END}"):
        judged()


def test_every_mamba_state_the_prober_holds_is_inside_an_inserts_domain() -> None:
    """The cache scenario's prober may take every Mamba state left, not one: an insert offering any of them (not
    only the first) lies inside its domain, and the reference takes it. Regression: the insert's domain named only
    the first, so the reference's accepting the second was reported as ``inv_domain_enforced`` (a false finding
    of the checker, on the reference, with this round's catalogue draws)."""
    seen: list[int] = []

    @settings(max_examples=200, derandomize=True, database=None, deadline=None, phases=[Phase.generate])
    @given(st.data())
    def run(data: st.DataObject) -> None:
        c = C._build_cache("mamba", data.draw)
        arg = C._insert_method(c, 1).args["mamba_slot"]
        key = torch.tensor([4, 4])  # NOTE: token 4 is in no cached key: no state at its end
        for state in c.states:
            assert arg.inside(state, {"key": key}), (state, c.states)
        seen.append(len(c.states))

    run()
    assert max(seen) >= 2, seen  # NOTE: a prober holding more than one state was drawn


def test_a_call_rebound_to_a_copy_acts_on_the_copy_alone() -> None:
    """``rebound`` makes a scenario's call on a copy: a bound method and a closure (and a closure calling
    another) over copied objects act on the copies; a closure over something the copy did not take (a list made
    beside the object) cannot be rebound, and is refused (``None``: the caller builds the call again)."""
    from copy import deepcopy

    kv = TokenAllocator(8)
    beside: list[int] = []
    r = request(1)
    inner = lambda n: kv.alloc(n, r)  # noqa: E731
    calls = {
        "method": kv.alloc,
        "closure": lambda n, owner: kv.alloc(n, owner),
        "nested": lambda n, owner: inner(n),
    }
    for what, call in calls.items():
        memo: dict[int, object] = {}
        twin = deepcopy(kv, memo)
        again = C.rebound(call, memo)
        assert again is not None, what
        got = again(n=2, owner=r) if what != "method" else again(2, r)
        assert twin.available_size() == 6 and kv.available_size() == 8, what
        assert twin.pool.held_by(r).tolist() == sorted(got.tolist()), what
    memo = {}
    deepcopy(kv, memo)
    assert C.rebound(lambda n: beside.append(n), memo) is None
    assert C.rebound(TokenAllocator(8).alloc, memo) is None  # NOTE: bound to a pool the copy did not take
    assert C.rebound(print, memo) is None  # NOTE: no closure to read: not known to name nothing copied


def test_a_release_of_a_handle_never_issued_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """``dec_lock_ref``'s catalogue holds a live handle with each id of ``calls.NEVER_ISSUED`` (this cache's own
    table, an id it never gave out: 0, -1, 2**40). A lookup that answers nothing for such an id instead of refusing
    it leaves the release to run on no coverage."""
    from kvledger.impl.locks import LockTable

    real = LockTable.covered

    def covered(self: LockTable, op: str, handle: Any) -> Any:
        ours = type(getattr(handle, "id", None)) is int and handle.table == self.ident
        if ours and handle.id not in self._live and not 0 < handle.id < self._next:
            return ()  # BUG: an id never issued is taken for a handle that covers nothing
        return real(self, op, handle)

    run_probes("token", C.cache_scenario, 40, sweeps=3)  # NOTE: the reference holds
    monkeypatch.setattr(LockTable, "covered", covered)
    with pytest.raises(AssertionError) as got:
        run_probes("token", C.cache_scenario, 40, sweeps=3)
    assert "dec_lock_ref" in str(got.value), got.value


def test_an_array_of_another_typecode_taken_as_it_is_is_caught_by_the_sweep(monkeypatch: pytest.MonkeyPatch) -> None:
    """Token ids and keys in an ``array`` of another typecode are converted, not taken as they are: the catalogue
    of what is no token sequence holds an array of floats and an array of unsigned ids with one past int64 (new
    family, seed 18). A ``check_tokens`` that takes any array as its ids accepts the floats, and is caught."""
    from array import array

    import kvledger.impl.arguments as arguments
    import kvledger.impl.memory as memory

    real = arguments.check_tokens

    def lenient(op: str, where: str, tokens: object, **kw: Any) -> tuple[int, ...]:
        if type(tokens) is array:
            return tuple(tokens)  # BUG: an array's items taken as token ids, whatever their type
        return real(op, where, tokens, **kw)

    run_probes("token", C.manager_scenario, 60, sweeps=2)  # NOTE: the reference holds
    monkeypatch.setattr(memory, "check_tokens", lenient)
    with pytest.raises(AssertionError) as got:
        run_probes("token", C.manager_scenario, 60, sweeps=2)
    assert str(got.value).startswith(
        ("inv_domain_enforced", "invalid call accepted", "rejected call leaves state unchanged")
    ), got.value


def test_a_key_of_another_typecode_is_the_same_key() -> None:
    """The catalogue's valid edge keys include an ``array("i")``: a key check that refuses arrays of another
    typecode refuses a valid key. The reference reads it as the same key as the list."""
    from array import array

    kv = TokenAllocator(8)
    cache = RadixCache(kv)
    owner = request(1)
    cache.insert([5, 6, 2**31 - 1], kv.alloc(3, owner), owner)
    assert cache.match_prefix(array("i", [5, 6, 2**31 - 1])).length == 3
    assert any(type(k) is array and k.typecode == "i" for k in C.edge_key_values(3))


def test_a_running_list_that_answers_other_requests_fails_the_reads_audit(monkeypatch: pytest.MonkeyPatch) -> None:
    """``MemoryManager.running()`` takes no argument, so no sweep calls it; the reads audit (one of the manager
    scenario's audits) checks its answer against the requests' recorded statuses (new family, seed 19: a
    ``running()`` answering the requests that are not running survived)."""
    mm = _running_manager(False)
    mm.add_request((1, 2))  # NOTE: one waiting beside the running one
    assert C.reads_audit(mm) == "reads audit: 1 running"
    monkeypatch.setattr(
        MemoryManager, "running", lambda self: [r for r in self.requests.values() if r.status.value != "running"]
    )
    with pytest.raises(AssertionError, match=r"self-checks agree with the state: MemoryManager\.running\(\)"):
        C.reads_audit(mm)


def test_a_session_open_that_takes_the_first_id_past_its_range_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 19, new family, seed 20: ``Sessions.open`` with its bound one past ``MAX_IDENT + 1`` opens a session
    whose id no owner tag can hold. ``open_session``'s junk now includes the edges of its range, not only -1."""
    from kvledger.impl import session as S
    from kvledger.impl.owners import MAX_IDENT

    real = S.check_int

    def one_more(op: str, where: str, name: str, x: object, lo: int = 0, hi: int | None = None) -> int:
        if op == "open_session" and hi == MAX_IDENT + 1:
            hi += 1  # BUG: the first id past the range is taken
        return real(op, where, name, x, lo, hi)

    run_probes("token", C.manager_scenario, 100)  # the reference refuses it
    monkeypatch.setattr(S, "check_int", one_more)
    msg = fails("token", C.manager_scenario, "inv_domain_enforced", examples=1000)
    assert "open_session" in msg and str(MAX_IDENT + 1) in msg, msg


def resumed_turn(warm: bool) -> tuple[MemoryManager, Any]:
    """A small manager (rows warm or fresh) with a session's second turn resumed: fewer slots than tokens."""
    cfg = SystemConfig(page_size=1, mamba=False, kv_tokens=16, rows=3, max_context=12, mamba_slots=4)
    mm = build_manager(cfg)
    if warm:
        C._warm_rows(mm)
    mm.sessions.open(0)
    first = mm.add_request((1, 2, 3), session=0)
    admit(mm, [first], Budget(24, 1))
    mm.finish(first)
    turn = mm.add_request((1, 2, 3, 2, 2), session=0)
    mm.sessions.resume(turn)
    return mm, turn


@pytest.mark.parametrize("warm", [True, False])
def test_a_write_past_a_resumed_turns_slots_is_caught_on_warm_rows(monkeypatch: pytest.MonkeyPatch, warm: bool) -> None:
    """Issue 19, new family, seed 12: ``write_kv`` bounding its end by the larger of the request's slots and tokens.
    A resumed session turn holds fewer slots than tokens, so an end one past its slots passes, and the write reads
    the row past them: a stale id of a real slot in a warm engine, which it writes over. The manager scenario's rows
    start warm (``calls._warm_rows``); on a fresh table the same write meets the padding slot 0 and is refused, for
    the wrong reason, so the bug would not show."""
    mm, turn = resumed_turn(warm)
    assert turn.alloc_len < len(turn.tokens) and turn.row is not None
    scenario = C.manager_scenario_of(mm)
    method = next(m for m in scenario.methods if m.what == "write_kv")
    args = {"req": turn, "start": 0, "end": turn.alloc_len + 1}
    C.judge(scenario, method, args, inside=False)  # NOTE: the reference refuses it
    original = MemoryManager.write_kv

    def write_kv(self: MemoryManager, req: Any, start: int, end: int) -> None:
        if end > max(req.alloc_len, len(req.tokens)):  # BUG: max, not min
            original(self, req, start, end)
            return
        slots = self.rows.table[req.row, start:end]
        pos = torch.arange(start, end, dtype=torch.int64)
        self.kv.write_fingerprint(slots, torch.tensor(req.tokens[start:end], dtype=torch.int64), pos)

    monkeypatch.setattr(MemoryManager, "write_kv", write_kv)
    method = next(m for m in C.manager_scenario_of(mm).methods if m.what == "write_kv")
    if warm:
        with pytest.raises(AssertionError, match="inv_domain_enforced"):
            C.judge(scenario, method, args, inside=False)
    else:
        C.judge(scenario, method, args, inside=False)  # NOTE: refused at the padding slot: nothing to see


def test_a_sweep_of_an_end_meets_a_request_of_each_stage() -> None:
    """``write_kv``'s ends are drawn relative to the request (one past its own slots): a sweep of them fixes a
    request of each stage of life in turn (a resumed turn with fewer slots than tokens among them), not only the
    one drawn valid; a catalogue that stands alone (``start``) is swept once."""
    mm, turn = resumed_turn(warm=True)
    running = mm.add_request((3, 3), session=None)
    admit(mm, [running], Budget(24, 1))
    method = next(m for m in C.manager_scenario_of(mm).methods if m.what == "write_kv")
    fixed = [b.get("req") for b in C._bases(method, "end")]
    assert fixed[0] is None and turn in fixed and running in fixed
    assert C._bases(method, "start") == [{}]


def test_an_insert_of_a_key_not_whole_pages_that_crashes_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 19, new family, seed 12: ``RadixCache.insert`` without its refusal of a key that is not whole pages.
    With as many slots as tokens, the insert then reshapes them into pages and crashes (torch's ``RuntimeError``).
    The insert's key catalogue holds a key one token short of whole pages, and its valid value fits it."""
    original = RadixCache.insert

    def insert(self: RadixCache, key: Any, value: torch.Tensor, owner: Any, **kw: Any) -> Any:
        n = value.numel() if isinstance(value, torch.Tensor) else -1
        if self.page_size > 1 and n > 0 and n % self.page_size and len(C.tokens_of(key) or ()) == n:
            value.view(-1, self.page_size)  # BUG: no refusal of the key first (raises RuntimeError)
        return original(self, key, value, owner, **kw)

    monkeypatch.setattr(RadixCache, "insert", insert)
    assert "RuntimeError" in fails("paged", C.cache_scenario, "inv_domain_enforced")


def test_a_crossed_request_meets_the_edges_drawn_relative_to_it() -> None:
    """A cross gives a request of one stage to every call that takes it; the arguments after it whose catalogue is
    drawn relative to it (``write_kv``'s end: one past this request's slots) meet their edges with it too, and a
    catalogue that stands alone (``start``) is left to the sweeps."""
    mm, turn = resumed_turn(warm=True)
    method = next(m for m in C.manager_scenario_of(mm).methods if m.what == "write_kv")
    got = {"req": turn, "start": 0, "end": 0}
    assert turn.alloc_len + 1 in C._edges_relative(method.args["end"], got)
    assert not C._edges_relative(method.args["start"], got)


def test_an_insert_taking_a_cached_state_refused_as_not_owned_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 19, new family, seed 11: ``RadixCache.insert`` without its refusal of a Mamba state the tree holds at
    another key. The ownership check after it still refuses (the state is a node's), with ``NotOwner``; the spec
    (``spec.prefix.check_insert``) says ``SlotConflict``, a state cached elsewhere, and the insert's state catalogue
    holds the states the tree caches and asks for the spec's refusal."""
    original = RadixCache._check_state

    def check_state(self: RadixCache, key: Any, slot: int, owner: Owner) -> None:
        pool = self._pool("insert")
        holder = pool.pool.owner_of(slot)
        if holder is not None and holder.kind is OwnerKind.NODE:
            pool.pool.check_held("insert", torch.tensor([slot]), owner)  # BUG: the cached state is not named
        original(self, key, slot, owner)

    monkeypatch.setattr(RadixCache, "_check_state", check_state)
    assert "not SlotConflict" in fails("mamba", C.cache_scenario, "inv_domain_enforced")


@settings(max_examples=5, derandomize=True, database=None, deadline=None, phases=[Phase.generate])
@given(st.data())
def test_a_sweep_meets_every_argument_of_the_call_it_draws(data: st.DataObject) -> None:
    """Issue 19, new family, seed 11: a paged insert that skips its page-order check at page 2 only survived the
    default run, whose few page-2 caches never had the insert's slots swept (one argument of one call a sweep):
    its catalogue of slots not in page order depends on the state, so it must be met in each state the call is
    swept in. A sweep now meets each argument's catalogue of the call it draws, in turn."""
    scenario = C.cache_scenario("paged", data.draw)
    insert = tuple(m for m in scenario.methods if m.what == "insert")
    hypothesis.assume(insert)  # NOTE: a prober holding no slots has no insert to make
    what = C.sweep(C.Scenario(scenario.what, insert, scenario.fingerprint, scenario.story), data.draw)
    swept = [k for k, a in insert[0].args.items() if a.edges is not None]
    assert len(swept) > 1 and all(f"junk {k}" in what for k in swept), what


def test_an_admission_that_takes_anything_for_its_manager_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 19, new family, seed 21: ``admission.admit`` without its check that ``mm`` is a memory manager; a
    cache, a table or ``None`` then crashes it (an untyped ``AttributeError``). The module functions of the manager
    take the manager as an argument like any other, with a catalogue of junk (no manager, one of its parts, a
    scalar); ``rollback`` and ``release_attempt_state`` crashed the same way in the reference and check it now.
    (Given no request to admit, the broken admit even accepts ``None``.)"""
    from kvledger.impl import admission

    monkeypatch.setattr(admission, "_check_manager", lambda op, mm: None)  # BUG: any object taken for a manager
    assert "(mm=" in fails("token", C.manager_scenario, "inv_domain_enforced")


@settings(max_examples=20, derandomize=True, database=None, deadline=None, phases=[Phase.generate])
@given(st.data())
def test_the_sweeps_of_one_object_meet_distinct_calls_first(data: st.DataObject) -> None:
    """Issue 19, new family, seed 26: the object a sweep calls is built once per example and no sweep changes it,
    yet in a default run 64 sweeps of caches that could insert never drew the insert (the same call swept twice in
    one example, near-copies of one example drawing the same picks). A sweep now draws among the calls not yet
    swept on its object: as many sweeps as the object has calls meet each of them once."""
    scenario = C.cache_scenario(data.draw(st.sampled_from(["token", "paged", "mamba"])), data.draw)
    calls = {m.what for m in scenario.methods if any(a.edges is not None for a in m.args.values())}
    swept = [C.sweep(scenario, data.draw).split(":")[0] for _ in calls]
    assert len(set(swept)) == len(calls), swept


def test_a_sweep_meets_a_later_argument_with_a_rare_valid_first_one() -> None:
    """Issue 19, new family, seed 26: a paged insert whose fast path took any whole pages for fresh ones (not
    repeated) accepted one page twice, but only for a key all new: on the cached key Hypothesis draws first, the
    repeated page is refused by the comparison with the cached one. A sweep of a later argument fixes the first to
    one valid value of its catalogue (a key all new) or to nothing, drawn."""
    drawn: list[object] = []

    @settings(max_examples=30, derandomize=True, database=None, deadline=None, phases=[Phase.generate])
    @given(st.data())
    def run(data: st.DataObject) -> None:
        scenario = C.cache_scenario("paged", data.draw)
        insert = next((m for m in scenario.methods if m.what == "insert"), None)
        hypothesis.assume(insert is not None)
        assert insert is not None
        for base in C._bases(insert, "value", scenario, data.draw):
            drawn.append(base.get("key"))

    run()
    new = [k for k in drawn if isinstance(k, torch.Tensor) and k.numel() and bool((k == 4).all())]
    assert None in drawn and new, drawn


def test_a_paged_insert_that_takes_whole_pages_for_fresh_ones_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 19, new family, seed 26: ``KVView.take`` believing any whole pages were one alloc's result (distinct)
    lets an insert of a key all new take one of its pages twice: the same slots then sit at two positions."""
    from kvledger.impl.allocators import PagedAllocator

    def fresh_pages(self: PagedAllocator, raw: bytes | bytearray) -> Any:
        got = self.whole_pages(torch.frombuffer(bytearray(raw), dtype=torch.int64)) if raw else None
        return None if got is None else got.numpy()  # BUG: whole pages taken for a fresh alloc's (distinct) pages

    monkeypatch.setattr(PagedAllocator, "fresh_pages", fresh_pages)
    assert "accepted" in fails("paged", C.cache_scenario, "inv_domain_enforced")


def test_the_cache_prober_holds_the_pools_first_slots_often() -> None:
    """Issue 19, new family, seed 28: an SWA insert's ownership check that dropped SWA slot 1 (the first real slot)
    instead of 0 (the sentinel for "none") survived ``--profile thorough``: the prober allocated after the cached
    sequences, which took the pools' first slots, so it held SWA slot 1 in 8 of 100 scenarios. It now allocates
    first in about half of them."""
    first = {"token": 0, "swa": 0}

    @settings(max_examples=100, derandomize=True, database=None, deadline=None, phases=[Phase.generate])
    @given(st.data())
    def run(data: st.DataObject) -> None:
        c = C._build_cache("swa", data.draw)
        first["token"] += 1 in c.held
        first["swa"] += bool(c.held) and 1 in c.cache.kv.translate(torch.tensor(c.held)).tolist()

    run()
    assert first["token"] >= 25 and first["swa"] >= 25, first  # NOTE: 47 and 36 here; 5 and 8 before


def test_an_swa_insert_check_that_skips_swa_slot_one_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 19, new family, seed 28: ``KVView.check_held`` filtering its SWA slots with ``!= 1`` where ``!= 0`` (the
    sentinel) is meant: an insert of a token whose SWA slot 1 another holder took is accepted, and one of a cached
    position whose SWA slot left the window (0) is refused."""
    from kvledger.impl.allocators import swa_owner
    from kvledger.impl.kvview import KVView

    def check_held(self: KVView, value: torch.Tensor, offered: torch.Tensor, owner: Owner) -> None:
        idx = value[offered]
        if not idx.numel():
            return
        self.check_pages("insert", value)
        self.pool.check_held("insert", self.units("insert", idx), owner)
        if self.swa is not None:
            live = self.swa.translate(idx)
            live = live[live != 1]  # BUG: the first real SWA slot taken for the sentinel
            if live.numel():
                self.swa.swa.pool.check_held("insert", live, swa_owner(owner))

    monkeypatch.setattr(KVView, "check_held", check_held)
    # NOTE: that insert accepted, or a valid one refused (SWA 0); met at examples 32 to 397 by seeds 0 to 2 and the
    # derandomised run once every finite junk became a catalogue (twenty-eighth round): a budget of 1.5 times that
    fails("swa", C.cache_scenario, "inv_domain_enforced", examples=600)


def test_an_argument_with_finite_junk_is_swept_through_all_of_it() -> None:
    """An argument whose junk is a finite sample names no catalogue of its own: the sample is its catalogue, so a
    sweep meets each value (a ``sampled_from`` junk used to be met by one-at-a-time probes only)."""
    arg = C._arg(None, stable.sampled_from([True, 1.5]) | stable.just(None), lambda _x: False)
    assert arg.edges is not None and tuple(arg.edges({})) == (True, 1.5, None)
    assert C._arg(None, st.integers(0, 3), lambda _x: False).edges is None  # a range names no catalogue
    assert tuple(C._arg(None, stable.sampled_from([1]), lambda _x: False, edges=[2]).edges({})) == (2,)


def test_a_node_id_check_that_takes_a_bool_for_an_int_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 19, new family, seed 34: ``RadixCache.handles_covering`` without its type check answers ``True`` as
    node 1 (``True == 1`` hashes alike) and ``None`` as no node. Its ``ident``'s junk was a ``sampled_from`` with
    no catalogue, so no sweep met it, and the default check's probes, drawing one kind of junk at a time, missed it
    (here the derandomised probes meet it at example 1 with the catalogue, 24 without)."""
    from kvledger.impl.radix import RadixCache
    from kvledger.spec.types import NodeId

    def handles_covering(self: RadixCache, ident: int, comp: Any) -> int:
        return self._locks.covering(NodeId(ident), self._component("handles_covering", comp))  # BUG: no type check

    monkeypatch.setattr(RadixCache, "handles_covering", handles_covering)
    fails("full", C.cache_scenario, "inv_domain_enforced")


@pytest.mark.parametrize("kind", ["token", "paged"])
def test_a_mamba_call_on_a_manager_without_mamba_that_goes_on_is_caught(
    monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """Issue 19, new family, seed 35: ``free_mamba`` on a manager with no Mamba pool, its ``ComponentDisabled``
    dropped, goes on to an untyped assertion (or another refusal). The manager prober called the Mamba calls only
    on managers with states; it now calls them on one without too, where every such call is refused."""
    real = MemoryManager.free_mamba

    def free_mamba(self: MemoryManager, owner: Any, m: Any) -> None:
        if self.mamba is None:
            self._free_mamba_slots(owner, m.slots() if isinstance(m, MambaAlloc) else ())  # BUG: no refusal first
        real(self, owner, m)

    monkeypatch.setattr(MemoryManager, "free_mamba", free_mamba)
    fails(kind, C.manager_scenario, "inv_domain_enforced")


@pytest.mark.parametrize("kind", ["token", "paged", "swa", "mamba"])
def test_aliased_keys_hold_on_a_healthy_cache(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each narrower width of a cached key's bytes is read as its ids, on every kind of cache (the audit found room
    to try at least one width), and the cache audited is left as it was."""
    c = _locked(kind) if kind == "token" else _cached(kind)
    before = C._cache_fingerprint(c)
    tried: list[object] = []
    real = C._alias_answers
    monkeypatch.setattr(C, "_alias_answers", lambda *a, **k: tried.append(a[2].typecode) or real(*a, **k))
    assert C._aliased_keys(c) == ""
    assert C._cache_fingerprint(c) == before
    assert "i" in tried and "q" in tried, tried


@pytest.mark.parametrize("kind", ["token", "paged"])
def test_a_full_pool_still_has_every_width_matched(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """With no free slot for an insert, each narrower width is still given to ``match_prefix`` (no width skipped),
    and a match that reads a narrower key's bytes as the key just matched fails the audit there."""
    c = _locked() if kind == "token" else _cached(kind)
    c.kv.alloc(c.kv.available_size(), request(55))
    assert c.kv.available_size() == 0
    calls: list[tuple[str, bool]] = []
    real = C._alias_answers
    monkeypatch.setattr(
        C, "_alias_answers", lambda *a, **k: calls.append((a[2].typecode, k["insert"])) or real(*a, **k)
    )
    assert C._aliased_keys(c) == ""
    assert {code for code, _ in calls} == {*C.ALIAS_WIDTHS, "q"} and not any(ins for _, ins in calls), calls

    from kvledger.impl import radix

    match = radix.RadixCache.match_prefix

    def reads_bytes(self: RadixCache, key: Any) -> Any:
        memo = self._walked
        if type(key) is array and key.typecode != "q" and memo is not None and memo.raw == key.tobytes():
            key = memo.key  # BUG: the bytes of another width read as the last match's int64 key
        return match(self, key)

    monkeypatch.setattr(radix.RadixCache, "match_prefix", reads_bytes)
    found = C._aliased_keys(c)
    assert "in an array('i')" in found and "the bytes of None" not in found, found


@pytest.mark.parametrize("kind", ["token", "paged"])
def test_an_insert_that_reads_a_narrower_key_by_its_bytes_fails_the_audit(
    monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """Issue 19, new family, seed 40: ``insert``'s test for an ``array("q")`` key negated, so a key of another
    typecode is taken by its raw bytes, and where those equal the bytes of the key last matched the insert reads
    that key (half as many ids) instead of its own. The audit gives a key of those very bytes right after the match."""
    from kvledger.impl import radix

    real = radix.RadixCache.insert

    def insert(self: RadixCache, key: Any, value: Any, owner: Any, *, mamba_slot: Any = None) -> Any:
        memo = self._walked
        if type(key) is array and key.typecode != "q" and memo is not None and memo.raw == key.tobytes():
            key = memo.key  # BUG: the bytes of another width read as the last match's int64 key
        return real(self, key, value, owner, mamba_slot=mamba_slot)

    c = _locked() if kind == "token" else _cached(kind)
    assert C._aliased_keys(c) == ""
    monkeypatch.setattr(radix.RadixCache, "insert", insert)
    with pytest.raises(
        AssertionError, match=r"self-checks agree with the state: a key of ids \[.*\] in an array\('i'\)"
    ):
        C.cache_audit(c)
