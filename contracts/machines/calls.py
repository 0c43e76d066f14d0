"""Probes of the public calls of the radix cache (its tree included) and the memory manager, on a live object.

:mod:`kvledger.contracts.machines.probes` holds the pools' constructors and
their id and owner arguments to ``spec.domains``. The objects built on the
pools take arguments too, and most of their domains depend on the state: a
node id names a *live* node, a match must still be live, a slot offered to
``insert`` must be held by the caller and offered once, a request must be
one of the manager's and in the right stage of its life. A scenario here
builds a small live object (a :class:`RadixCache` over the kind's pool, with
a few sequences cached, some locked, some evicted; a :class:`MemoryManager`
with requests at every stage, an allocation failure pending or not) and
lists its public calls as :class:`Method` s: per argument, its valid values
and its junk (wrong types, malformed ids and keys, out-of-range lengths,
another holder's or a repeated slot, a stale node, a released handle), each
a strategy of the scenario's state, with the ``spec.domains`` predicate
that says which side of the edge a drawn value is on.

:func:`probe` makes one call with at most one argument drawn from the junk
(so every check of the call is reachable) and holds it to the law at the
domain's edge (``spec.domains.inv_domain_enforced``) with the state
fingerprinted before and after:

* outside its domain the call raises a typed ``KVLedgerError`` (an
  ``OutOfRange``, ``DoubleFree`` or ``NotOwner`` names a slot,
  ``spec.errors.inv_names_culprit``) and changes nothing at all: ledgers,
  tree, LRU order, locks, sizes, slot data, pending injected failures
  (``rejected call leaves state unchanged``);
* a call that only reads (``Method.reads``) is made inside its domain too:
  it is accepted and changes nothing.
"""

from __future__ import annotations

import inspect
import signal
import threading
import time
import types
import zlib
from array import array
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import suppress
from copy import copy, deepcopy
from dataclasses import dataclass, field, replace
from enum import Enum
from functools import lru_cache, partial
from itertools import count, islice
from typing import Protocol, TypeGuard, TypeVar, cast

import numpy as np
import torch
from hypothesis import strategies as st

from kvledger.contracts import bindings
from kvledger.contracts.abstraction import ledger_of, pools_of
from kvledger.contracts.adapters.reference import snapshot_of
from kvledger.contracts.adapters.reference_system import build_manager, system_snapshot_of
from kvledger.contracts.adapters.system import SystemConfig
from kvledger.contracts.machines.probes import (
    JUNK_SCALARS,
    OWNER_EDGES,
    SCALAR_EDGES,
    count_edges,
    count_or_junk,
    id_edges,
    id_or_junk,
    owner_or_junk,
    raised,
)
from kvledger.contracts.machines.stable import elements_of, just, sampled_from
from kvledger.contracts.machines.system import end_cache_finding
from kvledger.impl.admission import Attempt, Budget, admit, release_attempt_state, rollback
from kvledger.impl.allocators import PagedAllocator, SWATokenAllocator, TokenAllocator, swa_owner
from kvledger.impl.arguments import MAX_TOKEN
from kvledger.impl.integrity import fingerprint, fingerprint_one, verify
from kvledger.impl.leaks import PoolCount, check_leaks, expected_owners, session_mamba_refs
from kvledger.impl.locks import LockHandle
from kvledger.impl.lru import Linked, LRUList
from kvledger.impl.mamba import MambaAlloc, MambaPool
from kvledger.impl.memory import MemoryManager
from kvledger.impl.owners import FREE_TAG, MAX_IDENT, RESERVED_TAG, decode, encode, node_tag
from kvledger.impl.radix import RadixCache
from kvledger.impl.requests import Request, Status
from kvledger.impl.session import SessionSlot
from kvledger.impl.slots import RUN_MIN, SlotPool
from kvledger.impl.tree import MatchResult, TreeNode
from kvledger.spec import domains as D
from kvledger.spec import prefix as P
from kvledger.spec.errors import (
    AlreadyInList,
    ComponentDisabled,
    IntegrityError,
    InvalidArgument,
    KVLedgerError,
    LedgerError,
    NotInList,
    NotOwner,
    OverAllocation,
    SlotConflict,
    UnknownNode,
    inv_names_culprit,
    inv_names_holder,
    inv_names_one_operation,
)
from kvledger.spec.ledger import Ledger, owner_of
from kvledger.spec.types import Component, HandleId, MambaSlot, Owner, OwnerKind, request, session

__all__ = [
    "NOT_PROBED",
    "NOT_PROBED_FUNCTIONS",
    "PROBED_FUNCTIONS",
    "SCENARIOS",
    "Arg",
    "Draw",
    "Method",
    "Scenario",
    "cache_scenario",
    "cross",
    "judge",
    "manager_scenario",
    "manager_scenario_of",
    "probe",
    "sweep",
]

FULL, SWA, MAMBA = Component.FULL, Component.SWA, Component.MAMBA
T = TypeVar("T")


class Draw(Protocol):
    """How a probe draws a value: ``data.draw`` of a Hypothesis rule (``st.data()``)."""

    def __call__(self, strategy: st.SearchStrategy[T], /) -> T: ...


Drawn = Mapping[str, object]


@dataclass(frozen=True)
class Arg:
    """One argument of a public call: its valid values, its junk, and which side of the domain's edge a value is
    on; each may depend on the arguments drawn before it (``Drawn``)."""

    valid: Callable[[Drawn], st.SearchStrategy[object] | None]
    junk: Callable[[Drawn], st.SearchStrategy[object] | None]
    inside: Callable[[object, Drawn], bool]
    edges: Callable[[Drawn], Sequence[object]] | None = None
    """A finite catalogue with one value of each kind of junk the argument takes (``None``: none), for
    :func:`sweep`: a draw of ``junk`` meets each kind only now and then, a sweep meets all of them at once."""
    culprit: Callable[[object], str | None] | None = None
    """What a refusal of this junk value must name (``None``: nothing beyond ``inv_names_culprit``), e.g. the
    request a batch names twice: an error that names another misleads whoever reads it."""
    refusal: Callable[[object, Drawn], type[KVLedgerError] | None] | None = None
    """The error class the spec gives for this junk value, where it names one (``None``: any typed error), e.g.
    ``SlotConflict`` for an insert naming one slot at two positions: callers catch it by its class."""

    def junk_only(self) -> Arg:
        """This argument with no valid value: for a call whose valid uses belong to a flow the rules run."""
        return replace(self, valid=lambda _d: None)


@dataclass(frozen=True)
class Method:
    """A public call of a live object: how to make it from keyword arguments, and each argument's domain.

    ``reads``: inside its domain the call changes nothing (it only answers), so the probe makes it there too.
    ``weight``: how often it is drawn against the others (a call whose domain depends on much state: more often).
    A call that changes state (not ``reads``) is made inside its domain on a copy of the object where the scenario
    has one (``Scenario.on_copy``): it must be accepted or refused typed. ``releases``: it gives memory back (a
    finish, a retract, a close), so the copy's books must then balance too (an alloc's are balanced by its caller).
    """

    what: str
    call: Callable[..., object]
    args: Mapping[str, Arg]
    reads: bool = False
    weight: int = 1
    releases: bool = False


@dataclass
class Scenario:
    """A live object, its public calls, and a fingerprint of everything a call could change."""

    what: str
    methods: tuple[Method, ...]
    fingerprint: Callable[[], object]
    story: list[str] = field(default_factory=list)
    audit: Callable[[Draw], str] | None = None
    """A check of the object's own checker, run once per probing step (the manager's leak checker)."""
    on_copy: Callable[[Method, Mapping[str, object]], str] | None = None
    """Make a call that changes state, inside its domain, on a copy of the object and check the copy."""
    probes_on_copy: bool = True
    """Whether a probe draws such calls too (else only the sweeps' and crosses' valid catalogue values meet
    ``on_copy``, and every probe of a call that changes state has one argument junk)."""
    swept: set[str] = field(default_factory=set)
    """The calls :func:`sweep` has swept on this object so far: a sweep draws among the others first."""
    turns: dict[str, int] = field(default_factory=dict)
    """How many picks of each kind (``probe``, ``sweep``, ``cross``) took the turn slot so far (:func:`fair_pick`)."""
    short_of: frozenset[str] | None = None
    """What an ``OverAllocation`` from the object may name as short (its pools, an admission's token budget):
    a refusal that names anything else sends its reader to the wrong pool (``None``: not checked)."""
    pools: Callable[[], Mapping[str, SlotPool]] | None = None
    """The object's pools by ledger name: a ``NotOwner`` that says who holds a slot is checked against them
    (``spec.errors.inv_names_holder``; ``None``: not checked)."""


def fair_pick(scenario: Scenario, draw: Draw, choices: Sequence[T], kind: str) -> T:
    """One of ``choices``, drawn without favouring the first.

    Hypothesis draws the simplest index, 0, far more often than any other: in a stateful run, a 40-way
    ``sampled_from`` drew index 0 a quarter of the time against about 2 % for each other index, so the method
    listed first took that share of the probes (the manager's ``alloc_kv`` 155 probes in one default run, ``free_mamba``
    4). Here index 0 is a turn slot: it takes the next of ``choices`` in order, from a start set by how the
    scenario was built (a digest of its story, so it differs from example to example), and every other index
    takes its own choice. The turn depends only on what this example drew before, so a replay picks the same."""
    i = draw(st.integers(0, len(choices)))
    if i:
        return choices[i - 1]
    turn = scenario.turns.get(kind, 0)
    scenario.turns[kind] = turn + 1
    start = zlib.crc32("\n".join(scenario.story).encode())
    return choices[(start + turn) % len(choices)]


def _arg(
    valid: st.SearchStrategy[object] | Callable[[Drawn], st.SearchStrategy[object] | None] | None,
    junk: st.SearchStrategy[object] | Callable[[Drawn], st.SearchStrategy[object] | None] | None,
    inside: Callable[[object], bool] | Callable[[object, Drawn], bool],
    *,
    after: bool = False,
    edges: Sequence[object] | Callable[[Drawn], Sequence[object]] | None = None,
    culprit: Callable[[object], str | None] | None = None,
    refusal: Callable[[object, Drawn], type[KVLedgerError] | None] | None = None,
) -> Arg:
    """An ``Arg``; strategies given as values (``None``: there is none in this state) do not depend on earlier
    arguments, nor does ``inside`` unless ``after`` (then it takes them); ``edges`` given as a sequence does not
    either. Without ``edges``, junk given as a finite strategy (a ``sampled_from``, or a union of them) is its own
    catalogue: a sweep meets each of its values (an argument without one is never swept)."""
    v = valid if callable(valid) and not isinstance(valid, st.SearchStrategy) else (lambda _d, s=valid: s)
    j = junk if callable(junk) and not isinstance(junk, st.SearchStrategy) else (lambda _d, s=junk: s)
    if edges is None and isinstance(junk, st.SearchStrategy):
        edges = elements_of(junk)
    ins = inside if after else (lambda x, _d, f=inside: f(x))
    e = edges if edges is None or callable(edges) else (lambda _d, xs=tuple(edges): xs)
    return Arg(v, j, ins, e, culprit, refusal)  # type: ignore[arg-type]


# ---------------------------------------------------------------- keys and token ids


def _as(tokens: list[int], how: str) -> object:
    """``tokens`` as a caller may pass a key: an int64, int32, uint64 or strided tensor, an int16 or uint8 one
    (``spec.domains.IDS_DTYPES``; int64 where the values do not fit), a list, a tuple, an array."""
    if how in NARROW:
        return torch.tensor(tokens, dtype=NARROW[how] if fits_dtype(tokens, NARROW[how]) else torch.int64)
    if how == "int64":
        return torch.tensor(tokens, dtype=torch.int64)
    if how == "strided":
        return torch.tensor([x for t in tokens for x in (t, 0)], dtype=torch.int64)[::2]
    if how == "array":
        return array("q", tokens)
    return tokens if how == "list" else tuple(tokens)


def bad_token(x: object) -> str | None:
    """The culprit a refusal of token ids ``x`` must name (``inv_names_culprit``): ``token id N`` where ``N`` is
    the one id of ``x`` outside ``[0, VALUE_END)``; ``None`` where there are none, or several (any may be named), or
    ``x`` is no sequence of ints."""
    if not isinstance(x, tuple | list) or not all(type(t) is int for t in x):
        return None
    bad = {t for t in x if not 0 <= t < VALUE_END}
    return f"token id {bad.pop()}" if len(bad) == 1 else None


def fits_dtype(values: Sequence[int] | torch.Tensor, dtype: torch.dtype) -> bool:
    """Whether every one of ``values`` (ints, or an integer tensor) is a value of integer ``dtype``."""
    if not len(values):
        return True
    info = torch.iinfo(dtype)
    if isinstance(values, torch.Tensor):
        return info.min <= int(values.min()) and int(values.max()) <= info.max
    return info.min <= min(values) and max(values) <= info.max


NARROW = {"int32": torch.int32, "uint64": torch.uint64, "int16": torch.int16, "uint8": torch.uint8}
"""Key and slot tensors in an integer dtype but int64 (``spec.domains.IDS_DTYPES``): the same ids, another dtype."""
KEY_FORMS = ("int64", "int32", "uint64", "int16", "uint8", "strided", "list", "tuple", "array")


VALUE_END = 1 << 31
"""The first token id or position past their range (``spec.prefix``: 31-bit tokens and positions)."""


TENSOR_FORMS = ("int64", "int32", "uint64", "int16", "uint8", "strided")


def key_forms(tokens: list[int], forms: tuple[str, ...] = KEY_FORMS) -> st.SearchStrategy[object]:
    """``tokens`` in any of ``forms`` (``KEY_FORMS``: every form a key takes; ``TENSOR_FORMS``: the tensors)."""
    return sampled_from(forms).map(lambda how: _as(tokens, how))


def junk_key_values(length: int) -> tuple[object, ...]:
    """Keys of ``length`` tokens that are no key, one of each kind: floats, bools, 2-D, a negative id (in a tensor
    and in a list), an id past int64 (in a uint64 tensor), float and bool lists, an ``array`` of floats and one of
    unsigned ids with one past int64 (an array of another typecode is converted, not taken as it is), int64 ids
    in a sparse and in a meta tensor (the right dtype and shape, no readable values), a string, the ids' bytes in
    each buffer type, a set and a dict of them (no order), and a scalar of each wrong type."""
    toks = list(range(1, length + 1)) or [1]
    ids = torch.tensor(toks, dtype=torch.int64)
    raw = array("q", toks).tobytes()
    return (
        ids.float(),
        torch.tensor([True] * len(toks)),
        ids.reshape(1, -1),
        torch.tensor([*toks[:-1], -1]),
        ids.to_sparse(),
        ids.to("meta"),
        [*toks[:-1], -1],
        [*toks[:-1], -(2**63)],  # NOTE: negatives whose low bytes are small: a sign test must read the sign
        torch.tensor([*toks[:-1], -256]),
        torch.tensor([*toks[:-1], 2**63], dtype=torch.uint64),  # NOTE: past int64: negative read as int64
        [float(t) for t in toks],
        [True for _ in toks],
        "ab",
        array("d", toks),  # NOTE: an array of another typecode: floats, and unsigned ids past int64
        array("Q", [*toks[:-1], 2**63]),
        raw,  # NOTE: the ids' bytes, in each buffer type: a buffer is not a key
        bytearray(raw),
        memoryview(raw),
        set(toks),  # NOTE: iterables of ints that are no sequence: no order to read a key in
        dict.fromkeys(toks),
        *SCALAR_EDGES,
    )


def edge_key_values(length: int) -> tuple[object, ...]:
    """Valid keys of ``length`` tokens at the edges of the id range: the largest int64, and ids whose low byte
    is 0x80 or more (a test that reads the wrong byte of an id for its sign refuses them), as a list and as an
    int64 tensor; the largest int32 in an ``array("i")``; the smallest id (0) and the largest int64 in a uint64
    tensor (whose values past int64 are no ids: a test of that bound must not refuse the ids at either end of the
    range)."""
    toks = list(range(1, length))
    return (
        [*toks, 2**63 - 1],
        array("i", [*toks, 2**31 - 1]),  # NOTE: an array of another typecode holding ids: the same key as a list
        torch.tensor([*toks, 255]),
        [*toks, 2**31 + 128],
        torch.tensor([*toks, 0], dtype=torch.uint64),
        torch.tensor([*toks, 2**63 - 1], dtype=torch.uint64),
    )


LONG_KEY = 10_000
"""Tokens in a long key: past the cut-offs where an implementation trades its per-token path for a bulk one (a
memo of short keys, a byte-wise sign check: kvledger's own key check changes path at 4,096 tokens). The machines'
own keys are a few tokens, so a path taken only past such a cut-off would otherwise never run."""


def long_keys(head: list[int]) -> tuple[object, ...]:
    """Valid keys of ``LONG_KEY`` tokens that start with ``head``, one of each kind: the smallest id (0) and the
    largest (``2**63 - 1``) among them, as an int64 tensor and as a list; and the tensor's strided view."""
    tail = [0, 2**63 - 1, *range(LONG_KEY - len(head) - 2)]
    toks = head + tail[: max(LONG_KEY - len(head), 0)]
    return (torch.tensor(toks, dtype=torch.int64), toks, _as(toks, "strided"))


def long_junk_keys(head: list[int]) -> tuple[object, ...]:
    """Keys of ``LONG_KEY`` tokens that start with ``head`` and are no key: a negative id last (as an int64 tensor
    and as a list), the smallest int64 among large ones."""
    body = [*head, *range(5, LONG_KEY - len(head) + 4)]
    return (
        torch.tensor([*body, -1], dtype=torch.int64),
        [*body, -1],
        torch.tensor([*body[:-1], -(2**63), 7], dtype=torch.int64),
    )


def junk_keys(length: int) -> st.SearchStrategy[object]:
    """A key of ``length`` tokens that is no key (:func:`junk_key_values`, or any scalar)."""
    return sampled_from(junk_key_values(length)) | JUNK_SCALARS


INT_TYPECODES = frozenset("bBhHiIlLqQ")
"""The ``array`` typecodes of integers: such an array is a sequence of ints (``u`` and ``w`` hold characters)."""


def tokens_of(key: object) -> list[int] | None:
    """The token ids ``key`` names when it is a key (``spec.domains.is_tokens`` on its values), else ``None``."""
    if isinstance(key, torch.Tensor):
        if key.layout != torch.strided or key.is_meta or key.dim() != 1:
            return None  # NOTE: a sparse or a meta tensor holds no readable ids
        if key.dtype.is_floating_point or key.dtype.is_complex or key.dtype == torch.bool:
            return None
        xs: list[int] = key.tolist()
    elif (isinstance(key, array) and key.typecode in INT_TYPECODES) or isinstance(key, list | tuple):
        xs = list(key)  # NOTE: an array of any integer typecode holds ids as a list does (its values decide)
    else:
        return None
    return xs if D.is_tokens(xs) else None


def _slots(xs: list[int]) -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.int64)


def _data_bytes(*ts: torch.Tensor | None) -> tuple[bytes, ...]:
    return tuple(b"" if t is None else t.cpu().numpy().tobytes() for t in ts)


# ---------------------------------------------------------------- the radix cache


PAGE_SIZES = (2, 3)
"""Page sizes the scenarios of a paged pool draw from: a power of two (whose page numbers are shifts) and one
that is not (whose page numbers are divisions): a path taken for one kind of page size only is met too."""


def _kv(kind: str, page_size: int = PAGE_SIZES[0]) -> TokenAllocator | PagedAllocator | SWATokenAllocator:
    if kind == "paged":
        return PagedAllocator(8, page_size)
    return SWATokenAllocator(16, 8) if kind == "swa" else TokenAllocator(16)


@dataclass
class _Cache:
    """A small live cache and what the scenario knows of it."""

    cache: RadixCache
    keys: list[list[int]]  # every key inserted (some evicted since)
    matches: list[tuple[MatchResult, list[int]]]  # live matches (each locked) and their keys
    stale_nodes: list[TreeNode]  # nodes evicted since they were seen
    released: list[LockHandle]  # handles already released
    prober: Owner  # a request holding ``held`` (token slots) and ``state`` (a Mamba state), for insert calls
    held: list[int]
    state: int | None
    others: dict[Owner, list[int]]  # other requests' token slots
    swa_dead: frozenset[int] = frozenset()  # held token slots whose SWA slot is not the prober's (freed, or given)
    stale_matches: list[tuple[MatchResult, list[int]]] = field(default_factory=list)  # last node evicted since
    states: tuple[int, ...] = ()  # every Mamba state the prober holds (``state`` is the first of them)
    swa_given: frozenset[int] = frozenset()  # held token slots whose SWA slot another holder took (of ``swa_dead``)
    live: tuple[LockHandle, ...] = ()  # the handles of ``matches``, not released


