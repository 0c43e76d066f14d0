"""icontract bindings attached to the reference implementation from outside.

``impl/`` never imports this module: the implementation stays readable and,
with contracts off, runs with no wrapper at all. :func:`install` replaces the
public methods of the impl classes by checked versions; :func:`uninstall` puts
the originals back (benchmarks measure both in one run).

Tiers (``KVLEDGER_CONTRACTS=off|on|slow``, or ``pytest --kvledger-contracts``):

* ``on`` — incremental: each operation checks only what it touched (the
  slots it returned or was given, the free-stack span it moved). Cost is
  proportional to the operation, not to the pool, so it stays on in every
  test run. These laws run in a light wrapper (:func:`checked`), not through
  icontract: icontract's wrapper resolves every call's arguments by name and
  costs 8-15 µs a call (one ``ensure``, with or without a ``snapshot``;
  measured here), as much as the alloc or free it checks. A broken law still
  raises ``icontract.ViolationError`` naming it, as icontract would.
* ``slow`` — adds whole-pool checks through icontract: the abstraction
  satisfies every ledger law, the free stack matches the tags, and the
  refinement ``abstract(after) == spec.step(abstract(before), op)`` holds.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, NamedTuple

import icontract
import numpy as np
import torch

from kvledger.contracts.abstraction import inv_free_stack_matches_tags, ledger_of
from kvledger.contracts.tiers import ENV_VAR as ENV_VAR  # re-exported: the tiers live in a light module
from kvledger.contracts.tiers import LEVELS as LEVELS
from kvledger.contracts.tiers import Level as Level
from kvledger.contracts.tiers import level_from_env as level_from_env
from kvledger.impl.allocators import SWATokenAllocator
from kvledger.impl.owners import FREE_TAG, RESERVED_TAG
from kvledger.impl.slots import SlotPool, _tag_bytes
from kvledger.spec import ledger as spec
from kvledger.spec.errors import LedgerError
from kvledger.spec.types import Owner

_originals: dict[tuple[type, str], Any] = {}
_level: Level = "off"

Law = tuple[Callable[..., bool], str]
"""An incremental law: ``check(self, old, result, *args, **kwargs) -> bool`` and its description."""


def current_level() -> Level:
    """The tier installed now."""
    return _level


# ------------------------------------------------------------------ the light checker (tier "on")


def checked(fn: Callable[..., Any], snapshot: Callable[..., Any] | None, laws: tuple[Law, ...]) -> Callable[..., Any]:
    """``fn`` with ``laws`` checked after every call that returns; ``snapshot(self, *args, **kwargs)`` is taken first.

    A law that does not hold raises ``icontract.ViolationError`` reading as
    icontract writes one: ``<description>: <law name>:``, then ``name was
    value`` for the call's arguments and result. Calls that raise are not
    checked (a rejected call leaves the state as it was; tests check that).
    The descriptions are kept on the wrapper as ``__kvledger_laws__``.
    """
    names = [p for p in inspect.signature(fn).parameters][1:]

    @functools.wraps(fn)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        old = None if snapshot is None else snapshot(self, *args, **kwargs)
        result = fn(self, *args, **kwargs)
        for law, description in laws:
            if not law(self, old, result, *args, **kwargs):
                raise _violation(description, law, names, args, kwargs, result)
        return result

    prior: tuple[str, ...] = getattr(fn, "__kvledger_laws__", ())
    wrapper.__kvledger_laws__ = prior + tuple(d for _, d in laws)  # type: ignore[attr-defined]
    return wrapper


def _violation(
    description: str,
    law: Callable[..., bool],
    names: list[str],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    result: Any,
) -> icontract.ViolationError:
    values = [*zip(names, args, strict=False), *kwargs.items(), ("result", result)]
    lines = "\n".join(f"{name} was {value!r:.200}" for name, value in values)
    return icontract.ViolationError(f"{description}: {law.__name__}:\n{lines}")


def _safe(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception:  # a malformed call: the method itself will raise its typed error
        return None


# ------------------------------------------------------------------ slot ids as the pool keeps them


def _host(self: SlotPool, indices: Any) -> Any:
    """``indices`` (a tensor or host ids) as this pool indexes its tag column: host int64 ids on a CPU pool, an
    int64 tensor on the pool's device otherwise."""
    if self._tags is not None:
        if isinstance(indices, np.ndarray):
            return indices if indices.dtype == np.int64 else indices.astype(np.int64)
        t: torch.Tensor = indices
        return (t if t.dtype == torch.int64 and t.is_cpu else t.to("cpu", torch.int64)).numpy()
    if isinstance(indices, np.ndarray):
        return torch.from_numpy(indices.astype(np.int64)).to(self.device)
    return indices.to(self.device, torch.int64)


