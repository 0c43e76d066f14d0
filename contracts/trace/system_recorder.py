"""Recording the whole memory manager: requests, admission, sessions and the leak checker, as a system trace.

:class:`SystemRecorder` drives a :class:`~kvledger.impl.memory.MemoryManager`
through the calls a scheduler makes and, after each, writes one ``call``
event (what it was given and returned) and what the call changed, observed
from the outside: ``own`` events from a diff of every pool's owner tags (so
every path that moves a slot is seen, however the implementation moved it)
and ``row`` events from a diff of the request-table rows the call's owners
hold. The diff costs one vectorised comparison per pool and call; an engine
that logs its own allocations can write the same events directly (the format
is in :mod:`kvledger.contracts.trace.format`).

:func:`record_system_workload` drives a random scheduler workload (the
memory-manager suite's flavour: tight admission budgets, speculative
over-allocation, chunked prefill, retract, abort, streaming sessions,
eviction, injected allocation failures, periodic leak checks) through a
recorder; with faults B2–B4 switched on, the trace it writes fails
``kvledger replay`` by the general rules.
"""

from __future__ import annotations

import contextlib
import random
from pathlib import Path
from typing import IO, Any

import torch

from kvledger.contracts.adapters.protocol import CacheConfig
from kvledger.contracts.adapters.reference import ReferenceAdapter
from kvledger.contracts.trace.arguments import check_count, check_faults, check_sink
from kvledger.contracts.trace.format import Header, TraceWriter
from kvledger.contracts.trace.recorder import WorkloadResult, drive
from kvledger.impl.admission import Budget, admit
from kvledger.impl.leaks import check_leaks
from kvledger.impl.memory import MemoryManager
from kvledger.impl.owners import FREE_TAG, decode
from kvledger.impl.requests import Request, Status
from kvledger.spec.errors import ArgumentError, KVLedgerError
from kvledger.spec.types import Component, Owner, OwnerKind, request, session

PROMPTS: tuple[tuple[int, ...], ...] = ((1, 2, 3, 4), (1, 2, 5, 6), (7, 8))
SESSIONS = (1, 2)
BUDGETS = (64, 16, 2)  # prefill token budgets: roomy, tight, too small


def _owner_text(tag: int) -> str | None:
    owner = decode(tag)
    return None if owner is None else str(owner)


