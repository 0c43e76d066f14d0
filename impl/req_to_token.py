"""The request-to-token table: one row per request, holding its KV slot indices.

Rows are slots of their own pool (SGLang's ``ReqToTokenPool``), so a row has
exactly one owner: a running request or a streaming session that saved it.
``table[row, i]`` is the KV slot of the request's token ``i``.
"""

from __future__ import annotations

import torch

from kvledger.impl.arguments import check_id, check_ids_tensor, check_int, check_range
from kvledger.impl.slots import SlotPool
from kvledger.spec.errors import OutOfRange
from kvledger.spec.types import Owner


class ReqToTokenPool:
    """``size`` rows of ``max_context_len`` slot indices each. Rows refine ``spec.ledger``."""

    def __init__(self, size: int, max_context_len: int, *, device: str | torch.device = "cpu") -> None:
        check_int("create", "req_to_token", "max_context_len", max_context_len, 1, 1 << 24)
        check_int("create", "req_to_token", "size", size, 1, 1 << 24)
        self.pool = SlotPool("req_to_token", size, device=device)
        self.device = self.pool.device
        self.max_context_len = max_context_len
        self.table = torch.zeros((size, max_context_len), dtype=torch.int64, device=self.device)

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

        ``slots``: a 1-D integer tensor of KV slot ids (>= 0) on the pool's device; ``start`` an int column.
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
        check_range("write", "req_to_token", "KV slot id", ids, 0, 1 << 62)
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
