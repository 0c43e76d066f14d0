"""Replay: check a recorded trace against the spec alone (no implementation needed).

:func:`replay` reads a trace (:mod:`kvledger.contracts.trace.format`) as a stream
and keeps only spec state: the cached content (``spec.prefix.PrefixCache``),
the lock table (``spec.locks.LockState``), one ``spec.ledger.Ledger`` per
pool (``kv`` in token slots, ``mamba``), the fingerprint last written to each
KV slot, and the LRU links the trace reported. Owners are ``request(r)`` for
request ``r`` and, since a trace names no tree nodes, one owner for the
whole tree per pool (``node(0, full)`` for KV, ``node(0, mamba)`` for states).

Each event is applied as the spec transition it observes, and what the
implementation returned must be what the spec allows:

* ``alloc_kv`` / ``alloc_mamba``: ``spec.ledger.allocate`` (fresh slots, in
  the pool, ``n`` of them); a refusal only when fewer than ``n`` are free
  (full-attention KV only: an SWA pool is not in the trace);
* ``free_kv`` / ``free_mamba``: ``spec.ledger.free`` by the owner (no double
  free, no freeing another's slot);
* ``write_kv``: only into held slots; records ``fingerprint(token, pos)``;
* ``match_prefix`` / ``lock``: results equal ``spec.prefix.match_prefix``;
  a lock's coverage includes ``required_coverage``, covers only cached sites,
  the handle id is fresh, and ``lock_delta`` is +1 on the coverage exactly;
* ``unlock``: ``spec.locks.dec_lock_ref`` of a live handle (a second unlock
  is a violation), ``lock_delta`` -1 on its coverage exactly;
* ``insert``: results equal ``spec.prefix.insert``; the pages the cache took
  pass from the request to the tree (the request must hold them) and hold the
  fingerprints of their tokens (``inv_content``); duplicates the cache freed
  itself (``dups_freed``) must be duplicates, and go from the request to the
  free list;
* ``evict`` (and evictions inside ``mamba_cow``): ``evict_mamba``,
  ``evict_full``, ``evict_swa`` with the live locks (nothing locked, only
  leaves, states first), in whichever components the implementation evicted
  from (an SWA eviction may delete an unlocked leaf whole, as SGLang's does);
  freed slots go from the tree back to the free list; an ``evict`` of ``n``
  removes at least ``n`` or everything evictable
  (``spec.prefix.evictable_size``) and returns what it removed;
* ``mamba_cow``: on a live handle whose match had a state; the new slot is
  allocated to the request; lock counters end where they began;
* ``lru``: the links after applying the delta obey ``inv_lru_detached`` and
  ``inv_lru_links_symmetric``; with ``cached``, the list holds exactly the
  nodes holding that component's content (``inv_lru_members``);
* ``sizes`` (on any tree operation): the implementation's ``(evictable,
  protected)`` counters equal ``spec.prefix.evictable_size`` /
  ``protected_size`` under the live locks (``inv_sizes``).

Each transition runs its spec precondition (``check_*``: the typed error it
raises names the rule); the spec's postconditions guarantee (and, with
``contracts=True`` / ``kvledger replay --contracts``, re-check at each step)
that every law of ``spec.prefix``, ``spec.locks`` and ``spec.ledger`` holds
after each step.

Not checkable from a trace: which pages each LRU node holds (a trace names
nodes only by id; ``cached`` is the implementation's own account), eviction
*order* (least recently used first), SWA pool accounting, a refused
allocation in a model with SWA, and data integrity of slots written outside
``write_kv``.

Memory stays flat in the trace's length: besides the spec state (bounded by
the pools), the replay keeps the last few events of each slot, key, handle
and request in a bounded LRU (:class:`History`), and released handle ids in a
bounded window (handle ids are assumed increasing: an id at or below the
highest seen that is not live counts as released).
"""

from __future__ import annotations

import inspect
import io
import os
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from kvledger.contracts.trace.arguments import check_count
from kvledger.contracts.trace.format import SYSTEM_OPS, Event, Header, TraceFormatError, first_repeat, read_trace
from kvledger.contracts.trace.pools import SparseLedger
from kvledger.contracts.trace.system_replay import (
    LEDGER_RULES,
    SYSTEM_LAWS,
    SYSTEM_NEEDS,
    SystemReplayer,
    Violated,
    system_unchecked,
)
from kvledger.spec import ledger as L
from kvledger.spec import locks as K
from kvledger.spec import lru as U
from kvledger.spec import prefix as P
from kvledger.spec.errors import ArgumentError, KVLedgerError
from kvledger.spec.locks import Coverage, Key, LockSite
from kvledger.spec.types import Component, HandleId, NodeId, Owner, node, request

