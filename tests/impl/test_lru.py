"""The intrusive LRU list against ``kvledger.spec.lru``: same operations, same order and links."""

from __future__ import annotations

import random

import pytest

from kvledger.impl.lru import SENTINEL_ID, Linked, LRUList
from kvledger.spec import lru as spec
from kvledger.spec.errors import AlreadyInList, IntegrityError, NotInList
from kvledger.spec.types import Component, NodeId

FULL, SWA = Component.FULL, Component.SWA


def abstract(lst: LRUList[Linked], nodes: list[Linked]) -> spec.LruState:
    """The spec state of ``lst``: its order, and every node's (prev, next) ids (sentinels as None inside)."""
    c = lst.component

    def ident(x: Linked | None, member: bool) -> NodeId | None:
        if x is None or (member and x.id == SENTINEL_ID):
            return None
        return NodeId(x.id)

    links = {NodeId(n.id): (ident(n.lru_prev[c], n in lst), ident(n.lru_next[c], n in lst)) for n in nodes}
    return spec.LruState(tuple(NodeId(i) for i in lst.order()), links, c)


def two_listed() -> tuple[LRUList[Linked], tuple[Linked, Linked, Linked]]:
    """A list holding nodes 1 and 2 (2 most recent), and node 3 outside it."""
    lst: LRUList[Linked] = LRUList(FULL)
    a, b, c = Linked(1), Linked(2), Linked(3)
    lst.insert_mru(a)
    lst.insert_mru(b)
    return lst, (a, b, c)


def test_insert_touch_remove_clears_links() -> None:
    lst: LRUList[Linked] = LRUList(FULL)
    a, b, c = Linked(1), Linked(2), Linked(3)
    for n in (a, b, c):
        lst.insert_mru(n)
    assert lst.order() == [3, 2, 1] and len(lst) == 3
    assert [n.id for n in lst.iter_lru()] == [1, 2, 3]
    lst.touch(a)
    assert lst.order() == [1, 3, 2] and lst.lru_first() is b
    lst.remove(c)
    assert c.lru_prev[FULL] is None and c.lru_next[FULL] is None  # B1: detached
    assert lst.order() == [1, 2] and c not in lst
    lst.check()


def test_misuse_raises_and_changes_nothing() -> None:
    lst: LRUList[Linked] = LRUList(FULL)
    a, b = Linked(1), Linked(2)
    lst.insert_mru(a)
    with pytest.raises(AlreadyInList):
        lst.insert_mru(a)
    with pytest.raises(NotInList, match="node 2"):
        lst.remove(b)
    with pytest.raises(NotInList):
        lst.touch(b)
    with pytest.raises(NotInList):
        lst.insert_ahead_of(b, Linked(3))
    assert lst.order() == [1] and b.lru_prev[FULL] is None
    lst.check()


def test_components_are_independent() -> None:
    full: LRUList[Linked] = LRUList(FULL)
    swa: LRUList[Linked] = LRUList(SWA)
    a, b = Linked(1), Linked(2)
    full.insert_mru(a)
    full.insert_mru(b)
    swa.insert_mru(a)
    swa.remove(a)
    assert a.lru_prev[SWA] is None and a.lru_next[FULL] is not None
    assert full.order() == [2, 1] and swa.order() == []


def test_insert_ahead_of_places_on_mru_side() -> None:
    lst, (a, _, c) = two_listed()
    lst.insert_ahead_of(a, c)
    assert lst.order() == [2, 3, 1]
    lst.check()


def test_iteration_tolerates_removing_the_yielded_node() -> None:
    lst: LRUList[Linked] = LRUList(FULL)
    nodes = [Linked(i) for i in range(1, 6)]
    for n in nodes:
        lst.insert_mru(n)
    seen = []
    for n in lst.iter_lru():
        seen.append(n.id)
        if n.id % 2:
            lst.remove(n)
    assert seen == [1, 2, 3, 4, 5] and lst.order() == [4, 2]


def test_check_detects_a_broken_link() -> None:
    lst: LRUList[Linked] = LRUList(FULL)
    a, b = Linked(1), Linked(2)
    lst.insert_mru(a)
    lst.insert_mru(b)
    a.lru_prev[FULL] = lst.head  # asymmetric: head.next is b
    with pytest.raises(IntegrityError, match="asymmetric"):
        lst.check()