def _cache_fingerprint(c: RadixCache) -> object:
    snap = snapshot_of(c)
    data = c.kv.full.data if isinstance(c.kv, SWATokenAllocator) else c.kv.data
    swa = c.kv.swa.data if isinstance(c.kv, SWATokenAllocator) else None
    m = c.mamba
    mamba = _data_bytes(m.data, m.conv, m.temporal) if m is not None else ()
    return (snap, _data_bytes(data, swa), mamba, c.node_count(), c.sizes())


def _build_cache(kind: str, draw: Draw) -> _Cache:
    kv = _kv(kind, draw(sampled_from(PAGE_SIZES)) if kind == "paged" else PAGE_SIZES[0])
    window = draw(st.integers(1, 4)) if kind == "swa" else None
    mamba = MambaPool(draw(st.integers(2, 3)), conv_shape=(2,), temporal_shape=(2,)) if kind == "mamba" else None
    cache = RadixCache(kv, swa_window=window, mamba=mamba)
    ps = cache.page_size
    seqs: list[list[int]] = draw(st.lists(st.lists(st.integers(1, 3), min_size=ps, max_size=6), min_size=1, max_size=4))
    keys, seen = [], list[TreeNode]()
    others: dict[Owner, list[int]] = {}
    prober = request(90)

    def hold() -> list[int]:
        """The prober's slots: one to three pairs of pages, as many as there is room for."""
        return kv.alloc(min(kv.available_size(), 2 * ps * draw(st.integers(1, 3))), prober).tolist()

    # NOTE: the prober allocates first (then it holds each pool's first slots: token slot 1, SWA slot 1, a bound a
    # sentinel test can be off by one from) or after the sequences are cached, drawn
    early = draw(st.booleans())
    held = hold() if early else []
    for r, seq in enumerate(seqs, 1):
        key = seq[: len(seq) - len(seq) % ps]
        owner = request(r)
        if kv.available_size() < len(key):
            cache.evict(FULL, len(key))  # NOTE: before the match: an eviction after it could free matched slots
        m = cache.match_prefix(torch.tensor(key, dtype=torch.int64))
        new = len(key) - m.length
        if new > kv.available_size():
            continue
        slots = kv.alloc(new, owner)
        pos = torch.arange(m.length, len(key), dtype=torch.int64)
        kv.write_fingerprint(slots, torch.tensor(key[m.length :], dtype=torch.int64), pos)
        state = None
        if mamba is not None and mamba.available_size():
            state = int(mamba.alloc(1, owner)[0])
            mamba.write_fingerprint(state, r)
        # NOTE: the key and the slots in any tensor form an engine passes (int32, a strided view): the same insert
        form = draw(sampled_from(TENSOR_FORMS))
        value = _as(m.indices.tolist() + slots.tolist(), form)
        res = cache.insert(_as(key, form), value, owner, mamba_slot=state)  # type: ignore[arg-type]
        if res.dup_indices.numel():
            kv.free(res.dup_indices, owner)
        if res.dup_mamba is not None and mamba is not None:
            mamba.free(torch.tensor([res.dup_mamba]), owner)
        keys.append(key)
        seen.extend(n for n in cache.nodes() if n is not cache.root)
    matches: list[tuple[MatchResult, list[int]]] = []
    unlocked: list[tuple[MatchResult, list[int]]] = []
    released: list[LockHandle] = []
    locks: list[LockHandle] = []
    for key in draw(st.lists(sampled_from(keys), min_size=1, max_size=2)) if keys else []:
        m = cache.match_prefix(torch.tensor(key))
        h = cache.inc_lock_ref(m.last_node)
        if draw(st.booleans()):
            cache.dec_lock_ref(h)
            released.append(h)
            unlocked.append((m, key))
        else:
            matches.append((m, key))
            locks.append(h)
    evict = draw(st.booleans())
    if keys and evict:  # NOTE: a few tokens, or all that no lock holds (then a released match is stale for sure)
        cache.evict(draw(sampled_from(cache.components)), draw(st.integers(1, 6) | just(1 << 20)))
    live = {id(n) for n in cache.nodes()}
    stale = [n for n in seen if id(n) not in live]
    matches = [(m, k) for m, k in matches if m.length and id(m.last_node) in live]
    gone = [(m, k) for m, k in unlocked if m.length and id(m.last_node) not in live]  # NOTE: stale: use after evict
    if not early:
        held = hold()
    state = None
    states: tuple[int, ...] = ()
    if mamba is not None and mamba.available_size() and draw(st.booleans()):
        # NOTE: the prober takes every state left (a full pool: copy-on-write must then evict), or one
        states = tuple(mamba.alloc(mamba.available_size() if draw(st.booleans()) else 1, prober).tolist())
        state = states[0]
    dead: list[int] = []
    how = "none"
    if isinstance(kv, SWATokenAllocator) and len(held) > 0:
        how = draw(sampled_from(["none", "freed", "given"]))
        if how != "none":  # NOTE: the SWA slots of some tokens no longer the prober's: those cannot be cached
            # NOTE: any of them (out-of-window tokens are the first; a bug may free others): a new position's too
            dead = draw(st.lists(sampled_from(held), min_size=1, max_size=len(held), unique=True))
            ids = torch.tensor(dead, dtype=torch.int64)
            if how == "freed":  # NOTE: a scheduler frees the SWA slots of tokens that left the window
                kv.free_swa(ids, prober)
            else:  # NOTE: handed to another holder (a state only a bug reaches: the insert must still refuse it)
                kv.swa.pool.transfer(kv.translate(ids), swa_owner(prober), request(92))
    other = request(91)
    others[other] = kv.alloc(min(kv.available_size(), 2 * ps), other).tolist()
    given = frozenset(dead if how == "given" else ())
    locks = [h for h in locks if cache.is_live(h)]
    return _Cache(
        cache,
        keys,
        matches,
        stale,
        released,
        prober,
        held,
        state,
        others,
        frozenset(dead),
        gone,
        states,
        given,
        tuple(locks),
    )


def _comp_arg(cache: RadixCache, any_on: bool = False) -> Arg:
    """A component: one the cache has (``any_on``: any ``Component``, the cache answering for those it has not)."""
    return _arg(
        sampled_from(list(Component) if any_on else cache.components),
        sampled_from(list(Component)) | sampled_from(["full", 0, None]),
        lambda x: type(x) is Component and (any_on or x in cache.components),
        refusal=lambda x, _d: ComponentDisabled if type(x) is Component else None,  # NOTE: one it has not
    )


def _node_arg(c: _Cache, root: bool = True) -> Arg:
    cache = c.cache
    live = [n for n in cache.nodes() if root or n is not cache.root]
    junk: list[object] = [*c.stale_nodes, _foreign()[0], 0, None, "node"]
    return _arg(
        sampled_from(live) if live else None,
        sampled_from(junk),
        lambda x: isinstance(x, TreeNode) and cache._nodes.get(x.id) is x and (root or x is not cache.root),
    )


NEVER_ISSUED = (0, -1, 1 << 40)
"""Handle ids no cache here issues: ids start at 1, and no run issues 2**40 handles."""


def forged_handles(live: Sequence[LockHandle]) -> list[LockHandle]:
    """Each live handle with its id in another type that equals it and hashes as it (a numpy int, a float, and
    ``True`` for id 1) or as its string: no handle the cache issued, though a lookup by id finds one; and the
    first live handle with each id of ``NEVER_ISSUED`` (the issuing cache's own table, an id it never gave out)."""
    out: list[LockHandle] = []
    for h in live:
        ids: list[object] = [np.int64(h.id), float(h.id), str(h.id), *([True] if h.id == 1 else [])]
        out += [h._replace(id=cast(HandleId, v)) for v in ids]  # NOTE: no HandleId: the forgery is the point
    out += [live[0]._replace(id=cast(HandleId, v)) for v in NEVER_ISSUED if live]
    return out


def _disabled(_x: object, _d: Drawn) -> type[KVLedgerError]:
    """The refusal of any call on a component the object has not (``spec``: ``ComponentDisabled``), whatever the
    argument."""
    return ComponentDisabled


def _cache_methods(c: _Cache) -> tuple[Method, ...]:
    cache, ps = c.cache, c.cache.page_size
    forged = forged_handles(c.live)
    comp, node = _comp_arg(cache), _node_arg(c)
    live_ids = [n.id for n in cache.nodes()]
    methods = [
        Method("evictable_size", cache.evictable_size, {"comp": comp}, reads=True),
        Method("protected_size", cache.protected_size, {"comp": comp}, reads=True),
        Method("lru", cache.lru, {"comp": comp}, reads=True),
        Method("prefix", cache.prefix, {"n": node}, reads=True),
        Method("holds", cache.holds, {"n": _node_arg(c, root=False), "comp": _comp_arg(cache, True)}, reads=True),
        Method(
            "node",
            cache.node,
            {
                "ident": _arg(
                    sampled_from(live_ids),
                    id_or_junk(cache._next_id + 1),
                    lambda x: type(x) is int and x in cache._nodes,
                    edges=id_edges(cache._next_id + 1),
                )
            },
            reads=True,
        ),
        Method(
            "handles_covering",
            cache.handles_covering,
            {
                "ident": _arg(
                    st.integers(0, cache._next_id + 1),  # NOTE: a dead or unborn id: no handle covers it
                    sampled_from([True, 1.5, None, "1"]),
                    lambda x: type(x) is int,
                ),
                "comp": _comp_arg(cache, True),
            },
            reads=True,
        ),
        Method(
            "is_live",
            cache.is_live,
            {
                "handle": _arg(
                    sampled_from([*c.released, _foreign()[1]]),  # NOTE: released or another cache's: False
                    sampled_from([1, None, "handle"]),
                    lambda x: isinstance(x, LockHandle),
                )
            },
            reads=True,
        ),
        Method("inc_lock_ref", cache.inc_lock_ref, {"n": node}),
        Method(
            "dec_lock_ref",
            cache.dec_lock_ref,
            {
                "handle": _arg(
                    None,
                    sampled_from([*c.released, _foreign()[1], 1, None, *forged]),
                    lambda x: isinstance(x, LockHandle) and type(x.id) is int and cache.is_live(x),
                    edges=(*c.released, _foreign()[1], 1, None, *forged),
                )
            },
        ),
        Method(
            "evict",
            cache.evict,
            {"comp": comp, "n": _arg(st.integers(0, 4), count_or_junk(0, 4), D.is_amount, edges=count_edges(0))},
        ),
        Method(
            "match_prefix",
            cache.match_prefix,
            {
                "key": _arg(
                    key_forms([1, 2]),
                    junk_keys(2),
                    _is_key,
                    edges=(*junk_key_values(2), *long_junk_keys([1, 2]), *edge_key_values(2)),
                )
            },
        ),
    ]
    if c.matches or c.stale_matches:  # NOTE: matches of length >= 1: ``verify`` of an empty match reads no key
        methods.append(
            Method(
                "verify",
                lambda match, key: cache.verify(_first(match), key),  # type: ignore[arg-type]
                {
                    "match": _arg(
                        sampled_from(c.matches) if c.matches else None,
                        sampled_from([None, 1, "match", *c.stale_matches]),  # NOTE: stale: its node evicted
                        _is_match(cache),
                        edges=[None, 1, "match", *c.stale_matches],
                    ),
                    "key": _arg(_covering_key, _short_key, _covers, after=True, edges=_short_key_edges),
                },
                reads=True,
                weight=3,
            )
        )
        states = [(m, k) for m, k in c.matches if m.mamba_slot is not None]
        gone = [(m, k) for m, k in c.stale_matches if m.mamba_slot is not None]
        if cache.mamba is not None and (states or gone):
            methods.append(
                Method(
                    "mamba_copy_on_write",
                    lambda match, owner: cache.mamba_copy_on_write(_first(match), owner),  # type: ignore[arg-type]
                    {
                        "match": _arg(
                            sampled_from(states) if states else None,
                            sampled_from([None, 1, *gone]),
                            _is_match(cache),
                        ),
                        "owner": _arg(just(request(92)), owner_or_junk(), D.is_owner, edges=OWNER_EDGES),
                    },
                    weight=3,
                )
            )
        if cache.mamba is None:
            # NOTE: a cache without Mamba holds no state to copy: every call is outside, whatever the match, and
            # the spec's refusal of a call on a component the cache has not is ``ComponentDisabled``
            methods.append(
                Method(
                    "mamba_copy_on_write",
                    lambda match, owner: cache.mamba_copy_on_write(_first(match), owner),  # type: ignore[arg-type]
                    {
                        "match": _arg(
                            None,
                            sampled_from(c.matches or c.stale_matches),
                            lambda _x: False,
                            edges=[*c.matches, *c.stale_matches],
                            refusal=_disabled,
                        ),
                        "owner": _arg(just(request(92)), owner_or_junk(), D.is_owner),
                    },
                )
            )
    if len(c.held) >= ps:
        methods.append(_insert_method(c, ps))
    methods.append(_root_insert_method(c))
    methods += [
        _fingerprint_method(),
        _fingerprint_one_method(),
        _verify_method(),
        _decode_method(),
        _node_tag_method(),
    ]
    return tuple(methods)


FP_EDGES: tuple[object, ...] = (
    torch.tensor([1, -1]),
    torch.tensor([1, MAX_TOKEN]),
    torch.tensor([1.0, 2.0]),
    torch.tensor([[1, 2]]),
    torch.tensor([1, 2, 3]),
    torch.tensor([1, 2]).to_sparse(),
    [1, 2],
    *SCALAR_EDGES,
)
"""Ids for ``impl.integrity.fingerprint`` that are outside its domain next to two tokens: a negative one, one past
``[0, 2**31)``, floats, 2-D, one too many, sparse, a list, a scalar of each wrong type."""


def _fp_ids_inside(x: object, d: Drawn) -> bool:
    t = d.get("tokens")
    xs = tokens_of(x) if isinstance(x, torch.Tensor) else None
    n = t.numel() if isinstance(t, torch.Tensor) else -1
    return xs is not None and len(xs) == n and all(v < MAX_TOKEN for v in xs)


def _fingerprint_method() -> Method:
    """``impl.integrity.fingerprint``: a reading call whose tokens and positions are 1-D integer tensors of one
    length with values in ``[0, 2**31)``; anything else is refused, typed."""
    ids = st.lists(st.integers(0, 9), min_size=2, max_size=2).map(_slots)
    return Method(
        "fingerprint",
        fingerprint,
        {
            "tokens": _arg(ids, sampled_from(FP_EDGES), lambda x: _fp_ids_inside(x, {"tokens": x}), edges=FP_EDGES),
            "positions": _arg(ids, sampled_from(FP_EDGES), _fp_ids_inside, after=True, edges=FP_EDGES),
        },
        reads=True,
    )


VERIFY_SLOTS = 8
"""``impl.integrity.verify``'s probe reads a store of this many fingerprints: slot ``i`` holds token ``i`` at
position ``i``'s."""


def _verify_method() -> Method:
    """``impl.integrity.verify``: a reading call that passes when ``slots`` of a store hold the fingerprints of
    ``tokens`` at ``positions`` (1-D integer tensors of one length, slots in the store); any other call is refused,
    typed: another content (``IntegrityError``), a slot out of the store, as many slots as tokens but one, a
    malformed tensor.

    The allocators' ``verify`` checks its ids before it calls this one, so a check this function drops is met
    only here: it is public, and an engine's own pool may call it as it is."""
    store = fingerprint(torch.arange(VERIFY_SLOTS), torch.arange(VERIFY_SLOTS))
    ids = st.lists(st.integers(0, VERIFY_SLOTS - 1), min_size=1, max_size=4).map(_slots)

    def tokens_inside(x: object) -> bool:
        xs = tokens_of(x) if isinstance(x, torch.Tensor) else None
        return xs is not None and len(xs) > 0 and all(v < VERIFY_SLOTS for v in xs)

    def basis(d: Drawn) -> torch.Tensor:
        """The token ids of the call drawn so far (tokens, else positions when the tokens are the junk)."""
        for k in ("tokens", "positions"):
            v = d.get(k)
            if tokens_inside(v):
                assert isinstance(v, torch.Tensor)
                return v
        return torch.tensor([0], dtype=torch.int64)

    def same(x: object, d: Drawn) -> bool:
        xs = tokens_of(x) if isinstance(x, torch.Tensor) else None
        t, q = d.get("tokens"), d.get("positions")
        return (
            xs is not None
            and tokens_inside(t)
            and tokens_of(t) == xs
            and (q is None or (tokens_inside(q) and tokens_of(q) == xs))
        )

    def slot_edges(d: Drawn) -> tuple[object, ...]:
        t = basis(d)
        return (
            torch.cat((t, t[:1])),  # NOTE: one slot more than tokens (a one-token call: two slots for one)
            t[:-1] if t.numel() > 1 else t.repeat(3),  # NOTE: one slot fewer (a one-token call: three for one)
            (t + 1) % VERIFY_SLOTS,  # NOTE: in the store, another content
            torch.full_like(t, VERIFY_SLOTS),
            torch.full_like(t, -1),
            t.to(torch.float32),
            t.view(1, -1),
            t.to_sparse(),
            torch.empty(t.numel(), dtype=torch.int64, device="meta"),
            t.tolist(),
            *SCALAR_EDGES,
        )

    return Method(
        "integrity.verify",
        lambda tokens, positions, slots: verify("kv", store, slots, tokens, positions),
        {
            "tokens": _arg(ids, sampled_from(FP_EDGES), tokens_inside, edges=FP_EDGES),
            "positions": _arg(lambda d: just(basis(d)), sampled_from(FP_EDGES), same, after=True, edges=FP_EDGES),
            "slots": _arg(
                lambda d: just(basis(d)),
                lambda d: sampled_from(slot_edges(d)),
                same,
                after=True,
                edges=slot_edges,
            ),
        },
        reads=True,
    )


def _is_tag(x: object) -> bool:
    """A tag ``impl.owners.encode`` writes for an owner in the domain, or a free or reserved slot's (``<= 0``), in
    int64."""
    if type(x) is not int or not -(2**63) <= x < 2**63:
        return False
    if x <= 0:
        return True
    for kind in OwnerKind:
        for comp in (None, *Component):
            o = Owner(kind, x & MAX_IDENT, comp)
            if D.is_owner(o) and encode(o) == x:
                return True
    return False


TAG_EDGES: tuple[object, ...] = (
    -(2**63) - 1,
    2**63,
    5 << 60,  # NOTE: no owner kind
    1,  # NOTE: no owner kind either (kind 0): the first tag above a free slot's
    (1 << 60) - 1,  # NOTE: the last tag of kind 0
    (2 << 60) | (9 << 56) | 1,  # NOTE: a tree node's, with no such component
    (2 << 60) | 1,  # NOTE: a tree node's, with no component
    (1 << 60) | (1 << 56) | 1,  # NOTE: a request's, with a component
    *SCALAR_EDGES,
)
"""Tags no ``encode`` writes: outside int64, an unknown kind or component (each side of the free tag's and the kinds'
bounds), a component where the kind has none (or none where it needs one), a scalar of each wrong type."""


def _decode_method() -> Method:
    """``impl.owners.decode``: a reading call of one tag ``encode`` writes (or a free or reserved slot's); any other
    value is refused, typed."""
    owners = sampled_from([request(3), session(2), Owner(OwnerKind.NODE, 5, SWA), Owner(OwnerKind.NODE, 0, FULL)])
    tags = st.one_of(sampled_from([FREE_TAG, RESERVED_TAG]), owners.map(encode))
    junk = st.one_of(sampled_from(TAG_EDGES), st.integers(-(2**64), 2**64).filter(lambda x: not _is_tag(x)))
    return Method("decode", decode, {"tag": _arg(tags, junk, lambda x: _is_tag(x), edges=TAG_EDGES)}, reads=True)


def _fingerprint_one_method() -> Method:
    """``impl.integrity.fingerprint_one``: a reading call of a token and a position, ints in ``[0, 2**31)``; anything
    else is refused, typed."""

    def inside(x: object) -> bool:
        return type(x) is int and 0 <= x < MAX_TOKEN  # NOTE: an int itself (not a bool, no subclass)

    edges = id_edges(MAX_TOKEN)
    arg = _arg(
        st.integers(0, MAX_TOKEN - 1), id_or_junk(MAX_TOKEN).filter(lambda x: not inside(x)), inside, edges=edges
    )
    return Method("fingerprint_one", fingerprint_one, {"token": arg, "position": arg}, reads=True)


