"""spec/prefix.py: the match rule on concrete caches, the content laws on broken states, misuse, a state machine."""

from __future__ import annotations

import copy
from collections.abc import Sequence

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, initialize, invariant, precondition, rule

from kvledger.spec import errors as e
from kvledger.spec.locks import Key, LockState, dec_lock_ref, inc_lock_ref, inv_locks, new_lock_state, required_coverage
from kvledger.spec.prefix import (
    PrefixCache,
    cached_len,
    evict_full,
    evict_mamba,
    evict_swa,
    evictable_size,
    fingerprint,
    insert,
    inv_content,
    inv_locked_cached,
    inv_mamba_cached,
    inv_page_aligned,
    inv_prefix,
    inv_prefix_closed,
    inv_slots_distinct,
    inv_swa_live_cached,
    match_prefix,
    new_prefix_cache,
    protected_size,
)
from kvledger.spec.types import Component, HandleId, MambaSlot, SlotId

FULL, SWA, MAMBA = Component.FULL, Component.SWA, Component.MAMBA
NO_LOCKS = new_lock_state()


def slots(*xs: int) -> tuple[SlotId, ...]:
    return tuple(SlotId(x) for x in xs)


def cache_with(s: PrefixCache, *keys: Sequence[int], base: int = 100) -> PrefixCache:
    """``s`` with each key inserted on fresh slots ``base, base + 1, ...`` (then ``base + 100`` ...)."""
    for n, key in enumerate(keys):
        s = insert(s, tuple(key), slots(*range(base * (n + 1), base * (n + 1) + len(key)))).state
    return s


# ---------------------------------------------------------------- the match rule


def test_match_is_page_aligned() -> None:
    s = cache_with(new_prefix_cache(page_size=4), (1, 2, 3, 4, 5, 6, 7, 8))
    assert match_prefix(s, (1, 2, 3, 4, 5, 6, 9, 9)).length == 4  # 6 tokens agree, one whole page
    assert match_prefix(s, (1, 2, 3)).length == 0
    assert match_prefix(s, (1, 2, 3, 4, 5, 6, 7, 8, 9)).slots == slots(*range(100, 108))


def test_pages_are_shared_only_whole() -> None:
    s = cache_with(new_prefix_cache(page_size=2), (1, 2), (1, 3))
    assert set(s.full) == {(1, 2), (1, 3)}  # token 1 at position 0 sits in two different pages
    assert match_prefix(s, (1, 3, 5)) == match_prefix(s, (1, 3))
    assert match_prefix(s, (1, 3)).slots == slots(200, 201)


def test_match_needs_the_window_before_its_end_swa_live() -> None:
    s = cache_with(new_prefix_cache(window=2), (1, 2, 3, 4, 5, 6))
    key = (1, 2, 3, 4, 5, 6)
    assert match_prefix(s, key).length == 6
    s = evict_swa(s, frozenset({(1, 2, 3)}), NO_LOCKS)  # tombstone position 2
    assert match_prefix(s, key).length == 6  # window of 6 is positions 4, 5
    s = evict_swa(s, frozenset({(1, 2, 3, 4, 5)}), NO_LOCKS)  # tombstone position 4
    # 6: needs 4, 5; 5: needs 3, 4; 4: needs 2, 3; 3: needs 1, 2; 2: needs 0, 1 -> live
    assert match_prefix(s, key).length == 2
    assert match_prefix(s, key).slots == slots(100, 101)


def test_swa_window_counts_whole_pages() -> None:
    s = cache_with(new_prefix_cache(page_size=2, window=3), (1, 2, 3, 4, 5, 6))
    s = evict_swa(s, frozenset({(1, 2)}), NO_LOCKS)
    assert match_prefix(s, (1, 2, 3, 4, 5, 6)).length == 6  # window tokens 3..5 are in pages 4 and 6
    assert match_prefix(s, (1, 2, 3, 4)).length == 0  # window tokens 1..3 touch the tombstoned page


