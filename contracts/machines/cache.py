"""The conformance state machine for a radix cache behind the adapter protocol.

One rule per spec transition, same names: ``match_prefix``, ``inc_lock_ref``,
``dec_lock_ref``, ``insert`` (a request caches its sequence, borrowing a
locked match or not), ``evict`` (per component), ``mamba_copy_on_write``;
plus the misuse ``double_dec_lock_ref`` (only where the adapter has
``rejects_double_unlock``). In a Mamba model, an insert whose request cannot
get a Mamba state inserts without one where the adapter has
``stateless_insert``, and gives up (slots and lock handed back) where not.
Duplicates the cache freed inside ``insert`` (``Inserted.dups_freed``) are
not freed again. Each rule drives the adapter and the
spec model (:mod:`kvledger.spec.prefix`, :mod:`kvledger.spec.locks`)
together and compares what they return. After every step one snapshot of the
implementation (the abstraction function) is checked against every law:

* pool conservation: ``inv_slots_conserved`` / ``inv_single_owner`` on every
  pool, and ``inv_owners_account`` (requests hold what they were given, tree
  nodes hold exactly the cached slots);
* refinement: the abstract cache equals the spec model (``inv_refines_prefix``)
  and obeys ``inv_prefix``;
* LRU detachment: ``inv_lru_detached``, ``inv_lru_links_symmetric``,
  ``inv_lru_members``; and the same law for the tree itself
  (:mod:`kvledger.spec.tree`): ``inv_tree_detached`` (an evicted node keeps no
  parent or child), ``inv_tree_links_symmetric``, ``inv_tree_acyclic``,
  ``inv_tree_index`` (the cache's index and cursors name only live nodes);
* lock pairing: ``inv_lock_ref_counts_handles``, ``inv_lock_ref_nonnegative``,
  ``inv_handles_match``, ``inv_locked_cached``, ``inv_sizes``;
* data integrity: ``inv_content``.

Requests draw from a few shared prompts with short random suffixes over a tiny
alphabet, and pools are small, so eviction and copy-on-write under pressure
happen within a few steps and counterexamples shrink to a handful of lines.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Set
from dataclasses import dataclass

from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context, target
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
)

from kvledger.contracts.adapters.protocol import CacheAdapter, CacheConfig, Match, Snapshot, policy_components
from kvledger.contracts.machines.probes import count_or_junk
from kvledger.contracts.machines.stable import sampled_from
from kvledger.spec import domains as D
from kvledger.spec import ledger as L
from kvledger.spec import locks as K
from kvledger.spec import lru as U
from kvledger.spec import prefix as P
from kvledger.spec import tree as T
from kvledger.spec.errors import KVLedgerError
from kvledger.spec.ledger import Ledger
from kvledger.spec.types import Component, HandleId, NodeId, OwnerKind, request

FULL, SWA, MAMBA = Component.FULL, Component.SWA, Component.MAMBA
PROMPTS: tuple[tuple[int, ...], ...] = ((1, 2, 3, 4), (1, 2, 5, 6), (7, 8, 7, 8))
suffixes = st.lists(st.integers(1, 4), max_size=6).map(tuple)


@dataclass(frozen=True, eq=False)
class Held:
    """A live lock handle the machine holds, with the key it locked and what the match returned."""

    handle: Hashable
    hid: HandleId
    key: tuple[int, ...]
    match: Match

    def __repr__(self) -> str:
        return f"Held(handle {self.hid} on {self.key[: self.match.length]})"


RULES = (
    "inv_slots_conserved",
    "inv_single_owner",
    "inv_owners_account",
    "inv_refines_prefix",
    "inv_prefix",
    "inv_lru_detached",
    "inv_lru_links_symmetric",
    "inv_lru_members",
    "inv_lru_recency",
    "evicts_lru_first",
    "evicts_enough",
    "evicts_no_more",
    "alloc evicts before it refuses",
    "inv_tree_detached",
    "inv_tree_links_symmetric",
    "inv_tree_acyclic",
    "inv_tree_index",
    "inv_lock_ref_counts_handles",
    "inv_lock_ref_nonnegative",
    "inv_handles_match",
    "inv_locked_cached",
    "inv_sizes",
    "inv_content",
    "inv_mamba_content",
    "results equal the spec's",
    "foreign insert refused",
    "rejected call leaves state unchanged",
    "inv_domain_enforced",
)


def _fail(law: str, detail: str) -> AssertionError:
    return AssertionError(f"{law}: {detail}")


def _released_refusal() -> KVLedgerError:
    """The spec's refusal of a second ``dec_lock_ref`` of a handle issued and then released (a ``DoubleUnlock``, not
    an unknown handle): what an implementation's second release must raise, by class."""
    issued = K.dec_lock_ref(K.inc_lock_ref(K.new_lock_state(), HandleId(1), frozenset()), HandleId(1))
    err = K.check_dec_lock_ref(issued, HandleId(1))
    assert err is not None
    return err


_RELEASED_REFUSAL = _released_refusal()