class SystemRecorder:
    """Drives ``mm`` call by call and writes each call and its observed effects to ``out``."""

    def __init__(self, mm: MemoryManager, out: Path | str | IO[str], *, faults: tuple[str, ...] = ()) -> None:
        if not isinstance(mm, MemoryManager):
            raise ArgumentError("record", "mm", f"must be a MemoryManager, got {type(mm).__name__}")
        check_sink("record", out)
        faults = check_faults("record", faults)
        self.mm = mm
        pools = mm.pools()
        config = CacheConfig(
            page_size=mm.page,
            mamba=mm.mamba is not None,
            kv_tokens=mm.kv.pool.capacity * mm.page,
            mamba_slots=mm.mamba.pool.capacity if mm.mamba is not None else 2,
        )
        header = Header(
            config,
            "kvledger-memory-manager",
            ReferenceAdapter.version,
            None,
            faults,
            {name: (p.base, p.capacity) for name, p in pools.items()},
        )
        self.writer = TraceWriter(out, header)
        self._tags = {name: p.owner_tag.clone() for name, p in pools.items()}
        self._rows: dict[int, torch.Tensor] = {}

    def close(self) -> None:
        self.writer.close()

    # ------------------------------------------------------------ observing one call

    def _emit(self, name: str, fields: dict[str, Any], involved: set[Owner]) -> None:
        self.writer.event("call", name=name, **fields)
        touched_rows: set[int] = set()
        for pool_name, pool in self.mm.pools().items():
            tags, prev = pool.owner_tag, self._tags[pool_name]
            changed = torch.nonzero(tags != prev).flatten()
            if not changed.numel():
                continue
            groups: dict[tuple[int, int], list[int]] = {}
            for x, old, new in zip(changed.tolist(), prev[changed].tolist(), tags[changed].tolist(), strict=True):
                groups.setdefault((old, new), []).append(x)
            for (old, new), slots in sorted(groups.items()):
                src, dst = _owner_text(old), _owner_text(new)
                self.writer.event("own", pool=pool_name, slots=slots, src=src, dst=dst)
                involved.update(o for o in (decode(old), decode(new)) if o is not None)
                if pool_name == "req_to_token":
                    touched_rows.update(slots)
            prev[changed] = tags[changed]
        self._emit_rows(touched_rows, involved)

    def _live_len(self, tag: int) -> int:
        """How many positions of a row its holder's KV fills (``alloc_len``): the rest is stale."""
        owner = decode(tag)
        if owner is not None and owner.kind is OwnerKind.REQUEST and owner.ident in self.mm.requests:
            return self.mm.requests[owner.ident].alloc_len
        if owner is not None and owner.kind is OwnerKind.SESSION and owner.ident in self.mm.sessions.slots:
            return self.mm.sessions.slots[owner.ident].alloc_len
        return 0

    def _emit_rows(self, touched: set[int], involved: set[Owner]) -> None:
        """A ``row`` event per row whose live part changed: from the first change to its (new) live end."""
        rows = self.mm.rows
        tags = rows.pool.owner_tag
        for x in [x for x in self._rows if int(tags[x]) == FREE_TAG]:
            del self._rows[x]  # freed: its contents mean nothing now
        candidates = set(touched)
        for o in involved:
            candidates.update(rows.pool.held_by(o).tolist())
        for r in sorted(candidates):
            tag = int(tags[r])
            if tag == FREE_TAG:
                continue
            now = rows.table[r, : self._live_len(tag)].clone()
            old = self._rows.get(r)
            if old is None or r in touched:
                self.writer.event("row", row=r, start=0, slots=now.tolist())
            else:
                common = min(len(old), len(now))
                diff = torch.nonzero(now[:common] != old[:common]).flatten()
                lo = int(diff[0]) if diff.numel() else common
                if lo < len(now) or len(now) != len(old):
                    self.writer.event("row", row=r, start=lo, slots=now[lo:].tolist())
            self._rows[r] = now

    def _run(self, name: str, fields: dict[str, Any], involved: set[Owner], call: Any) -> Any:
        try:
            out = call()
        except KVLedgerError as err:
            self._emit(name, {**fields, "error": f"{type(err).__name__}: {err}"}, involved)
            raise
        return out

    @staticmethod
    def _owners(req: Request) -> set[Owner]:
        return {request(req.rid), *([session(req.session)] if req.session is not None else [])}

    @staticmethod
    def _ids(req: Request) -> dict[str, Any]:
        return {"req": req.rid, **({"session": req.session} if req.session is not None else {})}

    # ------------------------------------------------------------ the calls

    def open_session(self, sid: int) -> None:
        self._run("open_session", {"session": sid}, {session(sid)}, lambda: self.mm.sessions.open(sid))
        self._emit("open_session", {"session": sid}, {session(sid)})

    def add_request(self, tokens: tuple[int, ...], sid: int | None = None) -> Request:
        fields: dict[str, Any] = {"tokens": list(tokens), **({"session": sid} if sid is not None else {})}
        req: Request = self._run("add_request", fields, set(), lambda: self.mm.add_request(tokens, sid))
        self._emit("add_request", {"req": req.rid, **fields}, self._owners(req))
        return req

    def admit(self, req: Request, tokens: int) -> bool:
        before = [req.handle.id] if req.handle is not None else []
        admitted, _, _ = admit(self.mm, [req], Budget(tokens, 1))
        ok = req in admitted
        fields = {
            **self._ids(req),
            "admitted": ok,
            "prefix_len": req.prefix_len,
            "handles_before": before,
            "handles_after": [req.handle.id] if req.handle is not None else [],
        }
        self._emit("admit", fields, self._owners(req))
        return ok

    def extend(self, req: Request, n: int, ahead: int) -> None:
        new = tuple(range(1, n + 1))
        self._run("extend", {**self._ids(req), "n": n}, self._owners(req), lambda: self.mm.extend(req, new, ahead))
        self._emit("extend", {**self._ids(req), "n": n}, self._owners(req))

    def end(self, op: str, req: Request) -> None:
        """``finish``, ``chunk``, ``retract`` or ``abort`` a request."""
        fields = self._ids(req)
        if op == "finish" and req.session is not None:
            fields["committed_len"] = req.kv_len
        self._run(op, fields, self._owners(req), lambda: getattr(self.mm, op)(req))
        self._emit(op, fields, self._owners(req))

    def close_session(self, sid: int) -> None:
        self._run("close_session", {"session": sid}, {session(sid)}, lambda: self.mm.sessions.close(sid))
        self._emit("close_session", {"session": sid}, {session(sid)})

    def evict(self, comp: Component, n: int) -> None:
        self.mm.cache.evict(comp, n)
        self._emit("evict", {"component": comp.value, "n": n}, set())

    def inject_failure(self) -> None:
        self.mm.fail_next += 1
        self._emit("inject_failure", {}, set())

    def leak_check(self) -> bool:
        report = check_leaks(self.mm)
        leaked = {p: sorted(s) for p, s in report.leaked().items() if s}
        self._emit("leak_check", {"ok": report.ok, "leaked": leaked}, set())
        return report.ok