def test_match_ends_where_a_mamba_state_sits() -> None:
    s = new_prefix_cache(mamba=True)
    s = insert(s, (1, 2), slots(10, 11), MambaSlot(7)).state
    s = insert(s, (1, 2, 3, 4), slots(10, 11, 12, 13), MambaSlot(8)).state
    assert match_prefix(s, (1, 2, 3, 4, 5)).length == 4 and match_prefix(s, (1, 2, 3, 4, 5)).mamba == 8
    assert match_prefix(s, (1, 2, 3, 9)).length == 2 and match_prefix(s, (1, 2, 3, 9)).mamba == 7
    assert match_prefix(s, (1, 9)).length == 0 and match_prefix(s, (1, 9)).mamba is None
    s, freed = evict_mamba(s, frozenset({(1, 2, 3, 4)}), NO_LOCKS)
    assert freed == {8} and match_prefix(s, (1, 2, 3, 4)).length == 2


def test_cached_len_ignores_swa_and_mamba() -> None:
    s = cache_with(new_prefix_cache(window=1, mamba=True), (1, 2, 3))
    assert cached_len(s, (1, 2, 3, 4)) == 3 and match_prefix(s, (1, 2, 3, 4)).length == 0


# ---------------------------------------------------------------- insert


def test_insert_returns_duplicates_but_not_borrowed_slots() -> None:
    s = cache_with(new_prefix_cache(page_size=2), (1, 2, 3, 4))
    m = match_prefix(s, (1, 2, 3, 4, 5, 6))
    r = insert(s, (1, 2, 3, 4, 5, 6), (*m.slots, SlotId(50), SlotId(51)))
    assert (r.prefix_len, r.dup_slots) == (4, ())  # the matched prefix was borrowed, not duplicated
    r = insert(r.state, (1, 2, 3, 4, 5, 6, 7, 8), slots(60, 61, 102, 103, 62, 63, 64, 65))
    assert r.prefix_len == 6 and r.dup_slots == (60, 61, 62, 63)  # page (1,2) recomputed, (3,4) borrowed
    assert r.state.full[(1, 2, 3, 4, 5, 6, 7, 8)] == (64, 65)


def test_insert_hands_back_a_mamba_state_for_a_key_that_has_one() -> None:
    s = insert(new_prefix_cache(mamba=True), (1,), slots(1), MambaSlot(5)).state
    r = insert(s, (1,), slots(9), MambaSlot(6))
    assert r.dup_slots == (9,) and r.dup_mamba == 6 and r.state.mamba_state == {(1,): 5}
    assert insert(s, (1,), slots(1), MambaSlot(5)).dup_mamba is None


def test_insert_never_revives_an_swa_tombstone() -> None:
    s = evict_swa(cache_with(new_prefix_cache(window=4), (1, 2)), frozenset({(1,)}), NO_LOCKS)
    r = insert(s, (1, 2, 3), slots(7, 8, 9))
    assert r.dup_slots == (7, 8) and r.state.swa_live == {(1, 2), (1, 2, 3)}


@pytest.mark.parametrize(
    "cache, key, xs, state, error, words",
    [
        (new_prefix_cache(), (1, 2), (5,), None, e.LengthMismatch, "1 slots for 2 tokens"),
        (new_prefix_cache(page_size=2), (1, 2, 3), (5, 6, 7), None, e.UnalignedKey, "page size 2"),
        (new_prefix_cache(), (1,), (5,), 3, e.ComponentDisabled, "no Mamba component"),
        (new_prefix_cache(mamba=True), (), (), 3, e.ComponentDisabled, "root"),
        (new_prefix_cache(), (1, 2), (5, 5), None, e.SlotConflict, "two positions"),
        (cache_with(new_prefix_cache(), (1, 2)), (3,), (101,), None, e.SlotConflict, "use after free"),
        (cache_with(new_prefix_cache(page_size=2), (1, 2)), (1, 2), (100, 7), None, e.SlotConflict, "partly"),
        (
            insert(new_prefix_cache(mamba=True), (1,), slots(1), MambaSlot(3)).state,
            (2,),
            (2,),
            3,
            e.SlotConflict,
            "slot 3",
        ),
    ],
)
def test_insert_misuse_raises_a_typed_error(
    cache: PrefixCache, key: Key, xs: tuple[int, ...], state: int | None, error: type[e.PrefixError], words: str
) -> None:
    before = copy.deepcopy(cache)
    with pytest.raises(error) as info:
        insert(cache, key, slots(*xs), None if state is None else MambaSlot(state))
    assert str(info.value).startswith("insert of key") and words in str(info.value)
    assert cache == before


