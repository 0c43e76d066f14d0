"""The ownership ledger of one pool: single ownership and conservation.

Every slot of a pool (KV token slots or pages, request rows, Mamba state
slots, ping-pong track buffers, SWA slots) has exactly one holder at every
moment: the free list or one :class:`~kvledger.spec.types.Owner`. The laws:

* ``inv_slots_conserved``: ``len(free) + sum(len(held[o])) == capacity``;
* ``inv_single_owner``: the free list and the owners' sets are pairwise
  disjoint and together cover exactly the pool's slots;
* ``inv_rows_held`` (KV and the request table together): every slot a live
  request-table row names lies in the KV pool and is held by that row's owner
  (or by the cache, for a prefix the owner borrows from the tree): never free
  (a use after free), never another request's or session's, never at two
  positions of the row;
* ``inv_end_caches`` (every pool together): a request that ends leaves its
  computed whole pages in the tree, and a Mamba state with them;
* ``inv_released_on_end`` (every pool together): a request that has ended
  (finished or aborted) holds nothing: what it held went back to the free list
  or on to another holder (the tree, its session) as it ended.

Operations are pure functions ``step(state, args) -> state`` over a frozen
state (DESIGN.md: the form CrossHair can check). Each has a named predicate
``check_<op>`` that returns the typed error a misuse deserves (or ``None``);
the precondition reuses it, so a rejected call raises that error and, being
pure, changes nothing.

>>> from kvledger.spec.types import request
>>> s = new_ledger("kv", capacity=4)
>>> s = allocate(s, request(1), frozenset({0, 1}))
>>> sorted(s.free), owner_of(s, 0)
([2, 3], Owner(kind=<OwnerKind.REQUEST: 'req'>, ident=1, component=None))
>>> free(s, request(2), frozenset({0}))
Traceback (most recent call last):
...
kvledger.spec.errors.NotOwner: free on pool 'kv' slots [0]: slot 0 is held by req:1, not by req:2
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence, Set
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

import icontract

from kvledger.spec.errors import (
    DoubleFree,
    InvalidArgument,
    LedgerError,
    NotOwner,
    OutOfRange,
    OverAllocation,
    must,
)
from kvledger.spec.types import Owner, OwnerKind, SlotId

Slots = frozenset[int]


@dataclass(frozen=True)
class Ledger:
    """Abstract state of one pool.

    ``held`` maps each owner to the non-empty set of slots it holds; an owner
    that holds nothing is absent. The pool's slots are
    ``range(base, base + capacity)`` (``base == 1`` for a token pool whose
    slot 0 is reserved padding).
    """

    name: str
    capacity: int
    free: Slots
    held: Mapping[Owner, Slots] = field(default_factory=dict)
    base: int = 0


def new_ledger(name: str, capacity: int, base: int = 0) -> Ledger:
    """A pool of ``capacity`` slots, all free."""
    return Ledger(name, capacity, frozenset(range(base, base + capacity)), {}, base)


def owner_of(s: Ledger, slot: int) -> Owner | None:
    """The owner holding ``slot``, or ``None`` when it is free (or out of range)."""
    for o, slots in s.held.items():
        if slot in slots:
            return o
    return None


def held_by(s: Ledger, owner: Owner) -> Slots:
    """The slots ``owner`` holds (empty when it holds none)."""
    return s.held.get(owner, frozenset())


def num_held(s: Ledger) -> int:
    """How many slots are held by some owner."""
    return sum(len(v) for v in s.held.values())


# ---------------------------------------------------------------- invariants


def inv_slots_conserved(s: Ledger) -> bool:
    """free + sum of owners == capacity."""
    return len(s.free) + num_held(s) == s.capacity


def inv_single_owner(s: Ledger) -> bool:
    """Free list and owners are pairwise disjoint and cover exactly the pool."""
    seen: set[int] = set(s.free)
    total = len(s.free)
    for slots in s.held.values():
        if not slots:
            return False  # an owner with nothing must be absent
        seen |= slots
        total += len(slots)
    return total == len(seen) and seen == set(range(s.base, s.base + s.capacity))


def inv_ledger(s: Ledger) -> bool:
    """Both ledger laws."""
    return inv_slots_conserved(s) and inv_single_owner(s)


def tree_holds(s: Ledger) -> int:
    """How many slots of the pool the prefix tree's nodes hold."""
    return sum(len(v) for o, v in s.held.items() if o.kind is OwnerKind.NODE)


