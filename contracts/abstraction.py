"""Abstraction functions: implementation state -> spec state.

Small and explicit (STYLE.md rule 12). A pool's abstraction is the spec
:class:`~kvledger.spec.ledger.Ledger` whose free set is the slots tagged free
and whose owners are the decoded tags. The core conformance check is
``abstract(after) == spec.step(abstract(before), op)``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from kvledger.impl.allocators import PagedAllocator, SWATokenAllocator, TokenAllocator
from kvledger.impl.mamba import MambaPool
from kvledger.impl.owners import FREE_TAG, RESERVED_TAG, decode
from kvledger.impl.req_to_token import ReqToTokenPool
from kvledger.impl.slots import SlotPool
from kvledger.spec.ledger import Ledger
from kvledger.spec.types import Owner

AnyPool = TokenAllocator | PagedAllocator | SWATokenAllocator | MambaPool | ReqToTokenPool


def ledger_of(pool: SlotPool) -> Ledger:
    """The spec ledger a ``SlotPool`` stands for (a whole-pool pass: slow tier)."""
    free: list[int] = []
    groups: dict[int, list[int]] = {}
    for slot, tag in enumerate(pool.owner_tag[pool.base :].tolist(), pool.base):
        if tag == FREE_TAG:
            free.append(slot)
        else:
            groups.setdefault(tag, []).append(slot)
    held: dict[Owner, frozenset[int]] = {}
    for tag, slots in groups.items():
        owner = decode(tag)
        if owner is not None:  # a reserved tag inside the pool's range is nobody's: conservation reports it
            held[owner] = frozenset(slots)
    return Ledger(pool.name, pool.capacity, frozenset(free), held, pool.base)


def free_stack_of(pool: SlotPool) -> frozenset[int]:
    """The slots on the free stack, as a set."""
    return frozenset(pool.free_slots().cpu().tolist())


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


STRUCTURE_LAWS: tuple[tuple[type, Callable[[Any], bool], str], ...] = (
    (SWATokenAllocator, inv_swa_mapping, "inv_swa_mapping"),
)
"""Whole-structure laws of an allocator beyond its pools' ledgers (tier ``slow`` checks them after each call):
the kind of allocator each applies to, the law, its name."""


def broken_structure_laws(alloc: object) -> list[str]:
    """The :data:`STRUCTURE_LAWS` that ``alloc`` breaks now, each as ``"name: what it states"``. The conformance
    machines ask after every step, at any contract tier: their pools are small, so a whole-structure check costs
    little there."""
    return [
        f"{name}: {(law.__doc__ or '').strip()}"
        for kind, law, name in STRUCTURE_LAWS
        if isinstance(alloc, kind) and not law(alloc)
    ]


def inv_free_stack_matches_tags(pool: SlotPool) -> bool:
    """The free stack holds each free-tagged slot exactly once and nothing else."""
    stack = pool.free_slots().cpu()
    tagged_free = int((pool.owner_tag[pool.base :] == FREE_TAG).sum())
    return (
        stack.numel() == tagged_free
        and torch.unique(stack).numel() == stack.numel()
        and bool((pool.owner_tag[pool.free_slots()] == FREE_TAG).all())
    )


def pools_of(obj: AnyPool) -> dict[str, SlotPool]:
    """Every ``SlotPool`` inside an allocator or pool object, by ledger name."""
    if isinstance(obj, SWATokenAllocator):
        return {"kv": obj.full.pool, "swa": obj.swa.pool}
    return {obj.pool.name: obj.pool}


def abstract(obj: AnyPool) -> dict[str, Ledger]:
    """The spec ledgers of every pool inside ``obj``."""
    return {name: ledger_of(p) for name, p in pools_of(obj).items()}
