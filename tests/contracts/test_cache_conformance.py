"""The radix-cache state machine passes on the reference cache and fails, naming the law, on broken ones."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import Phase, settings

from kvledger.contracts.machines.profiles import register_profiles
from kvledger.contracts.machines.runner import CheckResult, run_machine
from kvledger.contracts.machines.suites import CACHE_MODELS, SUITES
from kvledger.impl import faults
from kvledger.impl.radix import RadixCache
from kvledger.impl.tree import RadixTree

register_profiles()
FIND = settings(settings.get_profile("ci"), max_examples=200, phases=[Phase.explicit, Phase.generate])
"""Detection only (no shrinking): the tests ask *whether* and *by which law* a broken cache is caught."""


def run(model: str, s: settings = FIND) -> CheckResult:
    return run_machine("cache", model, SUITES["cache"].models[model](), [], s)


@pytest.mark.parametrize("model", sorted(CACHE_MODELS))
def test_reference_cache_conforms(model: str) -> None:
    result = run(model, settings.get_profile("ci"))
    assert result.ok, result.violation and result.violation.message
    assert result.examples >= 50 and result.steps > 500


@pytest.mark.parametrize("model", ["full", "swa", "mamba", "hybrid", "full-paged"])
def test_b1_is_caught_by_lru_detachment(model: str) -> None:
    with faults.injected("B1"):
        result = run(model)
    assert result.violation is not None and result.violation.rule == "inv_lru_detached", result.violation


def test_b5_is_caught_by_lock_pairing() -> None:
    with faults.injected("B5"):
        result = run("hybrid")
    assert result.violation is not None
    assert result.violation.rule in ("inv_lock_ref_counts_handles", "inv_lock_ref_nonnegative"), result.violation


def test_faults_are_off_after_the_block() -> None:
    with faults.injected("B1", "B5"):
        assert faults.active() == {"B1", "B5"}
    assert faults.active() == frozenset()
    assert run("hybrid", settings(FIND, max_examples=20)).ok


def test_unknown_fault_is_a_clear_error() -> None:
    with pytest.raises(KeyError, match="unknown fault 'B9'; known: B1"):
        faults.enable("B9")


def broken(monkeypatch: pytest.MonkeyPatch, cls: type, name: str, make: Callable[[Any], Callable[..., Any]]) -> None:
    monkeypatch.setattr(cls, name, make(getattr(cls, name)))


def test_size_counter_drift_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    def make(orig: Callable[..., list[Any]]) -> Callable[..., list[Any]]:
        def raise_full(self: RadixTree, n: Any) -> list[Any]:
            sizes = list(self._evictable), list(self._protected)
            counters = orig(self, n)
            self._evictable[:], self._protected[:] = sizes  # BUG: evictable/protected counters not moved
            return counters

        return raise_full

    broken(monkeypatch, RadixTree, "_raise_full", make)
    result = run("full")
    assert result.violation is not None and result.violation.rule == "inv_sizes", result.violation


def test_leaking_eviction_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    def make(orig: Callable[..., None]) -> Callable[..., None]:
        def free_leaves(self: RadixTree, freed: list[Any]) -> None:
            orig(self, freed[1:])  # BUG: the first evicted leaf's slots are never freed

        return free_leaves

    broken(monkeypatch, RadixTree, "_free_leaves", make)
    result = run("full")
    assert result.violation is not None and result.violation.rule == "inv_owners_account", result.violation


def test_match_that_ignores_swa_tombstones_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    import kvledger.impl.radix as radix

    real = radix.longest_match
    monkeypatch.setattr(radix, "longest_match", lambda c, p, w, t, m: real(c, p, w, [], m))  # BUG: tombstones ignored
    result = run("swa")
    assert result.violation is not None and result.violation.rule == "results equal the spec's", result.violation


def test_corrupted_kv_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    from kvledger.impl.allocators import TokenAllocator

    def make(orig: Callable[..., None]) -> Callable[..., None]:
        def write(self: TokenAllocator, slots: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor) -> None:
            orig(self, slots, tokens, positions + 1)  # BUG: KV written for the wrong positions

        return write

    broken(monkeypatch, TokenAllocator, "write_fingerprint", make)
    result = run("full")
    assert result.violation is not None and result.violation.rule == "inv_content", result.violation


def test_lock_that_skips_ancestors_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    def make(orig: Callable[..., Any]) -> Callable[..., Any]:
        def inc_lock_ref(self: RadixCache, n: Any) -> Any:
            h = orig(self, n)
            for nid, comp in list(self._locks.live()[h.id]):
                if nid != n.id:  # BUG: ancestors unlocked behind the handle's back
                    self._lower_lock(self._nodes[nid], comp)
            return h

        return inc_lock_ref

    broken(monkeypatch, RadixCache, "inc_lock_ref", make)
    result = run("full")
    assert result.violation is not None
    # NOTE: a law sees the lost counts, or the reference's own integrity check refuses the unlock that would take
    # a count below zero (a typed IntegrityError on a valid call: a finding too), whichever the draws meet first
    lock_refused = result.violation.message.startswith("IntegrityError") and "lock_ref" in result.violation.message
    assert result.violation.rule in ("inv_lock_ref_counts_handles", "inv_sizes") or lock_refused, result.violation


def test_eviction_that_leaves_the_parent_pointer_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    def make(orig: Callable[..., int]) -> Callable[..., int]:
        def delete_leaf(self: RadixTree, n: Any, freed: list[Any]) -> int:
            parent = n.parent
            size = orig(self, n, freed)
            n.parent = parent  # BUG: the evicted leaf still points at its old parent
            return size

        return delete_leaf

    broken(monkeypatch, RadixTree, "_delete_leaf", make)
    result = run("full")
    assert result.violation is not None and result.violation.rule == "inv_tree_detached", result.violation


def test_eviction_that_keeps_a_cursor_on_the_evicted_node_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    def make(orig: Callable[..., int]) -> Callable[..., int]:
        def delete_leaf(self: RadixTree, n: Any, freed: list[Any]) -> int:
            memo = self._walked
            size = orig(self, n, freed)
            self._walked = memo  # BUG: the memoised walk still names the evicted node
            return size

        return delete_leaf

    broken(monkeypatch, RadixTree, "_delete_leaf", make)
    result = run("full")
    assert result.violation is not None and result.violation.rule == "inv_tree_index", result.violation


def test_a_split_that_revives_an_swa_tombstone_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """``insert_branch`` leaves an inserted key inside it, so a tombstoned node is split within the default
    budget: an upper part that forgets its tombstone claims window KV it does not hold."""

    def make(orig: Callable[..., Any]) -> Callable[..., Any]:
        def split(self: RadixTree, c: Any, k: int) -> Any:
            p = orig(self, c, k)
            p.swa_tombstone = False  # BUG: the upper part of a tombstoned node counts as SWA-live again
            return p

        return split

    broken(monkeypatch, RadixTree, "_split", make)
    result = run("swa", settings(settings.get_profile("check"), phases=[Phase.explicit, Phase.generate]))
    assert result.violation is not None, "a revived tombstone went unseen at kvledger check's default budget"


def test_a_match_that_refreshes_only_its_last_node_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    def make(orig: Callable[..., None]) -> Callable[..., None]:
        def refresh(self: RadixTree, up: list[Any], rest: Any = None) -> None:
            orig(self, up[-1:])  # BUG: the ancestors and the split remainder keep their old place in the lists

        return refresh

    broken(monkeypatch, RadixTree, "_refresh", make)
    result = run("full")
    # NOTE: the list's order against the uses seen, or the eviction that order leads to, whichever a step meets first
    assert result.violation is not None and result.violation.rule in ("inv_lru_recency", "evicts_lru_first"), (
        result.violation
    )


def test_an_eviction_that_takes_the_most_recent_leaf_first_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    from kvledger.impl.tree import I_FULL

    def make(orig: Callable[..., int]) -> Callable[..., int]:
        def evict_full(self: RadixCache, n: int) -> int:
            freed, leaves = 0, list[Any]()
            while freed < n:
                mru = [x for x in self._full.iter_lru() if not x.children and not x.refs[I_FULL]][-1:]
                if not mru:
                    break
                freed += self._delete_leaf(mru[0], leaves)  # BUG: the most recently used evictable leaf first
            self._free_leaves(leaves)
            return freed

        return evict_full

    broken(monkeypatch, RadixCache, "_evict_full", make)
    result = run("full")
    assert result.violation is not None and result.violation.rule == "evicts_lru_first", result.violation


@pytest.mark.parametrize(("model", "comp"), [("full", "FULL"), ("mamba", "MAMBA"), ("swa", "SWA")])
def test_an_eviction_that_takes_one_node_more_than_asked_is_caught(
    monkeypatch: pytest.MonkeyPatch, model: str, comp: str
) -> None:
    name = "_evict_full" if comp == "FULL" else "_evict_component"

    def make(orig: Callable[..., int]) -> Callable[..., int]:
        def evict(self: RadixCache, *args: Any) -> int:
            freed = orig(self, *args)
            return freed + orig(self, *args[:-1], 1) if freed >= args[-1] else freed  # BUG: one more than asked

        return evict

    broken(monkeypatch, RadixCache, name, make)
    result = run(model)
    assert result.violation is not None and result.violation.rule == "evicts_no_more", result.violation


@pytest.mark.parametrize("declared", ["lru_policy:full", "lru_policy:mamba"])
def test_the_policy_laws_judge_only_the_components_declared(monkeypatch: pytest.MonkeyPatch, declared: str) -> None:
    """A cache declaring the LRU policy for one component (SGLang 0.5.23's FULL evictions follow it, its Mamba list
    does not) is judged on that component's evictions only: a Mamba eviction one state too long breaks
    ``evicts_no_more`` when Mamba is declared, and passes the policy laws when only FULL is."""
    from kvledger.contracts.adapters.protocol import policy_components
    from kvledger.contracts.adapters.reference import ReferenceAdapter
    from kvledger.spec.types import Component

    caps = (ReferenceAdapter.capabilities - {"lru_policy"}) | {declared}
    assert policy_components(caps, tuple(Component)) == {Component(declared.partition(":")[2])}
    monkeypatch.setattr(ReferenceAdapter, "capabilities", caps)

    def make(orig: Callable[..., int]) -> Callable[..., int]:
        def evict(self: RadixCache, *args: Any) -> int:
            freed = orig(self, *args)
            return freed + orig(self, *args[:-1], 1) if freed >= args[-1] else freed  # BUG: one more than asked

        return evict

    broken(monkeypatch, RadixCache, "_evict_component", make)
    result = run("mamba")
    judged = result.violation is not None and result.violation.rule == "evicts_no_more"
    assert judged == (declared == "lru_policy:mamba"), result.violation


@pytest.mark.parametrize("model", ["mamba", "hybrid"])
def test_a_copy_on_write_that_refuses_when_it_could_evict_is_caught(
    monkeypatch: pytest.MonkeyPatch, model: str
) -> None:
    """``mamba_copy_on_write`` with a full Mamba pool must evict an unlocked state, not give up: the adapter
    protocol's ``None`` means impossible."""
    from kvledger.spec.errors import OverAllocation

    def make(orig: Callable[..., int]) -> Callable[..., int]:
        def cow(self: RadixCache, match: Any, owner: Any) -> int:
            assert self.mamba is not None
            if self.mamba.available_size() == 0:
                raise OverAllocation("mamba_copy_on_write", "mamba", (), "pool full")  # BUG: no eviction tried
            return orig(self, match, owner)

        return cow

    broken(monkeypatch, RadixCache, "mamba_copy_on_write", make)
    result = run(model)
    assert result.violation is not None and result.violation.rule == "alloc evicts before it refuses", result.violation