def inv_end_caches(ledgers: Mapping[str, Ledger], page_size: int, computed: int, held_state: bool) -> bool:
    """Caching at a request's end: once a request whose KV holds ``computed`` positions ends (a finish, not a save
    into its session), the tree's nodes hold at least the whole pages of them (``"kv"``: its own pages handed
    over, or the tree's for the same prefix), and, when it ended holding a Mamba state (``held_state``) with its
    computed KV whole pages, a Mamba state (``"mamba"``: its own, or one the tree had at that prefix). An end that
    drops the state of a prefix it caches leaves a prefix no Mamba request can resume from. ``page_size``: token
    positions per ``"kv"`` slot (a paged pool's page), which is also the tree's page.

    >>> from kvledger.spec.types import Component, node
    >>> kv = Ledger("kv", 4, frozenset({2, 3}), {node(1): frozenset({0, 1})})
    >>> m = Ledger("mamba", 2, frozenset({0, 1}), {})
    >>> inv_end_caches({"kv": kv}, 1, 2, False), inv_end_caches({"kv": kv}, 1, 3, False)
    (True, False)
    >>> inv_end_caches({"kv": kv, "mamba": m}, 1, 2, True), inv_end_caches({"kv": kv, "mamba": m}, 2, 3, True)
    (False, True)
    >>> kept = Ledger("mamba", 2, frozenset({0}), {node(1, Component.MAMBA): frozenset({1})})
    >>> inv_end_caches({"kv": kv, "mamba": kept}, 1, 2, True)
    True
    """
    kv, mamba = ledgers.get("kv"), ledgers.get("mamba")
    if kv is not None and tree_holds(kv) < computed // page_size:
        return False
    whole = computed > 0 and computed % page_size == 0
    return not (held_state and whole and mamba is not None and not tree_holds(mamba))


def holdings(ledgers: Mapping[str, Ledger], owner: Owner) -> dict[str, Slots]:
    """Per pool, the slots ``owner`` holds there (a pool where it holds none is left out).

    >>> from kvledger.spec.types import request
    >>> kv = Ledger("kv", 4, frozenset({0, 1}), {request(3): frozenset({2})})
    >>> holdings({"kv": kv, "rows": Ledger("rows", 2, frozenset({0, 1}), {})}, request(3))
    {'kv': frozenset({2})}
    """
    return {name: xs for name, lg in ledgers.items() if (xs := held_by(lg, owner))}


def inv_released_on_end(ledgers: Mapping[str, Ledger], owner: Owner) -> bool:
    """Release at the end: ``owner``, a request that has finished or been aborted, holds nothing in any pool. An end
    hands each slot back to the free list or on to its next holder (the prefix cache's nodes, the request's
    session); a slot still in an ended request's name has lost its owner, whether or not some structure still names
    it (an engine's own references may keep naming a row it forgot to free).

    >>> from kvledger.spec.types import request
    >>> kv = Ledger("kv", 4, frozenset({0, 1}), {request(3): frozenset({2})})
    >>> inv_released_on_end({"kv": kv}, request(3)), inv_released_on_end({"kv": kv}, request(4))
    (False, True)
    """
    return not holdings(ledgers, owner)


def inv_end_caches_content(
    node_kv: Mapping[int, Set[int | None]], node_states: Set[int], owed: Sequence[int], state_at: int | None
) -> bool:
    """``inv_end_caches`` read through what the KV slots hold (an engine that shows its KV ``content``): once a
    request ends, the tree's nodes hold the KV of each of its computed whole-page positions (``owed``: the content
    each must hold, ``fingerprint(token, position)``), and, when a Mamba state is owed (``state_at``: the content
    of the last computed position), a node that holds a Mamba state holds that position's KV among its own slots.
    A state summarises the prefix that ends at its node: another node's state, at another prefix, does not stand
    in for it. ``node_kv``: per node id, the contents of the KV slots the node holds; ``node_states``: the ids of
    the nodes that hold a Mamba state.

    >>> inv_end_caches_content({1: {10, 11}}, {1}, [10, 11], 11)
    True
    >>> inv_end_caches_content({1: {10}, 2: {11}}, {1}, [10, 11], 11)
    False
    >>> inv_end_caches_content({1: {10}}, set(), [10, 12], None)
    False
    """
    held: set[int | None] = set()
    for values in node_kv.values():
        held |= values
    if any(v not in held for v in owed):
        return False
    return state_at is None or any(state_at in node_kv.get(n, ()) for n in node_states)


