"""icontract bindings attached to the reference implementation from outside.

``impl/`` never imports this module: the implementation stays readable and,
with contracts off, runs with no wrapper at all. :func:`install` replaces the
public methods of the impl classes by icontract-wrapped versions;
:func:`uninstall` puts the originals back (benchmarks measure both in one run).

Tiers (``KVLEDGER_CONTRACTS=off|on|slow``, or ``pytest --kvledger-contracts``):

* ``on`` — incremental: each operation checks only what it touched (the
  slots it returned or was given, the free-stack top it moved). Cost is
  proportional to the operation, not to the pool, so it stays on in every
  test run.
* ``slow`` — adds whole-pool checks: the abstraction satisfies every ledger
  law, the free stack matches the tags, and the refinement
  ``abstract(after) == spec.step(abstract(before), op)`` holds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import icontract
import numpy as np
import torch

from kvledger.contracts.abstraction import inv_free_stack_matches_tags, ledger_of
from kvledger.contracts.tiers import ENV_VAR as ENV_VAR  # re-exported: the tiers live in a light module
from kvledger.contracts.tiers import LEVELS as LEVELS
from kvledger.contracts.tiers import Level as Level
from kvledger.contracts.tiers import level_from_env as level_from_env
from kvledger.impl.allocators import SWATokenAllocator
from kvledger.impl.owners import FREE_TAG, RESERVED_TAG, encode
from kvledger.impl.slots import SlotPool
from kvledger.spec import ledger as spec
from kvledger.spec.errors import LedgerError
from kvledger.spec.types import Owner

_originals: dict[tuple[type, str], Any] = {}
_level: Level = "off"


def current_level() -> Level:
    """The tier installed now."""
    return _level


# ------------------------------------------------------------------ snapshots (never raise)


def _safe(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception:  # a malformed call: the method itself will raise its typed error
        return None


def _top_slice(self: SlotPool, n: Any) -> Any:
    return _safe(lambda: self._stack[self._top - n : self._top].clone() if 0 <= n <= self._top else None)


def _as_tensor(indices: Any) -> torch.Tensor:
    """Slot ids as an int64 tensor: a tensor, or the host ids (numpy) a CPU pool's ``release`` also takes."""
    if isinstance(indices, np.ndarray):
        return torch.tensor(indices, dtype=torch.int64)
    t: torch.Tensor = indices.to(torch.int64)
    return t


def _tags_at(self: SlotPool, indices: Any) -> Any:
    return _safe(lambda: self.owner_tag[_as_tensor(indices).to(self.device)].clone())


