"""Contract bindings: zero wrappers when off, incremental laws when on, refinement when slow."""

from __future__ import annotations

from collections.abc import Iterator

import icontract
import pytest
import torch

from kvledger.contracts import bindings
from kvledger.impl.allocators import PagedAllocator, SWATokenAllocator, TokenAllocator
from kvledger.impl.slots import SlotPool
from kvledger.spec.errors import DoubleFree
from kvledger.spec.types import request, session

R1 = request(1)


@pytest.fixture(params=["on", "slow"])
def level(request: pytest.FixtureRequest) -> Iterator[str]:
    saved = bindings.current_level()
    bindings.install(request.param)
    yield str(request.param)
    bindings.install(saved)


def test_off_means_no_wrapper() -> None:
    saved = bindings.current_level()
    bindings.install("off")
    try:
        assert SlotPool.alloc is SlotPool.__dict__["alloc"]
        assert not hasattr(SlotPool.alloc, "__preconditions__") and not hasattr(SlotPool.alloc, "__postconditions__")
    finally:
        bindings.install(saved)


def test_level_from_env_rejects_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(bindings.ENV_VAR, "loud")
    with pytest.raises(ValueError, match="KVLEDGER_CONTRACTS='loud'"):
        bindings.level_from_env()
    monkeypatch.setenv(bindings.ENV_VAR, "SLOW")
    assert bindings.level_from_env() == "slow"


def test_correct_pools_pass(level: str) -> None:
    a = TokenAllocator(16)
    x = a.alloc(5, R1)
    a.transfer(x[:2], R1, session(2))
    a.free(x[2:], R1)
    with pytest.raises(DoubleFree):  # the typed error still surfaces through the wrapper
        a.free(x[2:], R1)
    p = PagedAllocator(4, 2)
    p.free(p.alloc(3, R1), R1)
    s = SWATokenAllocator(8, 4)
    y = s.alloc(3, R1)
    s.free_swa(y[:1], R1)
    s.free(y, R1)


def test_leaky_release_violates_a_named_law(level: str, monkeypatch: pytest.MonkeyPatch) -> None:
    original = bindings._originals[(SlotPool, "release")]

    def leaky(self: SlotPool, idx: torch.Tensor) -> None:
        original(self, idx)
        self._top -= 1  # BUG: one freed slot never reaches the free stack

    monkeypatch.setattr(SlotPool, "_release", leaky)  # NOTE: the push a free makes (no tier wraps it)
    bindings._originals[(SlotPool, "release")] = leaky
    try:
        bindings.install(level)  # type: ignore[arg-type]
        a = TokenAllocator(8)
        x = a.alloc(3, R1)
        with pytest.raises(
            icontract.ViolationError,
            match=r"released slots are free-tagged and pushed once|free stack matches tags|ledger laws",
        ):
            a.free(x, R1)
        b = TokenAllocator(8)  # NOTE: a's pool is broken now (the slow tier checks it whole)
        y = b.alloc(2, R1)
        b.pool.check_held("free", y, R1)
        with pytest.raises(
            icontract.ViolationError,
            match=r"released slots are free-tagged and pushed once|free stack matches tags|ledger laws",
        ):
            b.pool.release(y)  # NOTE: alone, as the paged and SWA allocators call it
    finally:
        bindings._originals[(SlotPool, "release")] = original
        bindings.install(level)  # type: ignore[arg-type]


def test_alloc_of_held_slot_violates_a_named_law(level: str) -> None:
    a = TokenAllocator(8)
    x = a.alloc(2, R1)
    a.pool._stack[a.pool._top - 1] = x[0]  # corrupt the free stack: a held slot sits on it
    with pytest.raises(
        icontract.ViolationError,
        match=r"alloc hands out exactly the top n free slots|free stack matches tags|ledger laws|abstract\(after\)",
    ):
        a.alloc(1, session(3))


def test_slow_tier_checks_refinement() -> None:
    saved = bindings.current_level()
    bindings.install("slow")
    try:
        a = TokenAllocator(8)
        x = a.alloc(2, R1)
        a.pool.owner_tag[int(x[0])] = 0  # lose an owner behind the pool's back
        with pytest.raises(icontract.ViolationError, match=r"ledger laws|free stack matches tags|abstract"):
            a.alloc(1, R1)
    finally:
        bindings.install(saved)