def machine_for_cache(make: Callable[[], CacheAdapter]) -> type[RuleBasedStateMachine]:
    """A state machine class that checks the caches ``make`` builds against the spec."""

    class CacheConformance(RuleBasedStateMachine):
        handles = Bundle("handles")
        keys = Bundle("keys")

        def __init__(self) -> None:
            super().__init__()
            self.a = make()
            cfg: CacheConfig = self.a.config
            self.cfg = cfg
            self.caps = self.a.capabilities
            self.prefix = P.new_prefix_cache(cfg.page_size, cfg.window, cfg.mamba)
            self.locks = K.new_lock_state()
            self.req_kv: dict[int, set[int]] = {}
            self.req_mamba: dict[int, set[int]] = {}
            self.next_req = 1
            self.released: list[Held] = []
            self._snap: Snapshot | None = None  # valid only until the next adapter call
            self.pressure = 0.0  # the most of any pool held at once (0..1)
            self.depth = 0  # the longest cached key (the radix tree's depth, in tokens)
            self.most_locked = 0  # the most live lock handles at once
            on = (FULL, *([SWA] if cfg.window is not None else []), *([MAMBA] if cfg.mamba else []))
            self.policy = policy_components(self.caps, on)  # the components whose lists and evictions follow it
            self.clock = 0  # ticks of the calls that use the cache (``_use``)
            self.stamps: dict[tuple[int, ...], U.Stamp] = {}  # each cached page's last use, as far as known
            self.written: dict[int, int] = {}  # Mamba slot -> the value its state was given (written or copied)
            self.inserted: list[tuple[int, ...]] = []  # the last eight keys inserted (``insert``'s ``branch``)

        def teardown(self) -> None:
            """Guide the search (``hypothesis.target``) towards full pools, deep trees and many locks."""
            if currently_in_test_context():
                target(self.pressure, label="pool pressure")
                target(float(self.depth), label="tree depth")
                target(float(self.most_locked), label="live lock handles")
            super().teardown()

        # ---------------------------------------------------------- helpers

        def _key(self, prompt: int, suffix: tuple[int, ...]) -> tuple[int, ...]:
            return self._aligned(PROMPTS[prompt] + suffix)

        def _aligned(self, key: tuple[int, ...]) -> tuple[int, ...]:
            """``key`` cut to whole pages."""
            return key[: len(key) - len(key) % self.cfg.page_size]

        def _spec(self, what: str, call: Callable[[], object]) -> object:
            try:
                return call()
            except KVLedgerError as err:
                law = "inv_lock_ref_counts_handles" if "Locked" in type(err).__name__ else "results equal the spec's"
                raise _fail(law, f"the implementation did what spec {what} forbids: {err}") from err

        def _apply_evictions(self, before: P.PrefixCache, after: P.PrefixCache) -> None:
            """Account for whatever the implementation evicted between two snapshots, as spec evictions."""
            gone_states = frozenset(before.mamba_state.keys() - after.mamba_state.keys())
            if gone_states:
                self.prefix = self._spec("evict_mamba", lambda: P.evict_mamba(self.prefix, gone_states, self.locks))[0]  # type: ignore[index]
            gone = frozenset(before.full.keys() - after.full.keys())
            if gone:
                self.prefix = self._spec("evict_full", lambda: P.evict_full(self.prefix, gone, self.locks))[0]  # type: ignore[index]
            tomb = frozenset((before.swa_live & after.full.keys()) - after.swa_live)
            if tomb:
                self.prefix = self._spec("evict_swa", lambda: P.evict_swa(self.prefix, tomb, self.locks))  # type: ignore[assignment]

        def _use(self, key: tuple[int, ...], covered: int, split: int | None = None) -> None:
            """A call at a new tick used ``key``'s first ``covered`` tokens (their pages' stamps become that tick) and
            may have refreshed the rest of the key's cached path and what hangs below where it may have split a
            node (``split``: where an insert met the end of what was cached; a match's end, else where its walk
            ended): their ``hi`` becomes that tick (a cache refreshes the rest of a node it splits). Kept only for a
            cache with capability ``lru_policy``."""
            if not self.policy:
                return
            self.clock = t = self.clock + 1
            ps, full, stamps = self.cfg.page_size, self.prefix.full, self.stamps
            end = 0
            for j in range(ps, len(key) + 1, ps):
                k = key[:j]
                if k not in full:
                    break
                stamps[k] = (t, t) if j <= covered else (stamps.get(k, (0, t))[0], t)
                end = j
            below = key[: (covered or end) if split is None else split]
            if below:
                n = len(below)
                for k in full:
                    if len(k) > n and k[:n] == below:
                        stamps[k] = (stamps.get(k, (0, t))[0], t)

        def _unlocked(self, k: tuple[int, ...], comp: Component) -> bool:
            """No live lock holds page ``k`` in ``comp`` (FULL: in any component, as a page leaves FULL only so)."""
            return all(K.lock_ref_of(self.locks, k, c) == 0 for c in ((FULL, SWA, MAMBA) if comp is FULL else (comp,)))

        def _judge_eviction(self, comp: Component, asked: int | None, snap: Snapshot) -> None:
            """``evicts_enough`` and ``evicts_no_more`` (when ``asked``) and ``evicts_lru_first`` for what ``comp``'s
            eviction took between the snapshot ``snap`` and the model now; then forget the stamps of pages no
            longer cached (``comp``: judged only if it follows the policy)."""
            if not self.policy:
                return
            if comp in self.policy:
                self._judge(comp, asked, snap)
            stamps, now = self.stamps, self.prefix
            for k in [k for k in stamps if k not in now.full]:
                del stamps[k]

        def _judge(self, comp: Component, asked: int | None, snap: Snapshot) -> None:
            before, now, ps = snap.prefix, self.prefix, self.cfg.page_size
            held, left = set(P.cached_in(before, comp)), set(P.cached_in(now, comp))
            took = held - left
            could = sum(1 for k in held if self._unlocked(k, comp))
            inner = {x[:-ps] for x in now.full} if comp is FULL else set()  # NOTE: FULL evicts leaves only
            kept = [k for k in left if k not in inner and self._unlocked(k, comp)]
            unit = 1 if comp is MAMBA else ps
            if asked is not None and not U.evicts_enough(asked, could * unit, len(took) * unit):
                raise _fail(
                    "evicts_enough",
                    f"evict({comp.value}, {asked}) freed {len(took) * unit} though {could * unit} were unlocked",
                )
            if asked is not None and "ledgers" in self.caps:
                last = self._last_units(comp, took, snap)
                if not U.evicts_no_more(asked, len(took) * unit, last.values()):
                    raise _fail(
                        "evicts_no_more",
                        f"evict({comp.value}, {asked}) freed {len(took) * unit}: it needed none of the units it may "
                        f"have taken last (size each) {dict(sorted(last.items()))}",
                    )
            stamps = self.stamps
            gone, stay = [stamps[k] for k in took if k in stamps], [stamps[k] for k in kept if k in stamps]
            if not U.evicts_lru_first(gone, stay):
                newest = max((k for k in took if k in stamps), key=lambda k: stamps[k][0])
                oldest = min((k for k in kept if k in stamps), key=lambda k: stamps[k][1])
                raise _fail(
                    "evicts_lru_first",
                    f"evict({comp.value}) took {newest} (used at tick {stamps[newest][0]}) and kept {oldest} "
                    f"(unlocked, evictable, used last by tick {stamps[oldest][1]})",
                )

        def _last_units(self, comp: Component, took: Set[tuple[int, ...]], snap: Snapshot) -> dict[int, int]:
            """What ``comp``'s eviction of the pages ``took`` may have taken last, each with its size: a Mamba state
            (size 1), else a node (tokens; known by the ``kv`` ledger of ``snap``) of which it took pages, and, for
            FULL, whose parent it kept. Keyed by a state's slot or a node's id."""
            if comp is MAMBA:
                return {snap.prefix.mamba_state[k]: 1 for k in took}
            ps = self.cfg.page_size
            return {
                n: len(ks) * ps
                for n, ks in self._node_pages(snap, took).items()
                if comp is not FULL or min(ks, key=len)[:-ps] not in took
            }

        def _grain(self) -> int:
            """Token slots per unit of the ``kv`` ledger: a paged pool's ledger counts pages."""
            ps = self.cfg.page_size
            return ps if ps > 1 and not self.cfg.window else 1

        def _node_pages(self, snap: Snapshot, pages: Iterable[tuple[int, ...]]) -> dict[NodeId, list[tuple[int, ...]]]:
            """Which tree node holds each of the cached ``pages`` of ``snap`` (by its ``kv`` ledger's node owners):
            node id -> its pages among them."""
            grain, full = self._grain(), snap.prefix.full
            page_of = {full[k][0] // grain: k for k in pages}
            out: dict[NodeId, list[tuple[int, ...]]] = {}
            for o, xs in snap.ledgers["kv"].held.items():
                if o.kind is OwnerKind.NODE and o.component is FULL:
                    mine = [k for x in xs if (k := page_of.get(x)) is not None]
                    if mine:
                        out[NodeId(o.ident)] = mine
            return out

        def _before_snap(self) -> Snapshot:
            """The implementation now (the last invariant check's snapshot when nothing changed since)."""
            snap, self._snap = self._snap, None
            return snap if snap is not None else self.a.snapshot()

        def _compare_match(self, key: tuple[int, ...], got: Match) -> None:
            want = P.match_prefix(self.prefix, key)
            if (got.length, got.slots, got.mamba) != (want.length, tuple(want.slots), want.mamba):
                raise _fail(
                    "results equal the spec's",
                    f"match_prefix({key}) returned length {got.length} slots {got.slots} mamba {got.mamba}; "
                    f"spec: length {want.length} slots {tuple(want.slots)} mamba {want.mamba}",
                )

        def _new_req(self) -> int:
            r = self.next_req
            self.next_req += 1
            self.req_kv[r] = set()
            self.req_mamba[r] = set()
            return r

        def _lock(self, key: tuple[int, ...]) -> Held:
            m, h = self.a.lock(key)
            self._use(key, m.length)
            self._compare_match(key, m)
            hid = HandleId(self.a.handle_id(h))
            cov = self.a.snapshot().locks.handles.get(hid, frozenset()) if "locks" in self.caps else frozenset()
            need = K.required_coverage(key[: m.length], self.cfg.window, self.cfg.mamba, self.cfg.page_size)
            if "locks" in self.caps and not K.covers_required(cov, need):
                missing = sorted(need - cov)[:3]
                raise _fail(
                    "inv_lock_ref_counts_handles", f"handle {hid} on {key[: m.length]} does not cover {missing}"
                )
            self.locks = self._spec("inc_lock_ref", lambda: K.inc_lock_ref(self.locks, hid, cov))  # type: ignore[assignment]
            return Held(h, hid, key, m)

        def _unlock(self, held: Held) -> None:
            self.a.unlock(held.handle)
            self.locks = self._spec("dec_lock_ref", lambda: K.dec_lock_ref(self.locks, held.hid))  # type: ignore[assignment]
            self.released.append(held)

        # ---------------------------------------------------------- rules: one per spec transition

        @initialize(target=keys, prompt=st.integers(0, len(PROMPTS) - 1), suffix=suffixes)
        def cached_at_start(self, prompt: int, suffix: tuple[int, ...]) -> object:
            """Each example starts with a prompt cached (``insert`` as the rule makes it): the rules that take a
            cached key (a returning prefix locked, a copy-on-write, a branch inside it) can run from the first step,
            where Hypothesis' swarm may leave ``insert`` off for a whole example."""
            key = self.insert(prompt, suffix, False)
            return key if key else multiple()

        @rule(prompt=st.integers(0, len(PROMPTS) - 1), suffix=suffixes)
        def match_prefix(self, prompt: int, suffix: tuple[int, ...]) -> None:
            key = self._key(prompt, suffix)
            got = self.a.match_prefix(key)
            self._use(key, got.length)
            self._compare_match(key, got)

        @rule(target=handles, prompt=st.integers(0, len(PROMPTS) - 1), suffix=suffixes)
        def inc_lock_ref(self, prompt: int, suffix: tuple[int, ...]) -> Held:
            return self._lock(self._key(prompt, suffix))

        @rule(target=handles, key=keys, more=suffixes, cow=st.booleans())
        def inc_lock_ref_cached(self, key: tuple[int, ...], more: tuple[int, ...], cow: bool) -> Held:
            """Lock a sequence inserted earlier (maybe extended): the common case of a returning prefix.

            With ``cow``, a Mamba model then copies the matched state for a new
            request, as admission does right after matching.
            """
            held = self._lock(self._aligned(key + more))
            if cow:
                self.mamba_copy_on_write(held)
            return held

        @rule(held=consumes(handles))
        def dec_lock_ref(self, held: Held) -> None:
            self._unlock(held)

        @precondition(lambda self: bool(self.released) and "rejects_double_unlock" in self.caps)
        @rule()
        def double_dec_lock_ref(self) -> None:
            held = self.released[-1]
            before = self.a.snapshot()
            spec_err = _RELEASED_REFUSAL
            try:
                self.a.unlock(held.handle)
            except KVLedgerError as err:
                if not isinstance(err, type(spec_err)):
                    raise _fail(
                        "results equal the spec's",
                        f"second dec_lock_ref of handle {held.hid} refused with {type(err).__name__}: {err}; the "
                        f"spec refuses a released handle with {type(spec_err).__name__}",
                    ) from err
            else:
                raise _fail("inv_lock_ref_counts_handles", f"second dec_lock_ref of handle {held.hid} was accepted")
            after = self.a.snapshot()
            if (after.locks, after.sizes) != (before.locks, before.sizes):
                raise _fail("inv_lock_ref_counts_handles", f"rejected dec_lock_ref of handle {held.hid} changed locks")

        @rule(
            target=keys,
            prompt=st.integers(0, len(PROMPTS) - 1),
            suffix=suffixes,
            borrow=st.booleans(),
            branch=st.none() | st.tuples(st.integers(0, 7), st.integers(0, 15)),
            again=st.booleans(),
        )
        def insert(
            self,
            prompt: int,
            suffix: tuple[int, ...],
            borrow: bool,
            branch: tuple[int, int] | None = None,
            again: bool = False,
        ) -> tuple[int, ...]:
            """Insert a prompt and a suffix; with ``branch`` (``(i, cut)``), the suffix follows the ``i``-th last
            key inserted, left at a point inside it: whatever node holds that point is split, in whatever state it
            is (an SWA tombstone, a Mamba state at its end, locked, the remainder of an earlier split), which
            prompts drawn blind reach only by luck. With ``again`` (capability ``reinserts_cached_state``), the last
            key inserted that the cache still holds with a Mamba state at its end is inserted again offering that
            very state (``spec.prefix.insert``: it stays, nothing comes back), as a request that ran on the cached
            state without copying it would; by then later inserts may have split its path into several nodes."""
            key = self._key(prompt, suffix)
            if branch is not None and self.inserted:
                old = self.inserted[-1 - branch[0] % len(self.inserted)]
                at = branch[1] % len(old)
                key = self._aligned((*old[:at], old[at] % 4 + 1, *suffix))  # NOTE: not ``old[at]`` there
            again = again and "reinserts_cached_state" in self.caps
            if again:  # NOTE: the last key inserted that still has a state at its end, if any
                key = next((k for k in reversed(self.inserted) if k in self.prefix.mamba_state), key)
            if key:
                self._insert(key, borrow, again)
            return key

        def _insert(self, key: tuple[int, ...], borrow: bool, again: bool = False) -> None:
            req = self._new_req()
            held = self._lock(key) if borrow else None
            have = held.match.length if held else 0
            slots: tuple[int, ...] = ()
            if len(key) > have:
                got = self._alloc(req, len(key) - have)
                if got is None:
                    if held:
                        self._unlock(held)
                    return
                slots = got
                self.a.write_kv(slots, key[have:], have)
            cached = self.prefix.mamba_state.get(key) if again else None
            state = cached if cached is not None else self._alloc_state(req) if self.cfg.mamba else None
            if state is None and self.cfg.mamba and "stateless_insert" not in self.caps:
                # NOTE: the cache takes no sequence without its Mamba state: the request gives up (as SGLang's
                # admission would), handing back its new slots and its lock.
                if slots:
                    self.a.free_kv(req, slots)
                    self.req_kv[req] -= set(slots)
                if held:
                    self._unlock(held)
                return
            offered = (held.match.slots if held else ()) + slots
            got_ins = self.a.insert(req, key, offered, state)
            self._snap = None
            want = self._spec("insert", lambda: P.insert(self.prefix, key, offered, state))  # type: ignore[arg-type]
            assert isinstance(want, P.InsertResult)
            if (got_ins.prefix_len, set(got_ins.dup_slots), got_ins.dup_mamba) != (
                want.prefix_len,
                set(want.dup_slots),
                want.dup_mamba,
            ):
                raise _fail(
                    "results equal the spec's",
                    f"insert({key}) returned prefix_len {got_ins.prefix_len} dups {got_ins.dup_slots} "
                    f"dup_mamba {got_ins.dup_mamba}; spec: {want.prefix_len} {want.dup_slots} {want.dup_mamba}",
                )
            if not set(got_ins.dups_freed) <= set(got_ins.dup_slots):
                raise _fail(
                    "results equal the spec's",
                    f"insert({key}) freed {sorted(set(got_ins.dups_freed) - set(got_ins.dup_slots))} itself, "
                    f"which are not duplicates (dups {got_ins.dup_slots})",
                )
            self.prefix = want.state
            self.inserted = [*self.inserted[-7:], key]
            self._use(key, len(key), want.prefix_len)
            self.req_kv[req] -= set(slots) - set(got_ins.dup_slots)
            rest = tuple(x for x in got_ins.dup_slots if x not in set(got_ins.dups_freed))
            if rest:
                self.a.free_kv(req, rest)
            self.req_kv[req] -= set(got_ins.dup_slots)
            if state is not None:
                self.req_mamba[req].discard(state)
                if got_ins.dup_mamba is not None:
                    self.a.free_mamba(req, got_ins.dup_mamba)
            if held:
                self._unlock(held)

        @precondition(lambda self: "rejects_foreign_insert" in self.caps)
        @rule(
            prompt=st.integers(0, len(PROMPTS) - 1),
            suffix=suffixes,
            whose=sampled_from(["another request", "the free list", "the cache"]),
            at=st.lists(st.integers(0, 15), min_size=1, max_size=3),
            part=sampled_from(["kv", "mamba"]),
        )
        def insert_foreign(
            self, prompt: int, suffix: tuple[int, ...], whose: str, at: list[int], part: str = "kv"
        ) -> None:
            """Misuse: a request inserts its sequence offering, among its own slots, pages it does not hold (another
            request's, free ones, cached ones) where the cache would take them, or (``part`` ``mamba``, a cache
            with Mamba states) its own KV with a Mamba state it does not hold. The cache must refuse
            (``spec.ledger.check_transfer``: the slots are not the request's to hand over) and change nothing."""
            key = self._key(prompt, suffix)
            have = P.cached_len(self.prefix, key)  # NOTE: what insert finds cached (its prefix_len), not a match
            ps = self.cfg.page_size
            if len(key) <= have or (self.cfg.mamba and "stateless_insert" not in self.caps):
                return
            req = self._new_req()
            own = self._alloc(req, len(key))
            if own is None:
                return
            self.a.write_kv(own, key, 0)
            if part == "mamba" and self.cfg.mamba:
                self._insert_foreign_state(req, key, own, whose)
                return
            pages = sorted({have // ps + i % ((len(key) - have) // ps) for i in at})  # NOTE: pages of the new part
            victim = None
            if whose == "another request":
                victim = self._new_req()
                theirs = self._alloc(victim, len(pages) * ps)
                foreign = list(theirs or ())
            else:
                snap = self.a.snapshot()
                if whose == "the cache":
                    foreign = [x for xs in snap.prefix.full.values() for x in xs]
                else:
                    grain = ps if ps > 1 and not self.cfg.window else 1
                    free = sorted(snap.ledgers["kv"].free) if "ledgers" in self.caps else []
                    foreign = [u * grain + j for u in free for j in range(grain)] if grain > 1 else free
                    foreign = [x for x in foreign if x not in own]
                foreign = foreign[: len(pages) * ps]
            if len(foreign) == len(pages) * ps:
                offered = list(own)
                for n, pg in enumerate(pages):
                    offered[pg * ps : (pg + 1) * ps] = foreign[n * ps : (n + 1) * ps]
                self._refused_insert(req, key, tuple(offered), whose)
            self.a.free_kv(req, own)
            self.req_kv[req] -= set(own)
            if victim is not None and foreign:
                self.a.free_kv(victim, tuple(foreign))
                self.req_kv[victim] -= set(foreign)

        def _insert_foreign_state(self, req: int, key: tuple[int, ...], own: tuple[int, ...], whose: str) -> None:
            """``insert_foreign`` offering the request's own KV with a Mamba state of ``whose``: another request's,
            a free slot of the Mamba pool, or a state the cache holds."""
            victim = None
            if whose == "another request":
                victim = self._new_req()
                state = self._alloc_state(victim)
            elif whose == "the cache":
                state = min(self.prefix.mamba_state.values(), default=None)
            else:
                led = self.a.snapshot().ledgers.get("mamba") if "ledgers" in self.caps else None
                state = min(led.free, default=None) if led is not None else None
            if state is not None:
                self._refused_insert(req, key, own, whose, state)
            self.a.free_kv(req, own)
            self.req_kv[req] -= set(own)
            if victim is not None and state is not None:
                self.a.free_mamba(victim, state)
                self.req_mamba[victim].discard(state)

        def _refused_insert(
            self, req: int, key: tuple[int, ...], offered: tuple[int, ...], whose: str, state: int | None = None
        ) -> None:
            before = self.a.snapshot()
            try:
                self.a.insert(req, key, offered, state)
            except KVLedgerError as err:
                after = self.a.snapshot()
                if (after.prefix, after.ledgers, after.locks, after.sizes) != (
                    before.prefix,
                    before.ledgers,
                    before.locks,
                    before.sizes,
                ):
                    raise _fail(
                        "rejected call leaves state unchanged",
                        f"refused insert({key}) of request {req} with {'slots' if state is None else 'a Mamba state'} "
                        f"of {whose} changed the cache: {err}",
                    ) from err
                return
            what = f"slots {offered} (some of {whose}" if state is None else f"Mamba state {state} (of {whose}"
            raise _fail(
                "foreign insert refused", f"request {req} inserted {key} offering {what}, not its own): accepted"
            )

        def _alloc(self, req: int, n: int) -> tuple[int, ...] | None:
            got = self.a.alloc_kv(req, n)
            if got is None:
                self.evict(FULL, n)
                got = self.a.alloc_kv(req, n)
            if got is not None:
                self.req_kv[req] |= set(got)
            return got

        def _alloc_state(self, req: int) -> int | None:
            got = self.a.alloc_mamba(req)
            if got is None and self.cfg.mamba:
                self.evict(MAMBA, 1)
                got = self.a.alloc_mamba(req)
            if got is not None:
                self.req_mamba[req].add(got)
                self.a.write_mamba(got, P.fingerprint(req, 0))
                self.written[got] = P.fingerprint(req, 0)
            return got

        @rule(comp=sampled_from([FULL, SWA, MAMBA]), n=st.integers(1, 12))
        def evict(self, comp: Component, n: int) -> None:
            on = {FULL, *([SWA] if self.cfg.window is not None else []), *([MAMBA] if self.cfg.mamba else [])}
            if comp not in on:
                return
            snap = self._before_snap()
            self.a.evict(comp, n)
            self._apply_evictions(snap.prefix, self.a.snapshot().prefix)
            self._judge_eviction(comp, n, snap)

        @precondition(lambda self: "rejects_bad_arguments" in self.caps)
        @rule(comp=sampled_from([FULL, SWA, MAMBA]), n=count_or_junk(0, 12))
        def evict_bad(self, comp: Component, n: object) -> None:
            """``evict`` with a count drawn from anywhere (negative, a bool, a float, past int64), or of a
            component the cache does not have: outside its domain (``spec.domains.is_amount``) it is refused with
            a typed error and changes nothing (``inv_domain_enforced``)."""
            on = {FULL, *([SWA] if self.cfg.window is not None else []), *([MAMBA] if self.cfg.mamba else [])}
            if comp in on and D.is_amount(n):
                return
            before = self.a.snapshot()
            try:
                self.a.evict(comp, n)  # type: ignore[arg-type]
            except Exception as err:  # NOTE: any exception: an untyped one breaks the law too
                if not D.inv_domain_enforced(False, err):
                    raise _fail("inv_domain_enforced", f"evict({comp.value}, {n!r}) raised {err!r}") from err
            else:
                raise _fail("inv_domain_enforced", f"evict({comp.value}, {n!r}) lies outside its domain, was accepted")
            after = self.a.snapshot()
            if (after.prefix, after.ledgers, after.locks) != (before.prefix, before.ledgers, before.locks):
                raise _fail("rejected call leaves state unchanged", f"refused evict({comp.value}, {n!r}) changed it")

        @precondition(lambda self: "mamba_cow" in self.caps)
        @rule(held=handles)
        def mamba_copy_on_write(self, held: Held) -> None:
            if "mamba_cow" not in self.caps or held.match.mamba is None or held in self.released:
                return
            req = self._new_req()
            snap = self._before_snap()
            # NOTE: SGLang makes a copy-on-write at a match (``finalize_match_result``, inside ``match_prefix``), so
            # it may refresh the copied prefix's path as a match does; the reference's, made apart, does not: no
            # page surely used (``covered`` 0), nothing below it (``split`` 0)
            self._use(held.key[: held.match.length], 0, split=0)
            slot = self.a.mamba_cow(held.handle, req)
            self._apply_evictions(snap.prefix, self.a.snapshot().prefix)
            self._judge_eviction(MAMBA, None, snap)
            if slot is None:
                self._cow_refused(held, snap)
            else:
                source = held.match.mamba
                if "mamba_content" in self.caps and source in self.written:
                    got = self.a.snapshot().mamba_content.get(slot)
                    if got != self.written[source]:
                        raise _fail(
                            "inv_mamba_content",
                            f"copy-on-write of state {source} (holding {self.written[source]}) into slot {slot}: "
                            f"the copy holds {got}",
                        )
                    self.written[slot] = self.written[source]
                self.req_mamba[req].add(slot)
                self.a.free_mamba(req, slot)
                self.req_mamba[req].discard(slot)

        def _cow_refused(self, held: Held, snap: Snapshot) -> None:
            """``alloc evicts before it refuses`` for a copy-on-write that gave no slot (the protocol: ``None`` only
            when impossible): before it, no Mamba slot was free and every cached state but the one it copies was
            locked (that one stays: the copy is made from it)."""
            led = snap.ledgers.get("mamba") if "ledgers" in self.caps else None
            free = sorted(led.free) if led is not None else []
            src = held.key[: held.match.length]
            open_ = sorted(k for k in P.cached_in(snap.prefix, MAMBA) if k != src and self._unlocked(k, MAMBA))
            if free or open_:
                raise _fail(
                    "alloc evicts before it refuses",
                    f"mamba_copy_on_write of {held} gave no slot with Mamba slots {free[:4]} free and the states of "
                    f"{open_[:3]} unlocked",
                )

        # ---------------------------------------------------------- the laws, on one snapshot per step

        @invariant()
        def inv_all_laws(self) -> None:
            snap = self.a.snapshot()
            self._snap = snap
            self.depth = max(self.depth, max(map(len, snap.prefix.full), default=0))
            self.most_locked = max(self.most_locked, len(self.locks.handles))
            for led in snap.ledgers.values():
                if led.capacity:
                    self.pressure = max(self.pressure, 1 - len(led.free) / led.capacity)
            if "ledgers" in self.caps:
                self._check_ledgers(snap)
            if snap.prefix != self.prefix:
                raise _fail("inv_refines_prefix", _prefix_diff(snap.prefix, self.prefix))
            if not P.inv_prefix(snap.prefix):
                raise _fail("inv_prefix", "the abstract cache breaks a prefix law")
            if "lru" in self.caps:
                self._check_lru(snap)
            if "tree" in self.caps and snap.tree is not None:
                self._check_tree(snap.tree)
            if "locks" in self.caps:
                self._check_locks(snap)
            if "mamba_content" in self.caps:
                for k, state in snap.prefix.mamba_state.items():
                    want, got = self.written.get(state), snap.mamba_content.get(state)
                    if want is not None and got != want:
                        what = f"cached state {state} of {k} holds {got}, its request wrote {want}"
                        raise _fail("inv_mamba_content", what)
            if "content" in self.caps and not P.inv_content(snap.prefix, snap.content):  # type: ignore[arg-type]
                bad = [
                    (k, x)
                    for k, xs in snap.prefix.full.items()
                    for i, x in enumerate(xs, len(k) - self.cfg.page_size)
                    if snap.content.get(x) != P.fingerprint(k[i], i)
                ]
                raise _fail("inv_content", f"cached slots hold another token's KV: {bad[:3]}")

        def _check_ledgers(self, snap: Snapshot) -> None:
            ps = self.cfg.page_size
            for name, led in snap.ledgers.items():
                if not L.inv_slots_conserved(led):
                    raise _fail("inv_slots_conserved", f"pool {name!r}: {len(led.free)} free + held != {led.capacity}")
                if not L.inv_single_owner(led):
                    raise _fail("inv_single_owner", f"pool {name!r}: a slot has two holders or none")
            kv = snap.ledgers["kv"]
            grain = self._grain()

            def unit(xs: Iterable[int]) -> set[int]:
                return {x // grain for x in xs}

            for r, slots in self.req_kv.items():
                if L.held_by(kv, request(r)) != unit(slots):
                    raise _fail(
                        "inv_owners_account",
                        f"request {r} holds {sorted(L.held_by(kv, request(r)))} "
                        f"in 'kv', expected {sorted(unit(slots))}",
                    )
            tree = _node_held(kv, FULL)
            cached = unit(x for xs in snap.prefix.full.values() for x in xs)
            if tree != cached:
                raise _fail(
                    "inv_owners_account",
                    f"tree nodes hold {sorted(tree ^ cached)[:6]} in 'kv' that are not "
                    "cached, or cached slots no node holds (leak or double ownership)",
                )
            if "mamba" in snap.ledgers:
                mam = snap.ledgers["mamba"]
                states = set(snap.prefix.mamba_state.values())
                if _node_held(mam, MAMBA) != states:
                    raise _fail(
                        "inv_owners_account",
                        f"tree holds Mamba slots {sorted(_node_held(mam, MAMBA))}, cached states are {sorted(states)}",
                    )
                for r, ms in self.req_mamba.items():
                    if L.held_by(mam, request(r)) != ms:
                        raise _fail(
                            "inv_owners_account",
                            f"request {r} holds Mamba slots "
                            f"{sorted(L.held_by(mam, request(r)))}, expected {sorted(ms)}",
                        )
            if "swa" in snap.ledgers:
                live = len(snap.prefix.swa_live) * ps
                held = len(_node_held(snap.ledgers["swa"], SWA))
                if held != live:
                    raise _fail("inv_owners_account", f"tree holds {held} SWA slots for {live} SWA-live tokens")

        def _check_lru(self, snap: Snapshot) -> None:
            for comp, lst in snap.lru.items():
                if not U.inv_lru_detached(lst):
                    members = set(lst.order)
                    stale = [(n, ln) for n, ln in lst.links.items() if n not in members and ln != U.DETACHED][:3]
                    raise _fail(
                        "inv_lru_detached",
                        f"{comp.value} list {lst.order}: nodes outside it keep links {stale}"
                        if stale
                        else f"{comp.value} list {lst.order}: links out of order",
                    )
                if not U.inv_lru_links_symmetric(lst):
                    raise _fail("inv_lru_links_symmetric", f"{comp.value} list {lst.order}")
                cached = snap.cached_nodes.get(comp, frozenset())
                if not U.inv_lru_members(lst, cached):
                    raise _fail("inv_lru_members", f"{comp.value} list {sorted(lst.order)} vs holders {sorted(cached)}")
            if self.policy and "ledgers" in self.caps:
                self._check_recency(snap)

        def _check_recency(self, snap: Snapshot) -> None:
            """``inv_lru_recency`` on every list: a node's stamp joins its pages' (found through the ledger's node
            owners), and no node lies ahead of one used after it for sure."""
            known = [k for k in snap.prefix.full if k in self.stamps]
            nodes = self._node_pages(snap, known).items()
            stamps = {n: st for n, ks in nodes if (st := U.joint_stamp([self.stamps[k] for k in ks])) is not None}
            for comp, lst in snap.lru.items():
                if comp not in self.policy:
                    continue
                bad = U.recency_inversion(lst.order, stamps)
                if bad is not None:
                    a, b = bad
                    raise _fail(
                        "inv_lru_recency",
                        f"{comp.value} list {lst.order}: node {a} (used last by tick {stamps[a][1]}) lies ahead of "
                        f"node {b} (used at tick {stamps[b][0]})",
                    )

        def _check_tree(self, tree: T.TreeLinks) -> None:
            live = tree.live
            if not T.inv_tree_detached(tree):
                kept = [
                    (n, tree.parent.get(n), sorted(tree.children.get(n, ())))
                    for n in sorted(tree.parent.keys() - live)
                    if not T.detached([tree.parent.get(n), *tree.children.get(n, ())])
                ]
                raise _fail(
                    "inv_tree_detached",
                    f"evicted nodes keep tree links (node, parent, children) {kept[:3]}"
                    if kept
                    else "a node in the tree points at an evicted node",
                )
            if not T.inv_tree_links_symmetric(tree):
                raise _fail("inv_tree_links_symmetric", "a child and its parent do not name each other")
            if not T.inv_tree_acyclic(tree):
                raise _fail("inv_tree_acyclic", "a node's parents do not lead to the root")
            if not T.inv_tree_index(tree):
                stale = sorted(((tree.index or live) ^ live) | (tree.cursors - live))
                raise _fail("inv_tree_index", f"the cache's index or cursors name nodes {stale[:4]} outside the tree")

        def _check_locks(self, snap: Snapshot) -> None:
            locks = snap.locks
            if not K.inv_lock_ref_nonnegative(locks):
                neg = [(k, c.value, n) for (k, c), n in locks.lock_ref.items() if n < 0][:3]
                raise _fail("inv_lock_ref_nonnegative", f"negative lock_ref {neg}")
            if not K.inv_lock_ref_counts_handles(locks):
                want = K._count_handles(locks.handles.values())
                bad = sorted(
                    (k, c.value, locks.lock_ref.get((k, c), 0), want.get((k, c), 0))
                    for (k, c) in set(want) | set(locks.lock_ref)
                    if locks.lock_ref.get((k, c), 0) != want.get((k, c), 0)
                )[:3]
                raise _fail("inv_lock_ref_counts_handles", f"(key, component, lock_ref, live handles covering) {bad}")
            if dict(locks.handles) != dict(self.locks.handles):
                raise _fail(
                    "inv_handles_match", f"live handles {sorted(locks.handles)}, expected {sorted(self.locks.handles)}"
                )
            if not P.inv_locked_cached(snap.prefix, locks):
                raise _fail("inv_locked_cached", "a live lock covers content its component no longer holds")
            if "sizes" in self.caps:
                for comp, sizes in snap.sizes.items():
                    spec_sizes = (
                        P.evictable_size(snap.prefix, locks, comp),
                        P.protected_size(snap.prefix, locks, comp),
                    )
                    if tuple(sizes) != spec_sizes:
                        raise _fail(
                            "inv_sizes", f"{comp.value} (evictable, protected) = {tuple(sizes)}, spec {spec_sizes}"
                        )

    CacheConformance.__name__ = "CacheConformance"
    CacheConformance.__qualname__ = "CacheConformance"
    return CacheConformance


def _node_held(led: Ledger, comp: Component) -> set[int]:
    return {x for o, xs in led.held.items() if o.kind is OwnerKind.NODE and o.component is comp for x in xs}


def _prefix_diff(got: P.PrefixCache, want: P.PrefixCache) -> str:
    extra = sorted(got.full.keys() - want.full.keys())[:3]
    missing = sorted(want.full.keys() - got.full.keys())[:3]
    diff = [k for k in got.full.keys() & want.full.keys() if got.full[k] != want.full[k]][:3]
    parts = [
        f"cached but not in spec {extra}" if extra else "",
        f"in spec but not cached {missing}" if missing else "",
        f"other slots at {diff}" if diff else "",
    ]
    if got.swa_live != want.swa_live:
        parts.append(f"SWA-live differs at {sorted(got.swa_live ^ want.swa_live)[:3]}")
    if got.mamba_state != want.mamba_state:
        parts.append(f"Mamba states {dict(got.mamba_state)} vs spec {dict(want.mamba_state)}")
    return "; ".join(p for p in parts if p) or "abstract cache differs from the spec model"
