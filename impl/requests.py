"""A request and what it owns (SGLang's ``Req`` as the memory manager sees it).

Ownership (``Owner(REQUEST, rid)`` in every pool): its request-table ``row``;
the KV slots in ``row[own_from:alloc_len]`` (positions ``[0, prefix_len)``
are borrowed from the radix cache under ``handle`` when the prefix came from
the tree, or owned when it came from a streaming session); its Mamba state
slot and ping-pong track buffers (``mamba``). A waiting request owns nothing
unless it is being admitted.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from kvledger.impl.locks import LockHandle
from kvledger.impl.mamba import MambaAlloc
from kvledger.spec.types import Owner, request


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    ABORTED = "aborted"


@dataclass(eq=False)
class Request:
    """One request. Lengths are in tokens; ``alloc_len`` is a multiple of the KV page size."""

    rid: int
    tokens: tuple[int, ...]
    session: int | None = None
    status: Status = Status.WAITING
    row: int | None = None
    prefix_len: int = 0  # positions [0, prefix_len) matched (tree: borrowed; session: owned)
    own_from: int = 0  # first row position whose KV slot this request owns
    kv_len: int = 0  # positions with final KV (SGLang's kv_committed_len)
    alloc_len: int = 0  # positions with a slot in the row (SGLang's kv_allocated_len)
    handle: LockHandle | None = None
    mamba: MambaAlloc | None = None
    history: list[str] = field(default_factory=list)

    @property
    def owner(self) -> Owner:
        return request(self.rid)

    def __repr__(self) -> str:
        return (
            f"Request({self.rid}, {self.status.value}, row={self.row}, prefix={self.prefix_len}, "
            f"kv={self.kv_len}/{self.alloc_len}, mamba={self.mamba and self.mamba.slots()})"
        )