# ---------------------------------------------------------------- a random scheduler workload


class _Driver:
    def __init__(self, rec: SystemRecorder, rng: random.Random) -> None:
        self.rec, self.mm, self.rng = rec, rec.mm, rng

    def live(self, status: Status) -> list[Request]:
        return [r for r in self.mm.requests.values() if r.status is status]

    def end(self, op: str, req: Request) -> None:
        self.rec.end(op, req)
        if req.status in (Status.FINISHED, Status.ABORTED):
            del self.mm.requests[req.rid]  # a scheduler drops ended requests (keeps each step O(live))

    def try_admit(self, req: Request) -> None:
        if req.session is not None and self.mm.sessions.slots[req.session].lent_to is not None:
            return  # one turn of a session at a time
        self.rec.admit(req, self.rng.choice(BUDGETS))

    def step(self) -> str:
        rng, mm = self.rng, self.mm
        x = rng.random()
        running = self.live(Status.RUNNING)
        if x < 0.25 or (not running and x < 0.5):
            sid = rng.choice((None, None, *SESSIONS))
            if sid is not None and sid not in mm.sessions.slots:
                self.rec.open_session(sid)
            tokens = rng.choice(PROMPTS) + tuple(rng.randint(1, 3) for _ in range(rng.randint(0, 4)))
            self.try_admit(self.rec.add_request(tokens, sid))
            return "add_request"
        waiting = self.live(Status.WAITING)
        if x < 0.35 and waiting:
            self.try_admit(rng.choice(waiting))
            return "admit"
        if x < 0.55 and running:
            with contextlib.suppress(KVLedgerError):  # pool exhausted, injected failure: recorded with its error
                self.rec.extend(rng.choice(running), rng.randint(1, 3), rng.randint(0, 3))
            return "extend"
        if x < 0.80 and running:
            op = rng.choice(("finish", "finish", "chunk", "retract", "abort"))
            self.end(op, rng.choice(running))
            return op
        if x < 0.86:
            sid = rng.choice(SESSIONS)
            slot = mm.sessions.slots.get(sid)
            if slot is None:
                return "close_session"
            lender = mm.requests.get(slot.lent_to) if slot.lent_to is not None else None
            if lender is not None and lender.status is Status.RUNNING:
                return "close_session"
            for r in self.live(Status.WAITING):
                if r.session == sid:
                    self.end("abort", r)
            self.rec.close_session(sid)
            return "close_session"
        if x < 0.92:
            comps = [c for c in (Component.FULL, Component.MAMBA) if c in mm.cache.components]
            self.rec.evict(rng.choice(comps), rng.randint(1, 8))
            return "evict"
        if x < 0.95:
            self.rec.inject_failure()
            return "inject_failure"
        self.rec.leak_check()
        return "leak_check"


def record_system_workload(
    mm: MemoryManager, ops: int, seed: int, path: Path | str | IO[str], *, faults: tuple[str, ...] = ()
) -> WorkloadResult:
    """Drive ``ops`` random scheduler steps (seeded) on ``mm`` and record them to ``path``.

    A leak check closes the trace. If the implementation raises a kvledger error
    outside the calls that may fail, recording stops there and ``stopped_by``
    says what happened.
    """
    check_count("record_system_workload", "ops", ops)
    check_count("record_system_workload", "seed", seed, -(1 << 63))
    rec = SystemRecorder(mm, path, faults=faults)
    return drive(_Driver(rec, random.Random(seed)).step, ops, rec.writer, rec.leak_check)


__all__ = ["SystemRecorder", "record_system_workload"]
