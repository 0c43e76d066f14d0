"""Prefill admission as a transaction (SGLang's ``PrefillAdder``; bug B2). Refines :mod:`kvledger.spec.admission`.

For each waiting request, in order: match it (the radix cache, or its
streaming session), lock what matched, get its Mamba state (a copy-on-write
of the matched state, or a fresh one), then check the budget and allocate its
row and the KV of its uncached tokens. If everything fits, the request is
admitted and keeps exactly what it acquired; if anything does not (budget,
pool exhausted after eviction, an injected failure), the attempt is rolled
back: the lock released, the Mamba state freed, nothing kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from kvledger.impl.arguments import check_int
from kvledger.impl.mamba import MambaAlloc
from kvledger.impl.memory import MemoryManager
from kvledger.impl.requests import Request, Status
from kvledger.spec.errors import InvalidArgument, OverAllocation
from kvledger.spec.types import Component


@dataclass(frozen=True)
class Budget:
    """What one prefill batch may still take: uncached tokens and requests (``spec.admission.Budget``)."""

    tokens: int
    requests: int


@dataclass
class Attempt:
    """What an admission attempt has acquired so far (what a rollback must return)."""

    req: Request
    prefix_len: int = 0
    prefix_slots: torch.Tensor | None = None
    mamba: MambaAlloc | None = None
    resumed: bool = False  # a session's memory was lent to the request


def admit(mm: MemoryManager, waiting: list[Request], budget: Budget) -> tuple[list[Request], list[Request], Budget]:
    """Try to admit ``waiting`` (a sequence of ``mm``'s requests) in order; returns (admitted, rejected, budget left).

    Every argument is checked before anything changes (``InvalidArgument`` naming ``admit``): ``mm`` a
    memory manager, ``budget`` a ``Budget`` of ints >= 0, each request one of ``mm``'s.
    """
    waiting = _check_admit(mm, waiting, budget)
    admitted: list[Request] = []
    rejected: list[Request] = []
    for req in waiting:
        if req.status is not Status.WAITING:
            continue
        mm.event("admit", f"req {req.rid}")
        if _try_admit(mm, req, budget):
            admitted.append(req)
            budget = replace(
                budget, tokens=budget.tokens - (len(req.tokens) - req.prefix_len), requests=budget.requests - 1
            )
        else:
            rejected.append(req)
    return admitted, rejected, budget


def _check_manager(op: str, mm: object) -> None:
    """``InvalidArgument`` naming ``op`` unless ``mm`` is a memory manager."""
    if not isinstance(mm, MemoryManager):
        raise InvalidArgument(op, "req_to_token", (), f"expected a MemoryManager, got {type(mm).__name__}")


def _check_admit(mm: MemoryManager, waiting: object, budget: object) -> list[Request]:
    _check_manager("admit", mm)
    if not isinstance(budget, Budget):
        raise InvalidArgument("admit", "budget", (), f"expected a Budget, got {type(budget).__name__} {budget!r:.40}")
    check_int("admit", "budget", "budget.tokens", budget.tokens)
    check_int("admit", "budget", "budget.requests", budget.requests)
    if isinstance(waiting, str | bytes) or not isinstance(waiting, Sequence):
        raise InvalidArgument("admit", "req_to_token", (), f"waiting must be a list of requests, got {waiting!r:.40}")
    reqs = list(waiting)
    # NOTE: each of mm's requests, each once (a batch naming one twice admitted it once and skipped the repeat)
    _own_each_once(mm, reqs)
    return reqs


def _try_admit(mm: MemoryManager, req: Request, budget: Budget) -> bool:
    a = Attempt(req)
    try:
        _acquire(mm, a)
        new = len(req.tokens) - a.prefix_len
        if budget.requests < 1 or new > budget.tokens:
            raise OverAllocation("admit", "budget", (), f"request {req.rid}: {new} new tokens, budget {budget}")
        _commit(mm, a)
        return True
    except OverAllocation:
        rollback(mm, a)
        return False


def _acquire(mm: MemoryManager, a: Attempt) -> None:
    """Match and lock (tree or session) and get the Mamba state; record each step in ``a``."""
    req = a.req
    if req.session is not None:
        mm.sessions.resume(req)  # transfers the session's row, prefix KV and state to the request
        a.resumed, a.prefix_len = True, req.prefix_len
        return
    key = req.tokens[: len(req.tokens) - 1]  # the last token is always computed
    m = mm.cache.match_prefix(mm._tensor(key[: len(key) - len(key) % mm.cache.page_size]))
    req.handle = mm.cache.inc_lock_ref(m.last_node)
    a.prefix_len, a.prefix_slots = m.length, m.indices
    req.prefix_len = req.own_from = m.length
    if mm.mamba is not None:
        if m.mamba_slot is not None:
            state = mm.cache.mamba_copy_on_write(m, req.owner)
            try:
                pp = mm.mamba.ping_pong_size
                if pp:  # NOTE: the track buffers evict too (the matched state is locked): as alloc_mamba's do
                    mm._make_room(Component.MAMBA, pp - mm.mamba.available_size(), f"track buffers for {req.owner}")
                track = tuple(mm.mamba.alloc(pp, req.owner).tolist()) if pp else ()
            except OverAllocation:
                mm._free_mamba_slots(req.owner, (state,))
                raise
            a.mamba = MambaAlloc(state, track)
        else:
            a.mamba = mm.alloc_mamba(req.owner)
        req.mamba = a.mamba


def _commit(mm: MemoryManager, a: Attempt) -> None:
    """Allocate the row and the uncached tokens' KV, fill the row; on failure nothing of this step remains."""
    req = a.req
    if req.session is not None:
        mm.sessions.extend_resumed(req)
    else:
        row = mm.rows.alloc(req.owner) if req.row is None else req.row
        req.row = row
        need = mm.round_up(len(req.tokens)) - req.prefix_len
        try:
            got = mm.alloc_kv(req.owner, need) if need > 0 else mm._tensor([])
        except OverAllocation:
            mm.rows.free(row, req.owner)
            req.row = None
            raise
        if req.prefix_len and a.prefix_slots is not None:
            mm.rows.write(row, 0, a.prefix_slots, req.owner)
        if need > 0:
            mm.rows.write(row, req.prefix_len, got, req.owner)
        req.alloc_len = req.prefix_len + need
        mm.write_kv(req, req.prefix_len, len(req.tokens))
        req.kv_len = len(req.tokens)
    req.status = Status.RUNNING


def rollback(mm: MemoryManager, a: Attempt) -> None:
    """Return everything the attempt acquired: the request is left holding what it held before.

    ``a``: an attempt of one of ``mm``'s requests that is still waiting (a rejected attempt; an admitted request
    is running and its lock, row and state are its own: ``InvalidArgument``, nothing changes)."""
    req = _attempted("rollback", mm, a)
    if req.session is not None:
        if a.resumed:
            mm.sessions.unresume(req)
        return
    if req.handle is not None:
        mm.cache.dec_lock_ref(req.handle)
        req.handle = None
    release_attempt_state(mm, a)
    req.prefix_len = req.own_from = 0


def release_attempt_state(mm: MemoryManager, a: Attempt) -> None:
    """Free the Mamba state a rejected attempt acquired (matching may have copied one: B2's slot)."""
    _attempted("rollback", mm, a)
    if a.mamba is not None:
        mm.free_mamba(a.req.owner, a.mamba)
        a.req.mamba = None


def _attempted(op: str, mm: MemoryManager, a: object) -> Request:
    """``a``'s request, when ``a`` is an ``Attempt`` of one of ``mm``'s waiting requests whose state (if any) is the
    request's own; ``InvalidArgument`` naming ``op`` otherwise."""
    _check_manager(op, mm)
    if not isinstance(a, Attempt):
        raise InvalidArgument(op, "req_to_token", (), f"expected an Attempt, got {type(a).__name__}")
    req = mm.own(op, a.req)
    if req.status is not Status.WAITING:
        raise InvalidArgument(op, "req_to_token", (), f"request {req.rid} is {req.status.value}: no attempt to undo")
    if a.mamba is not None and a.mamba is not req.mamba:
        raise InvalidArgument(op, "mamba", a.mamba.slots(), f"the attempt's Mamba state is not request {req.rid}'s")
    return req


def _own_each_once(mm: MemoryManager, reqs: list[Request]) -> None:
    """``InvalidArgument`` naming ``admit`` unless every one of ``reqs`` is one of ``mm``'s requests, named once."""
    for r in reqs:
        mm.own("admit", r)
    if len({id(r) for r in reqs}) != len(reqs):
        again = next(r for i, r in enumerate(reqs) if any(r is x for x in reqs[:i]))
        raise InvalidArgument("admit", "req_to_token", (), f"request {again.rid} named twice in one batch")