def test_an_eviction_that_stops_short_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Caught by the machine's law with the contracts off (the reference cache's ``evict`` contract sees it too)."""
    from kvledger.contracts import bindings

    def make(orig: Callable[..., int]) -> Callable[..., int]:
        def evict_full(self: RadixCache, n: int) -> int:
            return orig(self, n // 2)  # BUG: half of what was asked

        return evict_full

    saved = bindings.current_level()
    bindings.install("off")
    try:
        broken(monkeypatch, RadixCache, "_evict_full", make)
        result = run("full")
    finally:
        monkeypatch.undo()
        bindings.install(saved)
    assert result.violation is not None and result.violation.rule == "evicts_enough", result.violation


def test_a_double_unlock_refused_as_an_unknown_handle_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The spec refuses a released handle with ``DoubleUnlock``; a cache that says it never issued it answers
    wrong (mutation seed 24: handle ids counted down, so released ones looked never issued)."""
    from kvledger.impl.locks import LockTable
    from kvledger.spec.errors import DoubleUnlock, UnknownHandle

    def make(orig: Callable[..., Any]) -> Callable[..., Any]:
        def covered(self: LockTable, op: str, handle: Any) -> Any:
            try:
                return orig(self, op, handle)
            except DoubleUnlock as err:
                raise UnknownHandle(op, handle.id, "was never issued by this cache") from err  # BUG: wrong answer

        return covered

    broken(monkeypatch, LockTable, "covered", make)
    result = run("full")
    assert result.violation is not None and result.violation.rule == "results equal the spec's", result.violation
    assert "the spec refuses a released handle with DoubleUnlock" in result.violation.message