def _node_tag_method() -> Method:
    """``impl.owners.node_tag``: a reading call of a tree node's id in ``[0, MAX_IDENT]`` (the ids an owner tag has
    room for); any other value is refused, typed."""
    ids = st.integers(0, MAX_IDENT) | sampled_from([0, MAX_IDENT])
    edges = (*id_edges(MAX_IDENT + 1), 2**64, -(2**63))

    def inside(x: object) -> bool:
        return type(x) is int and 0 <= x <= MAX_IDENT

    junk = sampled_from(edges) | id_or_junk(MAX_IDENT + 1).filter(lambda x: not inside(x))
    return Method("node_tag", node_tag, {"ident": _arg(ids, junk, inside, edges=edges)}, reads=True)


def _first(x: object) -> object:
    """A drawn match (the match and its key) as the call takes it: the match; junk as it is."""
    return x[0] if isinstance(x, tuple) and x else x


_FOREIGN: list[tuple[TreeNode, LockHandle]] = []


def _foreign() -> tuple[TreeNode, LockHandle]:
    """A node and a live handle of another cache (one, made once: no probe changes it)."""
    if not _FOREIGN:
        other = RadixCache(TokenAllocator(2))
        _FOREIGN.append((other.root, other.inc_lock_ref(other.root)))
    return _FOREIGN[0]


def _is_key(x: object) -> bool:
    return tokens_of(x) is not None


def _is_match(cache: RadixCache) -> Callable[[object], bool]:
    def inside(x: object) -> bool:
        if not isinstance(x, tuple):
            return False
        m = x[0]
        return isinstance(m, MatchResult) and cache._nodes.get(m.last_node.id) is m.last_node

    return inside


def _covering_key(d: Drawn) -> st.SearchStrategy[object]:
    """A key of the drawn match: its matched tokens, then anything (``verify`` reads the first ``length``)."""
    if not isinstance(d["match"], tuple):
        return key_forms([1], TENSOR_FORMS)  # NOTE: the match is the junk argument
    m, key = d["match"]
    head = key[: m.length]
    more = st.lists(st.integers(1, 3), max_size=3).flatmap(lambda more: key_forms(head + more, TENSOR_FORMS))
    return more | sampled_from([k for k in long_keys(head) if isinstance(k, torch.Tensor)])


def _short_key(d: Drawn) -> st.SearchStrategy[object]:
    m, key = d["match"] if isinstance(d["match"], tuple) else (None, [1])
    n = m.length if m is not None else 1
    return junk_keys(n) | just(key[:n]) | just(torch.tensor(key[: n - 1], dtype=torch.int64))


def _short_key_edges(d: Drawn) -> Sequence[object]:
    n = d["match"][0].length if isinstance(d["match"], tuple) else 1
    return junk_key_values(n)


def _covers(x: object, d: Drawn) -> bool:
    """A key covering the match: the matched tokens first (a key with other tokens is inside the domain, and then
    ``verify`` raises ``IntegrityError``: the probe draws none)."""
    if not isinstance(d["match"], tuple):
        return True  # NOTE: the match is the junk argument
    toks = tokens_of(x) if isinstance(x, torch.Tensor) else None  # NOTE: ``verify`` takes a tensor only
    m, key = d["match"]
    return toks is not None and toks[: m.length] == key[: m.length]


def _root_insert_method(c: _Cache) -> Method:
    """``insert`` of the empty key (no slots) by the prober, offering a Mamba state: no state sits at the root
    (``spec.prefix``), so the prober's own state, or junk, must be refused typed and change nothing. Without a state
    the call is inside its domain (it caches nothing), which the rules make."""
    cache, empty = c.cache, torch.empty(0, dtype=torch.int64)
    states = [c.state] if c.state is not None else []
    size = cache.mamba.pool.size if cache.mamba is not None else 4
    return Method(
        "insert of the empty key",
        lambda mamba_slot: cache.insert(empty, empty, c.prober, mamba_slot=mamba_slot),
        {
            "mamba_slot": _arg(
                st.none(),
                sampled_from([*states, *range(size)]) | id_or_junk(size),  # NOTE: a real state id, half the time
                lambda x: x is None,
                edges=(*dict.fromkeys([*states, *range(size)]), *id_edges(size)),
            )
        },
    )


def _insert_method(c: _Cache, ps: int) -> Method:
    """``insert(key, value, owner, mamba_slot)`` by the prober, of slots it holds, or of junk: another request's
    slots, free or cached ones, one of its own pages twice, too few or too many, malformed tensors, ids past the
    pool; another owner; a Mamba state it does not hold."""
    cache, held = c.cache, c.held
    n = len(held) - len(held) % ps
    own, pages, mine = held[:n], n // ps, set(held)
    kv = pools_of(cache.kv)["kv"]
    grain, end = _grain(cache), kv.size * _grain(cache)
    foreign = [x for xs in c.others.values() for x in xs]
    snap = snapshot_of(cache).prefix
    cached = [int(x) for xs in snap.full.values() for x in xs]
    free = [x for x in range(kv.base * grain, end) if x not in mine and x not in foreign]
    free = [x for x in free if x not in set(cached)]

    def with_page(src: list[int], i: int, j: int) -> torch.Tensor:
        """The prober's slots with their page ``i`` replaced by page ``j`` of ``src``."""
        return _slots(own[: i * ps] + src[j * ps : j * ps + ps] + own[i * ps + ps :])

    def swap(src: list[int]) -> st.SearchStrategy[object] | None:
        src = src[: len(src) - len(src) % ps]
        if not src:
            return None
        return st.tuples(st.integers(0, pages - 1), st.integers(0, len(src) // ps - 1)).map(
            lambda ij: with_page(src, *ij)
        )

    again = own[:ps] * 2 + own[2 * ps :]
    # NOTE: its own slots, but not whole pages in page order: the first page's slots reversed, or every slot moved
    # one position on (pages straddled): a paged pool's insert must refuse them (``PageAlignmentError``)
    torn = [own[:ps][::-1] + own[ps:], own[1:] + own[:1]] if grain > 1 and ps > 1 and own else []
    theirs = [
        s
        for s in (swap(foreign), swap(free), swap(cached), just(_slots(again)) if pages > 1 else None)
        if s is not None
    ]
    bad_values = [
        s
        for s in (
            st.one_of(*theirs) if theirs else None,  # NOTE: slots it does not hold, or one twice: half the junk
            just(_slots(own[:-ps])),
            just(_slots(own + own[:ps])),
            *(just(_slots(t)) for t in torn),
            just(_slots(own).float()),
            just(_slots(own).reshape(1, -1)),
            just(own),
            just(_slots([*own[:-1], end + 3])),
            just(_slots([*own[:-1], -1])),
        )
        if s is not None
    ]

    def swapped(src: list[int]) -> list[torch.Tensor]:
        """The first page of the prober's slots replaced by the first whole page of ``src`` (one edge per kind)."""
        return [with_page(src, 0, 0)] if len(src) >= ps and own else []

    value_edges: list[object] = [
        *swapped(foreign),
        *swapped(free),
        *swapped(cached),
        *([_slots(again)] if pages > 1 else []),
        _slots(own[:-ps]),
        _slots(own + own[:ps]),
        *(_slots(t) for t in torn),
        _slots(own).float(),
        _slots(own).reshape(1, -1),
        _slots(own).to_sparse(),  # NOTE: int64 ids of the right shape with no readable values (as the keys' junk)
        _slots(own).to("meta"),
        own,
        _slots([*own[:-1], end + 3]),
        _slots([*own[:-1], -1]),
    ]

    over_cached = [torch.tensor([*k[:ps], *[4] * (n - ps)]) for k in sorted(snap.full) if len(k) == ps and n >= ps]

    def partly_cached(d: Drawn) -> list[torch.Tensor]:
        """Where the key's first page is cached: that page with its last slot the prober's (a page only partly the
        cache's slots)."""
        key = tokens_of(d.get("key"))
        page = snap.full.get(tuple(key[:ps])) if key is not None and len(key) >= ps else None
        if ps < 2 or page is None or len(own) < ps:
            return []
        return [_slots([*page[:-1], own[ps - 1], *own[ps:]])]

    def value_edges_of(d: Drawn) -> list[object]:
        """The catalogue, and a page only partly the cache's slots where the key allows one."""
        return [*value_edges, *partly_cached(d)]

    def spec_refusal(v: object, d: Drawn) -> type[KVLedgerError] | None:
        """``SlotConflict`` where ``spec.prefix.check_insert`` gives it for these slots (one slot at two positions,
        a cached slot at another position, a page only partly the cache's); else any typed error."""
        key = tokens_of(d["key"])
        if key is None or not _readable_ids(v) or set(_ids(v)) & c.swa_dead:
            return None
        xs = v.tolist()
        if snap.window is not None and set(xs) & set(cached):
            # NOTE: a cached slot of an SWA cache may have lost its SWA slot, and that refusal may come first
            return SlotConflict if len(xs) == len(key) and len(set(xs)) < len(xs) else None
        err = P.check_insert(snap, tuple(key), tuple(xs), None)
        return SlotConflict if isinstance(err, SlotConflict) else None

    def value_inside(v: object, d: Drawn) -> bool:
        """As many slots as the key has tokens, in whole pages: each the cache's own for that position of the key, or
        the prober's; distinct."""
        key = tokens_of(d["key"])
        if key is None:
            return True  # NOTE: the key is the junk argument
        if not (_readable_ids(v) and v.numel() == n == len(key)):
            return False  # NOTE: a key of another length (one crossed from another call) has no value of n slots
        xs = v.tolist()
        if len(set(xs)) != n or set(xs) & c.swa_given:
            return False  # NOTE: a slot whose SWA slot another holds is not wholly the owner's, wherever it goes
        for p in range(pages):
            page = tuple(xs[p * ps : (p + 1) * ps])
            if snap.full.get(tuple(key[: (p + 1) * ps])) == page:
                continue
            if not all(x in mine for x in page) or (grain > 1 and page != tuple(range(page[0], page[0] + ps))):
                return False
            if any(x in c.swa_dead for x in page) and tuple(key[: (p + 1) * ps]) not in snap.full:
                return False  # NOTE: a new position's slot must still have its SWA slot (a cached one's is a dup)
        return True

    states = list(c.states)  # NOTE: any state the prober holds is its to offer, not only the first
    mamba = cache.mamba
    short = [torch.full((n - 1,), 4)] if ps > 1 and n > 1 else []

    def fitted(d: Drawn) -> st.SearchStrategy[object]:
        """The prober's slots; as many as the key has tokens where it has fewer and they are not whole pages (the
        call is then refused for its key alone, whatever it offers)."""
        key = tokens_of(d.get("key"))
        cut = key is not None and 0 < len(key) < n and len(key) % ps != 0
        return just(_slots(own[: len(key)] if cut and key is not None else own))

    cached_states = sorted(set(snap.mamba_state.values()))

    def state_refusal(x: object, d: Drawn) -> type[KVLedgerError] | None:
        """``SlotConflict`` where ``spec.prefix.check_insert`` gives it for this state with the drawn key and slots
        (a state cached at another key); else any typed error."""
        key, v = tokens_of(d["key"]), d["value"]
        if key is None or type(x) is not int or not _readable_ids(v):
            return None
        err = P.check_insert(snap, tuple(key), tuple(v.tolist()), MambaSlot(x))
        return SlotConflict if isinstance(err, SlotConflict) else None

    def state_inside(x: object, d: Drawn) -> bool:
        key = tokens_of(d["key"])
        if x is None:
            return True
        return type(x) is int and (x in states or (key is not None and snap.mamba_state.get(tuple(key)) == x))

    return Method(
        "insert",
        lambda key, value, owner, mamba_slot: cache.insert(key, value, owner, mamba_slot=mamba_slot),
        {
            "key": _arg(
                # NOTE: token 4 is in no cached key: a key with it reaches past what is cached (new positions); or
                # a cached key's first page, then new positions (a page the cache holds, and the prober's after it)
                st.one_of(
                    st.lists(st.integers(1, 4), min_size=n, max_size=n).map(torch.tensor),
                    *([sampled_from(over_cached)] if over_cached else []),
                ),
                junk_keys(n),
                _is_key,
                # NOTE: valid keys, all new or at the ids' edges: the value decides; and a key of valid tokens that
                # is not whole pages (one token short), which the value then matches in length
                edges=(*junk_key_values(n), torch.full((n,), 4), *edge_key_values(n), *short),
            ),
            "value": _arg(
                fitted,
                lambda d: st.one_of(bad_values[0], st.one_of(*bad_values[1:]), *(just(x) for x in partly_cached(d))),
                value_inside,
                after=True,
                edges=value_edges_of,
                refusal=spec_refusal,
            ),
            "owner": _arg(
                just(c.prober),
                owner_or_junk() | sampled_from([*c.others, request(93)]),
                lambda x: x == c.prober,
                edges=(*c.others, request(93), *OWNER_EDGES),
            ),
            "mamba_slot": _arg(
                sampled_from([None, *states]),
                id_or_junk(mamba.pool.size if mamba is not None else 4) | sampled_from([*cached_states, 0]),
                state_inside,
                after=True,
                # NOTE: and the states the tree holds (each cached at a key, so another key's insert may not take it)
                edges=(*cached_states, *id_edges(mamba.pool.size if mamba is not None else 4)),
                refusal=state_refusal,
            ),
        },
        weight=4,
    )


def _readable(v: object) -> TypeGuard[torch.Tensor]:
    """A 1-D tensor whose values can be read (strided: not sparse, not on the meta device)."""
    return isinstance(v, torch.Tensor) and v.layout == torch.strided and not v.is_meta and v.dim() == 1


def _readable_ids(v: object) -> TypeGuard[torch.Tensor]:
    """An int64 1-D tensor whose values can be read."""
    return _readable(v) and v.dtype == torch.int64


def _ids(v: object) -> list[int]:
    return v.tolist() if _readable(v) and not v.is_floating_point() else []


def _grain(cache: RadixCache) -> int:
    return cache.kv.page_size if isinstance(cache.kv, PagedAllocator) else 1


def cache_scenario(kind: str, draw: Draw) -> Scenario:
    """A radix cache over a fresh pool of ``kind`` (token, paged, SWA; a Mamba pool beside a token one)."""
    c = _build_cache(kind, draw)
    story = [f"RadixCache over {kind}: cached {c.keys}, locked {[k for _, k in c.matches]}"]
    return Scenario(
        "RadixCache",
        _cache_methods(c),
        lambda: _cache_fingerprint(c.cache),
        story,
        lambda draw: f"{cache_audit(c.cache)}; {lru_audit(c.cache, draw)}",
        partial(_cache_call_on_copy, c),
        short_of=_cache_short_of(c.cache),
        probes_on_copy=False,
        pools=partial(_cache_pools, c.cache),
    )


_SHARED = (types.BuiltinFunctionType, type, types.ModuleType, int, float, str, bytes, Enum)
"""What a call may close over and share with its twin on a copy: built-in code, types and values nothing changes."""


def _frozen(x: object) -> bool:
    """A frozen dataclass's instance (an ``Owner``, a ``LockHandle``): a value nothing changes."""
    params = getattr(type(x), "__dataclass_params__", None)
    return params is not None and bool(params.frozen)


def rebound(call: Callable[..., object], memo: Mapping[int, object]) -> Callable[..., object] | None:
    """``call`` made on the copies ``memo`` (a ``deepcopy`` memo) holds: a bound method of a copied object, bound
    to its copy (of an object not copied, ``None``, unless nothing changes it); a function closing over copied
    objects, closing over their copies (its code and globals shared).
    ``None`` when ``call`` closes over something else that can change (a list built beside the object): then only
    building the call again over the copy makes it on the copy alone.

    NOTE: a scenario's methods close over its object; rebinding them costs a few attribute reads, where building
    the methods again over the copy builds every argument's strategies and catalogues (milliseconds a call)."""
    if isinstance(call, types.MethodType):
        obj = call.__self__
        if id(obj) in memo:
            return types.MethodType(call.__func__, memo[id(obj)])
        return call if isinstance(obj, _SHARED) or _frozen(obj) else None  # NOTE: an object the copy did not take
    if not isinstance(call, types.FunctionType):
        return None
    cells = []
    for cell in call.__closure__ or ():
        x = cell.cell_contents
        if id(x) in memo:
            cells.append(types.CellType(memo[id(x)]))
        elif x is None or isinstance(x, _SHARED) or _frozen(x):
            cells.append(cell)
        elif isinstance(x, types.FunctionType | types.MethodType) and (inner := rebound(x, memo)) is not None:
            cells.append(types.CellType(inner))  # NOTE: a call that calls another: that one rebound too
        else:
            return None
    if not cells:
        return call
    fn = types.FunctionType(call.__code__, call.__globals__, call.__name__, call.__defaults__, tuple(cells))
    fn.__kwdefaults__ = call.__kwdefaults__
    return fn


def _cache_pools(cache: RadixCache) -> dict[str, SlotPool]:
    """A cache's pools by ledger name."""
    out = dict(pools_of(cache.kv))
    if cache.mamba is not None:
        out["mamba"] = cache.mamba.pool
    return out


def _cache_short_of(cache: RadixCache) -> frozenset[str]:
    """What a cache's ``OverAllocation`` may name as short: its pools."""
    return frozenset(pools_of(cache.kv)) | ({"mamba"} if cache.mamba is not None else set())


def _made_on_a_copy(
    what: str,
    obj: T,
    method: Method,
    args: Mapping[str, object],
    methods: Callable[[T], tuple[Method, ...]],
) -> tuple[T, BaseException | None, str]:
    """``method`` made with ``args`` on a copy of ``obj`` and of the arguments together (the call rebound to the
    copy, or taken from ``methods`` built over it): (the copy, what the call raised, the call shown)."""
    memo: dict[int, object] = {}
    twin, kw = deepcopy((obj, dict(args)), memo)
    call = rebound(method.call, memo) or {x.what: x for x in methods(twin)}[method.what].call
    shown = f"{what}.{method.what}({', '.join(f'{k}={_show(v)}' for k, v in args.items())}) on a copy"
    return twin, raised(lambda: call(**kw)), shown


def _cache_call_on_copy(c: _Cache, method: Method, args: Mapping[str, object]) -> str:
    """``Scenario.on_copy`` of a cache: ``method`` made with ``args`` (inside its domain: a catalogue value at the
    edge of the valid, a key of ids at the ends of their range) on a copy of the cache and of the arguments
    together, so they name the copy's nodes, matches and handles. The call must be made: a refusal is allowed
    only for want of room (an ``OverAllocation`` naming one of the cache's pools), and never an untyped crash.

    Raises ``AssertionError`` naming ``inv_domain_enforced`` (a valid call refused, or crashed) or
    ``inv_names_culprit``."""
    twin_c, err, shown = _made_on_a_copy("RadixCache", c, method, args, _cache_methods)
    if err is not None and not isinstance(err, OverAllocation):
        raise AssertionError(f"inv_domain_enforced: {shown} lies in its domain and was refused: {err!r}")
    _names_what_was_short(err, _cache_short_of(twin_c.cache), lambda: shown)
    return f"{shown}: {'refused' if err is not None else 'made'}"


def _planted_breaks(lru: LRUList[TreeNode]) -> Iterator[tuple[str, BaseException | None]]:
    """Break ``lru``'s links one way at a time, run its ``check()``, put the link back: (the break, what the check
    raised). The breaks: the first member's back pointer aimed at itself, or at nothing on an empty list (an
    asymmetric link), the head's link cut (a chain that ends early), and the first member spliced out of the
    chain, its neighbours linked to each other both ways (every link symmetric, a member the walk never meets). A
    cycle is not planted: a check that misses it would walk it forever."""
    i, head = lru.slot, lru.head
    first = head.next[i]
    assert first is not None
    old = first.prev[i]
    first.prev[i] = first if first is not lru.tail else None  # NOTE: never the head: the link would be whole again
    try:
        yield f"a back pointer of node {first.id} planted wrong", raised(lru.check)
    finally:
        first.prev[i] = old
    head.next[i] = None
    try:
        yield "the head's link planted cut", raised(lru.check)
    finally:
        head.next[i] = first
    if first is lru.tail:
        return
    after = first.next[i]
    assert after is not None
    head.next[i], after.prev[i] = after, head
    try:
        yield f"node {first.id} planted out of the chain (a member no walk meets)", raised(lru.check)
    finally:
        head.next[i], after.prev[i] = first, first


def _planted_lru_cycles(lru: LRUList[TreeNode]) -> str:
    """Plant a cycle in ``lru`` for each of its walks, one at a time, and put the link back: the MRU member's back
    pointer aimed at the LRU member through the node's public view ``lru_prev`` (a live view: a write through it is
    the link; ``iter_lru``, from the tail, then comes round again), the LRU member's forward
    pointer aimed at the MRU member (``order()``, from the head). Each walk must raise ``IntegrityError`` before it
    passes a node twice (at most one pass over the members); what went wrong, or "". The tail walk is read
    through ``islice``, so a walk without a guard is reported here, not walked forever."""
    i, head, tail = lru.slot, lru.head, lru.tail
    mru, lru_most = head.next[i], tail.prev[i]
    if mru is None or mru is tail or lru_most is None or lru_most is head:
        return ""
    n = len(lru)
    walked: list[int] = []

    def tail_walk() -> None:
        walked.extend(x.id for x in islice(lru.iter_lru(), n + 2))

    old = mru.prev[i]
    mru.lru_prev[lru.component] = lru_most  # NOTE: through the public view, which is live: the walk must see it
    try:
        err = raised(tail_walk)
    finally:
        mru.prev[i] = old
    if not isinstance(err, IntegrityError) or len(set(walked)) != len(walked):
        return f"iter_lru of the {lru.component.value} list with a cycle planted passed {walked} and raised {err!r}"
    old = lru_most.next[i]
    lru_most.next[i] = mru
    try:
        err = raised(lru.order)
    finally:
        lru_most.next[i] = old
    if not isinstance(err, IntegrityError):
        return f"order() of the {lru.component.value} list with a cycle planted raised {err!r}"
    return ""


def _lock_counts(cache: RadixCache) -> object:
    """Every node's lock counts and the cache's sizes: what a failed lock or release must leave as it found."""
    return [list(x.refs) for x in cache.nodes()], cache.sizes()


class _Walked(Exception):
    """A call under :func:`_bounded` ran past its bound."""


def _bounded(call: Callable[[], object], seconds: float) -> BaseException | None:
    """``raised(call)``, but a call that has spent ``seconds`` of this process's CPU time is stopped with
    :class:`_Walked` (a profiling alarm in the main thread: a walk round a planted cycle must not grow its list for
    the whole step's watchdog). CPU time, not wall time: a healthy call on a machine loaded by other work is slowed
    in wall time only, and is never taken for a walk; a walk round a cycle spends CPU all the while. The step
    watchdog's wall-clock alarm is another timer and runs on untouched; an enclosing profiling alarm is put back,
    less the CPU time spent.

    NOTE: the alarm fires again every tenth of a CPU second until the call returns: a signal handler's exception
    raised inside a callback that swallows it (Hypothesis' garbage-collection hook: "Exception ignored in ...")
    would otherwise leave the walk running, and its list growing, for ever."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        return raised(call)
    armed = [True]

    def fire(_signum: int, _frame: object) -> None:
        if armed[0]:
            raise _Walked(f"still running after {seconds:g} s of CPU time")

    saved, (left, every) = signal.signal(signal.SIGPROF, fire), signal.getitimer(signal.ITIMER_PROF)
    start = time.process_time()
    signal.setitimer(signal.ITIMER_PROF, seconds, 0.1)
    try:
        try:
            got = raised(call)
        finally:
            armed[0] = False
        return got
    except _Walked as late:  # NOTE: a fire between the call's end and the disarm: it ran to its bound
        return late
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, saved)
        if left > 0:
            signal.setitimer(signal.ITIMER_PROF, max(left - (time.process_time() - start), 1e-3), every)


def _planted_cycle(cache: RadixCache) -> str:
    """Link the newest node's parent to itself (a parent cycle) and make each public call of the cache that takes a
    node (found by its signature: one added later is met too) on it, then put the link back: each must answer or
    fail typed (``IntegrityError``) at once, never walk the cycle, and leave every lock count and size as it was;
    ``inc_lock_ref`` (a walk to the root) must fail. What went wrong, or ""."""
    nodes = [n for n in cache.nodes() if n is not cache.root]
    if not nodes:
        return ""
    n = max(nodes, key=lambda x: x.id)
    before = _lock_counts(cache)
    fixed: dict[str, object] = {"comp": cache.components[0], "op": "audit"}
    for name, fn in inspect.getmembers(RadixCache, inspect.isfunction):
        params = [k for k in inspect.signature(fn).parameters if k != "self"]
        hints = {k: str(v) for k, v in fn.__annotations__.items() if k != "return"}
        if name.startswith("_") or "TreeNode" not in hints.values() or not set(params) <= {*hints, *fixed}:
            continue
        args = [n if hints[k] == "TreeNode" else fixed[k] for k in params]
        parent, n.parent = n.parent, n
        try:
            err = _bounded(partial(getattr(cache, name), *args), 1.0)
        finally:
            n.parent = parent
        if isinstance(err, _Walked) or (err is not None and not isinstance(err, IntegrityError)):
            return f"{name} of node {n.id} with a parent cycle planted: {err!r}"
        if name == "inc_lock_ref" and err is None:
            return f"inc_lock_ref of node {n.id} with a parent cycle planted was accepted"
        if _lock_counts(cache) != before:
            return f"{name} of node {n.id} with a parent cycle planted changed the lock counts or sizes"
    return ""


def _covering_answers(cache: RadixCache) -> str:
    """On a deep copy of ``cache``: ``handles_covering`` answers, for every node and component, how many live handles
    cover it (``live_handles``), before a lock, after ``inc_lock_ref`` of the newest node, and after its release (a
    count kept between calls must follow each change); what went wrong, or ""."""
    dup = deepcopy(cache)

    def wrong(when: str) -> str:
        live = dup.live_handles().values()
        for x in dup.nodes():
            for comp in dup.components:
                want = sum(1 for cov in live if (x.id, comp) in cov)
                got = dup.handles_covering(x.id, comp)
                if got != want:
                    return f"handles_covering({x.id}, {comp.value}) {when}answers {got}; {want} live handles cover it"
        return ""

    nodes = [n for n in dup.nodes() if n is not dup.root]
    first = wrong("")
    if first or not nodes:
        return first
    n = max(nodes, key=lambda x: x.id)
    handle = dup.inc_lock_ref(n)
    after = wrong(f"after inc_lock_ref of node {n.id} ")
    if after:
        return after
    dup.dec_lock_ref(handle)
    return wrong(f"after inc_lock_ref and dec_lock_ref of node {n.id} ")


def _planted_unheld(cache: RadixCache) -> str:
    """On a deep copy of ``cache``, lose the last count a live handle holds (its counter set to 0) and release the
    handle: ``dec_lock_ref`` must fail typed (``IntegrityError``), put back every counter it lowered before it
    found the loss (the lost one stays 0), leave the sizes, and keep the handle live; what went wrong, or ""."""
    live = [(h, cov) for h, cov in cache.live_handles().items() if cov]
    if not live:
        return ""
    dup = deepcopy(cache)
    hid, cov = live[-1]
    nid, comp = cov[-1]
    node = next(x for x in dup.nodes() if x.id == nid)
    node.lock_ref[comp] = 0  # NOTE: through the public view, which is live (``refs``)
    before = _lock_counts(dup)
    handle = LockHandle(hid, dup._locks.ident, cov[0][0], tuple(cov))
    err = raised(lambda: dup.dec_lock_ref(handle))
    what = f"dec_lock_ref of handle {hid} with the count of node {nid} {comp.value} planted lost"
    if not isinstance(err, IntegrityError):
        return f"{what}: {err!r}"
    if _lock_counts(dup) != before or not dup.is_live(handle):
        return f"{what} failed and changed the other lock counts, the sizes or the handle"
    return ""


HAND_OVERS = ("cached whole", "cached in part", "cached as int32", "transferred", "freed", "SWA slots freed")
"""How ``_handed_over`` moves a fresh owner's two pages (or, with an SWA pool, the SWA slots of one: a window
moved past them) out of its hands before it uses them again."""


def _stale_match(cache: RadixCache) -> str:
    """A match is a reference into the tree: once its node is evicted, every call that takes it must refuse it. On a
    deep copy of ``cache``, the longest cached key with no lock on its node is matched, everything no lock holds is
    evicted, and ``verify`` of that match (and, with Mamba, a copy-on-write of it) must fail typed and change
    nothing; what went wrong, or ""."""
    dup = deepcopy(cache)
    nodes = [n for n in dup.nodes() if n is not dup.root and not n.children and not any(n.refs)]
    if not nodes:
        return ""
    n = max(nodes, key=lambda x: x.end)
    key = dup.prefix(n)
    m = dup.match_prefix(key)
    dup.evict(FULL, 1 << 30)
    if dup._nodes.get(m.last_node.id) is m.last_node:
        return ""  # NOTE: still cached (an ancestor of a locked node)
    calls: list[tuple[str, Callable[[], object]]] = [("verify", lambda: dup.verify(m, key))]
    if dup.mamba is not None:
        calls.append(("mamba_copy_on_write", lambda: dup.mamba_copy_on_write(m, request(97))))
    for what, call in calls:
        before = _cache_fingerprint(dup)
        err = raised(call)
        if not isinstance(err, KVLedgerError):
            got = "accepted" if err is None else f"raised {err!r}"
            return f"{what} of a match of {key.tolist()} whose node {m.last_node.id} was evicted was {got}"
        if _cache_fingerprint(dup) != before:
            return f"{what} of a stale match of {key.tolist()}, refused, changed the cache"
    return ""


def _long_match(cache: RadixCache) -> None:
    """A key past every cut-off for short keys (``LONG_KEY`` tokens: the smallest and the largest id among them)
    matches as its cached head does. On a deep copy of ``cache``, each of ``long_keys`` of the longest cached key
    must be matched, not refused (``inv_domain_enforced``), to exactly that key's length and slots (``results equal
    the spec's``: the rest of the key is cached nowhere)."""
    dup = deepcopy(cache)
    leaves = [n for n in dup.nodes() if n is not dup.root and not n.children]
    head = dup.prefix(max(leaves, key=lambda x: x.end)).tolist() if leaves else []
    want = dup.match_prefix(torch.tensor(head, dtype=torch.int64))
    for key in long_keys(head):
        try:
            got = dup.match_prefix(key)  # type: ignore[arg-type]
        except Exception as err:  # NOTE: typed or not, a refusal inside the domain
            raise AssertionError(
                f"inv_domain_enforced: match_prefix of a key of {LONG_KEY} tokens (cached head {head}, then "
                f"{_show(key)}) lies in its domain and was refused: {err!r}"
            ) from None
        if (got.length, got.indices.tolist()) != (want.length, want.indices.tolist()):
            raise AssertionError(
                f"results equal the spec's: match_prefix of a key of {LONG_KEY} tokens (cached head {head}) matched "
                f"{got.length} tokens {got.indices.tolist()}, its head {want.length} {want.indices.tolist()}"
            )


