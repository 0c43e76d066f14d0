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
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import icontract
import numpy as np
import torch

from kvledger.contracts.abstraction import inv_free_stack_matches_tags, inv_swa_mapping, ledger_of
from kvledger.contracts.tiers import ENV_VAR as ENV_VAR  # re-exported: the tiers live in a light module
from kvledger.contracts.tiers import LEVELS as LEVELS
from kvledger.contracts.tiers import Level as Level
from kvledger.contracts.tiers import level_from_env as level_from_env
from kvledger.impl.allocators import SWATokenAllocator
from kvledger.impl.owners import FREE_TAG
from kvledger.impl.slots import _RUNS, HANDED_MAX, I64, SlotPool, _tag_bytes
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
    An argument passed by keyword reaches ``snapshot`` and the laws where the
    same argument passed by position would (a call is checked the same way
    however its caller spells it).
    The descriptions are kept on the wrapper as ``__kvledger_laws__``.
    """
    sig = inspect.signature(fn)
    names = [p for p in sig.parameters][1:]

    @functools.wraps(fn)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        if kwargs:  # NOTE: arguments named by keyword reach the laws as the positional ones they bind to
            try:
                bound = sig.bind(self, *args, **kwargs)
            except TypeError:
                return fn(self, *args, **kwargs)  # NOTE: a call the method cannot take: its own error, unchecked
            args, kwargs = bound.args[1:], bound.kwargs
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


Handed = tuple[bytes, int, int, object, bytes, bytes, Any, Any, bytearray, bytearray]
"""What tier ``on`` keeps of a checked alloc result that was a run of slots, for its free to read in place: the run's
bytes as handed out, its lowest slot ``lo`` and length ``n``; the owner it was handed to, ``n`` copies of that owner's
tag bytes and ``n`` of ``FREE_TAG``'s (what the alloc's check compared the run's tags with); and the pool's tag column
and free stack (``_tags``, ``_free_np``) with the bytearrays the alloc's check showed them to be views of."""

_VIEWS: dict[int, tuple[torch.Tensor, int, Any, Handed | None]] = {}
"""Host views of the last alloc results checked (CPU pools), by tensor identity: the tensor, its version counter
then, the view and, when the result was a run of slots, its ``Handed`` (else ``None``). A free of one that torch has
not changed since (in place, shape included) reads the same view: it shares the tensor's memory, so it reads what the
tensor names now."""
VIEWS_KEPT = 64


def _remember(result: Any, ids: Any) -> None:
    if type(result) is torch.Tensor and ids is not None and ids.base is not None:  # NOTE: a view, not a copy
        _VIEWS[id(result)] = (result, result._version, ids, None)
        if len(_VIEWS) > VIEWS_KEPT:
            del _VIEWS[next(iter(_VIEWS))]


def _host(self: SlotPool, indices: Any) -> Any:
    """``indices`` (a tensor or host ids) as this pool indexes its tag column: host int64 ids on a CPU pool, an
    int64 tensor on the pool's device otherwise."""
    if self._tags is not None:
        if type(indices) is torch.Tensor and indices.is_cpu:
            seen = _VIEWS.get(id(indices))
            if seen is not None and seen[0] is indices and seen[1] == indices._version:
                return seen[2]
            ids = indices.numpy()  # NOTE: a view; the common case, one call
            return ids if ids.dtype == I64 else ids.astype(I64)
        if isinstance(indices, np.ndarray):
            return indices if indices.dtype == I64 else indices.astype(I64)
        t: torch.Tensor = indices
        return t.to("cpu", torch.int64).numpy()
    if isinstance(indices, np.ndarray):
        return torch.from_numpy(indices.astype(np.int64)).to(self.device)
    return indices.to(self.device, torch.int64)


def _tags(self: SlotPool, ids: Any) -> Any:
    """The owner tags of ``ids`` (from ``_host``), a copy."""
    return self._tags[ids] if self._tags is not None else self.owner_tag[ids].clone()


