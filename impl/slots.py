"""A pool of slots on a torch device: a tensor free stack and per-slot owner tags.

This is the one ledger every allocator of the reference implementation is
built from (token slots, pages, request rows, Mamba slots, SWA slots). It
refines :mod:`kvledger.spec.ledger`: the abstraction of a ``SlotPool`` is the
spec ``Ledger`` whose free set is the slots tagged ``FREE_TAG`` and whose
owners are the decoded tags.

Hot paths are vectorised: ``alloc`` pops a slice off the free stack,
``free`` pushes one, and ownership checks are one gather and compare; no
per-slot Python loop runs unless an error message is being written.
"""

from __future__ import annotations

import ctypes
import sys
from array import array
from typing import Any, Generic, TypeAlias, TypeVar

import numpy as np
import numpy.typing as npt
import torch

from kvledger.impl.arguments import check_device, check_id, check_int, int_ids
from kvledger.impl.owners import FREE_TAG, RESERVED_TAG, decode, encode
from kvledger.spec.errors import (
    DoubleFree,
    InvalidArgument,
    LedgerError,
    NotOwner,
    OutOfRange,
    OverAllocation,
)
from kvledger.spec.types import Owner

Ids: TypeAlias = "npt.NDArray[np.int64]"
"""Slot ids on the host (CPU pools): a 1-D int64 numpy array, often a view of a tensor or of bytes."""
I64 = np.dtype(np.int64)
"""The dtype of ``Ids``, made once: numpy parses a dtype instance passed by position fastest."""
_FREE0: Ids = np.array(FREE_TAG, dtype=I64)
"""``FREE_TAG`` as a 0-d array: numpy's fancy assignment takes one faster than a Python int."""
Seen: TypeAlias = "tuple[object, int, Ids, bytes]"
"""A pool's last owner seen: the owner, its tag, the tag as a 0-d array and as int64 bytes."""
_NOBODY = object()
"""The owner a pool's memo of the last owner seen (``_seen``) starts from: no value a caller can pass (it was
``None``, so a first call naming ``None`` as its owner passed for it, with the free tag as its code)."""
Tokens: TypeAlias = "array[int]"
"""Token ids or token slot ids kept on the host by the radix tree: an ``array("q")``."""
Last: TypeAlias = "tuple[bytes, Ids, object]"
"""A pool's last alloc, while no tag was written since: its ids' bytes (then), its ids and its owner."""