def _handed_over(cache: RadixCache) -> str:
    """Slots that changed hands are no longer their old holder's, even when its pool remembers handing them out. On
    a deep copy of ``cache`` per move (``HAND_OVERS``), with runs looked for from one slot on, a fresh owner
    allocates two pages and caches both (as int64 or int32 ids) or the first under a new key, or transfers them, or
    frees them, or frees the SWA slots of the first; then it frees both (after a free: caches both). That use must
    fail typed and change nothing; what went wrong, or ""."""
    owner, other = request(98), request(99)
    for how in HAND_OVERS:
        if how.startswith("SWA") and not isinstance(cache.kv, SWATokenAllocator):
            continue
        dup = deepcopy(cache)
        ps, kv = dup.page_size, dup.kv
        if kv.available_size() < 2 * ps:
            return ""
        for pool in pools_of(kv).values():
            pool.run_min = 1  # NOTE: an alloc of two slots is then a run, freed through the run path
        slots = kv.alloc(2 * ps, owner)
        key = torch.full((2 * ps,), 4, dtype=torch.int64)
        if how.startswith("cached"):
            n = ps if how == "cached in part" else 2 * ps
            dup.insert(key[:n], slots[:n].to(torch.int32) if how == "cached as int32" else slots[:n], owner)
        elif how == "transferred":
            kv.transfer(slots, owner, other)
        elif how == "freed":
            kv.free(slots, owner)
        else:
            cast(SWATokenAllocator, kv).free_swa(slots[:ps], owner)
        before = _cache_fingerprint(dup)
        use = "cache" if how in ("freed", "SWA slots freed") else "free"
        err = raised(lambda: dup.insert(key, slots, owner) if use == "cache" else kv.free(slots, owner))  # noqa: B023
        what = f"{owner}'s slots {slots.tolist()}, {how}, then {use}d by it"
        if not isinstance(err, KVLedgerError):
            return f"{what}: {err!r}"
        if _cache_fingerprint(dup) != before:
            return f"{what}: refused, but the cache changed"
    return ""


ALIAS_WIDTHS = ("i", "h", "b")
"""The narrower integer ``array`` typecodes ``_aliased_keys`` reads a key's int64 bytes in (``q``'s width is the
key's own; an unsigned code reads these small ids' bytes as its signed twin does)."""


def _aliased_keys(cache: RadixCache) -> str:
    """A key is its ids, whatever width holds them: a call with an ``array`` of a narrower integer typecode whose
    bytes are those of the key last matched (ids ``[t0, 0, t1, 0, ...]`` in an ``array("i")`` after a match of
    ``[t0, t1, ...]``) is the call with those ids as int64. An implementation that remembers a key by its bytes
    (a walk memo, a cache of converted keys) and takes another width's bytes for them reads another key.

    Per width (``ALIAS_WIDTHS``), a cached key is chosen (the longest, or its first page, whichever leaves room for
    as many slots as its alias has ids; the longest when neither does), and the alias is given right after a match
    of that key, once in its narrower typecode and once as the same ids in an ``array("q")``, each on its own deep
    copy of ``cache``: a match of it; and, where the pool has room for a fresh owner to hold as many slots as it
    has ids, an insert of it by that owner, then a match (a full pool still has every width's match compared).
    Both forms must be answered alike (the match's length and slots; the insert's refusal type, or its
    ``prefix_len`` and duplicates) and end in the same state. What differed, or ""."""
    leaves = [n for n in cache.nodes() if n is not cache.root and not n.children]
    if not leaves:
        return ""
    longest = cache.prefix(max(leaves, key=lambda x: x.end)).tolist()
    for code in ALIAS_WIDTHS:
        width = 8 // array(code).itemsize
        room = cache.kv.available_size()
        head = next((k for k in (longest, longest[: cache.page_size]) if len(k) * width <= room), None)
        alias = array(code, array("q", head or longest).tobytes())
        mine, theirs = (
            _alias_answers(cache, head or longest, key, insert=head is not None)
            for key in (alias, array("q", list(alias)))
        )
        if mine != theirs:
            how = "" if mine[-1] == theirs[-1] else "; and the cache ends in another state"
            return (
                f"a key of ids {list(alias)} in an array({code!r}) (the bytes of {head or longest}, the key just "
                "matched) is "
                f"answered {mine[:-1]}, the same ids as int64 {theirs[:-1]} (match; insert, match after){how}"
            )
    return ""


def _alias_answers(
    cache: RadixCache, head: list[int], key: array[int], *, insert: bool
) -> tuple[object, object, object, object]:
    """``_aliased_keys``' calls of ``key``, each right after a match of ``head`` on its own deep copy of ``cache``:
    (a match's answer; an insert's by a fresh owner of as many slots as ``key`` has ids; a match's after that
    insert; the state then), the insert and the match after it ``None`` without ``insert`` (the state is then
    the first copy's, after its match)."""

    def matched(dup: RadixCache) -> object:
        try:
            m = dup.match_prefix(key)
        except Exception as err:  # NOTE: typed or not, the answer is what is compared
            return type(err).__name__
        return (m.length, m.indices.tolist())

    first = deepcopy(cache)
    first.match_prefix(array("q", head))
    alone = matched(first)
    if not insert:
        return alone, None, None, _cache_fingerprint(first)
    dup = deepcopy(cache)
    dup.match_prefix(array("q", head))
    slots = dup.kv.alloc(len(key), request(97))
    try:
        res = dup.insert(key, slots, request(97))
    except Exception as err:  # NOTE: as above
        inserted: object = type(err).__name__
    else:
        inserted = (res.prefix_len, res.dup_indices.tolist(), res.dup_mamba)
    return alone, inserted, matched(dup), _cache_fingerprint(dup)


def _recomputed_sizes(cache: RadixCache, what: str) -> str:
    """``recompute_sizes()`` (the counters recomputed from the tree) equals ``sizes()`` (the maintained ones); what
    went wrong, or ""."""
    try:
        got = cache.recompute_sizes()
    except Exception as err:  # NOTE: as ``raised`` takes them: any exception is a finding here
        return f"recompute_sizes() of {what} raised {err!r}"
    kept = cache.sizes()
    return "" if got == kept else f"recompute_sizes() of {what} is {got}, sizes() {kept}"


def _fresh_self_checks(cache: RadixCache) -> str:
    """A cache built afresh like ``cache`` (over a copy of its pools, nothing cached yet) is one root, holds nothing,
    and its own checks pass on it: each list's ``check()`` (a list that never had a member is a chain too), the
    sizes recompute; what went wrong, or ""."""
    mamba = deepcopy(cache.mamba)
    fresh = RadixCache(deepcopy(cache.kv), page_size=cache.page_size, swa_window=cache.swa_window, mamba=mamba)
    for comp in fresh.components:
        err = raised(fresh.lru(comp).check)
        if err is not None:
            return f"a fresh cache's {comp.value} LRU list's check() raised {err!r}"
        if len(fresh.lru(comp)) or fresh.lru(comp).lru_first() is not None:
            return f"a fresh cache's {comp.value} LRU list is not empty"
    if fresh.node_count() != 1 or any(e or p for e, p in fresh.sizes().values()):
        return f"a fresh cache has {fresh.node_count()} nodes and sizes {fresh.sizes()}"
    return _recomputed_sizes(fresh, "a fresh cache")


def _fixed_views(cache: RadixCache) -> str:
    """A node's per-component views (``lock_ref``, ``lru_prev``, ``lru_next``: live mappings with one entry per
    component) have no entry to delete: each way to delete one (``del``, ``pop``, ``popitem``, ``clear``, each
    bounded to a second: a ``clear`` over a delete that does nothing never ends) must be refused and leave the view
    as it was. A delete dropped in silence loses what its caller asked for. What went wrong, or ""."""
    n = max(cache.nodes(), key=lambda x: x.id)  # NOTE: on the cache itself: a refused delete changes nothing
    comp = cache.components[0]
    for name in ("lock_ref", "lru_prev", "lru_next"):
        for how, call in (
            ("del", lambda v: v.__delitem__(comp)),
            ("pop", lambda v: v.pop(comp)),
            ("popitem", lambda v: v.popitem()),
            ("clear", lambda v: v.clear()),
        ):
            view = getattr(n, name)
            before = dict(view)
            err = _bounded(partial(call, view), 1.0)
            if err is None or isinstance(err, _Walked) or dict(getattr(n, name)) != before:
                got = "accepted" if err is None else repr(err)
                return f"{how} of an entry of node {n.id}'s {name} (one per component): {got}, view now {dict(view)}"
    return ""


def cache_audit(cache: RadixCache) -> str:
    """The cache's own self-checks and counters agree with its state: each component's LRU list passes its
    ``check()`` and fails it, typed, with a link planted broken (``_planted_breaks``; the link is put
    back), its walks raise typed before they pass a node twice with a cycle planted (``_planted_lru_cycles``), a
    lock of a node planted with a parent cycle fails typed and changes nothing (``_planted_cycle``), a
    release of a handle whose count was planted lost fails typed and puts back what it lowered (``_planted_unheld``),
    slots a fresh owner hands to the cache are no longer its to free (``_handed_over``), a match whose node was
    evicted is refused (``_stale_match``), a key past the cut-offs for short keys matches as its head (``_long_match``),
    ``handles_covering`` answers the live handles' count before and after a lock and its release
    (``_covering_answers``), ``recompute_sizes()`` equals ``sizes()``, a cache built afresh like it passes the same
    self-checks (``_fresh_self_checks``), a node's per-component views refuse a delete (``_fixed_views``), a key
    in a narrower integer array is answered as the same ids in int64 (``_aliased_keys``), and
    ``node_count()`` is the number of nodes a walk from the root through
    ``children`` meets.

    Raises ``AssertionError`` naming ``self-checks agree with the state`` otherwise (a healthy cache whose own
    check raises, or whose counter bounds a walk wrongly, misleads every caller that trusts them)."""
    law = "self-checks agree with the state"
    for comp in cache.components:
        err = raised(cache.lru(comp).check)
        if err is not None:
            raise AssertionError(f"{law}: {comp.value} LRU list's check() raised on a healthy cache: {err!r}")
        for how, err in list(_planted_breaks(cache.lru(comp))):  # NOTE: every link back before a verdict
            if not isinstance(err, IntegrityError):
                raise AssertionError(f"{law}: {comp.value} LRU list's check() passed {how}: {err!r}")
        cycled = _planted_lru_cycles(cache.lru(comp))
        if cycled:
            raise AssertionError(f"{law}: {cycled}")
    broken = (
        _planted_cycle(cache)
        or _planted_unheld(cache)
        or _handed_over(cache)
        or _stale_match(cache)
        or _covering_answers(cache)
        or _recomputed_sizes(cache, "the cache")
        or _fresh_self_checks(cache)
        or _fixed_views(cache)
        or _aliased_keys(cache)
    )
    if broken:
        raise AssertionError(f"{law}: {broken}")
    _long_match(cache)
    seen, todo = {cache.root.id}, [cache.root]
    while todo:
        for child in todo.pop().children.values():
            if child.id not in seen:
                seen.add(child.id)
                todo.append(child)
    if cache.node_count() != len(seen):
        raise AssertionError(f"{law}: node_count() is {cache.node_count()}, a walk from the root meets {len(seen)}")
    return f"cache audit: {len(seen)} nodes, lists of {', '.join(c.value for c in cache.components)}"


