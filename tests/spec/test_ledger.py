"""The ownership ledger: its laws hold on every legal run and fail on broken states."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvledger.spec import ledger as L
from kvledger.spec.errors import DoubleFree, InvalidArgument, NotOwner, OutOfRange, OverAllocation
from kvledger.spec.types import Component, Owner, node, request, session

OWNERS = [request(1), request(2), node(3), node(3, Component.SWA), session(4)]


def test_new_ledger_is_all_free() -> None:
    s = L.new_ledger("kv", 5, base=1)
    assert s.free == frozenset(range(1, 6)) and L.inv_ledger(s)


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["alloc", "free", "transfer"]),
            st.sampled_from(OWNERS),
            st.sampled_from(OWNERS),
            st.integers(1, 3),
        ),
        max_size=30,
    )
)
def test_legal_runs_keep_the_laws(ops: list[tuple[str, object, object, int]]) -> None:
    s = L.new_ledger("kv", 8)
    for op, a, b, n in ops:
        assert isinstance(a, type(OWNERS[0])) and isinstance(b, type(OWNERS[0]))
        if op == "alloc" and L.can_allocate(s, n):
            s = L.allocate(s, a, L.lowest_free(s, n))
        elif op == "free" and L.held_by(s, a):
            s = L.free(s, a, frozenset(sorted(L.held_by(s, a))[:n]))
        elif op == "transfer" and L.held_by(s, a) and a != b:
            s = L.transfer(s, a, b, frozenset(sorted(L.held_by(s, a))[:n]))
        assert L.inv_slots_conserved(s) and L.inv_single_owner(s)


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda s: L.free(s, request(1), frozenset({5})), DoubleFree),
        (lambda s: L.free(s, request(2), frozenset({0})), NotOwner),
        (lambda s: L.free(s, request(1), frozenset({9})), OutOfRange),
        (lambda s: L.free(s, request(1), frozenset()), InvalidArgument),
        (lambda s: L.allocate(s, request(2), frozenset({0})), OverAllocation),
        (lambda s: L.allocate(s, request(2), frozenset({1, 2})), OverAllocation),
        (lambda s: L.allocate(s, request(2), frozenset({-1})), OutOfRange),
        (lambda s: L.transfer(s, request(2), session(1), frozenset({0})), NotOwner),
        (lambda s: L.transfer(s, request(1), request(1), frozenset({0})), InvalidArgument),
        (lambda s: L.transfer(s, request(1), session(1), frozenset({4})), DoubleFree),
    ],
)
def test_misuse_raises_typed_error_and_leaves_state(call: object, error: type[Exception]) -> None:
    s = L.allocate(L.new_ledger("kv", 6), request(1), frozenset({0, 1}))
    before = s
    with pytest.raises(error) as info:
        call(s)  # type: ignore[operator]
    assert s == before
    assert "'kv'" in str(info.value)


def test_error_names_operation_slot_and_owners() -> None:
    s = L.allocate(L.new_ledger("kv", 4), request(1), frozenset({2}))
    with pytest.raises(NotOwner, match=r"free on pool 'kv' slots \[2\]: slot 2 is held by req:1, not by session:9"):
        L.free(s, session(9), frozenset({2}))


# ---- each invariant fails on a broken state


def test_conservation_fails_on_a_leak() -> None:
    s = L.allocate(L.new_ledger("kv", 4), request(1), frozenset({0, 1}))
    leaked = L.Ledger("kv", 4, s.free, {request(1): frozenset({0})})  # slot 1 lost its owner
    assert not L.inv_slots_conserved(leaked)
    assert not L.inv_single_owner(leaked)


def test_single_owner_fails_on_shared_slot() -> None:
    shared = L.Ledger("kv", 3, frozenset({2}), {request(1): frozenset({0, 1}), request(2): frozenset({1})})
    assert not L.inv_single_owner(shared)


def test_single_owner_fails_on_free_and_held_slot() -> None:
    both = L.Ledger("kv", 2, frozenset({0, 1}), {request(1): frozenset({1})})
    assert not L.inv_single_owner(both)


def test_single_owner_fails_on_foreign_slot_or_empty_owner() -> None:
    assert not L.inv_single_owner(L.Ledger("kv", 2, frozenset({0, 7}), {}))
    assert not L.inv_single_owner(L.Ledger("kv", 2, frozenset({0, 1}), {request(1): frozenset()}))


def test_postcondition_catches_a_broken_transition() -> None:
    import icontract

    @icontract.ensure(lambda result: L.inv_slots_conserved(result), "slots conserved")
    def leaky_free(s: L.Ledger, owner: object, slots: frozenset[int]) -> L.Ledger:
        return L.Ledger(s.name, s.capacity, s.free, L._with(s.held, request(1), L.held_by(s, request(1)) - slots))

    s = L.allocate(L.new_ledger("kv", 4), request(1), frozenset({0, 1}))
    with pytest.raises(icontract.ViolationError, match="slots conserved"):
        leaky_free(s, request(1), frozenset({0}))


# ---------------------------------------------------------------- inv_rows_held: rows name only KV their owner may read


@st.composite
def _rows_state(draw: st.DrawFn) -> tuple[L.Ledger, dict[int, tuple[Owner, list[int]]], int]:
    """A KV ledger (units: pages of ``page`` slots) with some owners, and rows naming only what they may read."""
    page = draw(st.sampled_from([1, 2, 4]))
    s = L.new_ledger("kv", 12, base=1)
    rows: dict[int, tuple[Owner, list[int]]] = {}
    tree = node(7)
    s = L.allocate(s, tree, frozenset({1, 2}))  # a cached prefix any row may borrow
    for r, owner in enumerate([request(1), request(2), session(4)]):
        units = draw(st.sets(st.sampled_from(sorted(s.free)), max_size=3)) if s.free else set()
        if units:
            s = L.allocate(s, owner, frozenset(units))
        mine = sorted(units) + draw(st.lists(st.sampled_from([1, 2]), max_size=2, unique=True))
        rows[r] = (owner, [u * page + draw(st.integers(0, page - 1)) for u in draw(st.permutations(mine))])
    return s, rows, page


@given(_rows_state())
def test_rows_naming_their_owners_kv_or_the_cache_hold(
    state: tuple[L.Ledger, dict[int, tuple[Owner, list[int]]], int],
) -> None:
    s, rows, page = state
    assert L.inv_rows_held(s, rows, page), list(L.row_faults(s, rows, page))


@given(_rows_state(), st.sampled_from(["free", "other", "outside", "below"]), st.data())
def test_rows_held_fails_on_a_broken_row(
    state: tuple[L.Ledger, dict[int, tuple[Owner, list[int]]], int], how: str, data: st.DataObject
) -> None:
    """A row naming free KV (use after free), another owner's KV, or a slot outside the pool breaks the law,
    and the fault names the row, the position, the slot and who holds it."""
    s, rows, page = state
    row = data.draw(st.sampled_from(sorted(rows)))
    owner, slots = rows[row]
    if how == "free":
        if not s.free:
            return
        unit, holder = data.draw(st.sampled_from(sorted(s.free))), None
    elif how == "other":
        others = [(o, u) for o, us in s.held.items() for u in us if o != owner and o.kind.value != "node"]
        if not others:
            return
        holder, unit = data.draw(st.sampled_from(others))
    else:
        unit, holder = (s.base + s.capacity if how == "outside" else 0), None
    pos = data.draw(st.integers(0, len(slots)))
    broken = {**rows, row: (owner, [*slots[:pos], unit * page, *slots[pos:]])}
    assert not L.inv_rows_held(s, broken, page)
    fault = next(L.row_faults(s, broken, page))
    assert (fault.row, fault.position, fault.slot, fault.holder) == (row, pos, unit * page, holder)
    assert fault.outside is (how in ("outside", "below"))


def test_rows_held_counts_pages_not_slots() -> None:
    """With pages of 4 token slots, a row names token slots: slot 9 lies in page 2."""
    s = L.allocate(L.new_ledger("kv", 4, base=1), request(1), frozenset({2}))
    assert L.inv_rows_held(s, {0: (request(1), [8, 9, 10, 11])}, 4)
    assert not L.inv_rows_held(s, {0: (request(1), [8, 12])}, 4)  # page 3 is free
    assert not L.inv_rows_held(s, {0: (request(1), [8, 9])}, 1)  # read as token slots: 8, 9 outside [1, 5)


def test_rows_held_fails_on_a_slot_named_twice() -> None:
    s = L.allocate(L.new_ledger("kv", 4, base=1), request(1), frozenset({1, 2}))
    assert L.inv_rows_held(s, {0: (request(1), [1, 2])})
    fault = next(L.row_faults(s, {0: (request(1), [1, 2, 1])}))
    assert (fault.position, fault.slot, fault.again) == (2, 1, True)


@given(
    had=st.integers(0, 40), computed=st.integers(0, 30), ahead=st.integers(0, 6), page=st.sampled_from([1, 2, 4, 16])
)
def test_a_row_grows_to_what_it_asked_in_whole_pages(had: int, computed: int, ahead: int, page: int) -> None:
    want = -(-(computed + ahead) // page) * page
    assert L.inv_row_grows_as_asked(had, max(had, want), computed, ahead, page)  # the reference's growth
    assert not L.inv_row_grows_as_asked(had, want - 1, computed, ahead, page)  # short of what it asked
    assert not L.inv_row_grows_as_asked(had, max(had, want) + 1, computed, ahead, page)  # past both


def test_a_step_eviction_counts_what_the_tree_gave_up_per_node() -> None:
    a, b = node(1, Component.FULL), node(2, Component.FULL)
    before = L.allocate(L.allocate(L.new_ledger("kv", 10), a, frozenset({0, 1, 2})), b, frozenset({3, 4}))
    evicted = L.free(before, a, frozenset({0, 1, 2}))
    after = L.allocate(evicted, request(7), frozenset({0, 1, 5, 6, 7, 8, 9}))  # 5 were free, 2 short
    free, taken, freed, lost = L.step_eviction(before, after)
    assert (free, taken, freed, lost) == (5, 7, 3, (3,))
    assert L.inv_evicts_only_short(free, taken, freed, lost)  # the one node made up the shortfall
    both = L.allocate(L.free(evicted, b, frozenset({3, 4})), request(7), frozenset({0, 1, 5, 6, 7, 8, 9}))
    assert not L.inv_evicts_only_short(*L.step_eviction(before, both))  # the second node was not needed
