"""Named id types and owners shared by every spec module.

Spec state is ids and plain values (STYLE.md rule 2). Each id type below is a
``NewType`` over ``int`` so a signature says which kind of id it takes.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import NewType

SlotId = NewType("SlotId", int)
"""One slot of a pool: a KV token slot, a request row, a Mamba state slot, an SWA slot."""

PageId = NewType("PageId", int)
"""One page of a paged KV pool (``page_size`` consecutive token slots)."""

NodeId = NewType("NodeId", int)
"""One node of the radix prefix cache (the root is node 0)."""

ReqId = NewType("ReqId", int)
"""One request of the scheduler (the engines' ``Req``)."""

SessionId = NewType("SessionId", int)
"""One streaming session (SGLang's ``StreamingSession``)."""

MambaSlot = NewType("MambaSlot", int)
"""One Mamba (SSM) state slot (SGLang's ``mamba_pool_idx``)."""

HandleId = NewType("HandleId", int)
"""One live lock handle returned by ``inc_lock_ref``."""


class Component(enum.Enum):
    """A component of a hybrid radix cache; tree ownership is per component."""

    FULL = "full"
    SWA = "swa"
    MAMBA = "mamba"


class OwnerKind(enum.Enum):
    """Who can hold a slot besides the free list."""

    REQUEST = "req"
    NODE = "node"
    SESSION = "session"


@dataclass(frozen=True, order=True)
class Owner:
    """The holder of a slot other than the free list.

    ``component`` is only meaningful for tree nodes (a node owns its full KV
    slots, its SWA slots and its Mamba state separately); it is ``None`` for
    requests and sessions.
    """

    kind: OwnerKind
    ident: int
    component: Component | None = None

    def __str__(self) -> str:
        suffix = f"/{self.component.value}" if self.component is not None else ""
        return f"{self.kind.value}:{self.ident}{suffix}"


def request(ident: int) -> Owner:
    """The owner that stands for request ``ident``."""
    return Owner(OwnerKind.REQUEST, ident)


def node(ident: int, component: Component = Component.FULL) -> Owner:
    """The owner that stands for radix node ``ident`` in ``component``."""
    return Owner(OwnerKind.NODE, ident, component)


def session(ident: int) -> Owner:
    """The owner that stands for streaming session ``ident``."""
    return Owner(OwnerKind.SESSION, ident)