def _stack(self: SlotPool, lo: int, hi: int) -> Any:
    """The free stack's entries ``lo:hi``, a copy."""
    return self._free_np[lo:hi].copy() if self._free_np is not None else self._stack[lo:hi].clone()


def _tags_are(self: SlotPool, ids: Any, code: int) -> bool:
    """Every slot of ``ids`` (from ``_host``) is tagged ``code`` now: ``_uniform(_tags(self, ids), code)`` in one
    call."""
    tags = self._tags
    if tags is not None:
        return bool(tags[ids].tobytes() == _tag_bytes(code, len(ids)))
    return bool((self.owner_tag[ids] == code).all())


def _uniform(tags: Any, code: int) -> bool:
    """Every tag of ``tags`` (host ids' tags, or a tensor) is ``code``: on the host one comparison of bytes."""
    if isinstance(tags, np.ndarray):
        return tags.tobytes() == _tag_bytes(code, len(tags))
    return bool((tags == code).all())


def _all_held(tags: Any) -> bool:
    """No tag of ``tags`` is free or reserved (held tags are > 0, ``owners.encode``)."""
    if isinstance(tags, np.ndarray):  # NOTE: FREE_TAG is 0: no zero tag and none negative, no reduction
        return int(np.count_nonzero(tags)) == len(tags) and _non_negative(tags)
    return bool((tags > FREE_TAG).all())


_SIGN = slice(7, None, 8) if sys.byteorder == "little" else slice(0, None, 8)
"""In the bytes of int64s in host order, the byte of each that holds its sign."""


def _non_negative(ids: Any) -> bool:
    """No id of ``ids`` (host ids or a tensor) is negative (an index would wrap one around).

    NOTE: on the host, every int64's sign byte is below 0x80, read with one ``bytes.isascii`` (a numpy
    reduction costs several times as much for a few hundred ids). A tensor with no readable values (the meta device)
    is not shown to be: ``False`` at once (torch's comparison there runs its Python reference, ~0.3 ms, and then
    cannot be read).
    """
    if isinstance(ids, np.ndarray):
        return bool(ids.tobytes()[_SIGN].isascii())
    if ids.is_meta:
        return False
    return not bool((ids < 0).any())


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


Pop = tuple[int, bool, Any]
"""Before an alloc: the free count, whether the slots it would pop (the top ``n`` of the free stack) were all
free-tagged, and those slots in pop order (last pushed first): int64 bytes on a CPU pool, else a tensor."""

Touched = tuple[int, Any, Any, Any]
"""Before a release, free or transfer: the free count, the slots named (as ``_host`` keeps them), their tags and, on
a CPU pool, the slots' int64 bytes (``None`` elsewhere)."""


def snap_alloc(self: SlotPool, n: Any) -> Pop | None:
    """The ``Pop`` of ``alloc(n)`` (``None`` for an ``n`` alloc rejects).

    NOTE: on a CPU pool the popped slots' bytes are one copy (a few hundred ids cost less to copy than a numpy
    call), compared with the result's after the call.
    """
    top = self._top
    if type(n) is not int or not 0 <= n <= top:
        return None
    tags = self._tags
    if tags is not None:
        span = self._free_np[top - n : top][::-1]  # type: ignore[index]
        return top, tags[span].tobytes() == _tag_bytes(FREE_TAG, n), span.tobytes()
    span = self._stack[top - n : top]
    return top, _tags_are(self, span, FREE_TAG), _reversed(span)


def snap_touched(self: SlotPool, indices: Any) -> Touched | None:
    """The ``Touched`` of a call naming ``indices`` (``None`` for indices the call must reject: malformed, out of
    range, or negative, which an index would wrap)."""
    try:
        ids = _host(self, indices)
        tags = self._tags
        if tags is not None:  # NOTE: the ids' bytes serve the sign check here and the push check after
            raw = ids.tobytes()
            return (self._top, ids, tags[ids], raw) if raw[_SIGN].isascii() else None
        return (self._top, ids, _tags(self, ids), None) if _non_negative(ids) else None
    except Exception:  # a malformed call: the method itself raises its typed error
        return None


