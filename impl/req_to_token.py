"""The request-to-token table: one row per request, holding its KV slot indices.

Rows are slots of their own pool (SGLang's ``ReqToTokenPool``), so a row has
exactly one owner: a running request or a streaming session that saved it.
``table[row, i]`` is the KV slot of the request's token ``i``.
"""

from __future__ import annotations

import numpy as np
import torch

from kvledger.impl.arguments import check_id, check_ids_tensor, check_int, check_range
from kvledger.impl.slots import SlotPool
from kvledger.spec.errors import InvalidArgument, OutOfRange
from kvledger.spec.types import Owner

MAX_SLOT = 1 << 31
"""KV slot ids a row may name lie below this: the int32 index engines' request tables hold (SGLang's
``req_to_token`` is int32), and the most slots a trace header may declare."""


def has_duplicates(ids: torch.Tensor) -> bool:
    """Whether 1-D int64 tensor ``ids`` names a value twice: a set of a short CPU tensor's values, a numpy sort of a
    long one, ``torch.unique`` off the CPU (a few microseconds next to the row write itself)."""
    if ids.is_cpu:
        n = ids.numel()
        if n <= 256:
            return len(set(ids.tolist())) != n
        a = np.sort(ids.numpy())
        return bool((a[1:] == a[:-1]).any())
    return bool(torch.unique(ids).numel() != ids.numel())


class ReqToTokenPool:
    """``size`` rows of ``max_context_len`` slot indices each. Rows refine ``spec.ledger``."""

    def __init__(self, size: int, max_context_len: int, *, device: str | torch.device = "cpu") -> None:
        check_int("create", "req_to_token", "max_context_len", max_context_len, 1, 1 << 24)
        check_int("create", "req_to_token", "size", size, 1, 1 << 24)
        self.pool = SlotPool("req_to_token", size, device=device)
        self.device = self.pool.device
        self.max_context_len = max_context_len
        self.table = torch.zeros((size, max_context_len), dtype=torch.int64, device=self.device)
        self.driven = False
        """Whether a memory manager drives this table (a second one on it would free the first's rows)."""

    def available_size(self) -> int:
        """Free rows."""
        return self.pool.available_size()

    def alloc(self, owner: Owner) -> int:
        """One row for ``owner``. Refines ``spec.ledger.allocate``."""
        return int(self.pool.alloc(1, owner)[0])

    def free(self, row: int, owner: Owner) -> None:
        """Return ``owner``'s row (its contents become meaningless). Refines ``spec.ledger.free``."""
        self.pool.free(self._row("free", row), owner)

    def transfer(self, row: int, src: Owner, dst: Owner) -> None:
        """Hand a row from ``src`` to ``dst`` (a session saving a request's row)."""
        self.pool.transfer(self._row("transfer", row), src, dst)

    def write(self, row: int, start: int, slots: torch.Tensor, owner: Owner) -> None:
        """Write ``slots`` into ``table[row, start:start + len(slots)]``; ``owner`` must hold the row.

        ``slots``: a 1-D integer tensor of distinct KV slot ids in ``[0, MAX_SLOT)`` on the pool's device (a row
        naming one slot at two positions breaks ``spec.ledger.inv_rows_held``); ``start`` an int column. ``slots``
        may be a view of this table (it is copied first).
        """
        r = self._row("write", row)
        start = check_int("write", "req_to_token", "start", start)
        ids = check_ids_tensor("write", "req_to_token", "slots", slots, self.device)
        self.pool.check_held("write", r, owner)
        end = start + ids.numel()
        if end > self.max_context_len:
            raise OutOfRange(
                "write", "req_to_token", [row], f"columns [{start}, {end}) outside [0, {self.max_context_len})"
            )
        check_range("write", "req_to_token", "KV slot id", ids, 0, MAX_SLOT)
        if end - start > 1 and has_duplicates(ids):
            raise InvalidArgument("write", "req_to_token", [row], "a KV slot named twice in one row write")
        if ids.untyped_storage().data_ptr() == self.table.untyped_storage().data_ptr():
            ids = ids.clone()  # NOTE: a view of this table (a row's own prefix): torch refuses overlapping copies
        self.table[row, start:end] = ids

    def read(self, row: int, start: int, end: int) -> torch.Tensor:
        """A copy of ``table[row, start:end]``."""
        self._row("read", row)
        start = check_int("read", "req_to_token", "start", start)
        end = check_int("read", "req_to_token", "end", end)
        if not 0 <= start <= end <= self.max_context_len:
            raise OutOfRange(
                "read", "req_to_token", [row], f"columns [{start}, {end}) outside [0, {self.max_context_len})"
            )
        return self.table[row, start:end].clone()

    def _row(self, op: str, row: int) -> torch.Tensor:
        check_id(op, "req_to_token", "row", row, 0, self.pool.size)
        return torch.tensor([row], dtype=torch.int64, device=self.device)
