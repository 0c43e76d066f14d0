"""The torch pools: real allocation behaviour, typed errors, state unchanged on rejection."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kvledger.contracts.abstraction import abstract
from kvledger.impl.allocators import PagedAllocator, SWATokenAllocator, TokenAllocator
from kvledger.impl.integrity import fingerprint
from kvledger.impl.mamba import MambaPool
from kvledger.impl.req_to_token import ReqToTokenPool
from kvledger.impl.slots import SlotPool, host_bytes
from kvledger.spec.errors import (
    DoubleFree,
    IntegrityError,
    InvalidArgument,
    KVLedgerError,
    NotOwner,
    OutOfRange,
    OverAllocation,
    PageAlignmentError,
)
from kvledger.spec.prefix import fingerprint as spec_fingerprint
from kvledger.spec.types import Component, node, request, session

R1, R2 = request(1), request(2)


def rejected(pool: object, call: Callable[[], object], error: type[KVLedgerError]) -> KVLedgerError:
    before = abstract(pool)  # type: ignore[arg-type]
    with pytest.raises(error) as info:
        call()
    assert abstract(pool) == before  # type: ignore[arg-type]
    return info.value


def test_token_allocator_reserves_padding_slot_and_reuses_freed() -> None:
    a = TokenAllocator(4)
    x = a.alloc(4, R1)
    assert sorted(x.tolist()) == [1, 2, 3, 4] and a.available_size() == 0
    rejected(a, lambda: a.alloc(1, R2), OverAllocation)
    a.free(x[:2], R1)
    y = a.alloc(2, R2)
    assert sorted(y.tolist()) == sorted(x[:2].tolist())
    assert a.pool.owner_of(int(y[0])) == R2


def test_token_allocator_typed_errors() -> None:
    a = TokenAllocator(8)
    x = a.alloc(3, R1)
    err = rejected(a, lambda: a.free(x, R2), NotOwner)
    assert "held by req:1, not by req:2" in str(err) and "free" in str(err)
    a.free(x[:1], R1)
    err = rejected(a, lambda: a.free(x[:1], R1), DoubleFree)
    assert f"[{int(x[0])}]" in str(err)
    rejected(a, lambda: a.free(torch.tensor([0]), R1), OutOfRange)
    rejected(a, lambda: a.free(torch.tensor([9]), R1), OutOfRange)
    rejected(a, lambda: a.free(x[1:].float(), R1), InvalidArgument)
    rejected(a, lambda: a.free(x[1:].reshape(1, -1), R1), InvalidArgument)
    rejected(a, lambda: a.free(torch.cat((x[1:], x[1:2])), R1), InvalidArgument)
    rejected(a, lambda: a.free(x[1:].tolist(), R1), InvalidArgument)  # type: ignore[arg-type]
    rejected(a, lambda: a.alloc(-1, R1), InvalidArgument)
    rejected(a, lambda: a.alloc(-2, R1), InvalidArgument)
    rejected(a, lambda: a.transfer(x[1:], R2, session(1)), NotOwner)


def test_token_allocator_rejects_wrong_device() -> None:
    a = TokenAllocator(8)
    x = a.alloc(2, R1)
    meta = torch.empty(2, dtype=torch.int64, device="meta")
    err = rejected(a, lambda: a.free(meta, R1), InvalidArgument)
    assert "meta" in str(err)
    assert x.device == a.device


def test_int32_indices_are_accepted() -> None:
    a = TokenAllocator(8)
    x = a.alloc(2, R1)
    a.free(x.to(torch.int32), R1)
    assert a.available_size() == 8


@pytest.mark.parametrize("dtype", [torch.int16, torch.int8, torch.uint8, torch.uint16, torch.uint32, torch.uint64])
@pytest.mark.parametrize("make", [lambda: TokenAllocator(8), lambda: PagedAllocator(8, 2)], ids=["token", "paged"])
def test_ids_in_any_integer_dtype_name_the_same_slots(make: Callable[[], TokenAllocator], dtype: torch.dtype) -> None:
    """``spec.domains.IDS_DTYPES``: a transfer and a free of ids kept in a narrow or unsigned dtype act as with int64
    (torch reads a uint8 index as a mask, and takes no int16 one: the pool converts before it indexes)."""
    a, b = make(), make()
    x, y = a.alloc(4, R1), b.alloc(4, R1)
    a.transfer(x[:2].to(dtype), R1, R2)
    b.transfer(y[:2], R1, R2)
    assert abstract(a) == abstract(b)
    a.free(x[:2].to(dtype), R2)
    b.free(y[:2], R2)
    assert abstract(a) == abstract(b) and a.available_size() == b.available_size()


def test_ids_past_int64_in_a_uint64_tensor_are_refused_by_value() -> None:
    a = TokenAllocator(8)
    a.alloc(2, R1)
    before = abstract(a)
    with pytest.raises(OutOfRange, match=str(2**63)):
        a.free(torch.tensor([1, 2**63], dtype=torch.uint64), R1)
    with pytest.raises(InvalidArgument, match="integer dtype"):
        a.free(torch.tensor([1.0]), R1)
    assert abstract(a) == before


def test_a_paged_free_with_a_token_named_twice_is_refused() -> None:
    """A page's tokens must each be named once: ``[t, t]`` for a page of two has a whole per-page count but is not
    the page (found by the pool machine's ``torn_pages``, issue 19's thirteenth round; it freed the page before).
    The page's tokens in another order are the page."""
    p = PagedAllocator(4, 2)
    x = p.alloc(4, R1)
    for bad in (x[[0, 0]], x[[0, 1, 2, 0]], x[[0, 0, 2, 3]]):
        for call in (lambda bad=bad: p.free(bad, R1), lambda bad=bad: p.transfer(bad, R1, R2)):
            err = rejected(p, call, InvalidArgument)
            assert "named twice" in str(err) and list(err.slots) == [int(x[0]) // 2]
    p.free(x[[1, 0, 2, 3]], R1)
    assert p.available_size() == 8


def test_paged_allocator_whole_pages_only() -> None:
    p = PagedAllocator(4, 4)
    x = p.alloc(5, R1)
    assert x.numel() == 8 and bool((x[:4] // 4 == x[0] // 4).all())
    assert p.available_size() == 8
    err = rejected(p, lambda: p.free(x[:6], R1), PageAlignmentError)
    assert "whole pages" in str(err)
    rejected(p, lambda: p.free(x[1:], R1), PageAlignmentError)
    rejected(p, lambda: p.free(x[:4], R2), NotOwner)
    rejected(p, lambda: p.free(torch.tensor([0, 1, 2, 3]), R1), OutOfRange)
    p.free(x[:4], R1)
    rejected(p, lambda: p.free(x[:4], R1), DoubleFree)
    rejected(p, lambda: p.alloc(100, R1), OverAllocation)
    p.transfer(x[4:], R1, node(5))
    assert p.pool.owner_of(int(x[4] // 4)) == node(5)


def test_swa_allocator_pairs_and_tombstones() -> None:
    s = SWATokenAllocator(8, 4)
    x = s.alloc(3, R1)
    assert bool((s.translate(x) != 0).all())
    rejected(s, lambda: s.alloc(2, R2), OverAllocation)  # SWA pool has 1 left
    s.free_swa(x[:2], R1)
    assert s.translate(x[:2]).tolist() == [0, 0] and s.swa.available_size() == 3
    rejected(s, lambda: s.free_swa(x[:1], R1), InvalidArgument)
    s.transfer(x, R1, node(4))
    assert s.swa.pool.owner_of(int(s.translate(x[2:])[0])) == node(4, Component.SWA)
    s.free(x, node(4))
    assert s.available_size() == 4 and s.full.available_size() == 8


def test_req_to_token_rows() -> None:
    r = ReqToTokenPool(2, 8)
    row = r.alloc(R1)
    r.write(row, 0, torch.tensor([5, 6, 7]), R1)
    assert r.read(row, 0, 3).tolist() == [5, 6, 7]
    rejected(r, lambda: r.write(row, 6, torch.tensor([1, 2, 3]), R1), OutOfRange)
    rejected(r, lambda: r.write(row, 0, torch.tensor([1]), R2), NotOwner)
    r.transfer(row, R1, session(2))
    rejected(r, lambda: r.free(row, R1), NotOwner)
    r.free(row, session(2))
    rejected(r, lambda: r.free(row, session(2)), DoubleFree)


def test_mamba_pool_request_state_and_copy_on_write() -> None:
    m = MambaPool(4, ping_pong_size=2)
    got = m.alloc_request_state(R1)
    assert len(got.slots()) == 3 and m.available_size() == 1
    m.write_fingerprint(got.state, 12345)
    cow = int(m.alloc(1, R2)[0])
    m.copy_state(got.state, cow, R2)
    m.verify(cow, 12345)
    assert torch.equal(m.conv[cow], m.conv[got.state])
    rejected(m, lambda: m.alloc_request_state(R2), OverAllocation)
    m.free(torch.tensor(list(got.slots())), R1)
    with pytest.raises(InvalidArgument, match="use after free"):
        m.copy_state(got.state, cow, R2)
    with pytest.raises(IntegrityError, match=f"slot {got.state}"):
        m.verify(got.state, 999)


def test_fingerprint_verify_catches_overwrite() -> None:
    a = TokenAllocator(8)
    x = a.alloc(3, R1)
    toks, pos = torch.tensor([11, 12, 13]), torch.arange(3)
    a.write_fingerprint(x, toks, pos)
    a.verify(x, toks, pos)
    a.write_fingerprint(x[1:2], torch.tensor([99]), torch.tensor([0]))  # another request wrote into slot x[1]
    with pytest.raises(IntegrityError, match=f"slot {int(x[1])}"):
        a.verify(x, toks, pos)


@given(st.lists(st.tuples(st.integers(0, 2**31 - 1), st.integers(0, 2**31 - 1)), min_size=1, max_size=50))
def test_torch_fingerprint_equals_spec_fingerprint(pairs: list[tuple[int, int]]) -> None:
    tokens = torch.tensor([t for t, _ in pairs])
    positions = torch.tensor([p for _, p in pairs])
    assert fingerprint(tokens, positions).tolist() == [spec_fingerprint(t, p) for t, p in pairs]


def remembered(pool: SlotPool, t: torch.Tensor) -> bool:
    """Whether ``t``'s slot ids are one of ``pool``'s recent alloc results (its memo of known-distinct sequences)."""
    return pool._fresh.find(host_bytes(t)) is not None


def test_claim_checks_owner_and_distinctness_and_changes_nothing_when_it_fails() -> None:
    a = TokenAllocator(16)
    pool = a.pool
    x = a.alloc(4, R1)
    assert remembered(pool, x)  # an alloc result is remembered as a known-distinct sequence
    before = pool.owner_tag.clone()
    repeated = torch.cat((x[:3], x[:1]))
    assert not remembered(pool, repeated)
    assert not pool.claim(repeated, R1, 99)  # a slot named twice
    assert not pool.claim(x, R2, 99, distinct=True)  # a known-distinct sequence still needs its holder
    assert not pool.claim(torch.tensor([0, 1]), R1, 99)  # slot 0 is reserved padding
    assert not pool.claim(torch.tensor([1, 99]), R1, 99)  # out of range
    assert torch.equal(pool.owner_tag, before)
    assert pool.claim(x, R1) and torch.equal(pool.owner_tag, before)  # check only
    assert pool.claim(x, R1, 99) and bool((pool.owner_tag[x] == 99).all())


@pytest.mark.parametrize("run_min", [512, 2])  # the inline pop, and the pop that looks for a run of slots
def test_last_alloc_shortcut_is_forgotten_by_every_tag_write(run_min: int) -> None:
    """A hand-over or free of exactly the last alloc's slots reads no tags only while no tag was written since:
    after a transfer, a free or a release of some of those slots, the same call checks their holders again."""
    a = TokenAllocator(16)
    pool = a.pool
    pool.run_min = run_min
    x = a.alloc(4, R1)
    assert pool.claim(x, R1)  # the shortcut: the last alloc's slots, all R1's
    pool.transfer(x[:1].clone(), R1, R2)  # one of them changes hands through the pool
    assert not pool.claim(x, R1, 99)
    rejected(a, lambda: a.free(x, R1), NotOwner)
    y = a.alloc(3, R1)
    pool.release(y[1:].numpy())  # behind the allocation's back, but through the pool: the memo goes
    assert not pool.claim(y, R1, 99)
    rejected(a, lambda: a.free(y, R1), DoubleFree)
    z = a.alloc(2, R2)
    a.free(z, R2)  # freed through the shortcut, and then forgotten with it
    rejected(a, lambda: a.free(z, R2), DoubleFree)
    assert not pool.claim(z, R2, 99)
    w = a.alloc(2, R1)
    assert not pool.claim(w, R2, 99)  # another owner: no shortcut
    rejected(a, lambda: a.free(w, R2), NotOwner)


def test_claim_of_host_ids_refuses_negative_ids() -> None:
    """Host ids are indexed with numpy, where -1 names the last slot: a negative id must be refused, not wrapped."""
    import numpy as np

    a = TokenAllocator(4)
    x = a.alloc(4, R1)  # slots 1..4: the last slot (4) is R1's
    before = a.pool.owner_tag.clone()
    for bad in (np.array([-1], dtype=np.int64), torch.tensor([-1]), np.array([1, -4], dtype=np.int64)):
        assert not a.pool.claim(bad, R1, 99)
    assert not a.pool.claim(np.array([1, 2], dtype=np.int32), R1, 99)  # host ids are int64
    assert torch.equal(a.pool.owner_tag, before)
    assert a.pool.claim(x.numpy(), R1, 99) and bool((a.pool.owner_tag[x] == 99).all())


def test_paged_alloc_results_are_known_whole_pages() -> None:
    a = PagedAllocator(8, 4)
    x = a.alloc(8, R1)
    pages = a.fresh_pages(host_bytes(x))
    assert pages is not None and pages.tolist() == (x[::4] // 4).tolist()
    assert a.fresh_pages(host_bytes(torch.cat((x[4:], x[:4])))) is None  # the same pages, another order


def test_insert_of_a_repeated_slot_is_rejected_after_an_alloc() -> None:
    from kvledger.impl.radix import RadixCache
    from kvledger.spec.errors import SlotConflict

    kv = TokenAllocator(16)
    cache = RadixCache(kv)
    x = kv.alloc(4, R1)
    bad = torch.cat((x[:3], x[:1]))
    rejected(kv, lambda: cache.insert(torch.tensor([1, 2, 3, 4]), bad, R1), SlotConflict)
    assert cache.insert(torch.tensor([1, 2, 3, 4]), x, R1).prefix_len == 0


def test_a_copied_pool_keeps_its_free_stack_in_one_place() -> None:
    import copy
    import pickle

    from kvledger.contracts.abstraction import inv_free_stack_matches_tags

    a = TokenAllocator(16)
    a.alloc(5, R1)
    for b in (copy.deepcopy(a), pickle.loads(pickle.dumps(a))):
        x = b.alloc(3, R2)
        y = b.alloc(2, R2)
        b.free(x, R2)
        z = b.alloc(3, R2)  # the free stack is last in, first out: x's slots again, none of y's
        assert sorted(z.tolist()) == sorted(x.tolist()) and inv_free_stack_matches_tags(b.pool), (x, y, z)
        assert b.pool.owner_of(int(z[0])) == R2  # the copy's host views write its own tag column
    assert a.available_size() == 11 and inv_free_stack_matches_tags(a.pool)
    assert bool((a.pool.owner_tag[6:] == 0).all())  # and not the original's


def test_freeing_a_changed_alloc_result_frees_what_it_names_now() -> None:
    """``free`` knows a recent alloc result by identity; a result changed since (by torch in place, or through a numpy
    view, which torch does not count) is checked as any other tensor: it frees the slots it names now, or is
    rejected with the pool unchanged."""
    from kvledger.contracts.abstraction import inv_free_stack_matches_tags

    a = TokenAllocator(32)
    other = a.alloc(2, R2)
    x = a.alloc(4, R1)
    x[0] = int(other[0])  # torch in place: now it names an R2 slot
    rejected(a, lambda: a.free(x, R1), NotOwner)
    y = a.alloc(4, R1)
    y.numpy()[1] = int(y[0])  # through a numpy view: now a slot named twice
    rejected(a, lambda: a.free(y, R1), InvalidArgument)
    z = a.alloc(3, R1)
    z.numpy()[0] = int(y[2])  # through a numpy view: another of R1's slots, still distinct
    a.free(z, R1)
    assert a.pool.owner_of(int(y[2])) is None and a.pool.owner_of(int(y[0])) == R1
    assert inv_free_stack_matches_tags(a.pool)
    w = a.alloc(2, R1)
    a.free(w, R1)
    rejected(a, lambda: a.free(w, R1), DoubleFree)  # the same tensor again
    v = a.alloc(1, R1)
    rejected(a, lambda: a.free(v, R2), NotOwner)  # the right tensor, the wrong owner
    a.free(v, R1)
    u = a.alloc(4, R1)
    u.unsqueeze_(0)  # torch in place, the same bytes: now 2-D
    rejected(a, lambda: a.free(u, R1), InvalidArgument)
    t = a.alloc(4, R1)
    kept = t[2:].clone()
    t.resize_(2)  # the same bytes, fewer of them: only the first two are named
    a.free(t, R1)
    assert [a.pool.owner_of(int(s)) for s in kept] == [R1, R1]
    assert inv_free_stack_matches_tags(a.pool)


def test_runs_of_slots_are_tagged_and_checked_as_any_other() -> None:
    """An alloc of a run of slots (a fresh pool's, or a run freed and popped again, in either order) is tagged and
    freed through slices: exactly those slots, and a wrong, repeated or double free is still refused with the
    pool unchanged."""
    from kvledger.contracts.abstraction import inv_free_stack_matches_tags
    from kvledger.impl.slots import RUN_MIN, run_start

    n = RUN_MIN + 36
    a = TokenAllocator(4 * n)
    pool = a.pool
    x = a.alloc(n, R1)
    assert x.tolist() == list(range(1, n + 1)) and run_start(host_bytes(x), n, 1, 1, pool.size) == 1
    assert [pool.owner_of(s) for s in (1, n)] == [R1, R1] and pool.owner_of(n + 1) is None
    rejected(a, lambda: a.free(x, R2), NotOwner)
    a.free(x, R1)
    rejected(a, lambda: a.free(x, R1), DoubleFree)
    y = a.alloc(n, R1)  # x's slots popped again: descending
    assert y.tolist() == list(range(n, 0, -1)) and run_start(host_bytes(y), n, n, 1, pool.size) == 1
    assert abstract(a)["kv"].held == {R1: frozenset(range(1, n + 1))}
    y.numpy()[5] = int(y[6])  # through a numpy view: a slot named twice
    rejected(a, lambda: a.free(y, R1), InvalidArgument)
    z = a.alloc(n, R2)  # the next run up
    z[3] = int(y[0])  # torch in place: now it names one of R1's slots
    rejected(a, lambda: a.free(z, R2), NotOwner)
    assert inv_free_stack_matches_tags(pool)


@given(st.lists(st.tuples(st.booleans(), st.integers(1, 6)), max_size=30))
def test_run_min_is_a_speed_setting_that_changes_no_result(ops: list[tuple[bool, int]]) -> None:
    """A pool looks at an allocation as a run of slots from ``run_min`` slots on (the pool machine lowers it so
    its small pools take that path): the same calls give the same slots, ledgers and refusals at any setting."""
    from kvledger.contracts.abstraction import inv_free_stack_matches_tags
    from kvledger.impl.slots import RUN_MIN

    def run(run_min: int) -> list[object]:
        a = TokenAllocator(12)
        a.pool.run_min = run_min
        live: list[torch.Tensor] = []
        seen: list[object] = []
        for is_alloc, n in ops:
            if is_alloc:
                try:
                    live.append(a.alloc(n, R1))
                    seen.append(live[-1].tolist())
                except OverAllocation:
                    seen.append("refused")
            elif live:
                a.free(live.pop(n % len(live)), R1)
            seen.append(abstract(a)["kv"])
            assert inv_free_stack_matches_tags(a.pool)
        for x in live:
            a.free(x, R1)
            rejected(a, lambda x=x: a.free(x, R1), DoubleFree)
        return seen

    default = run(RUN_MIN)
    assert run(1) == default and run(2) == default


def test_run_start_proves_a_run_or_answers_no() -> None:
    import numpy as np

    from kvledger.impl.slots import run_start

    def start(ids: list[int], base: int = 1, size: int = 1000) -> int:
        return run_start(np.array(ids, dtype=np.int64).tobytes(), len(ids), ids[0], base, size)

    assert start(list(range(5, 105))) == 5 and start(list(range(104, 4, -1))) == 5
    near = list(range(5, 105))
    near[50] = 500  # the same first and last ids, not a run
    assert start(near) == -1 and start(near[::-1]) == -1
    swapped = list(range(5, 105))
    swapped[10], swapped[11] = swapped[11], swapped[10]  # the same slots, out of order
    assert start(swapped) == -1
    assert start(list(range(0, 100))) == -1  # slot 0 is below base
    assert start(list(range(950, 1050))) == -1 and start(list(range(1049, 949, -1))) == -1  # past the pool


def test_long_alloc_results_are_remembered_as_distinct() -> None:
    """A result longer than the identity memo keeps (a long prompt's) is still known distinct by content, so its
    insert need not prove that again; a sequence that only ends like it is not."""
    from kvledger.impl.radix import RadixCache
    from kvledger.impl.slots import FRESH_LONG, HANDED_MAX

    n = HANDED_MAX + 8
    kv = TokenAllocator((FRESH_LONG + 2) * n)
    x = kv.alloc(n, R1)
    assert remembered(kv.pool, x)
    forged = x.clone()
    forged[0] = int(x[1])  # the same last ids, one slot named twice
    assert not remembered(kv.pool, forged)
    cache = RadixCache(kv)
    assert cache.insert(list(range(n)), x, R1).prefix_len == 0
    assert kv.pool.owner_of(int(x[0])) == cache.match_prefix(list(range(n))).last_node.owner
    olds = [kv.alloc(HANDED_MAX + 1, R2) for _ in range(FRESH_LONG)]
    assert all(remembered(kv.pool, o) for o in olds)
    assert not remembered(kv.pool, x)  # forgotten: only the last FRESH_LONG long results are kept
