"""spec/lru.py: the LRU detachment laws fail on broken lists; every op keeps them; misuse raises typed errors."""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvledger.spec import lru
from kvledger.spec.errors import AlreadyInList, LruError, NodeExists, NotInList, UnknownNode
from kvledger.spec.lru import (
    DETACHED,
    SENTINEL,
    LruState,
    inv_lru,
    inv_lru_detached,
    inv_lru_links_symmetric,
    inv_lru_members,
    lru_add_node,
    lru_delete_node,
    lru_eviction_order,
    lru_insert_mru,
    lru_lru_first,
    lru_remove,
    lru_touch,
    new_lru,
)
from kvledger.spec.types import Component, NodeId


def build(members: Sequence[int], extra: Sequence[int] = ()) -> LruState:
    """A list whose head..tail is ``members`` (inserted tail first), plus detached ``extra`` nodes."""
    s = new_lru()
    for n in [*members, *extra]:
        s = lru_add_node(s, NodeId(n))
    for n in reversed(members):
        s = lru_insert_mru(s, NodeId(n))
    return s


# ---------------------------------------------------------------- the laws reject broken lists


def test_b1_removed_node_keeps_its_links_breaks_detachment() -> None:
    s = build([1, 2, 3])
    # B1: _remove_node relinked 1 <-> 3 but left node 2 pointing at them.
    broken = LruState((NodeId(1), NodeId(3)), {**s.links, NodeId(1): (None, NodeId(3)), NodeId(3): (NodeId(1), None)})
    assert broken.links[NodeId(2)] == (NodeId(1), NodeId(3))
    assert not inv_lru_detached(broken)
    assert not inv_lru_links_symmetric(broken)
    assert inv_lru(lru_remove(s, NodeId(2)))


def test_b1_detached_node_still_pointing_at_a_sentinel_breaks_detachment() -> None:
    s = build([1])
    broken = LruState((), {NodeId(1): (SENTINEL, SENTINEL)})
    assert not inv_lru_detached(broken)
    assert lru_remove(s, NodeId(1)).links[NodeId(1)] == DETACHED


def test_evicted_neighbours_pointing_at_each_other_break_both_laws() -> None:
    # The reference cycle of B1: two evicted nodes that were adjacent.
    broken = LruState((), {NodeId(1): (None, NodeId(2)), NodeId(2): (NodeId(1), None)})
    assert inv_lru_links_symmetric(broken)  # the cycle is symmetric ...
    assert not inv_lru_detached(broken)  # ... but outside the list


@pytest.mark.parametrize(
    "order, links",
    [
        ((1, 1), {1: (None, None)}),  # duplicate member
        ((1, 2), {1: (None, 2)}),  # member unknown to links
        ((1, 2), {1: (None, 2), 2: (None, None)}),  # tail's prev missing
        ((1, 2), {1: (2, None), 2: (None, 1)}),  # links run backwards
    ],
)
def test_detachment_rejects_malformed_lists(order: tuple[int, ...], links: dict[int, tuple[int | None, ...]]) -> None:
    assert not inv_lru_detached(LruState(order, links))  # type: ignore[arg-type]


def test_symmetry_rejects_one_way_and_dangling_pointers() -> None:
    assert not inv_lru_links_symmetric(LruState((), {NodeId(1): (None, NodeId(2)), NodeId(2): DETACHED}))
    assert not inv_lru_links_symmetric(LruState((), {NodeId(1): (NodeId(9), None)}))


def test_members_law() -> None:
    s = build([1, 2], extra=[3])
    assert inv_lru_members(s, frozenset({NodeId(1), NodeId(2)}))
    assert not inv_lru_members(s, frozenset({NodeId(1), NodeId(2), NodeId(3)}))


# ---------------------------------------------------------------- operations


def test_order_runs_mru_to_lru_and_eviction_walks_from_the_tail() -> None:
    s = build([3, 2, 1])
    assert s.order == (3, 2, 1)
    assert lru_eviction_order(s) == (1, 2, 3)
    assert lru_lru_first(s) == 1
    assert lru_lru_first(s, skip=frozenset({NodeId(1), NodeId(2)})) == 3
    assert lru_lru_first(s, skip=frozenset({NodeId(1), NodeId(2), NodeId(3)})) is None
    s = lru_touch(s, NodeId(1))
    assert s.order == (1, 3, 2)
    assert s.links == {1: (None, 3), 3: (1, 2), 2: (3, None)}


Op = Callable[[LruState, NodeId], LruState]
OPS: dict[str, tuple[Op, Callable[[LruState, NodeId], LruError | None]]] = {
    "add": (lru_add_node, lru.check_lru_add_node),
    "delete": (lru_delete_node, lru.check_lru_delete_node),
    "insert_mru": (lru_insert_mru, lru.check_lru_insert_mru),
    "remove": (lru_remove, lru.check_lru_remove),
    "touch": (lru_touch, lru.check_lru_touch),
}


