"""Recording any ``SystemAdapter`` as a system trace, observed only through its snapshots.

:class:`AdapterRecorder` drives an engine through the request-level protocol
(:class:`~kvledger.contracts.adapters.system.SystemAdapter`) and, after each
call, writes one ``call`` event and what the call changed, computed from two
snapshots: ``own`` events from the difference of every pool's owner map,
``row`` events from the difference of the request-table rows, and for the
pools whose blocks several requests hold at once (the snapshot's
:class:`~kvledger.contracts.adapters.system.SharedBlocks`, e.g. vLLM's
``ref_cnt``) ``leave``/``join`` events from the difference of each block's
holders, ``count`` events from the difference of the engine's counts and
``queue`` events from the difference of the free queue. Nothing is read
from inside the engine, so the trace of a real engine (SGLang's scheduler,
vLLM's manager) replays against the spec with ``kvledger replay`` exactly as
one of the reference implementation does.

:func:`record_adapter_workload` drives a seeded random scheduler workload (the
system suite's flavour, restricted to the adapter's capabilities).
"""

from __future__ import annotations

import contextlib
import random
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from kvledger.contracts.adapters.protocol import CacheConfig
from kvledger.contracts.adapters.system import StepResult, SystemAdapter, SystemSnapshot
from kvledger.contracts.trace.arguments import SYSTEM_CORE, check_count, check_faults, check_members, check_sink
from kvledger.contracts.trace.format import ENDS, Header, TraceWriter
from kvledger.contracts.trace.recorder import WorkloadResult, drive
from kvledger.spec.errors import KVLedgerError
from kvledger.spec.ledger import Ledger
from kvledger.spec.shared import SharedPool, blocks_of, unheld
from kvledger.spec.types import Component, Owner

PROMPTS: tuple[tuple[int, ...], ...] = ((1, 2, 3, 4), (1, 2, 5, 6), (7, 8))
SESSIONS = (1, 2)
BUDGETS = (64, 16, 2)


class CannotRecord(ValueError):
    """The adapter cannot start a trace: a shared pool not fresh, or a pool both shared and single-owner."""


def _owners(lg: Ledger) -> dict[int, Owner]:
    return {x: o for o, xs in lg.held.items() for x in xs}


def _shared_pools(snap: SystemSnapshot) -> dict[str, SharedPool]:
    return dict(snap.shared.pools) if snap.shared is not None else {}


def _not_fresh(pool: SharedPool) -> str | None:
    """Why ``pool`` is not in the state a trace's shared pool starts from (``None``: it is).

    That state: no block held, every non-sentinel block counted 0 and on the free queue.
    """
    if pool.holders:
        return f"blocks {sorted(pool.holders)[:8]} are held"
    counted = [b for b in blocks_of(pool) if b not in pool.sentinels and pool.counts.get(b, 0) != 0]
    if counted:
        return f"blocks {counted[:8]} have non-zero counts"
    if frozenset(pool.queue) != unheld(pool) or len(set(pool.queue)) != len(pool.queue):
        return "its free queue does not hold exactly the non-sentinel blocks"
    return None


def _diff_blocks(before: SharedPool, after: SharedPool) -> list[tuple[str, dict[str, Any]]]:
    """The ``leave``, ``join``, ``count`` and ``queue`` events that take ``before`` to ``after``."""
    left: dict[Owner, list[int]] = {}
    joined: dict[Owner, list[int]] = {}
    for b in sorted(set(before.holders) | set(after.holders)):
        old, new = Counter(before.holders.get(b, ())), Counter(after.holders.get(b, ()))
        for o in (old - new).elements():
            left.setdefault(o, []).append(b)
        for o in (new - old).elements():
            joined.setdefault(o, []).append(b)
    out: list[tuple[str, dict[str, Any]]] = []
    for op, moved in (("leave", left), ("join", joined)):
        for o in sorted(moved, key=str):
            out.append((op, {"pool": after.name, "holder": str(o), "blocks": moved[o]}))
    counts = [
        [b, after.counts.get(b, 0)]
        for b in sorted(set(before.counts) | set(after.counts))
        if before.counts.get(b, 0) != after.counts.get(b, 0)
    ]
    if counts:
        out.append(("count", {"pool": after.name, "counts": counts}))
    q_old, q_new = set(before.queue), set(after.queue)
    if q_old != q_new:
        out.append(("queue", {"pool": after.name, "joined": sorted(q_new - q_old), "left": sorted(q_old - q_new)}))
    return out