def test_random_operations_refine_the_spec() -> None:
    rng = random.Random(7)
    lst: LRUList[Linked] = LRUList(FULL)
    nodes = [Linked(i) for i in range(1, 9)]
    model = spec.new_lru(FULL)
    for n in nodes:
        model = spec.lru_add_node(model, NodeId(n.id))
    for _ in range(400):
        n = rng.choice(nodes)
        op = rng.choice(["insert_mru", "remove", "touch", "place"])
        if op == "place":  # a path placed at the head: the spec's touches from its end
            members = [x for x in nodes if x in lst]
            order = rng.sample(members, rng.randint(0, len(members)))
            if rng.random() < 0.5:
                lst.place(order)  # again: already in place, nothing moves
            lst.place(order)
            for x in reversed(order):
                model = spec.lru_touch(model, NodeId(x.id))
            assert abstract(lst, nodes) == model
            lst.check()
            continue
        ok = {"insert_mru": spec.check_lru_insert_mru, "remove": spec.check_lru_remove, "touch": spec.check_lru_touch}
        err = ok[op](model, NodeId(n.id))
        if err is not None:
            with pytest.raises(type(err)):
                getattr(lst, op)(n)
        else:
            getattr(lst, op)(n)
            model = {"insert_mru": spec.lru_insert_mru, "remove": spec.lru_remove, "touch": spec.lru_touch}[op](
                model, NodeId(n.id)
            )
        got = abstract(lst, nodes)
        assert got == model
        assert spec.inv_lru(got)
        lst.check()
        assert [x.id for x in lst.iter_lru()] == list(spec.lru_eviction_order(model))


def listed_with_model(count: int) -> tuple[LRUList[Linked], list[Linked], spec.LruState]:
    """A list holding nodes ``1 .. count`` (``count`` most recent) and the spec state it refines."""
    nodes = [Linked(i) for i in range(1, count + 1)]
    lst: LRUList[Linked] = LRUList(FULL)
    model = spec.new_lru(FULL)
    for n in nodes:
        model = spec.lru_add_node(model, NodeId(n.id))
        lst.insert_mru(n)
        model = spec.lru_insert_mru(model, NodeId(n.id))
    return lst, nodes, model


def test_touch_all_is_the_spec_touches_in_turn() -> None:
    """A whole-path touch ends where touching each node in turn does (the last at the head), for any members."""
    rng = random.Random(11)
    lst, nodes, model = listed_with_model(10)
    for _ in range(300):
        seq = rng.sample(nodes, rng.randint(1, len(nodes)))
        if rng.random() < 0.3:  # the same path again, in the same order: already in place
            seq = [x for x in nodes if x.id in {y.id for y in seq}][::-1]
            lst.touch_all(seq)
        lst.touch_all(seq)
        for n in seq:
            model = spec.lru_touch(model, NodeId(n.id))
        assert abstract(lst, nodes) == model
        lst.check()


def test_place_of_stretches_already_in_the_list_is_the_spec_touches() -> None:
    """Orders made of stretches that already lie in the list (as a radix path's nodes mostly do), in any order
    and overlapping the head or not, end where the spec's touches do; the list stays one symmetric chain."""
    rng = random.Random(13)
    lst, nodes, model = listed_with_model(14)
    byid = {n.id: n for n in nodes}
    for _ in range(400):
        now = lst.order()
        cuts = sorted(rng.sample(range(1, len(now)), rng.randint(0, 4)))
        pieces = [now[a:b] for a, b in zip([0, *cuts], [*cuts, len(now)], strict=True)]
        rng.shuffle(pieces)
        ids = [x for piece in pieces[: rng.randint(1, len(pieces))] for x in piece[: rng.randint(1, len(piece))]]
        order = [byid[x] for x in ids]
        lst.place(order)
        for x in reversed(order):
            model = spec.lru_touch(model, NodeId(x.id))
        assert abstract(lst, nodes) == model
        lst.check()


def test_touch_all_with_a_non_member_changes_nothing() -> None:
    lst, (a, b, c) = two_listed()
    for seq in ([a, c], [c, a], [b, a, c], [a, c, b]):
        with pytest.raises(NotInList, match="node 3"):
            lst.touch_all(seq)
        assert lst.order() == [2, 1]
        lst.check()


def test_insert_behind_places_on_lru_side() -> None:
    lst, (a, b, c) = two_listed()
    lst.insert_behind(b, c)
    assert lst.order() == [2, 3, 1]
    with pytest.raises(AlreadyInList):
        lst.insert_behind(a, c)
    with pytest.raises(NotInList):
        lst.insert_behind(Linked(4), Linked(5))
    assert lst.order() == [2, 3, 1]
    lst.check()


@pytest.mark.parametrize("order", [[1, 2, 1], [2, 1, 2], [3, 1, 3, 2], [1, 3, 2, 2]])
def test_place_naming_a_node_twice_names_that_node(order: list[int]) -> None:
    """``place`` refuses an order that names a node twice, naming that node (it named the first node not yet in
    place, an innocent one, when the repeat came later; found by the LRU audit's culprit law)."""
    lst: LRUList[Linked] = LRUList(Component.FULL)
    nodes = {i: Linked(i) for i in (1, 2, 3)}
    for i in (3, 2, 1):
        lst.insert_mru(nodes[i])
    before = lst.order()
    with pytest.raises(AlreadyInList) as got:
        lst.place([nodes[i] for i in order])
    assert got.value.node == next(i for k, i in enumerate(order) if i in order[:k])
    assert lst.order() == before