def test_an_insert_that_reuses_another_keys_walk_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 19, new family, seed 9: the insert's reuse of the last match's walk, tested the wrong way round, so an
    ``array("q")`` key (the form a scheduler hands over, read without a copy) is inserted as the last key matched.
    The reference adapter hands the cache each key form in turn, so an insert after a match of another key meets
    the array path."""
    from array import array

    real = RadixCache.insert

    def stale(self: RadixCache, key: Any, value: Any, owner: Any, **kw: Any) -> Any:
        memo = self._walked
        if type(key) is array and memo is not None and memo.raw != key.tobytes() and len(memo.key) == len(key):
            key = array("q", memo.key)  # BUG: the walk of another key taken for this one
        return real(self, key, value, owner, **kw)

    assert run("full").ok
    monkeypatch.setattr(RadixCache, "insert", stale)
    result = run("full")
    assert result.violation is not None, result


def test_an_insert_that_refuses_the_state_cached_at_its_end_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 19, new family, seed 10: the insert reads the state at the key's end from the path's first node, not
    its last, so offering the state already cached there (legal: ``spec.prefix.insert`` keeps it, nothing comes
    back) is refused once the key's path has more than one node. The machine offers it again
    (``reinserts_cached_state``) for the last key inserted that still has one."""
    from kvledger.spec.errors import SlotConflict

    real = RadixCache.insert

    def first_node(self: RadixCache, key: Any, value: Any, owner: Any, **kw: Any) -> Any:
        slot = kw.get("mamba_slot")
        if slot is not None and any(n.mamba_slot == slot for n in self.nodes() if n is not self.root):
            raise SlotConflict("insert", (), f"Mamba slot {slot} is cached")  # BUG: its own end's state refused
        return real(self, key, value, owner, **kw)

    assert run("mamba").ok
    monkeypatch.setattr(RadixCache, "insert", first_node)
    result = run("mamba")
    assert result.violation is not None and "SlotConflict" in result.violation.rule, result.violation