FULL, SWA, MAMBA = Component.FULL, Component.SWA, Component.MAMBA
TREE_KV: Owner = node(0, FULL)
TREE_MAMBA: Owner = node(0, MAMBA)
RESULTS = "results equal the spec's"
EVICT_ENOUGH = "eviction frees what was asked (or all it can)"
LOCKS = "inv_lock_ref_counts_handles"
EVICTIONS = "evictions legal (spec evict_*)"
REFUSAL = "allocation refused only when short"
COVERAGE = "lock coverage beyond required_coverage"
DELTA = "lock_delta (counters moved by each operation)"
LRU_LAWS = ("inv_lru_detached", "inv_lru_links_symmetric", "inv_lru_members")
CACHE_LAWS = (
    "inv_single_owner",
    "inv_slots_conserved",
    RESULTS,
    "inv_content",
    "inv_slots_distinct",
    LOCKS,
    "inv_locked_cached",
    EVICTIONS,
    EVICT_ENOUGH,
    REFUSAL,
    COVERAGE,
    DELTA,
    *LRU_LAWS,
    "inv_sizes",
)
"""What a cache replay checks, each when the trace holds its data."""
_DATA: dict[str, tuple[str | None, str]] = {
    "inv_lru_detached": ("lru", "LRU links (lru events)"),
    "inv_lru_links_symmetric": ("lru", "LRU links (lru events)"),
    "inv_lru_members": ("lru", "LRU members (lru events with 'cached')"),
    "inv_sizes": ("sizes", "size counters ('sizes' fields)"),
    COVERAGE: ("locks", "lock coverage ('coverage' on lock events)"),
    DELTA: ("locks", "lock counters ('lock_delta' fields)"),
    EVICT_ENOUGH: ("locks", "an evict with the lock coverage recorded"),
    REFUSAL: (None, "a refused alloc_kv in a model without SWA (with SWA, its pool may be what is short)"),
}
"""Per optional law: the capability a recording lists when it holds the law's data, and what that data is."""
NEVER_IN_A_CACHE_TRACE = (
    ("eviction order (LRU)", "a trace names no node's pages, so which node is least recently used is unknown"),
    ("SWA pool accounting", "an SWA pool's slots are not in a cache trace"),
)

_RULE_OF_ERROR = {
    **LEDGER_RULES,
    "InvalidArgument": RESULTS,
    "DoubleUnlock": LOCKS,
    "UnknownHandle": LOCKS,
    "HandleReused": LOCKS,
    "BadCoverage": LOCKS,
    "EvictLockedError": "inv_locked_cached",
    "NotCached": EVICTIONS,
    "EvictInteriorError": EVICTIONS,
    "EvictHoldsStateError": EVICTIONS,
    "ComponentDisabled": RESULTS,
    "SlotConflict": "inv_slots_distinct",
    "LengthMismatch": RESULTS,
    "UnalignedKey": "inv_page_aligned",
}


_CHECKS: dict[Callable[..., Any], Callable[..., Any]] = {
    P.insert: P.check_insert,
    P.evict_full: P.check_evict_full,
    P.evict_swa: P.check_evict_swa,
    P.evict_mamba: P.check_evict_mamba,
    K.inc_lock_ref: K.check_inc_lock_ref,
    K.dec_lock_ref: K.check_dec_lock_ref,
}
_BARE: dict[Callable[..., Any], Callable[..., Any]] = {f: inspect.unwrap(f) for f in (*_CHECKS, P.match_prefix)}


class History:
    """The last ``per_subject`` events of each subject (slot, key, handle, request), for at most ``max_subjects``."""

    def __init__(self, per_subject: int = 6, max_subjects: int = 4096) -> None:
        self.per_subject = per_subject
        self.max_subjects = max_subjects
        self._log: OrderedDict[str, deque[tuple[int, str]]] = OrderedDict()

    def note(self, subject: str, step: int, text: str) -> None:
        log = self._log.get(subject)
        if log is None:
            log = self._log[subject] = deque(maxlen=self.per_subject)
            if len(self._log) > self.max_subjects:
                self._log.popitem(last=False)
        else:
            self._log.move_to_end(subject)
        log.append((step, text))

    def of(self, subject: str) -> list[str]:
        return [f"step {s}: {t}" for s, t in self._log.get(subject, ())]

    def __len__(self) -> int:
        return len(self._log)


@dataclass
class Violation:
    """The first event the spec does not allow: where, which rule, why, and who held what since when."""

    step: int
    line: int
    op: str
    rule: str
    message: str
    history: dict[str, list[str]] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        return {
            "step": self.step,
            "line": self.line,
            "op": self.op,
            "rule": self.rule,
            "message": self.message,
            "history": self.history,
        }


@dataclass
class ReplayResult:
    """How a replay ended: ``ok``, events applied, and the first violation or format error (if any)."""

    header: Header | None
    steps: int
    violation: Violation | None = None
    error: TraceFormatError | None = None
    unchecked: tuple[tuple[str, str], ...] = ()  # (law, why this trace could not check it)
    checked: dict[str, int] = field(default_factory=dict)  # law -> how many times it was checked

    @property
    def ok(self) -> bool:
        return self.violation is None and self.error is None

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else (2 if self.error is not None else 1)

    def to_json(self) -> dict[str, object]:
        return {
            "ok": self.ok,
            "steps": self.steps,
            "adapter": self.header.adapter if self.header else None,
            "model": self.header.config.kind if self.header else None,
            "violation": self.violation.to_json() if self.violation else None,
            "error": self.error.to_json() if self.error else None,
            "checked": dict(self.checked),
            "unchecked": [{"law": law, "reason": why} for law, why in self.unchecked],
        }