def _chain(lst: LRUList[Linked]) -> list[Linked]:
    """``lst``'s nodes from head to tail, walked through the pointers (at most one more than its members)."""
    out, i = list[Linked](), lst.slot
    x = lst.head.next[i]
    while x is not None and x is not lst.tail and len(out) <= len(lst):
        out.append(x)
        x = x.next[i]
    return out


def _list_print(lst: LRUList[Linked], nodes: Sequence[Linked]) -> tuple[object, ...]:
    """Everything a list call may change: the chain by identity, each node's pointers, the members."""
    i = lst.slot
    return (
        [id(x) for x in _chain(lst)],
        [(id(n.prev[i]), id(n.next[i])) for n in nodes],
        sorted(id(x) for x in nodes if x in lst),
    )


def _misuses(
    lst: LRUList[Linked], a: Linked, b: Linked, out: Linked
) -> list[tuple[str, Callable[[], object], type, int]]:
    """Calls of ``lst`` outside their domain (``spec.lru``'s ``check_*``), each with the error class it must raise
    and the node it must name (its id; -1 for a value that is no node): members ``a``, ``b``; ``out`` a node never
    linked."""
    dangling = Linked(10**6 + 1)
    dangling.next[lst.slot] = a  # NOTE: still points into a list: inserting it would corrupt that one
    return [
        ("place naming a member twice", lambda: lst.place([a, b, a]), AlreadyInList, a.id),
        ("place naming a node outside the list", lambda: lst.place([a, out]), NotInList, out.id),
        ("place naming a non-node", lambda: lst.place([a, "x"]), NotInList, -1),  # type: ignore[list-item]
        ("place of a string", lambda: lst.place("ab"), NotInList, -1),  # type: ignore[arg-type]
        ("touch of a node outside the list", lambda: lst.touch(out), NotInList, out.id),
        ("touch_all naming a member twice", lambda: lst.touch_all([b, b]), AlreadyInList, b.id),
        ("remove of a node outside the list", lambda: lst.remove(out), NotInList, out.id),
        ("insert_behind an anchor outside the list", lambda: lst.insert_behind(out, dangling), NotInList, out.id),
        ("insert_ahead_of an anchor outside the list", lambda: lst.insert_ahead_of(out, dangling), NotInList, out.id),
        ("more_recent of a node outside the list", lambda: lst.more_recent(out), NotInList, out.id),
        # NOTE: every insert, given each kind of node it must not link (next to a member anchor)
        *(
            (f"{name} of {what}", partial(insert, bad), err, bad.id)
            for name, insert in (
                ("insert_mru", lst.insert_mru),
                ("insert_behind", partial(lst.insert_behind, a)),
                ("insert_ahead_of", partial(lst.insert_ahead_of, a)),
            )
            for what, bad, err in (("a member", b, AlreadyInList), ("a node still linked", dangling, AlreadyInList))
        ),
        # NOTE: every call that takes a node, and every anchor, given each kind of non-node: a call that lets one
        # kind through to its membership test misnames it, or crashes on one that cannot be hashed
        *(
            (f"{name} of {what}", partial(call, bad), err, -1)  # type: ignore[arg-type]  # NOTE: junk on purpose
            for name, call, err in (
                ("insert_mru", lst.insert_mru, UnknownNode),
                ("insert_behind", partial(lst.insert_behind, a), UnknownNode),
                ("insert_ahead_of", partial(lst.insert_ahead_of, a), UnknownNode),
                ("insert_behind's anchor", lambda x: lst.insert_behind(x, out), UnknownNode),
                ("insert_ahead_of's anchor", lambda x: lst.insert_ahead_of(x, out), UnknownNode),
                ("remove", lst.remove, UnknownNode),
                ("more_recent", lst.more_recent, UnknownNode),
                ("touch", lst.touch, NotInList),  # NOTE: ``place`` names a non-node as not in the list
            )
            for what, bad in _NON_NODES
        ),
        # NOTE: every call that takes a list of nodes, given each kind of value that is no list: one member alone
        # (the likeliest slip), None, an int, a set, a dict, an iterator (a list must keep its order)
        *(
            (f"{name} of {what}", partial(call, bad), NotInList, -1)  # type: ignore[arg-type]  # NOTE: junk on purpose
            for name, call in (("place", lst.place), ("touch_all", lst.touch_all))
            for what, bad in (
                ("one member, not a list", a),
                ("None", None),
                ("an int", 7),
                ("a set", {a, b}),
                ("a dict", {a: 1}),
                ("an iterator", iter([a])),
            )
        ),
    ]


def _bad_id_node() -> Linked:
    x = Linked(0)
    x.id = "0"  # type: ignore[assignment]  # NOTE: junk on purpose
    return x


_NON_NODES: tuple[tuple[str, object], ...] = (
    ("an int", 7),
    ("a string", "7"),
    ("None", None),
    ("a list (unhashable)", [7]),
    ("a node whose id is no int", _bad_id_node()),
)
"""Each kind of value that is no node an LRU list can hold (``impl.lru._check_node``)."""


def lru_audit(cache: RadixCache, draw: Draw) -> str:
    """Each LRU list of ``cache``, mirrored (``_mirror``), refines ``spec.lru`` through its public calls: a call
    outside its domain raises the spec's error class and changes nothing (no pointer, no member); ``place`` of a drawn
    selection of members in a drawn order (its first nodes, a drawn number of them, already in place), ``touch``,
    ``insert_mru``, ``insert_behind``, ``insert_ahead_of`` and ``remove`` leave the order the spec's transitions
    give, ``more_recent``, ``lru_first`` and ``iter_lru`` read it, and the list passes its ``check()`` after each.

    Raises ``AssertionError`` naming ``results equal the spec's``, ``inv_domain_enforced``, ``rejected call
    leaves state unchanged``, ``inv_lru_links_symmetric`` or ``inv_lru_detached``."""
    fresh = count(10**6 + 2)
    done = [c.value for c in cache.components if _audit_list(c.value, _mirror(cache.lru(c)), draw, fresh)]
    return f"lru audit: {', '.join(done) or 'no list of two'}"


def _mirror(lst: LRUList[TreeNode]) -> LRUList[Linked]:
    """A new list of ``lst``'s component holding new nodes with its members' ids in its order (no tree, no tensor
    to copy)."""
    out: LRUList[Linked] = LRUList(lst.component)
    for x in reversed(_chain(cast(LRUList[Linked], lst))):
        out.insert_mru(Linked(x.id))
    return out


def _audit_list(name: str, lst: LRUList[Linked], draw: Draw, fresh: Iterator[int]) -> bool:
    """``lru_audit`` of one list (``name``: its component); ``False`` when it has fewer than two members."""
    members = _chain(lst)
    if len(members) < 2:
        return False
    a, b = draw(st.permutations(members))[:2]
    out = Linked(next(fresh))
    nodes = [*members, out]
    for what, call, want, culprit in _misuses(lst, a, b, out):
        before = _list_print(lst, nodes)
        err = raised(call)
        if not isinstance(err, want):
            raise AssertionError(f"inv_domain_enforced: {name} list: {what} raised {err!r}, not {want.__name__}")
        named = getattr(err, "node", None)
        if named != culprit:  # NOTE: an error naming another node (or none) misleads its reader
            raise AssertionError(f"inv_names_culprit: {name} list: {what} named node {named}, not {culprit}")
        if _list_print(lst, nodes) != before:
            raise AssertionError(f"rejected call leaves state unchanged: {name} list: refused {what} changed it")
    # NOTE: a drawn head of the list kept as it is, then a drawn selection of the rest in a drawn order: ``place``
    # of an order whose first nodes are already in place (it moves only what follows them) is met as often as one
    # that moves from the head
    keep = draw(st.integers(0, len(members) - 1))
    rest = members[keep:]
    picked = members[:keep] + draw(st.lists(sampled_from(rest), min_size=1, max_size=len(rest), unique=True))
    c = draw(sampled_from(members))
    new, behind, ahead = Linked(next(fresh)), Linked(next(fresh)), Linked(next(fresh))
    order = [x.id for x in picked] + [x.id for x in members if x not in picked]
    steps: list[tuple[str, Callable[[], object], list[int]]] = [
        (f"place({[x.id for x in picked]})", lambda: lst.place(picked), order)
    ]
    order = [c.id, *(i for i in order if i != c.id)]
    steps.append((f"touch({c.id})", lambda: lst.touch(c), order))
    order = [new.id, *order]
    steps.append((f"insert_mru({new.id})", lambda: lst.insert_mru(new), order))
    at = order.index(b.id) + 1
    order = [*order[:at], behind.id, *order[at:]]
    steps.append((f"insert_behind({b.id}, {behind.id})", lambda: lst.insert_behind(b, behind), order))
    at = order.index(a.id)
    order = [*order[:at], ahead.id, *order[at:]]
    steps.append((f"insert_ahead_of({a.id}, {ahead.id})", lambda: lst.insert_ahead_of(a, ahead), order))
    order = [i for i in order if i != c.id]
    steps.append((f"remove({c.id})", lambda: lst.remove(c), order))
    got: list[int] = []
    for what, call, want_order in steps:
        err = raised(call)
        if err is not None:
            raise AssertionError(f"results equal the spec's: {name} list: {what} inside its domain raised {err!r}")
        got = lst.order()
        if got != want_order:
            raise AssertionError(f"results equal the spec's: {name} list after {what}: {got}, spec {want_order}")
        err = raised(lst.check)
        if err is not None:
            raise AssertionError(f"inv_lru_links_symmetric: {name} list after {what}: {err!r}")
    i = lst.slot
    if c.prev[i] is not None or c.next[i] is not None:
        raise AssertionError(f"inv_lru_detached: {name} list: node {c.id} removed keeps its links")
    chain = _chain(lst)
    if lst.lru_first() is not chain[-1] or lst.more_recent(chain[-1]) is not chain[-2] or lst.more_recent(chain[0]):
        raise AssertionError(f"results equal the spec's: {name} list {got}: lru_first or more_recent misread it")
    if [x.id for x in lst.iter_lru()] != got[::-1]:
        raise AssertionError(f"results equal the spec's: {name} list {got}: iter_lru does not walk it from the tail")
    for x in chain:  # NOTE: then emptied: an empty list reads as empty (no sentinel handed out as a member)
        lst.remove(x)
    empty = (lst.order(), len(lst), lst.lru_first(), list(lst.iter_lru()))
    if empty != ([], 0, None, []):
        what = "(order, len, lru_first, iter_lru)"
        raise AssertionError(f"results equal the spec's: {name} list emptied reads {what} {empty}")
    return True


# ---------------------------------------------------------------- the memory manager


def _manager_fingerprint(mm: MemoryManager) -> object:
    reqs = tuple(
        (r.rid, r.status, r.tokens, r.row, r.prefix_len, r.own_from, r.kv_len, r.alloc_len, r.handle, r.mamba)
        for r in mm.requests.values()
    )
    m = mm.mamba
    mamba = _data_bytes(m.data, m.conv, m.temporal) if m is not None else ()
    return (
        system_snapshot_of(mm),
        _cache_fingerprint(mm.cache),
        mm.fail_next,
        reqs,
        _data_bytes(mm.kv.data, mm.rows.table),
        mamba,
        tuple(_session_fingerprint(x) for x in mm.sessions.slots.values()),
    )


def _session_fingerprint(x: SessionSlot) -> object:
    fresh = x.lent_fresh if x.lent_to is not None else None  # NOTE: what was lent fresh means something only while lent
    return (x.sid, x.row, x.tokens, x.alloc_len, x.committed_len, x.mamba, x.lent_to, fresh)


LIFE_MOVES = ("wait", "admit", "extend", "finish", "abort", "retract", "resume")
"""What the manager scenario does with each request it adds: the stage of life the request is left at."""


def _build_manager(kind: str, draw: Draw) -> tuple[MemoryManager, list[str]]:
    ps = draw(sampled_from(PAGE_SIZES)) if kind == "paged" else 1
    kv_tokens = 16 - 16 % ps  # NOTE: whole pages
    cfg = SystemConfig(page_size=ps, mamba=kind == "mamba", kv_tokens=kv_tokens, rows=3, max_context=12, mamba_slots=4)
    mm = build_manager(cfg)
    run_min = draw(sampled_from((RUN_MIN, 1, 2)))
    for pool in mm.pools().values():
        pool.run_min = run_min  # NOTE: short enough, the small pools tag, stamp and free runs through slices too
    _warm_rows(mm)
    story = [f"run_min = {run_min}", "rows warm: each holds stale ids of real slots"]
    # NOTE: each request takes another move (a permutation, not independent draws): a scenario of k requests holds
    # k different stages of life, so a rare one (a resumed turn still waiting) is in one scenario in a few, not in
    # one in twenty; a resume needs a session, so one is open then, and it takes that session's turn if it is free.
    # Sessions too are left at every stage: up to two are open, one in three after a first turn that ended (saved:
    # memory kept between turns), and a request takes an idle session's turn first (the simplest draw), a saved
    # one's after no turn, so a session's stage is that of its turn's move. Over eight seeds each stage (idle, saved,
    # a turn waiting, a turn running on the session's memory: the state a close must refuse) is in 11 % of the
    # token scenarios or more; with one session at most and no turn preferred, a saved session was in 2.7 %
    moves = draw(st.permutations(LIFE_MOVES))[: draw(st.integers(1, 5))]
    for sid in draw(st.lists(st.integers(0, 2), min_size=int("resume" in moves), max_size=2, unique=True)):
        mm.sessions.open(sid)
        story.append(f"open session {sid}")
        # NOTE: one session in three has a first turn, ended: it keeps its memory between turns (saved)
        if draw(st.integers(0, 2)) == 1:
            first = mm.add_request(tuple(draw(st.lists(st.integers(1, 3), min_size=1, max_size=4))), session=sid)
            admit(mm, [first], Budget(24, 1))
            if first.status is Status.RUNNING:
                mm.finish(first)
            story.append(f"request {first.rid} {first.tokens} of session {sid}: finish ({first.status.name})")
    for move in moves:
        toks: tuple[int, ...] = tuple(draw(st.lists(st.integers(1, 3), min_size=1, max_size=6)))
        # NOTE: a request may begin as an earlier one did (a shared system prompt): its match then locks a cached
        # node, and the calls that walk from it up the tree (a chunk, a finish, a release) meet a real path. Drawn
        # afresh alone, a running request held a lock below the root in 5 token scenarios of 300
        lead = draw(sampled_from([(), *(r.tokens for r in mm.requests.values())]))
        toks = (*lead[: draw(st.integers(0, len(lead)))], *toks)[:8]
        live = (Status.WAITING, Status.RUNNING)
        turns = {r.session for r in mm.requests.values() if r.status in live}  # NOTE: one turn at a time
        free = [x for x in mm.sessions.slots.values() if x.lent_to is None and x.sid not in turns]
        fits = [x.sid for x in free if len(x.tokens) + len(toks) <= mm.rows.max_context_len]
        # NOTE: an idle session's turn first, a saved one's after no turn: a saved session stays saved in some
        saved = [sid for sid in fits if mm.sessions.slots[sid].row is not None]
        fresh = [sid for sid in fits if sid not in saved]
        turn: int | None = draw(sampled_from(fits if move == "resume" and fits else [*fresh, None, *saved]))
        if turn is not None:
            toks = (*mm.sessions.slots[turn].tokens, *toks)  # NOTE: a later turn extends the one before
        req = mm.add_request(toks, session=turn)
        story.append(f"request {req.rid} {toks}{f' of session {turn}' if turn is not None else ''}: {move}")
        if move == "resume":  # NOTE: a session's turn handed its memory and left waiting (a row, not running)
            if turn is not None:
                with suppress(KVLedgerError):
                    mm.sessions.resume(req)
            continue
        if move == "wait":
            continue
        if move == "abort":
            mm.abort(req)
            continue
        admit(mm, [req], Budget(24, 1))
        if req.status is not Status.RUNNING:
            continue
        if move == "extend" and req.kv_len < 10:
            with suppress(OverAllocation):
                mm.extend(req, (1,), draw(st.integers(0, 1)))
        elif move == "finish":
            mm.finish(req)
        elif move == "retract":
            mm.retract(req)
    mm.fail_next = draw(st.integers(0, 1))
    story.append(f"fail_next = {mm.fail_next}")
    return mm, story


def _warm_rows(mm: MemoryManager) -> None:
    """Leave every row of ``mm`` as a served request leaves it: its table filled with ids of real KV slots, all free
    again. A row's columns past its request's slots are stale ("meaningless" once the row is freed), and in a warm
    engine they name real slots, another request's now or soon; in a fresh table they are 0, the padding slot every
    write refuses, so a call that reads a row past its request's slots would be refused there for the wrong
    reason, and write nothing. Made through the pools' public calls by an owner no scenario request is."""
    temp = request(MAX_IDENT)
    rows = [mm.rows.alloc(temp) for _ in range(mm.rows.available_size())]
    kv = mm.kv.alloc(mm.kv.available_size(), temp)
    width = min(mm.rows.max_context_len, kv.numel())
    for i, row in enumerate(rows):
        mm.rows.write(row, 0, kv.roll(-i * width)[:width], temp)  # NOTE: each row other slots, where there are
    mm.kv.free(kv, temp)
    for row in reversed(rows):
        mm.rows.free(row, temp)


def _borrower(mm: MemoryManager, r: Request) -> bool:
    """``r`` holds its row and its session's memory, lent to it for this turn (a resumed session request)."""
    slot = mm.sessions.slots.get(r.session) if type(r.session) is int else None
    return slot is not None and slot.lent_to == r.rid and r.row is not None


def _lender_free(mm: MemoryManager, r: Request) -> bool:
    """``r`` names an open session that is lent to no request: it may resume it."""
    slot = mm.sessions.slots.get(r.session) if type(r.session) is int else None
    return slot is not None and slot.lent_to is None


_TURN_DOMAINS: dict[str, Callable[[MemoryManager, Request], bool]] = {
    "save": _borrower,
    "unresume": _borrower,
    "resume": _lender_free,
    "extend_resumed": lambda mm, r: r.row is not None and r.session is not None,
}
"""A session turn's calls on one of the manager's own requests: the requests each accepts (its domain). The turn's
valid calls belong to the flow the rules run (admission resumes, finish saves); the probe makes each with the
manager's requests outside its domain (a request of no session, one whose session is lent to another, one with no
row), which must be refused, typed, with nothing changed."""


def _turn_arg(
    mm: MemoryManager, reqs: list[Request], strangers: list[object], inside: Callable[[MemoryManager, Request], bool]
) -> Arg:
    """A session turn call's ``req``: junk is a stranger or one of the manager's requests outside ``inside``."""
    outside = [r for r in reqs if not inside(mm, r)]
    return _arg(
        None,
        sampled_from([*strangers, *outside]),
        lambda x: isinstance(x, Request) and mm.requests.get(x.rid) is x and inside(mm, x),
        edges=[*strangers, *outside],
    )


def _one_per_stage(reqs: list[Request]) -> list[Request]:
    """The first of ``reqs`` at each stage of a request's life: its status, and whether it holds a row, a Mamba
    state, and is a session's turn."""
    seen: dict[tuple[object, ...], Request] = {}
    for r in reqs:
        seen.setdefault((r.status, r.row is not None, r.mamba is not None, r.session is not None), r)
    return list(seen.values())