_ENDED_BY = {"finished": "finish", "aborted": "abort"}


def _ended(before: SystemSnapshot, after: SystemSnapshot) -> dict[str, list[int]]:
    """The requests that ended between ``before`` and ``after``, by how: a running request now waiting was
    retracted; one now finished or aborted (or gone from the snapshot) ended so."""
    out: dict[str, list[int]] = {}
    for r, was in sorted(before.requests.items()):
        if was.status not in ("running", "waiting"):
            continue
        now = after.requests.get(r)
        gone = "finished" if was.status == "running" else "aborted"  # NOTE: dropped from the snapshot: it ended
        status = gone if now is None else now.status
        how = "retract" if was.status == "running" and status == "waiting" else _ENDED_BY.get(status)
        if how is not None:
            out.setdefault(how, []).append(r)
    return out


class AdapterRecorder:
    """Drives ``adapter`` call by call and writes each call and its observed effects to ``out``."""

    def __init__(self, adapter: SystemAdapter, out: Path | str | IO[str], *, faults: tuple[str, ...] = ()) -> None:
        check_members("record", "adapter", adapter, SYSTEM_CORE, "system adapter")
        check_sink("record", out)
        faults = check_faults("record", faults)
        self.sys = adapter
        self.snap = adapter.snapshot()
        c = adapter.config
        config = CacheConfig(page_size=c.page_size, window=c.window, mamba=c.mamba, kv_tokens=c.kv_tokens)
        pools = {name: (lg.base, lg.capacity) for name, lg in self.snap.ledgers.items()}
        shared = _shared_pools(self.snap)
        for name, sp in shared.items():
            why = "it is a single-owner ledger too" if name in pools else _not_fresh(sp)
            if why is not None:
                raise CannotRecord(f"{adapter.name}: cannot record shared pool {name!r} from a fresh engine: {why}")
            pools[name] = (sp.base, sp.capacity)
        sentinels = {name: {b: sp.counts.get(b, 0) for b in sorted(sp.sentinels)} for name, sp in shared.items()}
        header = Header(config, adapter.name, adapter.version, None, faults, pools, shared=sentinels or None)
        self.writer = TraceWriter(out, header)
        for row, view in sorted(self.snap.rows.items()):
            self.writer.event("row", row=row, start=0, slots=list(view.slots))

    def close(self) -> None:
        self.writer.close()

    def _emit(self, calls: list[tuple[str, dict[str, Any]]]) -> SystemSnapshot:
        """Write ``calls`` and then what changed since the last snapshot; return the new snapshot."""
        before, after = self.snap, self.sys.snapshot()
        for name, fields in calls:
            self.writer.event("call", name=name, **fields)
        for pool, lg in after.ledgers.items():
            old, new = _owners(before.ledgers[pool]), _owners(lg)
            groups: dict[tuple[str | None, str | None], list[int]] = {}
            for x in sorted(set(old) | set(new)):
                src, dst = old.get(x), new.get(x)
                if src != dst:
                    groups.setdefault(
                        (None if src is None else str(src), None if dst is None else str(dst)), []
                    ).append(x)
            for (src_text, dst_text), slots in sorted(groups.items(), key=lambda g: (str(g[0][0]), str(g[0][1]))):
                self.writer.event("own", pool=pool, slots=slots, src=src_text, dst=dst_text)
        old_shared = _shared_pools(before)
        for pool, sp in _shared_pools(after).items():
            for op, fields in _diff_blocks(old_shared[pool], sp):
                self.writer.event(op, **fields)
        for row, view in sorted(after.rows.items()):
            old_view = before.rows.get(row)
            if old_view is None or old_view.slots != view.slots or old_view.holder != view.holder:
                self.writer.event("row", row=row, start=0, slots=list(view.slots))
        self.snap = after
        return after

    def _run(self, name: str, fields: dict[str, Any], call: Callable[[], Any]) -> Any:
        try:
            out = call()
        except KVLedgerError as err:
            self._emit([(name, {**fields, "error": f"{type(err).__name__}: {err}"})])
            raise
        return out

    def _ids(self, rid: int) -> dict[str, Any]:
        view = self.snap.requests.get(rid)
        sid = view.session if view is not None else None
        return {"req": rid, **({"session": sid} if sid is not None else {})}

    # ------------------------------------------------------------ the calls

    def open_session(self, sid: int) -> None:
        self._run("open_session", {"session": sid}, lambda: self.sys.open_session(sid))
        self._emit([("open_session", {"session": sid})])

    def add_request(self, tokens: tuple[int, ...], sid: int | None = None) -> int:
        fields: dict[str, Any] = {"tokens": list(tokens), **({"session": sid} if sid is not None else {})}
        rid: int = self._run("add_request", fields, lambda: self.sys.add_request(tokens, sid))
        self._emit([("add_request", {**fields, "req": rid})])
        return rid

    def admit(self, budget: int, rid: int | None) -> StepResult:
        before = self.snap
        result = self.sys.admit(budget, rid)
        after = self.sys.snapshot()
        calls = []
        for r, ok in [*((r, True) for r in result.admitted), *((r, False) for r in result.rejected)]:
            b, a = before.requests.get(r), after.requests.get(r)
            calls.append(
                (
                    "admit",
                    {
                        **self._ids(r),
                        "admitted": ok,
                        "prefix_len": a.prefix_len if a is not None else 0,
                        "handles_before": [b.handle] if b is not None and b.handle is not None else [],
                        "handles_after": [a.handle] if a is not None and a.handle is not None else [],
                    },
                )
            )
        self._emit(calls)
        return result

    def extend(self, rid: int, n: int, ahead: int) -> None:
        fields = {**self._ids(rid), "n": n}
        self._run("extend", fields, lambda: self.sys.extend(rid, n, ahead))
        self._emit([("extend", fields)])

    def end(self, op: str, rid: int) -> None:
        """``finish``, ``chunk``, ``retract`` or ``abort`` a request.

        An engine's call may end other requests than ``rid``, or not ``rid`` (SGLang's retraction is a decode step
        whose policy picks its victims): a finish, retract or abort records in ``ended`` the requests the
        snapshots show it ended, by how, so the replay holds exactly those to having released everything."""
        fields = self._ids(rid)
        before = self.snap
        self._run(op, fields, lambda: getattr(self.sys, op)(rid))
        after = self.sys.snapshot()
        view = after.sessions.get(fields.get("session", -1))
        if op in ENDS:
            if view is not None and view.lent_to is None:
                # NOTE: an engine may save an aborted or retracted turn too (SGLang's streaming sessions keep it)
                fields["committed_len"] = view.committed_len
            fields["ended"] = _ended(before, after)
        self._emit([(op, fields)])

    def close_session(self, sid: int) -> None:
        self._run("close_session", {"session": sid}, lambda: self.sys.close_session(sid))
        self._emit([("close_session", {"session": sid})])

    def evict(self, comp: Component, n: int) -> None:
        self.sys.evict(comp, n)
        self._emit([("evict", {"component": comp.value, "n": n})])

    def inject_failure(self) -> None:
        self.sys.inject_failure()
        self._emit([("inject_failure", {})])

    def leak_check(self) -> bool:
        verdict = self.sys.idle_check()
        if verdict is None:
            return True
        fields: dict[str, Any] = {"ok": verdict.ok}
        if verdict.leaked is not None:
            fields["leaked"] = {p: sorted(s) for p, s in verdict.leaked.items() if s}
        self._emit([("leak_check", fields)])
        return verdict.ok