def test_slow_tier_adds_to_the_incremental_tier() -> None:
    saved = bindings.current_level()
    try:
        bindings.install("on")
        on = set(SlotPool.alloc.__kvledger_laws__)  # type: ignore[attr-defined]
        assert not hasattr(SlotPool.alloc, "__postconditions__")  # NOTE: tier on runs no icontract wrapper
        bindings.install("slow")
        slow = {c.description for c in SlotPool.alloc.__postconditions__}  # type: ignore[attr-defined]
        slow |= set(SlotPool.alloc.__kvledger_laws__)  # type: ignore[attr-defined]
        assert on < slow
        assert {"pool obeys the ledger laws", "abstract(after) == spec.allocate(abstract(before))"} <= slow
    finally:
        bindings.install(saved)
    assert bindings.current_level() == saved


# ---------------------------------------------------------------- each incremental law fails on a broken pool
# NOTE: tier on alone (the slow tier's whole-pool laws would catch these too, and hide which law fired).


def _broken(name: str, broken: object) -> None:
    """Install tier ``on`` over ``broken`` standing in for ``SlotPool.<name>``."""
    bindings._originals[(SlotPool, name)] = broken
    bindings.install("on")


@pytest.fixture
def restore() -> Iterator[None]:
    saved = dict(bindings._originals)
    yield
    bindings.install("off")
    bindings._originals.update(saved)
    bindings.install("on")


@pytest.mark.parametrize("n", [1, 2])  # NOTE: one slot takes the scalar reads of tier on, more the gathers
@pytest.mark.parametrize("alloc", ["alloc", "alloc_ids"])
def test_alloc_off_the_stack_top_is_caught(contracts_on: None, restore: None, alloc: str, n: int) -> None:
    original = bindings._originals[(SlotPool, alloc)]

    def skips_one(self: SlotPool, n: int, owner: object, **kw: object) -> object:
        self._top -= 1  # BUG: the top free slot is lost, the next n handed out
        return original(self, n, owner, **kw)

    _broken(alloc, skips_one)
    a = TokenAllocator(8)
    with pytest.raises(icontract.ViolationError, match="alloc hands out exactly the top n free slots"):
        getattr(a.pool, alloc)(n, R1)


def test_alloc_that_rewrites_the_stack_it_pops_is_caught(contracts_on: None, restore: None) -> None:
    """The popped slots are read before the call: an alloc that writes a held slot onto its free stack and hands it
    out is caught, though the stack reads as the result after the call."""
    original = bindings._originals[(SlotPool, "alloc")]

    def rewrites(self: SlotPool, n: int, owner: object) -> torch.Tensor:
        if owner == R1:  # BUG: session 4's first slot written over the top free one, and untagged
            self._stack[self._top - 1] = 1
            self.owner_tag[1] = 0
        out: torch.Tensor = original(self, n, owner)
        return out

    _broken("alloc", rewrites)
    a = TokenAllocator(8)
    a.pool.alloc(2, session(4))
    with pytest.raises(icontract.ViolationError, match="alloc hands out exactly the top n free slots"):
        a.pool.alloc(1, R1)


@pytest.mark.parametrize("n", [1, 3])
def test_alloc_that_leaves_a_tag_is_caught(contracts_on: None, restore: None, n: int) -> None:
    original = bindings._originals[(SlotPool, "alloc")]

    def untagged(self: SlotPool, n: int, owner: object) -> torch.Tensor:
        out: torch.Tensor = original(self, n, owner)
        self.owner_tag[out[:1]] = 0  # BUG: one handed-out slot still reads free
        return out

    _broken("alloc", untagged)
    with pytest.raises(icontract.ViolationError, match="alloc'd slots are tagged with their new owner"):
        TokenAllocator(8).alloc(n, R1)


def test_alloc_count_is_checked(contracts_on: None, restore: None) -> None:
    original = bindings._originals[(SlotPool, "alloc")]

    def short(self: SlotPool, n: int, owner: object) -> torch.Tensor:
        out: torch.Tensor = original(self, n, owner)
        return out[:-1]  # BUG: one slot taken but not handed out (a leak)

    _broken("alloc", short)
    with pytest.raises(icontract.ViolationError, match=r"exactly the top n free slots|drops by exactly"):
        TokenAllocator(8).alloc(3, R1)