def _manager_methods(mm: MemoryManager) -> tuple[Method, ...]:
    reqs = list(mm.requests.values())
    other = Request(reqs[0].rid, reqs[0].tokens) if reqs else Request(1, (1,))  # NOTE: not this manager's
    twins = [copy(r) for r in reqs]  # NOTE: every field of one of its requests (row, session), another object
    strangers: list[object] = [other, 1, None, "req", *twins]
    not_requests = sampled_from(strangers)
    mine = [r for r in reqs if r.status is not Status.ABORTED and r.status is not Status.FINISHED]

    def req_arg(ok: Callable[[Request], bool]) -> Arg:
        good = [r for r in reqs if ok(r)]
        bad = [r for r in reqs if not ok(r)]
        return _arg(
            sampled_from(good) if good else None,
            not_requests | sampled_from(bad) if bad else not_requests,
            lambda x: isinstance(x, Request) and mm.requests.get(x.rid) is x and ok(x),
            # NOTE: a sweep meets one request of each stage of life (a rare one too: a resumed turn still waiting)
            edges=[*strangers[:5], *_one_per_stage(bad), *_one_per_stage(good)],
        )

    def running(r: Request) -> bool:
        return r.status is Status.RUNNING

    count = _arg(st.integers(1, 3), count_or_junk(0, 3), D.is_amount, edges=count_edges(0))  # NOTE: too many: no room
    owner = _arg(just(request(95)), owner_or_junk(), D.is_owner, edges=OWNER_EDGES)
    sessions = sorted(mm.sessions.slots)
    lenders = {sid: mm.requests.get(x.lent_to) for sid, x in mm.sessions.slots.items() if x.lent_to is not None}
    in_use = [sid for sid, r in lenders.items() if r is not None and r.status is Status.RUNNING]
    idle = [sid for sid in sessions if sid not in in_use]
    # NOTE: an admission attempt to undo: one of a waiting request's (nothing acquired yet, or its own state); junk:
    # no attempt, another manager's request's, a request's that is not waiting, one whose state is another's
    waiting = [r for r in reqs if r.status is Status.WAITING]
    states = [r.mamba for r in reqs if r.mamba is not None]
    bad_attempts: list[object] = [None, 1, "attempt", Attempt(other)]
    bad_attempts += [Attempt(r) for r in _one_per_stage([r for r in reqs if r.status is not Status.WAITING])]
    bad_attempts += [Attempt(w, mamba=m) for w in waiting[:2] for m in states[:1] if m is not w.mamba]
    attempt = _arg(
        sampled_from([Attempt(w, mamba=w.mamba) for w in waiting]) if waiting else None,
        sampled_from(bad_attempts),
        lambda x: isinstance(x, Attempt) and any(x.req is w for w in waiting) and x.mamba is x.req.mamba,
        edges=bad_attempts,
        refusal=lambda _x, _d: InvalidArgument,  # NOTE: the documented class: an attempt that is not one to undo
    )
    # NOTE: token ids get the keys' junk too (the ids' bytes in each buffer type, tensors, sets): one catalogue of
    # what is no token sequence, whichever call takes one
    bad_tokens = (
        (),
        (1, -1),
        (1, VALUE_END),  # NOTE: the first id past the range (31-bit tokens: a KV fingerprint's domain)
        (1.0, 2.0),
        (True,),
        tuple(range(1, mm.rows.max_context_len + 2)),
        *junk_key_values(2),
    )

    def is_token_ids(x: object) -> bool:
        return isinstance(x, tuple) and D.is_tokens(list(x)) and all(t < VALUE_END for t in x)

    tokens = _arg(
        st.lists(st.integers(1, 3), min_size=1, max_size=3).map(tuple),
        sampled_from(bad_tokens) | JUNK_SCALARS,
        lambda x: is_token_ids(x) and 0 < len(x) <= mm.rows.max_context_len,
        edges=bad_tokens,
        culprit=bad_token,
    )
    slots = list(mm.sessions.slots.values())
    stray: list[object] = [SessionSlot(MAX_IDENT), *(copy(x) for x in slots), 1, None, "s"]  # NOTE: not its own
    slot_arg = _arg(
        sampled_from(slots) if slots else None,
        sampled_from(stray),
        lambda x: any(x is y for y in slots),
        edges=stray,
    )
    methods = [
        Method("alloc_kv", mm.alloc_kv, {"owner": owner, "n": count}, weight=2),
        Method(
            "round_up",
            mm.round_up,
            {"n": _arg(st.integers(0, 9), count_or_junk(0, 9), lambda x: D.is_count(x, 0), edges=count_edges(0))},
            reads=True,
        ),
        Method(
            "add_request",
            mm.add_request,
            {
                "tokens": tokens,
                "session": _arg(
                    sampled_from([None, *sessions]),
                    sampled_from([3, 1.0, "s", *id_edges(MAX_IDENT + 1)]),
                    lambda x: x is None or (type(x) is int and x in mm.sessions.slots),
                    edges=(3, *id_edges(MAX_IDENT + 1)),
                ),
            },
        ),
        Method(
            "extend",
            lambda req, new_tokens, ahead: mm.extend(req, new_tokens, ahead),
            {
                "req": req_arg(running),
                "new_tokens": _arg(  # NOTE: none at all is a decode step that only allocates ``ahead``
                    just((1,)),
                    tokens.junk({}),
                    is_token_ids,
                    edges=bad_tokens[1:],
                    culprit=bad_token,
                ),
                "ahead": _arg(
                    st.integers(0, 1),
                    count_or_junk(0, 1) | just(mm.rows.max_context_len),
                    _ahead_inside(mm),
                    after=True,
                    edges=(*count_edges(0), mm.rows.max_context_len),
                ),
            },
        ),
        Method(
            "admit",
            lambda mm, waiting, budget: admit(mm, waiting, budget),
            {"mm": _manager_arg(mm), "waiting": _batch_arg(mm, reqs, other), "budget": _budget_arg()},
        ),
        *(
            Method(f"admission.{fn.__name__}", fn, {"mm": _manager_arg(mm), "a": attempt}, releases=True)
            for fn in (rollback, release_attempt_state)
        ),
        Method("finish", mm.finish, {"req": req_arg(running)}, releases=True),
        Method("chunk", mm.chunk, {"req": req_arg(running)}, releases=True),
        Method("retract", mm.retract, {"req": req_arg(running)}, releases=True),
        Method("abort", mm.abort, {"req": req_arg(lambda r: r in mine)}, releases=True),
        Method(
            "write_kv",
            mm.write_kv,
            {
                "req": req_arg(lambda r: True),  # NOTE: one of its requests; a row is needed only to write something
                "start": _arg(just(0), count_or_junk(0, 0), lambda x: D.is_amount(x), edges=count_edges(0)),
                # NOTE: ends up to the request's own limit (a write, made on a copy), and the first end past it
                "end": _arg(
                    lambda d: st.integers(0, _end_limit(d)),
                    lambda d: count_or_junk(0, 0) | just(_end_limit(d) + 1),
                    _end_inside,
                    after=True,
                    edges=lambda d: (*count_edges(0), _end_limit(d) + 1),
                ),
            },
        ),
        *(
            Method(f"sessions.{name}", getattr(mm.sessions, name), {"req": _turn_arg(mm, reqs, strangers, inside)})
            for name, inside in _TURN_DOMAINS.items()
        ),
        Method(
            "sessions.free_tail",
            mm.sessions.free_tail,
            {
                "slot": slot_arg,
                "start": _arg(just(0), count_or_junk(0, 0), D.is_amount, edges=count_edges(0)),
            },
        ),
        Method("sessions.release_state", mm.sessions.release_state, {"slot": slot_arg}, releases=True),
        Method("sessions.spec_slot", mm.sessions.spec_slot, {"slot": slot_arg}, reads=True),
        Method(
            "open_session",
            mm.sessions.open,
            {
                # NOTE: an id in [0, MAX_IDENT] no open session has: the last one inside too (made on a copy); junk:
                # an open session's id, and the edges of that range (-1, the first past it, past int64, wrong types)
                "sid": _arg(
                    sampled_from(unopened)
                    if (unopened := [i for i in (7, MAX_IDENT) if i not in mm.sessions.slots])
                    else None,
                    sampled_from([*sessions, *id_edges(MAX_IDENT + 1), 1.5, 1 << 70]),
                    lambda x: type(x) is int and 0 <= x <= MAX_IDENT and x not in mm.sessions.slots,
                    edges=(*sessions[:1], MAX_IDENT, *id_edges(MAX_IDENT + 1)),
                )
            },
        ),
        Method(
            "close_session",
            mm.sessions.close,
            {
                # NOTE: a session whose turn runs on its memory is in use: its close is refused (the turn would
                # run on freed memory), and nothing changes
                "sid": _arg(
                    sampled_from(idle) if idle else None,
                    # NOTE: any id or junk (the probes' own), a session never opened, one in use
                    id_or_junk(MAX_IDENT + 1) | sampled_from([3, *in_use]),
                    lambda x: type(x) is int and x in mm.sessions.slots and x not in in_use,
                    edges=(3, *id_edges(MAX_IDENT + 1), *in_use),
                )
            },
            releases=True,
        ),
    ]
    if mm.mamba is not None:
        held = [(r.owner, r.mamba) for r in reqs if r.mamba is not None]
        methods.append(Method("alloc_mamba", mm.alloc_mamba, {"owner": owner}))
        if held:
            methods.append(
                Method(
                    "free_mamba",
                    lambda owner, m: mm.free_mamba(owner, m),
                    {
                        "m": _arg(
                            sampled_from([m for _, m in held]),
                            sampled_from([1, None, (1, ()), MambaAlloc(0, (1 << 40,))]),
                            lambda x: isinstance(x, MambaAlloc) and any(x is m for _, m in held),
                        ),
                        "owner": _arg(
                            lambda d: sampled_from([o for o, m in held if m is d["m"]] or [request(96)]),
                            sampled_from([request(96), *(o for o, _ in held)]) | owner_or_junk(),
                            lambda x, d: any(x == o and m is d["m"] for o, m in held),
                            after=True,
                        ),
                    },
                )
            )
    else:
        # NOTE: a manager without Mamba holds no state to give or take back: every such call is refused, whatever
        # its arguments, ComponentDisabled (as a cache without Mamba refuses a copy-on-write)
        methods.append(
            Method(
                "alloc_mamba",
                mm.alloc_mamba,
                {
                    "owner": _arg(
                        None, owner_or_junk(), lambda _x: False, edges=(request(96), *OWNER_EDGES), refusal=_disabled
                    )
                },
            )
        )
        methods.append(
            Method(
                "free_mamba",
                lambda owner, m: mm.free_mamba(owner, m),
                {
                    "m": _arg(None, sampled_from([MambaAlloc(0, (1,)), 1, None]), lambda _x: False, refusal=_disabled),
                    "owner": _arg(just(request(96)), owner_or_junk(), D.is_owner, edges=OWNER_EDGES),
                },
            )
        )
    return tuple(methods)


def _batch_arg(mm: MemoryManager, reqs: list[Request], other: Request) -> Arg:
    """``admit``'s batch: valid ones change state (the rules make those); junk: a request named twice (after
    another one: the refusal must name the repeated one), one not this manager's, a non-request, a string, a
    non-sequence."""
    batches: list[object] = [[*reqs[:1], other], [*reqs[:1], None], "reqs", None, 3]
    if reqs:
        batches += [[reqs[0], reqs[0]], [*reqs[:1], *reqs[-1:] * 2]]

    def repeated(x: object) -> str | None:
        if not isinstance(x, list):
            return None
        again = [r for i, r in enumerate(x) if isinstance(r, Request) and any(r is y for y in x[:i])]
        return f"request {again[0].rid}" if again else None

    def inside(x: object) -> bool:
        if isinstance(x, str | bytes) or not isinstance(x, Sequence):
            return False
        xs = list(x)
        return all(isinstance(r, Request) and mm.requests.get(r.rid) is r for r in xs) and len(
            {id(r) for r in xs}
        ) == len(xs)

    return _arg(just([]), sampled_from(batches), inside, edges=batches, culprit=repeated)


def _manager_arg(mm: MemoryManager) -> Arg:
    """The manager a module-level function of the manager's takes first (``admission.admit``, ``rollback``): this
    one; junk: no manager (nothing, one of its parts, a scalar), each refused typed before anything is read."""
    bad = [None, mm.cache, mm.sessions, mm.rows, 0, "mm"]
    return _arg(just(mm), sampled_from(bad), lambda x: x is mm, edges=bad)


def _budget_arg() -> Arg:
    bad = [Budget(-1, 1), Budget(24, -1), Budget(True, 1), Budget(1.5, 1), (24, 1), None]  # type: ignore[arg-type]
    return _arg(
        just(Budget(24, 1)),
        sampled_from(bad),
        lambda x: isinstance(x, Budget) and D.is_amount(x.tokens) and D.is_amount(x.requests),
        edges=bad,
    )


def _ahead_inside(mm: MemoryManager) -> Callable[[object, Drawn], bool]:
    def inside(x: object, d: Drawn) -> bool:
        req, toks = d["req"], d["new_tokens"]
        if not isinstance(req, Request) or not isinstance(toks, tuple):
            return D.is_count(x, least=0)  # NOTE: another argument is the junk one
        return D.is_count(x, least=0) and req.kv_len + len(toks) + x <= mm.rows.max_context_len  # type: ignore[operator]

    return inside


def _end_limit(d: Drawn) -> int:
    """How far ``write_kv`` may write for the drawn request: its slots and tokens, if it holds a row; else 0."""
    req = d["req"]
    return min(req.alloc_len, len(req.tokens)) if isinstance(req, Request) and req.row is not None else 0


def _end_inside(x: object, d: Drawn) -> bool:
    """``write_kv``'s end: an int >= 0, past ``start`` only for a request holding a row, up to its slots and
    tokens."""
    req, start = d["req"], d["start"]
    if not D.is_amount(x) or not D.is_amount(start) or not isinstance(req, Request):
        return D.is_amount(x)
    return x <= start or x <= _end_limit(d)  # type: ignore[operator]


def manager_scenario(kind: str, draw: Draw) -> Scenario:
    """A memory manager (token or paged KV; a Mamba pool for ``mamba``) with requests at every stage."""
    mm, story = _build_manager(kind, draw)
    return manager_scenario_of(mm, story)


def manager_scenario_of(mm: MemoryManager, story: list[str] | None = None) -> Scenario:
    """The public calls of the live manager ``mm`` (``story``: how it came to its state)."""
    return Scenario(
        "MemoryManager",
        _manager_methods(mm),
        lambda: _manager_fingerprint(mm),
        story or [],
        partial(_manager_audits, mm),
        partial(_call_on_copy, mm),
        short_of=_short_of(mm),
        pools=mm.pools,
    )


def _manager_audits(mm: MemoryManager, draw: Draw) -> str:
    """Every audit of a manager's probing step; the room and cow audits share one copy with a prompt cached."""
    grown = lru_cache(maxsize=1)(partial(_cached_copy, mm))
    return (
        f"{leak_audit(mm, draw)}; {room_audit(mm, grown)}; {rollback_audit(mm)}; {session_audit(mm)}; "
        f"{cow_audit(mm, grown)}; {injection_audit(mm)}; {reads_audit(mm)}; {cycle_audit(mm)}"
    )


def _short_of(mm: MemoryManager) -> frozenset[str]:
    """What a manager's ``OverAllocation`` may name as short: its pools, or an admission's token budget."""
    return frozenset(mm.pools()) | {"budget"}


def _call_on_copy(mm: MemoryManager, method: Method, args: Mapping[str, object]) -> str:
    """``Scenario.on_copy`` of a manager: ``method`` made with ``args`` (inside its domain) on a copy of ``mm`` and
    of the arguments together, so they name the copy's requests and sessions. It may be refused, typed, never
    untyped. After a ``releases`` call, either way, the copy's books must balance: its leak checker finds nothing (no
    slot held that nothing references, none referenced that is not held) and its sessions keep their laws.

    Raises ``AssertionError`` naming the law otherwise (a release that frees a slot but keeps pointing at it, an
    empty write that crashes untyped)."""
    m, err, shown = _made_on_a_copy("MemoryManager", mm, method, args, _manager_methods)
    if err is not None and not isinstance(err, KVLedgerError):
        raise AssertionError(f"inv_domain_enforced: {shown} lies in its domain and raised {err!r}")
    _names_what_was_short(err, _short_of(m), lambda: shown)
    _spent_if_it_took(mm, m, shown)
    if not method.releases:  # NOTE: what it hands out is its caller's to reference (an alloc's slots)
        return f"{shown}: {'refused' if err is not None else 'made'}"
    found = check_leaks(m).findings
    if found:
        raise AssertionError(f"leak checker agrees with the ledgers: {shown} left {found[0]}")
    ended = [
        rid
        for rid, r in mm.requests.items()
        if r.status is Status.RUNNING and rid in m.requests and m.requests[rid].status is Status.FINISHED
    ]
    if ended:  # NOTE: a request the call ended must leave what it computed cached (``inv_end_caches``)
        was, now = system_snapshot_of(mm), system_snapshot_of(m)
        for rid in ended:
            wrong = end_cache_finding(was, now, rid, content=True)
            if wrong:
                raise AssertionError(f"inv_end_caches: {shown}: {wrong}")
    try:
        m.sessions.check()
    except IntegrityError as broke:
        law = str(broke).split(":")[0]
        raise AssertionError(f"{law}: {shown} left {broke}") from broke
    return f"{shown}: {'refused' if err is not None else 'made'}, the books balance"


INJECTED = ("kv", "mamba")
"""The pools whose allocations an injected failure (``MemoryManager.fail_next``) fails: the KV slots and the Mamba
states a request is given (``alloc_kv``, ``alloc_mamba``); request rows are not among them."""


def _spent_if_it_took(before: MemoryManager, after: MemoryManager, shown: str) -> None:
    """``an injected failure fails the next allocation``, for one call made on a copy: a call that began with a
    failure injected and pending and left it pending must not have taken free slots of a pool it fails
    (``INJECTED``). An injection one allocation skips moves the failure onto another call, which then meets it
    in place of the one that should have."""
    pending = before.fail_next
    if not pending or after.fail_next != pending:
        return
    was, now = before.pools(), after.pools()
    for name in INJECTED:
        if name in was and (taken := sorted(ledger_of(was[name]).free - ledger_of(now[name]).free)):
            raise AssertionError(
                f"an injected failure fails the next allocation: {shown}, begun with {pending} failure(s) injected "
                f"and pending, took free {name} slots {taken[:8]} and left them pending"
            )


ROOM_PROMPT = (11, 12, 13, 14)
"""The prompt of the request the room audit runs to its end on a copy (tokens the machines' stories do not draw)."""


def _cached_copy(mm: MemoryManager) -> MemoryManager | None:
    """A copy of ``mm`` with one request more run to its end, so that its cache holds something it can evict (the
    prompt's KV and, with a Mamba pool, its state); ``None`` when the copy cannot admit it (no room)."""
    m = deepcopy(mm)
    m.fail_next = 0
    try:
        req = m.add_request(ROOM_PROMPT, None)
        admitted = admit(m, [req], Budget(10**6, 10**6))[0]
        if not admitted:
            return None
        m.finish(req)
    except KVLedgerError:
        return None
    return m


def _leave_mamba_free(m: MemoryManager, left: int, who: int) -> None:
    """Take ``m``'s free Mamba slots down to ``left`` (none when fewer are free), by request ``who``: straight from
    the pool, not through the manager, so the cache evicts nothing for it."""
    assert m.mamba is not None
    free = m.mamba.available_size()
    if free > left:
        m.mamba.alloc(free - left, request(who))


def cow_audit(mm: MemoryManager, grown: Callable[[], MemoryManager | None] | None = None) -> str:
    """Admission under Mamba pressure: on a copy of ``mm`` with a prompt cached with its state (``_cached_copy``),
    a request that extends that prompt (its match ends at the state: a copy-on-write, then the track buffers) is
    admitted with each number of Mamba slots left free, from none to a whole request's (the rest taken by another
    owner first, straight from the pool). Each admission must answer, never crash; a rejected one leaves the
    request holding nothing; and where the free slots and the states the cache can evict (all but the one the
    match locks) cover the copy and its track buffers, and the KV pool has room, the request must be admitted.

    ``grown`` gives the copy with the prompt cached (``_cached_copy`` of ``mm`` when ``None``; the room audit of
    the same step may share it: neither audit changes it).

    Raises ``AssertionError`` naming ``inv_domain_enforced`` (a crash), ``admission rolls back`` (a rejection that
    keeps something) or ``alloc evicts before it refuses``."""
    if mm.mamba is None:
        return ""
    base = grown() if grown is not None else _cached_copy(mm)
    if base is None or base.mamba is None:
        return "cow audit: no room for the cached prompt"
    need = 1 + base.mamba.ping_pong_size
    prompt = (*ROOM_PROMPT, 15)
    told = []
    for left in range(need + 1):
        m = deepcopy(base)
        assert m.mamba is not None
        if m.mamba.available_size() < left:
            continue
        _leave_mamba_free(m, left, 94)
        room = left + m.cache.evictable_size(Component.MAMBA) - 1  # NOTE: the matched state is locked by the match
        kv_room = m.kv.available_size() >= m.round_up(len(prompt) + 1) and m.rows.available_size() > 0
        req = m.add_request(prompt, None)
        what = f"admission of {prompt} extending a cached prompt with {left} Mamba slots free"
        err = raised(lambda m=m, req=req: admit(m, [req], Budget(64, 1)))  # type: ignore[misc]
        if err is not None:
            raise AssertionError(f"inv_domain_enforced: {what} raised {err!r}")
        if req.status is Status.RUNNING:
            told.append(f"{left} free: admitted")
            continue
        if req.mamba is not None or req.row is not None or req.handle is not None:
            raise AssertionError(f"admission rolls back: {what} was rejected and the request kept {req.mamba}")
        if room >= need and kv_room:
            raise AssertionError(
                f"alloc evicts before it refuses: {what} was rejected, with {room} states free or evictable for the "
                f"{need} a copy and its track buffers take"
            )
        told.append(f"{left} free: rejected")
    return f"cow audit: {', '.join(told)}"