def _tags(self: SlotPool, ids: Any) -> Any:
    """The owner tags of ``ids`` (from ``_host``), a copy."""
    return self._tags[ids] if self._tags is not None else self.owner_tag[ids].clone()


def _stack(self: SlotPool, lo: int, hi: int) -> Any:
    """The free stack's entries ``lo:hi``, a copy."""
    return self._free_np[lo:hi].copy() if self._free_np is not None else self._stack[lo:hi].clone()


def _uniform(tags: Any, code: int) -> bool:
    """Every tag of ``tags`` (host ids' tags, or a tensor) is ``code``: on the host one comparison of bytes."""
    if isinstance(tags, np.ndarray):
        return tags.tobytes() == _tag_bytes(code, len(tags))
    return bool((tags == code).all())


def _all_held(tags: Any) -> bool:
    """No tag of ``tags`` is free or reserved (held tags are > 0, ``owners.encode``)."""
    if not len(tags):
        return True
    return bool(tags.min() > FREE_TAG) if isinstance(tags, np.ndarray) else bool((tags > FREE_TAG).all())


def _same_ids(a: Any, b: Any) -> bool:
    """``a`` and ``b`` name the same slots (in order first: the cheap comparison, then as sets)."""
    if len(a) != len(b):
        return False
    if isinstance(a, np.ndarray):
        return a.tobytes() == b.tobytes() or bool((np.sort(a) == np.sort(b)).all())
    return bool(torch.equal(a, b)) or bool((torch.sort(a).values == torch.sort(b).values).all())


def _reversed(ids: Any) -> Any:
    return ids[::-1].copy() if isinstance(ids, np.ndarray) else ids.flip(0)


# ------------------------------------------------------------------ incremental laws (tier "on")


class Pop(NamedTuple):
    """Before an alloc: the free count, the ``n`` slots on top of the free stack in pop order (last pushed first),
    and whether they were all free-tagged."""

    top: int
    cand: Any
    free: bool


class Touched(NamedTuple):
    """Before a release, free or transfer: the free count and the tags of the slots named."""

    top: int
    ids: Any
    tags: Any


def snap_alloc(self: SlotPool, n: Any, *_: Any, **__: Any) -> Pop | None:
    """The ``Pop`` of ``alloc(n)`` (``None`` for an ``n`` alloc rejects)."""
    top = self._top
    if type(n) is not int or not 0 <= n <= top:
        return None
    cand = _reversed(_stack(self, top - n, top))
    return Pop(top, cand, _uniform(_tags(self, cand), FREE_TAG))


def snap_touched(self: SlotPool, indices: Any, *_: Any, **__: Any) -> Touched | None:
    """The ``Touched`` of a call naming ``indices`` (``None`` for indices the call rejects)."""
    try:
        ids = _host(self, indices)
        return Touched(self._top, ids, _tags(self, ids))
    except Exception:  # a malformed call: the method itself raises its typed error
        return None


def alloc_takes_free_top(self: SlotPool, old: Pop | None, result: Any, n: int, *_: Any, **__: Any) -> bool:
    """alloc hands out exactly the top ``n`` free slots, which were free-tagged (``result``: a tensor, or host ids
    from ``alloc_ids``)."""
    return old is not None and old.free and _same_ids(_host(self, result), old.cand)


def alloc_tags_owner(self: SlotPool, old: Pop, result: Any, n: int, owner: Owner, **__: Any) -> bool:
    """alloc'd slots are tagged with their new owner (after ``alloc_takes_free_top``: they are ``old.cand``)."""
    return _uniform(_tags(self, old.cand), self.code_of(owner, "alloc"))


def alloc_count(self: SlotPool, old: Pop | None, result: Any, n: int, *_: Any, **__: Any) -> bool:
    """free count drops by exactly n (after ``alloc_takes_free_top``: ``result`` is ``old.cand``)."""
    return old is not None and len(old.cand) == n and self._top == old.top - n  # NOTE: result == old.cand, checked