def _same_set(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.numel() == b.numel() and bool((torch.sort(a).values == torch.sort(b).values).all())


# ------------------------------------------------------------------ incremental laws (tier "on")


def alloc_takes_free_top(self: SlotPool, n: int, result: Any, OLD: Any) -> bool:
    """alloc hands out exactly the top ``n`` free slots (``result``: a tensor, or host ids from ``alloc_ids``)."""
    got = _as_tensor(result).to(self.device)
    return OLD.cand is not None and _same_set(got, OLD.cand) and bool((OLD.cand_tags == FREE_TAG).all())


def alloc_tags_owner(self: SlotPool, owner: Owner, result: Any) -> bool:
    """alloc'd slots are tagged with their new owner."""
    return bool((self.owner_tag[_as_tensor(result).to(self.device)] == encode(owner)).all())


def alloc_count(self: SlotPool, n: int, result: Any, OLD: Any) -> bool:
    """free count drops by exactly n."""
    return len(result) == n and self._top == OLD.top - n


def release_only_held(self: SlotPool, OLD: Any) -> bool:
    """release returns only held slots (no double free, no reserved slot)."""
    tags = OLD.tags
    return tags is not None and bool(((tags != FREE_TAG) & (tags != RESERVED_TAG)).all())


def release_frees(self: SlotPool, idx: Any, OLD: Any) -> bool:
    """released slots are free-tagged and pushed on the free stack exactly once."""
    idx = _as_tensor(idx).to(self.device)
    k = idx.numel()
    pushed = self._stack[OLD.top : OLD.top + k]
    return self._top == OLD.top + k and bool((self.owner_tag[idx] == FREE_TAG).all()) and _same_set(pushed, idx)


def free_by_owner(self: SlotPool, owner: Owner, OLD: Any) -> bool:
    """free takes slots only from the owner that held them."""
    return OLD.tags is not None and bool((OLD.tags == encode(owner)).all())


def transfer_from_source(self: SlotPool, src: Owner, OLD: Any) -> bool:
    """transfer takes slots only from the named source."""
    return OLD.tags is not None and bool((OLD.tags == encode(src)).all())


def transfer_to_destination(self: SlotPool, indices: torch.Tensor, dst: Owner, OLD: Any) -> bool:
    """transferred slots are tagged with the destination and the free count is unchanged."""
    return self._top == OLD.top and bool((self.owner_tag[indices.to(torch.int64)] == encode(dst)).all())


def free_swa_clears_mapping(self: SWATokenAllocator, indices: torch.Tensor) -> bool:
    """full slots whose SWA slot was freed map to no SWA slot."""
    return bool((self.full_to_swa[indices.to(torch.int64)] == 0).all())


# ------------------------------------------------------------------ whole-pool laws (tier "slow")


def inv_pool_ledger(self: SlotPool) -> bool:
    """the pool's abstraction obeys single ownership and conservation."""
    return spec.inv_ledger(ledger_of(self))


def inv_free_stack(self: SlotPool) -> bool:
    """the free stack holds exactly the free-tagged slots."""
    return inv_free_stack_matches_tags(self)


def inv_swa_mapping(self: SWATokenAllocator) -> bool:
    """every live SWA mapping joins a held full slot to a held SWA slot, one to one."""
    m = self.full_to_swa
    live = torch.nonzero(m).flatten()
    swa = m[live]
    held_swa = int(((self.swa.pool.owner_tag != FREE_TAG) & (self.swa.pool.owner_tag != RESERVED_TAG)).sum())
    return (
        torch.unique(swa).numel() == swa.numel() == held_swa
        and bool((self.full.pool.owner_tag[live] > 0).all())
        and bool((self.swa.pool.owner_tag[swa] > 0).all())
    )


def _refines(self: SlotPool, step: Callable[[], spec.Ledger]) -> bool:
    try:
        return ledger_of(self) == step()
    except LedgerError:  # the spec forbids what the implementation just did
        return False


def refines_allocate(self: SlotPool, owner: Owner, result: Any, OLD: Any) -> bool:
    """abstract(after) == spec.allocate(abstract(before), owner, result)."""
    return _refines(self, lambda: spec.allocate(OLD.ledger, owner, frozenset(_as_tensor(result).tolist())))


def refines_free(self: SlotPool, indices: torch.Tensor, owner: Owner, OLD: Any) -> bool:
    """abstract(after) == spec.free(abstract(before), owner, indices)."""
    return _refines(self, lambda: spec.free(OLD.ledger, owner, frozenset(indices.tolist())))


def refines_transfer(self: SlotPool, indices: torch.Tensor, src: Owner, dst: Owner, OLD: Any) -> bool:
    """abstract(after) == spec.transfer(abstract(before), src, dst, indices)."""
    return _refines(self, lambda: spec.transfer(OLD.ledger, src, dst, frozenset(indices.tolist())))


# ------------------------------------------------------------------ install / uninstall


def _wrap(cls: type, name: str, *decorators: Callable[[Any], Any]) -> None:
    key = (cls, name)
    _originals.setdefault(key, cls.__dict__[name])
    fn = cls.__dict__[name]  # NOTE: wrap what is installed now, so the slow tier adds to the incremental one
    for deco in reversed(decorators):  # listed top to bottom, like decorator syntax
        fn = deco(fn)
    setattr(cls, name, fn)


def install(level: Level) -> None:
    """Attach the contracts of ``level`` to the impl classes (``off`` removes them)."""
    global _level
    uninstall()
    if level == "off":
        return
    snap = icontract.snapshot
    ens = icontract.ensure
    slow = level == "slow"
    for name in ("alloc", "alloc_ids"):  # NOTE: both pop through _pop_ids on a CPU pool
        _wrap(
            SlotPool,
            name,
            snap(lambda self: self._top, name="top"),
            snap(lambda self, n: _top_slice(self, n), name="cand"),
            snap(lambda self, n: _safe(lambda: self.owner_tag[_top_slice(self, n)].clone()), name="cand_tags"),
            snap(lambda self: ledger_of(self) if slow else None, name="ledger"),
            ens(alloc_takes_free_top, "alloc hands out exactly the top n free slots"),
            ens(alloc_tags_owner, "alloc'd slots are tagged with their new owner"),
            ens(alloc_count, "free count drops by exactly n"),
            ens(refines_allocate, "abstract(after) == spec.allocate(abstract(before))", enabled=slow),
        )
    _wrap(
        SlotPool,
        "release",
        snap(lambda self: self._top, name="top"),
        snap(lambda self, idx: _tags_at(self, idx), name="tags"),
        ens(release_only_held, "release returns only held slots"),
        ens(release_frees, "released slots are free-tagged and pushed once"),
    )
    _wrap(
        SlotPool,
        "free",
        snap(lambda self, indices: _tags_at(self, indices), name="tags"),
        snap(lambda self: ledger_of(self) if slow else None, name="ledger"),
        ens(free_by_owner, "free takes slots only from their owner"),
        ens(refines_free, "abstract(after) == spec.free(abstract(before))", enabled=slow),
    )
    _wrap(
        SlotPool,
        "transfer",
        snap(lambda self: self._top, name="top"),
        snap(lambda self, indices: _tags_at(self, indices), name="tags"),
        snap(lambda self: ledger_of(self) if slow else None, name="ledger"),
        ens(transfer_from_source, "transfer takes slots only from the named source"),
        ens(transfer_to_destination, "transferred slots carry the destination's tag"),
        ens(refines_transfer, "abstract(after) == spec.transfer(abstract(before))", enabled=slow),
    )
    _wrap(SWATokenAllocator, "free_swa", ens(free_swa_clears_mapping, "freed SWA slots are unmapped"))
    from kvledger.contracts import cache_bindings  # NOTE: here, so pool-only users do not import the cache

    cache_bindings.attach(_wrap, slow)
    from kvledger.contracts import session_bindings

    session_bindings.attach(_wrap)
    if slow:
        for name in ("alloc", "alloc_ids", "free", "transfer", "release"):
            _wrap(SlotPool, name, ens(inv_pool_ledger, "pool obeys the ledger laws"))
            _wrap(SlotPool, name, ens(inv_free_stack, "free stack matches tags"))
        for name in ("alloc", "free", "free_swa", "transfer"):
            _wrap(SWATokenAllocator, name, ens(inv_swa_mapping, "SWA mapping is one to one"))
    _level = level


def uninstall() -> None:
    """Put the original, unwrapped methods back."""
    global _level
    for (cls, name), fn in _originals.items():
        setattr(cls, name, fn)
    _originals.clear()
    _level = "off"