_Violated = Violated


def _key(x: list[int]) -> Key:
    return tuple(x)


def _site(x: list[Any]) -> LockSite:
    return (tuple(x[0]), Component(x[1]))


def _order(site: LockSite) -> tuple[Key, str]:
    return site[0], site[1].value


def _ks(k: Key) -> str:
    return "key " + str(list(k))


class Replayer:
    """The spec state of one trace, advanced one event at a time by :meth:`apply`."""

    def __init__(
        self, header: Header, history: History | None = None, released_window: int = 4096, contracts: bool = False
    ) -> None:
        cfg = header.config
        self.contracts = contracts
        self._fp: Callable[[int, int], int] = P.fingerprint if contracts else inspect.unwrap(P.fingerprint)
        self.header, self.cfg = header, cfg
        self.caps = header.capabilities
        self._locks_known = header.capabilities is None or "locks" in header.capabilities
        self.prefix = P.new_prefix_cache(cfg.page_size, cfg.window, cfg.mamba)
        self.locks = K.new_lock_state()
        where = header.ledgers or {}
        kv_base, kv_cap = where.get("kv", (cfg.page_size, cfg.kv_tokens - cfg.kv_tokens % cfg.page_size))
        self.kv = SparseLedger("kv", kv_cap, base=kv_base)
        m_base, m_cap = where.get("mamba", (0, cfg.mamba_slots))
        self.mamba = SparseLedger("mamba", m_cap, base=m_base) if cfg.mamba else None
        self.content: dict[int, int] = {}
        self.handle_match: dict[int, tuple[Key, int, int | None]] = {}
        self.released: deque[int] = deque(maxlen=released_window)
        self.released_set: set[int] = set()
        self.max_handle = -1
        self.max_req = -1
        self.lru: dict[Component, tuple[tuple[NodeId, ...], dict[NodeId, U.Links]]] = {}
        self.history = history if history is not None else History()
        self.checked: Counter[str] = Counter()  # law -> how many times this replay checked it
        self.step = 0
        self.line = 1
        self.op = ""

    # ------------------------------------------------------------ helpers

    def _note(self, subject: str, text: str) -> None:
        self.history.note(subject, self.step, text)

    def _spec(self, call: Callable[[], Any], subjects: Iterable[str] = ()) -> Any:
        try:
            return call()
        except KVLedgerError as err:
            rule = _RULE_OF_ERROR.get(type(err).__name__, RESULTS)
            raise _Violated(rule, f"the spec forbids it: {type(err).__name__}: {err}", subjects) from None

    def _t(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Spec transition ``fn``: with ``contracts``, decorated (every pre- and postcondition); else its
        ``check_*`` predicate (raising the typed error it names) and the bare transition."""
        if self.contracts:
            return fn(*args)
        check = _CHECKS.get(fn)
        if check is not None and (err := check(*args)) is not None:
            raise err
        return _BARE[fn](*args)

    def _own(
        self, led: SparseLedger, src: Owner | None, dst: Owner | None, slots: frozenset[int], subjects: Iterable[str]
    ) -> None:
        """``spec.ledger`` allocate (``src`` None), free (``dst`` None) or transfer of ``slots`` on ``led``.

        The spec's ``check_*`` on the sparse ledger's view decides (its typed error names the rule); with
        ``contracts``, the decorated spec transition also runs on the full ledger (every pre- and
        postcondition, O(capacity)) and must agree with the sparse one.
        """
        full = led.to_ledger() if self.contracts else None
        self.checked["inv_single_owner"] += 1
        self.checked["inv_slots_conserved"] += 1
        err = led.check(src, dst, slots)
        if err is not None:
            rule = _RULE_OF_ERROR.get(type(err).__name__, RESULTS)
            raise _Violated(rule, f"the spec forbids it: {type(err).__name__}: {err}", subjects)
        led.move(src, dst, slots)
        if full is not None:
            if src is None:
                assert dst is not None
                want = L.allocate(full, dst, slots)
            elif dst is None:
                want = L.free(full, src, slots)
            else:
                want = L.transfer(full, src, dst, slots)
            assert led.to_ledger() == want, f"sparse ledger {led.name!r} disagrees with spec.ledger"
        if led.name == "kv" and dst is None:
            for x in slots:
                self.content.pop(x, None)  # freed: what it held means nothing now (memory ~ slots in use)

    def _distinct(self, slots: list[int], rule: str, what: str, subjects: Iterable[str]) -> None:
        again = first_repeat(slots)
        if again is not None:
            raise _Violated(rule, f"{what} names slot {again} twice", [*subjects, f"{self.op} slot {again}"])

    def _req_seen(self, req: int, line: int) -> None:
        if req > self.max_req:
            raise TraceFormatError(line, "a request that allocated earlier in the trace", f"request {req}")

    def _slots_in(self, led: SparseLedger, slots: Iterable[int], line: int) -> frozenset[int]:
        out = frozenset(slots)
        bad = [x for x in out if not led.base <= x < led.base + led.capacity]
        if bad:
            raise TraceFormatError(
                line, f"slots of pool {led.name!r} in [{led.base}, {led.base + led.capacity})", f"slot {min(bad)}"
            )
        return out

    def _pool_mamba(self, line: int) -> SparseLedger:
        if self.mamba is None:
            raise TraceFormatError(line, "no Mamba event: the header's config has mamba false")
        return self.mamba

    def _handle(self, hid: int, line: int, op: str) -> None:
        if hid in self.locks.handles:
            return
        if hid in self.released_set or hid <= self.max_handle:
            raise _Violated(LOCKS, f"{op} of handle {hid}: handle already released", [f"handle {hid}"])
        raise TraceFormatError(line, "a handle returned by an earlier lock", f"handle {hid}")

    def _check_delta(self, op: str, ev: Event, want: dict[LockSite, int], subjects: list[str]) -> None:
        if "lock_delta" not in ev:
            return
        self.checked[DELTA] += 1
        got = {_site(x): x[2] for x in ev["lock_delta"]}
        if got != want:
            moved = sorted(set(got) | set(want), key=_order)
            bad = [
                (list(k), c.value, got.get((k, c), 0), want.get((k, c), 0))
                for k, c in moved
                if got.get((k, c), 0) != want.get((k, c), 0)
            ][:4]
            raise _Violated(
                LOCKS,
                f"{op} moved lock counters other than its handle's coverage: "
                f"(key, component, observed change, spec change) {bad}",
                [*subjects, *(_ks(tuple(b[0])) for b in bad)],
            )

    def _compare_match(self, ev: Event) -> P.MatchResult:
        key = _key(ev["key"])
        want: P.MatchResult = self._spec(lambda: self._t(P.match_prefix, self.prefix, key), [_ks(key)])
        self.checked[RESULTS] += 1
        got = (ev["length"], tuple(ev["slots"]), ev["mamba"])
        if got != (want.length, tuple(want.slots), want.mamba):
            raise _Violated(
                RESULTS,
                f"{ev['op']}({list(key)}) returned length {got[0]} slots {list(got[1])} mamba {got[2]}; "
                f"spec: length {want.length} slots {list(want.slots)} mamba {want.mamba}",
                [_ks(key[:i]) for i in range(self.cfg.page_size, len(key) + 1, self.cfg.page_size)][:6]
                + [f"kv slot {x}" for x in got[1]][:6],
            )
        return want

    def _evicted(self, ev: dict[str, list[list[int]]], op: str) -> None:
        gone_m = frozenset(_key(k) for k in ev.get("mamba", []))
        gone = frozenset(_key(k) for k in ev.get("full", []))
        tomb = frozenset(_key(k) for k in ev.get("swa", []))
        if gone_m:
            mam = self._pool_mamba(self.line)
            subj = [_ks(k) for k in sorted(gone_m)]
            self.prefix, freed = self._spec(lambda: self._t(P.evict_mamba, self.prefix, gone_m, self.locks), subj)
            self._own(mam, TREE_MAMBA, None, frozenset(freed), subj)
            for k in gone_m:
                self._note(_ks(k), f"{op}: Mamba state evicted")
            for x in freed:
                self._note(f"mamba slot {x}", f"{op}: evicted from the tree, free")
        if gone:
            subj = [_ks(k) for k in sorted(gone)]
            self.prefix, freed = self._spec(lambda: self._t(P.evict_full, self.prefix, gone, self.locks), subj)
            self._own(self.kv, TREE_KV, None, frozenset(freed), subj)
            for k in gone:
                self._note(_ks(k), f"{op}: evicted (full)")
            for x in freed:
                self._note(f"kv slot {x}", f"{op}: evicted from the tree, free")
        if tomb:
            subj = [_ks(k) for k in sorted(tomb)]
            self.prefix = self._spec(lambda: self._t(P.evict_swa, self.prefix, tomb, self.locks), subj)
            for k in tomb:
                self._note(_ks(k), f"{op}: SWA tombstone")

    # ------------------------------------------------------------ events

    def _claimed(self, line: int, ev: Event) -> None:
        """The header lists what the trace holds: data its capabilities deny is malformed (the header lies)."""
        if self.caps is None:
            return
        for data, cap in (("op:lru", "lru"), ("sizes", "sizes"), ("coverage", "locks"), ("lock_delta", "locks")):
            here = ev["op"] == "lru" if data == "op:lru" else data in ev
            if here and cap not in self.caps:
                what = "an lru event" if data == "op:lru" else f"field {data!r}"
                raise TraceFormatError(
                    line,
                    f"only what the header's capabilities list ({', '.join(sorted(self.caps))})",
                    f"{what}, but no capability {cap!r}",
                )

    def apply(self, line: int, ev: Event) -> None:
        """Apply one event; raises ``_Violated`` (a spec rule) or :class:`TraceFormatError` (bad input)."""
        self.step, self.line, self.op = ev["step"], line, ev["op"]
        if ev["op"] in SYSTEM_OPS:
            raise TraceFormatError(line, "an event of a cache trace (the header has no 'pools')", repr(ev["op"]))
        self._claimed(line, ev)
        getattr(self, "_on_" + ev["op"])(line, ev)
        if "sizes" in ev:
            self._check_sizes(ev["sizes"])

    def _check_sizes(self, sizes: dict[str, list[int]]) -> None:
        self.checked["inv_sizes"] += 1
        for name, got in sizes.items():
            comp = Component(name)
            want = [P.evictable_size(self.prefix, self.locks, comp), P.protected_size(self.prefix, self.locks, comp)]
            if got != want:
                raise _Violated(
                    "inv_sizes",
                    f"after {self.op}: {name} (evictable, protected) = {tuple(got)}, spec {tuple(want)}",
                )

    def finish(self) -> None:
        """The trace ended (nothing is pending between events of a cache trace)."""

    def _on_alloc_kv(self, line: int, ev: Event) -> None:
        req, n, slots = ev["req"], ev["n"], ev["slots"]
        self.max_req = max(self.max_req, req)
        if slots is None:
            self.checked[REFUSAL] += self.cfg.window is None
            if self.cfg.window is None and n <= self.kv.num_free:
                raise _Violated(
                    "allocation refused only when short",
                    f"alloc_kv of {n} for request {req} refused with {self.kv.num_free} slots free",
                    [f"req {req}"],
                )
            self._note(f"req {req}", f"alloc_kv {n}: refused")
            return
        got = self._slots_in(self.kv, slots, line)
        subj = [f"req {req}", *(f"kv slot {x}" for x in sorted(got))]
        self._distinct(slots, "inv_single_owner", f"alloc_kv of {n} for request {req} returned {slots}: it", subj)
        if len(slots) != n:
            raise _Violated(RESULTS, f"alloc_kv of {n} for request {req} returned {len(slots)} slots {slots}", subj)
        self._own(self.kv, None, request(req), got, subj)
        for x in got:
            self.content.pop(x, None)
            self._note(f"kv slot {x}", f"alloc_kv -> req {req}")
        self._note(f"req {req}", f"alloc_kv {n} -> {slots}")

    def _on_free_kv(self, line: int, ev: Event) -> None:
        req = ev["req"]
        self._req_seen(req, line)
        got = self._slots_in(self.kv, ev["slots"], line)
        subj = [f"req {req}", *(f"kv slot {x}" for x in sorted(got))]
        self._distinct(ev["slots"], "inv_single_owner", f"free_kv by request {req} (a double free)", subj)
        self._own(self.kv, request(req), None, got, subj)
        for x in got:
            self._note(f"kv slot {x}", f"free_kv by req {req} -> free")
        self._note(f"req {req}", f"free_kv {ev['slots']}")

    def _on_alloc_mamba(self, line: int, ev: Event) -> None:
        req, slot = ev["req"], ev["slot"]
        mam = self._pool_mamba(line)
        self.max_req = max(self.max_req, req)
        if slot is None:
            self._note(f"req {req}", "alloc_mamba: refused")
            return
        got = self._slots_in(mam, [slot], line)
        subj = [f"req {req}", f"mamba slot {slot}"]
        self._own(mam, None, request(req), got, subj)
        self._note(f"mamba slot {slot}", f"alloc_mamba -> req {req}")
        self._note(f"req {req}", f"alloc_mamba -> {slot}")

    def _on_free_mamba(self, line: int, ev: Event) -> None:
        req, slot = ev["req"], ev["slot"]
        mam = self._pool_mamba(line)
        self._req_seen(req, line)
        got = self._slots_in(mam, [slot], line)
        subj = [f"req {req}", f"mamba slot {slot}"]
        self._own(mam, request(req), None, got, subj)
        self._note(f"mamba slot {slot}", f"free_mamba by req {req} -> free")
        self._note(f"req {req}", f"free_mamba {slot}")

    def _on_write_kv(self, line: int, ev: Event) -> None:
        slots, tokens, start = ev["slots"], ev["tokens"], ev["start"]
        if len(slots) != len(tokens):
            raise TraceFormatError(line, "write_kv with as many slots as tokens", f"{len(slots)} and {len(tokens)}")
        got = self._slots_in(self.kv, slots, line)
        self._distinct(slots, "inv_content", "write_kv (two tokens' KV into one slot)", [])
        loose = sorted(x for x in got if self.kv.owner_of(x) is None)
        self.checked["inv_content"] += 1
        if loose:
            raise _Violated("inv_content", f"write_kv into free slots {loose[:6]}", [f"kv slot {x}" for x in loose])
        for i, (x, t) in enumerate(zip(slots, tokens, strict=True), start):
            if not (0 <= t < 2**31 and 0 <= i < 2**31):
                raise TraceFormatError(line, "tokens and positions in [0, 2**31)", f"token {t} at {i}")
            self.content[x] = self._fp(t, i)

    def _on_match_prefix(self, line: int, ev: Event) -> None:
        self._compare_match(ev)

    def _on_lock(self, line: int, ev: Event) -> None:
        hid = ev["handle"]
        key = _key(ev["key"])
        m = self._compare_match(ev)
        subj = [f"handle {hid}"]
        if hid in self.locks.handles or hid in self.released_set:
            raise _Violated(LOCKS, f"lock returned handle {hid}, an id already issued", subj)
        need = K.required_coverage(key[: m.length], self.cfg.window, self.cfg.mamba, self.cfg.page_size)
        cov: Coverage = frozenset(_site(x) for x in ev["coverage"]) if "coverage" in ev else need
        self.checked[COVERAGE] += "coverage" in ev
        self.checked[LOCKS] += 1
        self.checked["inv_locked_cached"] += 1
        if not K.covers_required(cov, need):
            missing = sorted(need - cov, key=_order)[:3]
            raise _Violated(
                LOCKS,
                f"handle {hid} on {list(key[: m.length])} does not cover {[(list(k), c.value) for k, c in missing]}",
                subj + [_ks(k) for k, _ in missing],
            )
        held = {FULL: self.prefix.full.keys(), SWA: self.prefix.swa_live, MAMBA: self.prefix.mamba_state.keys()}
        stale = sorted(((k, c) for k, c in cov if k not in held[c]), key=_order)
        if stale:
            raise _Violated(
                "inv_locked_cached",
                f"handle {hid} covers {[(list(k), c.value) for k, c in stale[:3]]}, not held by that component",
                subj + [_ks(k) for k, _ in stale[:4]],
            )
        self.locks = self._spec(lambda: self._t(K.inc_lock_ref, self.locks, HandleId(hid), cov), subj)
        self._check_delta("lock", ev, dict.fromkeys(cov, 1), subj)
        self.handle_match[hid] = (key, m.length, m.mamba)
        self.max_handle = max(self.max_handle, hid)
        self._note(f"handle {hid}", f"lock on {list(key[: m.length])} ({len(cov)} sites)")
        self._note(_ks(key[: m.length]), f"locked by handle {hid}")

    def _on_unlock(self, line: int, ev: Event) -> None:
        hid = ev["handle"]
        self._handle(hid, line, "unlock")
        cov = self.locks.handles[HandleId(hid)]
        subj = [f"handle {hid}"]
        self.checked[LOCKS] += 1
        self.locks = self._spec(lambda: self._t(K.dec_lock_ref, self.locks, HandleId(hid)), subj)
        self.locks = K.LockState(self.locks.handles, self.locks.lock_ref, frozenset())  # bounded: see released
        self._check_delta("unlock", ev, dict.fromkeys(cov, -1), subj)
        key, length, _ = self.handle_match.pop(hid)
        if len(self.released) == self.released.maxlen:
            self.released_set.discard(self.released[0])
        self.released.append(hid)
        self.released_set.add(hid)
        self._note(f"handle {hid}", "unlock")
        self._note(_ks(key[:length]), f"unlocked by handle {hid}")

    def _on_insert(self, line: int, ev: Event) -> None:
        req, key, slots, mamba = ev["req"], _key(ev["key"]), tuple(ev["slots"]), ev["mamba"]
        self.max_req = max(self.max_req, req)
        subj = [f"req {req}", *(f"kv slot {x}" for x in slots)][:8]
        if mamba is not None:
            self._pool_mamba(line)
        want = self._spec(lambda: self._t(P.insert, self.prefix, key, slots, mamba), subj)
        self.checked[RESULTS] += 1
        self.checked["inv_slots_distinct"] += 1
        self.checked["inv_content"] += 1
        got = (ev["prefix_len"], sorted(ev["dup_slots"]), ev["dup_mamba"])
        if got != (want.prefix_len, sorted(want.dup_slots), want.dup_mamba):
            raise _Violated(
                RESULTS,
                f"insert({list(key)}) returned prefix_len {got[0]} dups {got[1]} dup_mamba {got[2]}; "
                f"spec: {want.prefix_len} {sorted(want.dup_slots)} {want.dup_mamba}",
                subj,
            )
        new = sorted(want.state.full.keys() - self.prefix.full.keys(), key=len)
        taken = frozenset(x for k in new for x in want.state.full[k])
        p = self.cfg.page_size
        for k in new:
            for i, x in enumerate(want.state.full[k], len(k) - p):
                if self.content.get(x) != self._fp(k[i], i):
                    raise _Violated(
                        "inv_content",
                        f"insert({list(key)}) caches slot {x} for token {k[i]} at position {i}, "
                        "but it holds other KV (or was never written)",
                        [f"kv slot {x}", _ks(k), f"req {req}"],
                    )
        if taken:
            self._own(self.kv, request(req), TREE_KV, taken, subj)
        self._distinct(ev.get("dups_freed", []), "inv_single_owner", "insert's dups_freed (a double free)", subj)
        freed = frozenset(ev.get("dups_freed", ()))
        if freed:
            if not freed <= set(want.dup_slots):
                raise _Violated(
                    RESULTS,
                    f"insert({list(key)}) freed {sorted(freed - set(want.dup_slots))} itself, not duplicates",
                    subj,
                )
            self._own(self.kv, request(req), None, freed, subj)
            for x in freed:
                self._note(f"kv slot {x}", f"insert: duplicate freed by the cache (req {req})")
        if mamba is not None and key not in self.prefix.mamba_state and self.mamba is not None:
            self._own(self.mamba, request(req), TREE_MAMBA, frozenset({mamba}), [f"req {req}", f"mamba slot {mamba}"])
            self._note(f"mamba slot {mamba}", f"insert: req {req} -> tree at {list(key)}")
        self.prefix = want.state
        for x in taken:
            self._note(f"kv slot {x}", f"insert: req {req} -> tree")
        for k in new:
            self._note(_ks(k), f"cached by insert of req {req}")
        self._note(f"req {req}", f"insert {list(key)} prefix_len {want.prefix_len}")

    def _on_evict(self, line: int, ev: Event) -> None:
        comp = Component(ev["component"])
        on = {FULL, *([SWA] if self.cfg.window is not None else []), *([MAMBA] if self.cfg.mamba else [])}
        if comp not in on:
            raise TraceFormatError(line, f"evict of a component of this model ({', '.join(c.value for c in on)})")
        n, freed = ev["n"], ev["freed"]
        # NOTE: what is evictable depends on the real locks: known only when the trace records them.
        could = P.evictable_size(self.prefix, self.locks, comp) if self._locks_known else 0
        before = self._amount(comp)
        self.checked[EVICTIONS] += 1
        self.checked[EVICT_ENOUGH] += self._locks_known
        self._evicted(ev["evicted"], f"evict {comp.value}")
        removed = before - self._amount(comp)
        if removed < min(n, could) or freed != removed:
            raise _Violated(
                EVICT_ENOUGH,
                f"evict {comp.value} of {n} with {could} evictable removed {removed} and returned {freed} "
                "(it must remove what was asked, or all that can go, and return what it removed)",
                [_ks(_key(k)) for k in ev["evicted"].get(comp.value, [])][:4],
            )

    def _amount(self, comp: Component) -> int:
        """Tokens (FULL, SWA-live) or states (MAMBA) the spec cache holds in ``comp``."""
        if comp is MAMBA:
            return len(self.prefix.mamba_state)
        return self.cfg.page_size * len(self.prefix.full if comp is FULL else self.prefix.swa_live)

    def _on_mamba_cow(self, line: int, ev: Event) -> None:
        hid, req, slot = ev["handle"], ev["req"], ev["slot"]
        self._pool_mamba(line)
        self._handle(hid, line, "mamba_cow")
        self.max_req = max(self.max_req, req)
        subj = [f"handle {hid}", f"req {req}"]
        state = self.handle_match[hid][2]
        if slot is not None and state is None:
            raise _Violated(
                "mamba_copy_on_write (rule)", f"copy-on-write of handle {hid}: its match has no state", subj
            )
        self._evicted(ev.get("evicted", {}), "mamba_cow")
        if slot is not None:
            mam = self._pool_mamba(line)  # after the evictions above
            got = self._slots_in(mam, [slot], line)
            self._own(mam, None, request(req), got, [*subj, f"mamba slot {slot}"])
            self._note(f"mamba slot {slot}", f"mamba_cow of handle {hid} -> req {req}")
        self._check_delta("mamba_cow", ev, {}, subj)
        self._note(f"handle {hid}", f"mamba_cow -> req {req} slot {slot}")

    def _on_lru(self, line: int, ev: Event) -> None:
        comp = Component(ev["component"])
        order = tuple(NodeId(n) for n in ev["order"])
        _, links = self.lru.get(comp, ((), {}))
        for n, p, q in ev["links"]:
            links[NodeId(n)] = (None if p is None else NodeId(p), None if q is None else NodeId(q))
        members = set(order)
        for n in [n for n, ln in links.items() if ln == U.DETACHED and n not in members]:
            del links[n]  # detached and outside: nothing to remember (keeps memory bounded)
        self.lru[comp] = (order, links)
        for n in order:
            links.setdefault(n, U.DETACHED)  # a delta leaves out links equal to the default (none, none)
        lst = U.LruState(order, links, comp)
        self.checked["inv_lru_detached"] += 1
        self.checked["inv_lru_links_symmetric"] += 1
        again = first_repeat(order)
        if again is not None:
            raise _Violated(
                "inv_lru_detached",
                f"{comp.value} list {[int(n) for n in order]} holds node {again} twice",
                [f"lru node {again}"],
            )
        if not U.inv_lru_detached(lst):
            stale = [(int(n), ln) for n, ln in links.items() if n not in members and ln != U.DETACHED][:3]
            raise _Violated(
                "inv_lru_detached",
                f"{comp.value} list {[int(n) for n in order]}: nodes outside it keep links {stale}"
                if stale
                else f"{comp.value} list {[int(n) for n in order]}: links out of order",
                [f"lru node {n}" for n, _ in stale],
            )
        if not U.inv_lru_links_symmetric(lst):
            raise _Violated("inv_lru_links_symmetric", f"{comp.value} list {[int(n) for n in order]}")
        if "cached" in ev:
            self.checked["inv_lru_members"] += 1
            again = first_repeat(ev["cached"])
            if again is not None:
                raise _Violated(
                    "inv_lru_members",
                    f"{comp.value} nodes holding content (the implementation's account) name node {again} twice",
                    [f"lru node {again}"],
                )
        if "cached" in ev and set(ev["cached"]) != members:
            extra, missing = sorted(members - set(ev["cached"])), sorted(set(ev["cached"]) - members)
            raise _Violated(
                "inv_lru_members",
                f"{comp.value} list {[int(n) for n in order]}: holds nodes without {comp.value} content {extra}, "
                f"misses nodes holding it {missing}",
                [f"lru node {n}" for n in (extra + missing)[:4]],
            )
        for n, p, q in ev["links"]:
            self._note(
                f"lru node {n}", f"{comp.value} links ({p}, {q})" + ("" if NodeId(n) in members else ", outside")
            )


def unchecked_rules(header: Header, checked: Mapping[str, int] | None = None) -> tuple[tuple[str, str], ...]:
    """Each law a replay of this trace did not check, with the reason (never in a trace, not recorded, or no
    event carried its data); ``checked``: how often the replay checked each law (``None``: before any event)."""
    done = checked or {}
    if header.system:
        out = list(system_unchecked(header))
        out += [
            (law, SYSTEM_NEEDS.get(law, "no event of the trace exercised it"))
            for law in SYSTEM_LAWS
            if not done.get(law)
        ]
        return tuple(out)
    out = list(NEVER_IN_A_CACHE_TRACE)
    caps = header.capabilities
    for law in CACHE_LAWS:
        if done.get(law):
            continue
        cap, data = _DATA.get(law, (None, ""))
        if caps is not None and cap is not None and cap not in caps:
            out.append((law, f"not recorded: the header's capabilities lack {cap!r} ({data})"))
        else:
            out.append((law, f"no event of the trace carried {data}" if data else "no event of the trace exercised it"))
    return tuple(out)


def replay(
    stream: IO[str], progress: Callable[[int], None] | None = None, every: int = 4096, contracts: bool = False
) -> ReplayResult:
    """Replay the trace on ``stream``; stops at the first violation or format error (never raises for bad input).

    ``progress(bytes_or_events)`` is called every ``every`` events with the
    number of events applied so far. ``contracts``: run the spec transitions
    with their full contracts (postconditions re-checked: slower); by default
    each transition's ``check_*`` precondition runs and the transition itself.
    """
    if isinstance(stream, str | bytes | os.PathLike) or not callable(getattr(stream, "readline", None)):
        raise ArgumentError("replay", "stream", f"must be a text stream (replay_path takes a path), got {stream!r:.40}")
    if isinstance(stream, io.BufferedIOBase | io.RawIOBase):
        raise ArgumentError("replay", "stream", "is a binary stream: open the trace as text (encoding='utf-8')")
    check_count("replay", "every", every, 1)
    header: Header | None = None
    steps = 0
    rep: Replayer | SystemReplayer | None = None
    history = History()
    line = 1
    try:
        header, events = read_trace(stream)
        rep = SystemReplayer(header, history.note) if header.system else Replayer(header, history, contracts=contracts)
        for line, ev in events:
            rep.apply(line, ev)
            steps += 1
            if progress is not None and steps % every == 0:
                progress(steps)
        rep.finish()
    except TraceFormatError as err:
        checked = {law: n for law, n in rep.checked.items() if n} if rep is not None else {}
        unchecked = unchecked_rules(header, checked) if header else ()
        return ReplayResult(header, steps, error=err, unchecked=unchecked, checked=checked)
    except UnicodeDecodeError as err:
        return ReplayResult(header, steps, error=TraceFormatError(line + 1, "UTF-8 text", str(err)[:60]))
    except _Violated as v:
        assert rep is not None
        hist = {s: history.of(s) for s in dict.fromkeys(v.subjects)}
        viol = Violation(rep.step, rep.line, rep.op, v.rule, v.message, hist)
        checked = {law: n for law, n in rep.checked.items() if n}
        return ReplayResult(header, steps, viol, unchecked=unchecked_rules(rep.header, checked), checked=checked)
    if progress is not None:
        progress(steps)
    assert header is not None and rep is not None
    checked = {law: n for law, n in rep.checked.items() if n}
    return ReplayResult(header, steps, unchecked=unchecked_rules(header, checked), checked=checked)


def replay_path(
    path: Path | str, progress: Callable[[int], None] | None = None, contracts: bool = False
) -> ReplayResult:
    """:func:`replay` on a file; an unreadable file is a format error at line 0.

    ``path``: a ``str`` or ``os.PathLike`` (anything else, a file descriptor included, is an ``ArgumentError``).
    """
    if not isinstance(path, str | os.PathLike):
        raise ArgumentError("replay_path", "path", f"must be a str or a path, got {type(path).__name__} {path!r:.40}")
    try:
        with open(path, encoding="utf-8", newline="") as stream:
            return replay(stream, progress, contracts=contracts)
    except OSError as err:
        return ReplayResult(None, 0, error=TraceFormatError(0, "a readable trace file", f"{err.strerror}"))