class _Driver:
    """A random scheduler workload over the protocol, restricted to what the adapter can express."""

    def __init__(self, rec: AdapterRecorder, rng: random.Random) -> None:
        self.rec, self.rng = rec, rng
        self.caps = rec.sys.capabilities

    def ids(self, status: str) -> list[int]:
        return [r.rid for r in self.rec.snap.requests.values() if r.status == status]

    def try_admit(self, rid: int) -> None:
        view = self.rec.snap.requests.get(rid)
        if view is not None and view.session is not None:
            slot = self.rec.snap.sessions.get(view.session)
            if slot is not None and slot.lent_to is not None:
                return  # one turn of a session at a time
        self.rec.admit(self.rng.choice(BUDGETS), rid if "targeted_admission" in self.caps else None)

    def step(self) -> str:
        rng, snap = self.rng, self.rec.snap
        x = rng.random()
        running = self.ids("running")
        if x < 0.25 or (not running and x < 0.5):
            sid = rng.choice((None, None, *SESSIONS)) if "sessions" in self.caps else None
            if sid is not None and sid not in snap.sessions:
                self.rec.open_session(sid)
            tokens = rng.choice(PROMPTS) + tuple(rng.randint(1, 3) for _ in range(rng.randint(0, 4)))
            self.try_admit(self.rec.add_request(tokens, sid))
            return "add_request"
        waiting = self.ids("waiting")
        if x < 0.35 and waiting:
            self.try_admit(rng.choice(waiting))
            return "admit"
        if x < 0.55 and running:
            with contextlib.suppress(KVLedgerError):  # pool exhausted, injected failure: recorded with its error
                self.rec.extend(rng.choice(running), rng.randint(1, 3), rng.randint(0, 3))
            return "extend"
        if x < 0.80 and running:
            ops = [op for op in ("finish", "finish", "chunk", "retract", "abort") if op == "finish" or op in self.caps]
            op = rng.choice(ops)
            self.rec.end(op, rng.choice(running))
            return op
        if x < 0.86 and "sessions" in self.caps:
            sid = rng.choice(SESSIONS)
            slot = snap.sessions.get(sid)
            if slot is None:
                return "close_session"
            lender = snap.requests.get(slot.lent_to) if slot.lent_to is not None else None
            if lender is not None and lender.status == "running":
                return "close_session"
            for r in self.ids("waiting"):
                if snap.requests[r].session == sid and "abort" in self.caps:
                    self.rec.end("abort", r)
            self.rec.close_session(sid)
            return "close_session"
        if x < 0.92 and "evict" in self.caps:
            self.rec.evict(rng.choice((Component.FULL, Component.MAMBA)), rng.randint(1, 8))
            return "evict"
        if x < 0.95 and "inject_failure" in self.caps:
            self.rec.inject_failure()
            return "inject_failure"
        self.rec.leak_check()
        return "leak_check"


def record_adapter_workload(
    adapter: SystemAdapter, ops: int, seed: int, path: Path | str | IO[str], *, faults: tuple[str, ...] = ()
) -> WorkloadResult:
    """Drive ``ops`` random scheduler steps (seeded) on ``adapter``, record them to ``path``; a leak check ends it."""
    check_count("record_adapter_workload", "ops", ops)
    check_count("record_adapter_workload", "seed", seed, -(1 << 63))
    rec = AdapterRecorder(adapter, path, faults=faults)
    return drive(_Driver(rec, random.Random(seed)).step, ops, rec.writer, rec.leak_check)


__all__ = ["AdapterRecorder", "CannotRecord", "record_adapter_workload"]