# ---------------------------------------------------------------- eviction


def test_evict_full_frees_whole_leaf_pages_and_their_swa() -> None:
    s = cache_with(new_prefix_cache(page_size=2, window=2), (1, 2, 3, 4))
    s2, freed = evict_full(s, frozenset({(1, 2, 3, 4)}), NO_LOCKS)
    assert freed == {102, 103} and set(s2.full) == {(1, 2)} and s2.swa_live == {(1, 2)}
    s3, freed = evict_full(s, frozenset({(1, 2), (1, 2, 3, 4)}), NO_LOCKS)
    assert freed == {100, 101, 102, 103} and s3 == new_prefix_cache(page_size=2, window=2)


def locked(key: Key, comp: Component) -> LockState:
    return inc_lock_ref(new_lock_state(), HandleId(1), frozenset({(key, comp)}))


@pytest.mark.parametrize(
    "op, victims, locks, error, words",
    [
        (evict_full, {(9,)}, NO_LOCKS, e.NotCached, "evicted twice"),
        (evict_full, {(1, 2)}, locked((1, 2), FULL), e.EvictLockedError, "locked in full"),
        (evict_full, {(1, 2)}, locked((1, 2), SWA), e.EvictLockedError, "locked in swa"),
        (evict_full, {(1,)}, NO_LOCKS, e.EvictInteriorError, "extension (1, 2) stays"),
        (evict_full, {(1, 2, 3)}, NO_LOCKS, e.EvictHoldsStateError, "evict_mamba first"),
        (evict_swa, {(1, 2)}, locked((1, 2), SWA), e.EvictLockedError, "locked in swa"),
        (evict_swa, {(7,)}, NO_LOCKS, e.NotCached, "not held in swa"),
        (evict_mamba, {(1, 2)}, NO_LOCKS, e.NotCached, "not held in mamba"),
        (evict_mamba, {(1, 2, 3)}, locked((1, 2, 3), MAMBA), e.EvictLockedError, "locked in mamba"),
    ],
)
def test_evict_misuse_raises_a_typed_error(
    op: object, victims: set[Key], locks: LockState, error: type[e.PrefixError], words: str
) -> None:
    s = cache_with(new_prefix_cache(window=2, mamba=True), (1, 2), (5,))
    s = insert(s, (1, 2, 3), slots(100, 101, 50), MambaSlot(1)).state
    before = copy.deepcopy(s)
    with pytest.raises(error) as info:
        op(s, frozenset(victims), locks)  # type: ignore[operator]
    assert words in str(info.value)
    assert s == before


def test_evict_swa_without_a_window_is_rejected() -> None:
    s = cache_with(new_prefix_cache(), (1,))
    with pytest.raises(e.ComponentDisabled):
        evict_swa(s, frozenset({(1,)}), NO_LOCKS)


def test_sizes_recompute_from_locks() -> None:
    s = cache_with(new_prefix_cache(page_size=2, window=2), (1, 2, 3, 4), (5, 6))
    locks = inc_lock_ref(new_lock_state(), HandleId(1), required_coverage((1, 2, 3, 4), 2, False, 2))
    assert (evictable_size(s, locks, FULL), protected_size(s, locks, FULL)) == (2, 4)
    assert (evictable_size(s, locks, SWA), protected_size(s, locks, SWA)) == (4, 2)
    assert (evictable_size(s, NO_LOCKS, MAMBA), protected_size(s, NO_LOCKS, MAMBA)) == (0, 0)


# ---------------------------------------------------------------- the laws reject broken caches