class Holdings(Protocol):
    """What :func:`inv_rows_held` reads of a pool: its range and who holds what (a :class:`Ledger` is one)."""

    @property
    def name(self) -> str: ...
    @property
    def base(self) -> int: ...
    @property
    def capacity(self) -> int: ...
    @property
    def held(self) -> Mapping[Owner, Set[int]]: ...


Rows = Mapping[int, tuple[Owner, Sequence[SlotId]]]
"""Request-table rows: row id -> (the row's owner, the KV token slot of each live position, in order)."""


class RowFault(NamedTuple):
    """One live row position that names KV its owner may not read: ``holder`` is who holds it (``None``: free)."""

    row: int
    position: int
    slot: int
    owner: Owner
    holder: Owner | None
    outside: bool  # the slot lies outside the KV pool
    again: bool = False  # an earlier position of the row names the same slot (two tokens' KV in one slot)


def row_faults(kv: Holdings, rows: Rows, page_size: int = 1) -> Iterator[RowFault]:
    """Each live row position whose KV slot breaks :func:`inv_rows_held`, row by row, in position order.

    ``kv`` is the KV ledger; its units are pages when ``page_size > 1`` (slot
    ``x`` lies in unit ``x // page_size``). Cost: the positions named, plus one
    scan of the holders per fault reported.
    """
    for row, (owner, slots) in rows.items():
        mine = kv.held.get(owner, frozenset())
        seen: set[int] = set()
        for pos, x in enumerate(slots):
            unit = x // page_size
            if x in seen:
                yield RowFault(row, pos, x, owner, owner, False, True)
            seen.add(x)
            if not kv.base <= unit < kv.base + kv.capacity:
                yield RowFault(row, pos, x, owner, None, True)
            elif unit not in mine:
                holder = next((o for o, held in kv.held.items() if unit in held), None)
                if holder is None or holder.kind is not OwnerKind.NODE:
                    yield RowFault(row, pos, x, owner, holder, False)


def inv_rows_held(kv: Holdings, rows: Rows, page_size: int = 1) -> bool:
    """Every slot a live row names lies in the KV pool, is held by the row's owner or by the cache, and is
    named at one position only.

    A request reads its own KV and, before it, a prefix it borrowed (locked) from
    the radix tree (held by tree nodes); a slot that is free, held by another
    request or session, or outside the pool is a use after free (or a
    corruption) waiting for the next kernel to read it.
    """
    return next(row_faults(kv, rows, page_size), None) is None


# ---------------------------------------------------------------- predicates


