"""Held-out trust corpus (issue 17), library calls: fresh bad inputs to every public entry point of ``kvledger.impl``.

Written apart from ``tests/impl/test_bad_arguments.py`` (its values are not
reused): the classes here are numpy scalars, ``Decimal``/``Fraction``/complex
numbers, infinities and ``-0.0``, int64 edges (``2**63``), iterators and
mappings where sequences are expected, bools hidden inside token lists,
tensors that are empty but 2-D, 0-D, stride-0 (``expand``: one slot named
twice), non-contiguous, of small integer dtypes with negative values, views
into the pool's own tables (aliasing), owners whose kind and component do not
go together, clones of live requests, nodes and handles (``copy.copy``), the
root node, objects another structure holds (an LRU node linked in another
list), duplicates in request lists, and attempts that were never made.

Each input is one call. Its outcome is classified (:func:`classify`):

* ``clean``: a :class:`~kvledger.spec.errors.KVLedgerError` naming the call, the whole state unchanged;
* ``traceback``: any other exception;
* ``state``: a typed rejection that changed state;
* ``silent``: the call returned (garbage accepted).

The state is a deep, generic fingerprint of every object reachable from the
world (:func:`deep_state`): every attribute, tensor byte and container,
memo caches aside. ``test_the_checks_can_fail`` shows each class is detected.
"""

from __future__ import annotations

import copy
import enum
import io
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from kvledger.contracts.adapters.reference import ReferenceAdapter
from kvledger.contracts.adapters.reference_system import ReferenceSystemAdapter, build_manager
from kvledger.contracts.adapters.system import SystemConfig
from kvledger.contracts.machines.suites import CACHE_MODELS
from kvledger.contracts.trace.adapter_recorder import record_adapter_workload
from kvledger.contracts.trace.recorder import record_workload
from kvledger.contracts.trace.replay import replay, replay_path
from kvledger.contracts.trace.system_recorder import record_system_workload
from kvledger.impl import faults, integrity
from kvledger.impl.admission import Attempt, Budget, admit, release_attempt_state, rollback
from kvledger.impl.allocators import PagedAllocator, SWATokenAllocator, TokenAllocator, check_kv_write
from kvledger.impl.leaks import check_leaks, expected_owners, session_mamba_refs
from kvledger.impl.lru import Linked, LRUList
from kvledger.impl.mamba import MambaPool
from kvledger.impl.memory import MemoryManager
from kvledger.impl.owners import decode, encode, node_tag
from kvledger.impl.radix import RadixCache
from kvledger.impl.req_to_token import ReqToTokenPool
from kvledger.impl.requests import Request
from kvledger.impl.slots import SlotPool
from kvledger.impl.tree import TreeNode
from kvledger.spec.errors import KVLedgerError
from kvledger.spec.types import Component, Owner, OwnerKind, request

FULL, SWA, MAMBA = Component.FULL, Component.SWA, Component.MAMBA
R7 = request(7)


