"""Session and admission laws: they hold on legal runs and fail on the states B2, B3 and B4 leave."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvledger.spec import admission as A
from kvledger.spec import prefix as P
from kvledger.spec import session as S
from kvledger.spec.errors import InvalidArgument
from kvledger.spec.ledger import allocate, free, new_ledger, transfer
from kvledger.spec.types import HandleId, request, session


@given(
    alloc=st.integers(0, 12),
    data=st.data(),
    page=st.sampled_from([1, 2, 4]),
)
def test_resume_splits_row_at_page_boundary(alloc: int, data: st.DataObject, page: int) -> None:
    committed = data.draw(st.integers(0, alloc))
    prefix = data.draw(st.integers(0, committed))
    s = S.save(S.new_session(1), 0, tuple(range(100, 100 + alloc)), committed, frozenset())
    plan = S.resume(s, prefix, page)
    assert plan.kept + plan.freed == s.kv
    assert len(plan.kept) >= prefix
    assert not plan.freed or len(plan.kept) % page == 0
    assert len(plan.kept) - prefix < page  # never keeps a whole page past the prefix


def test_resume_beyond_committed_is_rejected() -> None:
    s = S.save(S.new_session(1), 0, (1, 2, 3), 2, frozenset())
    with pytest.raises(InvalidArgument, match="append-only"):
        S.resume(s, 3, 1)


def test_save_into_a_busy_session_is_rejected() -> None:
    s = S.save(S.new_session(1), 0, (1, 2), 2, frozenset())
    with pytest.raises(InvalidArgument, match="still holds row 0"):
        S.save(s, 1, (3,), 1, frozenset())


def test_close_releases_everything() -> None:
    s = S.save(S.new_session(2), 4, (7, 8, 9), 3, frozenset({1, 2}))
    emptied, plan = S.close(s)
    assert emptied.empty and plan.row == 4 and set(plan.freed) == {7, 8, 9} and plan.mamba == {1, 2}


def test_held_equals_recorded_fails_when_close_keeps_mamba() -> None:
    """The state bug B3 leaves: the session slot is empty but the Mamba ledger still names the session."""
    kv, rows, mamba = new_ledger("kv", 8), new_ledger("rows", 2), new_ledger("mamba", 3)
    kv = allocate(kv, session(1), frozenset({1, 2}))
    rows = allocate(rows, session(1), frozenset({0}))
    mamba = allocate(mamba, session(1), frozenset({0, 1}))
    s = S.save(S.new_session(1), 0, (1, 2), 2, frozenset({0, 1}))
    assert S.inv_session_holds_recorded(s, kv, rows, mamba)
    emptied, plan = S.close(s)
    kv = free(kv, session(1), frozenset(plan.freed))
    rows = free(rows, session(1), frozenset({0}))
    assert not S.inv_session_holds_recorded(emptied, kv, rows, mamba)  # mamba not freed: B3
    assert S.inv_session_holds_recorded(emptied, kv, rows, free(mamba, session(1), plan.mamba))


def test_held_equals_recorded_fails_when_tail_is_overwritten() -> None:
    """The state bug B4 leaves: the tail was dropped from the record without being freed."""
    kv = allocate(new_ledger("kv", 8), session(1), frozenset({1, 2, 3, 4}))
    s = S.save(S.new_session(1), 0, (1, 2, 3, 4), 2, frozenset())
    plan = S.resume(s, 2, 1)
    lost = S.SessionSlot(1, 0, plan.kept, 2)  # tail (3, 4) forgotten, still held in the ledger
    assert not S.inv_session_holds_recorded(lost, kv, None, None)
    assert S.inv_session_holds_recorded(lost, free(kv, session(1), frozenset(plan.freed)), None, None)


def test_rollback_law_fails_on_kept_mamba_slot_and_holds_after_release() -> None:
    """B2: a rejected request keeps the Mamba slot matching gave it."""
    m = new_ledger("mamba", 2)
    a = A.begin(request(1), {"mamba": m}, frozenset())
    got = allocate(m, request(1), frozenset({1}))
    assert not A.inv_rollback_restores(a, {"mamba": got}, frozenset())
    assert A.leaked_by_rollback(a, {"mamba": got}) == {"mamba": frozenset({1})}
    assert A.inv_rollback_restores(a, {"mamba": free(got, request(1), frozenset({1}))}, frozenset())


def test_rollback_law_fails_on_a_leftover_lock_handle() -> None:
    m = new_ledger("mamba", 2)
    a = A.begin(request(1), {"mamba": m}, frozenset())
    assert not A.inv_rollback_restores(a, {"mamba": m}, frozenset({HandleId(3)}))


def test_commit_law_fails_when_an_admitted_request_loses_its_slot() -> None:
    m = allocate(new_ledger("mamba", 2), request(1), frozenset({0}))
    a = A.begin(request(1), {"mamba": m}, frozenset())
    assert A.inv_commit_keeps(a, {"mamba": m})
    assert not A.inv_commit_keeps(a, {"mamba": transfer(m, request(1), request(2), frozenset({0}))})


def test_budget() -> None:
    b = A.Budget(tokens=10, requests=2)
    assert A.fits(b, 10) and not A.fits(b, 11)
    b = A.take(A.take(b, 4), 4)
    assert not A.fits(b, 1)


def test_save_of_kv_without_a_row_is_rejected() -> None:
    """Found by CrossHair: KV slots saved without the row that references them would be unreachable."""
    with pytest.raises(InvalidArgument, match="without the row"):
        S.save(S.new_session(0), None, (0,), 0, frozenset())


def test_commit_law_lets_a_request_hand_its_slot_only_to_the_session_it_runs_on() -> None:
    m = allocate(new_ledger("mamba", 2), request(1), frozenset({0}))
    a = A.begin(request(1), {"mamba": m}, frozenset())
    to_session_1 = {"mamba": transfer(m, request(1), session(1), frozenset({0}))}
    assert A.inv_commit_keeps(a, to_session_1, lenders=(session(1),))
    assert not A.inv_commit_keeps(a, to_session_1)  # no lender: lost
    assert not A.inv_commit_keeps(a, to_session_1, lenders=(session(2),))  # another session's record


def _cache(page: int, keys: list[tuple[int, ...]], **kw: object) -> P.PrefixCache:
    """A cache holding ``keys``' pages (slots numbered in order), with ``kw`` as ``PrefixCache``'s other fields."""
    full = {k: tuple(range(10 * i, 10 * i + page)) for i, k in enumerate(keys)}
    return P.PrefixCache(page, full=full, **kw)  # type: ignore[arg-type]


def test_reuse_law_wants_the_longest_match_of_all_tokens_but_the_last() -> None:
    c = _cache(2, [(1, 2), (1, 2, 3, 4), (1, 2, 3, 4, 5, 6)])
    assert A.reuse_bounds(c, c, (1, 2, 3, 4, 5, 6)) == (4, 4)  # the last page holds the last token: not matched
    assert A.reuse_bounds(c, c, (1, 2, 3, 4, 5, 6, 7)) == (6, 6)
    assert A.inv_reuses_cache(6, (1, 2, 3, 4, 5, 6, 7), c, c)
    assert not A.inv_reuses_cache(4, (1, 2, 3, 4, 5, 6, 7), c, c)  # a page short: KV recomputed
    assert not A.inv_reuses_cache(6, (1, 2, 3, 4, 5, 6), c, c)  # past the last token but one


def test_reuse_law_follows_the_match_rule_of_mamba_and_swa_caches() -> None:
    keys = [(1,), (1, 2), (1, 2, 3), (1, 2, 3, 4)]
    mamba = _cache(1, keys, mamba=True, mamba_state={(1, 2): 7})
    assert A.reuse_bounds(mamba, mamba, (1, 2, 3, 4, 5)) == (2, 2)  # a match ends at a cached state
    swa = _cache(1, keys, window=2, swa_live=frozenset({(1,), (1, 2), (1, 2, 3)}))
    assert A.reuse_bounds(swa, swa, (1, 2, 3, 4, 5)) == (3, 3)  # the window of a match of 4 is gone


def test_reuse_law_allows_for_what_the_step_evicted_and_only_that() -> None:
    before = _cache(1, [(1,), (1, 2), (1, 2, 3)])
    after = _cache(1, [(1,)])  # an earlier admission of the step evicted (1, 2) and (1, 2, 3)
    assert A.reuse_bounds(before, after, (1, 2, 3, 4)) == (1, 3)
    moved = P.PrefixCache(1, full={**before.full, (1, 2): (99,)})  # a page with other slots was not kept through
    assert A.reuse_bounds(before, moved, (1, 2, 3, 4)) == (1, 3)


@given(committed=st.lists(st.integers(1, 3), max_size=8), tokens=st.lists(st.integers(1, 3), min_size=1, max_size=10))
def test_resume_reuses_the_common_prefix_of_all_tokens_but_the_last(committed: list[int], tokens: list[int]) -> None:
    n = S.reusable_on_resume(committed, tokens)
    assert committed[:n] == tokens[:n] and n <= len(tokens) - 1
    assert n == min(len(committed), len(tokens) - 1) or committed[n] != tokens[n]  # the longest such
    assert S.inv_resume_reuses(n, committed, tokens)
    assert not S.inv_resume_reuses(n - 1, committed, tokens) and not S.inv_resume_reuses(n + 1, committed, tokens)


def test_a_turn_saved_whole_commits_exactly_what_it_computed() -> None:
    assert S.inv_turn_saved_whole((1, 2, 3), [1, 2, 3])
    assert not S.inv_turn_saved_whole((1, 2, 3), (1, 2))  # the last computed token is recomputed next turn
    assert not S.inv_turn_saved_whole((1, 2), (1, 2, 3))  # a token the turn never computed
    assert not S.inv_turn_saved_whole((1, 2, 3), (1, 4, 3))
    # a finish that computes more first: the committed tokens begin with the computed ones
    assert S.inv_turn_saved_past((1, 2, 3), (1, 2, 3), 4) and S.inv_turn_saved_past((1, 2, 3), [1, 2, 3, 9], 4)
    assert not S.inv_turn_saved_past((1, 2, 3), (1, 2), 4)  # fewer than it had computed
    assert not S.inv_turn_saved_past((1, 2, 3), (1, 4, 3, 9), 4)  # a computed token changed
    assert not S.inv_turn_saved_past((1, 2, 3), (1, 2, 3, 9, 9), 4)  # more than the finish can have computed
    assert S.inv_turn_saved_past((), (7,), 1)
