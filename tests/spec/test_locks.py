"""spec/locks.py: lock pairing fails on B5-style tables; inc/dec keep it; handle misuse raises typed errors."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvledger.spec.errors import BadCoverage, DoubleUnlock, HandleError, HandleReused, UnknownHandle
from kvledger.spec.locks import (
    Coverage,
    LockSite,
    LockState,
    check_dec_lock_ref,
    check_inc_lock_ref,
    covers_required,
    dec_lock_ref,
    inc_lock_ref,
    inv_handles_fresh,
    inv_lock_ref_counts_handles,
    inv_lock_ref_nonnegative,
    inv_locks,
    is_locked,
    lock_ref_of,
    new_lock_state,
    required_coverage,
    window_start,
)
from kvledger.spec.types import Component, HandleId

FULL, SWA, MAMBA = Component.FULL, Component.SWA, Component.MAMBA
H = HandleId


def sites(cov: Coverage, comp: Component) -> list[tuple[int, ...]]:
    return sorted(k for k, c in cov if c is comp)


# ---------------------------------------------------------------- required coverage


def test_required_coverage_full_swa_mamba() -> None:
    cov = required_coverage((1, 2, 3, 4), window=2, mamba=True)
    assert sites(cov, FULL) == [(1,), (1, 2), (1, 2, 3), (1, 2, 3, 4)]
    assert sites(cov, SWA) == [(1, 2, 3), (1, 2, 3, 4)]
    assert sites(cov, MAMBA) == [(1, 2, 3, 4)]


def test_required_coverage_edges() -> None:
    assert required_coverage((), window=3, mamba=True) == frozenset()
    assert sites(required_coverage((1, 2), window=5, mamba=False), SWA) == [(1,), (1, 2)]
    assert sites(required_coverage((1, 2), window=None, mamba=False), SWA) == []
    assert sites(required_coverage((1, 2), window=1, mamba=False), MAMBA) == []


def test_required_coverage_is_per_page() -> None:
    cov = required_coverage((1, 2, 3, 4, 5, 6), window=3, mamba=False, page_size=2)
    assert sites(cov, FULL) == [(1, 2), (1, 2, 3, 4), (1, 2, 3, 4, 5, 6)]
    # tokens 3, 4, 5 are the window; they sit in the pages ending at 4 and 6
    assert sites(cov, SWA) == [(1, 2, 3, 4), (1, 2, 3, 4, 5, 6)]


@given(st.integers(0, 12), st.integers(1, 6), st.integers(1, 3))
def test_window_start_is_the_first_page_holding_a_window_token(n: int, window: int, page: int) -> None:
    n -= n % page
    overlapping = [i for i in range(page, n + 1, page) if any(n - window <= t < n for t in range(i - page, i))]
    assert [i for i in range(page, n + 1, page) if i >= window_start(n, window, page)] == overlapping


def test_covers_required_allows_locking_more() -> None:
    need = required_coverage((1, 2, 3), window=1, mamba=False)
    assert covers_required(need, need)
    assert covers_required(need | {((1,), SWA)}, need)  # a whole-node lock may cover more
    assert not covers_required(need - {((1, 2, 3), SWA)}, need)


# ---------------------------------------------------------------- the laws reject broken tables


def two_requests() -> LockState:
    """A holds a match of (1, 2, 3, 4), B of (1, 2); window 2, as in B5."""
    s = inc_lock_ref(new_lock_state(), H(1), required_coverage((1, 2, 3, 4), window=2, mamba=False))
    return inc_lock_ref(s, H(2), required_coverage((1, 2), window=2, mamba=False))


def test_b5_release_walking_swa_to_the_root_breaks_the_count() -> None:
    s = two_requests()
    assert lock_ref_of(s, (1, 2), SWA) == 1 and lock_ref_of(s, (1,), SWA) == 1  # B's window
    # B5: releasing A without its lock result lowered SWA up to the root, B's window included.
    over = {**s.lock_ref, ((1, 2), SWA): 0, ((1,), SWA): 0}
    for window_key in ((1, 2, 3), (1, 2, 3, 4)):
        over[(window_key, SWA)] -= 1
    for path_key in ((1,), (1, 2), (1, 2, 3), (1, 2, 3, 4)):
        over[(path_key, FULL)] -= 1
    broken = LockState({H(2): s.handles[H(2)]}, over, frozenset({H(1)}))
    assert not inv_lock_ref_counts_handles(broken)
    assert inv_lock_ref_counts_handles(dec_lock_ref(s, H(1)))
    assert is_locked(dec_lock_ref(s, H(1)), (1,), SWA)


def test_a_negative_count_breaks_nonnegativity() -> None:
    s = LockState({}, {((1,), SWA): -1}, frozenset())
    assert not inv_lock_ref_nonnegative(s)
    assert not inv_lock_ref_counts_handles(s)


def test_a_handle_both_live_and_released_breaks_freshness() -> None:
    s = inc_lock_ref(new_lock_state(), H(1), frozenset({((1,), FULL)}))
    assert not inv_handles_fresh(LockState(s.handles, s.lock_ref, frozenset({H(1)})))


# ---------------------------------------------------------------- operations

SITES: list[LockSite] = [((1,), FULL), ((1, 2), FULL), ((1, 2), SWA), ((1, 2), MAMBA), ((3,), FULL)]


@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("inc"), st.integers(0, 6), st.frozensets(st.sampled_from(SITES))),
            st.tuples(st.just("dec"), st.integers(0, 6), st.just(frozenset())),
        ),
        max_size=30,
    )
)
def test_any_sequence_keeps_the_laws_and_matches_a_handle_model(steps: list[tuple[str, int, Coverage]]) -> None:
    s, live, released = new_lock_state(), dict[HandleId, Coverage](), set[HandleId]()
    for op, h, cov in steps:
        handle = H(h)
        err = check_inc_lock_ref(s, handle, cov) if op == "inc" else check_dec_lock_ref(s, handle)
        if err is not None:
            before = copy.deepcopy(s)
            with pytest.raises(type(err)):
                inc_lock_ref(s, handle, cov) if op == "inc" else dec_lock_ref(s, handle)
            assert s == before
            continue
        if op == "inc":
            s, live[handle] = inc_lock_ref(s, handle, cov), cov
        else:
            s = dec_lock_ref(s, handle)
            released.add(handle)
            del live[handle]
        assert inv_locks(s)
        assert s.handles == live and s.released == released
        for site in SITES:
            assert lock_ref_of(s, *site) == sum(site in c for c in live.values())
        assert all(n > 0 for n in s.lock_ref.values()), "zero counts are absent"


def test_empty_coverage_is_a_valid_handle() -> None:
    s = inc_lock_ref(new_lock_state(), H(1), frozenset())
    assert s.handles == {H(1): frozenset()} and dict(s.lock_ref) == {}
    assert dec_lock_ref(s, H(1)).released == {H(1)}


def test_release_lowers_only_its_own_coverage() -> None:
    s = two_requests()
    after = dec_lock_ref(s, H(2))
    assert dict(after.lock_ref) == {site: 1 for site in s.handles[H(1)]}


# ---------------------------------------------------------------- misuse


@pytest.mark.parametrize(
    "call, error, words",
    [
        (lambda s: dec_lock_ref(s, H(1)), DoubleUnlock, "double unlock"),
        (lambda s: dec_lock_ref(s, H(9)), UnknownHandle, "never issued"),
        (lambda s: inc_lock_ref(s, H(1), frozenset()), HandleReused, "already released"),
        (lambda s: inc_lock_ref(s, H(2), frozenset()), HandleReused, "already live"),
        (lambda s: inc_lock_ref(s, H(3), frozenset({((), FULL)})), BadCoverage, "root"),
    ],
)
def test_misuse_raises_a_typed_error_naming_the_handle(
    call: Callable[[LockState], object], error: type[HandleError], words: str
) -> None:
    s = dec_lock_ref(two_requests(), H(1))
    before = copy.deepcopy(s)
    with pytest.raises(error) as info:
        call(s)
    assert "of handle" in str(info.value) and words in str(info.value)
    assert s == before
