"""Recording: wrap any :class:`CacheAdapter` and write what it does as a trace (:mod:`kvledger.contracts.trace.format`).

:class:`Recorder` is itself a ``CacheAdapter``: each call is forwarded and
one event with the observed result is appended. What a replay cannot infer
from results alone it takes from the adapter's ``snapshot()``, when the
adapter has the capability:

* evictions (``evict``, and those ``mamba_cow`` does under pressure): the
  keys that left, from a diff of ``snapshot().prefix`` before and after;
* lock coverage (``lock``): the sites the new handle covers, from
  ``snapshot().locks.handles``; and ``lock_delta`` on ``lock``, ``unlock``,
  ``mamba_cow``: how ``snapshot().locks.lock_ref`` moved (capability
  ``locks``);
* LRU links (capability ``lru``, ``lru=True``): an ``lru`` event after each
  operation that changed a list, carrying the order and the links that
  changed (delta-encoded, so a node's dangling links after removal show),
  and the nodes holding that component's content (``cached``, from
  ``snapshot().cached_nodes``: what the list must contain);
* size counters (capability ``sizes``): ``sizes`` on each tree operation, the
  implementation's ``(evictable, protected)`` per component after it.

Pool operations (``alloc_*``, ``free_*``, ``write_kv``) leave the tree as it
was, so they take no snapshot; every tree operation takes one after the call
when LRU links, sizes or lock counters are recorded.

:func:`record_workload` drives a random workload in the cache conformance
machine's flavour (shared prompts, borrow-or-not inserts, lock/unlock, evict,
copy-on-write) through a recorder; :func:`write_synthetic` writes a long,
valid trace without any implementation (for streaming tests and benchmarks).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from kvledger.contracts.adapters.protocol import CacheAdapter, CacheConfig, Inserted, Match, Snapshot
from kvledger.contracts.trace.arguments import CACHE_CORE, check_count, check_faults, check_members, check_sink
from kvledger.contracts.trace.format import Header, TraceWriter
from kvledger.spec import prefix as P
from kvledger.spec.errors import KVLedgerError, LawBroken
from kvledger.spec.locks import LockSite
from kvledger.spec.lru import LruState
from kvledger.spec.types import Component, NodeId

FULL, SWA, MAMBA = Component.FULL, Component.SWA, Component.MAMBA
PROMPTS: tuple[tuple[int, ...], ...] = ((1, 2, 3, 4), (1, 2, 5, 6), (7, 8, 7, 8))


def _site_order(site: LockSite) -> tuple[tuple[int, ...], str]:
    return site[0], site[1].value


def evicted_between(before: P.PrefixCache, after: P.PrefixCache) -> dict[str, list[list[int]]]:
    """What left the cache between two abstract states: pages, SWA-live pages that became tombstones, states."""
    return {
        "full": [list(k) for k in sorted(before.full.keys() - after.full.keys())],
        "swa": [list(k) for k in sorted((before.swa_live & after.full.keys()) - after.swa_live)],
        "mamba": [list(k) for k in sorted(before.mamba_state.keys() - after.mamba_state.keys())],
    }


def lock_delta(before: Mapping[LockSite, int], after: Mapping[LockSite, int]) -> list[list[object]]:
    """How lock counters moved, as trace triples ``[key, component, delta]`` (sorted, zeros left out)."""
    out: list[list[object]] = []
    for key, comp in sorted(set(before) | set(after), key=_site_order):
        d = after.get((key, comp), 0) - before.get((key, comp), 0)
        if d:
            out.append([list(key), comp.value, d])
    return out


class Recorder:
    """A :class:`CacheAdapter` that forwards to ``adapter`` and writes a trace of every call to ``out``."""

    def __init__(
        self, adapter: CacheAdapter, out: Path | str | IO[str], *, lru: bool = True, faults: tuple[str, ...] = ()
    ) -> None:
        check_members("record", "adapter", adapter, CACHE_CORE, "cache adapter")
        check_sink("record", out)
        faults = check_faults("record", faults)
        self.a = adapter
        self.name, self.version = adapter.name, adapter.version
        self.config: CacheConfig = adapter.config
        self.capabilities = adapter.capabilities
        ledgers = adapter.snapshot().ledgers if "ledgers" in adapter.capabilities else {}
        pools = {name: (led.base, led.capacity) for name, led in ledgers.items() if name in ("kv", "mamba")}
        cfg = adapter.config
        if "kv" in pools and cfg.page_size > 1 and cfg.window is None:  # a paged pool's ledger counts pages
            base, cap = pools["kv"]
            pools["kv"] = (base * cfg.page_size, cap * cfg.page_size)
        self._locks = "locks" in adapter.capabilities
        self._lru = lru and "lru" in adapter.capabilities
        self._sizes = {"sizes", "locks"} <= adapter.capabilities  # sizes derive from the lock state
        # NOTE: the header lists what this trace holds, not what the adapter could have recorded: a replay
        # reports a law as checked only when its data is here (and rejects data the header does not list).
        unrecorded = {"lru"} - ({"lru"} if self._lru else set()) | ({"sizes"} - ({"sizes"} if self._sizes else set()))
        header = Header(
            adapter.config, adapter.name, adapter.version, adapter.capabilities - unrecorded, faults, ledgers=pools
        )
        self.writer = TraceWriter(out, header)
        self._snap: Snapshot | None = None  # the adapter's state after the last call, when taken
        self._lru_order: dict[Component, tuple[int, ...]] = {}
        self._lru_links: dict[Component, dict[int, tuple[int | None, int | None]]] = {}
        self._lru_cached: dict[Component, list[int] | None] = {}

    # ------------------------------------------------------------ helpers

    def _state(self) -> Snapshot:
        if self._snap is None:
            self._snap = self.a.snapshot()
        return self._snap

    def _done(self, op: str, fields: dict[str, object], snap: Snapshot | None = None, fresh: bool = False) -> None:
        """Write the event of a finished call, with the sizes and LRU lists after it when the trace records them.

        ``snap``: a snapshot already taken after the call; ``fresh``: the call left the tree as it
        was (pool operations: the last snapshot's prefix, locks and lists still hold). Otherwise a
        snapshot is taken when LRU recording needs one.
        """
        if not fresh and snap is None:
            self._snap = None
            if self._lru:
                snap = self._state()
        if snap is not None and self._sizes and snap.sizes:
            fields["sizes"] = {c.value: list(v) for c, v in snap.sizes.items()}
        self.writer.event(op, **fields)
        if snap is not None and self._lru:
            self._emit_lru(snap.lru, snap.cached_nodes)

    def _emit_lru(
        self, lists: Mapping[Component, LruState], cached: Mapping[Component, frozenset[NodeId]] | None = None
    ) -> None:
        for comp, lst in lists.items():
            order = tuple(int(n) for n in lst.order)
            last = self._lru_links.setdefault(comp, {})
            changed: list[tuple[int, int | None, int | None]] = [
                (int(n), None if p is None else int(p), None if q is None else int(q))
                for n, (p, q) in lst.links.items()
                if last.get(int(n), (None, None)) != (p, q)
            ]
            members = sorted(int(n) for n in cached[comp]) if cached and comp in cached else None
            if changed or order != self._lru_order.get(comp, ()) or members != self._lru_cached.get(comp):
                for n, p, q in changed:
                    last[n] = (p, q)
                self._lru_order[comp] = order
                extra: dict[str, object] = {} if members is None else {"cached": members}
                self._lru_cached[comp] = members
                self.writer.event(
                    "lru", component=comp.value, order=list(order), links=[list(c) for c in changed], **extra
                )

    def close(self) -> None:
        self.writer.close()

    # ------------------------------------------------------------ the adapter protocol

    def alloc_kv(self, req: int, n: int) -> tuple[int, ...] | None:
        got = self.a.alloc_kv(req, n)
        self._done("alloc_kv", {"req": req, "n": n, "slots": None if got is None else list(got)}, fresh=True)
        return got

    def free_kv(self, req: int, slots: tuple[int, ...]) -> None:
        self.a.free_kv(req, slots)
        self._done("free_kv", {"req": req, "slots": list(slots)}, fresh=True)

    def alloc_mamba(self, req: int) -> int | None:
        got = self.a.alloc_mamba(req)
        self._done("alloc_mamba", {"req": req, "slot": got}, fresh=True)
        return got

    def free_mamba(self, req: int, slot: int) -> None:
        self.a.free_mamba(req, slot)
        self._done("free_mamba", {"req": req, "slot": slot}, fresh=True)

    def write_kv(self, slots: tuple[int, ...], tokens: tuple[int, ...], start: int) -> None:
        self.a.write_kv(slots, tokens, start)
        self._done("write_kv", {"slots": list(slots), "tokens": list(tokens), "start": start}, fresh=True)

    def match_prefix(self, key: tuple[int, ...]) -> Match:
        m = self.a.match_prefix(key)
        self._done("match_prefix", {"key": list(key), "length": m.length, "slots": list(m.slots), "mamba": m.mamba})
        return m

    def lock(self, key: tuple[int, ...]) -> tuple[Match, Hashable]:
        before = self._state().locks.lock_ref if self._locks else {}
        self._snap = None
        m, h = self.a.lock(key)
        hid = self.a.handle_id(h)
        fields: dict[str, object] = {
            "key": list(key),
            "handle": hid,
            "length": m.length,
            "slots": list(m.slots),
            "mamba": m.mamba,
        }
        snap = self._state() if self._locks or self._lru else None
        if snap is not None and self._locks:
            cov = snap.locks.handles.get(hid, frozenset())  # type: ignore[call-overload]
            fields["coverage"] = [[list(k), c.value] for k, c in sorted(cov, key=_site_order)]
            fields["lock_delta"] = lock_delta(before, snap.locks.lock_ref)
        self._done("lock", fields, snap)
        return m, h

    def unlock(self, handle: Hashable) -> None:
        before = self._state().locks.lock_ref if self._locks else {}
        self._snap = None
        hid = self.a.handle_id(handle)
        self.a.unlock(handle)
        fields: dict[str, object] = {"handle": hid}
        snap = self._state() if self._locks or self._lru else None
        if snap is not None and self._locks:
            fields["lock_delta"] = lock_delta(before, snap.locks.lock_ref)
        self._done("unlock", fields, snap)

    def handle_id(self, handle: Hashable) -> int:
        return self.a.handle_id(handle)

    def insert(self, req: int, key: tuple[int, ...], slots: tuple[int, ...], mamba: int | None) -> Inserted:
        r = self.a.insert(req, key, slots, mamba)
        fields: dict[str, object] = {
            "req": req,
            "key": list(key),
            "slots": list(slots),
            "mamba": mamba,
            "prefix_len": r.prefix_len,
            "dup_slots": list(r.dup_slots),
            "dup_mamba": r.dup_mamba,
        }
        if r.dups_freed:
            fields["dups_freed"] = list(r.dups_freed)
        self._done("insert", fields)
        return r

    def evict(self, component: Component, n: int) -> int:
        before = self._state().prefix
        self._snap = None
        freed = self.a.evict(component, n)
        after = self._state()
        ev = evicted_between(before, after.prefix)
        self._done("evict", {"component": component.value, "n": n, "freed": freed, "evicted": ev}, after)
        return freed

    def mamba_cow(self, handle: Hashable, req: int) -> int | None:
        before = self._state()
        self._snap = None
        hid = self.a.handle_id(handle)
        slot = self.a.mamba_cow(handle, req)
        after = self._state()
        fields: dict[str, object] = {
            "handle": hid,
            "req": req,
            "slot": slot,
            "evicted": evicted_between(before.prefix, after.prefix),
        }
        if self._locks:
            fields["lock_delta"] = lock_delta(before.locks.lock_ref, after.locks.lock_ref)
        self._done("mamba_cow", fields, after)
        return slot

    def snapshot(self) -> Snapshot:
        self._snap = None  # pool operations keep the last one for the trace; a caller gets a fresh one
        return self._state()


# ---------------------------------------------------------------- a random workload


@dataclass
class WorkloadResult:
    """How a recorded workload went: operations driven, events written, and the error that stopped it (if any).

    ``broken`` is the law an engine's call met broken (:class:`~kvledger.spec.errors.LawBroken`, e.g. a scheduler
    that stopped moving a running request), which stopped the run: a finding, where ``stopped_by`` alone is a
    refusal the workload could not go past."""

    ops: int
    events: int
    stopped_by: str | None = None
    counts: dict[str, int] = field(default_factory=dict)
    broken: str | None = None


@dataclass(eq=False)
class _Held:
    handle: Hashable
    key: tuple[int, ...]
    match: Match


class _Driver:
    def __init__(self, rec: Recorder, rng: random.Random) -> None:
        self.rec, self.rng, self.cfg = rec, rng, rec.config
        self.held: list[_Held] = []
        self.next_req = 1
        self.keys: list[tuple[int, ...]] = []

    def key(self) -> tuple[int, ...]:
        if self.keys and self.rng.random() < 0.4:
            k = self.rng.choice(self.keys) + tuple(self.rng.randint(1, 4) for _ in range(self.rng.randint(0, 2)))
        else:
            k = self.rng.choice(PROMPTS) + tuple(self.rng.randint(1, 4) for _ in range(self.rng.randint(0, 6)))
        return k[: len(k) - len(k) % self.cfg.page_size]

    def req(self) -> int:
        self.next_req += 1
        return self.next_req - 1

    def lock(self, key: tuple[int, ...]) -> _Held:
        m, h = self.rec.lock(key)
        held = _Held(h, key, m)
        self.held.append(held)
        return held

    def unlock(self, held: _Held) -> None:
        self.held.remove(held)
        self.rec.unlock(held.handle)

    def insert(self, key: tuple[int, ...], borrow: bool) -> None:
        if not key:
            return
        req = self.req()
        held = self.lock(key) if borrow else None
        have = held.match.length if held else 0
        slots: tuple[int, ...] = ()
        if len(key) > have:
            got = self.rec.alloc_kv(req, len(key) - have)
            if got is None:
                self.rec.evict(FULL, len(key) - have)
                got = self.rec.alloc_kv(req, len(key) - have)
            if got is None:
                if held:
                    self.unlock(held)
                return
            slots = got
            self.rec.write_kv(slots, key[have:], have)
        state = None
        if self.cfg.mamba:
            state = self.rec.alloc_mamba(req)
            if state is None:
                self.rec.evict(MAMBA, 1)
                state = self.rec.alloc_mamba(req)
            if state is None and "stateless_insert" not in self.rec.capabilities:
                if slots:  # this cache takes no insert without a state: the request gives up
                    self.rec.free_kv(req, slots)
                if held:
                    self.unlock(held)
                return
        offered = (held.match.slots if held else ()) + slots
        r = self.rec.insert(req, key, offered, state)
        rest = tuple(x for x in r.dup_slots if x not in set(r.dups_freed))
        if rest:
            self.rec.free_kv(req, rest)
        if r.dup_mamba is not None:
            self.rec.free_mamba(req, r.dup_mamba)
        if held:
            self.unlock(held)
        self.keys = ([*self.keys, key])[-8:]

    def step(self) -> str:
        x = self.rng.random()
        if x < 0.12:
            self.rec.match_prefix(self.key())
            return "match_prefix"
        if x < 0.27:
            held = self.lock(self.key())
            if self.cfg.mamba and self.rng.random() < 0.5:
                self.cow(held)
            return "lock"
        if x < 0.42 and self.held:
            self.unlock(self.rng.choice(self.held))
            return "unlock"
        if x < 0.80:
            self.insert(self.key(), self.rng.random() < 0.5)
            return "insert"
        if x < 0.92 or not self.cfg.mamba:
            comps = [FULL, *([SWA] if self.cfg.window is not None else []), *([MAMBA] if self.cfg.mamba else [])]
            self.rec.evict(self.rng.choice(comps), self.rng.randint(1, 12))
            return "evict"
        live = [h for h in self.held if h.match.mamba is not None]
        if live:
            self.cow(self.rng.choice(live))
        return "mamba_cow"

    def cow(self, held: _Held) -> None:
        if held.match.mamba is None or "mamba_cow" not in self.rec.capabilities:
            return
        req = self.req()
        slot = self.rec.mamba_cow(held.handle, req)
        if slot is not None:
            self.rec.free_mamba(req, slot)


def record_workload(
    adapter: CacheAdapter,
    ops: int,
    seed: int,
    path: Path | str | IO[str],
    *,
    lru: bool = True,
    faults: tuple[str, ...] = (),
) -> WorkloadResult:
    """Drive ``ops`` random operations (seeded) on ``adapter`` and record them to ``path``.

    If the implementation raises a kvledger error (a fault can make it trip
    over its own integrity checks), recording stops there: the trace holds
    everything up to that call, and ``stopped_by`` says what happened.
    """
    check_count("record_workload", "ops", ops)
    check_count("record_workload", "seed", seed, -(1 << 63))
    rec = Recorder(adapter, path, lru=lru, faults=faults)
    return drive(_Driver(rec, random.Random(seed)).step, ops, rec.writer)


def drive(
    step: Callable[[], str], ops: int, writer: TraceWriter, last: Callable[[], object] | None = None
) -> WorkloadResult:
    """Run ``step`` ``ops`` times (then ``last``), counting what each did, and close ``writer``.

    A kvledger error raised by the implementation, or a law one of its calls met broken
    (:class:`~kvledger.spec.errors.LawBroken`, also in ``broken``), stops the run there; the
    trace keeps everything written up to it and ``stopped_by`` says what happened.
    """
    counts: dict[str, int] = {}
    done, stopped, broken = 0, None, None
    try:
        for done in range(1, ops + 1):  # noqa: B007
            what = step()
            counts[what] = counts.get(what, 0) + 1
        if last is not None:
            last()
    except (KVLedgerError, LawBroken) as err:
        stopped = f"{type(err).__name__}: {err}"
        if isinstance(err, LawBroken):
            from kvledger.contracts.machines.runner import rule_of  # NOTE: on a finding only (it loads Hypothesis)

            broken = rule_of(str(err))
    finally:
        writer.close()
    return WorkloadResult(done, writer.step, stopped, counts, broken)


def write_synthetic(path: Path | str | IO[str], events: int, config: CacheConfig | None = None) -> int:
    """Write a valid trace of about ``events`` events without any implementation (full attention, page 1).

    Each cycle allocates 4 slots, writes and inserts a 4-token key, locks,
    matches and unlocks it, then evicts it: the cache returns to empty, so the
    trace is as long as asked while its state stays small. Returns the events written.
    """
    cfg = config or CacheConfig()
    header = Header(cfg, "kvledger-synthetic", "1", frozenset({"locks"}))
    with TraceWriter(path, header) as w:
        c = 0
        base = cfg.page_size
        slots = list(range(base, base + 4))
        while w.step < events:
            c += 1
            key = [c % 997 + 1, 2, 3, 4]
            w.event("alloc_kv", req=c, n=4, slots=slots)
            w.event("write_kv", slots=slots, tokens=key, start=0)
            w.event("insert", req=c, key=key, slots=slots, mamba=None, prefix_len=0, dup_slots=[], dup_mamba=None)
            cov = [[key[:i], "full"] for i in range(1, 5)]
            delta = [[k, comp, 1] for k, comp in cov]
            w.event("lock", key=key, handle=c, length=4, slots=slots, mamba=None, coverage=cov, lock_delta=delta)
            w.event("match_prefix", key=key, length=4, slots=slots, mamba=None)
            w.event("unlock", handle=c, lock_delta=[[k, comp, -1] for k, comp in cov])
            w.event("evict", component="full", n=4, freed=4, evicted={"full": [key[:i] for i in range(1, 5)]})
        return w.step


__all__ = ["Recorder", "WorkloadResult", "drive", "evicted_between", "lock_delta", "record_workload", "write_synthetic"]
