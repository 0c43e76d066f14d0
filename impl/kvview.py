"""The radix cache's view of its KV allocator: tags, checks and moves of node slots, whatever the allocator.

A token allocator and an SWA allocator own token slots; a paged allocator
owns pages (``grain`` tokens each). The cache speaks token slots throughout
and this view turns them into what the pool checks, so ``insert`` can check
everything before it changes anything (STYLE.md rule 6).
"""

from __future__ import annotations

import numpy as np
import torch

from kvledger.impl.allocators import PagedAllocator, SWATokenAllocator, TokenAllocator, swa_owner
from kvledger.impl.arguments import check_range
from kvledger.impl.owners import encode
from kvledger.impl.slots import I64, Ids, SlotPool, Tokens
from kvledger.spec.errors import InvalidArgument, OutOfRange, PageAlignmentError, SlotConflict
from kvledger.spec.types import Owner, OwnerKind, node

KVAllocator = TokenAllocator | PagedAllocator | SWATokenAllocator
_NODE_KIND = encode(node(0)) >> 60


class KVView:
    """``kv`` seen per token slot. ``grain``: the allocator's page size (1 when token-granular)."""

    def __init__(self, kv: KVAllocator) -> None:
        self.kv = kv
        self.grain = kv.page_size if isinstance(kv, PagedAllocator) else 1
        self.pool: SlotPool = kv.full.pool if isinstance(kv, SWATokenAllocator) else kv.pool
        self.swa = kv if isinstance(kv, SWATokenAllocator) else None
        self._paged = kv if isinstance(kv, PagedAllocator) else None
        self._fast = self.swa is None and self.pool.is_cpu  # NOTE: where ``take`` needs no tensor
        self._shift = self.grain.bit_length() - 1 if self.grain & (self.grain - 1) == 0 else None  # log2(grain)
        self._offsets = torch.arange(self.grain, dtype=torch.int64, device=kv.device)

    def owner_of(self, slot: int) -> Owner | None:
        """The owner tagged on token ``slot`` (on its page when paged)."""
        return self.pool.owner_of(slot // self.grain)

    def units(self, op: str, idx: torch.Tensor) -> torch.Tensor:
        """The pool slots (pages when paged) of token slots ``idx``, validated: in range, distinct, whole pages."""
        if isinstance(self.kv, PagedAllocator):
            return self.kv.pages_of(op, idx)
        return self.pool.as_index(op, idx)

    def take(self, value: torch.Tensor, hit: int, owner: Owner, dst: int, raw: bytes | bytearray) -> bool:
        """The insert's checks and hand-over in one pass, for the common case: the slots of ``value[hit:]`` go from
        ``owner`` to the owner whose tag is ``dst``.

        ``True`` when those slots are in range and distinct and
        ``owner`` holds them (whole pages in order, when paged), so that
        ``check_fresh`` and ``check_held`` would pass: they are ``dst``'s now.
        ``False`` changes nothing and means "ask those": they raise the precise
        error, or accept what this conservative pass does not (an SWA
        allocator, a node as the owner). ``raw``: the values of ``value[hit:]`` as bytes on the host.
        """
        if self.swa is not None or owner.kind is OwnerKind.NODE:
            return False
        if not raw:
            return True
        pool, paged = self.pool, self._paged
        if self._fast:
            # NOTE: on the CPU the ids are read from ``raw`` (no tensor slice); an alloc result is distinct
            # slots (whole, distinct pages in order when paged); pages that are not one come from tokens that
            # are not one either (the pool and the allocator remember the same allocs)
            if paged is None:
                # NOTE: the pool finds the ids among its recent allocs by ``raw`` (its last one needs no tag read)
                return pool.claim(np.frombuffer(raw, I64), owner, dst, raw=raw)
            units = paged.fresh_pages(raw)
            fresh = units is not None
            if units is None:
                got = paged.whole_pages(torch.frombuffer(bytearray(raw), dtype=torch.int64))
                if got is None:
                    return False
                units = got.numpy()
            # NOTE: a slot ``owner`` holds is no node's, so the new part repeats no cached slot
            return pool.claim(units, owner, dst, distinct=fresh)
        if paged is not None:
            return False  # NOTE: off the CPU a paged insert takes the general checks
        new = value[hit:]
        lo, hi = torch.aminmax(new)
        if int(lo) < pool.base or int(hi) >= pool.size:
            return False
        tags = pool.owner_tag.index_select(0, new)
        if not torch.equal(tags, torch.full_like(tags, encode(owner))) or pool.has_duplicates(new):
            return False
        pool.retag_code(new, dst)
        return True

    def move(self, value: torch.Tensor, src: Owner, dst: Owner) -> None:
        """Hand ``value``'s slots (checked: ``src`` holds them) from ``src`` to ``dst`` without checking again."""
        if self.swa is not None:
            self.swa.transfer(value, src, dst)
        else:
            self.pool.retag(self.units_unchecked(value), dst)

    def retag(self, slots: Tokens, code: int) -> None:
        """Tag token slots ``slots`` (ids on the host; whole pages in order, when paged; checked by the caller)
        ``code``, unchecked. For token and paged allocators only (an SWA allocator moves SWA slots too: ``move``).
        """
        self.pool.retag_code(self._host_units(slots), code)

    def release(self, slots: Tokens | bytearray) -> None:
        """Free token slots ``slots`` (ids on the host; whole pages in order, when paged) without checking who holds
        them. For the tree's own slots, whose tags it keeps exact (a token or paged allocator: SWA slots go through
        the allocator's checked ``free``).
        """
        self.pool.release(self._host_units(slots))

    def _host_units(self, slots: Tokens | bytearray) -> torch.Tensor | Ids:
        """The pool slots of non-empty host ids ``slots`` (whole pages in order): host ids on a CPU pool, else a
        tensor on the pool's device.

        NOTE: a page's number is worked out on the host (a few dozen pages per node): cheaper than two torch calls.
        """
        ids = np.frombuffer(slots, I64)
        g, shift = self.grain, self._shift
        if g == 1:
            units = ids
        elif shift is not None:
            units = ids[::g] >> shift  # NOTE: ids are >= 0; a shift costs half an int64 floor division
        else:
            units = ids[::g] // g
        return units if self.pool.is_cpu else torch.from_numpy(units.copy()).to(self.pool.device)

    def units_unchecked(self, value: torch.Tensor) -> torch.Tensor:
        """The pool slots of ``value``, known to be whole pages in order: every ``grain``-th slot, as a page."""
        return value if self.grain == 1 else torch.div(value[:: self.grain], self.grain, rounding_mode="floor")

    def check_fresh(self, key: tuple[int, ...], value: torch.Tensor, offered: torch.Tensor) -> None:
        """Raise ``SlotConflict`` if ``value`` repeats a slot or offers one a node holds (``spec.prefix.check_insert``).

        ``offered`` marks the positions whose slot differs from the cached one
        (new positions, and duplicates the caller will get back).
        """
        if _repeats(self.pool, self.grain, value):
            s, _ = torch.sort(value)
            x = int(s[1:][s[1:] == s[:-1]][0])
            raise SlotConflict("insert", key, f"slot {x} offered for two positions (double allocation?)")
        idx = value[offered]
        if idx.numel():
            lo, hi = self.pool.base * self.grain, self.pool.size * self.grain
            out = (idx < lo) | (idx >= hi)
            if bool(out.any()):
                raise OutOfRange("insert", self.pool.name, idx[out].tolist(), f"token slot outside [{lo}, {hi})")
            cached = (self.pool.owner_tag[idx // self.grain] >> 60) == _NODE_KIND
            if bool(cached.any()):
                i = int(torch.nonzero(offered)[int(torch.nonzero(cached)[0])])
                x = int(value[i])
                raise SlotConflict("insert", key, f"slot {x} for position {i} is cached at {self.owner_of(x)}")

    def check_held(self, value: torch.Tensor, offered: torch.Tensor, owner: Owner) -> None:
        """Raise unless ``owner`` holds ``value[offered]`` (pages whole and in order, SWA slots too)."""
        idx = value[offered]
        if not idx.numel():
            return
        self.check_pages("insert", value)
        self.pool.check_held("insert", self.units("insert", idx), owner)
        if self.swa is not None:
            live = self.swa.translate(idx)
            live = live[live != 0]
            if live.numel():
                self.swa.swa.pool.check_held("insert", live, swa_owner(owner))

    def check_pages(self, op: str, value: torch.Tensor) -> None:
        """Raise ``PageAlignmentError`` unless ``value`` is whole pages in page order (paged allocators)."""
        if self.grain == 1:
            return
        v = value.view(-1, self.grain)
        ok = (v[:, 0] % self.grain == 0) & (v - v[:, :1] == self._offsets).all(dim=1)
        if not bool(ok.all()):
            bad = (v[~ok][:, 0] // self.grain).tolist()
            raise PageAlignmentError(op, self.pool.name, bad, f"slots are not whole pages of {self.grain} in order")

    def check_swa_live(self, op: str, idx: torch.Tensor) -> None:
        """Raise unless every token slot of ``idx`` still has its SWA slot (new cached positions are SWA-live)."""
        if self.swa is not None and idx.numel():
            full = self.swa.full.pool
            check_range(op, "kv", "full slot", idx, full.base, full.size)  # NOTE: refused naming this call
            dead = self.swa.full_to_swa[idx] == 0  # NOTE: ``translate`` without its checks (``idx``: int64, in range)
            if bool(dead.any()):
                raise InvalidArgument(op, "swa", idx[dead].tolist(), "slot's SWA slot was freed: cannot cache SWA-live")


def _repeats(pool: SlotPool, grain: int, value: torch.Tensor) -> bool:
    """Whether ``value`` names a token slot twice (O(n) when every slot is in the pool's range, else a sort)."""
    if value.numel() < 2:
        return False
    if grain == 1:
        lo, hi = torch.aminmax(value)
        if pool.base <= int(lo) and int(hi) < pool.size:
            return pool.has_duplicates(value)
    return bool(torch.unique(value).numel() != value.numel())
