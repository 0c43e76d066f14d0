"""The shared-ownership laws (spec/shared.py): each holds on a well-formed pool and fails on a broken one."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvledger.contracts.machines.shared_laws import check_refused, check_shared_laws, check_transition
from kvledger.spec import shared as S
from kvledger.spec.lru import LruState
from kvledger.spec.shared import SharedPool
from kvledger.spec.types import request

A, B = request(1), request(2)
KEY0, KEY1 = ("p", 0), ("p", 1)


def good() -> SharedPool:
    """Block 0 is the sentinel; 1 is shared by two requests; 2 held by one; 3 is an evictable cached block; 4 free."""
    return SharedPool(
        "kv",
        5,
        holders={0: (A,), 1: (A, B), 2: (B,)},
        counts={0: 0, 1: 2, 2: 1, 3: 0, 4: 0},
        queue=(3, 4),
        sentinels=frozenset({0}),
        keys={1: frozenset({KEY0}), 3: frozenset({KEY1})},
        index={KEY0: frozenset({1}), KEY1: frozenset({3})},
        content={1: KEY0, 3: KEY1},
    )


class _Snap:
    def __init__(self, pool: SharedPool, counters: dict[str, tuple[int, int]] | None = None) -> None:
        self.pools = {"kv": pool}
        self.queues = {"kv": LruState(pool.queue, {3: (None, 4), 4: (3, None), 1: (None, None), 2: (None, None)})}
        self.counters = counters or {"free": (2, 2)}
        self.problems: tuple[tuple[str, str], ...] = ()


def test_well_formed_pool_satisfies_every_law() -> None:
    assert S.inv_shared(good())
    assert check_shared_laws(_Snap(good())) == []


BROKEN = {
    "inv_refcount_counts_holders": replace(good(), counts={0: 0, 1: 3, 2: 1, 3: 0, 4: 0}),
    "inv_refcount_nonnegative": replace(good(), counts={0: 0, 1: 2, 2: 1, 3: 0, 4: -1}),
    "inv_free_iff_unheld": replace(good(), queue=(3,)),
    "inv_sentinel_fixed": replace(good(), queue=(3, 4, 0)),
    "inv_index_names_carriers": replace(good(), index={KEY0: frozenset({1, 2}), KEY1: frozenset({3})}),
    "inv_keys_match_content": replace(good(), content={1: KEY1, 3: KEY1}),
}


@pytest.mark.parametrize("law", sorted(BROKEN))
def test_each_law_fails_on_a_broken_pool(law: str) -> None:
    pool = BROKEN[law]
    assert not getattr(S, law)(pool)
    assert not S.inv_shared(pool)
    assert law in {name for name, _ in check_shared_laws(_Snap(pool))}


def test_a_block_queued_twice_breaks_free_iff_unheld() -> None:
    assert not S.inv_free_iff_unheld(replace(good(), queue=(3, 4, 3)))


def test_a_carried_key_missing_from_the_index_breaks_the_index_law() -> None:
    pool = replace(good(), index={KEY0: frozenset({1})})
    assert S.index_mismatches(pool) == [(KEY1, 3, "carries the key but is not indexed under it")]


def test_counters_must_equal_their_recount() -> None:
    assert S.inv_counters_recount({"free": (2, 2)})
    assert not S.inv_counters_recount({"free": (3, 2)})
    assert "inv_counters_recount" in {n for n, _ in check_shared_laws(_Snap(good(), {"free": (3, 2)}))}


def test_queue_links_are_checked_as_an_intrusive_list() -> None:
    snap = _Snap(good())
    snap.queues = {"kv": LruState((3, 4), {3: (None, 4), 4: (3, None), 1: (None, 4), 2: (None, None)})}
    assert "inv_lru_detached" in {n for n, _ in check_shared_laws(snap)}


def test_a_queued_block_linked_out_of_its_place_is_named() -> None:
    """A queued block whose links are not the ones its place in the walk gives (block 3 lost its next link), and a
    block the walk meets twice (its links fit one place at most): the detail names each, not only the strays."""
    snap = _Snap(good())
    snap.queues = {"kv": LruState((3, 4), {3: (None, None), 4: (3, None), 1: (None, None), 2: (None, None)})}
    (detail,) = [d for n, d in check_shared_laws(snap) if n == "inv_lru_detached"]
    assert "blocks out of the queue holding links {}" in detail
    assert "{3: 'links (None, None), place gives (None, 4)'}" in detail
    snap.queues = {"kv": LruState((3, 4, 3), {3: (4, None), 4: (3, 3), 1: (None, None), 2: (None, None)})}
    (detail,) = [d for n, d in check_shared_laws(snap) if n == "inv_lru_detached"]
    assert "{3: 'links (4, None), place gives (None, 4)'}" in detail  # NOTE: its second place's links, not its first


def test_a_sentinel_count_that_moves_breaks_the_transition_law() -> None:
    moved = replace(good(), counts={0: -1, 1: 2, 2: 1, 3: 0, 4: 0})
    assert not S.sentinel_count_fixed(good(), moved)
    assert [n for n, _ in check_transition(_Snap(good()), _Snap(moved))] == ["sentinel_count_fixed"]
    assert S.sentinel_count_fixed(good(), good())


def test_a_refused_admission_must_leave_the_pool_as_it_was() -> None:
    assert check_refused(7, good(), good()) == []
    leaked = replace(good(), counts={0: 0, 1: 3, 2: 1, 3: 0, 4: 0})
    [(law, detail)] = check_refused(7, good(), leaked)
    assert law == "admission is a transaction"
    assert "block 1: count 2 -> 3" in detail
    assert not S.pool_unchanged(good(), replace(good(), queue=(4, 3)))


def test_a_single_owner_ledger_is_a_shared_pool_with_one_holder_per_block() -> None:
    from kvledger.spec.ledger import Ledger, allocate, new_ledger

    led = allocate(allocate(new_ledger("kv", 6), A, frozenset({0, 1})), B, frozenset({4}))
    pool = S.from_ledger(led)
    assert S.inv_shared(pool)
    assert pool.holders == {0: (A,), 1: (A,), 4: (B,)} and pool.queue == (2, 3, 5)
    # a slot both free and held (single ownership broken) breaks the shared laws too
    both = Ledger("kv", 6, frozenset({2, 3, 4, 5}), {A: frozenset({0, 1}), B: frozenset({4})})
    assert not S.inv_free_iff_unheld(S.from_ledger(both))
    # a slot held by two owners is two holders for a count of 1
    twice = Ledger("kv", 6, frozenset({2, 3, 5}), {A: frozenset({0, 1, 4}), B: frozenset({4})})
    assert S.refcount_mismatches(S.from_ledger(twice)) == {4: (1, 2)}