def alloc_takes_free_top(self: SlotPool, old: Pop | None, got: Any, n: int) -> bool:
    """alloc hands out exactly the top ``n`` free slots, which were free-tagged (``got``: the result as ``_host``
    keeps it; ``None`` when it is not slot ids)."""
    if old is None or not old[1] or got is None:
        return False
    popped = old[2]
    if isinstance(popped, bytes):
        return len(got) == n and (got.tobytes() == popped or _same_ids(got, np.frombuffer(popped, I64)))
    return _same_ids(got, popped)


def alloc_count(self: SlotPool, old: Pop, n: int) -> bool:
    """free count drops by exactly n (after ``alloc_takes_free_top``: the result is the top n)."""
    return self._top == old[0] - n


def alloc_tags_owner(self: SlotPool, got: Any, code: int) -> bool:
    """alloc'd slots ``got`` are tagged with their new owner (``code``: the owner's tag)."""
    return _tags_are(self, got, code)


def release_only_held(old: Touched | None) -> bool:
    """release returns only held slots (no double free, no reserved slot)."""
    return old is not None and _all_held(old[2])


def release_frees(self: SlotPool, old: Touched) -> bool:
    """released slots are free-tagged and pushed on the free stack exactly once (``old``: before the call)."""
    top, ids, _, raw = old
    k = len(ids)
    if self._top != top + k:
        return False
    tags = self._tags
    if tags is not None:
        pushed = self._free_np[top : top + k]  # type: ignore[index]
        return tags[ids].tobytes() == _tag_bytes(FREE_TAG, k) and (pushed.tobytes() == raw or _same_ids(pushed, ids))
    return _tags_are(self, ids, FREE_TAG) and _same_ids(self._stack[top : top + k], ids)


def free_by_owner(old: Touched | None, code: int) -> bool:
    """free takes slots only from the owner that held them (``code``: the owner's tag)."""
    return old is not None and _uniform(old[2], code)


def transfer_from_source(old: Touched | None, code: int) -> bool:
    """transfer takes slots only from the named source (``code``: its tag)."""
    return old is not None and _uniform(old[2], code)


def transfer_to_destination(self: SlotPool, old: Touched, code: int) -> bool:
    """transferred slots are tagged with the destination (``code``: its tag) and the free count is unchanged."""
    return self._top == old[0] and _tags_are(self, old[1], code)


# ------------------------------------------------------------------ tier "on" wrappers of the pool's transitions
# NOTE: one wrapper per transition, each law called with what it reads (no generic argument binding, no
# snapshot object beyond the few values the laws need); a free checks the release it makes as part of itself
# (the impl's free pushes through ``SlotPool._release``, which no tier wraps; ``release`` called alone is checked).

ALLOC_TOP = "alloc hands out exactly the top n free slots"
ALLOC_COUNT = "free count drops by exactly n"
ALLOC_TAGS = "alloc'd slots are tagged with their new owner"
RELEASE_HELD = "release returns only held slots"
RELEASE_FREES = "released slots are free-tagged and pushed once"
FREE_OWNER = "free takes slots only from their owner"
TRANSFER_SOURCE = "transfer takes slots only from the named source"
TRANSFER_DESTINATION = "transferred slots carry the destination's tag"


def _laws(wrapper: Callable[..., Any], fn: Callable[..., Any], *descriptions: str) -> Callable[..., Any]:
    """``wrapper``, its ``__kvledger_laws__`` the descriptions of ``fn``'s laws and then ``descriptions``."""
    prior: tuple[str, ...] = getattr(fn, "__kvledger_laws__", ())
    wrapper.__kvledger_laws__ = prior + descriptions  # type: ignore[attr-defined]
    return wrapper


def _result_ids(self: SlotPool, result: Any) -> Any:
    """An alloc's result as ``_host`` keeps slot ids (``None`` when it is not slot ids)."""
    try:
        return _host(self, result)
    except Exception:
        return None


_RUN_OF: dict[int, bytes] = {}
"""The last ``_tag_bytes(code, n)`` asked of ``_uniform_bytes`` per ``code``: a check compares a call's gathered tags
with it (a dict keyed by the code alone costs less than ``_tag_bytes``'s keyed by ``(code, n)``)."""


