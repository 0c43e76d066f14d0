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

import torch

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

INDEX_DTYPES = (torch.int64, torch.int32)


class SlotPool:
    """Slots ``base .. base + capacity - 1`` of one pool, each free or tagged with its owner.

    Slots below ``base`` are reserved (padding) and never handed out.
    Refines :class:`kvledger.spec.ledger.Ledger`.
    """

    def __init__(self, name: str, capacity: int, *, base: int = 0, device: str | torch.device = "cpu") -> None:
        if capacity <= 0 or base < 0:
            raise InvalidArgument("create", name, (), f"capacity {capacity} and base {base} must be > 0 and >= 0")
        self.name = name
        self.capacity = capacity
        self.base = base
        self.device = torch.device(device)
        self.size = base + capacity
        # owner_tag[s]: FREE_TAG, RESERVED_TAG (s < base) or the encoded owner of slot s.
        self.owner_tag = torch.zeros(self.size, dtype=torch.int64, device=self.device)
        self.owner_tag[:base] = RESERVED_TAG
        # The free stack holds free slots in _stack[:_top]; the next alloc pops from the top.
        # NOTE: filled descending so a fresh pool hands out its lowest slots first.
        self._stack = torch.arange(self.size - 1, base - 1, -1, dtype=torch.int64, device=self.device)
        self._top = capacity
        # Provenance: origin[s] is the ``stamp`` in force when slot s last got its owner (alloc or
        # transfer). Whoever drives the pool (the memory manager) sets ``stamp`` to an event id it logs.
        self.origin = torch.zeros(self.size, dtype=torch.int64, device=self.device)
        self.stamp = 0

    # ------------------------------------------------------------ queries

    def available_size(self) -> int:
        """Number of free slots."""
        return self._top

    def free_slots(self) -> torch.Tensor:
        """The free stack's contents (a copy; order is the allocation order reversed)."""
        return self._stack[: self._top].clone()

    def owner_of(self, slot: int) -> Owner | None:
        """The owner tagged on ``slot`` (``None`` when free or reserved)."""
        return decode(int(self.owner_tag[slot]))

    # ------------------------------------------------------------ validation

    def as_index(self, op: str, indices: torch.Tensor) -> torch.Tensor:
        """Check that ``indices`` is a non-empty 1-D integer tensor of distinct in-range slots on our device."""
        if not isinstance(indices, torch.Tensor):
            raise InvalidArgument(op, self.name, (), f"indices must be a torch.Tensor, got {type(indices).__name__}")
        if indices.dtype not in INDEX_DTYPES:
            raise InvalidArgument(
                op, self.name, (), f"index dtype {indices.dtype}, expected torch.int64 or torch.int32"
            )
        if indices.device != self.device:
            raise InvalidArgument(op, self.name, (), f"indices on {indices.device}, pool on {self.device}")
        if indices.dim() != 1 or indices.numel() == 0:
            raise InvalidArgument(
                op, self.name, (), f"indices must be 1-D and non-empty, got shape {tuple(indices.shape)}"
            )
        idx = indices.to(torch.int64)
        lo, hi = int(idx.min()), int(idx.max())
        if lo < self.base or hi >= self.size:
            bad = idx[(idx < self.base) | (idx >= self.size)].tolist()
            raise OutOfRange(op, self.name, bad, f"outside [{self.base}, {self.size})")
        if torch.unique(idx).numel() != idx.numel():
            s, _ = torch.sort(idx)
            dup = s[1:][s[1:] == s[:-1]].tolist()
            raise InvalidArgument(op, self.name, dup, "duplicate slot ids in one call")
        return idx

    def check_held(self, op: str, idx: torch.Tensor, owner: Owner) -> None:
        """Raise unless every slot of ``idx`` (already validated) is tagged ``owner``."""
        code = encode(owner)
        tags = self.owner_tag[idx]
        bad = tags != code
        if bool(bad.any()):
            raise self._held_error(op, idx[bad], tags[bad], owner)

    def _held_error(self, op: str, slots: torch.Tensor, tags: torch.Tensor, owner: Owner) -> LedgerError:
        free_mask = tags == FREE_TAG
        if bool(free_mask.any()):
            return DoubleFree(op, self.name, slots[free_mask].tolist(), f"already free (double free by {owner})")
        first = int(slots[0])
        holder = decode(int(tags[0]))
        return NotOwner(op, self.name, slots.tolist(), f"slot {first} is held by {holder}, not by {owner}")

    def check_alloc(self, n: int, owner: Owner) -> None:
        """Raise unless ``n`` slots can be given to ``owner``."""
        if not isinstance(n, int) or isinstance(n, bool) or n <= 0:
            raise InvalidArgument("alloc", self.name, (), f"size {n!r} for {owner} must be a positive int")
        encode(owner)
        if n > self._top:
            raise OverAllocation("alloc", self.name, (), f"{n} requested by {owner}, {self._top} free")

    # ------------------------------------------------------------ transitions

    def alloc(self, n: int, owner: Owner) -> torch.Tensor:
        """Give ``n`` free slots to ``owner``; all or nothing. Refines ``spec.ledger.allocate``.

        Returns a new int64 tensor of slot ids owned by ``owner`` until it frees
        or transfers them. Raises ``OverAllocation`` (pool unchanged) when fewer
        than ``n`` are free.
        """
        self.check_alloc(n, owner)
        out = self._stack[self._top - n : self._top].flip(0)
        self._top -= n
        self.owner_tag[out] = encode(owner)
        self.origin[out] = self.stamp
        return out

    def free(self, indices: torch.Tensor, owner: Owner) -> None:
        """Return ``indices`` from ``owner`` to the free list. Refines ``spec.ledger.free``.

        Raises ``DoubleFree`` / ``NotOwner`` / ``OutOfRange`` / ``InvalidArgument``
        with the pool unchanged.
        """
        idx = self.as_index("free", indices)
        self.check_held("free", idx, owner)
        self.release(idx)

    def release(self, idx: torch.Tensor) -> None:
        """Push already-validated slots back on the free stack (no checks: callers validate first)."""
        k = idx.numel()
        self.owner_tag[idx] = FREE_TAG
        self._stack[self._top : self._top + k] = idx
        self._top += k

    def transfer(self, indices: torch.Tensor, src: Owner, dst: Owner) -> None:
        """Move ``indices`` from ``src`` (which must hold them) to ``dst``. Refines ``spec.ledger.transfer``."""
        idx = self.as_index("transfer", indices)
        if src == dst:
            raise InvalidArgument("transfer", self.name, idx.tolist(), f"source and destination are both {src}")
        code = encode(dst)
        self.check_held("transfer", idx, src)
        self.owner_tag[idx] = code
        self.origin[idx] = self.stamp

    def free_all_of(self, owner: Owner) -> torch.Tensor:
        """Free every slot tagged ``owner`` (a whole-pool scan: for teardown paths) and return them."""
        idx = torch.nonzero(self.owner_tag == encode(owner)).flatten()
        if idx.numel():
            self.release(idx)
        return idx

    def held_by(self, owner: Owner) -> torch.Tensor:
        """Every slot tagged ``owner`` (a whole-pool scan)."""
        return torch.nonzero(self.owner_tag == encode(owner)).flatten()