def test_each_law_rejects_a_state_that_breaks_it() -> None:
    ok = cache_with(new_prefix_cache(page_size=2, window=2, mamba=True), (1, 2, 3, 4))
    full = dict(ok.full)
    assert inv_prefix(ok)
    assert not inv_prefix_closed(PrefixCache(2, 2, True, {(1, 2, 3, 4): full[(1, 2, 3, 4)]}))
    assert not inv_page_aligned(PrefixCache(2, 2, True, {**full, (1, 2, 3): slots(7, 8)}))
    assert not inv_page_aligned(PrefixCache(2, 2, True, {**full, (1, 2, 3, 4, 5, 6): slots(7)}))
    assert not inv_swa_live_cached(PrefixCache(2, 2, True, full, frozenset({(9, 9)})))
    assert not inv_swa_live_cached(PrefixCache(2, None, True, full, frozenset({(1, 2)})))
    assert not inv_mamba_cached(PrefixCache(2, 2, True, full, frozenset(), {(9, 9): MambaSlot(1)}))
    assert not inv_mamba_cached(PrefixCache(2, 2, False, full, frozenset(), {(1, 2): MambaSlot(1)}))
    assert not inv_slots_distinct(PrefixCache(2, 2, True, {**full, (1, 2, 3, 4): slots(100, 103)}))
    states = {(1, 2): MambaSlot(1), (1, 2, 3, 4): MambaSlot(1)}
    assert not inv_slots_distinct(PrefixCache(2, 2, True, full, frozenset(), states))


def test_a_lock_on_an_evicted_page_breaks_locked_cached() -> None:
    s = cache_with(new_prefix_cache(), (1, 2))
    locks = inc_lock_ref(new_lock_state(), HandleId(1), required_coverage((1, 2), None, False))
    assert inv_locked_cached(s, locks)
    # what evicting without checking locks would leave behind
    assert not inv_locked_cached(PrefixCache(full={(1,): slots(100)}), locks)


def test_content_law_catches_a_wrong_or_stale_slot() -> None:
    s = cache_with(new_prefix_cache(page_size=2), (5, 6, 7, 8))
    good = {SlotId(100 + i): fingerprint(t, i) for i, t in enumerate((5, 6, 7, 8))}
    assert inv_content(s, good)
    assert not inv_content(s, {**good, SlotId(102): fingerprint(9, 2)})  # another token in that slot
    assert not inv_content(s, {**good, SlotId(102): fingerprint(7, 0)})  # that token from another position
    assert not inv_content(s, {k: v for k, v in good.items() if k != 103})  # a slot with nothing written


def test_fingerprint_is_pinned_small_and_int64_safe() -> None:
    # NOTE: the torch implementation writes these exact values; changing them is a format change.
    assert [fingerprint(t, p) for t, p in [(0, 0), (1, 0), (0, 1), (151_935, 4095)]] == PINNED
    assert all(1 <= fingerprint(t, p) < 2**24 for t in range(50) for p in range(50))
    assert (2**31 - 1) * (0x2545F491 + 0x4F6CDD1D) + 0x6A09E667 < 2**63 and (2**32 - 1) * 0x045D9F3B < 2**63
    # a wrong token at a position, or a token from a wrong position, changes the value (on this grid)
    assert all(len({fingerprint(t, p) for t in range(64)}) == 64 for p in range(64))
    assert all(len({fingerprint(t, p) for p in range(64)}) == 64 for t in range(64))


PINNED = [6403414, 10107, 9725465, 4425016]


# ---------------------------------------------------------------- state machine: cache, locks, slots, content

TOKENS = st.lists(st.integers(0, 2), max_size=6)