def room_audit(mm: MemoryManager, grown: Callable[[], MemoryManager | None] | None = None) -> str:
    """Every allocation evicts before it refuses: on a copy of ``mm`` with no failure pending, an allocation from
    each pool the cache can evict into, a little more than is free and no more than the cache's evictable part
    covers, must succeed and be held by its owner: ``alloc_kv`` of one page more than is free, and (with a Mamba
    pool) ``alloc_mamba`` with one slot fewer free than a request state and its track buffers take (the copy's
    free slots taken by another owner first, straight from the pool, down to that). Where the story left nothing
    evictable (in either pool), the audit runs on a copy with one request more run to its end (``_cached_copy``), so
    that it always has something to evict (``grown`` gives it, as for :func:`cow_audit`).

    Raises ``AssertionError`` naming ``alloc evicts before it refuses`` otherwise (a manager that refuses memory it
    could free turns a full cache into refused requests)."""
    law = "alloc evicts before it refuses"
    told: list[str] = []
    if not mm.cache.evictable_size(Component.FULL) or (
        mm.mamba is not None and not mm.cache.evictable_size(Component.MAMBA)
    ):
        copy = grown() if grown is not None else _cached_copy(mm)  # NOTE: nothing to evict in this story: audit a
        if copy is not None:  # copy with one request more cached
            mm = copy
            told.append("on a copy with one request more cached")
    free, evictable = mm.kv.available_size(), mm.cache.evictable_size(Component.FULL)
    n = mm.round_up(free + 1)
    if n > free + evictable:
        told.append(f"{free} kv free, {evictable} evictable: nothing to evict for")
    else:
        m = deepcopy(mm)
        m.fail_next = 0
        owner = request(97)
        err = raised(lambda: m.alloc_kv(owner, n))
        if err is not None:
            raise AssertionError(
                f"{law}: alloc_kv of {n} tokens with {free} free and {evictable} evictable raised {err!r}"
            )
        pool = pools_of(m.kv)["kv"]
        held = pool.held_by(owner).numel() * (m.kv.page_size if isinstance(m.kv, PagedAllocator) else 1)
        if held != n:
            raise AssertionError(f"{law}: alloc_kv of {n} tokens left {held} held by {owner}")
        told.append(f"{n} tokens with {free} free")
    if mm.mamba is not None:
        need = 1 + mm.mamba.ping_pong_size  # NOTE: a request's state and its track buffers
        free, evictable = mm.mamba.available_size(), mm.cache.evictable_size(Component.MAMBA)
        if need > min(free, need - 1) + evictable:  # NOTE: free slots taken down to one short of a request's
            told.append(f"{free} mamba free, {evictable} evictable: no state to evict for")
        else:
            m = deepcopy(mm)
            assert m.mamba is not None
            m.fail_next = 0
            _leave_mamba_free(m, need - 1, 98)
            free = m.mamba.available_size()
            owner = request(97)
            err = raised(lambda: m.alloc_mamba(owner))
            if err is not None:
                raise AssertionError(
                    f"{law}: alloc_mamba ({need} slots) with {free} free and {evictable} evictable states raised "
                    f"{err!r}"
                )
            held = m.mamba.pool.held_by(owner).numel()
            if held != need:
                raise AssertionError(f"{law}: alloc_mamba ({need} slots) left {held} held by {owner}")
            told.append(f"a Mamba state with {free} free")
    return "room audit: " + "; ".join(told)


def reads_audit(mm: MemoryManager) -> str:
    """The manager's argument-free reads, against the state they read: ``running()`` answers exactly the requests
    whose recorded status is running, each once, in the order they arrived (the request table's order, as the
    system snapshot lists them). An argument-free read has nothing outside its domain to refuse, so no sweep calls
    it; a wrong answer misleads whoever schedules by it. What was audited.

    Raises ``AssertionError`` naming ``self-checks agree with the state`` otherwise."""
    got = mm.running()
    want = [r for r in mm.requests.values() if r.status is Status.RUNNING]
    if len(got) != len(want) or any(a is not b for a, b in zip(got, want, strict=False)):
        raise AssertionError(
            f"self-checks agree with the state: MemoryManager.running() answers requests "
            f"{[getattr(r, 'rid', r) for r in got]}, the running ones are {[r.rid for r in want]}"
        )
    return f"reads audit: {len(got)} running"


def session_audit(mm: MemoryManager) -> str:
    """The sessions' own self-check (``Sessions.check``, which the checker trusts after every release it makes on a
    copy) must pass on the healthy manager and fail, typed and naming the law, with each session law planted broken
    on a deep copy of one session (a fresh one opened if none is): committed tokens past the positions it holds
    (``inv_committed_within_allocated``), tokens recorded past its committed length (the same law), positions held
    without a row (``inv_kv_needs_row``). What was audited.

    Raises ``AssertionError`` naming ``self-checks agree with the state`` otherwise."""
    law = "self-checks agree with the state"
    err = raised(mm.sessions.check)
    if err is not None:
        raise AssertionError(f"{law}: Sessions.check() raised on a healthy manager: {err!r}")
    plants: tuple[tuple[str, str, Callable[[SessionSlot], None]], ...] = (
        ("committed past what it holds", "inv_committed_within_allocated", _plant_overcommitted),
        ("tokens past its committed length", "inv_committed_within_allocated", _plant_extra_token),
        ("positions held without a row", "inv_kv_needs_row", _plant_rowless),
    )
    m = deepcopy(mm)
    if not m.sessions.slots:
        m.sessions.open(1)
    slot = next(iter(m.sessions.slots.values()))
    kept = copy(slot)
    for what, name, plant in plants:
        plant(slot)  # NOTE: one law broken at a time, the slot put back after each: one copy serves every plant
        err = raised(m.sessions.check)
        vars(slot).update(vars(kept))
        if not (isinstance(err, IntegrityError) and str(err).startswith(name)):
            raise AssertionError(f"{law}: Sessions.check() with session {slot.sid}'s {what} planted: {err!r}")
    return f"session audit: {len(plants)} plants"


def cycle_audit(mm: MemoryManager) -> str:
    """A walk up the tree that meets a parent cycle fails typed at once, in the manager's calls too: on a copy of
    ``mm`` per call, the node the lock of a running request covers (its deepest, when several run) is linked under
    itself, and each public ``MemoryManager`` method that takes only a request (found by signature: a method added
    later is met too) is made on that request, with the contracts as installed and again with none (the
    implementation's own walks alone: a contract's walk that fails first must not hide one that runs round the
    cycle). Each must answer or fail with ``IntegrityError`` within a second. What was audited.

    Raises ``AssertionError`` naming ``inv_tree_acyclic`` otherwise (a walk that runs round the cycle, an untyped
    crash)."""
    nodes, root = mm.cache._nodes, mm.cache.root
    locked = [
        (n.end, r.rid)
        for r in mm.requests.values()
        if r.status is Status.RUNNING and r.handle is not None
        if (n := nodes.get(r.handle.node_id)) is not None and n is not root
    ]
    if not locked:
        return "cycle audit: no running request holds a lock"
    rid = max(locked)[1]
    tiers = dict.fromkeys((bindings.current_level(), "off"))
    for tier in tiers:
        with bindings.installed(tier):
            for name in _request_calls():
                m = deepcopy(mm)
                req = m.requests[rid]
                assert req.handle is not None
                n = m.cache._nodes[req.handle.node_id]
                n.parent = n
                err = _bounded(partial(getattr(m, name), req), 1.0)
                if isinstance(err, _Walked) or (err is not None and not isinstance(err, IntegrityError)):
                    raise AssertionError(
                        f"inv_tree_acyclic: {name} of running request {rid} with a parent cycle planted at node "
                        f"{n.id}, the node its lock covers (contracts {tier}): {err!r}"
                    )
    return f"cycle audit: request {rid}'s {', '.join(_request_calls())} (contracts {', '.join(tiers)})"


@lru_cache(maxsize=1)
def _request_calls() -> tuple[str, ...]:
    """The public methods of ``MemoryManager`` whose one parameter is a request (``finish``, ``chunk``, ...)."""
    out = []
    for name, fn in inspect.getmembers(MemoryManager, inspect.isfunction):
        hints = {k: str(v) for k, v in fn.__annotations__.items() if k != "return"}
        params = [k for k in inspect.signature(fn).parameters if k != "self"]
        if not name.startswith("_") and len(params) == 1 and hints.get(params[0]) == "Request":
            out.append(name)
    return tuple(out)


def _plant_overcommitted(slot: SessionSlot) -> None:
    slot.committed_len = slot.alloc_len + 1
    slot.tokens = (*slot.tokens, *[1] * (slot.committed_len - len(slot.tokens)))[: slot.committed_len]


def _plant_extra_token(slot: SessionSlot) -> None:
    slot.tokens = (*slot.tokens, 1)


def _plant_rowless(slot: SessionSlot) -> None:
    slot.row, slot.alloc_len, slot.committed_len, slot.tokens = None, slot.alloc_len + 1, 0, ()


INJECTION_OWNER = request(999_999)
"""The owner the injection audit allocates for (a request no story draws)."""


def injection_audit(mm: MemoryManager) -> str:
    """On a copy of ``mm``, one failure injected before each allocation entry point the manager has (``alloc_kv``
    of one token, and with a Mamba pool ``alloc_mamba``), which must meet it: refused ``OverAllocation``, the
    failure spent, the manager otherwise as it was (``an injected failure fails the next allocation``). An
    entry point that skips the injection lets every failure path behind it go unchecked.

    Raises ``AssertionError`` naming the law otherwise."""
    law = "an injected failure fails the next allocation"
    m = deepcopy(mm)
    calls: list[tuple[str, Callable[[], object]]] = [("alloc_kv(1)", lambda: m.alloc_kv(INJECTION_OWNER, 1))]
    if m.mamba is not None:
        calls.append(("alloc_mamba", lambda: m.alloc_mamba(INJECTION_OWNER)))
    for what, call in calls:
        m.fail_next = 1
        before = _manager_fingerprint(m)
        try:
            call()
        except OverAllocation:
            pass
        else:
            raise AssertionError(f"{law}: {what} with a failure injected was not refused")
        if m.fail_next != 0:
            raise AssertionError(f"{law}: {what} refused but left the failure pending ({m.fail_next})")
        m.fail_next = 1  # NOTE: the fingerprint holds the count: compare the rest
        if _manager_fingerprint(m) != before:
            raise AssertionError(f"{law}: {what}, refused on an injected failure, changed the manager")
    return f"injection audit: {', '.join(w for w, _ in calls)} refused on an injected failure"


def rollback_audit(mm: MemoryManager) -> str:
    """Admission is a transaction for a session's later turn too: on a copy of ``mm``, a new session's first turn
    runs and finishes (the session keeps its prefix and row), and its second turn (that prefix and one token more)
    is admitted with the next allocation failing. It must be refused and leave the manager exactly as it was before
    the admit (the row and KV lent back, the session's committed prefix restored).

    Raises ``AssertionError`` naming ``admission rolls back`` otherwise."""
    law = "admission rolls back"
    m = deepcopy(mm)
    m.fail_next = 0
    sid = max(m.sessions.slots, default=0) + 1
    m.sessions.open(sid)
    first = m.add_request((1, 2), session=sid)
    admit(m, [first], Budget(24, 1))
    if first.status is not Status.RUNNING:
        return "rollback audit: no room for a first turn"
    m.finish(first)
    slot = m.sessions.slots[sid]
    second = m.add_request((*slot.tokens, 3), session=sid)
    before = _manager_fingerprint(m)
    m.fail_next = 1
    admitted, _, _ = admit(m, [second], Budget(24, 1))
    if admitted:
        return "rollback audit: the second turn needed no allocation"
    if _manager_fingerprint(m) != before:
        raise AssertionError(
            f"{law}: session {sid}'s second turn {second.tokens}, refused on an injected allocation failure, changed "
            f"the manager (session committed {slot.committed_len}, row {slot.row}, lent to {slot.lent_to})"
        )
    return f"rollback audit: session {sid}'s second turn refused, nothing changed"


def _counts_agree(mm: MemoryManager, counts: Mapping[str, PoolCount], law: str) -> None:
    """Each pool's counts in a leak report are its ledger's: free slots, and held ones by the class of their holder
    (a tree node, a session, a running request, any other request)."""
    running = {r.owner for r in mm.requests.values() if r.status is Status.RUNNING}
    for name, pool in mm.pools().items():
        led = ledger_of(pool)
        held = {"tree": 0, "sessions": 0, "running": 0, "waiting": 0}
        for o, slots in led.held.items():
            kind = {OwnerKind.NODE: "tree", OwnerKind.SESSION: "sessions"}.get(o.kind)
            held[kind or ("running" if o in running else "waiting")] += len(slots)
        want = PoolCount(led.capacity, len(led.free), **held)
        if counts.get(name) != want:
            got = counts.get(name)
            raise AssertionError(f"{law}: pool {name}'s counts in the report are {got}, its ledger's {want}")


PHANTOM = request(10**6)
"""An owner no structure of a manager references (the planted leak's)."""


def leak_audit(mm: MemoryManager, draw: Draw) -> str:
    """The leak checker under test: a healthy manager is reported clean, and one slot of a pool planted for an
    owner nothing references, at an event of its own, is reported, and only it, as leaked by that owner at that
    event (provenance: the step ids grow); the plant is then taken back. Junk is refused typed.

    Raises ``AssertionError`` naming ``leak checker agrees with the ledgers`` when either fails."""
    law = "leak checker agrees with the ledgers"
    junks: tuple[object, ...] = (None, mm.kv, "mm")
    for f in (check_leaks, expected_owners, session_mamba_refs):
        for junk in junks:
            err = raised(partial(f, junk))  # type: ignore[arg-type]  # NOTE: junk on purpose
            if not D.inv_domain_enforced(False, err):
                what = f"{f.__name__}({junk!r:.40})"
                raise AssertionError(f"inv_domain_enforced: {what} lies outside its domain and raised {err!r}")
    report = check_leaks(mm)
    if report.findings:
        raise AssertionError(f"{law}: a healthy manager was reported: {report.findings[0]}")
    if not report.ok or report.leaked():
        raise AssertionError(f"{law}: a healthy manager's report reads ok={report.ok}, leaked {report.leaked()}")
    _counts_agree(mm, report.pools, law)
    pools = [(name, pool) for name, pool in mm.pools().items() if pool.available_size() > 0]
    if not pools:
        return "leak audit: no free slot to plant"
    name, pool = draw(sampled_from(pools))
    before = max(mm.events, default=0)
    step = mm.event("leak audit", str(PHANTOM))
    if step <= before:
        raise AssertionError(f"{law}: event ids must grow (provenance orders by them): {step} after {before}")
    # NOTE: one slot, or a few (a run: the pool tags and stamps a run through slices when it is long enough)
    origins = pool.origin.clone()
    planted = pool.alloc(min(pool.available_size(), draw(st.integers(1, 3))), PHANTOM)
    try:
        slots = sorted(planted.tolist())
        stamped = sorted(torch.nonzero(pool.origin != origins).flatten().tolist())
        if stamped != slots:
            raise AssertionError(
                f"{law}: an alloc of {name} slots {slots} for {PHANTOM} at event {step} stamped the provenance of "
                f"slots {stamped}: an alloc stamps exactly the slots it hands out"
            )
        leaky = check_leaks(mm)
        found = leaky.findings
        named = [f for f in found if (f.pool, f.kind) == (name, "leaked") and str(PHANTOM) in f.owner]
        if len(found) != len(slots) or sorted(x.slot for x in named) != slots:
            seen = "; ".join(map(str, found)) or "nothing"
            raise AssertionError(f"{law}: {name} slots {slots} planted for {PHANTOM}, nobody referencing them: {seen}")
        # NOTE: every reading of the report agrees with its findings (an idle check reads ``leaked()`` and ``ok``)
        if leaky.ok or leaky.leaked() != {name: set(slots)}:
            raise AssertionError(
                f"{law}: {name} slots {slots} planted for {PHANTOM} are found, but the report reads ok={leaky.ok}, "
                f"leaked {leaky.leaked()}"
            )
        for finding in named:
            if finding.expected != "nobody":  # NOTE: every field of a finding is read: who references it too
                raise AssertionError(
                    f"{law}: {name} slot {finding.slot} planted for {PHANTOM}, referenced by nobody, is reported as "
                    f"expected by {finding.expected!r}"
                )
            if (finding.op, finding.step) != ("leak audit", step):
                raise AssertionError(
                    f"{law}: {name} slot {finding.slot} planted by event {step} (leak audit) is attributed to "
                    f"{finding.op!r} at step {finding.step}"
                )
    finally:
        pool.free(planted, PHANTOM)
    return f"leak audit: {name} slots {slots}; {log_audit(mm, law)}; {provenance_audit(mm, draw, law)}"


def provenance_audit(mm: MemoryManager, draw: Draw, law: str) -> str:
    """Provenance names the operation: on a copy of ``mm`` with no failure pending, one operation of the manager
    that logs an event (admit a waiting request; chunk, extend, finish, retract or abort a running one; abort a
    waiting one) is made; every slot that got an owner in it (a new one, or another) must carry the event it logged,
    named after it, and a slot whose provenance changed may carry no other event.

    Raises ``AssertionError`` naming ``law`` otherwise (a leak report that names another operation, or an older one,
    sends whoever reads it to the wrong code)."""
    m = deepcopy(mm)
    m.fail_next = 0
    reqs = list(m.requests.values())
    choices = [(op, r) for r in reqs if r.status is Status.RUNNING for op in ("chunk", "extend", "finish", "retract")]
    choices += [(op, r) for r in reqs if r.status in (Status.RUNNING, Status.WAITING) for op in ("abort",)]
    choices += [("admit", r) for r in reqs if r.status is Status.WAITING]
    if not choices:
        return "provenance audit: no request to act on"
    op, req = draw(sampled_from(choices))
    pools = m.pools()
    before = {name: (p.owner_tag.clone(), p.origin.clone()) for name, p in pools.items()}
    last = max(m.events)
    calls: dict[str, Callable[[], object]] = {
        "chunk": lambda: m.chunk(req),
        "extend": lambda: m.extend(req, (1,), 0),
        "finish": lambda: m.finish(req),
        "retract": lambda: m.retract(req),
        "abort": lambda: m.abort(req),
        "admit": lambda: admit(m, [req], Budget(24, 1)),
    }
    if raised(calls[op]) is not None:
        return f"provenance audit: {op} of request {req.rid} refused"
    logged = sorted(e for e in m.events if e > last)
    for name, p in pools.items():
        tags, origins = before[name]
        got = torch.nonzero((p.owner_tag != tags) & (p.owner_tag != FREE_TAG)).flatten().tolist()
        stamped = torch.nonzero(p.origin != origins).flatten().tolist()
        if not got and not stamped:
            continue
        if not logged or m.events[logged[-1]].op != op:
            ops = [m.events[e].op for e in logged]
            raise AssertionError(f"{law}: {op} of request {req.rid} gave {name} slots {got[:4]} owners, logging {ops}")
        # NOTE: a slot it stamped may have no owner now (a refused admission gave back what it took)
        bad = sorted({x for x in (*got, *stamped) if int(p.origin[x]) != logged[-1]})
        if bad:
            raise AssertionError(
                f"{law}: {op} of request {req.rid} (event {logged[-1]}) gave {name} slots {got[:6]} owners and "
                f"stamped slots {stamped[:6]}; slots {bad[:4]} name another event"
            )
    return f"provenance audit: {op} of request {req.rid}"


