"""The leak checker: which slot leaked, who owns it, and which operation gave it that owner.

For every pool it computes what each owner *should* hold from the structures
that reference slots — running and waiting requests (their rows, the KV in
``row[own_from:alloc_len]``, their Mamba state), the radix tree's nodes, the
open sessions — and compares that with what the pool's owner tags say.
``free + running + tree + sessions == capacity`` holds exactly when nothing
leaked. A *leaked* slot is tagged with an owner that does not reference it
(a finished or aborted request, even one whose row still names it, a closed
session, a node that no longer holds it); a
*lost* slot is referenced but tagged otherwise (freed while still in use).
Every finding names the pool, the slot, the recorded owner, and the event
(operation, step, and in debug mode the stack) that gave it that owner.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from kvledger.impl.memory import MemoryManager
from kvledger.impl.owners import FREE_TAG, decode, encode
from kvledger.impl.requests import Status
from kvledger.spec.errors import InvalidArgument
from kvledger.spec.types import Component, Owner, OwnerKind, node


@dataclass(frozen=True)
class Finding:
    """One slot whose tag and references disagree."""

    pool: str
    slot: int
    kind: str  # "leaked" or "lost"
    owner: str  # the owner its tag records ("free" when lost)
    expected: str  # who references it ("nobody" when leaked)
    op: str
    step: int
    stack: str | None = None

    def __str__(self) -> str:
        how = f"given to {self.owner} by {self.op} at step {self.step}"
        if self.kind == "leaked":
            who = "no live structure references it"
            return f"{self.pool} slot {self.slot}: leaked: held by {self.owner} but {who} ({how})"
        return f"{self.pool} slot {self.slot}: lost: referenced by {self.expected} but tagged {self.owner} ({how})"


@dataclass
class PoolCount:
    """``free + running + tree + sessions (+ waiting) == capacity`` for one pool."""

    capacity: int
    free: int
    running: int
    waiting: int
    tree: int
    sessions: int

    @property
    def accounted(self) -> int:
        return self.free + self.running + self.waiting + self.tree + self.sessions


@dataclass
class LeakReport:
    """The verdict: per-pool counts and every disagreeing slot."""

    pools: dict[str, PoolCount] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.findings and all(c.accounted == c.capacity for c in self.pools.values())

    def leaked(self) -> dict[str, set[int]]:
        out: dict[str, set[int]] = {}
        for f in self.findings:
            if f.kind == "leaked":
                out.setdefault(f.pool, set()).add(f.slot)
        return out

    def to_json(self) -> str:
        return json.dumps(
            {
                "ok": self.ok,
                "pools": {k: asdict(v) for k, v in self.pools.items()},
                "findings": [asdict(f) for f in self.findings],
            },
            indent=2,
        )

    def __str__(self) -> str:
        lines = [f"leak check: {'ok' if self.ok else 'LEAK'}"]
        for name, c in self.pools.items():
            lines.append(
                f"  {name}: free {c.free} + running {c.running} + waiting {c.waiting} + tree {c.tree} "
                f"+ sessions {c.sessions} = {c.accounted} of {c.capacity}"
            )
        lines += [f"  {f}" for f in self.findings]
        return "\n".join(lines)


def _check_mm(op: str, mm: object) -> None:
    if not isinstance(mm, MemoryManager):
        raise InvalidArgument(op, "leaks", (), f"expected a MemoryManager, got {type(mm).__name__}")


def expected_owners(mm: MemoryManager) -> dict[str, dict[int, Owner]]:
    """Per pool, slot -> the owner whose structure references it (pages for a paged KV pool)."""
    _check_mm("expected_owners", mm)
    page = mm.page
    out: dict[str, dict[int, Owner]] = {name: {} for name in mm.pools()}
    kv, rows, mam = out["kv"], out["req_to_token"], out.get("mamba")
    for req in mm.requests.values():
        if req.status in (Status.FINISHED, Status.ABORTED):
            continue  # NOTE: an ended request owns nothing: a slot still tagged to it has leaked
        if req.row is not None:
            rows[req.row] = req.owner
            for x in mm.rows.table[req.row, req.own_from : req.alloc_len].tolist():
                kv[x // page] = req.owner
        if req.mamba is not None and mam is not None:
            for x in req.mamba.slots():
                mam[x] = req.owner
    for n in mm.cache.nodes():
        if n is mm.cache.root:
            continue
        for x in n.value.tolist():
            kv[x // page] = node(n.id, Component.FULL)
        if n.mamba_slot is not None and mam is not None:
            mam[n.mamba_slot] = node(n.id, Component.MAMBA)
    for slot in mm.sessions.slots.values():
        if slot.row is not None:
            rows[slot.row] = slot.owner
            for x in mm.rows.table[slot.row, : slot.alloc_len].tolist():
                kv[x // page] = slot.owner
        if mam is not None:
            for x in session_mamba_refs(slot):
                mam[x] = slot.owner
    return out


def session_mamba_refs(slot: object) -> tuple[int, ...]:
    """The Mamba slots a session references (state and track buffers); ``slot`` a ``SessionSlot``."""
    if not hasattr(slot, "sid") or not hasattr(slot, "mamba"):
        raise InvalidArgument("session_mamba_refs", "mamba", (), f"expected a session slot, got {slot!r:.40}")
    m = getattr(slot, "mamba", None)
    return m.slots() if m is not None else ()


def check_leaks(mm: MemoryManager) -> LeakReport:
    """Compare every pool's tags with the structures' references; report each disagreeing slot."""
    _check_mm("check_leaks", mm)
    report = LeakReport()
    running = {r.owner for r in mm.requests.values() if r.status is Status.RUNNING}
    expected = expected_owners(mm)
    for name, pool in mm.pools().items():
        expect = expected[name]
        tags = pool.owner_tag.tolist()
        origin = pool.origin.tolist()
        count = PoolCount(pool.capacity, pool.available_size(), 0, 0, 0, 0)
        for o in expect.values():
            if o.kind is OwnerKind.NODE:
                count.tree += 1
            elif o.kind is OwnerKind.SESSION:
                count.sessions += 1
            elif o in running:
                count.running += 1
            else:
                count.waiting += 1
        for slot in range(pool.base, pool.size):
            tag = tags[slot]
            want = expect.get(slot)
            if tag == FREE_TAG and want is None:
                continue
            if want is not None and tag == encode(want):
                continue
            ev = mm.events.get(origin[slot])
            kind = "lost" if want is not None else "leaked"
            report.findings.append(
                Finding(
                    name,
                    slot,
                    kind,
                    str(decode(tag)) if tag != FREE_TAG else "free",
                    str(want) if want is not None else "nobody",
                    ev.op if ev else "?",
                    ev.step if ev else -1,
                    ev.stack if ev else None,
                )
            )
        report.pools[name] = count
    return report