class SlotPool:
    """Slots ``base .. base + capacity - 1`` of one pool, each free or tagged with its owner.

    Slots below ``base`` are reserved (padding) and never handed out.
    Refines :class:`kvledger.spec.ledger.Ledger`.
    """

    def __init__(self, name: str, capacity: int, *, base: int = 0, device: str | torch.device = "cpu") -> None:
        if not isinstance(name, str):
            raise InvalidArgument("create", "pool", (), f"pool name must be a str, got {type(name).__name__}")
        check_int("create", name, "capacity", capacity, 1, 1 << 40)
        check_int("create", name, "base", base, 0, 1 << 40)
        self.name = name
        self.capacity = capacity
        self.base = base
        self.device = check_device("create", name, device)
        self.is_cpu = self.device.type == "cpu"
        self.size = base + capacity
        # owner_tag[s]: FREE_TAG, RESERVED_TAG (s < base) or the encoded owner of slot s.
        # NOTE: on the CPU the tag column and the free stack live in bytearrays (``_tag_buf``, ``_free_buf``): the
        # same memory as ``owner_tag`` / ``_tags`` and ``_free_np``, which a reader can compare a run of with bytes in
        # place (``bytearray.startswith(b, offset)``: one ``memcmp``, no slice or copy). ``None`` on another device and
        # in a copy (pickle, deepcopy), whose columns are the torch tensors it was given.
        self._tag_buf: bytearray | None = None
        self._free_buf: bytearray | None = None
        if self.is_cpu:
            self._tag_buf = bytearray(8 * self.size)
            self.owner_tag = torch.from_numpy(np.frombuffer(self._tag_buf, dtype=I64))
        else:
            self.owner_tag = torch.zeros(self.size, dtype=torch.int64, device=self.device)
        self.owner_tag[:base] = RESERVED_TAG
        # The free stack holds free slots in _stack[:_top]; the next alloc pops from the top.
        # NOTE: filled descending so a fresh pool hands out its lowest slots first.
        if self.is_cpu:
            _grow_runs(self.size)
            self._free_buf = bytearray(8 * capacity)
            self._free_np: Ids | None = np.frombuffer(self._free_buf, dtype=I64)
            self._free_np[:] = np.arange(self.size - 1, base - 1, -1, dtype=np.int64)
            self._stack = torch.from_numpy(self._free_np)
        else:
            self._free_np = None
            self._stack = torch.arange(self.size - 1, base - 1, -1, dtype=torch.int64, device=self.device)
        self._top = capacity
        # NOTE: allocations of at least run_min slots are looked at as a run of slots (tagged and freed through
        # slices); a speed setting that changes no result (the pool machine lowers it to drive the run path)
        self.run_min = RUN_MIN  # NOTE: a property: it sets ``_inline_below`` too
        # Provenance: origin[s] is the ``stamp`` in force when slot s last got its owner (alloc or
        # transfer). Whoever drives the pool (the memory manager) sets ``stamp`` to an event id it logs.
        self.origin = torch.zeros(self.size, dtype=torch.int64, device=self.device)
        self._stamp = 0
        self._stamped = False  # NOTE: until a stamp other than 0 is set, origin is all 0 and needs no writes
        self._mark: torch.Tensor | None = None  # scratch for the O(n) duplicate check, allocated on first use
        self._iota = self._stack[:0]  # positions 0, 1, ... for the duplicate checks (grown on first use)
        self._iota_np: Ids = np.arange(0, dtype=np.int64)  # the same on the host
        self._iota_bytes: bytes | bytearray = b""  # and their bytes
        # NOTE: the bytes of recent ``alloc`` results (an ordered set): a sequence equal to one of
        # them names distinct slots, so ``claim`` needs no duplicate check for it (CPU only)
        self._fresh: RecentAllocs[None] = RecentAllocs()
        # NOTE: the tensors of recent ``alloc`` results (CPU only), by identity: each with its host ids (the memory
        # the tensor was made on) and their bytes then. Freeing one of them needs no conversion back to the host
        # and where they start when they are a run of slots (else -1)
        self._handed: dict[int, tuple[torch.Tensor, Ids, bytes, int]] = {}
        # the last owner encoded, its tag, the tag as a 0-d array (numpy assigns one fastest) and as bytes
        self._seen: Seen = (_NOBODY, FREE_TAG, _FREE0, _tag_bytes(FREE_TAG, 1))
        # the last owner's tag bytes freed by ``free`` of an alloc result, a count ``k`` and ``k`` copies of them
        self._held_k: tuple[bytes, int, bytes] = (b"", 0, b"")
        # NOTE: the last alloc (CPU only) while no tag was written since: its ids' bytes, its ids and its owner.
        # Those slots are all tagged that owner (this pool wrote them, nothing since), so a hand-over or free of
        # exactly them needs no gather of their tags. Every other write of a tag forgets it
        self._last: Last | None = None
        self._link_host()

    def _link_host(self) -> None:
        """On the CPU: numpy views of the tag and origin columns, and the stack tensor as a view of ``_free_np``.

        NOTE: the hot paths index the columns through numpy, which costs a fraction of a torch dispatch
        for the few hundred ids an operation names; both see the same memory.
        """
        self._tags: Ids | None = None
        self._origins: Ids | None = None
        if self._free_np is not None:
            # NOTE: the column's host view over its bytearray, so ``_tags.base is _tag_buf`` shows they are one memory
            buf = self._tag_buf
            self._tags = np.frombuffer(buf, dtype=I64) if buf is not None else self.owner_tag.numpy()
            self._origins = self.origin.numpy()
            self._stack = torch.from_numpy(self._free_np)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        for view in ("_tags", "_origins") + (("_stack",) if self._free_np is not None else ()):
            del state[view]
        state["_handed"] = {}  # NOTE: a copy's alloc results are other tensors
        state["_tag_buf"] = state["_free_buf"] = None  # NOTE: a copy's columns are the tensors it gets, not these
        state["_last"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        # NOTE: a copy (deepcopy, pickle) must keep its views on its own columns and stack
        self.__dict__.update(state)
        self._link_host()

    @property
    def run_min(self) -> int:
        """Allocations of at least this many slots are looked at as a run of slots (``run_start``): a speed setting
        that changes no result (the pool machine lowers it to drive the run path)."""
        return self._run_min

    @run_min.setter
    def run_min(self, value: int) -> None:
        self._run_min = value
        # NOTE: ``alloc`` pops fewer slots than this inline (no run to look for, a result short enough to remember)
        self._inline_below = min(value, HANDED_MAX + 1)

    @property
    def stamp(self) -> int:
        """The provenance stamp written into ``origin`` for every slot that gets an owner from now on."""
        return self._stamp

    @stamp.setter
    def stamp(self, value: int) -> None:
        self._stamp = value
        self._stamped = self._stamped or value != 0

    # ------------------------------------------------------------ queries

    def available_size(self) -> int:
        """Number of free slots."""
        return self._top

    def free_slots(self) -> torch.Tensor:
        """The free stack's contents (a copy; order is the allocation order reversed)."""
        return self._stack[: self._top].clone()

    def owner_of(self, slot: int) -> Owner | None:
        """The owner tagged on ``slot`` (``None`` when free or reserved)."""
        return decode(int(self.owner_tag[check_id("owner_of", self.name, "slot", slot, 0, self.size)]))

    # ------------------------------------------------------------ validation

    def as_index(self, op: str, indices: torch.Tensor) -> torch.Tensor:
        """Check that ``indices`` is a non-empty 1-D integer tensor (any integer dtype) of distinct in-range slots on
        our device; the same ids as int64."""
        if not isinstance(indices, torch.Tensor):
            raise InvalidArgument(op, self.name, (), f"indices must be a torch.Tensor, got {type(indices).__name__}")
        if indices.layout != torch.strided or indices.is_meta:
            raise InvalidArgument(
                op, self.name, (), f"indices must be a dense tensor, got {indices.layout} on {indices.device}"
            )
        if indices.device != self.device:
            raise InvalidArgument(op, self.name, (), f"indices on {indices.device}, pool on {self.device}")
        if indices.dim() != 1 or indices.numel() == 0:
            raise InvalidArgument(
                op, self.name, (), f"indices must be 1-D and non-empty, got shape {tuple(indices.shape)}"
            )
        idx = int_ids(op, self.name, indices)
        lo, hi = torch.aminmax(idx)
        if int(lo) < self.base or int(hi) >= self.size:
            bad = idx[(idx < self.base) | (idx >= self.size)].tolist()
            raise OutOfRange(op, self.name, bad, f"outside [{self.base}, {self.size})")
        if self.has_duplicates(idx):
            s, _ = torch.sort(idx)
            dup = s[1:][s[1:] == s[:-1]].tolist()
            raise InvalidArgument(op, self.name, dup, "duplicate slot ids in one call")
        return idx

    def has_duplicates(self, idx: torch.Tensor) -> bool:
        """Whether in-range slots ``idx`` name a slot twice: O(n), no sort.

        Each position writes its own number into a scratch cell of its slot; a
        slot named twice keeps only one of the numbers, so some position reads back another.
        """
        k = idx.numel()
        if k < 2:
            return False
        if self._mark is None:
            self._mark = torch.empty(self.size, dtype=torch.int64, device=self.device)
        # NOTE: a slice of a kept arange (a view) costs a fraction of a new arange per call
        pos = self._positions(k)
        self._mark.scatter_(0, idx, pos)  # NOTE: a slot named twice keeps one of its positions (either)
        back = self._mark.index_select(0, idx)
        if self.is_cpu:
            return back.numpy().tobytes() != self._iota_bytes[: 8 * k]
        return not torch.equal(back, pos)

    def claim(
        self,
        idx: torch.Tensor | Ids,
        owner: Owner,
        code: int | None = None,
        *,
        distinct: bool = False,
        op: str = "claim",
        raw: bytes | bytearray | None = None,
    ) -> bool:
        """On the CPU, a check (and hand-over) in one pass: whether ``idx`` are distinct slots all tagged ``owner``.

        ``idx``: a tensor, or int64 ids on the host (``Ids``). If they are and
        ``code`` is given, they are tagged ``code`` (``encode(dst)``)
        on return; with ``code=None`` their tags are unchanged. Returns ``False``, with the pool
        unchanged, when that is not shown (another device, a slot out of range,
        another holder, a repeated slot): callers then run ``as_index`` and
        ``check_held`` for the precise error. ``distinct``: the caller knows
        ``idx`` names distinct slots of this pool (one of its recent alloc results), so that is not checked
        again. ``raw``: the ids' int64 bytes, when the caller has them (``ids.tobytes()`` otherwise, where needed).

        NOTE: a gather rejects an index past the column and slots below
        ``base`` carry the reserved tag, so with no negative index "all tagged
        ``owner``" means "all in range". Distinctness is checked in the tag column itself: each
        position writes its number into its slot's tag and reads it back (a slot
        named twice keeps one number), then the tags get ``code`` — or
        ``owner`` again, when there is no ``code`` or a slot was named twice.
        Only the cache lines the first gather loaded are touched (a separate
        scratch column costs a cache miss per slot).
        """
        tags = self._tags
        if tags is None:
            return False
        if isinstance(idx, torch.Tensor):
            if not (idx.dtype == torch.int64 and idx.is_cpu and idx.dim() == 1 and idx.layout == torch.strided):
                return False
            ids: Ids = idx.numpy()
        elif isinstance(idx, np.ndarray) and idx.dtype == I64 and idx.ndim == 1:
            ids = idx
        else:
            return False
        k = len(ids)
        if not k:
            return False
        last = self._last
        if last is not None and owner is last[2] and (ids.tobytes() if raw is None else raw) == last[0]:
            # NOTE: exactly the last alloc's slots, and no tag written since: distinct, in range, all ``owner``'s
            if code is not None:
                self._mark_owned(ids, code)
            return True
        if not distinct and k > 1 and self._fresh.find(ids.tobytes() if raw is None else raw) is not None:
            distinct = True  # NOTE: one of the recent alloc results: distinct slots of this pool, none negative
        if not distinct and int(ids.min()) < 0:  # NOTE: numpy would wrap a negative index
            return False
        try:
            got = tags[ids]
        except IndexError:
            return False
        held = self.code_of(owner, op)
        if got.tobytes() != _tag_bytes(held, k):
            return False
        scattered = k > 1 and not distinct
        if scattered:
            self._last = None
            tags[ids] = self._host_positions(k)
            if tags[ids].tobytes() != self._iota_bytes[: 8 * k]:
                tags[ids] = held
                return False
        if code is None:
            if scattered:
                tags[ids] = held
            return True
        self._mark_owned(ids, code)
        return True

    def _positions(self, k: int) -> torch.Tensor:
        """``0, 1, ..., k - 1`` (int64): a view of a kept ``arange`` when it is long enough."""
        if k > self._iota.numel():
            self._iota = torch.arange(max(k, 2 * self._iota.numel(), 4096), dtype=torch.int64, device=self.device)
            self._iota_np = self._iota.cpu().numpy()
            self._iota_bytes = self._iota_np.tobytes()
        return self._iota[:k]

    def _host_positions(self, k: int) -> Ids:
        """``_positions(k)`` on the host."""
        if k > len(self._iota_np):
            self._positions(k)
        return self._iota_np[:k]

    def _held_index(self, op: str, indices: torch.Tensor, owner: Owner) -> torch.Tensor:
        """``as_index`` then ``check_held``: the validated slots, or the first of their errors."""
        idx = self.as_index(op, indices)
        self.check_held(op, idx, owner)
        return idx

    def check_held(self, op: str, idx: torch.Tensor, owner: Owner) -> None:
        """Raise unless every slot of ``idx`` (already validated) is tagged ``owner``."""
        code = encode(owner, op, self.name)
        idx = _long(idx)
        tags = self.owner_tag.index_select(0, idx)
        if not torch.equal(tags, torch.full_like(tags, code)):
            bad = tags != code
            raise self._held_error(op, idx[bad], tags[bad], owner)

    def _held_error(self, op: str, slots: torch.Tensor, tags: torch.Tensor, owner: Owner) -> LedgerError:
        free_mask = tags == FREE_TAG
        if bool(free_mask.any()):
            return DoubleFree(op, self.name, slots[free_mask].tolist(), f"already free (double free by {owner})")
        first = int(slots[0])
        holder = decode(int(tags[0]))
        return NotOwner(
            op, self.name, slots.tolist(), f"slot {first} is held by {holder}, not by {owner}", held=(first, holder)
        )

    def code_of(self, owner: Owner, op: str) -> int:
        """``encode(owner, op, name)``, remembered for the last owner seen (an ``Owner`` is immutable: a scheduler
        hands the same request's owner to its alloc and its free)."""
        return self._seen[1] if owner is self._seen[0] else self._seen_for(owner, op)[1]

    def _seen_for(self, owner: Owner, op: str) -> Seen:
        """Make ``owner`` the last owner seen (``encode`` raises for a malformed one) and return ``_seen``."""
        code = encode(owner, op, self.name)
        self._seen = (owner, code, np.array(code, dtype=I64), code.to_bytes(8, sys.byteorder, signed=True))
        return self._seen

    def check_alloc(self, n: int, owner: Owner) -> int:
        """Raise unless ``n`` slots can be given to ``owner``; return ``owner``'s tag. ``n == 0`` is legal (nothing)."""
        if type(n) is not int or n < 0:
            n = check_int("alloc", self.name, "size", n)
        code = self.code_of(owner, "alloc")
        if n > self._top:
            raise OverAllocation("alloc", self.name, (), f"{n} requested by {owner}, {self._top} free")
        return code

    # ------------------------------------------------------------ transitions

    def alloc(self, n: int, owner: Owner) -> torch.Tensor:
        """Give ``n`` free slots to ``owner``; all or nothing. Refines ``spec.ledger.allocate``.

        Returns a new int64 tensor of slot ids owned by ``owner`` until it frees
        or transfers them; empty for ``n == 0`` (a fully cached request allocates
        nothing, and engines return an empty tensor). Raises ``OverAllocation``
        (pool unchanged) when fewer than ``n`` are free, ``InvalidArgument`` for
        a negative or non-int ``n`` or a malformed owner.
        """
        free_np = self._free_np
        if free_np is not None:
            top = self._top
            seen = self._seen
            if type(n) is int and 0 < n < top and n < self._inline_below:
                # NOTE: the common case inline (``_pop_ids`` below, with no run to look for): a short result above the
                # bottom of the stack, popped by one negative-step slice; a new owner is encoded (and checked) first,
                # as ``check_alloc`` does once ``n`` is known good
                if owner is not seen[0]:
                    seen = self._seen_for(owner, "alloc")
                ids = free_np[top - 1 : top - n - 1 : -1].copy()
                self._top = top - n
                self._tags[ids] = seen[2]  # type: ignore[index]
                if self._stamped:
                    self._origins[ids] = self._stamp  # type: ignore[index]
                out = torch.from_numpy(ids)
                raw = ids.tobytes()
                self._last = (raw, ids, owner)
                items = self._fresh._items  # NOTE: ``RecentAllocs.add_short`` inline
                items[raw[-64:]] = (raw, None)
                if len(items) > FRESH_KEEP:
                    del items[next(iter(items))]
                handed = self._handed
                handed[id(out)] = (out, ids, raw, -1)
                if len(handed) > FRESH_KEEP:
                    del handed[next(iter(handed))]
                return out
            ids, popped, lo = self._pop_ids(n, owner, False)
            out = torch.from_numpy(ids)
            if 0 < n <= HANDED_MAX:
                raw = ids.tobytes() if popped is None else popped
                self._last = (raw, ids, owner)
                self._fresh.add_short(raw, None)
                handed = self._handed
                handed[id(out)] = (out, ids, raw, lo)
                if len(handed) > FRESH_KEEP:
                    del handed[next(iter(handed))]
            elif 0 < n <= FRESH_MAX:
                self._fresh.add(ids.tobytes() if popped is None else popped, None)
            return out
        code = self.check_alloc(n, owner)
        top = self._top
        out = self._stack[top - n : top].flip(0)
        self._top -= n
        self.owner_tag.index_fill_(0, out, code)
        if self._stamped:
            self.origin.index_fill_(0, out, self._stamp)
        return out

    def alloc_ids(self, n: int, owner: Owner, *, remember: bool = True) -> Ids:
        """``alloc`` on a CPU pool, the slot ids as a new host array (``Ids``). ``remember``: keep the result
        as a known-distinct sequence (``RecentAllocs``); an allocator that remembers what it hands out itself does not.
        """
        ids = self._pop_ids(n, owner, remember)[0]
        if 0 < n <= HANDED_MAX:
            self._last = (ids.tobytes(), ids, owner)
        return ids

    def _pop_ids(self, n: int, owner: Owner, remember: bool) -> tuple[Ids, bytes | None, int]:
        """The pop of ``alloc`` / ``alloc_ids``: the slot ids, their bytes when they were made (else ``None``) and
        where they start when they are a run of slots (``run_start``; else -1).

        NOTE: ``alloc`` and ``alloc_ids`` share this, so the contracts check each call once. A pop of a run
        (a fresh pool's, or one freed whole and popped again) is tagged through a slice, not a fancy index.
        """
        free_np = self._free_np
        assert free_np is not None, "alloc_ids: a CPU pool's call"
        top = self._top
        seen = self._seen
        if type(n) is not int or not 0 <= n <= top:
            self.check_alloc(n, owner)  # NOTE: raises, or takes an int-like ``n`` and makes ``owner`` the last seen
            seen = self._seen
        elif owner is not seen[0]:
            seen = self._seen_for(owner, "alloc")  # NOTE: ``check_alloc``'s owner check, once ``n`` is known good
        # NOTE: a copy (the caller's ids must not see later pushes), reversed by one negative-step slice (a stop of
        # -1 would read as the end: the bottom of the stack is popped through a reversed view)
        ids = (free_np[top - 1 : top - n - 1 : -1] if top > n else free_np[top - n : top][::-1]).copy()
        self._top = top - n
        self._last = None
        raw, lo = None, -1
        if n >= self._run_min and free_np.item(top - n) - (first := free_np.item(top - 1)) in (n - 1, 1 - n):
            raw = ids.tobytes()  # NOTE: its first and last ids n - 1 apart: most likely a run (the pool's are in range)
            lo = run_start(raw, n, first, self.base, self.size)
        if lo >= 0:
            self._tags[lo : lo + n] = seen[2]  # type: ignore[index]
            if self._stamped:
                self._origins[lo : lo + n] = self._stamp  # type: ignore[index]
        else:
            self._tags[ids] = seen[2]  # type: ignore[index]
            if self._stamped:
                self._origins[ids] = self._stamp  # type: ignore[index]
        if remember and 0 < n <= FRESH_MAX:
            self._fresh.add(ids.tobytes() if raw is None else raw, None)
        return ids, raw, lo

    def free(self, indices: torch.Tensor, owner: Owner) -> None:
        """Return ``indices`` from ``owner`` to the free list. Refines ``spec.ledger.free``.

        Raises ``DoubleFree`` / ``NotOwner`` / ``OutOfRange`` / ``InvalidArgument``
        with the pool unchanged.
        """
        mine = self._handed.get(id(indices))  # NOTE: only a CPU pool's alloc results are there
        if mine is not None and mine[0] is indices and indices._version == 0 and (ids := mine[1]).tobytes() == mine[2]:
            # NOTE: a recent alloc result that nothing changed (torch counts its in-place calls, shape changes
            # too; a write through a numpy view changes the bytes): its host ids, distinct slots of this pool
            lo, k = mine[3], len(ids)
            tags = self._tags
            assert tags is not None
            last = self._last
            # NOTE: the last alloc's very ids, and no tag written since: all ``owner``'s, nothing to read back
            untouched = last is not None and last[1] is ids and owner is last[2]
            if not untouched:
                seen = self._seen
                if owner is not seen[0]:
                    seen = self._seen_for(owner, "free")
                held = self._held_k  # NOTE: ``k`` copies of the owner's tag bytes, remembered for the owner and k
                if held[0] is not seen[3] or held[1] != k:
                    held = self._held_k = (seen[3], k, seen[3] * k)
            if lo < 0:
                if untouched or tags[ids].tobytes() == held[2]:
                    self._release(ids)
                    del self._handed[id(indices)]
                    return
            elif untouched or tags[lo : lo + k].tobytes() == held[2]:
                # NOTE: the run of slots lo .. lo + k - 1 (as the alloc found it): read and freed through a slice
                self._last = None
                tags[lo : lo + k] = _FREE0
                top = self._top
                self._free_np[top : top + k] = ids  # type: ignore[index]
                self._top = top + k
                del self._handed[id(indices)]
                return
        elif self._tags is not None and type(indices) is torch.Tensor and self._free_host(indices, owner):
            return
        self._release(self._held_index("free", indices, owner))

    def _free_host(self, indices: torch.Tensor, owner: Owner) -> bool:
        """``free`` of a CPU tensor through its host view, when it is shown to be distinct slots held by ``owner``;
        ``False`` (nothing done) when not: ``free`` then takes the checked path, which names the error."""
        try:
            ids: Ids = indices.numpy()
        except (TypeError, RuntimeError):  # another device, a sparse or meta tensor
            return False
        if ids.dtype != I64 or ids.ndim != 1 or not (k := len(ids)):
            return False
        if k == 1 and ids[0] >= 0:  # NOTE: one slot is distinct; numpy would wrap a negative index
            seen = self._seen if owner is self._seen[0] else self._seen_for(owner, "free")
            try:
                ok = self._tags[ids].tobytes() == seen[3]  # type: ignore[index]
            except IndexError:
                return False
        else:
            ok = self.claim(ids, owner, op="free")
        if ok:
            self._release(ids)
        return ok

    def release(self, idx: torch.Tensor | Ids) -> None:
        """Push already-validated slots back on the free stack (no checks: callers validate first).

        ``idx``: a tensor, or (CPU pools) int64 ids on the host.
        """
        top = self._top
        free_np = self._free_np
        if free_np is not None:
            ids = idx if type(idx) is np.ndarray or not isinstance(idx, torch.Tensor) else idx.numpy()
            k = len(ids)
            self._last = None
            self._tags[ids] = _FREE0  # type: ignore[index]
            free_np[top : top + k] = ids
        else:
            assert isinstance(idx, torch.Tensor)
            k = idx.numel()
            self.owner_tag.index_fill_(0, _long(idx), FREE_TAG)
            self._stack[top : top + k] = idx
        self._top = top + k

    # NOTE: the push ``free`` makes once it has validated its slots: ``release`` itself, under a name a contract tier
    # does not wrap (``release`` called alone is checked as a transition; inside a free it is part of the free's check)
    _release = release

    def transfer(self, indices: torch.Tensor, src: Owner, dst: Owner) -> None:
        """Move ``indices`` from ``src`` (which must hold them) to ``dst``. Refines ``spec.ledger.transfer``."""
        if src == dst:
            idx = self.as_index("transfer", indices)
            raise InvalidArgument("transfer", self.name, idx.tolist(), f"source and destination are both {src}")
        code = encode(dst, "transfer", self.name)
        if not isinstance(indices, torch.Tensor):
            self.as_index("transfer", indices)  # NOTE: raises: a caller's ids are a tensor (host ids: the pool's own)
        if self.claim(indices, src, code, op="transfer"):
            return
        self.retag_code(self._held_index("transfer", indices, src), code)

    def retag(self, idx: torch.Tensor, dst: Owner) -> None:
        """Give already-validated slots ``idx`` to ``dst`` (no checks: callers validate first, as for ``release``).

        The radix tree moves slots between its own nodes, and takes slots an
        ``insert`` has checked, with this.
        """
        self.retag_code(idx, encode(dst))

    def retag_code(self, idx: torch.Tensor | Ids, code: int) -> None:
        """``retag`` to the owner whose tag is ``code``; ``idx``: a tensor or (CPU pools) int64 ids on the host."""
        if self._tags is not None:
            self._mark_owned(idx.numpy() if isinstance(idx, torch.Tensor) else idx, code)
            return
        assert isinstance(idx, torch.Tensor)
        idx = _long(idx)
        self.owner_tag.index_fill_(0, idx, code)
        if self._stamped:
            self.origin.index_fill_(0, idx, self._stamp)

    def _mark_owned(self, ids: Ids, code: int) -> None:
        """Tag host ids ``ids`` (CPU pools) ``code`` and stamp their origin."""
        assert self._tags is not None and self._origins is not None
        self._last = None
        self._tags[ids] = code
        if self._stamped:
            self._origins[ids] = self._stamp

    def free_all_of(self, owner: Owner) -> torch.Tensor:
        """Free every slot tagged ``owner`` (a whole-pool scan: for teardown paths) and return them."""
        idx = torch.nonzero(self.owner_tag == encode(owner, "free_all_of", self.name)).flatten()
        if idx.numel():
            self.release(idx)
        return idx

    def held_by(self, owner: Owner) -> torch.Tensor:
        """Every slot tagged ``owner`` (a whole-pool scan)."""
        return torch.nonzero(self.owner_tag == encode(owner, "held_by", self.name)).flatten()


def host_bytes(t: torch.Tensor) -> bytes | bytearray:
    """The int64 values of 1-D integer tensor ``t`` (any device), as raw bytes on the CPU: one copy."""
    n = t.numel()
    if not n:
        return b""
    if t.is_cpu and t.dtype == torch.int64 and t.is_contiguous():
        return _host(t)
    out = bytearray(8 * n)
    torch.frombuffer(out, dtype=torch.int64).copy_(t)
    return out


def _host(t: torch.Tensor) -> bytes:
    """The raw bytes of contiguous CPU tensor ``t``: a copy made without a torch dispatch, compared by ``memcmp``.

    NOTE: a contiguous CPU tensor's values are the bytes at its data pointer; reading them there costs
    no torch dispatch (a dispatch costs more than copying a few thousand ids).
    """
    return ctypes.string_at(t.data_ptr(), t.element_size() * t.numel())


RUN_MIN = 512
"""Slot ids at least this many are looked at as a run (``run_start``): below it a fancy index costs less than the
look (numpy makes a view object for a slice). At 256 slots the run path ran 4 % fewer instructions but ~10 % more
CPU time in ``bench_pools.py`` (four alternating runs); at 1,000, 33 % fewer instructions and ~15 % less time."""
_RUNS: list[bytes] = [b"", b""]
"""The ids ``0 .. M - 1`` as int64 bytes, ascending and descending, ``M`` the largest CPU pool's size: a run of
slot ids is one slice of them (shared by every pool; 16 bytes a slot of the largest)."""


def _grow_runs(size: int) -> None:
    """Make ``_RUNS`` cover slot ids below ``size``."""
    if 8 * size > len(_RUNS[0]):
        ids = np.arange(size, dtype=I64)
        _RUNS[0], _RUNS[1] = ids.tobytes(), ids[::-1].tobytes()


def run_start(raw: bytes, n: int, first: int, base: int, size: int) -> int:
    """Where the ``n`` int64 ids ``raw`` (``n >= 1``; ``first``: the first of them) start when they are exactly the
    slots ``lo .. lo + n - 1`` of ``[base, size)``, in ascending or descending order: ``lo``; else -1.

    NOTE: one comparison of bytes with a slice of ``_RUNS`` (a C ``memcmp``) proves it, so the caller
    may index the run by a slice.
    """
    asc, desc = _RUNS
    if base <= first and first + n <= size and 8 * (first + n) <= len(asc) and raw == asc[8 * first : 8 * (first + n)]:
        return first
    lo = first - n + 1  # NOTE: descending from ``first``: desc[i] = M - 1 - i
    at = len(desc) // 8 - 1 - first
    if base <= lo and first < size and at >= 0 and raw == desc[8 * at : 8 * (at + n)]:
        return lo
    return -1


FRESH_KEEP = 64
"""How many recent ``alloc`` results of up to ``HANDED_MAX`` slots a pool remembers as known-distinct sequences."""
HANDED_MAX = 8192
"""The results a pool remembers by tensor identity (``free`` of them needs no conversion): at most this many slots
(the memo keeps each tensor alive, at most 64 × 64 KiB per pool)."""
FRESH_LONG = 4
"""How many longer results (``HANDED_MAX`` to ``FRESH_MAX`` slots) a pool remembers as known-distinct sequences."""
FRESH_MAX = 1 << 17
"""Only results of at most this many slots are remembered by content (at most 4 × 1 MiB more per pool): a long
prompt's allocation is inserted into the cache right after, which then need not prove it distinct again."""

V = TypeVar("V")


class RecentAllocs(Generic[V]):
    """A pool's last ``FRESH_KEEP`` alloc results of up to ``HANDED_MAX`` ids and last ``FRESH_LONG`` longer ones
    (up to ``FRESH_MAX``) as host bytes (int64 ids), each with a value, found by content.

    NOTE: keyed by the last eight ids (hashing thousands of ids would cost what the lookup saves); a
    full comparison confirms a hit, and a result whose key is taken replaces the older one.
    """

    __slots__ = ("_items", "_long")

    def __init__(self) -> None:
        self._items: dict[bytes, tuple[bytes, V]] = {}
        self._long: dict[bytes, tuple[bytes, V]] = {}

    def add(self, raw: bytes | bytearray, value: V) -> None:
        """Remember the alloc result ``raw`` with ``value``, forgetting the oldest of its length class past
        ``FRESH_KEEP`` (or ``FRESH_LONG``)."""
        raw = bytes(raw)
        if len(raw) <= _SHORT_BYTES:
            items, keep = self._items, FRESH_KEEP
        else:
            items, keep = self._long, FRESH_LONG
        items[raw[-64:]] = (raw, value)
        if len(items) > keep:
            del items[next(iter(items))]

    def add_short(self, raw: bytes, value: V) -> None:
        """``add`` of a result of at most ``HANDED_MAX`` ids already as ``bytes`` (an alloc's hot path)."""
        items = self._items
        items[raw[-64:]] = (raw, value)
        if len(items) > FRESH_KEEP:
            del items[next(iter(items))]

    def find(self, raw: bytes | bytearray) -> tuple[bytes, V] | None:
        """The remembered result equal to ``raw`` and its value, if any."""
        hit = (self._items if len(raw) <= _SHORT_BYTES else self._long).get(bytes(raw[-64:]))
        return hit if hit is not None and hit[0] == raw else None


_SHORT_BYTES = 8 * HANDED_MAX


_TAG_BYTES: dict[int, bytes] = {}


_TAG_RUNS: dict[tuple[int, int], bytes] = {}
"""``_tag_bytes`` of the last few ``(code, n)`` asked for with ``1 < n <= HANDED_MAX``: a check of an alloc or free
compares the slots' tags with one, and making ``n`` copies costs more than finding them."""


def _tag_bytes(code: int, n: int) -> bytes:
    """``n`` int64 copies of ``code`` as raw native-order bytes (what ``_host`` of a uniform tag column reads)."""
    if 1 < n <= HANDED_MAX:
        got = _TAG_RUNS.get((code, n))
        if got is not None:
            return got
    one = _TAG_BYTES.get(code)
    if one is None:
        one = _TAG_BYTES[code] = code.to_bytes(8, sys.byteorder, signed=True)
        if len(_TAG_BYTES) > 4096:  # NOTE: request tags come and go; keep the table small
            _TAG_BYTES.clear()
    if not 1 < n <= HANDED_MAX:
        return one * n
    if len(_TAG_RUNS) >= 64:  # NOTE: at most 64 x 64 KiB
        _TAG_RUNS.clear()
    got = _TAG_RUNS[code, n] = one * n
    return got


def _long(idx: torch.Tensor) -> torch.Tensor:
    return idx if idx.dtype == torch.int64 else idx.to(torch.int64)