def _uniform_bytes(code: int, n: int) -> bytes:
    """``_tag_bytes(code, n)``, remembered per ``code`` for ``n <= HANDED_MAX`` (the hot checks look it up inline
    first; at most 256 codes of 64 KiB)."""
    if n > HANDED_MAX:
        return _tag_bytes(code, n)
    got = _RUN_OF.get(code)
    if got is None or len(got) != 8 * n:
        if len(_RUN_OF) >= 256:
            _RUN_OF.clear()
        got = _RUN_OF[code] = _tag_bytes(code, n)
    return got


Run = tuple[bytes, bytes, int, bytes]
"""A run of ``n`` slot ids ``lo .. lo + n - 1`` popped off a free stack: as the stack holds it (bottom to top) and as
an alloc hands it out (pop order), each as int64 bytes; ``lo``; and ``n`` copies of ``FREE_TAG``'s bytes."""
_POPPED_UP: dict[int, Run] = {}
"""The ``Run`` of the last runs popped ascending (``lo`` first), by their first slot popped (``lo``)."""
_POPPED_DOWN: dict[int, Run] = {}
"""The same, popped descending (``lo + n - 1`` first), by their first slot popped."""


def _run(lo: int, n: int, up: bool) -> bytes | None:
    """The slot ids ``lo .. lo + n - 1`` (``up``; else in the reverse order) as int64 bytes, ``None`` when not all
    of them are below the largest CPU pool's size (or ``lo`` is negative): a slice of ``slots._RUNS``."""
    asc, desc = _RUNS
    top = len(asc) // 8
    if lo < 0 or lo + n > top:
        return None
    return asc[8 * lo : 8 * (lo + n)] if up else desc[8 * (top - lo - n) : 8 * (top - lo)]


def _popped_run(first: int, n: int, up: bool) -> Run | None:
    """The ``Run`` of ``n`` slots popped from ``first`` on, ascending (``up``) or descending; ``None`` when they are
    not all below the largest CPU pool's size.

    NOTE: remembered per first slot and direction for ``n <= HANDED_MAX`` (at most 64 each way, each of up to
    3 x 64 KiB): a free stack's span, an alloc's result or a free's slots equal to one of its runs are exactly those
    slots, so their tags are a slice of the tag column and compare in place (``bytearray.startswith``).
    """
    lo = first if up else first - n + 1
    stacked, handed = _run(lo, n, not up), _run(lo, n, up)
    if stacked is None or handed is None:
        return None
    got = (stacked, handed, lo, _uniform_bytes(FREE_TAG, n))
    if n <= HANDED_MAX:
        memo = _POPPED_UP if up else _POPPED_DOWN
        if len(memo) >= 64:
            memo.clear()
        memo[first] = got
    return got


def _one_id(self: SlotPool, result: Any, slot: int) -> bool:
    """``result`` names exactly ``slot``, read as ``_host`` reads slot ids (an alloc's result that ``tolist`` did not
    show as ``[slot]``: another dtype, say)."""
    got = _result_ids(self, result)
    return got is not None and got.shape == (1,) and got.item(0) == slot