@pytest.mark.parametrize("model", ["mamba", "hybrid"])
def test_a_copy_on_write_that_refreshes_the_copied_path_as_a_match_does_holds(
    monkeypatch: pytest.MonkeyPatch, model: str
) -> None:
    """SGLang makes a copy-on-write at a match (``match_prefix(cow_mamba=True)``), which refreshes the matched path;
    the reference makes it apart and refreshes nothing. The spec allows either: a cache whose copy-on-write
    refreshes the copied prefix's path (ancestors first, as a match does) passes every law, ``evicts_lru_first``
    and ``inv_lru_recency`` among them (issue 19: SGLang 0.5.17 to 0.5.23's hybrid cache, a late copy-on-write)."""

    def make(orig: Callable[..., int]) -> Callable[..., int]:
        def mamba_copy_on_write(self: RadixCache, match: Any, owner: Any) -> int:
            path, n = [], match.last_node
            while n is not None and n is not self.root and self._nodes.get(n.id) is n:
                path.append(n)
                n = n.parent
            if n is self.root:
                self._refresh(path[::-1])  # NOTE: as a match of the copied prefix does
            return orig(self, match, owner)

        return mamba_copy_on_write

    broken(monkeypatch, RadixCache, "mamba_copy_on_write", make)
    result = run(model, settings(FIND, max_examples=300))
    assert result.ok, result.violation and result.violation.message