def test_release_of_a_free_slot_is_caught(contracts_on: None) -> None:
    a = TokenAllocator(8)
    x = a.alloc(4, R1)
    a.free(x[:1], R1)
    with pytest.raises(icontract.ViolationError, match="release returns only held slots"):
        a.pool.release(x[:2])  # NOTE: unchecked by design; the contract sees the double free


@pytest.mark.parametrize("alone", [False, True])
@pytest.mark.parametrize("n", [1, 2])
def test_release_that_leaves_a_tag_is_caught(
    contracts_on: None, restore: None, monkeypatch: pytest.MonkeyPatch, n: int, alone: bool
) -> None:
    """A release that leaves its slots tagged is caught in a free (through the push the free makes,
    ``SlotPool._release``) and called alone (``SlotPool.release``, as the paged and SWA allocators call it)."""
    original = bindings._originals[(SlotPool, "release")]

    def keeps_tag(self: SlotPool, idx: torch.Tensor) -> None:
        tags = self.owner_tag.clone()
        original(self, idx)
        self.owner_tag.copy_(tags)  # BUG: pushed on the stack, still tagged with the old owner

    monkeypatch.setattr(SlotPool, "_release", keeps_tag)
    _broken("release", keeps_tag)
    a = TokenAllocator(8)
    x = a.alloc(n, R1)
    with pytest.raises(icontract.ViolationError, match="released slots are free-tagged and pushed once"):
        if alone:
            a.pool.check_held("free", x, R1)
            a.pool.release(x)
        else:
            a.free(x, R1)


@pytest.mark.parametrize("n", [1, 2])
def test_free_that_pushes_another_slot_is_caught(contracts_on: None, restore: None, n: int) -> None:
    original = bindings._originals[(SlotPool, "free")]

    def pushes_other(self: SlotPool, indices: torch.Tensor, owner: object) -> None:
        original(self, indices, owner)
        self._stack[self._top - 1] = 8  # BUG: the top pushed entry names a held slot, not the one freed

    _broken("free", pushes_other)
    a = TokenAllocator(8)
    x = a.alloc(n, R1)
    a.alloc(8 - n, session(3))  # slot 8 is session 3's
    with pytest.raises(icontract.ViolationError, match="released slots are free-tagged and pushed once"):
        a.pool.free(x, R1)


@pytest.mark.parametrize("n", [1, 2])
def test_free_from_the_wrong_owner_is_caught(contracts_on: None, restore: None, n: int) -> None:
    def frees_anything(self: SlotPool, indices: torch.Tensor, owner: object) -> None:
        self._release(indices)  # BUG: no ownership check

    _broken("free", frees_anything)
    a = TokenAllocator(8)
    x = a.alloc(n, R1)
    with pytest.raises(icontract.ViolationError, match="free takes slots only from their owner"):
        a.pool.free(x, session(2))


def test_transfer_laws_are_checked(contracts_on: None, restore: None) -> None:
    def retags_anything(self: SlotPool, indices: torch.Tensor, src: object, dst: object) -> None:
        self.retag(indices, dst)  # type: ignore[arg-type]  # BUG: the source is never checked

    _broken("transfer", retags_anything)
    a = TokenAllocator(8)
    x = a.alloc(2, R1)
    with pytest.raises(icontract.ViolationError, match="transfer takes slots only from the named source"):
        a.pool.transfer(x, session(5), session(2))

    def drops(self: SlotPool, indices: torch.Tensor, src: object, dst: object) -> None:
        pass  # BUG: nothing moves

    _broken("transfer", drops)
    b = TokenAllocator(8)
    with pytest.raises(icontract.ViolationError, match="transferred slots carry the destination's tag"):
        b.pool.transfer(b.alloc(2, R1), R1, session(2))