def on_alloc(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Tier ``on`` for ``SlotPool.alloc`` / ``alloc_ids``: the top of the free stack before, the result after.

    NOTE: on a CPU pool the laws are inlined (no helper frames): one slot (a decode step, a Mamba state) is read and
    compared as scalars, the result's one id through ``tolist`` (a torch call, where ``numpy()`` costs four); more
    slots take one gather of the top ``n`` slots' tags and one copy of their ids before the call, and after it the
    result's ids and one gather of their tags, each compared as bytes. The helpers (``snap_alloc``,
    ``alloc_takes_free_top``, ...) state the same laws and take every other case.
    """
    names = [p for p in inspect.signature(fn).parameters][1:]

    def fail(
        description: str, law: Callable[..., bool], n: Any, owner: Any, args: Any, kwargs: Any, result: Any
    ) -> Any:
        return _violation(description, law, names, (n, owner, *args), kwargs, result)

    views, kept, runs, up, down = _VIEWS, VIEWS_KEPT, _RUN_OF, _POPPED_UP, _POPPED_DOWN

    @functools.wraps(fn)
    def wrapper(self: SlotPool, n: Any, owner: Any, *args: Any, **kwargs: Any) -> Any:
        tags = self._tags
        top = self._top
        if type(n) is int and tags is not None:
            if n == 1 and top:
                slot = self._free_np.item(top - 1)  # type: ignore[union-attr]
                was = tags.item(slot)
                result = fn(self, 1, owner, *args, **kwargs) if args or kwargs else fn(self, 1, owner)
                try:
                    got = result.tolist()  # NOTE: [slot] for a 1-D tensor or array of one integer id
                except Exception:
                    got = None
                if (got != [slot] or type(got[0]) is not int) and not _one_id(self, result, slot):
                    raise fail(ALLOC_TOP, alloc_takes_free_top, n, owner, args, kwargs, result)
                if was != FREE_TAG:
                    raise fail(ALLOC_TOP, alloc_takes_free_top, n, owner, args, kwargs, result)
                if self._top != top - 1:
                    raise fail(ALLOC_COUNT, alloc_count, n, owner, args, kwargs, result)
                seen = self._seen
                if tags.item(slot) != (seen[1] if owner is seen[0] else self.code_of(owner, "alloc")):
                    raise fail(ALLOC_TAGS, alloc_tags_owner, n, owner, args, kwargs, result)
                return result
            tbuf, fbuf, free_np = self._tag_buf, self._free_buf, self._free_np
            if (
                1 < n <= top
                and n <= HANDED_MAX
                and tbuf is not None
                and type(tags) is np.ndarray
                and tags.base.obj is tbuf  # type: ignore[union-attr]
                and free_np.base.obj is fbuf is not None  # type: ignore[union-attr]
            ):
                # NOTE: the pool's tag column and free stack are views of its bytearrays (``np.frombuffer``'s base is a
                # memoryview of the bytearray; another device or a copy has none), so the bytearrays are their memory
                # NOTE: the top n of the stack as a run of slots, proven by comparing their bytes in place with a run's
                # (``_run``); its tags, before and after, are then a slice of the column, compared in place too
                first, last = free_np.item(top - 1), free_np.item(top - n)  # type: ignore[union-attr]  # NOTE: popped 1st, last
                size = 8 * n
                if last - first == n - 1:  # NOTE: popped ascending (the stack holds them descending)
                    run = up.get(first)
                    if run is None or len(run[0]) != size:
                        run = _popped_run(first, n, True)
                elif first - last == n - 1:  # NOTE: popped descending
                    run = down.get(first)
                    if run is None or len(run[0]) != size:
                        run = _popped_run(first, n, False)
                else:
                    run = None
                if run is not None and fbuf.startswith(run[0], 8 * (top - n)):
                    stacked, handed, lo, freed = run
                    was_free = tbuf.startswith(freed, 8 * lo)
                    result = fn(self, n, owner, *args, **kwargs) if args or kwargs else fn(self, n, owner)
                    if type(result) is torch.Tensor:
                        try:
                            got = result.numpy()  # NOTE: a view; raises off the CPU
                        except (TypeError, RuntimeError):
                            got = None
                    else:
                        got = result if type(result) is np.ndarray else None
                    exact = False
                    if got is not None and (got.dtype is I64 or got.dtype == I64) and len(got) == n:
                        # NOTE: the stacked reversed; ``tobytes`` costs less than numpy's buffer export to a new array
                        exact = got.tobytes() == handed
                    if not exact:  # NOTE: the same slots in another order, or not slot ids: read as the checked path
                        got = _result_ids(self, result)
                        _remember(result, got)
                        if got is None or len(got) != n or not _same_ids(got, np.frombuffer(stacked, I64)):
                            raise fail(ALLOC_TOP, alloc_takes_free_top, n, owner, args, kwargs, result)
                    if not was_free:
                        raise fail(ALLOC_TOP, alloc_takes_free_top, n, owner, args, kwargs, result)
                    if self._top != top - n:
                        raise fail(ALLOC_COUNT, alloc_count, n, owner, args, kwargs, result)
                    seen = self._seen
                    code = seen[1] if owner is seen[0] else self.code_of(owner, "alloc")
                    held = runs.get(code)
                    if held is None or len(held) != size:
                        held = _uniform_bytes(code, n)
                    if not tbuf.startswith(held, 8 * lo):
                        raise fail(ALLOC_TAGS, alloc_tags_owner, n, owner, args, kwargs, result)
                    if exact and type(result) is torch.Tensor:
                        # NOTE: ``_remember``, with what the free of this run reads in place (``Handed``)
                        views[id(result)] = (
                            result,
                            result._version,
                            got,
                            (handed, lo, n, owner, held, freed, tags, free_np, tbuf, fbuf),
                        )
                        if len(views) > kept:
                            del views[next(iter(views))]
                    return result
            if 1 < n <= top:
                span = self._free_np[top - n : top]  # type: ignore[index]
                before = tags[span].tobytes()
                popped = span.tobytes()  # NOTE: a copy: an alloc that rewrites its stack top is read as it was
                result = fn(self, n, owner, *args, **kwargs) if args or kwargs else fn(self, n, owner)
                got = None
                if type(result) is torch.Tensor:
                    try:
                        got = result.numpy()  # NOTE: a view; raises off the CPU
                    except (TypeError, RuntimeError):
                        pass
                    else:
                        if got.dtype is I64 or got.dtype == I64:
                            views[id(result)] = (result, result._version, got, None)  # NOTE: ``_remember``
                            if len(views) > kept:
                                del views[next(iter(views))]
                        else:
                            got = None
                elif type(result) is np.ndarray and result.dtype == I64:
                    got = result
                if got is None:
                    got = _result_ids(self, result)
                    _remember(result, got)
                free = runs.get(FREE_TAG)
                if free is None or len(free) != 8 * n:
                    free = _uniform_bytes(FREE_TAG, n)
                if not (
                    before == free
                    and got is not None
                    and len(got) == n
                    and (got[::-1].tobytes() == popped or _same_ids(got, np.frombuffer(popped, I64)))
                ):
                    raise fail(ALLOC_TOP, alloc_takes_free_top, n, owner, args, kwargs, result)
                if self._top != top - n:
                    raise fail(ALLOC_COUNT, alloc_count, n, owner, args, kwargs, result)
                seen = self._seen
                code = seen[1] if owner is seen[0] else self.code_of(owner, "alloc")
                held = runs.get(code)
                if held is None or len(held) != 8 * n:
                    held = _uniform_bytes(code, n)
                if tags[got].tobytes() != held:
                    raise fail(ALLOC_TAGS, alloc_tags_owner, n, owner, args, kwargs, result)
                return result
        old = snap_alloc(self, n)
        result = fn(self, n, owner, *args, **kwargs)
        got = _result_ids(self, result)
        _remember(result, got)
        if not alloc_takes_free_top(self, old, got, n):
            raise fail(ALLOC_TOP, alloc_takes_free_top, n, owner, args, kwargs, result)
        assert old is not None
        if not alloc_count(self, old, n):
            raise fail(ALLOC_COUNT, alloc_count, n, owner, args, kwargs, result)
        if not alloc_tags_owner(self, got, self.code_of(owner, "alloc")):
            raise fail(ALLOC_TAGS, alloc_tags_owner, n, owner, args, kwargs, result)
        return result

    return _laws(wrapper, fn, ALLOC_TOP, ALLOC_COUNT, ALLOC_TAGS)


def on_release(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Tier ``on`` for ``SlotPool.release`` called alone (the paged and SWA allocators' frees; a pool's own ``free``
    pushes through ``SlotPool._release``, checked as part of the free)."""
    names = [p for p in inspect.signature(fn).parameters][1:]

    @functools.wraps(fn)
    def wrapper(self: SlotPool, idx: Any) -> None:
        old = snap_touched(self, idx)
        fn(self, idx)
        if not release_only_held(old):
            raise _violation(RELEASE_HELD, release_only_held, names, (idx,), {}, None)
        assert old is not None
        if not release_frees(self, old):
            raise _violation(RELEASE_FREES, release_frees, names, (idx,), {}, None)

    return _laws(wrapper, fn, RELEASE_HELD, RELEASE_FREES)