def log_audit(mm: MemoryManager, law: str) -> str:
    """The provenance log stays bounded and keeps what provenance names: on a copy of ``mm`` whose log keeps 4
    events, 13 more events are logged; then every event a slot's provenance names (and the last one) is still in
    the log, and the log holds at most 4 more than those.

    Raises ``AssertionError`` naming ``law`` otherwise (a log that never forgets grows with every operation of a
    long run; one that forgets a named event cannot say which operation leaked a slot)."""
    m = deepcopy(mm)
    keep = m.events_keep = 4
    for _ in range(3 * keep + 1):
        m.event("log audit", "-")
    named = {m._step} | {int(x) for p in m.pools().values() for x in torch.unique(p.origin).tolist()}
    lost = sorted(named - set(m.events))
    if lost:
        raise AssertionError(f"{law}: events {lost[:4]}, which slots' provenance names, were forgotten by the log")
    if len(m.events) > len(named) + keep:
        raise AssertionError(
            f"{law}: the event log holds {len(m.events)} events after {3 * keep + 1} more, with {len(named)} named by "
            f"provenance and {keep} kept: it does not forget"
        )
    return f"log audit: {len(m.events)} events, {len(named)} named"


NOT_PROBED: dict[str, str] = {
    "MemoryManager.event": "a log entry: its op and who are labels, any string (the leak audit checks its stamps)",
    "MemoryManager.own": "the request check every call taking a request makes first: probed through each of them",
    "MemoryManager.pools": "no argument: nothing outside its domain (every audit reads its answer)",
    "MemoryManager.running": "no argument: nothing outside its domain (the reads audit checks its answer)",
    "Sessions.check": "no argument: the session self-check, run by the system machine after every step",
    "RadixCache.live_handles": "no argument: nothing outside its domain (the lock laws read it)",
    "RadixCache.node_count": "no argument: nothing outside its domain (the cache audit checks it against a walk)",
    "RadixCache.nodes": "no argument: nothing outside its domain (every cache audit walks it)",
    "RadixCache.recompute_sizes": "no argument: nothing outside its domain (the size laws compare it with sizes)",
    "RadixCache.sizes": "no argument: nothing outside its domain (the size laws read it)",
    "RadixCache.revisit": "makes the error a walk raises on a node passed twice (the cache audit's cycles run it)",
}
"""Public methods of the probed classes that no scenario calls, each with the reason: every other public method
of ``MemoryManager``, ``Sessions`` and ``RadixCache`` is in a scenario (``test_public_calls`` holds the two
together, so a new public call cannot go unprobed unnoticed)."""


PROBED_FUNCTIONS: dict[str, str] = {
    "admission.admit": "admit",
    "admission.rollback": "admission.rollback",
    "admission.release_attempt_state": "admission.release_attempt_state",
    "integrity.fingerprint": "fingerprint",
    "integrity.fingerprint_one": "fingerprint_one",
    "integrity.verify": "integrity.verify",
    "owners.decode": "decode",
    "owners.node_tag": "node_tag",
}
"""Public functions of ``kvledger.impl``'s modules that a scenario calls, by the name of its method."""

_CHECKS = "an argument check the public calls make first: probed through the junk of every call that takes one"
_OWN = "a helper on values the implementation has already checked"
NOT_PROBED_FUNCTIONS: dict[str, str] = {
    **dict.fromkeys(
        (
            "arguments.check_device",
            "arguments.check_id",
            "arguments.check_ids_tensor",
            "arguments.check_int",
            "arguments.int_ids",
            "arguments.check_range",
            "arguments.check_tokens",
            "arguments.has_bool",
            "arguments.not_ids",
            "allocators.check_kv_write",
            "allocators.not_int64_1d",
            "owners.encode",
            "tree.as_key",
            "tree.key_bytes",
        ),
        _CHECKS,
    ),
    **dict.fromkeys(
        ("faults.active", "faults.disable", "faults.enable", "faults.injected"),
        ("a switch of the named faults (B1..B5), not part of the memory manager: the fault tests run each"),
    ),
    "allocators.swa_owner": f"{_OWN} (an owner's SWA twin): every SWA allocator call runs it",
    "integrity.fingerprint_unchecked": f"{_OWN} (the fingerprint of ids checked by its caller)",
    "leaks.check_leaks": "the leak checker: the leak audit plants leaks and wants each found, on every probing step",
    "leaks.expected_owners": "the leak checker's model of owners: the leak audit compares it with the ledgers",
    "leaks.session_mamba_refs": (
        f"{_OWN} (a session slot the leak checker walks): the leak audit gives it the junk it gives check_leaks"
    ),
    "req_to_token.has_duplicates": f"{_OWN} (ids a row write has checked in range)",
    "session.common_prefix": f"{_OWN} (a request's tokens and a session's, both checked at add and save)",
    "slots.host_bytes": f"{_OWN} (a 1-D int64 CPU tensor's bytes)",
    "slots.run_start": f"{_OWN} (ids a pool popped from its own free stack)",
    "tree.common_prefix": f"{_OWN} (keys the tree has checked): every match and insert runs it",
    "tree.longest_match": f"{_OWN} (a walk's own positions): every match runs it",
}
"""Public functions of ``kvledger.impl``'s modules that no scenario calls by name, each with the reason
(``test_public_calls`` holds every public function to this list or to ``PROBED_FUNCTIONS``)."""


SCENARIOS: dict[str, tuple[Callable[[str, Draw], Scenario], ...]] = {
    "token": (cache_scenario, manager_scenario),
    "paged": (cache_scenario, manager_scenario),
    "swa": (cache_scenario,),
    "mamba": (cache_scenario, manager_scenario),
    "req_to_token": (manager_scenario,),
}
"""Per pool kind of the pool machine: the live objects built on that kind of pool whose public calls it probes."""


# ---------------------------------------------------------------- the probe


def audit(scenario: Scenario, draw: Draw) -> str:
    """Run ``scenario``'s audit of its own checker, if it has one; what was audited."""
    return "" if scenario.audit is None else scenario.audit(draw)


def probe(scenario: Scenario, draw: Draw) -> str:
    """Make one public call of ``scenario`` (one argument junk at most) and hold it to the law; what was called.

    Raises ``AssertionError`` naming the law it broke: ``inv_domain_enforced`` (a call outside accepted or
    refused untyped, a reading call inside refused), ``inv_names_culprit``, ``rejected call leaves state
    unchanged`` (a refused call, or a reading one, changed the fingerprint)."""
    method = fair_pick(scenario, draw, [m for m in scenario.methods for _ in range(m.weight)], "probe")
    names = list(method.args)
    inside_too = method.reads or (scenario.on_copy is not None and scenario.probes_on_copy)
    broken = draw(sampled_from([None, *names] if inside_too else names))
    got, inside, missing = _draw_args(method, draw, broken, lambda arg, d: arg.junk(d))
    if missing is not None:
        return f"{scenario.what}.{method.what}: no {'junk' if missing == broken else 'valid'} {missing} in this state"
    if inside and not method.reads:
        if scenario.on_copy is not None:
            return scenario.on_copy(method, got)
        return f"{scenario.what}.{method.what}: inside"  # NOTE: a valid call that changes state: the rules make those
    return judge(scenario, method, got, inside)


def sweep(scenario: Scenario, draw: Draw) -> str:
    """Make one public call of ``scenario`` with each value of each argument's catalogue of junk (``Arg.edges``)
    in turn, one argument at a time, the others valid, and hold each to the law (see :func:`probe`); what was
    swept.

    A probe draws one kind of junk for one argument, so a check weakened for one kind (a sparse tensor let
    through, a bool taken for an int) is met only now and then; a sweep meets every kind for every argument of one
    drawn call, in the state this example built (a catalogue drawn from the state, such as an insert's slots not
    in page order, is met in each state the call is swept in, not in one of its arguments' turns). A method is
    drawn as often as its ``weight`` says (a call whose domain depends on much state, more often), among those not
    swept on this object yet while there are any."""
    methods = [
        m for m in scenario.methods for _ in range(m.weight) if any(a.edges is not None for a in m.args.values())
    ]
    if not methods:
        return f"{scenario.what}: no argument with a catalogue of junk"
    # NOTE: the object is built once per example and no sweep changes it: a call swept again meets the same state
    # and the same catalogues, so the calls not yet swept here go first (each example's sweeps are distinct calls)
    fresh = [m for m in methods if m.what not in scenario.swept]
    method = fair_pick(scenario, draw, fresh or methods, "sweep")
    scenario.swept.add(method.what)
    swept: list[str] = []
    before = None
    errors: list[KVLedgerError] = []
    for broken in (k for k, a in method.args.items() if a.edges is not None):
        made_here = 0
        for base in _bases(method, broken, scenario, draw):
            for i in count():
                got, inside, missing = _draw_args(method, draw, broken, _edge_at(i), base)
                if missing == broken:
                    break
                if missing is not None:
                    return f"{scenario.what}.{method.what}: no valid {missing} in this state"
                before, made = _made(scenario, method, got, inside, before, errors)
                made_here += made
        swept.append(f"{made_here} junk {broken}")
    names_one_operation(f"{scenario.what}.{method.what}", errors)
    return f"{scenario.what}.{method.what}: {', '.join(swept)}"


def names_one_operation(what: str, errors: Sequence[KVLedgerError]) -> None:
    """``spec.errors.inv_names_one_operation`` over ``errors``, the refusals of one call ``what``; ``AssertionError``
    naming the law, with one refusal of each operation named, otherwise."""
    if not inv_names_one_operation(errors):
        named = {e.operation: e for e in errors if isinstance(e, LedgerError)}
        raise AssertionError(
            f"inv_names_one_operation: {what}'s refusals name {sorted(named)}: "
            + "; ".join(f"{e!r}" for e in named.values())
        )


def _bases(
    method: Method, broken: str, scenario: Scenario | None = None, draw: Draw | None = None
) -> list[dict[str, object]]:
    """What a sweep of ``broken`` fixes before it: nothing (the arguments before it drawn valid), and, when its
    catalogue cannot be made without them (an end past the drawn request's own slots), each valid value of the
    first argument's catalogue in turn (a request of each stage of life), so its edges meet every such value.

    Otherwise, given the scenario and a draw, one base: nothing, or one valid value of the first argument's
    catalogue (drawn with :func:`fair_pick`): an argument drawn valid is drawn simple (a key of the cached tokens,
    the first request), while its catalogue's valid values are the rare ones (a key all new, a request at a late
    stage), and some junk of a later argument is refused only on the simple one's path (slots repeated on a
    cached key's page are refused by the comparison with the cached page; on a new key's, by the repeat check)."""
    names = list(method.args)
    arg, first = method.args[broken], method.args[names[0]]
    if names[0] == broken or arg.edges is None or first.edges is None:
        return [{}]
    valid = [{names[0]: v} for v in _alone(first) or () if first.inside(v, {})]
    if _alone(arg) is None:
        return [{}, *valid]
    if scenario is None or draw is None or not valid:
        return [{}]
    return [fair_pick(scenario, draw, [{}, *valid], f"base of {method.what}.{broken}")]


def _alone(arg: Arg) -> Sequence[object] | None:
    """``arg``'s catalogue of junk drawn relative to no other argument; ``None`` when it has none (no catalogue, or
    one that cannot be made without the arguments before it: an end past the drawn request's own slots)."""
    if arg.edges is None:
        return None
    try:
        return arg.edges({})
    except Exception:  # NOTE: a catalogue that needs the arguments before it
        return None


def _made(
    scenario: Scenario,
    method: Method,
    got: Mapping[str, object],
    inside: bool,
    before: object,
    errors: list[KVLedgerError] | None = None,
) -> tuple[object, bool]:
    """Make one call of a sweep (or a cross): a call inside its domain that changes state on the scenario's copy
    (else it is left to the rules: a catalogue value valid here, an owner that is the holder), any other judged
    against the state before the first of them (each leaves the state as it was); (that state, whether made)."""
    if inside and not method.reads:
        if scenario.on_copy is None:
            return before, False
        scenario.on_copy(method, got)
        return before, True
    if before is None:
        before = scenario.fingerprint()
    judge(scenario, method, got, inside, before=before, show=False, errors=errors)
    return before, True


def cross(scenario: Scenario, draw: Draw) -> str:
    """Give one value of an argument that several of ``scenario``'s calls take (a request at one stage of its
    life, a component, a match) to each of those calls in turn, the other arguments valid, and hold each to the
    law (see :func:`probe`); what was crossed.

    A sweep meets every value of one call's argument; a rare value (a resumed turn still waiting, one request in
    a hundred examples) then meets a given call only when that call's sweep is drawn too. Here the value is
    drawn first (``fair_pick`` over the values of the arguments' catalogues) and meets every call that takes it.
    A call that lies inside its domain and changes state is made on a copy where the scenario has one."""
    takers: dict[str, list[Method]] = {}
    for m in scenario.methods:
        for k, a in m.args.items():
            if a.edges is not None:
                takers.setdefault(k, []).append(m)
    shared = sorted(k for k, ms in takers.items() if len({m.what for m in ms}) > 1)
    if not shared:
        return f"{scenario.what}: no argument that several calls take"
    name = fair_pick(scenario, draw, shared, "cross")
    values: dict[int, object] = {}
    for m in takers[name]:
        for v in _alone(m.args[name]) or ():  # NOTE: a catalogue that depends on earlier arguments has none here
            values.setdefault(id(v), v)
    if not values:
        return f"{scenario.what}: no value of {name} to cross"
    value = fair_pick(scenario, draw, list(values.values()), "cross value")
    before, crossed = None, 0
    for m in {id(m): m for m in takers[name]}.values():
        got, inside, missing = _draw_args(m, draw, name, lambda _a, _d: just(value))
        if missing is not None:
            continue
        before, made = _made(scenario, m, got, inside, before)
        crossed += made
        # NOTE: and the edges of each argument after it that are drawn relative to it (an end past this request's
        # own slots): a sweep meets them only with a value of ``name`` drawn valid, not with this one
        for later in list(m.args)[list(m.args).index(name) + 1 :]:
            for edge in _edges_relative(m.args[later], got):
                tried, inside, _ = _draw_args(m, draw, None, lambda _a, _d: None, fixed={**got, later: edge})
                before, made = _made(scenario, m, tried, inside, before)
                crossed += made
    return f"{scenario.what}: {name} {_show(value)} given to {crossed} calls"


def _edges_relative(arg: Arg, got: Drawn) -> Sequence[object]:
    """``arg``'s catalogue of junk as drawn relative to the arguments ``got`` before it, where that differs from
    its catalogue relative to nothing (one with no value without them, or other values); else none (a sweep
    meets a fixed catalogue already)."""
    if arg.edges is None:
        return ()
    mine, alone = arg.edges(got), _alone(arg)
    return mine if alone is None or [_show(v) for v in mine] != [_show(v) for v in alone] else ()


def _edge_at(i: int) -> Callable[[Arg, Drawn], st.SearchStrategy[object] | None]:
    """The ``i``-th value of an argument's catalogue of junk, as drawn so far (``None``: the catalogue is done)."""

    def edge(arg: Arg, d: Drawn) -> st.SearchStrategy[object] | None:
        values = arg.edges(d) if arg.edges is not None else ()
        return just(values[i]) if i < len(values) else None

    return edge


def _draw_args(
    method: Method,
    draw: Draw,
    broken: str | None,
    junk: Callable[[Arg, Drawn], st.SearchStrategy[object] | None],
    fixed: Mapping[str, object] | None = None,
) -> tuple[dict[str, object], bool, str | None]:
    """``method``'s arguments in order, each valid but ``broken`` (from ``junk``) and those ``fixed`` (given):
    (them, whether every one lies inside its domain, the first argument with no value in this state or ``None``)."""
    got: dict[str, object] = {}
    inside = True
    for k, arg in method.args.items():
        if fixed and k in fixed:
            got[k] = fixed[k]
            inside = inside and arg.inside(got[k], got)
            continue
        strategy = junk(arg, got) if k == broken else arg.valid(got)
        if strategy is None:
            return got, False, k
        got[k] = draw(strategy)
        inside = inside and arg.inside(got[k], got)
    return got, inside, None


def judge(
    scenario: Scenario,
    method: Method,
    args: Mapping[str, object],
    inside: bool,
    *,
    before: object = None,
    show: bool = True,
    errors: list[KVLedgerError] | None = None,
) -> str:
    """Make ``method(**args)`` on ``scenario``'s object, ``inside`` its domain or not, and hold it to the law (see
    :func:`probe`); what was called (``show=False``: "", the call shown only if it breaks the law).

    ``before``: the fingerprint of the state before the call, when the caller knows it (a sweep: each call of
    which must leave the state as it found it), else taken here; returns after checking it is unchanged."""
    shown = _shown(scenario, method, args) if show else ""
    what: Callable[[], str] = (lambda: shown) if show else (lambda: _shown(scenario, method, args))
    if before is None:
        before = scenario.fingerprint()
    err = raised(lambda: method.call(**args))
    if errors is not None and isinstance(err, KVLedgerError):
        errors.append(err)  # NOTE: a sweep's: ``inv_names_one_operation`` over every refusal of the call it swept
    story = "; ".join(scenario.story)
    if not D.inv_domain_enforced(inside, err):
        side = "lies in its domain" if inside else "lies outside its domain"
        verdict = f"was refused: {err!r}" if inside else ("was accepted" if err is None else f"raised {err!r}")
        raise AssertionError(f"inv_domain_enforced: {what()} {side} and {verdict} (after: {story})")
    if isinstance(err, KVLedgerError) and not inv_names_culprit(err):
        raise AssertionError(f"inv_names_culprit: {what()}: {type(err).__name__} names no slot: {err}")
    _names_what_was_short(err, scenario.short_of, what)
    for k, v in args.items():
        arg = method.args[k]
        name = arg.culprit(v) if arg.culprit is not None and not arg.inside(v, args) else None
        if name is not None and err is not None and name not in str(err):
            raise AssertionError(f"inv_names_culprit: {what()} was refused without naming {name}: {err}")
        want = arg.refusal(v, args) if arg.refusal is not None and not arg.inside(v, args) else None
        if want is not None and err is not None and not isinstance(err, want):
            raise AssertionError(f"inv_domain_enforced: {what()} was refused with {err!r}, not {want.__name__}")
    if scenario.fingerprint() != before:
        how = "a call that only reads" if inside else "a rejected call"
        raise AssertionError(
            f"rejected call leaves state unchanged: {how}, {what()}, changed the state (after: {story})"
        )
    if isinstance(err, NotOwner) and scenario.pools is not None:
        # NOTE: the state is as it was before the call (checked above), so its ledgers are the ones refused
        holder_named(err, {name: ledger_of(p) for name, p in scenario.pools().items()}, what())
    return shown


def holder_named(err: BaseException | None, ledgers: Mapping[str, Ledger], what: str = "") -> None:
    """``spec.errors.inv_names_holder`` against ``ledgers`` (the pools' by ledger name, as the refused call found
    them); ``AssertionError`` naming the law otherwise."""
    if not isinstance(err, NotOwner):
        return

    def holder(pool: str, slot: int) -> object:
        return owner_of(ledgers[pool], slot) if pool in ledgers else None

    if not inv_names_holder(err, holder):
        slot, said = err.held or (None, None)
        truth = holder(err.pool, slot) if slot is not None else None
        raise AssertionError(
            f"inv_names_holder: {what + ': ' if what else ''}NotOwner says slot {slot} is held by {said}, the "
            f"ledger says by {truth}: {err}"
        )


def _names_what_was_short(err: BaseException | None, short: frozenset[str] | None, what: Callable[[], str]) -> None:
    """An ``OverAllocation`` names what was short: one of ``short`` (the object's pools, an admission's budget)."""
    if isinstance(err, OverAllocation) and short is not None and err.pool not in short:
        raise AssertionError(
            f"inv_names_culprit: {what()} was refused as short of {err.pool!r}, none of {sorted(short)}: {err}"
        )


def _shown(scenario: Scenario, method: Method, args: Mapping[str, object]) -> str:
    return f"{scenario.what}.{method.what}({', '.join(f'{k}={_show(v)}' for k, v in args.items())})"


def _show(v: object) -> str:
    if isinstance(v, torch.Tensor):
        if v.is_meta or v.layout != torch.strided:
            return f"a {'meta' if v.is_meta else v.layout} tensor of {tuple(v.shape)} {v.dtype}"
        if v.dim() == 1 and len(v) > 16:  # NOTE: a long key: its ends and its length
            return f"tensor([{str(v[:8].tolist())[1:-1]}, ..., {str(v[-2:].tolist())[1:-1]}] of {len(v)}, {v.dtype})"
        return f"tensor({v.tolist()}, {v.dtype})"
    if isinstance(v, tuple) and v and isinstance(v[0], MatchResult):
        return f"match of {v[1]} (length {v[0].length})"
    if isinstance(v, MatchResult):
        return f"match (length {v.length})"
    if isinstance(v, Request):
        return f"request {v.rid} ({v.status.value})"
    if isinstance(v, list) and len(v) > 16:  # NOTE: a long key: its ends and its length
        return f"[{repr(v[:8])[1:-1]}, ..., {repr(v[-2:])[1:-1]}] of {len(v)}"
    return repr(v)[:60]