def test_free_swa_mapping_is_checked(contracts_on: None) -> None:
    bindings.install("off")
    original = SWATokenAllocator.free_swa

    def keeps_mapping(self: SWATokenAllocator, indices: torch.Tensor, owner: object) -> None:
        saved = self.full_to_swa.clone()
        original(self, indices, owner)  # type: ignore[arg-type]
        self.full_to_swa.copy_(saved)  # BUG: the freed SWA slots stay mapped

    SWATokenAllocator.free_swa = keeps_mapping  # type: ignore[method-assign]
    try:
        bindings.install("on")
        s = SWATokenAllocator(8, 4)
        y = s.alloc(2, R1)
        with pytest.raises(icontract.ViolationError, match="freed SWA slots are unmapped"):
            s.free_swa(y[:1], R1)
    finally:
        bindings.install("off")
        SWATokenAllocator.free_swa = original  # type: ignore[method-assign]


def test_incremental_laws_cost_what_the_call_touches() -> None:
    """Tier on reads only the slots a call names and the stack span it moved: the same touched entries on a
    pool of 8 slots and one of a million (counted by numpy reads of the tag column, not timed)."""
    saved = bindings.current_level()
    bindings.install("on")
    try:
        reads = []
        for capacity in (8, 1_000_000):
            a = TokenAllocator(capacity)
            tags = a.pool._tags
            assert tags is not None
            counted = _CountingArray(tags)
            a.pool._tags = counted  # type: ignore[assignment]
            a.free(a.alloc(4, R1), R1)
            reads.append(counted.elements)
        assert reads[0] == reads[1] > 0
    finally:
        bindings.install(saved)


class _CountingArray:
    """A stand-in for a pool's host tag column that counts the elements each read or write touches."""

    def __init__(self, a: object) -> None:
        self.a = a
        self.elements = 0

    def __getitem__(self, ids: object) -> object:
        out = self.a[ids]  # type: ignore[index]
        self.elements += int(getattr(out, "size", 1))
        return out

    def __setitem__(self, ids: object, value: object) -> None:
        self.a[ids] = value  # type: ignore[index]
        self.elements += int(getattr(self.a[ids], "size", 1))  # type: ignore[index]