def on_free(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Tier ``on`` for ``SlotPool.free``: the named slots' tags before; after, the release's laws on them.

    NOTE: on a CPU pool the laws after the call are inlined (no helper frames): one gather of the slots' tags and one
    read of the pushed span, each compared as bytes with what was read before; one slot (named by any integer
    tensor of one id) is read and compared as scalars; a checked alloc result that was a run of slots, still the run,
    is read in place with what its alloc's check kept (``Handed``). The release the free makes (through
    ``SlotPool._release``, which no tier wraps) is checked as part of it.
    """
    names = [p for p in inspect.signature(fn).parameters][1:]

    def violation(description: str, law: Callable[..., bool], indices: Any, owner: Any) -> Exception:
        return _violation(description, law, names, (indices, owner), {}, None)

    def freed_by(self: SlotPool, indices: Any, owner: Any) -> int:
        """Make the free; ``owner``'s tag code."""
        fn(self, indices, owner)
        seen = self._seen
        return seen[1] if owner is seen[0] else self.code_of(owner, "free")

    views, runs = _VIEWS, _RUN_OF

    @functools.wraps(fn)
    def wrapper(self: SlotPool, indices: Any, owner: Any) -> None:
        tags = self._tags
        if tags is not None and type(indices) is torch.Tensor:
            mem = views.pop(id(indices), None)  # NOTE: freed or refused, it leaves the memo: a second free is read anew
            if mem is not None and mem[0] is indices and mem[1] == indices._version:
                # NOTE: an alloc result this tier checked, unchanged in torch's count since: its host view, read in
                # place of ``snap_touched`` (the same reads: the slots' signs and tags before, the pushed span after)
                ids, run = mem[2], mem[3]
                if run is not None:
                    handed, lo, k, was, owned, freed, their_tags, their_free, tbuf, fbuf = run
                    if tags is their_tags and self._free_np is their_free and ids.tobytes() == handed:
                        # NOTE: still the run of slots lo .. lo + k - 1 the alloc handed out (its bytes now), and the
                        # pool's columns still the views of ``tbuf`` / ``fbuf`` the alloc's check showed them to be (a
                        # numpy array's base never changes): their signs hold, their tags before and after are a
                        # slice of the column and the pushed span one of the stack, each compared in place with the
                        # bytes the alloc's check compared
                        top = self._top
                        if owner is was:
                            ok = tbuf.startswith(owned, 8 * lo)  # NOTE: before the call
                            fn(self, indices, owner)
                        else:
                            tagged = bytes(tbuf[8 * lo : 8 * (lo + k)])  # NOTE: a copy; the owner's tag is known after
                            ok = tagged == _uniform_bytes(freed_by(self, indices, owner), k)
                        if not ok:
                            raise violation(FREE_OWNER, free_by_owner, indices, owner)
                        if self._top == top + k and tbuf.startswith(freed, 8 * lo) and fbuf.startswith(handed, 8 * top):
                            return
                        raise violation(RELEASE_FREES, release_frees, indices, owner)
                k, top = len(ids), self._top
                raw = ids.tobytes()
                if k > 1 and raw[_SIGN].isascii():
                    try:
                        before = tags[ids].tobytes()
                    except IndexError:  # NOTE: rewritten through numpy past the pool: the checked path names it
                        before = None
                    if before is not None:
                        code = freed_by(self, indices, owner)
                        held = runs.get(code)
                        if held is None or len(held) != 8 * k:
                            held = _uniform_bytes(code, k)
                        if before != held:
                            raise violation(FREE_OWNER, free_by_owner, indices, owner)
                        free = runs.get(FREE_TAG)
                        if free is None or len(free) != 8 * k:
                            free = _uniform_bytes(FREE_TAG, k)
                        if (
                            self._top == top + k
                            and tags[ids].tobytes() == free
                            and self._free_np[top : top + k].tobytes() == raw  # type: ignore[index]
                        ):
                            return
                        raise violation(RELEASE_FREES, release_frees, indices, owner)
            elif indices.numel() == 1:
                # NOTE: one slot, whatever its integer dtype: read as a Python int (negative or past the pool: the
                # checked path below)
                try:
                    one = indices.tolist()
                except Exception:
                    one = None
                if type(one) is list and len(one) == 1 and type(slot := one[0]) is int and 0 <= slot < len(tags):
                    top = self._top
                    tag = tags.item(slot)
                    if tag != freed_by(self, indices, owner):
                        raise violation(FREE_OWNER, free_by_owner, indices, owner)
                    if self._top == top + 1 and tags.item(slot) == FREE_TAG and self._free_np.item(top) == slot:  # type: ignore[union-attr]
                        return
                    raise violation(RELEASE_FREES, release_frees, indices, owner)
        old = snap_touched(self, indices)
        code = freed_by(self, indices, owner)
        tags = self._tags
        if old is None or not (
            old[2].tobytes() == _tag_bytes(code, len(old[2])) if tags is not None else free_by_owner(old, code)
        ):
            raise _violation(FREE_OWNER, free_by_owner, names, (indices, owner), {}, None)
        # NOTE: held by the owner, so held (> 0): ``release_only_held`` holds too
        top, ids, _, raw = old
        if tags is not None:
            k = len(ids)
            if k == 1 and ids.shape == (1,):  # NOTE: one slot: the same reads as scalars
                slot = ids.item(0)
                if self._top == top + 1 and tags.item(slot) == FREE_TAG:
                    pushed = self._free_np.item(top)  # type: ignore[union-attr]
                    if pushed == slot or pushed == int.from_bytes(raw, sys.byteorder, signed=True):
                        return
            elif (
                self._top == top + k
                and tags[ids].tobytes() == _tag_bytes(FREE_TAG, k)
                and (self._free_np[top : top + k].tobytes() == raw or _same_ids(self._free_np[top : top + k], ids))  # type: ignore[index]
            ):
                return
        elif release_frees(self, old):
            return
        raise _violation(RELEASE_FREES, release_frees, names, (indices, owner), {}, None)

    return _laws(wrapper, fn, FREE_OWNER, RELEASE_FREES)


