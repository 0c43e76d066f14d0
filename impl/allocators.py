"""KV allocators: token-granular, paged, and the SWA pair (full + sliding-window).

Each refines :mod:`kvledger.spec.ledger` through the :class:`SlotPool` it is
built on. Every slot carries an ``int64`` fingerprint column (``data``) that
stands for its K/V contents (see :mod:`kvledger.impl.integrity`).
"""

from __future__ import annotations

import torch

from kvledger.impl.arguments import MAX_TOKEN, check_ids_tensor, check_int, check_range, int_ids
from kvledger.impl.integrity import fingerprint_unchecked, verify
from kvledger.impl.slots import FRESH_MAX, Ids, RecentAllocs, SlotPool
from kvledger.spec.errors import InvalidArgument, OutOfRange, PageAlignmentError
from kvledger.spec.types import Component, Owner, OwnerKind


def check_kv_write(
    op: str, where: str, slots: object, tokens: object, positions: object, device: torch.device, lo: int, hi: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The arguments of a KV write or verify, checked: 1-D integer tensors on ``device`` of one length, token
    slots in ``[lo, hi)`` (the padding below ``lo`` is never written), token ids and positions non-negative."""
    s = check_ids_tensor(op, where, "slots", slots, device)
    t = check_ids_tensor(op, where, "tokens", tokens, device)
    p = check_ids_tensor(op, where, "positions", positions, device)
    if not s.numel() == t.numel() == p.numel():
        raise InvalidArgument(op, where, (), f"{s.numel()} slots, {t.numel()} tokens, {p.numel()} positions")
    check_range(op, where, "token slot", s, lo, hi)
    check_range(op, where, "token id", t, 0, MAX_TOKEN)
    check_range(op, where, "position", p, 0, MAX_TOKEN)
    if s.numel() > 1 and torch.unique(s).numel() != s.numel():
        u, n = torch.unique(s, return_counts=True)
        raise InvalidArgument(op, where, u[n > 1].tolist(), "a slot named twice in one write")
    return s, t, p


class TokenAllocator:
    """Token-granular KV slot allocator (SGLang's ``TokenToKVPoolAllocator``).

    Slots ``1..size`` are allocatable; slot 0 is reserved as padding, as
    engines do. Owned slots belong to whoever ``alloc`` named until they are
    freed or transferred.
    """

    page_size = 1

    def __init__(self, size: int, *, device: str | torch.device = "cpu", name: str = "kv") -> None:
        self.pool = SlotPool(name, size, base=1, device=device)
        self.device = self.pool.device
        self.data = torch.zeros(self.pool.size, dtype=torch.int64, device=self.device)

    @property
    def capacity(self) -> int:
        return self.pool.capacity

    def available_size(self) -> int:
        """Free token slots."""
        return self.pool.available_size()

    def alloc(self, n: int, owner: Owner) -> torch.Tensor:
        """``n`` token slots for ``owner`` (all or nothing). Refines ``spec.ledger.allocate``."""
        return self.pool.alloc(n, owner)

    def free(self, indices: torch.Tensor, owner: Owner) -> None:
        """Return ``owner``'s slots. Refines ``spec.ledger.free``."""
        self.pool.free(indices, owner)

    def transfer(self, indices: torch.Tensor, src: Owner, dst: Owner) -> None:
        """Hand slots from ``src`` to ``dst``. Refines ``spec.ledger.transfer``."""
        self.pool.transfer(indices, src, dst)

    def write_fingerprint(self, slots: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor) -> None:
        """Write the KV of ``tokens`` at ``positions`` into ``slots`` (as fingerprints); the arguments as
        ``check_kv_write`` takes them (``InvalidArgument`` / ``OutOfRange``, nothing written)."""
        s, t, p = check_kv_write("write_fingerprint", self.pool.name, slots, tokens, positions, *self._span())
        self.data[s] = fingerprint_unchecked(t, p)

    def verify(self, slots: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor) -> None:
        """Raise ``IntegrityError`` unless ``slots`` hold exactly ``tokens`` at ``positions``."""
        s, t, p = check_kv_write("verify", self.pool.name, slots, tokens, positions, *self._span())
        verify(self.pool.name, self.data, s, t, p)

    def _span(self) -> tuple[torch.device, int, int]:
        return self.device, self.pool.base, self.pool.size


class PagedAllocator:
    """Paged KV allocator: whole pages of ``page_size`` token slots.

    Page 0 is reserved padding. ``alloc`` returns token indices of whole
    pages; ``free`` accepts only whole pages (a free that would split a page
    raises ``PageAlignmentError``). The ledger's slots are pages.
    """

    def __init__(self, num_pages: int, page_size: int, *, device: str | torch.device = "cpu", name: str = "kv") -> None:
        check_int("create", name, "page_size", page_size, 1, 1 << 20)
        self.page_size = page_size
        self.pool = SlotPool(name, num_pages, base=1, device=device)
        self.device = self.pool.device
        self.data = torch.zeros(self.pool.size * page_size, dtype=torch.int64, device=self.device)
        # _rows[p]: the token indices of page p (a lookup table: one gather instead of arithmetic per call)
        self._rows = torch.arange(self.data.numel(), dtype=torch.int64, device=self.device).view(-1, page_size)
        # NOTE: recent alloc results, as token-id bytes -> their pages (CPU only): token ids equal to one
        # of them are whole, distinct pages in order, so a cache insert need not prove that again
        self._fresh: RecentAllocs[Ids] = RecentAllocs()
        self._rows_np = self._rows.numpy() if self.pool.is_cpu else None  # NOTE: the same rows on the host

    @property
    def capacity(self) -> int:
        """Capacity in tokens."""
        return self.pool.capacity * self.page_size

    def available_size(self) -> int:
        """Free token slots (whole free pages times ``page_size``)."""
        return self.pool.available_size() * self.page_size

    def pages_for(self, num_tokens: int) -> int:
        """Pages needed to hold ``num_tokens`` tokens (a count: an int in ``[0, 2**63)``, else ``InvalidArgument``)."""
        return -(-check_int("pages_for", self.pool.name, "num_tokens", num_tokens, 0, 1 << 63) // self.page_size)

    def tokens_of(self, pages: torch.Tensor) -> torch.Tensor:
        """Token indices of ``pages`` (a 1-D integer tensor of pages of the pool), page by page."""
        p = check_ids_tensor("tokens_of", self.pool.name, "pages", pages, self.device)
        check_range("tokens_of", self.pool.name, "page", p, self.pool.base, self.pool.size)
        return self._rows.index_select(0, p).view(-1)

    def alloc(self, num_tokens: int, owner: Owner) -> torch.Tensor:
        """Whole pages for ``num_tokens`` tokens: returns ``pages_for(num_tokens) * page_size`` token indices
        (none for 0; a negative or non-int size raises ``InvalidArgument``)."""
        if type(num_tokens) is not int or num_tokens < 0:
            num_tokens = check_int("alloc", self.pool.name, "size", num_tokens)
        pages = -(-num_tokens // self.page_size)
        if not self.pool.is_cpu:
            return self._rows.index_select(0, self.pool.alloc(pages, owner)).view(-1)
        # NOTE: on the CPU the pages' token ids are gathered with numpy from the host view of the row table
        ids = self.pool.alloc_ids(pages, owner, remember=False)
        assert self._rows_np is not None
        out = self._rows_np[ids].ravel()
        if 0 < len(out) <= FRESH_MAX:
            self._fresh.add(out.tobytes(), ids)
        return torch.from_numpy(out)

    def fresh_pages(self, raw: bytes | bytearray) -> Ids | None:
        """The pages of one of the recent ``alloc`` results whose token ids are ``raw`` (int64 bytes), if any."""
        if not isinstance(raw, bytes | bytearray):
            raise InvalidArgument("fresh_pages", self.pool.name, (), f"raw must be bytes, got {type(raw).__name__}")
        hit = self._fresh.find(raw)
        return None if hit is None else hit[1]

    def whole_pages(self, idx: torch.Tensor) -> torch.Tensor | None:
        """The pages of int64 token indices ``idx`` when they are whole pages in page order, else ``None``.

        One gather of the pages' rows and one comparison (on the CPU an
        index out of the pool raises there). Page 0 (reserved) and repeated
        pages are not ruled out: callers check those.
        """
        g = self.page_size
        if not self.pool.is_cpu or not isinstance(idx, torch.Tensor) or not_int64_1d(idx) or idx.numel() % g:
            return None
        pages = torch.div(idx[::g], g, rounding_mode="floor")
        try:
            rows = self._rows.index_select(0, pages)
        except IndexError:
            return None
        return pages if torch.equal(idx.view(-1, g), rows) else None

    def _host_pages(self, indices: torch.Tensor) -> tuple[Ids, bool] | None:
        """On the CPU, the pages (host ids) of int64 token ids that are whole pages of the pool in page order, and
        whether they are known distinct (one of the recent ``alloc`` results); ``None`` when that is not shown
        (callers then take the checked path, which names the error).

        NOTE: numpy on the host: a handful of torch dispatches cost more than the whole check.
        """
        if self._rows_np is None or type(indices) is not torch.Tensor or not_int64_1d(indices) or not indices.is_cpu:
            return None
        ids = indices.numpy()
        raw = ids.tobytes()
        hit = self._fresh.find(raw)
        if hit is not None:
            return hit[1], True
        g = self.page_size
        if not len(ids) or len(ids) % g:
            return None
        pages = ids[::g] // g
        if int(pages.min()) < self.pool.base:
            return None
        try:
            rows = self._rows_np[pages]
        except IndexError:
            return None
        return (pages, False) if rows.tobytes() == raw else None

    def pages_of(self, op: str, indices: torch.Tensor) -> torch.Tensor:
        """The pages that ``indices`` cover exactly; raise unless they are whole, distinct pages."""
        if not isinstance(indices, torch.Tensor) or indices.layout != torch.strided or indices.is_meta:
            raise InvalidArgument(op, self.pool.name, (), f"indices must be a dense tensor, got {indices!r:.60}")
        if indices.dim() != 1 or indices.numel() == 0:
            raise InvalidArgument(op, self.pool.name, (), "indices must be a non-empty 1-D tensor")
        if indices.device != self.device:
            raise InvalidArgument(op, self.pool.name, (), f"indices {indices.dtype} on {indices.device}")
        idx = int_ids(op, self.pool.name, indices)
        in_order = self.whole_pages(idx)
        if in_order is not None:
            distinct: torch.Tensor = torch.unique(in_order)  # NOTE: sorted, as the general path below returns them
            if distinct.numel() == in_order.numel() and int(distinct[0]) >= self.pool.base:
                return distinct
        lo, hi = torch.aminmax(idx)
        if int(lo) < self.page_size or int(hi) >= self.data.numel():
            raise OutOfRange(
                op,
                self.pool.name,
                idx[(idx < self.page_size) | (idx >= self.data.numel())].tolist(),
                f"token index outside [{self.page_size}, {self.data.numel()})",
            )
        pages = torch.div(idx, self.page_size, rounding_mode="floor")
        tokens, named = torch.unique(idx, return_counts=True)
        if tokens.numel() != idx.numel():  # NOTE: a page's count can come out whole with one token twice, one not
            twice = tokens[named > 1]
            raise InvalidArgument(
                op,
                self.pool.name,
                torch.unique(torch.div(twice, self.page_size, rounding_mode="floor")).tolist(),
                f"token indices {twice.tolist()[:8]} named twice in one call",
            )
        uniq: torch.Tensor
        counts: torch.Tensor
        uniq, counts = torch.unique(pages, return_counts=True)
        if uniq.numel() * self.page_size != idx.numel() or bool((counts != self.page_size).any()):
            partial = uniq[counts != self.page_size].tolist() or uniq.tolist()
            raise PageAlignmentError(
                op, self.pool.name, partial, f"indices cover {idx.numel()} tokens, not whole pages of {self.page_size}"
            )
        return uniq

    def free(self, indices: torch.Tensor, owner: Owner) -> None:
        """Return whole pages (given as token indices) from ``owner``."""
        host = self._host_pages(indices)
        if host is not None and self.pool.claim(host[0], owner, distinct=host[1], op="free"):
            self.pool.release(host[0])
            return
        pages = self.pages_of("free", indices)  # NOTE: in range and distinct: only the owner is left to check
        self.pool.check_held("free", pages, owner)
        self.pool.release(pages)

    def transfer(self, indices: torch.Tensor, src: Owner, dst: Owner) -> None:
        """Hand whole pages (given as token indices) from ``src`` to ``dst``."""
        self.pool.transfer(self.pages_of("transfer", indices), src, dst)

    def write_fingerprint(self, slots: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor) -> None:
        """Write the KV of ``tokens`` at ``positions`` into token ``slots`` (checked as ``check_kv_write``)."""
        s, t, p = check_kv_write("write_fingerprint", self.pool.name, slots, tokens, positions, *self._span())
        self.data[s] = fingerprint_unchecked(t, p)

    def verify(self, slots: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor) -> None:
        """Raise ``IntegrityError`` unless token ``slots`` hold exactly ``tokens`` at ``positions``."""
        s, t, p = check_kv_write("verify", self.pool.name, slots, tokens, positions, *self._span())
        verify(self.pool.name, self.data, s, t, p)

    def _span(self) -> tuple[torch.device, int, int]:
        return self.device, self.page_size, self.data.numel()


def not_int64_1d(t: torch.Tensor) -> bool:
    """``t`` is not a dense 1-D int64 tensor."""
    return t.dtype != torch.int64 or t.layout != torch.strided or t.dim() != 1 or t.is_meta


def swa_owner(owner: Owner) -> Owner:
    """Who holds the SWA slots of ``owner``'s full slots: a tree node's SWA component, else the same owner."""
    if getattr(owner, "kind", None) is OwnerKind.NODE:
        return Owner(owner.kind, owner.ident, Component.SWA)
    return owner


class SWATokenAllocator:
    """A full KV pool paired with a sliding-window (SWA) pool (SGLang's ``SWATokenToKVPoolAllocator``).

    Every allocated full slot gets an SWA slot; ``full_to_swa`` maps one to the
    other (0: none). When tokens fall out of the window, ``free_swa`` returns
    their SWA slots while the full slots stay (an SWA tombstone).
    """

    page_size = 1

    def __init__(self, size: int, swa_size: int, *, device: str | torch.device = "cpu") -> None:
        self.full = TokenAllocator(size, device=device, name="kv")
        self.swa = TokenAllocator(swa_size, device=device, name="swa")
        self.device = self.full.device
        self.full_to_swa = torch.zeros(self.full.pool.size, dtype=torch.int64, device=self.device)

    @property
    def capacity(self) -> int:
        return self.full.capacity

    def available_size(self) -> int:
        """Tokens allocatable now: limited by both pools."""
        return min(self.full.available_size(), self.swa.available_size())

    def alloc(self, n: int, owner: Owner) -> torch.Tensor:
        """``n`` full slots, each with an SWA slot, for ``owner`` (both or neither)."""
        self.full.pool.check_alloc(n, owner)
        self.swa.pool.check_alloc(n, swa_owner(owner))
        out = self.full.alloc(n, owner)
        self.full_to_swa[out] = self.swa.alloc(n, swa_owner(owner))
        return out

    def translate(self, full_indices: torch.Tensor) -> torch.Tensor:
        """SWA slots of ``full_indices`` (a 1-D integer tensor of full slots; 0 where the SWA slot was freed)."""
        idx = check_ids_tensor("translate", "swa", "full_indices", full_indices, self.device)
        check_range("translate", "kv", "full slot", idx, self.full.pool.base, self.full.pool.size)
        out: torch.Tensor = self.full_to_swa[idx]
        return out

    def _live_swa(self, idx: torch.Tensor) -> torch.Tensor:
        s = self.full_to_swa[idx]
        return s[s != 0]

    def free(self, indices: torch.Tensor, owner: Owner) -> None:
        """Return full slots and whatever SWA slots they still have."""
        idx = self.full.pool.as_index("free", indices)
        self.full.pool.check_held("free", idx, owner)
        live = self._live_swa(idx)
        if live.numel():
            self.swa.pool.check_held("free", live, swa_owner(owner))
            self.swa.pool.release(live)
        self.full_to_swa[idx] = 0
        self.full.pool.release(idx)

    def free_swa(self, indices: torch.Tensor, owner: Owner) -> None:
        """Return only the SWA slots of ``indices`` (out of the window); the full slots stay with ``owner``."""
        idx = self.full.pool.as_index("free_swa", indices)
        self.full.pool.check_held("free_swa", idx, owner)
        swa = self.full_to_swa[idx]
        if bool((swa == 0).any()):
            raise InvalidArgument(
                "free_swa", "swa", idx[swa == 0].tolist(), "full slots without an SWA slot (SWA double free)"
            )
        self.swa.pool.check_held("free_swa", swa, swa_owner(owner))
        self.swa.pool.release(swa)
        self.full_to_swa[idx] = 0

    def transfer(self, indices: torch.Tensor, src: Owner, dst: Owner) -> None:
        """Hand full slots and their live SWA slots from ``src`` to ``dst``."""
        idx = self.full.pool.as_index("transfer", indices)
        self.full.pool.check_held("transfer", idx, src)
        live = self._live_swa(idx)
        if live.numel():
            self.swa.pool.check_held("transfer", live, swa_owner(src))
        self.full.pool.transfer(idx, src, dst)
        if live.numel() and swa_owner(src) != swa_owner(dst):
            self.swa.pool.transfer(live, swa_owner(src), swa_owner(dst))

    def write_fingerprint(self, slots: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor) -> None:
        """Write KV into the full slots and their SWA slots."""
        s, t, p = check_kv_write("write_fingerprint", "kv", slots, tokens, positions, *self.full._span())
        self.full.write_fingerprint(s, t, p)
        live = self.full_to_swa[s]
        mask = live != 0
        self.swa.data[live[mask]] = self.full.data[s[mask]]

    def verify(self, slots: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor) -> None:
        """Verify the full slots (SWA slots where present must match too)."""
        s, t, p = check_kv_write("verify", "kv", slots, tokens, positions, *self.full._span())
        self.full.verify(s, t, p)
        live = self.full_to_swa[s]
        mask = live != 0
        if bool(mask.any()):
            verify("swa", self.swa.data, live[mask], t[mask], p[mask])
