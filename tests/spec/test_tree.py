"""The tree's pointer laws (``spec.tree``): each holds on a sound tree and fails on a hand-broken one."""

from __future__ import annotations

from kvledger.spec import tree as T
from kvledger.spec.lru import DETACHED, LruState, inv_lru_detached
from kvledger.spec.types import NodeId

R, A, B, C = NodeId(0), NodeId(1), NodeId(2), NodeId(3)


def sound() -> T.TreeLinks:
    """root -> 1 -> {2, 3}."""
    return T.TreeLinks(
        R,
        {R: None, A: R, B: A, C: A},
        {R: frozenset({A}), A: frozenset({B, C}), B: frozenset(), C: frozenset()},
        frozenset({R, A, B, C}),
        frozenset({A, B}),
    )


def evicted(parent_kept: bool = False, child_kept: bool = False) -> T.TreeLinks:
    """``sound()`` with leaf 3 evicted: its parent drops it; it keeps what the flags say."""
    return T.TreeLinks(
        R,
        {R: None, A: R, B: A, C: A if parent_kept else None},
        {R: frozenset({A}), A: frozenset({B}), B: frozenset(), C: frozenset({B}) if child_kept else frozenset()},
        frozenset({R, A, B}),
    )


def test_sound_tree_keeps_every_law() -> None:
    assert T.inv_tree(sound()) and T.inv_tree(evicted())
    assert sound().live == {R, A, B, C} and evicted().live == {R, A, B}


def test_evicted_node_keeping_a_pointer_breaks_detachment() -> None:
    assert not T.inv_tree_detached(evicted(parent_kept=True))
    assert not T.inv_tree_detached(evicted(child_kept=True))


def test_live_node_pointing_at_an_evicted_one_breaks_detachment() -> None:
    s = evicted()
    dangling = T.TreeLinks(R, {**s.parent, B: C}, s.children, s.index)  # live node 2 names evicted node 3
    assert not T.inv_tree_detached(dangling)


def test_one_sided_link_breaks_symmetry() -> None:
    s = sound()
    assert not T.inv_tree_links_symmetric(T.TreeLinks(R, {**s.parent, C: B}, s.children))


def test_parent_cycle_breaks_acyclicity() -> None:
    s = sound()
    assert not T.inv_tree_acyclic(T.TreeLinks(R, {**s.parent, A: B}, s.children))


def test_stale_index_or_cursor_breaks_the_index_law() -> None:
    s = evicted()
    assert not T.inv_tree_index(T.TreeLinks(R, s.parent, s.children, frozenset({R, A, B, C})))
    assert not T.inv_tree_index(T.TreeLinks(R, s.parent, s.children, s.index, frozenset({C})))


def test_lru_detachment_is_the_same_law() -> None:
    s = LruState((A,), {A: DETACHED, B: (A, None)})
    assert not inv_lru_detached(s) and not T.detached(s.links[B]) and T.detached(DETACHED)