def on_transfer(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Tier ``on`` for ``SlotPool.transfer``: the named slots' tags before and after."""
    names = [p for p in inspect.signature(fn).parameters][1:]

    @functools.wraps(fn)
    def wrapper(self: SlotPool, indices: Any, src: Any, dst: Any) -> None:
        old = snap_touched(self, indices)
        fn(self, indices, src, dst)
        if not transfer_from_source(old, self.code_of(src, "transfer")):
            raise _violation(TRANSFER_SOURCE, transfer_from_source, names, (indices, src, dst), {}, None)
        assert old is not None
        if not transfer_to_destination(self, old, self.code_of(dst, "transfer")):
            raise _violation(TRANSFER_DESTINATION, transfer_to_destination, names, (indices, src, dst), {}, None)

    return _laws(wrapper, fn, TRANSFER_SOURCE, TRANSFER_DESTINATION)


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
        _wrap(SlotPool, name, on_alloc)
    _wrap(SlotPool, "release", on_release)
    _wrap(SlotPool, "free", on_free)
    _wrap(SlotPool, "transfer", on_transfer)
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


@contextmanager
def installed(level: Level) -> Iterator[None]:
    """The tier ``level`` installed for the block, the tier before put back after it (a checker that makes some
    calls with the implementation's own checks alone: ``installed("off")``)."""
    was = _level
    if was == level:
        yield
        return
    install(level)
    try:
        yield
    finally:
        install(was)


def uninstall() -> None:
    """Put the original, unwrapped methods back."""
    global _level
    for (cls, name), fn in _originals.items():
        setattr(cls, name, fn)
    _originals.clear()
    _level = "off"
