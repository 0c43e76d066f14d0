"""The pool machine's probes at the domains' edge (``spec.domains``) and of ``verify``
(``spec.prefix.inv_verify_exact``): they pass on the reference pools and fail, naming the law, on a hand-broken one."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings

from kvledger.contracts.machines.pool import KINDS, Chunk, machine_for
from kvledger.contracts.machines.probes import (
    CONSTRUCTORS,
    Call,
    LookAlike,
    _elsewhere_mamba,
    constructor_calls,
    run_call,
)
from kvledger.impl import integrity
from kvledger.impl.allocators import PagedAllocator, SWATokenAllocator, TokenAllocator
from kvledger.impl.mamba import MambaPool
from kvledger.impl.radix import RadixCache
from kvledger.impl.slots import SlotPool
from kvledger.spec import domains as D
from kvledger.spec.errors import IntegrityError, InvalidArgument, SlotConflict
from kvledger.spec.types import Component, Owner, OwnerKind, request, session


def machine(kind: str) -> Any:
    return machine_for(KINDS[kind])()


def chunk_of(m: Any, n: int = 2) -> Chunk:
    return m.allocate(request(1), n)  # type: ignore[no-any-return]


@pytest.mark.parametrize("kind", sorted(CONSTRUCTORS))
def test_constructor_calls_obey_the_domain_law_on_the_reference(kind: str) -> None:
    """Every drawn call of the reference's constructors: built inside its domain, a typed error outside."""

    @settings(max_examples=150, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(constructor_calls(kind))
    def check(call: Call) -> None:
        assert D.inv_domain_enforced(call.inside, run_call(call)), call

    check()


def test_construct_fails_on_a_cache_that_takes_a_window_over_a_full_only_allocator(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    original = RadixCache.__init__

    def lax(self: RadixCache, kv: Any, page_size: Any = None, swa_window: Any = None, mamba: Any = None) -> None:
        original(self, kv, page_size=page_size, swa_window=None, mamba=mamba)  # the window check forgotten

    call = Call(
        "RadixCache", (("kv", TokenAllocator(8)), ("page_size", None), ("swa_window", 2), ("mamba", None)), False
    )
    machine("token").construct(call)  # the reference refuses it
    monkeypatch.setattr(RadixCache, "__init__", lax)
    with pytest.raises(AssertionError, match=r"inv_domain_enforced: RadixCache.*outside its domain and was accepted"):
        machine("token").construct(call)


def test_construct_fails_on_a_mamba_pool_that_takes_an_integer_dtype(monkeypatch: pytest.MonkeyPatch) -> None:
    original = MambaPool.__init__

    def lax(self: MambaPool, size: int, **kw: Any) -> None:
        original(self, size, **{**kw, "dtype": torch.float32})  # the dtype check forgotten

    args = (("size", 2), ("conv_shape", (2,)), ("temporal_shape", (2,)), ("ping_pong_size", 0), ("dtype", torch.int64))
    call = Call("MambaPool", args, False)
    machine("mamba").construct(call)
    monkeypatch.setattr(MambaPool, "__init__", lax)
    with pytest.raises(AssertionError, match=r"inv_domain_enforced: MambaPool"):
        machine("mamba").construct(call)


def test_construct_fails_on_a_cache_over_pools_on_two_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    """The constructor sweep gives a cache a Mamba pool on the meta device over a CPU allocator: a cache that
    forgets to compare the pools' devices is caught on a machine with no GPU."""
    original = RadixCache.__init__

    def lax(self: RadixCache, kv: Any, page_size: Any = None, swa_window: Any = None, mamba: Any = None) -> None:
        device = getattr(mamba, "device", None)
        if mamba is not None:
            mamba.device = kv.device  # BUG: the devices never compared (the pool passed off as the allocator's)
        try:
            original(self, kv, page_size=page_size, swa_window=swa_window, mamba=mamba)
        finally:
            if mamba is not None:
                mamba.device = device

    call = Call(
        "RadixCache",
        (("kv", TokenAllocator(8)), ("page_size", None), ("swa_window", None), ("mamba", _elsewhere_mamba())),
        False,
    )
    machine("token").construct(call)  # the reference refuses it
    monkeypatch.setattr(RadixCache, "__init__", lax)
    with pytest.raises(AssertionError, match=r"inv_domain_enforced: RadixCache.*outside its domain and was accepted"):
        _sweep_constructors("token", 80)


BAD_OWNERS = [
    Owner(OwnerKind.NODE, 3, None),  # a node without a component
    Owner(OwnerKind.REQUEST, 3, Component.FULL),  # a request with one
    Owner(OwnerKind.REQUEST, True),  # a bool id
    Owner(OwnerKind.REQUEST, -1),
    (OwnerKind.REQUEST, 1),  # no Owner at all
    LookAlike(OwnerKind.REQUEST, 1),  # an owner's fields, no Owner
]


@pytest.mark.parametrize("owner", BAD_OWNERS, ids=repr)
def test_bad_owner_fails_on_a_pool_that_takes_any_owner(monkeypatch: pytest.MonkeyPatch, owner: object) -> None:
    assert not D.is_owner(owner)
    m = machine("token")
    c = chunk_of(m)
    for how in ("alloc", "free", "give", "take"):
        m.bad_owner(c, owner, how)  # the reference refuses each, changing nothing
    original = TokenAllocator.alloc

    def lax(self: TokenAllocator, n: int, who: Any) -> torch.Tensor:
        return original(self, n, who if D.is_owner(who) else request(9))  # an owner it cannot encode, taken as another

    monkeypatch.setattr(TokenAllocator, "alloc", lax)
    with pytest.raises(AssertionError, match=r"inv_domain_enforced: alloc with owner .* was accepted"):
        m.bad_owner(c, owner, "alloc")


@pytest.mark.parametrize("bad", [-1, 6, 7, True, 2.0, None, 1 << 63])
def test_bad_id_fails_on_a_mamba_pool_that_wraps_negative_ids(monkeypatch: pytest.MonkeyPatch, bad: object) -> None:
    m = machine("mamba")
    c = chunk_of(m)
    for how in range(4):
        m.bad_id(c, bad, how)

    def wraps(self: MambaPool, slot: Any, value: int) -> None:
        self.data[int(slot) % self.data.numel()] = value  # no id check: -1 is the last slot

    monkeypatch.setattr(MambaPool, "write_fingerprint", wraps)
    with pytest.raises(AssertionError, match=r"inv_domain_enforced: write_fingerprint of id|rejected call leaves"):
        m.bad_id(c, bad, 0)


@pytest.mark.parametrize("kind", ["token", "paged", "swa", "mamba"])
def test_corrupt_passes_on_the_reference(kind: str) -> None:
    m = machine(kind)
    c = chunk_of(m, 3)
    for parts in ({"data"}, {"conv"}, {"temporal"}, {"swa"}, {"data", "conv", "temporal", "swa"}):
        m.corrupt(c, frozenset(parts), [0, 5])
    m.inv_data_integrity()


def test_corrupt_fails_on_a_verify_that_reads_one_value_of_a_state(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Mamba ``verify`` before issue 19's third round: the fingerprint and the first conv value only."""

    def first_value_only(self: MambaPool, slot: int, value: int) -> None:
        if int(self.data[slot]) != value or float(self.conv[slot].flatten()[0]) != float(value % 1000):
            raise IntegrityError("mamba: wrong state")

    m = machine("mamba")
    c = chunk_of(m)
    monkeypatch.setattr(MambaPool, "verify", first_value_only)
    m.corrupt(c, frozenset({"conv"}), [0])  # the one value it reads: flagged
    with pytest.raises(AssertionError, match=r"inv_verify_exact: .*temporal of slot .* verify passed"):
        m.corrupt(c, frozenset({"temporal"}), [3])


def test_corrupt_fails_on_a_verify_that_needs_both_parts_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    original = MambaPool.verify

    def both(self: MambaPool, slot: int, value: int) -> None:
        data = int(self.data[slot])
        self.data[slot] = value  # flags only a state whose fingerprint AND tensors changed
        try:
            original(self, slot, value)
        except IntegrityError:
            if data != value:
                raise
        finally:
            self.data[slot] = data

    m = machine("mamba")
    c = chunk_of(m)
    monkeypatch.setattr(MambaPool, "verify", both)
    with pytest.raises(AssertionError, match=r"inv_verify_exact"):
        m.corrupt(c, frozenset({"conv"}), [1])


def test_corrupt_fails_on_a_kv_verify_that_reads_the_first_slot_only(monkeypatch: pytest.MonkeyPatch) -> None:
    original = TokenAllocator.verify

    def first_only(self: TokenAllocator, slots: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor) -> None:
        original(self, slots[:1], tokens[:1], positions[:1])

    m = machine("token")
    c = chunk_of(m, 3)
    monkeypatch.setattr(TokenAllocator, "verify", first_only)
    with pytest.raises(AssertionError, match=r"inv_verify_exact"):
        m.corrupt(c, frozenset({"data"}), [2])


def test_corrupt_fails_on_a_verify_whose_miss_another_change_would_hide(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 19, new family, seed 4: an SWA ``verify`` that skips one SWA copy. Changed together with the KV it
    copies, the KV change is flagged and hides the miss: ``corrupt`` must try each change alone too."""

    def skips_first_copy(self: SWATokenAllocator, slots: torch.Tensor, tokens: torch.Tensor, pos: torch.Tensor) -> None:
        self.full.verify(slots, tokens, pos)
        live = self.full_to_swa[slots]
        mask = live != 0
        mask[0] = False  # the first slot's SWA copy is never read
        if bool(mask.any()):
            integrity.verify("swa", self.swa.data, live[mask], tokens[mask], pos[mask])

    m = machine("swa")
    c = chunk_of(m, 3)
    m.corrupt(c, frozenset({"data", "swa"}), [0])
    monkeypatch.setattr(SWATokenAllocator, "verify", skips_first_copy)
    m.corrupt(c, frozenset({"data"}), [1])  # the KV it reads: flagged
    with pytest.raises(AssertionError, match=r"inv_verify_exact: .* with swa data\[\d+\] changed: verify passed"):
        m.corrupt(c, frozenset({"data", "swa"}), [1])  # every slot of the chunk is changed alone, whatever ``at``


def test_a_verify_that_flags_an_intact_tombstone_fails_the_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 19, new family, seed 4 (the survivor left at the edge of the default budget): an SWA ``verify`` that
    reads the copy of every slot but SWA slot 1, an unmapped slot's (0) included. Once a chunk's SWA slots are
    freed, its intact KV is flagged: ``inv_verify_passes`` meets that on every step, not only when ``corrupt``
    happens to draw the chunk."""

    def reads_unmapped(self: SWATokenAllocator, slots: torch.Tensor, tokens: torch.Tensor, pos: torch.Tensor) -> None:
        self.full.verify(slots, tokens, pos)
        live = self.full_to_swa[slots]
        mask = live != 1  # BUG: for ``!= 0``
        if bool(mask.any()):
            integrity.verify("swa", self.swa.data, live[mask], tokens[mask], pos[mask])

    m = machine("swa")
    chunk_of(m, 2)
    m.free_swa(chunk_of(m, 3))
    m.inv_verify_passes()  # the reference passes on a tombstone beside a chunk with its SWA slots
    monkeypatch.setattr(SWATokenAllocator, "verify", reads_unmapped)
    with pytest.raises(
        AssertionError, match=r"inv_verify_exact: (chunk \d+|every chunk) intact, verify raised IntegrityError"
    ):
        m.inv_verify_passes()


@pytest.mark.parametrize("kind", ["token", "paged", "swa"])
def test_a_kv_write_that_writes_other_positions_fails_the_machine(monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    """The machine writes each chunk's KV through the pool's own ``write_fingerprint``; ``inv_data_integrity``
    holds what it wrote to fingerprints computed apart, so a write that records the wrong positions is caught."""
    cls = {"token": TokenAllocator, "paged": PagedAllocator, "swa": SWATokenAllocator}[kind]
    original = cls.write_fingerprint
    m = machine(kind)
    chunk_of(m, 3)
    m.inv_data_integrity()

    def shifted(self: Any, slots: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor) -> None:
        original(self, slots, tokens, positions + 1)  # BUG: positions one on

    monkeypatch.setattr(cls, "write_fingerprint", shifted)
    chunk_of(m, 3)
    with pytest.raises(AssertionError, match=r"data integrity: chunk \d+ slots .* lost their data"):
        m.inv_data_integrity()


@pytest.mark.parametrize("give", [False, True])
def test_a_paged_refusal_of_a_token_named_twice_must_name_its_page(monkeypatch: pytest.MonkeyPatch, give: bool) -> None:
    """Issue 19, new family, seed 10: ``pages_of``'s duplicate test off by one (``> 2``) still refuses a token
    named twice (the page is not whole), but names no page. A paged pool's refusal names the pages of the tokens
    named twice, and only them."""
    from kvledger.spec.errors import PageAlignmentError

    m = machine("paged")
    c = chunk_of(m, 3)
    for bad in ("dup", "twice", "in place"):
        m._malformed(c, bad, give)  # the reference names exactly those pages
    real = PagedAllocator.pages_of

    def names_none(self: PagedAllocator, op: str, indices: Any) -> Any:
        try:
            return real(self, op, indices)
        except (InvalidArgument, PageAlignmentError) as err:
            raise type(err)(err.operation, err.pool, [], err.detail) from None  # BUG: no page named

    monkeypatch.setattr(PagedAllocator, "pages_of", names_none)
    with pytest.raises(
        AssertionError, match=r"inv_names_culprit: (InvalidArgument|PageAlignmentError) names slots \[\]"
    ):
        m._malformed(c, "dup", give)


@pytest.mark.parametrize("kind", ["token", "swa", "mamba", "req_to_token"])
@pytest.mark.parametrize("give", [False, True])
def test_a_refusal_of_a_slot_named_twice_must_name_that_slot(
    monkeypatch: pytest.MonkeyPatch, kind: str, give: bool
) -> None:
    """Issue 19, new family, seed 5: ``as_index`` refused ids naming a slot twice, but named the slots that
    differ from the one before them (``!=`` for ``==``), not the repeated one: the error misleads its reader."""
    m = machine(kind)
    c = chunk_of(m, 3)
    for bad in ("dup", "twice"):
        m._malformed(c, bad, give)  # the reference names exactly the slots named twice
    original = SlotPool.as_index

    def names_others(self: SlotPool, op: str, indices: torch.Tensor) -> torch.Tensor:
        try:
            return original(self, op, indices)
        except InvalidArgument as err:
            if "duplicate" not in str(err):
                raise
            s = torch.sort(indices.to(torch.int64)).values
            raise InvalidArgument(op, self.name, s[1:][s[1:] != s[:-1]].tolist(), "duplicate slot ids") from None

    monkeypatch.setattr(SlotPool, "as_index", names_others)
    with pytest.raises(AssertionError, match=r"inv_names_culprit"):
        m._malformed(c, "dup", give)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_dropped_device_check_is_caught_without_a_gpu(monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    """Issue 19, new family, seeds 4 and 6: ids on the CPU given to a pool on another device must be refused,
    typed. ``bad_tensor`` gives them to a twin of the pool on the meta device, so a dropped device check is met on
    any machine (the reference holds; with the check gone, the call runs on and is accepted or crashes)."""
    import kvledger.impl.allocators as allocators
    import kvledger.impl.arguments as arguments
    import kvledger.impl.req_to_token as req_to_token

    m = machine(kind)
    c = chunk_of(m, 2)
    m.bad_tensor(c)
    original = arguments.check_ids_tensor

    def anywhere(op: str, where: str, name: str, t: object, device: torch.device | None = None) -> torch.Tensor:
        return original(op, where, name, t)  # BUG: the device is never compared

    for module in (allocators, req_to_token):
        monkeypatch.setattr(module, "check_ids_tensor", anywhere)
    as_index = SlotPool.as_index

    def as_index_anywhere(self: SlotPool, op: str, indices: torch.Tensor) -> torch.Tensor:
        saved = self.device
        self.device = indices.device if isinstance(indices, torch.Tensor) else saved  # BUG: as if on the pool's
        try:
            return as_index(self, op, indices)
        finally:
            self.device = saved

    monkeypatch.setattr(SlotPool, "as_index", as_index_anywhere)
    with pytest.raises(AssertionError, match=r"inv_domain_enforced: .* of a pool on the meta device"):
        m.bad_tensor(c)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_pool_that_trusts_an_alloc_result_rewritten_in_place_is_caught(
    monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """Issue 19, new family, seed 6: a pool remembers its alloc results, and a write through a numpy view moves no
    version counter. ``malformed_indices`` writes a slot twice into the alloc's own tensor that way: a free that
    takes the ids as they were handed out (not as they are) frees what the caller no longer names."""
    m = machine(kind)
    c = chunk_of(m, 3)
    m.malformed_indices(c, False)  # the reference reads the ids as they are now and refuses
    m.malformed_indices(c, True)
    original = SlotPool.free

    def as_handed_out(self: SlotPool, indices: torch.Tensor, owner: Owner) -> None:
        mine = self._handed.get(id(indices))
        if mine is not None and mine[0] is indices:
            indices = torch.tensor(list(memoryview(mine[2]).cast("q")), dtype=torch.int64)  # BUG: bytes as handed out
        original(self, indices, owner)

    monkeypatch.setattr(SlotPool, "free", as_handed_out)
    if kind in ("paged", "req_to_token", "swa"):
        # NOTE: a paged free remembers by content, an SWA free checks the ids itself before its pools free them,
        # and a request table hands out one row at a time: the identity memo above is not theirs
        m.malformed_indices(c, False)
        return
    with pytest.raises(AssertionError, match=r"invalid call accepted"):
        m.malformed_indices(c, False)


@pytest.mark.parametrize("kind", ["token", "paged", "swa"])
def test_a_kv_write_that_takes_one_slot_twice_is_caught(monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    """Issue 19, new family, seed 6: ``check_kv_write``'s duplicate test moved from "more than one slot" to "more
    than two", so a write of one slot twice went on. ``malformed_indices`` gives the KV write a slot twice, and
    the least such write (one slot, twice): each refused, naming that slot."""
    import kvledger.impl.allocators as allocators

    m = machine(kind)
    c = chunk_of(m, 2)
    m.malformed_indices(c, False)
    original = allocators.check_kv_write

    def pairs_pass(op: str, where: str, slots: Any, tokens: Any, positions: Any, *span: Any) -> Any:
        if isinstance(slots, torch.Tensor) and slots.numel() == 2 and bool(slots[0] == slots[1]):
            return original(op, where, slots[:1], tokens[:1], positions[:1], *span)  # BUG: two is not "more than 2"
        return original(op, where, slots, tokens, positions, *span)

    monkeypatch.setattr(allocators, "check_kv_write", pairs_pass)
    with pytest.raises(AssertionError, match=r"invalid call accepted"):
        m.malformed_indices(c, False)


def test_a_paged_free_that_checks_the_wrong_end_of_its_pages_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 19, new family, seed 7: ``pages_of``'s fast path checked the largest of its sorted pages against the
    pool's base, not the least, so the reserved page went through with a valid one after it. ``out_of_range``
    frees the reserved page followed by the pool's first page: ``OutOfRange``, naming the reserved page's tokens."""
    m = machine("paged")
    m.out_of_range("below")
    original = PagedAllocator.pages_of

    def last_end(self: PagedAllocator, op: str, indices: torch.Tensor) -> torch.Tensor:
        got = self.whole_pages(indices) if isinstance(indices, torch.Tensor) else None
        if got is not None:
            d = torch.unique(got)
            if d.numel() == got.numel() and int(d[-1]) >= self.pool.base:  # BUG: the largest page, not the least
                return d
        return original(self, op, indices)

    monkeypatch.setattr(PagedAllocator, "pages_of", last_end)
    with pytest.raises(AssertionError, match=r"expected OutOfRange|inv_names_culprit|accepted"):
        m.out_of_range("below")


def test_a_refused_constructor_raises_a_typed_error() -> None:
    """The reference's refusals are typed (what the law asks), e.g. a window over a full-only allocator."""
    err = run_call(
        Call("RadixCache", (("kv", TokenAllocator(8)), ("page_size", None), ("swa_window", 2), ("mamba", None)), False)
    )
    assert err is not None
    assert D.inv_domain_enforced(False, err) and not D.inv_domain_enforced(False, TypeError("untyped"))


# ---------------------------------------------------------------- cache: an insert of slots the request does not hold


def cache_machine(model: str) -> Any:
    from kvledger.contracts.machines.suites import SUITES

    return SUITES["cache"].models[model]()()


@pytest.mark.parametrize("model", ["full", "full-paged", "swa", "hybrid"])
@pytest.mark.parametrize("whose", ["another request", "the free list", "the cache"])
def test_insert_foreign_is_refused_by_the_reference(model: str, whose: str) -> None:
    m = cache_machine(model)
    m.insert(0, (1, 2), False)  # something cached, so 'the cache' has slots to offer
    m.inv_all_laws()
    refused: list[str] = []
    original = m._refused_insert

    def spy(req: int, key: tuple[int, ...], offered: tuple[int, ...], w: str, state: int | None = None) -> None:
        original(req, key, offered, w, state)
        refused.append(w)

    m._refused_insert = spy
    m.insert_foreign(1, (3, 4), whose, [0, 1])
    m.inv_all_laws()
    assert refused == [whose]  # the misuse was made (and refused): the rule is not vacuous


@pytest.mark.parametrize("model", ["mamba", "hybrid"])
@pytest.mark.parametrize("whose", ["another request", "the free list", "the cache"])
def test_insert_with_a_foreign_mamba_state_is_refused_by_the_reference(model: str, whose: str) -> None:
    m = cache_machine(model)
    m.insert(0, (1, 2), False)  # a state cached, so 'the cache' has one to offer
    m.inv_all_laws()
    refused: list[int | None] = []
    original = m._refused_insert

    def spy(req: int, key: tuple[int, ...], offered: tuple[int, ...], w: str, state: int | None = None) -> None:
        original(req, key, offered, w, state)
        refused.append(state)

    m._refused_insert = spy
    m.insert_foreign(1, (3, 4), whose, [0], "mamba")
    m.inv_all_laws()
    assert len(refused) == 1 and refused[0] is not None  # a foreign state was offered (and refused)


@pytest.mark.parametrize("whose", ["another request", "the free list"])
def test_insert_foreign_state_fails_on_a_cache_that_takes_any_state(
    monkeypatch: pytest.MonkeyPatch, whose: str
) -> None:
    """A cache whose insert checks only that the offered Mamba state is not cached, not that the request holds it."""

    def lax(self: RadixCache, key: tuple[int, ...], slot: int, owner: Any) -> None:
        holder = self._pool("insert").pool.owner_of(slot)
        if holder is not None and holder.kind is OwnerKind.NODE:
            raise SlotConflict("insert", key, f"Mamba slot {slot} is cached at {holder}")

    m = cache_machine("mamba")
    m.insert(0, (1, 2), False)
    monkeypatch.setattr(RadixCache, "_check_state", lax)
    # NOTE: accepted, or refused by a later transfer after the tree changed: either breaks a law
    with pytest.raises(AssertionError, match=r"foreign insert refused|rejected call leaves state unchanged"):
        m.insert_foreign(1, (3, 4), whose, [0], "mamba")


@pytest.mark.parametrize("whose", ["another request", "the free list", "the cache"])
def test_insert_foreign_fails_on_a_cache_that_takes_any_slot(monkeypatch: pytest.MonkeyPatch, whose: str) -> None:
    """A cache whose insert takes the offered slots without asking who holds them (it retags them)."""
    original = RadixCache.insert

    def lax(self: RadixCache, key: torch.Tensor, value: torch.Tensor, owner: Any, **kw: Any) -> Any:
        for pool in ((self.kv.full if hasattr(self.kv, "full") else self.kv).pool,):
            held = pool.owner_tag[value] != pool.code_of(owner, "insert")
            pool.owner_tag[value[held]] = pool.code_of(owner, "insert")  # steals them for the request first
        return original(self, key, value, owner, **kw)

    m = cache_machine("full")
    m.insert(0, (1, 2), False)
    monkeypatch.setattr(RadixCache, "insert", lax)
    with pytest.raises(AssertionError, match="foreign insert refused"):
        m.insert_foreign(1, (3, 4), whose, [0])


def test_a_refusal_that_names_no_slot_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """``inv_names_culprit``: the first page past a pool's end refused as OutOfRange, but naming no slot."""
    from kvledger.impl.slots import SlotPool
    from kvledger.spec.errors import OutOfRange

    m = machine("token")
    m.out_of_range("edge")  # the reference names the slot
    original = SlotPool.as_index

    def silent(self: SlotPool, op: str, indices: torch.Tensor) -> torch.Tensor:
        try:
            return original(self, op, indices)
        except OutOfRange as err:
            raise OutOfRange(op, self.name, [], err.detail) from None

    monkeypatch.setattr(SlotPool, "as_index", silent)
    with pytest.raises(AssertionError, match="inv_names_culprit"):
        m.out_of_range("edge")


def test_malformed_indices_of_a_transfer_are_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pool whose transfer takes a 2-D index tensor as if it were flat."""
    m = machine("token")
    c = chunk_of(m)
    m.malformed_indices(c, True)  # the reference refuses each kind
    original = TokenAllocator.transfer

    def flat(self: TokenAllocator, indices: torch.Tensor, src: Any, dst: Any) -> None:
        original(self, indices.reshape(-1) if indices.dim() == 2 else indices, src, dst)

    monkeypatch.setattr(TokenAllocator, "transfer", flat)
    with pytest.raises(AssertionError, match="invalid call accepted"):
        m.malformed_indices(c, True)


@pytest.mark.parametrize("n", [-1, True, 2.5, None])
def test_evict_bad_is_caught_on_a_cache_that_takes_any_count(monkeypatch: pytest.MonkeyPatch, n: object) -> None:
    """``evict`` of a negative, bool or float count: the reference refuses it; one that evicts nothing instead
    (the count's check skipped) breaks ``inv_domain_enforced``."""
    m = cache_machine("full")
    m.insert(0, (1, 2), False)
    m.evict_bad(Component.FULL, n)  # refused by the reference
    m.evict_bad(Component.SWA, 1)  # a component the full model does not have: refused
    monkeypatch.setattr(RadixCache, "evict", lambda self, comp, k: 0)
    with pytest.raises(AssertionError, match="inv_domain_enforced: evict"):
        m.evict_bad(Component.FULL, n)


@pytest.mark.parametrize(("start", "shift"), [(2, -1), (1, 2)])
def test_a_row_write_that_copies_a_view_of_its_own_row_in_place_is_caught(
    monkeypatch: pytest.MonkeyPatch, start: int, shift: int
) -> None:
    """``row write commits``: the reference copies a window of its own row first; a write that assigns the view in
    place meets torch's overlap refusal (an untyped crash) and is caught; the reference passes."""
    from kvledger.impl.req_to_token import ReqToTokenPool

    m = machine("req_to_token")
    c = chunk_of(m, 1)
    m.write_row(c, start, 3, "own row", shift)  # the reference: the row holds exactly the copied window

    def in_place(self: ReqToTokenPool, row: int, start: int, slots: torch.Tensor, owner: Any) -> None:
        self.pool.check_held("write", self._row("write", row), owner)
        self.table[row, start : start + slots.numel()] = slots  # BUG: no copy of a view of this table

    monkeypatch.setattr(ReqToTokenPool, "write", in_place)
    with pytest.raises(AssertionError, match="row write commits: write"):
        m.write_row(c, start, 3, "own row", shift)


def test_a_teardown_scan_that_frees_nothing_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    from kvledger.impl.slots import SlotPool

    m = machine("token")
    m.free_all_of_owner(2, 0)  # the reference returns exactly the slots and leaves the pool as before
    monkeypatch.setattr(
        SlotPool, "free_all_of", lambda self, owner: self.held_by(owner)
    )  # BUG: reports the slots, frees none
    with pytest.raises(AssertionError, match=r"refinement \(abstract == spec model\): kv free_all_of.* is not as"):
        m.free_all_of_owner(2, 0)


def test_a_page_map_without_its_range_check_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """``tokens_of`` of the reserved page below a paged pool: the reference refuses it ``OutOfRange``."""
    from kvledger.impl.allocators import PagedAllocator

    m = machine("paged")
    m.out_of_range("below")
    monkeypatch.setattr(PagedAllocator, "tokens_of", lambda self, pages: self._rows.index_select(0, pages).view(-1))
    with pytest.raises(AssertionError, match="invalid call accepted"):
        m.out_of_range("below")


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_bad_tensor_passes_on_the_reference_and_meets_every_tensor_parameter(kind: str) -> None:
    from kvledger.contracts.machines.pool import tensor_calls

    m = machine(kind)
    c = chunk_of(m, KINDS[kind].unit * 2)
    calls = tensor_calls(m.pool, c)
    assert calls and all(isinstance(p, str) for _, p, _, _, _, _ in calls)
    m.bad_tensor(c)  # every method, every tensor parameter, every kind of bad tensor: refused, nothing changed


@pytest.mark.parametrize("edge", ["below", "above"])
def test_bad_tensor_fails_on_a_translate_without_its_range_check(monkeypatch: pytest.MonkeyPatch, edge: str) -> None:
    """A method no other rule calls with ids outside the pool is met through its signature: ``translate`` that
    reads ``full_to_swa`` at any index wraps a negative id round, or fails untyped past the end."""
    from kvledger.contracts.machines import pool as P
    from kvledger.impl.allocators import SWATokenAllocator

    m = machine("swa")
    c = chunk_of(m)
    monkeypatch.setattr(P, "TENSOR_EDGES", (edge,))

    def translate(self: SWATokenAllocator, full_indices: torch.Tensor) -> torch.Tensor:
        return self.full_to_swa[full_indices]  # type: ignore[no-any-return]  # BUG: no range check

    monkeypatch.setattr(SWATokenAllocator, "translate", translate)
    with pytest.raises(AssertionError, match=r"inv_domain_enforced: SWATokenAllocator.translate with full_indices"):
        m.bad_tensor(c)


def test_bad_tensor_fails_on_a_row_write_that_takes_kv_slots_past_int32(monkeypatch: pytest.MonkeyPatch) -> None:
    """A request table names another pool's KV slots, which it cannot check against that pool, but it holds them
    as engines do, int32: ``bad_tensor`` gives the row write's slots -1 and the first value past 2**31, and a table
    whose bound is off (here 2**32, as an int64 table would take) lets the second in."""
    from kvledger.impl import req_to_token

    m = machine("req_to_token")
    c = chunk_of(m)
    m.bad_tensor(c)  # NOTE: the reference refuses both
    monkeypatch.setattr(req_to_token, "MAX_SLOT", 1 << 32)  # BUG: the bound of an int64 table
    with pytest.raises(AssertionError, match=r"inv_domain_enforced: ReqToTokenPool.write with slots above"):
        m.bad_tensor(c)


def test_a_copy_on_write_that_copies_nothing_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """``inv_mamba_content``: the reference's copy holds its source's state; a copy-on-write that hands out a slot
    without copying into it (the new request starts from a stale state) is caught."""
    for broken in (False, True):
        m = cache_machine("mamba")
        keys = m.insert(0, (1, 2), False)
        m.inv_all_laws()
        if not broken:
            m.inc_lock_ref_cached(keys, (), True)  # the reference copies: the law holds
            m.inv_all_laws()
    monkeypatch.setattr(MambaPool, "copy_state", lambda self, src, dst, owner: None)  # BUG: nothing copied
    with pytest.raises(AssertionError, match=r"inv_mamba_content: copy-on-write of state \d+ .* the copy holds"):
        m.inc_lock_ref_cached(keys, (), True)


def test_a_cached_state_overwritten_behind_the_cache_is_caught() -> None:
    """``inv_mamba_content`` on every snapshot: a cached state whose value changed (written over after it was
    cached, e.g. by a slot handed out twice) is caught."""
    m = cache_machine("mamba")
    m.insert(0, (1, 2), False)
    m.inv_all_laws()
    state = next(iter(m.prefix.mamba_state.values()))
    m.a.write_mamba(state, 12345)  # BUG: the cached state is written over
    with pytest.raises(AssertionError, match=rf"inv_mamba_content: cached state {state} of .* holds 12345"):
        m.inv_all_laws()


def _sweep_constructors(kind: str, examples: int = 40) -> None:
    from hypothesis import Phase
    from hypothesis import strategies as st

    from kvledger.contracts.machines.probes import CONSTRUCTORS

    turns = sum(1 for c in CONSTRUCTORS[kind] for k in c.args if k in c.edges)

    @settings(max_examples=examples, derandomize=True, database=None, deadline=None, phases=[Phase.generate])
    @given(st.data())
    def run(data: st.DataObject) -> None:
        m = machine(kind)
        for _ in range(turns):  # NOTE: a whole round: the sweep takes every (type, argument) in turn
            m.construct_sweep(data)

    run()


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_the_constructor_sweep_holds_on_the_reference(kind: str) -> None:
    _sweep_constructors(kind)


def test_a_constructor_that_takes_any_shape_is_caught_by_the_sweep(monkeypatch: pytest.MonkeyPatch) -> None:
    """A shape check weakened for one kind of dimension (here any shape is replaced by a good one: a zero, negative,
    bool or float dimension is taken) is met by the sweep, which gives each kind in turn."""
    real = MambaPool.__init__

    def lenient(self: MambaPool, size: int, conv_shape: Any = (2,), temporal_shape: Any = (2,), **kw: Any) -> None:
        real(self, size, conv_shape=(2,), temporal_shape=(2,), **kw)  # BUG: the shapes are never checked

    monkeypatch.setattr(MambaPool, "__init__", lenient)
    with pytest.raises(AssertionError, match="inv_domain_enforced: MambaPool"):
        _sweep_constructors("mamba")


@pytest.mark.parametrize(
    ("kind", "cls"),
    [
        ("req_to_token", "ReqToTokenPool"),
        ("mamba", "MambaPool"),
        ("paged", "PagedAllocator"),
        ("token", "TokenAllocator"),
    ],
)
def test_a_constructor_bound_moved_past_its_stated_maximum_is_caught_by_the_sweep(
    kind: str, cls: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each count a constructor takes is swept with the first count past its stated maximum (``probes.SLOTS_END``,
    ``ROWS_END``, ``SHAPE_END``), which must be refused, typed: a bound moved one power of two up takes it. (The
    lenient constructor here builds a small pool instead of the huge one, as a bug's would try to.)"""
    import kvledger.contracts.machines.probes as P

    ends = {P.SLOTS_END, P.ROWS_END, P.SHAPE_END}
    target = {c.what: c for c in P.CONSTRUCTORS[kind]}[cls]
    real = target.build

    def lenient(*args: Any, **kw: Any) -> object:
        small = {k: (2 if v in ends and type(v) is int else v) for k, v in kw.items()}  # BUG: the bound is not checked
        return real(*[2 if a in ends and type(a) is int else a for a in args], **small)

    monkeypatch.setitem(P._BY_NAME, cls, replace(target, build=lenient))
    with pytest.raises(AssertionError, match=f"inv_domain_enforced: {cls}"):
        _sweep_constructors(kind)


def test_a_row_read_one_column_too_long_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """``read`` answers what ``write`` stored: a read whose slice runs one column past ``end`` is caught by the row
    write's read-back (``results equal the spec's``)."""
    from kvledger.impl.req_to_token import ReqToTokenPool

    m = machine("req_to_token")
    c = chunk_of(m)
    m.write_row(c, 0, 2, "ids", 0)  # the reference reads back what it wrote
    monkeypatch.setattr(ReqToTokenPool, "read", lambda self, row, start, end: self.table[row, start : end + 1].clone())
    with pytest.raises(AssertionError, match=r"results equal the spec's: read\(row \d+, 0, 2\) after the write"):
        m.write_row(c, 0, 2, "ids", 0)


@pytest.mark.parametrize(
    ("kind", "bug"),
    [("token", "an SWA cache"), ("paged", "a driven cache"), ("req_to_token", "rows on another device")],
)
def test_a_memory_manager_built_outside_its_domain_is_caught_by_the_sweep(
    kind: str, bug: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``MemoryManager`` is one of the constructors every pool kind sweeps (``probes.MANAGER``): a cache over an
    SWA allocator, a cache or a request table another manager drives, a table on another device, and objects of
    other types are each refused, typed. A manager that skips one of those checks is caught (the lenient build
    here lets that one kind through, as a bug's would)."""
    import kvledger.contracts.machines.probes as P
    from kvledger.impl.allocators import SWATokenAllocator
    from kvledger.impl.memory import MemoryManager

    target = P._BY_NAME["MemoryManager"]

    def lenient(cache: Any, rows: Any) -> object:
        if bug == "an SWA cache" and isinstance(getattr(cache, "kv", None), SWATokenAllocator):
            return None  # BUG: a cache over an SWA allocator taken
        if bug == "a driven cache" and getattr(cache, "driven", False):
            return None  # BUG: a second manager over one cache
        if bug == "rows on another device" and getattr(rows, "device", None) == torch.device("meta"):
            return None  # BUG: the devices are not compared
        return MemoryManager(cache, rows)

    _sweep_constructors(kind)  # the reference refuses each
    monkeypatch.setitem(P._BY_NAME, "MemoryManager", replace(target, build=lenient))
    with pytest.raises(AssertionError, match="inv_domain_enforced: MemoryManager"):
        _sweep_constructors(kind)


@pytest.mark.parametrize(
    ("kind", "cls"),
    [("token", "TokenAllocator"), ("paged", "PagedAllocator"), ("swa", "SWATokenAllocator"), ("mamba", "MambaPool")],
)
def test_a_pool_that_takes_any_device_is_caught_by_the_sweep(
    kind: str, cls: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each pool constructor's ``device`` is swept with ``probes.DEVICE_EDGES`` (no device: ``None``, an int, bytes,
    an empty or unknown name): a constructor that puts anything it cannot read on the CPU is caught."""
    import kvledger.contracts.machines.probes as P

    target = {c.what: c for c in P.CONSTRUCTORS[kind]}[cls]
    real = target.build

    def lenient(**kw: Any) -> object:
        device = kw["device"]
        if not isinstance(device, str | torch.device) or not P._is_device(device):
            kw["device"] = "cpu"  # BUG: a device it cannot read is taken for the CPU
        return real(**kw)

    monkeypatch.setitem(P._BY_NAME, cls, replace(target, build=lenient))
    with pytest.raises(AssertionError, match=f"inv_domain_enforced: {cls}"):
        _sweep_constructors(kind)


def test_an_lru_list_of_no_component_is_caught_by_the_sweep(monkeypatch: pytest.MonkeyPatch) -> None:
    """``LRUList`` is among the token kind's constructors: a component given by its name, an int or an enum of
    another type is refused, typed. A list that reads a component's name as that component is caught."""
    import kvledger.contracts.machines.probes as P
    from kvledger.impl.lru import LRUList
    from kvledger.spec.types import Component

    def lenient(component: Any) -> object:
        if isinstance(component, str) and component in {c.value for c in Component}:
            component = Component(component)  # BUG: a component's name taken for the component
        return LRUList(component)

    monkeypatch.setitem(P._BY_NAME, "LRUList", replace(P._BY_NAME["LRUList"], build=lenient))
    with pytest.raises(AssertionError, match="inv_domain_enforced: LRUList"):
        _sweep_constructors("token")


def _every_int_dtype(m: Any, c: Chunk) -> None:
    """``_in_every_int_dtype`` until every (parameter, dtype) pair has come round (it takes one per step)."""
    from kvledger.contracts.machines.pool import OTHER_INT_DTYPES, tensor_calls

    for _ in range(len(tensor_calls(m.pool, c)) * len(OTHER_INT_DTYPES) * 2):
        m._in_every_int_dtype(c)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_ids_in_every_int_dtype_pass_on_the_reference(kind: str) -> None:
    """``spec.domains.inv_dtype_blind``: every tensor parameter of every pool, given its ids (or values) as int32,
    int16, int8, uint8, ... does what it does with them as int64."""
    m = machine(kind)
    _every_int_dtype(m, chunk_of(m, KINDS[kind].unit * 2))


@pytest.mark.parametrize("kind", ["token", "paged", "swa"])
def test_ids_left_in_their_dtype_are_caught(monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    """Issue 19, new family, seed 19: ``check_ids_tensor`` that leaves ids in the dtype they came in. torch takes
    no int8 or int16 index and reads a uint8 one as a mask, so a verify, a translate or a page map of such ids
    crashes or reads other slots, where the same ids as int64 are answered."""
    from kvledger.impl import arguments

    m = machine(kind)
    c = chunk_of(m, KINDS[kind].unit * 2)
    _every_int_dtype(m, c)
    monkeypatch.setattr(arguments, "int_ids", lambda op, where, t: t)  # BUG: the ids keep their dtype
    with pytest.raises(AssertionError, match=r"inv_domain_enforced: .* as torch\.u?int|inv_dtype_blind"):
        _every_int_dtype(m, c)


def test_a_pool_that_indexes_before_it_converts_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pool whose free and transfer index with the ids as they came (a uint8 tensor is a mask to torch, an int16
    one no index): the same call with int64 ids is accepted."""
    from kvledger.impl import slots

    m = machine("token")
    c = chunk_of(m, 2)
    _every_int_dtype(m, c)
    monkeypatch.setattr(slots, "int_ids", lambda op, where, t: t)  # BUG: no conversion before the index
    with pytest.raises(AssertionError, match=r"inv_domain_enforced|inv_dtype_blind"):
        _every_int_dtype(m, c)


@pytest.mark.parametrize("kind", ["token", "paged", "mamba", "req_to_token"])
def test_a_refusal_that_pairs_a_slot_with_another_slots_holder_is_caught(
    monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """Issue 19, new family, seed 5: ``SlotPool._held_error`` naming the last foreign slot with the first one's
    holder. A thief frees the slots of two other owners at once; the ``NotOwner`` must say who holds the slot it
    names (``spec.errors.inv_names_holder``)."""
    from kvledger.impl import slots
    from kvledger.impl.owners import decode
    from kvledger.spec.errors import LedgerError
    from kvledger.spec.errors import NotOwner as NotOwnerError

    m = machine(kind)
    m.allocate(request(1), KINDS[kind].unit)
    m.allocate(request(2), KINDS[kind].unit)
    m.allocate(session(3), KINDS[kind].unit)  # NOTE: the thief's alloc: it then frees the other two owners' slots

    def held_error(self: Any, op: str, ids: torch.Tensor, tags: torch.Tensor, owner: Any) -> LedgerError:
        last = int(ids[-1])  # BUG: the last slot named, with the first one's holder
        holder = decode(int(tags[0]))
        return NotOwnerError(op, self.name, ids.tolist(), f"slot {last} is held by {holder}", held=(last, holder))

    monkeypatch.setattr(slots.SlotPool, "_held_error", held_error)
    with pytest.raises(AssertionError, match="inv_names_holder"):
        m.allocate(session(3), KINDS[kind].unit)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_an_id_past_int64_must_be_named_as_given(monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    """Issue 19, new family, seed 12: ``int_ids`` without its refusal of uint64 ids past int64. They are then
    converted to the negative int64s their bits read as, and refused as those: ids the caller never gave. A free of
    the pool's first ids with one id past int64 must be refused naming that id, and only it."""
    from kvledger.impl import allocators, arguments, slots

    m = machine(kind)
    m.out_of_range("above")
    convert = arguments.int_ids

    def wrapping(op: str, where: str, t: torch.Tensor) -> torch.Tensor:
        return t.to(torch.int64) if t.dtype == torch.uint64 else convert(op, where, t)  # BUG: wraps past int64

    for module in (arguments, allocators, slots):
        monkeypatch.setattr(module, "int_ids", wrapping)
    with pytest.raises(AssertionError, match="inv_names_culprit"):
        m.out_of_range("above")


def test_a_shape_bound_one_too_tight_is_caught_by_the_sweep(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 19, new family, seed 13: ``MambaPool`` refusing dimensions of 1 (``0 < d`` made ``1 < d``). The shape
    catalogue holds the least valid shapes, which must be built."""
    real = MambaPool.__init__

    def strict(self: MambaPool, size: int, conv_shape: Any = (2,), temporal_shape: Any = (2,), **kw: Any) -> None:
        for shape in (conv_shape, temporal_shape):
            if isinstance(shape, tuple) and 1 in shape:  # BUG: a dimension of 1 is refused
                raise InvalidArgument("create", "mamba", (), f"shape {shape} must be of ints >= 2")
        real(self, size, conv_shape=conv_shape, temporal_shape=temporal_shape, **kw)

    monkeypatch.setattr(MambaPool, "__init__", strict)
    with pytest.raises(AssertionError, match="inv_domain_enforced: MambaPool"):
        _sweep_constructors("mamba")