def T(*xs: int, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    return torch.tensor(xs, dtype=dtype)


# ---------------------------------------------------------------- the world


@dataclass
class W:
    mm: MemoryManager
    twin: MemoryManager  # built the same way: same ids, other objects
    run: Request  # running, holds a row, KV, a Mamba state and a lock
    wait: Request
    done: Request  # finished
    sess: Request  # running on session 1
    node: TreeNode
    swa: RadixCache
    paged: PagedAllocator
    pool: SlotPool
    lru: LRUList[Linked]
    other_lru: LRUList[Linked]
    linked: Linked  # in ``lru``
    elsewhere: Linked  # in ``other_lru``


def _manager() -> tuple[MemoryManager, Request, Request, Request, Request]:
    mm = MemoryManager(RadixCache(TokenAllocator(40), mamba=MambaPool(8)), ReqToTokenPool(5, 20))
    mm.sessions.open(1)
    done = mm.add_request((9, 8, 7, 6))
    admit(mm, [done], Budget(64, 4))
    mm.finish(done)
    run = mm.add_request((9, 8, 7, 6, 5))
    sess = mm.add_request((3, 3), 1)
    admit(mm, [run, sess], Budget(64, 4))
    wait = mm.add_request((4, 4, 4))
    return mm, run, wait, done, sess


def build() -> W:
    mm, run, wait, done, sess = _manager()
    twin = _manager()[0]
    node = mm.cache.match_prefix(T(9, 8, 7, 6)).last_node
    swa_kv = SWATokenAllocator(12, 12)
    swa = RadixCache(swa_kv, swa_window=2)
    swa.insert(T(1, 2, 3), swa_kv.alloc(3, R7), R7)
    paged = PagedAllocator(8, 2)
    paged.alloc(4, R7)
    pool = SlotPool("p", 6, base=1)
    pool.alloc(2, R7)
    lru: LRUList[Linked] = LRUList(FULL)
    other: LRUList[Linked] = LRUList(FULL)
    a, b = Linked(1), Linked(2)
    lru.insert_mru(a)
    other.insert_mru(b)
    return W(mm, twin, run, wait, done, sess, node, swa, paged, pool, lru, other, a, b)


_ONE: list[W] = []


def fresh() -> W:
    if not _ONE:
        _ONE.append(build())
    return copy.deepcopy(_ONE[0])


# ---------------------------------------------------------------- the deep fingerprint

MEMO = frozenset({"_seen", "_fresh", "_iota", "_iota_np", "_iota_bytes", "_mark", "_index", "_offsets", "_walked"})
"""Attributes that only memoise (a rejected call may warm them; they change no answer)."""


def deep_state(root: object) -> object:
    """A canonical, comparable picture of everything reachable from ``root``: objects by attribute, tensors and
    arrays by dtype, shape and bytes, containers by content; an object met again is a back-reference by number."""
    seen: dict[int, int] = {}
    keep: list[object] = []  # NOTE: keeps visited objects alive, so ids are not reused during the walk

    def go(x: object) -> object:
        if x is None or isinstance(x, bool | int | str | bytes):
            return x
        if isinstance(x, float):
            return repr(x)
        if isinstance(x, enum.Enum):
            return (type(x).__name__, x.name)
        if isinstance(x, type) or (callable(x) and not hasattr(x, "__dict__") and not hasattr(x, "__slots__")):
            return ("callable", getattr(x, "__qualname__", repr(x)))
        if id(x) in seen:
            return ("ref", seen[id(x)])
        seen[id(x)] = len(seen)
        keep.append(x)
        if isinstance(x, torch.Tensor):
            if x.is_meta or x.layout != torch.strided:
                return ("tensor", str(x.dtype), tuple(x.shape), str(x.layout))
            return ("tensor", str(x.dtype), tuple(x.shape), x.detach().cpu().contiguous().numpy().tobytes())
        if isinstance(x, np.ndarray):
            return ("array", str(x.dtype), x.shape, x.tobytes())
        if isinstance(x, list | tuple):
            return (type(x).__name__, [go(v) for v in x])
        if isinstance(x, dict):
            return ("dict", [(go(k), go(v)) for k, v in x.items()])
        if isinstance(x, set | frozenset):
            return ("set", sorted(repr(go(v)) for v in x))
        if isinstance(x, bytearray | memoryview):
            return ("bytes", bytes(x))
        fields: dict[str, object] = {}
        for klass in type(x).__mro__:
            for name in getattr(klass, "__slots__", ()):
                if name not in MEMO and hasattr(x, name):
                    fields[name] = getattr(x, name)
        fields.update((k, v) for k, v in getattr(x, "__dict__", {}).items() if k not in MEMO)
        return (type(x).__name__, [(k, go(v)) for k, v in sorted(fields.items())])

    return go(root)


# ---------------------------------------------------------------- classification


class Outcome(enum.Enum):
    CLEAN = "clean"
    TRACEBACK = "traceback"
    STATE = "state"
    SILENT = "silent"


def classify(w: Any, call: Callable[[Any], object], names: tuple[str, ...]) -> tuple[Outcome, str]:
    """Run ``call(w)`` and say what became of it (and why, for a message)."""
    before = deep_state(w)
    try:
        got = call(w)
    except KVLedgerError as err:
        if deep_state(w) != before:
            return Outcome.STATE, f"{type(err).__name__} but the state changed: {err}"
        if not any(n in str(err) for n in names):
            return Outcome.TRACEBACK, f"{type(err).__name__} not naming the call ({'/'.join(names)}): {err}"
        return Outcome.CLEAN, str(err)
    except Exception as err:
        return Outcome.TRACEBACK, f"{type(err).__name__}: {err}"
    return Outcome.SILENT, f"accepted, returned {got!r:.80}"


# ---------------------------------------------------------------- bad values, by class


def numbers() -> list[object]:
    return [
        np.int64(2),
        np.float64(2.0),
        np.bool_(True),
        Decimal(2),
        Fraction(2, 1),
        2 + 0j,
        math.inf,
        -0.0,
        2**63,
        -(2**63) - 1,
        range(2),
        iter([2]),
        frozenset({2}),
        Ellipsis,
        int,
    ]


def tensors() -> list[object]:
    """Index tensors no pool takes: one per class of layout, shape, dtype and aliasing."""
    return [
        torch.zeros((0, 2), dtype=torch.int64),
        torch.tensor(3),
        T(3, 4).view(1, 2),
        T(-3, dtype=torch.int8),
        T(-1, 3, dtype=torch.int16),
        torch.tensor([3.0]).to(torch.float16),
        torch.tensor([3], dtype=torch.complex64),
        T(3, 4).to_sparse_csr() if False else T(3, 4).to_sparse(),
        np.array([3, 4]),
        memoryview(b"\x03\x00\x00\x00\x00\x00\x00\x00"),
        T(2**40),
        T(-(2**40)),
        T(2**31),
    ]


def owners() -> list[object]:
    return [
        Owner(OwnerKind.NODE, 3),  # a node owner with no component
        Owner(OwnerKind.SESSION, 1, FULL),  # a session with a component
        Owner(OwnerKind.REQUEST, np.int64(3)),  # type: ignore[arg-type]
        Owner(OwnerKind.REQUEST, 2**56),
        Owner(OwnerKind.REQUEST, -0.0),  # type: ignore[arg-type]
        Owner(OwnerKind.REQUEST, 3, "swa"),  # type: ignore[arg-type]
        type("FakeOwner", (), {"kind": OwnerKind.REQUEST, "ident": 3, "component": None})(),
        str(R7),
        [OwnerKind.REQUEST, 3],
    ]


def token_lists() -> list[object]:
    return [
        (True, 2),
        (2, False),
        (np.float64(2.0),),
        (2, 2**63),
        iter([1, 2]),
        {1: 1, 2: 2},
        (1,) * 21,
        ("1",),
        [b"\x01"],
        (1, None, 2),
        (Decimal(1),),
        (1.0, 2.0),
    ]


def requests(w: W) -> list[object]:
    clone = copy.copy(w.run)
    twin = w.twin.requests[w.run.rid]
    return [clone, twin, w.run.owner, w.run.rid, str(w.run.rid), Request(w.run.rid, w.run.tokens), w.mm]


def nodes(w: W) -> list[object]:
    return [copy.copy(w.node), w.node.id, w.twin.cache.match_prefix(T(9, 8, 7, 6)).last_node, w.linked]


def handles(w: W) -> list[object]:
    h = w.run.handle
    assert h is not None
    return [copy.copy(h)._replace(id=h.id + 100), h._replace(table=h.table + 1), h._replace(id=True), (h.id,), h.id]


# ---------------------------------------------------------------- the corpus: (entry point, bad input, call)


@dataclass(frozen=True)
class Input:
    entry: str
    label: str
    call: Callable[[W], object]
    names: tuple[str, ...]  # what the message must name (the operation, as errors write it)


def _row(w: W) -> int:
    assert w.run.row is not None
    return w.run.row


def corpus() -> Iterator[Input]:
    probe = fresh()

    def each(
        entry: str, values: Callable[[W], list[object]] | list[object], call: Callable[[W, Any], object], *names: str
    ) -> Iterator[Input]:
        """One input per value; ``values`` of a world are drawn again from the world each input runs on."""
        make = values if callable(values) else (lambda w, vs=values: vs)
        for i, v in enumerate(make(probe)):
            yield Input(entry, f"{i}:{type(v).__name__}", lambda w, i=i: call(w, make(w)[i]), names)

    # sizes and ids
    yield from each("SlotPool.alloc n", lambda w: numbers(), lambda w, v: w.pool.alloc(v, R7), "alloc")
    yield from each("TokenAllocator.alloc n", lambda w: numbers()[:10], lambda w, v: w.mm.kv.alloc(v, R7), "alloc")
    yield from each("PagedAllocator.pages_for", lambda w: numbers()[:8], lambda w, v: w.paged.pages_for(v), "pages_for")
    yield from each("MemoryManager.round_up", lambda w: numbers()[:8], lambda w, v: w.mm.round_up(v), "round_up")
    yield from each("RadixCache.evict n", lambda w: numbers()[:8], lambda w, v: w.mm.cache.evict(FULL, v), "evict")
    yield from each(
        "MambaPool.write_fingerprint slot",
        lambda w: numbers()[:9],
        lambda w, v: w.mm.mamba.write_fingerprint(v, 1),
        "write_fingerprint",
    )  # type: ignore[union-attr]
    yield from each(
        "ReqToTokenPool.read start", lambda w: numbers()[:9], lambda w, v: w.mm.rows.read(_row(w), v, 2), "read"
    )
    yield from each("SlotPool.owner_of", lambda w: numbers()[:9], lambda w, v: w.pool.owner_of(v), "owner_of")
    yield from each(
        "MemoryManager.extend ahead", lambda w: numbers()[:8], lambda w, v: w.mm.extend(w.run, (1,), v), "extend"
    )
    yield from each("Sessions.open", lambda w: numbers()[:8], lambda w, v: w.mm.sessions.open(v), "open_session")
    yield from each(
        "MemoryManager.add_request session",
        lambda w: numbers()[:8],
        lambda w, v: w.mm.add_request((1,), v),
        "add_request",
    )
    yield from each(
        "integrity.fingerprint_one",
        lambda w: numbers()[:6],
        lambda w, v: integrity.fingerprint_one(v, 0),
        "fingerprint",
    )
    yield from each("owners.node_tag", [None, 1.5, True, -1, 2**56], lambda w, v: node_tag(v), "node_tag")
    yield from each("owners.decode", [None, 1.5, "x", 2**64, -(2**63) - 1], lambda w, v: decode(v), "decode")
    # index tensors
    yield from each("SlotPool.free", lambda w: tensors(), lambda w, v: w.pool.free(v, R7), "free")
    yield from each("TokenAllocator.free", lambda w: tensors(), lambda w, v: w.mm.kv.free(v, w.run.owner), "free")
    yield from each("PagedAllocator.free", lambda w: tensors(), lambda w, v: w.paged.free(v, R7), "free")
    yield from each("SWATokenAllocator.translate", lambda w: tensors(), lambda w, v: w.swa.kv.translate(v), "translate")  # type: ignore[union-attr]
    yield from each("MambaPool.free", lambda w: tensors(), lambda w, v: w.mm.mamba.free(v, w.run.owner), "free")  # type: ignore[union-attr]
    yield from each(
        "ReqToTokenPool.write slots",
        lambda w: tensors(),
        lambda w, v: w.mm.rows.write(_row(w), 0, v, w.run.owner),
        "write",
    )
    yield from each(
        "RadixCache.match_prefix", lambda w: tensors()[:8], lambda w, v: w.mm.cache.match_prefix(v), "match_prefix"
    )
    yield from each(
        "check_kv_write slots",
        lambda w: tensors(),
        lambda w, v: check_kv_write("w", "kv", v, T(1), T(0), torch.device("cpu"), 1, 41),
        "w",
    )

    # duplicates and aliasing
    def dup(w: W) -> list[object]:
        return [T(3).expand(2), T(3, 4, 3)[::2], T(3, 3, dtype=torch.int32)]

    yield from each("TokenAllocator.free dup", dup, lambda w, v: w.mm.kv.free(v, w.run.owner), "free")
    yield from each("ReqToTokenPool.write dup", dup, lambda w, v: w.mm.rows.write(_row(w), 0, v, w.run.owner), "write")
    yield Input(
        "ReqToTokenPool.write alias dup",
        "own row",
        lambda w: w.mm.rows.write(_row(w), 1, w.mm.rows.table[_row(w), 0:1].expand(2), w.run.owner),
        ("write",),
    )
    yield Input("admit dup", "[wait, wait]", lambda w: admit(w.mm, [w.wait, w.wait], Budget(64, 4)), ("admit",))
    yield Input(
        "admit twin", "twin's request", lambda w: admit(w.mm, [w.twin.requests[w.wait.rid]], Budget(64, 4)), ("admit",)
    )
    yield Input("admit iterator", "generator", lambda w: admit(w.mm, iter([w.wait]), Budget(64, 4)), ("admit",))  # type: ignore[arg-type]
    yield Input("admit budget", "numpy", lambda w: admit(w.mm, [w.wait], Budget(np.int64(64), 4)), ("admit",))  # type: ignore[arg-type]
    yield Input("admit budget", "negative", lambda w: admit(w.mm, [w.wait], Budget(64, -1)), ("admit",))
    yield Input("LRUList.touch_all dup", "[a, a]", lambda w: w.lru.touch_all([w.linked, w.linked]), ("lru",))
    yield Input("LRUList.insert_mru other list", "linked elsewhere", lambda w: w.lru.insert_mru(w.elsewhere), ("lru",))
    yield Input("LRUList.remove other list", "linked elsewhere", lambda w: w.lru.remove(w.elsewhere), ("lru",))
    yield Input("LRUList.touch other list", "linked elsewhere", lambda w: w.lru.touch(w.elsewhere), ("lru",))
    yield Input("LRUList.place", "tuple of ints", lambda w: w.lru.place((1, 2)), ("lru",))  # type: ignore[arg-type]
    yield Input(
        "MambaPool.copy_state",
        "src = dst",
        lambda w: w.mm.mamba.copy_state(w.run.mamba.state, w.run.mamba.state, w.run.owner),
        ("copy_state",),
    )  # type: ignore[union-attr]
    # owners
    yield from each("SlotPool.alloc owner", lambda w: owners(), lambda w, v: w.pool.alloc(1, v), "alloc")
    yield from each("TokenAllocator.free owner", lambda w: owners(), lambda w, v: w.mm.kv.free(T(5), v), "free")
    yield from each(
        "MambaPool.transfer dst",
        lambda w: owners()[:7],
        lambda w, v: w.mm.mamba.transfer(T(w.run.mamba.state), w.run.owner, v),
        "transfer",
    )  # type: ignore[union-attr]
    yield from each(
        "RadixCache.insert owner",
        lambda w: owners()[:7],
        lambda w, v: w.mm.cache.insert(T(1, 1), T(30, 31), v),
        "insert",
    )
    yield from each("encode", lambda w: owners(), lambda w, v: encode(v, "encode"), "encode")
    # token lists
    yield from each(
        "MemoryManager.add_request tokens", lambda w: token_lists(), lambda w, v: w.mm.add_request(v), "add_request"
    )
    yield from each(
        "MemoryManager.extend tokens", lambda w: token_lists()[:6], lambda w, v: w.mm.extend(w.run, v), "extend"
    )
    yield from each(
        "RadixCache.match_prefix tokens",
        lambda w: token_lists()[:4],
        lambda w, v: w.mm.cache.match_prefix(v),
        "match_prefix",
    )
    yield from each(
        "RadixCache.insert key", lambda w: token_lists()[:4], lambda w, v: w.mm.cache.insert(v, T(30, 31), R7), "insert"
    )
    # requests, nodes, handles, sessions from elsewhere or cloned
    for entry, fn in [
        ("MemoryManager.finish", lambda w, v: w.mm.finish(v)),
        ("MemoryManager.abort", lambda w, v: w.mm.abort(v)),
        ("MemoryManager.retract", lambda w, v: w.mm.retract(v)),
        ("MemoryManager.chunk", lambda w, v: w.mm.chunk(v)),
        ("MemoryManager.extend", lambda w, v: w.mm.extend(v, (1,))),
        ("MemoryManager.write_kv", lambda w, v: w.mm.write_kv(v, 0, 1)),
        ("Sessions.save", lambda w, v: w.mm.sessions.save(v)),
    ]:
        yield from each(entry, requests, fn, entry.split(".")[-1])
    yield Input("Sessions.close", "lent to a running request", lambda w: w.mm.sessions.close(1), ("close_session",))
    yield Input("Sessions.resume", "running request", lambda w: w.mm.sessions.resume(w.sess), ("resume",))
    yield Input("rollback", "attempt of a running request", lambda w: rollback(w.mm, Attempt(w.run)), ("rollback",))
    yield Input("rollback", "attempt of a finished request", lambda w: rollback(w.mm, Attempt(w.done)), ("rollback",))
    yield Input(
        "release_attempt_state",
        "twin manager",
        lambda w: release_attempt_state(
            w.mm, Attempt(w.twin.requests[w.run.rid], mamba=w.twin.requests[w.run.rid].mamba)
        ),
        ("release", "free", "rollback"),
    )
    yield Input(
        "release_attempt_state", "not an attempt", lambda w: release_attempt_state(w.mm, None), ("release", "rollback")
    )  # type: ignore[arg-type]
    yield Input(
        "MemoryManager.free_mamba",
        "running request's live state",
        lambda w: w.mm.free_mamba(w.wait.owner, w.run.mamba),
        ("free",),
    )  # type: ignore[arg-type]
    yield from each("RadixCache.inc_lock_ref", nodes, lambda w, v: w.mm.cache.inc_lock_ref(v), "inc_lock_ref")
    yield from each("RadixCache.prefix", nodes, lambda w, v: w.mm.cache.prefix(v), "prefix")
    yield from each("RadixCache.dec_lock_ref", handles, lambda w, v: w.mm.cache.dec_lock_ref(v), "dec_lock_ref")
    yield from each(
        "RadixCache.evict component",
        ["full", FULL.value, OwnerKind.NODE, 0, None],
        lambda w, v: w.mm.cache.evict(v, 1),
        "evict",
    )
    yield from each("RadixCache.holds comp", ["swa", 1, None], lambda w, v: w.mm.cache.holds(w.node, v), "holds")
    yield from each("faults.enable", ["B9", "", None, 1, "b1 "], lambda w, v: faults.enable(v), "fault")
    yield from each(
        "check_leaks", lambda w: [w.swa, w.mm.cache, None], lambda w, v: check_leaks(v), "check_leaks", "leak"
    )
    yield from each(
        "expected_owners", lambda w: [w.swa, "mm"], lambda w, v: expected_owners(v), "expected_owners", "leak"
    )
    yield from each("session_mamba_refs", [None, 1, "slot"], lambda w, v: session_mamba_refs(v), "session", "mamba")
    yield from each(
        "integrity.verify",
        lambda w: tensors()[:6],
        lambda w, v: integrity.verify("verify", w.mm.kv.data, v, T(1), T(0)),
        "verify",
    )
    # the rest of the allocators
    kv_ = lambda w: w.mm.kv  # noqa: E731
    yield from each(
        "TokenAllocator.transfer", lambda w: tensors(), lambda w, v: kv_(w).transfer(v, w.run.owner, R7), "transfer"
    )
    yield from each("TokenAllocator.verify", lambda w: tensors(), lambda w, v: kv_(w).verify(v, T(1), T(0)), "verify")
    yield from each(
        "TokenAllocator.write_fingerprint",
        lambda w: tensors(),
        lambda w, v: kv_(w).write_fingerprint(T(30), v, T(0)),
        "write_fingerprint",
    )
    yield from each("PagedAllocator.alloc", lambda w: numbers()[:8], lambda w, v: w.paged.alloc(v, R7), "alloc")
    yield from each(
        "PagedAllocator.transfer", lambda w: tensors(), lambda w, v: w.paged.transfer(v, R7, request(8)), "transfer"
    )
    yield from each(
        "PagedAllocator.verify", lambda w: tensors(), lambda w, v: w.paged.verify(v, T(1, 2), T(0, 1)), "verify"
    )
    yield from each(
        "PagedAllocator.write_fingerprint",
        lambda w: tensors(),
        lambda w, v: w.paged.write_fingerprint(T(2, 3), v, T(0, 1)),
        "write_fingerprint",
    )
    swa_ = lambda w: w.swa.kv  # noqa: E731
    yield from each("SWATokenAllocator.alloc", lambda w: numbers()[:8], lambda w, v: swa_(w).alloc(v, R7), "alloc")
    yield from each("SWATokenAllocator.free", lambda w: tensors(), lambda w, v: swa_(w).free(v, R7), "free")
    yield from each("SWATokenAllocator.free_swa", lambda w: tensors(), lambda w, v: swa_(w).free_swa(v, R7), "free")
    yield from each(
        "SWATokenAllocator.transfer", lambda w: owners(), lambda w, v: swa_(w).transfer(T(5), R7, v), "transfer"
    )
    yield from each(
        "SWATokenAllocator.verify", lambda w: tensors(), lambda w, v: swa_(w).verify(v, T(1), T(0)), "verify"
    )
    yield from each(
        "SWATokenAllocator.write_fingerprint",
        lambda w: tensors(),
        lambda w, v: swa_(w).write_fingerprint(T(5), T(1), v),
        "write_fingerprint",
    )
    yield from each(
        "integrity.fingerprint", lambda w: tensors()[:8], lambda w, v: integrity.fingerprint(v, T(0)), "fingerprint"
    )
    # the Mamba pool, the manager's allocations, the request table's rows
    mam = lambda w: w.mm.mamba  # noqa: E731
    yield from each("MambaPool.alloc", lambda w: numbers()[:8], lambda w, v: mam(w).alloc(v, R7), "alloc")
    yield from each(
        "MambaPool.alloc_request_state", lambda w: owners(), lambda w, v: mam(w).alloc_request_state(v), "alloc"
    )
    yield from each("MambaPool.verify", lambda w: numbers()[:8], lambda w, v: mam(w).verify(v, 1), "verify")
    yield from each("MemoryManager.alloc_kv", lambda w: numbers()[:8], lambda w, v: w.mm.alloc_kv(R7, v), "alloc")
    yield from each("MemoryManager.alloc_mamba", lambda w: owners(), lambda w, v: w.mm.alloc_mamba(v), "alloc_mamba")
    yield from each("MemoryManager.own", requests, lambda w, v: w.mm.own("own", v), "own")
    yield from each("ReqToTokenPool.alloc", lambda w: owners(), lambda w, v: w.mm.rows.alloc(v), "alloc")
    yield from each("ReqToTokenPool.free", lambda w: numbers()[:9], lambda w, v: w.mm.rows.free(v, w.run.owner), "free")
    yield from each(
        "ReqToTokenPool.transfer",
        lambda w: numbers()[:9],
        lambda w, v: w.mm.rows.transfer(v, w.run.owner, R7),
        "transfer",
    )
    # the rest of the radix cache and of the LRU lists
    comps: list[object] = ["full", None, 1, OwnerKind.NODE]
    yield from each(
        "RadixCache.evictable_size", comps, lambda w, v: w.mm.cache.evictable_size(v), "evictable_size", "size"
    )
    yield from each(
        "RadixCache.protected_size", comps, lambda w, v: w.mm.cache.protected_size(v), "protected_size", "size"
    )
    yield from each("RadixCache.lru", comps, lambda w, v: w.mm.cache.lru(v), "lru")
    yield from each(
        "RadixCache.handles_covering",
        lambda w: numbers()[:6],
        lambda w, v: w.mm.cache.handles_covering(v, FULL),
        "handles_covering",
    )
    yield from each(
        "RadixCache.is_live", lambda w: [None, 1, "h", (1, 2)], lambda w, v: w.mm.cache.is_live(v), "is_live"
    )
    yield from each("RadixCache.node", lambda w: numbers()[:9], lambda w, v: w.mm.cache.node(v), "node")
    yield from each(
        "RadixCache.mamba_copy_on_write",
        lambda w: [None, w.twin.cache.match_prefix(T(9, 8, 7, 6)), (1, 2)],
        lambda w, v: w.mm.cache.mamba_copy_on_write(v, R7),
        "mamba_copy_on_write",
    )
    yield from each(
        "RadixCache.verify",
        lambda w: [None, "m", (1, 2)],
        lambda w, v: w.mm.cache.verify(v, T(9, 8, 7, 6)),
        "verify",
    )
    yield from each(
        "LRUList.insert_ahead_of",
        lambda w: [w.elsewhere, None, copy.copy(w.linked)],
        lambda w, v: w.lru.insert_ahead_of(w.linked, v),
        "lru",
    )
    yield from each(
        "LRUList.insert_behind",
        lambda w: [w.elsewhere, None, copy.copy(w.linked)],
        lambda w, v: w.lru.insert_behind(w.linked, v),
        "lru",
    )
    yield from each(
        "LRUList.more_recent", lambda w: [w.elsewhere, None, 1], lambda w, v: w.lru.more_recent(v), "more_recent"
    )
    # the rest of the sessions
    yield from each(
        "Sessions.extend_resumed", requests, lambda w, v: w.mm.sessions.extend_resumed(v), "extend_resumed", "resume"
    )
    yield from each("Sessions.unresume", requests, lambda w, v: w.mm.sessions.unresume(v), "unresume", "resume")
    yield from each(
        "Sessions.free_tail", lambda w: [None, 1, w.sess], lambda w, v: w.mm.sessions.free_tail(v, 0), "free_tail"
    )
    yield from each(
        "Sessions.release_state",
        lambda w: [None, 1, w.sess],
        lambda w, v: w.mm.sessions.release_state(v),
        "release_state",
    )
    # constructors: sizes that cannot be built, sizes that do not fit together
    yield Input("TokenAllocator.__init__", "2**62 slots", lambda w: TokenAllocator(2**62), ("create",))
    yield Input("ReqToTokenPool.__init__", "2**40 x 2**40", lambda w: ReqToTokenPool(2**40, 2**40), ("create",))
    yield Input("MambaPool.__init__", "2**62 states", lambda w: MambaPool(2**62), ("create",))
    yield Input("SlotPool.__init__", "numpy capacity", lambda w: SlotPool("p", np.int64(4)), ("create",))  # type: ignore[arg-type]
    yield Input(
        "RadixCache.__init__",
        "page 2 on a paged allocator of page 4",
        lambda w: RadixCache(PagedAllocator(8, 4), page_size=2),
        ("create",),
    )
    yield Input(
        "RadixCache.__init__",
        "SWA window on a token allocator",
        lambda w: RadixCache(TokenAllocator(8), swa_window=2),
        ("create",),
    )
    yield Input(
        "MemoryManager.__init__",
        "pools shared with another manager",
        lambda w: MemoryManager(w.mm.cache, w.mm.rows),
        ("create",),
    )


INPUTS = list(corpus())


@pytest.mark.parametrize("item", INPUTS, ids=[f"{x.entry}-{x.label}" for x in INPUTS])
def test_corpus_input_is_refused_cleanly(item: Input) -> None:
    w = fresh()
    outcome, why = classify(w, item.call, item.names)
    assert outcome is Outcome.CLEAN, f"{outcome.value}: {item.entry} [{item.label}]: {why}"


def test_a_row_write_may_read_from_the_table_itself() -> None:
    """Aliasing is not garbage: a view of the table written back (here: onto itself) is copied first, not refused."""
    w = fresh()
    row = _row(w)
    before = w.mm.rows.table[row].clone()
    w.mm.rows.write(row, 0, w.mm.rows.table[row, 0:3], w.run.owner)
    assert torch.equal(w.mm.rows.table[row], before)


# ---------------------------------------------------------------- the public contracts API: adapters, recorders, replay


@dataclass
class C:
    """A reference cache adapter holding a lock, and a reference system adapter with a running request."""

    cache: ReferenceAdapter
    handle: object
    sys: ReferenceSystemAdapter
    rid: int


def build_contracts() -> C:
    a = ReferenceAdapter(CACHE_MODELS["hybrid"])
    slots = a.alloc_kv(1, 4)
    assert slots is not None
    a.insert(1, (5, 6, 7, 8), slots, None)
    _, handle = a.lock((5, 6, 7, 8))
    s = ReferenceSystemAdapter(SystemConfig())
    rid = s.add_request((1, 2, 3))
    s.admit(64)
    return C(a, handle, s, rid)


_C: list[C] = []


def fresh_contracts() -> C:
    if not _C:
        _C.append(build_contracts())
    return copy.deepcopy(_C[0])


def contracts_corpus(tmp: Path) -> Iterator[tuple[str, Callable[[C], object], tuple[str, ...]]]:
    text = io.StringIO
    yield "replay None", lambda c: replay(None), ("replay",)  # type: ignore[arg-type]
    yield "replay a path as a stream", lambda c: replay(str(tmp / "t.jsonl")), ("replay",)  # type: ignore[arg-type]
    yield "replay a binary stream", lambda c: replay(io.BytesIO(b"{}\n")), ("replay",)  # type: ignore[arg-type]
    yield "replay every 0", lambda c: replay(text(""), every=0), ("replay",)
    yield "replay every -1.5", lambda c: replay(text(""), every=-1.5), ("replay",)  # type: ignore[arg-type]
    yield "replay_path None", lambda c: replay_path(None), ("replay_path",)  # type: ignore[arg-type]
    yield "replay_path a descriptor", lambda c: replay_path(0), ("replay_path",)  # type: ignore[arg-type]
    yield "replay_path bytes", lambda c: replay_path(b"t.jsonl"), ("replay_path",)  # type: ignore[arg-type]
    for label, kw in [
        ("ops -1", {"ops": -1}),
        ("ops 2.5", {"ops": 2.5}),
        ("ops True", {"ops": True}),
        ("seed None", {"seed": None}),
        ("seed '7'", {"seed": "7"}),
        ("faults B6", {"faults": ("B6",)}),
        ("faults a string", {"faults": "B1"}),
        ("faults twice", {"faults": ("B1", "B1")}),
        ("path None", {"path": None}),
        ("path a number", {"path": 10**6}),
    ]:
        args: dict[str, Any] = {"ops": 3, "seed": 0, "path": tmp / "r.jsonl", **kw}

        def rec(c: C, args: dict[str, Any] = args) -> object:
            faults = args.get("faults", ())
            return record_workload(c.cache, args["ops"], args["seed"], args["path"], faults=faults)

        def rec_sys(c: C, args: dict[str, Any] = args) -> object:
            faults = args.get("faults", ())
            return record_system_workload(build_manager(), args["ops"], args["seed"], args["path"], faults=faults)

        yield f"record_workload {label}", rec, ("record",)
        yield f"record_system_workload {label}", rec_sys, ("record",)
    yield "record_workload adapter None", lambda c: record_workload(None, 3, 0, tmp / "n.jsonl"), ("record",)  # type: ignore[arg-type]
    yield "record_workload a system adapter", lambda c: record_workload(c.sys, 3, 0, tmp / "s.jsonl"), ("record",)  # type: ignore[arg-type]
    yield (
        "record_system_workload an adapter",
        lambda c: record_system_workload(c.cache, 3, 0, tmp / "a.jsonl"),
        ("record",),
    )  # type: ignore[arg-type]
    yield (
        "record_adapter_workload a cache adapter",
        lambda c: record_adapter_workload(c.cache, 3, 0, tmp / "b.jsonl"),
        ("record",),
    )  # type: ignore[arg-type]
    yield (
        "record_adapter_workload ops -2",
        lambda c: record_adapter_workload(c.sys, -2, 0, tmp / "c.jsonl"),
        ("record",),
    )
    yield "ReferenceAdapter config None", lambda c: ReferenceAdapter(None), ("create",)  # type: ignore[arg-type]
    yield "ReferenceAdapter config name", lambda c: ReferenceAdapter("hybrid"), ("create",)  # type: ignore[arg-type]
    yield "ReferenceAdapter.match_prefix floats", lambda c: c.cache.match_prefix((5.0, 6.5)), ("match_prefix",)  # type: ignore[arg-type]
    yield "ReferenceAdapter.match_prefix negative", lambda c: c.cache.match_prefix((5, -6)), ("match_prefix",)
    yield "ReferenceAdapter.match_prefix bools", lambda c: c.cache.match_prefix((True, 6)), ("match_prefix",)  # type: ignore[arg-type]
    yield "ReferenceAdapter.insert float slots", lambda c: c.cache.insert(1, (9,), (10.0,), None), ("insert",)  # type: ignore[arg-type]
    yield "ReferenceAdapter.free_kv float slots", lambda c: c.cache.free_kv(1, (1.5,)), ("free",)  # type: ignore[arg-type]
    yield "ReferenceAdapter.free_kv a repeat", lambda c: c.cache.free_kv(1, (30, 30)), ("free",)
    yield "ReferenceAdapter.alloc_kv -1", lambda c: c.cache.alloc_kv(1, -1), ("alloc",)
    yield "ReferenceAdapter.alloc_kv 1.0", lambda c: c.cache.alloc_kv(1, 1.0), ("alloc",)  # type: ignore[arg-type]
    yield "ReferenceAdapter.alloc_kv req None", lambda c: c.cache.alloc_kv(None, 1), ("alloc",)  # type: ignore[arg-type]
    yield "ReferenceAdapter.unlock None", lambda c: c.cache.unlock(None), ("dec_lock_ref",)  # type: ignore[arg-type]
    yield "ReferenceAdapter.unlock a handle id", lambda c: c.cache.unlock(1), ("dec_lock_ref",)
    yield "ReferenceAdapter.handle_id a tuple", lambda c: c.cache.handle_id((1,)), ("handle_id",)
    yield "ReferenceAdapter.mamba_cow a string", lambda c: c.cache.mamba_cow("h", 1), ("mamba_cow",)
    yield "ReferenceAdapter.evict 'full'", lambda c: c.cache.evict("full", 1), ("evict",)  # type: ignore[arg-type]
    yield "ReferenceAdapter.evict n -3", lambda c: c.cache.evict(FULL, -3), ("evict",)
    yield "ReferenceAdapter.write_kv floats", lambda c: c.cache.write_kv((30,), (1.5,), 0), ("write_fingerprint",)  # type: ignore[arg-type]
    yield "ReferenceAdapter.write_mamba None", lambda c: c.cache.write_mamba(None, 1), ("write_fingerprint",)  # type: ignore[arg-type]
    yield "ReferenceSystemAdapter config None", lambda c: ReferenceSystemAdapter(None), ("create",)  # type: ignore[arg-type]
    yield "ReferenceSystemAdapter page 0", lambda c: ReferenceSystemAdapter(SystemConfig(page_size=0)), ("create",)
    yield (
        "ReferenceSystemAdapter kv not pages",
        lambda c: ReferenceSystemAdapter(SystemConfig(page_size=4, kv_tokens=10)),
        ("create",),
    )
    yield "ReferenceSystemAdapter rows 1.5", lambda c: ReferenceSystemAdapter(SystemConfig(rows=1.5)), ("create",)  # type: ignore[arg-type]
    yield "ReferenceSystemAdapter mamba 'yes'", lambda c: ReferenceSystemAdapter(SystemConfig(mamba="yes")), ("create",)  # type: ignore[arg-type]
    yield "SystemAdapter.extend n 0", lambda c: c.sys.extend(c.rid, 0), ("extend",)
    yield "SystemAdapter.extend n -2", lambda c: c.sys.extend(c.rid, -2), ("extend",)
    yield "SystemAdapter.extend n 1.0", lambda c: c.sys.extend(c.rid, 1.0), ("extend",)  # type: ignore[arg-type]
    yield "SystemAdapter.extend rid None", lambda c: c.sys.extend(None, 1), ("request", "extend")  # type: ignore[arg-type]
    yield "SystemAdapter.extend ahead 1.5", lambda c: c.sys.extend(c.rid, 1, 1.5), ("extend",)  # type: ignore[arg-type]
    yield "SystemAdapter.evict 'full'", lambda c: c.sys.evict("full", 1), ("evict",)  # type: ignore[arg-type]
    yield "SystemAdapter.evict None", lambda c: c.sys.evict(None, 1), ("evict",)  # type: ignore[arg-type]
    yield "SystemAdapter.admit budget None", lambda c: c.sys.admit(None), ("admit",)  # type: ignore[arg-type]
    yield "SystemAdapter.admit rid of nothing", lambda c: c.sys.admit(64, 999), ("request", "admit")
    yield "SystemAdapter.add_request floats", lambda c: c.sys.add_request((1.0, 2.5)), ("add_request",)  # type: ignore[arg-type]
    yield "SystemAdapter.add_request a bool", lambda c: c.sys.add_request((True,)), ("add_request",)  # type: ignore[arg-type]
    yield "SystemAdapter.add_request session 'x'", lambda c: c.sys.add_request((1,), "x"), ("add_request",)  # type: ignore[arg-type]
    yield "SystemAdapter.finish twice", lambda c: c.sys.finish(c.rid) and c.sys.finish(c.rid), ("finish",)
    yield "SystemAdapter.abort unknown", lambda c: c.sys.abort(12345), ("request", "abort")
    yield "SystemAdapter.open_session -1", lambda c: c.sys.open_session(-1), ("open_session",)
    yield "SystemAdapter.close_session never opened", lambda c: c.sys.close_session(8), ("close_session",)


CONTRACT_INPUTS = list(contracts_corpus(Path("/nonexistent")))


@pytest.mark.parametrize("i", range(len(CONTRACT_INPUTS)), ids=[x[0] for x in CONTRACT_INPUTS])
def test_contracts_api_input_is_refused_cleanly(i: int, tmp_path: Path) -> None:
    label, call, names = list(contracts_corpus(tmp_path))[i]
    c = fresh_contracts()
    if label.startswith("SystemAdapter.finish twice"):
        c.sys.finish(c.rid)  # NOTE: the first finish is legal: the corpus input is the second
        call = lambda c: c.sys.finish(c.rid)  # noqa: E731
    outcome, why = classify(c, call, names)
    assert outcome is Outcome.CLEAN, f"{outcome.value}: {label}: {why}"
    assert not any(tmp_path.iterdir()), f"{label}: a refused call wrote {list(tmp_path.iterdir())}"


# ---------------------------------------------------------------- each check can fail


@pytest.mark.parametrize(
    "change",
    [
        lambda w: w.pool.owner_tag.__setitem__(1, 0),  # one tag of a pool (slot 1 is held)
        lambda w: w.mm.kv.data.__setitem__(5, 1),  # one KV fingerprint
        lambda w: setattr(w.run, "kv_len", w.run.kv_len - 1),  # one field of a request
        lambda w: w.linked.prev.__setitem__(0, None),  # one LRU pointer
        lambda w: w.mm.rows.table.__setitem__((0, 0), 7),  # one cell of the request table
        lambda w: setattr(w.mm, "fail_next", 1),  # the manager's own counter
        lambda w: w.mm.sessions.slots[1].__setattr__("committed_len", 9),  # a session
        lambda w: setattr(w.node, "mamba_slot", None),  # a tree node
    ],
    ids=["pool tag", "kv data", "request", "lru pointer", "row cell", "fail_next", "session", "node"],
)
def test_the_fingerprint_sees_each_kind_of_state(change: Callable[[W], object]) -> None:
    w = fresh()
    before = deep_state(w)
    change(w)
    assert deep_state(w) != before


def test_the_classifier_names_each_defect_class() -> None:
    """A call that raises untyped is a traceback, one that returns is silent, a typed one that changed state is a
    state change, a typed one naming another call is not clean: each outcome the corpus counts can be produced."""
    from kvledger.spec.errors import InvalidArgument

    def mutate_then_refuse(w: W) -> None:
        w.pool.owner_tag[1] = 0
        raise InvalidArgument("alloc", "p", (), "refused after the fact")

    def untyped(w: W) -> None:
        raise ValueError("alloc: untyped")

    def wrong_name(w: W) -> None:
        raise InvalidArgument("free", "p", (), "names another call")

    assert classify(fresh(), untyped, ("alloc",))[0] is Outcome.TRACEBACK
    assert classify(fresh(), lambda w: 1, ("alloc",))[0] is Outcome.SILENT
    assert classify(fresh(), mutate_then_refuse, ("alloc",))[0] is Outcome.STATE
    assert classify(fresh(), wrong_name, ("alloc",))[0] is Outcome.TRACEBACK
    assert classify(fresh(), lambda w: w.pool.alloc(-1, R7), ("alloc",))[0] is Outcome.CLEAN


# ---------------------------------------------------------------- every public entry point is attacked or exempt

INTERNAL = {
    "SlotPool.release": "no checks by design: takes ids a validated free/transfer produced",
    "SlotPool.retag": "no checks by design (the tree's own moves of validated slots)",
    "SlotPool.retag_code": "no checks by design",
    "SlotPool.check_held": "takes ids as_index validated",
    "SlotPool.has_duplicates": "takes in-range ids",
    "SlotPool.claim": "a conservative pre-check: False for anything it does not show",
    "SlotPool.as_index": "the index validation itself (attacked through every free/transfer)",
    "SlotPool.check_alloc": "the size validation itself (attacked through every alloc)",
    "SlotPool.code_of": "encode, memoised (attacked through every owner)",
    "SlotPool.held_by": "encode then a scan (attacked through every owner)",
    "SlotPool.free_all_of": "encode then a scan (attacked through every owner)",
    "SlotPool.alloc_ids": "alloc's CPU path (attacked through alloc)",
    "SlotPool.transfer": "the pool's transfer (attacked through MambaPool/TokenAllocator transfer)",
    "PagedAllocator.whole_pages": "a query: None for anything not shown to be whole pages",
    "PagedAllocator.pages_of": "the paged index validation itself (attacked through free)",
    "PagedAllocator.fresh_pages": "a query on bytes: None for anything unknown",
    "PagedAllocator.tokens_of": "pages to tokens of validated pages",
    "KVView": "the cache's view of its allocator: takes what insert/evict validated",
    "LockTable": "the cache's handle table: takes what inc/dec_lock_ref validated",
    "RecentAllocs": "a memo of alloc results keyed by bytes",
    "RadixTree": "the cache's base (attacked through RadixCache)",
    "MemoryManager.event": "the provenance log (an op name and a label)",
    "RadixCache.revisit": "builds the error a bounded walk raises",
    "Sessions.spec_slot": "the abstraction of one of its own slots",
    "arguments": "the validation helpers themselves (attacked through every entry point)",
    "tree": "key helpers of the cache (attacked through match_prefix/insert)",
    "session.common_prefix": "two token tuples a validated request holds",
    "allocators.not_int64_1d": "a predicate: a reason or None",
    "allocators.swa_owner": "maps an owner; encode validates it where it is used",
    "slots.host_bytes": "bytes of a validated tensor",
    "slots.run_start": "a query on bytes: -1 for anything it does not show to be a run of the pool's slots",
    "faults": "the fault switches (enable attacked; the rest take no user value)",
    "ByComponent": "a Mapping view of a node's pointers (KeyError for a key that is no component: the protocol)",
    "integrity.fingerprint_unchecked": "the mix of tensors the allocators' writes checked (fingerprint checks)",
    "req_to_token.has_duplicates": "a predicate on a validated id tensor",
}
"""Public callables of ``kvledger.impl`` no corpus input attacks, each with the reason."""


def _public_callables() -> list[str]:
    import importlib
    import inspect
    import pkgutil

    import kvledger.impl as impl

    out = []
    for m in pkgutil.iter_modules(impl.__path__):
        mod = importlib.import_module(f"kvledger.impl.{m.name}")
        for name, obj in vars(mod).items():
            if name.startswith("_") or getattr(obj, "__module__", None) != mod.__name__:
                continue
            if inspect.isclass(obj):
                for attr, fn in inspect.getmembers(obj, inspect.isfunction):
                    params = list(inspect.signature(fn).parameters)
                    if not attr.startswith("_") and len(params) > 1:
                        out.append(f"{m.name}:{name}.{attr}")
            elif inspect.isfunction(obj) and inspect.signature(obj).parameters:
                out.append(f"{m.name}:{name}")
    return out


def test_every_public_entry_point_is_attacked_or_exempt() -> None:
    attacked = {x.entry.split(" ")[0] for x in INPUTS}
    attacked |= {label.split(" ")[0] for label, _, _ in CONTRACT_INPUTS}
    missing = []
    for qual in _public_callables():
        module, name = qual.split(":")
        cls = name.split(".")[0]
        short = name.split(".")[-1]
        keys = {name, cls, module, f"{module}.{short}"}
        if not keys & (attacked | set(INTERNAL)):
            missing.append(qual)
    assert not missing, f"public entry points no corpus input attacks: {missing}"