@given(st.lists(st.tuples(st.sampled_from(sorted(OPS)), st.integers(0, 4)), max_size=40))
def test_any_sequence_keeps_the_laws_and_matches_a_list_model(steps: list[tuple[str, int]]) -> None:
    s, model, known = new_lru(Component.SWA), list[NodeId](), set[NodeId]()
    for name, n in steps:
        node = NodeId(n)
        op, check = OPS[name]
        err = check(s, node)
        if err is not None:
            before = copy.deepcopy(s)
            with pytest.raises(type(err)):
                op(s, node)
            assert s == before, "a rejected call changed the state"
            continue
        s = op(s, node)
        if name == "add":
            known.add(node)
        elif name == "delete":
            known.discard(node)
        elif name == "insert_mru":
            model.insert(0, node)
        elif name == "remove":
            model.remove(node)
        else:
            model.remove(node)
            model.insert(0, node)
        assert inv_lru(s)
        assert s.order == tuple(model)
        assert set(s.links) == known
        assert lru_lru_first(s) == (model[-1] if model else None)


def test_ops_do_not_mutate_their_input() -> None:
    s = build([1, 2, 3], extra=[4])
    before = copy.deepcopy(s)
    lru_remove(s, NodeId(2))
    lru_touch(s, NodeId(3))
    lru_insert_mru(s, NodeId(4))
    lru_add_node(s, NodeId(5))
    lru_delete_node(s, NodeId(4))
    assert s == before


# ---------------------------------------------------------------- misuse


@pytest.mark.parametrize(
    "op, node, error, words",
    [
        (lru_insert_mru, 1, AlreadyInList, "already in the list"),
        (lru_insert_mru, 9, UnknownNode, "unknown node"),
        (lru_remove, 3, NotInList, "removed twice"),
        (lru_remove, 9, NotInList, "not in the list"),
        (lru_touch, 3, NotInList, "not in the list"),
        (lru_add_node, 3, NodeExists, "already exists"),
        (lru_delete_node, 1, AlreadyInList, "remove it before deleting"),
        (lru_delete_node, 9, UnknownNode, "deleted twice"),
    ],
)
def test_misuse_raises_a_typed_error_naming_op_list_and_node(
    op: Op, node: int, error: type[LruError], words: str
) -> None:
    s = build([1, 2], extra=[3])
    before = copy.deepcopy(s)
    with pytest.raises(error) as info:
        op(s, NodeId(node))
    msg = str(info.value)
    assert op.__name__ in msg and f"node {node}" in msg and "full LRU list" in msg and words in msg
    assert s == before


# ---------------------------------------------------------------- recency


@given(st.lists(st.tuples(st.integers(0, 5), st.booleans()), max_size=40))
def test_a_list_kept_by_touches_orders_its_stamps(steps: list[tuple[int, bool]]) -> None:
    """Touch nodes (each touch at a new tick); the list's order never inverts the stamps, however wide the
    uncertainty an observer adds (``hi`` moved later for some nodes: uses it may have missed)."""
    s, stamps = new_lru(), dict[NodeId, lru.Stamp]()
    for tick, (n, unsure) in enumerate(steps, 1):
        node = NodeId(n)
        s = lru_touch(s, node) if node in s.links else lru_insert_mru(lru_add_node(s, node), node)
        stamps[node] = (tick, tick)
        if unsure:  # NOTE: an observer unsure whether the others were refreshed too widens their hi only
            stamps = {m: (lo, tick) if m != node else (lo, hi) for m, (lo, hi) in stamps.items()}
        assert lru.inv_lru_recency(s.order, stamps)


def test_recency_inversion_names_the_pair() -> None:
    stamps = {NodeId(1): (5, 5), NodeId(2): (1, 2), NodeId(3): (3, 3)}
    assert lru.recency_inversion([NodeId(1), NodeId(3), NodeId(2)], stamps) is None
    assert lru.recency_inversion([NodeId(2), NodeId(1), NodeId(3)], stamps) == (2, 1)  # 2 ahead, used before 1
    assert not lru.inv_lru_recency([NodeId(1), NodeId(2), NodeId(3)], stamps)
    # an unsure node (hi past the other's lo) and an unknown one never count as an inversion
    assert lru.inv_lru_recency([NodeId(2), NodeId(1)], {NodeId(2): (1, 9), NodeId(1): (5, 5)})
    assert lru.inv_lru_recency([NodeId(7), NodeId(1)], stamps)


def test_joint_stamp_of_a_node_bounds_each_page() -> None:
    assert lru.joint_stamp([(1, 4), (3, 9), (2, 5)]) == (3, 4)
    assert lru.joint_stamp([]) is None


def test_eviction_laws_fail_on_a_wrong_eviction() -> None:
    assert lru.evicts_lru_first([(1, 1), (2, 3)], [(2, 2), (5, 5)])
    assert not lru.evicts_lru_first([(4, 4)], [(1, 3)])  # took what was used at 4, kept what was last used by 3
    assert lru.evicts_lru_first([], [(1, 1)])
    assert lru.evicts_enough(asked=5, could=3, freed=3) and lru.evicts_enough(5, 9, 6)
    assert not lru.evicts_enough(asked=5, could=9, freed=4)
    assert lru.evicts_no_more(asked=5, freed=6, last=[4, 2])  # without the node of 2 it freed 4 < 5
    assert not lru.evicts_no_more(asked=5, freed=8, last=[2, 3])  # either could go back, still >= 5
    assert lru.evicts_no_more(asked=5, freed=3, last=[3])  # freed less than asked: nothing more to take