class PrefixMachine(RuleBasedStateMachine):
    """Cache and lock table driven together; every slot ever allocated is cached or freed, never both."""

    handles = Bundle("handles")

    @initialize(page=st.sampled_from([1, 2]), window=st.sampled_from([None, 1, 3]), mamba=st.booleans())
    def init(self, page: int, window: int | None, mamba: bool) -> None:
        self.cache = new_prefix_cache(page, window, mamba)
        self.locks = new_lock_state()
        self.content: dict[SlotId, int] = {}
        self.freed: set[int] = set()
        self.states: set[int] = set()
        self.freed_states: set[int] = set()
        self.next_handle = 0

    def _key(self, tokens: list[int]) -> Key:
        return tuple(tokens[: len(tokens) - len(tokens) % self.cache.page_size])

    @rule(tokens=TOKENS, borrow=st.booleans(), with_state=st.booleans())
    def insert(self, tokens: list[int], borrow: bool, with_state: bool) -> None:
        key = self._key(tokens)
        borrowed = match_prefix(self.cache, key).slots if borrow else ()
        fresh = [SlotId(len(self.content) + i) for i in range(len(key) - len(borrowed))]
        for i, x in enumerate(fresh, len(borrowed)):
            self.content[x] = fingerprint(key[i], i)
        state = MambaSlot(len(self.states)) if with_state and self.cache.mamba and key else None
        if state is not None:
            self.states.add(state)
        r = insert(self.cache, key, (*borrowed, *fresh), state)
        assert set(r.dup_slots) <= set(fresh), "only the caller's own slots come back"
        self.freed |= set(r.dup_slots)
        if r.dup_mamba is not None:
            self.freed_states.add(r.dup_mamba)
        self.cache = r.state

    @rule(target=handles, tokens=TOKENS)
    def lock(self, tokens: list[int]) -> HandleId:
        key = self._key(tokens)
        m = match_prefix(self.cache, key)
        c = self.cache
        handle, self.next_handle = HandleId(self.next_handle), self.next_handle + 1
        cover = required_coverage(key[: m.length], c.window, c.mamba, c.page_size)
        self.locks = inc_lock_ref(self.locks, handle, cover)
        return handle

    @rule(handle=consumes(handles))
    def unlock(self, handle: HandleId) -> None:
        self.locks = dec_lock_ref(self.locks, handle)

    def _unlocked(self, keys: object, *comps: Component) -> list[Key]:
        return sorted(k for k in keys if all((k, c) not in self.locks.lock_ref for c in comps))  # type: ignore[attr-defined]

    @precondition(lambda self: self.cache.full)
    @rule(data=st.data())
    def evict_full(self, data: st.DataObject) -> None:
        parents = {k[: -self.cache.page_size] for k in self.cache.full}
        leaves = [k for k in self.cache.full if k not in parents and k not in self.cache.mamba_state]
        choice = self._unlocked(leaves, FULL, SWA, MAMBA)
        if not choice:
            return
        victims = data.draw(st.frozensets(st.sampled_from(choice), min_size=1))
        self.cache, freed = evict_full(self.cache, victims, self.locks)
        self.freed |= freed

    @precondition(lambda self: self.cache.swa_live)
    @rule(data=st.data())
    def evict_swa(self, data: st.DataObject) -> None:
        choice = self._unlocked(self.cache.swa_live, SWA)
        if choice:
            self.cache = evict_swa(self.cache, data.draw(st.frozensets(st.sampled_from(choice))), self.locks)

    @precondition(lambda self: self.cache.mamba_state)
    @rule(data=st.data())
    def evict_mamba(self, data: st.DataObject) -> None:
        choice = self._unlocked(self.cache.mamba_state, MAMBA)
        if choice:
            self.cache, freed = evict_mamba(self.cache, data.draw(st.frozensets(st.sampled_from(choice))), self.locks)
            self.freed_states |= freed

    @precondition(lambda self: self.locks.lock_ref)
    @rule(data=st.data())
    def evicting_a_locked_page_is_rejected(self, data: st.DataObject) -> None:
        key, comp = data.draw(st.sampled_from(sorted(self.locks.lock_ref, key=repr)))
        op = {FULL: evict_full, SWA: evict_swa, MAMBA: evict_mamba}[comp]
        with pytest.raises(e.EvictLockedError):
            op(self.cache, frozenset({key}), self.locks)

    @invariant()
    def laws(self) -> None:
        c = self.cache
        assert inv_prefix(c) and inv_locks(self.locks) and inv_locked_cached(c, self.locks)
        assert inv_content(c, self.content)
        cached = {x for xs in c.full.values() for x in xs}
        assert not cached & self.freed and cached | self.freed == set(self.content), "KV slot leaked or doubly held"
        held = set(c.mamba_state.values())
        assert not held & self.freed_states and held | self.freed_states == self.states, "Mamba slot leaked"
        for comp in (FULL, SWA, MAMBA):
            unit = 1 if comp is MAMBA else c.page_size
            total = {FULL: len(c.full), SWA: len(c.swa_live), MAMBA: len(c.mamba_state)}[comp] * unit
            assert evictable_size(c, self.locks, comp) + protected_size(c, self.locks, comp) == total


TestPrefixMachine = PrefixMachine.TestCase