def test_free_checks_the_release_it_makes_in_one_pass(contracts_on: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tier on reads a free's slots once: its release is checked as part of it, not by a second snapshot; a release
    called alone is still checked."""
    calls = []
    snap = bindings.snap_touched

    def counted(self: SlotPool, indices: object) -> object:
        calls.append(len(indices))  # type: ignore[arg-type]
        return snap(self, indices)

    monkeypatch.setattr(bindings, "snap_touched", counted)
    a = TokenAllocator(8)
    a.free(a.alloc(3, R1), R1)  # NOTE: an alloc result this tier checked: read through its view, no snapshot
    a.free(a.alloc(1, R1), R1)
    assert calls == []
    a.free(a.alloc(3, R1).clone(), R1)  # another tensor: one snapshot, none for the release inside
    assert calls == [3]
    x = a.alloc(2, R1)
    a.pool.check_held("free", x, R1)
    a.pool.release(x)  # NOTE: alone, as the paged and SWA allocators call it
    assert calls == [3, 2]


@pytest.mark.parametrize("n", [1, 2])
def test_free_of_an_alloc_result_rewritten_through_numpy_is_caught(n: int, contracts_on: None, restore: None) -> None:
    """A write through a numpy view changes no torch version: a free of a remembered alloc result reads its ids
    again, so a negative id written there is refused as for any other tensor."""

    def frees_anything(self: SlotPool, indices: torch.Tensor, owner: object) -> None:
        self._release(indices.numpy())  # BUG: no checks; numpy wraps -1 around to the last slot

    _broken("free", frees_anything)
    a = TokenAllocator(4)
    x = a.alloc(n, R1)
    a.alloc(4 - n, R1)  # the last slot (4) is R1's: its tag passes an owner check read through the wrapped index
    x.numpy()[0] = -1
    with pytest.raises(icontract.ViolationError, match="free takes slots only from their owner"):
        a.pool.free(x, R1)


def test_free_of_a_negative_id_is_caught(contracts_on: None, restore: None) -> None:
    def frees_anything(self: SlotPool, indices: torch.Tensor, owner: object) -> None:
        self._release(indices.numpy())  # BUG: no checks; numpy wraps -1 around to the last slot

    _broken("free", frees_anything)
    a = TokenAllocator(4)
    a.alloc(4, R1)  # the last slot (4) is R1's: its tag passes an owner check read through the wrapped index
    with pytest.raises(icontract.ViolationError, match="free takes slots only from their owner"):
        a.pool.free(torch.tensor([-1]), R1)


def _state(pool: SlotPool) -> tuple[bytes, bytes, int]:
    """A fingerprint of everything a pool's transitions change: its tags, its free stack and the stack's top."""
    return pool.owner_tag.numpy().tobytes(), pool.free_slots().numpy().tobytes(), pool.available_size()


@pytest.mark.parametrize("n", [1, 3])
def test_second_free_of_a_checked_alloc_result_is_refused_typed(contracts_on: None, n: int) -> None:
    """A checked alloc result leaves the tier's view memo when freed: freeing it again takes the checked path and is
    refused as a double free, the pool unchanged."""
    a = TokenAllocator(8)
    x = a.alloc(n, R1)
    a.free(x, R1)
    before = _state(a.pool)
    with pytest.raises(DoubleFree):
        a.free(x, R1)
    assert _state(a.pool) == before


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_one_slot_free_is_checked_whatever_its_integer_dtype(
    contracts_on: None, restore: None, dtype: torch.dtype
) -> None:
    """A one-slot free is read as a Python int (``tolist``), so an int32 id is checked as an int64 one is."""

    def frees_anything(self: SlotPool, indices: torch.Tensor, owner: object) -> None:
        self._release(indices.to(torch.int64).numpy())  # BUG: no ownership check

    _broken("free", frees_anything)
    a = TokenAllocator(8)
    x = a.alloc(1, R1)
    with pytest.raises(icontract.ViolationError, match="free takes slots only from their owner"):
        a.pool.free(x.to(dtype), session(2))


def test_one_slot_alloc_of_another_dtype_is_read_as_slot_ids(contracts_on: None, restore: None) -> None:
    """A one-slot alloc whose result ``tolist`` does not show as ``[slot]`` of an int (a float here) is read as any
    other result (``_host``, as tier on read it before): the right slot passes, another is caught."""
    original = bindings._originals[(SlotPool, "alloc")]

    def as_float(self: SlotPool, n: int, owner: object) -> torch.Tensor:
        out: torch.Tensor = original(self, n, owner)
        return out.to(torch.float64)

    _broken("alloc", as_float)
    a = TokenAllocator(8)
    assert a.pool.alloc(1, R1).tolist() == [1.0]

    def off_by_one(self: SlotPool, n: int, owner: object) -> torch.Tensor:
        out: torch.Tensor = original(self, n, owner)
        return (out + 1).to(torch.int32)  # BUG: names the next slot, not the one popped and tagged

    _broken("alloc", off_by_one)
    with pytest.raises(icontract.ViolationError, match="alloc hands out exactly the top n free slots"):
        TokenAllocator(8).pool.alloc(1, R1)


def test_tag_bytes_of_long_calls_are_not_kept(contracts_on: None) -> None:
    """Tier on keeps the tag bytes it compares with per owner only for calls of up to ``HANDED_MAX`` slots: a long
    alloc's are made for it and dropped (at most 256 owners' worth of 64 KiB are kept)."""
    from kvledger.impl.slots import HANDED_MAX

    a = TokenAllocator(2 * HANDED_MAX + 8)
    x = a.alloc(HANDED_MAX + 1, R1)
    assert all(len(b) <= 8 * HANDED_MAX for b in bindings._RUN_OF.values())
    a.free(x, R1)
    y = a.alloc(HANDED_MAX, R1)
    assert len(bindings._RUN_OF[a.pool.code_of(R1, "alloc")]) == 8 * HANDED_MAX
    a.free(y, R1)


def _run_of(x: torch.Tensor) -> bytes | None:
    """The run of slots tier on remembered for alloc result ``x`` (``None``: read as any other result)."""
    handed = bindings._VIEWS[id(x)][3]
    return None if handed is None else handed[0]


def test_run_path_is_taken_for_a_run_only(contracts_on: None) -> None:
    """An alloc whose popped slots are a run of slots (a fresh pool's, or one freed whole) is read in place; a
    fragmented stack's is not, and both pass."""
    a = TokenAllocator(16)
    x = a.alloc(4, R1)
    assert _run_of(x) == torch.arange(1, 5).numpy().tobytes()
    a.free(x, R1)
    y = a.alloc(4, R1)  # NOTE: the freed run, popped in the other order
    assert _run_of(y) == torch.arange(4, 0, -1).numpy().tobytes()
    a.free(y[1:3], R1)
    a.free(y[torch.tensor([0, 3])], R1)  # NOTE: the stack's top four are 3, 2, 4, 1: not a run
    z = a.alloc(4, R1)
    assert _run_of(z) is None
    a.free(z, R1)


def test_run_alloc_one_past_its_run_is_caught(contracts_on: None, restore: None) -> None:
    """An alloc that pops a run and hands out (and tags) the run one slot further is caught in the run path."""
    original = bindings._originals[(SlotPool, "alloc")]

    def one_past(self: SlotPool, n: int, owner: object) -> torch.Tensor:
        out: torch.Tensor = original(self, n, owner)
        moved = out + 1  # BUG: slots 2 .. n + 1 handed out and tagged; slot 1 popped, tagged and lost
        self.owner_tag[moved] = int(self.owner_tag[out[0]])
        return moved

    _broken("alloc", one_past)
    with pytest.raises(icontract.ViolationError, match="alloc hands out exactly the top n free slots"):
        TokenAllocator(16).alloc(4, R1)


def test_run_alloc_of_a_held_slot_is_caught(contracts_on: None) -> None:
    """A run on the free stack whose slot is held (tagged behind the pool's back) is caught before it is handed out."""
    a = TokenAllocator(16)
    assert a.pool._tags is not None
    a.pool._tags[3] = a.pool.code_of(session(2), "test")  # BUG: a free slot of the run carries an owner
    with pytest.raises(icontract.ViolationError, match="alloc hands out exactly the top n free slots"):
        a.alloc(4, R1)


@pytest.mark.parametrize("how", ["transfer", "behind the pool"])
def test_run_free_of_another_owners_slot_is_caught(contracts_on: None, restore: None, how: str) -> None:
    """A free that checks nothing, of a remembered run one of whose slots another owner now holds (by a transfer,
    after which the freeing owner is not the pool's last seen; or written behind the pool's back, after which it
    is): the run path reads the tags before the call and names the law."""

    def frees_anything(self: SlotPool, indices: torch.Tensor, owner: object) -> None:
        self._release(indices.numpy())  # BUG: no ownership check

    _broken("free", frees_anything)
    a = TokenAllocator(16)
    x = a.alloc(4, R1)
    if how == "transfer":
        a.transfer(x[1:2], R1, session(2))
    else:
        assert a.pool._tags is not None
        a.pool._tags[2] = a.pool._tags[1] + 1  # BUG: slot 2 carries another tag; R1 stays the last owner seen
        assert a.pool._seen[0] is R1
    assert _run_of(x) is not None
    with pytest.raises(icontract.ViolationError, match="free takes slots only from their owner"):
        a.pool.free(x, R1)


@pytest.mark.parametrize("bug", ["pushes past the run", "keeps a tag"])
def test_run_free_that_misplaces_the_run_is_caught(contracts_on: None, restore: None, bug: str) -> None:
    """A free of a remembered run that pushes the run one slot further, or leaves one slot tagged, is caught."""
    original = bindings._originals[(SlotPool, "free")]

    def misplaces(self: SlotPool, indices: torch.Tensor, owner: object) -> None:
        tag = self.owner_tag[indices[:1]].clone()
        original(self, indices, owner)
        if bug == "pushes past the run":
            self._stack[self._top - 1] += 1  # BUG: the top pushed entry names the slot past the run
        else:
            self.owner_tag[indices[:1]] = tag  # BUG: one freed slot still carries its owner

    _broken("free", misplaces)
    a = TokenAllocator(16)
    x = a.alloc(4, R1)
    assert _run_of(x) is not None
    with pytest.raises(icontract.ViolationError, match="released slots are free-tagged and pushed once"):
        a.pool.free(x, R1)


def test_run_rewritten_through_numpy_is_read_anew(contracts_on: None, restore: None) -> None:
    """A remembered run rewritten through numpy (no torch version change) to name another owner's slot is no longer
    the run: the free reads its slots again and a free that checks nothing is caught."""

    def frees_anything(self: SlotPool, indices: torch.Tensor, owner: object) -> None:
        self._release(indices.numpy())  # BUG: no ownership check

    _broken("free", frees_anything)
    a = TokenAllocator(16)
    x = a.alloc(4, R1)
    a.alloc(4, session(2))  # slots 5 .. 8
    x.numpy()[0] = 5
    with pytest.raises(icontract.ViolationError, match="free takes slots only from their owner"):
        a.pool.free(x, R1)


def test_pool_copy_reads_its_own_columns(contracts_on: None, restore: None) -> None:
    """A copy's columns are the tensors it was given (no bytearrays): tier on reads them as before and still catches
    a free that checks nothing."""
    import copy

    a = TokenAllocator(16)
    b = copy.deepcopy(a)
    assert a.pool._tag_buf is not None and b.pool._tag_buf is None and b.pool._free_buf is None
    x = b.alloc(4, R1)
    assert _run_of(x) is None
    b.free(x, R1)

    def frees_anything(self: SlotPool, indices: torch.Tensor, owner: object) -> None:
        self._release(indices.numpy())  # BUG: no ownership check

    _broken("free", frees_anything)
    y = b.alloc(4, R1)
    with pytest.raises(icontract.ViolationError, match="free takes slots only from their owner"):
        b.pool.free(y, session(2))


def test_run_free_by_its_owner_reads_the_bytes_its_alloc_kept(
    contracts_on: None, restore: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A free of a remembered run by the owner it was handed to compares the run's tags, in place, with the owner's
    tag bytes the alloc's check kept (no lookup): a slot of the run tagged behind the pool's back is caught there."""

    def frees_anything(self: SlotPool, indices: torch.Tensor, owner: object) -> None:
        self._release(indices.numpy())  # BUG: no ownership check

    _broken("free", frees_anything)
    a = TokenAllocator(16)
    x = a.alloc(4, R1)
    kept = bindings._VIEWS[id(x)][3]
    assert kept is not None and kept[3] is R1
    looked_up: list[int] = []
    uniform = bindings._uniform_bytes
    monkeypatch.setattr(bindings, "_uniform_bytes", lambda code, n: looked_up.append(code) or uniform(code, n))
    assert a.pool._tags is not None
    a.pool._tags[2] = a.pool.code_of(session(2), "test")  # BUG: a slot of R1's run carries another owner's tag
    with pytest.raises(icontract.ViolationError, match="free takes slots only from their owner"):
        a.pool.free(x, R1)
    assert looked_up == []  # NOTE: the run path, with the bytes its alloc kept


def test_run_free_reads_the_columns_the_pool_has_now(contracts_on: None, restore: None) -> None:
    """A free of a remembered run reads it in place only while the pool's tag column and free stack are still the
    views of its bytearrays the alloc's check proved them to be: a pool whose column was replaced since is read
    through the column it has now, so a slot tagged there is caught (and a correct free after the stack was
    replaced is not refused)."""
    a = TokenAllocator(16)
    x = a.alloc(4, R1)
    assert _run_of(x) is not None and a.pool._free_np is not None
    a.pool._free_np = a.pool._free_np.copy()  # NOTE: the free stack no longer the bytearray's memory
    a.pool.free(x, R1)

    def frees_anything(self: SlotPool, indices: torch.Tensor, owner: object) -> None:
        self._release(indices.numpy())  # BUG: no ownership check

    _broken("free", frees_anything)
    b = TokenAllocator(16)
    y = b.alloc(4, R1)
    assert _run_of(y) is not None and b.pool._tags is not None
    b.pool._tags = b.pool._tags.copy()  # NOTE: the column no longer the bytearray's memory
    b.pool._tags[2] = b.pool.code_of(session(2), "test")  # BUG: slot 2 carries another owner's tag there
    with pytest.raises(icontract.ViolationError, match="free takes slots only from their owner"):
        b.pool.free(y, R1)


def test_run_memo_is_read_per_length(contracts_on: None) -> None:
    """The runs tier on remembers are keyed by their first slot popped and direction and read only at their own
    length: runs of other lengths from the same first slot, popped either way, are each read as themselves."""
    a = TokenAllocator(32)
    for n in (8, 8, 4, 4, 2, 2):  # NOTE: from slot 1 up, from 8 down, from 1 up, from 4 down, ...
        x = a.alloc(n, R1)
        assert _run_of(x) == x.numpy().tobytes()
        a.free(x, R1)
    assert a.available_size() == 32