def release_only_held(self: SlotPool, old: Touched | None, result: None, idx: Any) -> bool:
    """release returns only held slots (no double free, no reserved slot)."""
    return old is not None and _all_held(old.tags)


def release_frees(self: SlotPool, old: Touched | None, result: None, idx: Any) -> bool:
    """released slots are free-tagged and pushed on the free stack exactly once."""
    if old is None:
        return False
    k = len(old.ids)
    return (
        self._top == old.top + k
        and _uniform(_tags(self, old.ids), FREE_TAG)
        and _same_ids(_stack(self, old.top, old.top + k), old.ids)
    )


def free_by_owner(self: SlotPool, old: Touched | None, result: None, indices: Any, owner: Owner) -> bool:
    """free takes slots only from the owner that held them."""
    return old is not None and _uniform(old.tags, self.code_of(owner, "free"))


def transfer_from_source(
    self: SlotPool, old: Touched | None, result: None, indices: Any, src: Owner, dst: Owner
) -> bool:
    """transfer takes slots only from the named source."""
    return old is not None and _uniform(old.tags, self.code_of(src, "transfer"))


def transfer_to_destination(
    self: SlotPool, old: Touched | None, result: None, indices: Any, src: Owner, dst: Owner
) -> bool:
    """transferred slots are tagged with the destination and the free count is unchanged."""
    return old is not None and self._top == old.top and _uniform(_tags(self, old.ids), self.code_of(dst, "transfer"))


def free_swa_clears_mapping(
    self: SWATokenAllocator, old: None, result: None, indices: torch.Tensor, owner: Owner
) -> bool:
    """full slots whose SWA slot was freed map to no SWA slot."""
    return bool((self.full_to_swa[indices.to(torch.int64)] == 0).all())


# ------------------------------------------------------------------ whole-pool laws (tier "slow", icontract)


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


def _as_tensor(indices: Any) -> torch.Tensor:
    """Slot ids as an int64 tensor: a tensor, or the host ids (numpy) a CPU pool's ``release`` also takes."""
    if isinstance(indices, np.ndarray):
        return torch.tensor(indices, dtype=torch.int64)
    t: torch.Tensor = indices.to(torch.int64)
    return t


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


def check(snapshot: Callable[..., Any] | None, *laws: Law) -> Callable[[Any], Any]:
    """A decorator for ``_wrap``: :func:`checked` with ``snapshot`` and ``laws``."""
    return lambda fn: checked(fn, snapshot, laws)


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
            check(
                snap_alloc,
                (alloc_takes_free_top, "alloc hands out exactly the top n free slots"),
                (alloc_count, "free count drops by exactly n"),
                (alloc_tags_owner, "alloc'd slots are tagged with their new owner"),
            ),
        )
    _wrap(
        SlotPool,
        "release",
        check(
            snap_touched,
            (release_only_held, "release returns only held slots"),
            (release_frees, "released slots are free-tagged and pushed once"),
        ),
    )
    _wrap(SlotPool, "free", check(snap_touched, (free_by_owner, "free takes slots only from their owner")))
    _wrap(
        SlotPool,
        "transfer",
        check(
            snap_touched,
            (transfer_from_source, "transfer takes slots only from the named source"),
            (transfer_to_destination, "transferred slots carry the destination's tag"),
        ),
    )
    _wrap(SWATokenAllocator, "free_swa", check(None, (free_swa_clears_mapping, "freed SWA slots are unmapped")))
    from kvledger.contracts import cache_bindings  # NOTE: here, so pool-only users do not import the cache

    cache_bindings.attach(_wrap, slow)
    from kvledger.contracts import session_bindings

    session_bindings.attach(_wrap)
    if slow:
        ledger = snap(lambda self: ledger_of(self), name="ledger")
        for name in ("alloc", "alloc_ids"):
            _wrap(SlotPool, name, ledger, ens(refines_allocate, "abstract(after) == spec.allocate(abstract(before))"))
        _wrap(SlotPool, "free", ledger, ens(refines_free, "abstract(after) == spec.free(abstract(before))"))
        _wrap(SlotPool, "transfer", ledger, ens(refines_transfer, "abstract(after) == spec.transfer(abstract(before))"))
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