def inv_row_grows_as_asked(held_before: int, held_after: int, computed: int, ahead: int, page_size: int = 1) -> bool:
    """A decode that leaves a request with ``computed`` tokens and ``ahead`` more asked for (speculative
    decoding's over-allocation) leaves its row holding positions for all of them, in whole pages, and no more than
    that or than it held before (``held_before``; a row may keep an earlier, longer over-allocation): a row grown
    past what it was asked holds KV nobody will write.

    >>> inv_row_grows_as_asked(8, 12, 10, 1, 4), inv_row_grows_as_asked(8, 16, 10, 1, 4)
    (True, False)
    >>> inv_row_grows_as_asked(16, 16, 10, 0, 4), inv_row_grows_as_asked(8, 8, 10, 0, 4)
    (True, False)
    """
    want = -(-(computed + ahead) // page_size) * page_size
    return want <= held_after <= max(held_before, want)


def step_eviction(before: Ledger, after: Ledger) -> tuple[int, int, int, tuple[int, ...]]:
    """What a step that only allocates and evicts did to one pool: (free before, taken: units held by a request or
    session after that were free or the tree's before, freed: units the tree held before and no longer holds, the
    units each node of ``before`` lost: at least the size of any node the step evicted, as a node it split loses
    no more than its whole)."""

    def tree(s: Ledger) -> dict[int, Owner]:
        return {u: o for o, us in s.held.items() if o.kind is OwnerKind.NODE for u in us}

    def users(s: Ledger) -> set[int]:
        return {u for o, us in s.held.items() if o.kind is not OwnerKind.NODE for u in us}

    was, now = tree(before), tree(after)
    taken = len(users(after) - users(before))
    gone = [u for u in was if u not in now]
    lost: dict[Owner, int] = {}
    for u in gone:
        lost[was[u]] = lost.get(was[u], 0) + 1
    return len(before.free), taken, len(gone), tuple(lost.values())


def inv_evicts_only_short(free_before: int, taken: int, freed: int, lost: Sequence[int]) -> bool:
    """A step that took ``taken`` units with ``free_before`` free evicted from the tree only what it was short:
    nothing when they were free, else it stopped at the node that made up the shortfall (``spec.lru.evicts_no_more``
    over the whole step: each allocation evicts what it is short of after what earlier ones left free).

    >>> inv_evicts_only_short(10, 4, 0, ()), inv_evicts_only_short(10, 4, 3, (3,))
    (True, False)
    >>> inv_evicts_only_short(2, 5, 4, (4,)), inv_evicts_only_short(2, 5, 8, (4, 4))
    (True, False)
    """
    short = taken - free_before
    if short <= 0:
        return freed == 0
    return freed < short or any(freed - n < short for n in lost)


def _check_range(op: str, s: Ledger, slots: Slots) -> LedgerError | None:
    bad = [x for x in slots if not s.base <= x < s.base + s.capacity]
    if bad:
        return OutOfRange(op, s.name, bad, f"outside [{s.base}, {s.base + s.capacity})")
    return None


def _check_held(op: str, s: Ledger, owner: Owner, slots: Slots) -> LedgerError | None:
    if not slots:
        return InvalidArgument(op, s.name, slots, "empty slot set")
    err = _check_range(op, s, slots)
    if err is not None:
        return err
    loose = slots & s.free
    if loose:
        return DoubleFree(op, s.name, loose, f"already free (double free by {owner})")
    mine = held_by(s, owner)
    foreign = slots - mine
    if foreign:
        x = min(foreign)
        holder = owner_of(s, x)
        return NotOwner(op, s.name, foreign, f"slot {x} is held by {holder}, not by {owner}", held=(x, holder))
    return None


def can_allocate(s: Ledger, n: int) -> bool:
    """At least ``n`` slots are free."""
    return len(s.free) >= n


def check_allocate(s: Ledger, owner: Owner, slots: Slots) -> LedgerError | None:
    """Why giving ``slots`` to ``owner`` is illegal, or ``None``.

    Allocating nothing is legal and changes nothing: an engine allocates 0 slots for a fully cached request.
    """
    err = _check_range("allocate", s, slots)
    if err is not None:
        return err
    if not can_allocate(s, len(slots)):
        return OverAllocation("allocate", s.name, slots, f"{len(slots)} requested by {owner}, {len(s.free)} free")
    taken = slots - s.free
    if taken:
        x = min(taken)
        return OverAllocation("allocate", s.name, taken, f"slot {x} is held by {owner_of(s, x)}, not free")
    return None


def check_free(s: Ledger, owner: Owner, slots: Slots) -> LedgerError | None:
    """Why ``owner`` may not free ``slots``, or ``None``."""
    return _check_held("free", s, owner, slots)


def check_transfer(s: Ledger, src: Owner, dst: Owner, slots: Slots) -> LedgerError | None:
    """Why ``slots`` may not move from ``src`` to ``dst``, or ``None``."""
    if src == dst:
        return InvalidArgument("transfer", s.name, slots, f"source and destination are both {src}")
    return _check_held("transfer", s, src, slots)


# ---------------------------------------------------------------- transitions


def _with(held: Mapping[Owner, Slots], owner: Owner, slots: Slots) -> dict[Owner, Slots]:
    out = dict(held)
    if slots:
        out[owner] = slots
    else:
        out.pop(owner, None)
    return out


def _others_unchanged(old: Ledger, new: Ledger, *owners: Owner) -> bool:
    keys = (set(old.held) | set(new.held)) - set(owners)
    return all(held_by(old, o) == held_by(new, o) for o in keys)


@icontract.require(lambda s: inv_ledger(s), "well-formed ledger")
@icontract.require(
    lambda s, owner, slots: check_allocate(s, owner, slots) is None,
    "slots are free and in range",
    error=lambda s, owner, slots: must(check_allocate(s, owner, slots)),
)
@icontract.ensure(lambda result: inv_slots_conserved(result), "slots conserved")
@icontract.ensure(lambda result: inv_single_owner(result), "single owner")
@icontract.ensure(
    lambda s, owner, slots, result: held_by(result, owner) == held_by(s, owner) | slots, "owner gains exactly the slots"
)
@icontract.ensure(lambda s, slots, result: result.free == s.free - slots, "free list loses exactly the slots")
@icontract.ensure(lambda s, owner, result: _others_unchanged(s, result, owner), "other owners untouched")
def allocate(s: Ledger, owner: Owner, slots: Slots) -> Ledger:
    """Move free ``slots`` to ``owner`` (all or nothing).

    The implementation chooses which slots; the spec accepts any free ones.
    """
    return Ledger(s.name, s.capacity, s.free - slots, _with(s.held, owner, held_by(s, owner) | slots), s.base)


@icontract.require(lambda s: inv_ledger(s), "well-formed ledger")
@icontract.require(
    lambda s, owner, slots: check_free(s, owner, slots) is None,
    "slots held by owner",
    error=lambda s, owner, slots: must(check_free(s, owner, slots)),
)
@icontract.ensure(lambda result: inv_slots_conserved(result), "slots conserved")
@icontract.ensure(lambda result: inv_single_owner(result), "single owner")
@icontract.ensure(
    lambda s, owner, slots, result: held_by(result, owner) == held_by(s, owner) - slots, "owner loses exactly the slots"
)
@icontract.ensure(lambda s, slots, result: result.free == s.free | slots, "free list gains exactly the slots")
@icontract.ensure(lambda s, owner, result: _others_unchanged(s, result, owner), "other owners untouched")
def free(s: Ledger, owner: Owner, slots: Slots) -> Ledger:
    """Return ``slots`` from ``owner`` to the free list; only their owner may."""
    return Ledger(s.name, s.capacity, s.free | slots, _with(s.held, owner, held_by(s, owner) - slots), s.base)


@icontract.require(lambda s: inv_ledger(s), "well-formed ledger")
@icontract.require(
    lambda s, src, dst, slots: check_transfer(s, src, dst, slots) is None,
    "slots held by the named source",
    error=lambda s, src, dst, slots: must(check_transfer(s, src, dst, slots)),
)
@icontract.ensure(lambda result: inv_slots_conserved(result), "slots conserved")
@icontract.ensure(lambda result: inv_single_owner(result), "single owner")
@icontract.ensure(
    lambda s, src, slots, result: held_by(result, src) == held_by(s, src) - slots, "source loses exactly the slots"
)
@icontract.ensure(
    lambda s, dst, slots, result: held_by(result, dst) == held_by(s, dst) | slots, "destination gains exactly the slots"
)
@icontract.ensure(lambda s, result: result.free == s.free, "free list untouched")
@icontract.ensure(lambda s, src, dst, result: _others_unchanged(s, result, src, dst), "other owners untouched")
def transfer(s: Ledger, src: Owner, dst: Owner, slots: Slots) -> Ledger:
    """Move ``slots`` from ``src`` (which must hold them) to ``dst``.

    This is how a request hands its KV to a tree node on insert, or its row and
    Mamba state to a streaming session on save.
    """
    held = _with(s.held, src, held_by(s, src) - slots)
    held = _with(held, dst, held_by(s, dst) | slots)
    return Ledger(s.name, s.capacity, s.free, held, s.base)


def lowest_free(s: Ledger, n: int) -> Slots:
    """The ``n`` lowest free slots: a deterministic choice for spec-only runs."""
    return frozenset(sorted(s.free)[:n])
