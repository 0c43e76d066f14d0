"""Hypothesis state machines that drive each pool and the spec ledger in lockstep.

One rule per spec transition (``allocate``, ``free``, ``transfer``) plus the
misuses every engine eventually commits (double free, foreign free, out of
range, bad tensors). After every step the abstraction of the implementation
must equal the spec model, every ledger law must hold, and every held slot
must still hold the data written into it.

``PoolKind`` says how one pool maps onto ledgers; ``machine_for(kind)``
builds the ``RuleBasedStateMachine``. A test or ``kvledger check`` runs it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from copy import deepcopy
from dataclasses import dataclass
from functools import partial
from typing import cast

import torch
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

from kvledger.contracts.abstraction import (
    AnyPool,
    abstract,
    broken_structure_laws,
    inv_free_stack_matches_tags,
    pools_of,
)
from kvledger.contracts.machines.calls import (
    SCENARIOS,
    VALUE_END,
    Draw,
    Scenario,
    audit,
    cache_scenario,
    cross,
    fits_dtype,
    holder_named,
    manager_scenario,
    names_one_operation,
    probe,
    sweep,
)
from kvledger.contracts.machines.probes import (
    CONSTRUCTORS,
    SCALAR_EDGES,
    Call,
    constructor_calls,
    id_edges,
    id_or_junk,
    owner_or_junk,
    raised,
    run_call,
)
from kvledger.contracts.machines.stable import sampled_from
from kvledger.impl.allocators import PagedAllocator, SWATokenAllocator, TokenAllocator, swa_owner
from kvledger.impl.mamba import MambaPool
from kvledger.impl.req_to_token import ReqToTokenPool
from kvledger.impl.slots import RUN_MIN
from kvledger.spec import domains as D
from kvledger.spec import ledger as spec
from kvledger.spec import prefix as P
from kvledger.spec.errors import (
    DoubleFree,
    InvalidArgument,
    KVLedgerError,
    LedgerError,
    NotOwner,
    PageAlignmentError,
    inv_names_culprit,
)
from kvledger.spec.ledger import Ledger
from kvledger.spec.types import Owner, node, request, session

OWNERS = (request(1), request(2), node(7), session(3))


def other_owner(owner: Owner) -> Owner:
    """An owner of ``OWNERS`` that is not ``owner``: a thief, or the other side of a hand-over."""
    return OWNERS[1] if owner != OWNERS[1] else OWNERS[0]


LONG_ALLOC = 10_000
"""Units in a long allocation: past the cut-offs where an implementation trades its per-slot path for a bulk one (a
memo of short results, a table of tag runs: kvledger's own pools change path at 8,192 slots). The machines' pools
hold a dozen slots, so a path taken only past such a cut-off would otherwise never run (as ``calls.LONG_KEY`` for
keys)."""


@dataclass(frozen=True)
class Chunk:
    """What one ``alloc`` gave one owner (user-level indices: tokens, rows or state slots)."""

    owner: Owner
    idx: torch.Tensor
    stamp: int

    def __repr__(self) -> str:
        return f"Chunk({self.owner}, {self.idx.tolist()})"


@dataclass(frozen=True)
class PoolKind:
    """How a pool object maps user-level indices onto spec ledgers."""

    name: str
    make: Callable[[str], AnyPool]
    unit: int = 1  # user indices per ledger slot (page_size for a paged pool)
    big: Callable[[str], AnyPool] | None = None
    """A pool of this kind with room for ``LONG_ALLOC`` units (``long_alloc``); ``None``: it allocates one at a time."""

    def effects(self, pool: AnyPool, idx: torch.Tensor, owner: Owner) -> dict[str, tuple[Owner, frozenset[int]]]:
        """Which ledger slots ``idx`` stands for, and under which owner, per ledger."""
        if isinstance(pool, PagedAllocator):
            return {"kv": (owner, frozenset((idx // pool.page_size).tolist()))}
        if isinstance(pool, SWATokenAllocator):
            out = {"kv": (owner, frozenset(idx.tolist()))}
            live = pool.translate(idx)
            live = live[live != 0]
            if live.numel():
                out["swa"] = (swa_owner(owner), frozenset(live.tolist()))
            return out
        name = next(iter(pools_of(pool)))
        return {name: (owner, frozenset(idx.tolist()))}


def _alloc(pool: AnyPool, n: int, owner: Owner) -> torch.Tensor:
    if isinstance(pool, ReqToTokenPool):
        return torch.tensor([pool.alloc(owner)], dtype=torch.int64, device=pool.device)
    return pool.alloc(n, owner)


def _free(pool: AnyPool, idx: torch.Tensor, owner: Owner) -> None:
    if isinstance(pool, ReqToTokenPool):
        pool.pool.free(idx, owner)  # rows are freed one at a time by the public API; the pool takes a tensor
    else:
        pool.free(idx, owner)


def _transfer(pool: AnyPool, idx: torch.Tensor, src: Owner, dst: Owner) -> None:
    if isinstance(pool, ReqToTokenPool):
        pool.pool.transfer(idx, src, dst)
    else:
        pool.transfer(idx, src, dst)


ID_FORMS = ("as handed out", "clone", "int32", "strided", "reversed")
"""Each form of slot ids an engine passes back to a pool: the alloc's very result, a copy of it (no memo knows
it), int32 ids, a strided view, the same ids in another order (an engine frees a request's slots back to front, or
as its tree gathers them; a paged pool's pages then come with their tokens in another order, which ``pages_of``
takes on its general path). A pool's fast path for one form must not change what a call does in another."""


def _in_form(idx: torch.Tensor, form: str) -> torch.Tensor:
    """``idx`` (an alloc's result) in ``form`` (``ID_FORMS``)."""
    if form == "clone":
        return idx.clone()
    if form == "int32":
        return idx.to(torch.int32)
    if form == "strided":
        return torch.stack([idx, idx], 1)[:, 0]
    if form == "reversed":
        return idx.flip(0)
    return idx


def _contents(pool: AnyPool) -> tuple[torch.Tensor, ...]:
    """Every tensor of ``pool`` a call can write (slot data, SWA copies, Mamba states, the request table): copies."""
    if isinstance(pool, ReqToTokenPool):
        return (pool.table.clone(),)
    if isinstance(pool, SWATokenAllocator):
        return (pool.full.data.clone(), pool.swa.data.clone())
    if isinstance(pool, MambaPool):
        return (pool.data.clone(), pool.conv.clone(), pool.temporal.clone())
    return (pool.data.clone(),)


def _same(a: tuple[torch.Tensor, ...], b: tuple[torch.Tensor, ...]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def _pages(pool: AnyPool, idx: torch.Tensor) -> torch.Tensor:
    """The ledger's slots of ids ``idx``: a paged pool's pages, any other pool's ids as they are."""
    return torch.div(idx, pool.page_size, rounding_mode="floor") if isinstance(pool, PagedAllocator) else idx


def _torn_culprits(tokens: list[int], page_size: int) -> dict[type[KVLedgerError], set[int]]:
    """What a paged refusal of token ids ``tokens`` must name, per kind of refusal: a ``PageAlignmentError``, the
    pages whose tokens are not named each exactly once; an ``InvalidArgument``, the pages of the tokens named twice.

    >>> _torn_culprits([4, 5, 6], 2) == {PageAlignmentError: {3}, InvalidArgument: set()}
    True
    >>> _torn_culprits([4, 5, 6, 4], 2) == {PageAlignmentError: {2, 3}, InvalidArgument: {2}}
    True
    """
    named = Counter(tokens)
    pages = {t // page_size for t in named}
    whole = {p for p in pages if all(named[t] == 1 for t in range(p * page_size, (p + 1) * page_size))}
    return {PageAlignmentError: pages - whole, InvalidArgument: {t // page_size for t, k in named.items() if k > 1}}


def _data(pool: AnyPool) -> torch.Tensor | None:
    if isinstance(pool, ReqToTokenPool):
        return None
    if isinstance(pool, SWATokenAllocator):
        return pool.full.data
    return pool.data


TENSOR_EDGES = ("float", "2d", "sparse", "meta", "below", "above", "empty", "list", "ndarray", "none")
"""Every kind of bad tensor ``bad_tensor`` gives a tensor parameter: a float or 2-D copy of valid ids, the same ids
in a sparse or a meta tensor (the right dtype and no readable values), and, for a parameter naming this pool's ids,
the same ids moved just below the pool (negative) or far past its end (whole pages stay whole pages), and none at
all (an empty 1-D tensor: a call that acts on this pool's slots names at least one; a query of none may answer
none, so queries are not given it); and no tensor at all: the same ids as a list or a numpy array (an engine's
host ids: a call takes a tensor, and a fast path for host ids must not let them in), or ``None``."""

ROW_SOURCES = ("ids", "own row", "other row")
"""Where ``write_row`` takes the ids it writes: new ids, a window of the row itself, another row."""

DATA_PARAMS = frozenset({"tokens", "positions"})
"""Tensor parameters that carry values, not this pool's ids (token ids and positions for a fingerprint)."""

OTHER_POOLS_IDS = frozenset({("write", "slots")})
"""(method, parameter) pairs whose tensor names another pool's ids (a request-table row write names KV slots,
which the table cannot check against that pool): given malformed tensors, and values just outside the range the
table holds (``[0, 2**31)``, int32 as engines' tables are: -1 and ``VALUE_END``), not ids outside this pool."""


def bad_tensor_of(good: torch.Tensor, edge: str, top: int) -> torch.Tensor:
    """The bad tensor of kind ``edge`` (``TENSOR_EDGES``) made from valid ids ``good``; ``top`` lies past the pool.
    (``list``, ``ndarray`` and ``none`` are no tensor: typed as one, as the call under test is.)"""
    if edge in ("list", "ndarray", "none"):
        host = None if edge == "none" else good.tolist() if edge == "list" else good.numpy().copy()
        return cast(torch.Tensor, host)
    if edge == "float":
        return good.to(torch.float32)
    if edge == "2d":
        return good.reshape(1, -1)
    if edge == "sparse":
        return good.to_sparse()
    if edge == "meta":
        return good.to("meta")
    if edge == "empty":
        return good[:0]
    low = int(good.min())
    return good - low - good.numel() if edge == "below" else good - low + top


def bad_values_of(good: torch.Tensor, edge: str) -> torch.Tensor:
    """A tensor of values (``DATA_PARAMS``) as long as ``good``, one of them just outside their range: -1 for
    ``below``, the first past it (``VALUE_END``) for ``above``; the others 0."""
    bad = torch.zeros_like(good)
    bad[-1] = -1 if edge == "below" else VALUE_END
    return bad


def _none_or_raise(answer: object) -> None:
    if answer is not None:
        raise AssertionError(f"answered {answer!r:.60}")


def answers_none(query: bool, made: Callable[[], object]) -> bool:
    """Whether ``made`` is a query typed ``... | None`` (``query``) that answered ``None``: its way of saying "not
    known here, ask the general path", allowed where a refusal is expected."""
    return query and raised(lambda: _none_or_raise(made())) is None


OTHER_INT_DTYPES = tuple(
    dt for dt in (getattr(torch, name, None) for name in D.IDS_DTYPES if name != "int64") if isinstance(dt, torch.dtype)
)
"""The integer dtypes of ``spec.domains.IDS_DTYPES`` but int64 (those this torch has): ``inv_dtype_blind``'s sweep."""


def _done(pool: AnyPool, call: Callable[[], object]) -> tuple[object, ...]:
    """What ``call`` (of ``pool``) did, as one record: the error's class (``"accepted"`` if none), the answer's
    values (shown), the pool's ledgers and every tensor it writes (shown), after."""
    box: list[object] = []
    err = raised(lambda: box.append(call()))
    answer = box[0] if box else None
    shown = answer.tolist() if isinstance(answer, torch.Tensor) and not answer.is_meta else answer
    return (
        "accepted" if err is None else type(err),
        repr(shown),
        abstract(pool),
        tuple(repr(x.tolist()) for x in _contents(pool)),
    )


def _shown_tensor(x: torch.Tensor) -> str:
    if not isinstance(x, torch.Tensor):
        return f"{type(x).__name__} {x!r:.60}"
    if x.is_sparse or x.is_meta:
        return f"({x.layout}, {x.device})"
    return f"{x.tolist()!r:.60}"


TensorCall = tuple[str, str, bool, bool, bool, Callable[[torch.Tensor], object]]


TENSOR_HINTS: tuple[object, ...] = ("torch.Tensor", torch.Tensor)
INT_HINTS: tuple[object, ...] = ("int", int)
BYTES_HINTS: tuple[object, ...] = ("bytes", "bytes | bytearray", bytes)
BYTES_EDGES: tuple[object, ...] = (
    "\x01",
    [1],
    (1,),
    1,
    None,
    memoryview(b"\x01" * 8),
    torch.ones(1, dtype=torch.int64),
)
"""Values no ``bytes`` parameter takes (a string, a list or tuple of ints, an int, ``None``, a memoryview, a
tensor): each converts to bytes somewhere, or passes a ``len`` and a slice, so a method without its type check
meets them quietly."""


def _caller(
    fn: Callable[..., object], params: list[str], target: str, valid: Callable[[str], object]
) -> Callable[[object], object]:
    """The call of ``fn`` with a value at parameter ``target`` and ``valid(p)`` at every other parameter ``p``."""

    def call(bad: object) -> object:
        return fn(*(bad if p == target else valid(p) for p in params))

    return call


def _typed_params(
    pool: AnyPool, wanted: tuple[object, ...]
) -> Iterator[tuple[str, Callable[..., object], list[str], dict[str, object], str, str]]:
    """Each public method of ``pool`` (found by signature: a method added later is met too) and each of its
    parameters annotated as one of ``wanted``: (method name, the bound method, its parameters, their annotations,
    the parameter, the answer's annotation without spaces)."""
    for name, params, hints, param, answer in _signatures(type(pool), wanted):
        yield name, getattr(pool, name), params, hints, param, answer


Signature = tuple[str, list[str], dict[str, object], str, str]
"""A public method's name, parameters (no ``self``), their annotations, one parameter of a wanted type, the answer."""
_SIGNATURES: dict[tuple[type, tuple[object, ...]], list[Signature]] = {}


def _signatures(cls: type, wanted: tuple[object, ...]) -> list[Signature]:
    """``_typed_params`` of class ``cls`` without the bound methods, read once per class (``inspect`` is slow)."""
    import inspect

    key = (cls, wanted)
    if key not in _SIGNATURES:
        out: list[Signature] = []
        for name, fn in inspect.getmembers(cls, inspect.isfunction):
            if name.startswith("_"):
                continue
            hints = {k: v for k, v in fn.__annotations__.items() if k != "return"}
            params = list(inspect.signature(fn).parameters)
            if not isinstance(inspect.getattr_static(cls, name), staticmethod):
                params = params[1:]  # NOTE: without ``self``: the bound method's
            answer = str(fn.__annotations__.get("return", "None")).replace(" ", "")
            out.extend((name, params, hints, param, answer) for param in params if hints.get(param) in wanted)
        _SIGNATURES[key] = out
    return _SIGNATURES[key]


def tensor_calls(pool: AnyPool, chunk: Chunk) -> list[TensorCall]:
    """Each public method of ``pool`` with a parameter annotated ``torch.Tensor``, per such parameter: (method,
    parameter, whether it names this pool's ids, whether the method is a query that may answer ``None`` (its answer
    typed ``... | None``), whether it answers nothing (typed ``None``: it acts, or checks), the call of a tensor
    there with every other argument valid: ``chunk``'s ids and owner, another owner as ``dst``, zeros for values,
    ``chunk``'s first id as a row)."""

    out: list[TensorCall] = []
    other = other_owner(chunk.owner)
    for name, fn, params, hints, param, answer in _typed_params(pool, TENSOR_HINTS):

        def valid(p: str, hints: dict[str, object] = hints) -> object:
            if hints.get(p) in TENSOR_HINTS:
                return torch.zeros_like(chunk.idx) if p in DATA_PARAMS else chunk.idx
            fixed: dict[str, object] = {"owner": chunk.owner, "src": chunk.owner, "dst": other, "op": "bad_tensor"}
            return int(chunk.idx[0]) if p == "row" else fixed.get(p, 0)

        ids = param not in DATA_PARAMS and (name, param) not in OTHER_POOLS_IDS
        query = answer.endswith("|None")
        call = _caller(fn, params, param, valid)
        out.append((f"{type(pool).__name__}.{name}", param, ids, query, answer == "None", call))
    return out


IntCall = tuple[str, str, bool, Callable[[object], object]]
INT_VALID = {"value": 1, "start": 0, "end": 1, "n": 1, "num_tokens": 1}
"""A valid value for an int parameter that names no id (every other int parameter names one: ``chunk``'s first)."""


def int_calls(pool: AnyPool, chunk: Chunk) -> list[IntCall]:
    """Each public method of ``pool`` with a parameter annotated ``int``, per such parameter: (method, parameter,
    whether the method is a query that may answer ``None``, the call of a value there with every other argument
    valid: ``chunk``'s first id for an id, ``INT_VALID`` for a value or a count, ``chunk``'s owner, another owner
    as ``dst``, the id 1 for a tensor). Found by signature, as ``tensor_calls``: a method added later is met too."""
    return _typed_calls(pool, chunk, INT_HINTS)


def bytes_calls(pool: AnyPool, chunk: Chunk) -> list[tuple[str, str, Callable[[object], object]]]:
    """Each public method of ``pool`` with a parameter annotated ``bytes`` (raw int64 ids), per such parameter:
    (method, parameter, the call of a value there with every other argument valid as ``int_calls`` makes them:
    ``chunk``'s ids' bytes for raw ids)."""
    return [(what, param, call) for what, param, _, call in _typed_calls(pool, chunk, BYTES_HINTS)]


def _typed_calls(pool: AnyPool, chunk: Chunk, types: tuple[object, ...]) -> list[IntCall]:
    """``int_calls`` for the parameters annotated one of ``types`` (``INT_HINTS``, ``BYTES_HINTS``)."""
    out: list[IntCall] = []
    other = other_owner(chunk.owner)
    first = int(chunk.idx[0])
    for name, fn, params, hints, param, answer in _typed_params(pool, types):

        def valid(p: str, hints: dict[str, object] = hints) -> object:
            hint = str(hints.get(p, ""))
            if hints.get(p) in BYTES_HINTS:
                return chunk.idx.numpy().tobytes()
            if hints.get(p) in INT_HINTS:
                return INT_VALID.get(p, first)
            if "Tensor" in hint:
                return torch.tensor([1], dtype=torch.int64)
            return other if p == "dst" else chunk.owner if "Owner" in hint else False

        call = _caller(fn, params, param, valid)
        out.append((f"{type(pool).__name__}.{name}", param, answer.endswith("|None"), call))
    return out


KINDS: dict[str, PoolKind] = {
    "token": PoolKind(
        "token", lambda dev: TokenAllocator(12, device=dev), big=lambda dev: TokenAllocator(LONG_ALLOC + 4, device=dev)
    ),
    "paged": PoolKind(
        "paged",
        lambda dev: PagedAllocator(6, 2, device=dev),
        unit=2,
        big=lambda dev: PagedAllocator(LONG_ALLOC + 4, 2, device=dev),
    ),
    "swa": PoolKind(
        "swa",
        lambda dev: SWATokenAllocator(12, 8, device=dev),
        big=lambda dev: SWATokenAllocator(LONG_ALLOC + 4, LONG_ALLOC + 4, device=dev),
    ),
    # NOTE: rows as wide as a scheduler's (hundreds of columns): a whole-row write then meets any path an
    # implementation takes only for long writes (a sort where a short one uses a set)
    "req_to_token": PoolKind("req_to_token", lambda dev: ReqToTokenPool(4, 512, device=dev)),
    "mamba": PoolKind(
        "mamba",
        lambda dev: MambaPool(6, ping_pong_size=1, device=dev),
        big=lambda dev: MambaPool(LONG_ALLOC + 4, conv_shape=(1,), temporal_shape=(1,), device=dev),
    ),
}


def machine_for(kind: PoolKind, device: str = "cpu") -> type[RuleBasedStateMachine]:
    """A state machine class checking ``kind``'s pool against the spec ledger."""

    class PoolConformance(RuleBasedStateMachine):
        chunks = Bundle("chunks")

        def __init__(self) -> None:
            super().__init__()
            self.pool = kind.make(device)
            self.model: dict[str, Ledger] = abstract(self.pool)
            self.stamp = 0
            self.expect: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # stamp -> (slots, fingerprints)
            self.written: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # stamp -> (tokens, positions) of KV
            self.released: list[Chunk] = []
            self.live: dict[int, Chunk] = {}  # stamp -> the chunk as held now (owner after transfers)
            self.pressure = 0.0  # the most of any pool held at once (0..1)
            self.scenarios: dict[str, Scenario] = {}  # the live objects the public-call probes call, by maker
            self.twin: AnyPool | None = None  # the pool's kind on the meta device (``_elsewhere``), made once
            self.dtype_turn = 0  # how many calls ``_in_every_int_dtype`` has made: which dtype is next
            self.construct_turn = 0  # how many sweeps ``construct_sweep`` has made: which argument is next

        @initialize(run_min=sampled_from((RUN_MIN, 1, 2, 3)))
        def runs(self, run_min: int) -> None:
            """How long an allocation must be for the pool to look at it as a run of slots (tagged and freed
            through slices): the default, or short enough that this machine's small pools take that path too."""
            for pool in pools_of(self.pool).values():
                pool.run_min = run_min

        @initialize(
            target=chunks,
            owners=st.lists(sampled_from(OWNERS), min_size=1, max_size=2, unique=True),
            n=st.integers(1, 3),
        )
        def held_at_start(self, owners: list[Owner], n: int) -> object:
            """Each example starts with memory held, a chunk of ``n`` for each of one or two owners (``allocate``
            as the rule makes it): the rules that take a held chunk (frees, hand-overs, every misuse of a held slot)
            can run from the first step, where Hypothesis' swarm may leave ``allocate`` off for a whole example."""
            made = [self.allocate(owner, n) for owner in owners]
            return multiple(*(c for c in made if isinstance(c, Chunk)))

        def teardown(self) -> None:
            """Guide the search (``hypothesis.target``) towards a full pool (exhaustion and refusal paths)."""
            if currently_in_test_context():
                target(self.pressure, label="pool pressure")
            super().teardown()

        # ---------------------------------------------------------- helpers

        def _apply(self, op: str, effects: dict[str, tuple[Owner, frozenset[int]]], dst: Owner | None = None) -> None:
            new = dict(self.model)
            for name, (owner, slots) in effects.items():
                try:
                    if op == "allocate":
                        new[name] = spec.allocate(new[name], owner, slots)
                    elif op == "free":
                        new[name] = spec.free(new[name], owner, slots)
                    else:
                        assert dst is not None
                        d = swa_owner(dst) if name == "swa" else dst
                        new[name] = spec.transfer(new[name], owner, d, slots)
                except LedgerError as err:
                    raise AssertionError(f"refinement: the implementation did what spec.{op} forbids: {err}") from err
            self.model = new

        def _expect_rejected(
            self,
            call: Callable[[], object],
            expected: type[KVLedgerError] | tuple[type[KVLedgerError], ...],
            culprits: set[int] | Mapping[type[KVLedgerError], set[int]] | None = None,
            pool: AnyPool | None = None,
        ) -> None:
            """``call`` refused with ``expected`` (one of them), naming a slot (``culprits``: exactly those, or per
            kind of refusal where the call breaks two rules and either may be named first), nothing changed (in
            ``pool``: this machine's pool unless given)."""
            pool = self.pool if pool is None else pool
            before = abstract(pool)
            contents = _contents(pool)
            want = " or ".join(e.__name__ for e in (expected if isinstance(expected, tuple) else (expected,)))
            try:
                call()
            except KVLedgerError as err:
                assert isinstance(err, expected), f"expected {want}, got {type(err).__name__}: {err}"
                assert inv_names_culprit(err), f"inv_names_culprit: {type(err).__name__} names no slot: {err}"
                named = set(getattr(err, "slots", ()))
                if isinstance(culprits, Mapping):
                    culprits = next((v for k, v in culprits.items() if isinstance(err, k)), None)
                assert culprits is None or named == culprits, (
                    f"inv_names_culprit: {type(err).__name__} names slots {sorted(named)}, the culprits are "
                    f"{sorted(culprits or ())}: {err}"
                )
                holder_named(err, before)
            else:
                raise AssertionError(f"invalid call accepted (expected {want})")
            assert abstract(pool) == before, "rejected call leaves state unchanged: the pool changed"
            assert _same(_contents(pool), contents), "rejected call leaves state unchanged: slot data changed"

        # ---------------------------------------------------------- spec transitions

        @rule(target=chunks, owner=sampled_from(OWNERS), n=st.integers(1, 5))
        def allocate(self, owner: Owner, n: int) -> object:
            need = -(-n // kind.unit)
            fits = all(spec.can_allocate(led, need) for led in self.model.values())
            if isinstance(self.pool, MambaPool | ReqToTokenPool):
                fits = spec.can_allocate(
                    next(iter(self.model.values())), 1 if isinstance(self.pool, ReqToTokenPool) else n
                )
            if not fits:
                from kvledger.spec.errors import OverAllocation

                self._expect_rejected(lambda: _alloc(self.pool, n, owner), OverAllocation)
                return multiple()
            idx = _alloc(self.pool, n, owner)
            self._apply("allocate", kind.effects(self.pool, idx, owner))
            self.stamp += 1
            data = _data(self.pool)
            if data is not None:
                from kvledger.impl.integrity import fingerprint

                tokens, positions = torch.full_like(idx, owner.ident), torch.arange(idx.numel()) + 100 * self.stamp
                fp = fingerprint(tokens, positions)
                self.written[self.stamp] = (tokens, positions)
                if isinstance(self.pool, MambaPool):
                    for slot, value in zip(idx.tolist(), fp.tolist(), strict=True):
                        self.pool.write_fingerprint(slot, value)
                elif not isinstance(self.pool, ReqToTokenPool):  # NOTE: it has no data, so never here
                    # NOTE: the pool's own write (an SWA pool's copies too): ``inv_data_integrity`` holds what it
                    # wrote to the fingerprints computed here, and ``inv_verify_passes`` holds its verify to them
                    self.pool.write_fingerprint(idx, tokens, positions)
                self.expect[self.stamp] = (idx, fp)
            made = self.live[self.stamp] = Chunk(owner, idx, self.stamp)
            self._robbing(owner)
            return made

        @rule(chunk=consumes(chunks), form=sampled_from(ID_FORMS))
        def free(self, chunk: Chunk, form: str = "as handed out") -> None:
            effects = kind.effects(self.pool, chunk.idx, chunk.owner)
            _free(self.pool, _in_form(chunk.idx, form), chunk.owner)
            self._apply("free", effects)
            self.expect.pop(chunk.stamp, None)
            self.written.pop(chunk.stamp, None)
            self.released.append(chunk)
            self.live.pop(chunk.stamp, None)
            self._robbed(chunk.owner)

        @rule(target=chunks, chunk=consumes(chunks), dst=sampled_from(OWNERS), form=sampled_from(ID_FORMS))
        def transfer(self, chunk: Chunk, dst: Owner, form: str = "as handed out") -> Chunk:
            if dst == chunk.owner:
                self._expect_rejected(lambda: _transfer(self.pool, chunk.idx, chunk.owner, dst), InvalidArgument)
                return chunk
            effects = kind.effects(self.pool, chunk.idx, chunk.owner)
            _transfer(self.pool, _in_form(chunk.idx, form), chunk.owner, dst)
            self._apply("transfer", effects, dst)
            moved = self.live[chunk.stamp] = Chunk(dst, chunk.idx, chunk.stamp)
            self._robbed(chunk.owner, dst)
            return moved

        def _robbed(self, *served: Owner) -> None:
            """Right after a call served ``served`` (a free, a transfer), another owner frees each chunk they still
            hold: refused with ``NotOwner``, nothing changed. A fast path that remembers the last owner it served
            (its tag, a run of its tags) is hot now; one that trusts the memo over the caller shows here."""
            pool = self.pool
            for chunk in [c for c in self.live.values() if c.owner in served]:
                thief = other_owner(chunk.owner)
                self._expect_rejected(partial(_free, pool, chunk.idx, thief), NotOwner)

        def _robbing(self, thief: Owner) -> None:
            """Right after an alloc served ``thief``, it frees each chunk another owner holds: refused with
            ``NotOwner``, nothing changed. The memo of the last owner served (and of its last alloc) is hot now; a
            fast path that trusts it for slots the owner does not hold (an earlier alloc of its own, handed over
            since) shows here (``_robbed`` is the other side: another owner frees what the one served holds)."""
            pool = self.pool
            others = [c for c in self.live.values() if c.owner != thief]
            for chunk in others:
                self._expect_rejected(partial(_free, pool, chunk.idx, thief), NotOwner)
            if len({c.owner for c in others}) > 1:
                # NOTE: slots of several holders at once, the last chunk first: a refusal that says who holds a
                # slot must pair it with its own holder, not another named slot's (``inv_names_holder``)
                ids = torch.cat([c.idx for c in reversed(others)])
                self._expect_rejected(partial(_free, pool, ids, thief), NotOwner)

        def long_alloc(self, form: str, dst: Owner, scrambled: bool = False) -> None:
            """An allocation of ``LONG_ALLOC`` units on a pool of this kind with room for it, held to the spec at
            each step: the alloc (``spec.allocate``), a free naming one of its units twice with its last ids as
            handed out (a memo keyed by the last ids must not vouch for it: refused, nothing changed), its hand-over
            to ``dst`` in ``form`` (``spec.transfer``), its free (the ledgers as before) and a double free.
            ``scrambled``: the pool's free slots first given out and taken back every third unit first, so the
            allocation is no run of slots (a fresh pool hands out one run, which a pool may take another path for).

            NOTE: no rule: a step of ~50 ms (the ledgers of a 10,000-slot pool, read eight times) drawn in most
            examples would add a fifth to the pools suite. A kept program (``kept.KEPT``) makes it in every form
            once a run, in the regression-first phase, before the search."""
            if kind.big is None:
                return
            pool, owner, u = kind.big(device), OWNERS[0], kind.unit
            if scrambled:
                # NOTE: in three interleaved parts: the next pop is no run, and its ends are not a run's ends either
                units = _alloc(pool, LONG_ALLOC * u, owner).view(-1, u)
                for part in range(3):
                    _free(pool, units[part::3].flatten(), owner)
            before = abstract(pool)

            def refines(op: str, want: dict[str, Ledger]) -> None:
                assert abstract(pool) == want, (
                    f"refinement (abstract == spec model): a long allocation ({LONG_ALLOC} units) after {op}: the "
                    "pool's ledgers are not the spec's"
                )

            idx = _alloc(pool, LONG_ALLOC * u, owner)
            effects = kind.effects(pool, idx, owner)
            allocated = {**before, **{n: spec.allocate(before[n], o, slots) for n, (o, slots) in effects.items()}}
            refines("allocate", allocated)
            twice = idx.clone()
            twice[u : 2 * u] = idx[:u]  # NOTE: its first unit named twice, its last ids as handed out
            self._expect_rejected(partial(_free, pool, twice, owner), (InvalidArgument, PageAlignmentError), pool=pool)
            holder = owner
            if dst != owner:
                _transfer(pool, _in_form(idx, form), owner, dst)
                to = {n: swa_owner(dst) if n == "swa" else dst for n in effects}
                refines(
                    "transfer",
                    {**allocated, **{n: spec.transfer(allocated[n], o, to[n], sl) for n, (o, sl) in effects.items()}},
                )
                holder = dst
            _free(pool, _in_form(idx, form), holder)
            assert abstract(pool) == before, (
                f"refinement (abstract == spec model): a long allocation ({LONG_ALLOC} units) freed by its holder "
                "left the ledgers other than before it"
            )
            self._expect_rejected(partial(_free, pool, idx, holder), DoubleFree, pool=pool)

        # ---------------------------------------------------------- misuse: typed error, state unchanged

        @rule()
        def double_free(self) -> None:
            if not self.released:
                return
            chunk = self.released[-1]
            effects = kind.effects(self.pool, chunk.idx, chunk.owner)
            name = next(iter(effects))
            owner, slots = effects[name]
            err = spec.check_free(self.model[name], owner, slots)
            if err is None:  # its slots were handed out again, to the same owner: a legal free now
                return
            self._expect_rejected(lambda: _free(self.pool, chunk.idx, chunk.owner), type(err))

        @rule()
        def use_after_free(self) -> None:
            """The last chunk freed, used by its old owner (the use after free ``double_free`` is the free of):
            a Mamba state copied from it into a state the owner of a live chunk holds, or into it; a request row
            written; SWA slots freed. Wherever its slots are free again, each is refused with a typed error naming
            one of them, nothing changed; slots handed out again since are not the old owner's to check here."""
            if not self.released:
                return
            chunk, pool = self.released[-1], self.pool
            name, (_, slots) = next(iter(kind.effects(pool, chunk.idx, chunk.owner).items()))
            if not slots <= self.model[name].free:
                return
            first = int(chunk.idx[0])
            calls: list[Callable[[], object]] = []
            if isinstance(pool, MambaPool):
                live = list(self.live.values())
                if live:
                    dst = live[-1]  # NOTE: the chunk held now that was allocated or handed over last
                    calls.append(lambda: pool.copy_state(first, int(dst.idx[-1]), dst.owner))
                    calls.append(lambda: pool.copy_state(int(dst.idx[0]), first, chunk.owner))
            elif isinstance(pool, ReqToTokenPool):
                calls.append(lambda: pool.write(first, 0, torch.tensor([1], dtype=torch.int64), chunk.owner))
            elif isinstance(pool, SWATokenAllocator):
                calls.append(lambda: pool.free_swa(chunk.idx, chunk.owner))
            for call in calls:
                self._expect_rejected(call, LedgerError)

        @rule(chunk=chunks, thief=sampled_from(OWNERS), how=sampled_from(["free", "give", "use"]))
        def foreign_free(self, chunk: Chunk, thief: Owner, how: str = "free") -> None:
            """A call on the chunk's slots by an owner that does not hold them (the ownership domain of every call
            that names an owner): free them, give them away, or use them (a Mamba state copied into, a row
            written, SWA slots freed); refused with ``NotOwner``, nothing changed."""
            if thief == chunk.owner:
                return
            pool, first, last = self.pool, int(chunk.idx[0]), int(chunk.idx[-1])
            call: Callable[[], object] = lambda: _free(pool, chunk.idx, thief)  # noqa: E731
            if how == "give":
                call = lambda: _transfer(pool, chunk.idx, thief, chunk.owner)  # noqa: E731
            elif how == "use" and isinstance(pool, MambaPool) and first != last:
                call = lambda: pool.copy_state(first, last, thief)  # noqa: E731  (a state into itself: refused anyway)
            elif how == "use" and isinstance(pool, ReqToTokenPool):
                call = lambda: pool.write(first, 0, torch.tensor([1], dtype=torch.int64), thief)  # noqa: E731
            elif how == "use" and isinstance(pool, SWATokenAllocator):
                call = lambda: pool.free_swa(chunk.idx, thief)  # noqa: E731
            self._expect_rejected(call, NotOwner)

        @rule(chunk=chunks)
        def bad_tensor(self, chunk: Chunk) -> None:
            """Every public method of the pool that takes a tensor (found by its signature: ``tensor_calls``, so a
            method added later is met too), each of its tensor parameters given every kind of bad tensor in turn (a
            sweep of ``TENSOR_EDGES``; for a tensor of values, token ids or positions, ``below`` and ``above`` are
            just outside their range ``[0, 2**31)``), the other arguments valid: each refused with a typed error,
            nothing changed. A query whose answer is typed ``... | None`` may answer ``None`` (not shown) instead.
            Each parameter naming ids is given the chunk's very ids made 2-D in place too (``_reshaped_in_place``).
            Then the same methods of a twin of the pool on another device, given ids on this one (``_elsewhere``)."""
            top = next(iter(pools_of(self.pool).values())).size * max(1, kind.unit) + 10_000
            refusals: dict[str, list[KVLedgerError]] = {}  # NOTE: per method, whichever parameter was bad
            for what, param, ids, query, acts, call in tensor_calls(self.pool, chunk):
                for edge in TENSOR_EDGES:
                    outside = edge in ("below", "above")
                    # NOTE: another pool's ids in a request table have the table's own range (int32): values too
                    values = outside and (param in DATA_PARAMS or (what.rpartition(".")[2], param) in OTHER_POOLS_IDS)
                    if (outside and not ids and not values) or (edge == "empty" and not (ids and acts)):
                        continue
                    # NOTE: values (tokens, positions) have a range of their own: just below it, the first past it
                    bad = bad_values_of(chunk.idx, edge) if values else bad_tensor_of(chunk.idx, edge, top)
                    made = partial(call, bad)
                    if answers_none(query, made):
                        continue
                    err = self._expect_outside(f"{what} with {param} {edge} {_shown_tensor(bad)}", made)
                    if isinstance(err, KVLedgerError):
                        refusals.setdefault(what, []).append(err)
                if ids:
                    self._reshaped_in_place(chunk, f"{what} with {param}", query, call)
            for what, errs in refusals.items():
                names_one_operation(what, errs)
            self._elsewhere(chunk)
            self._in_every_int_dtype(chunk)

        def _in_every_int_dtype(self, chunk: Chunk) -> None:
            """One tensor parameter of one method ``bad_tensor`` meets, given its valid tensor (``chunk``'s ids, or
            zeros for values) in another integer dtype that holds the values, on a copy of the pool: the call does
            what it does on another copy with the int64 tensor (``spec.domains.inv_dtype_blind``: the same refusal
            class, answer, ledgers and contents); a query typed ``... | None`` may answer ``None``. A call the int64
            tensor has accepted and another dtype's refused breaks ``inv_domain_enforced``.

            The parameter and the dtype go in turn, from the chunk's stamp on (two copies of the pool per step: every
            (parameter, dtype) pair is met a few times in a default run)."""
            calls = tensor_calls(self.pool, chunk)
            turn = self.dtype_turn = self.dtype_turn + 1
            k = turn + chunk.stamp
            what, param, _ids, query, _acts, _call = calls[k % len(calls)]
            value = torch.zeros_like(chunk.idx) if param in DATA_PARAMS else chunk.idx
            fits = [dt for dt in OTHER_INT_DTYPES if fits_dtype(value, dt)]
            if not fits:
                return
            dtype = fits[(k // len(calls) + k) % len(fits)]
            base, got = self._on_twin(chunk, k % len(calls), None), self._on_twin(chunk, k % len(calls), dtype)
            if query and got[1] == "None":
                return
            shown = f"{what} with {param} {value.tolist()} as {dtype} (on a copy)"
            err = got[0]
            untyped = isinstance(err, type) and not issubclass(err, KVLedgerError)
            if err != base[0] and (base[0] == "accepted" or untyped):
                why = "was refused" if base[0] == "accepted" else f"crashed where int64 ids met {base[0]}"
                raise AssertionError(f"inv_domain_enforced: {shown} lies in its domain and {why}: {err}")
            if not D.inv_dtype_blind(base, got):
                parts = ("refusal", "answer", "ledgers", "contents")
                diff = [f"{part} {x} -> {y}" for part, x, y in zip(parts, base, got, strict=True) if x != y][:2]
                raise AssertionError(f"inv_dtype_blind: {shown} did otherwise than as int64: {'; '.join(diff)}")

        def _on_twin(self, chunk: Chunk, at: int, dtype: torch.dtype | None) -> tuple[object, ...]:
            """``_done`` of the ``at``-th of ``tensor_calls`` on a copy of the pool (and of ``chunk``'s ids, so a
            memo of them is copied with them), its tensor in ``dtype`` (``None``: int64 as it is)."""
            twin, idx = deepcopy((self.pool, chunk.idx))
            _what, param, _ids, _query, _acts, call = tensor_calls(twin, Chunk(chunk.owner, idx, chunk.stamp))[at]
            value = torch.zeros_like(idx) if param in DATA_PARAMS else idx
            return _done(twin, partial(call, value if dtype is None else value.to(dtype)))

        def _reshaped_in_place(
            self, chunk: Chunk, what: str, query: bool, call: Callable[[torch.Tensor], object]
        ) -> None:
            """``call`` of ``chunk``'s very ids (the alloc's own result, where the chunk still has it) made 2-D in
            place, as a caller's ``unsqueeze_`` does: the same object a pool may remember handing out, its values
            unchanged, no longer ids. Refused with a typed error, nothing changed; then put back."""
            idx = chunk.idx
            idx.unsqueeze_(0)
            try:
                made = partial(call, idx)
                if not answers_none(query, made):
                    self._expect_outside(f"{what} reshaped in place {_shown_tensor(idx)}", made)
            finally:
                idx.squeeze_(0)

        def _elsewhere(self, chunk: Chunk) -> None:
            """The same methods on a twin of the pool on another device (the meta device: shapes, no memory), given
            ``chunk``'s ids and every other tensor on this machine's device: each refused with a typed error (a
            query typed ``... | None`` may answer ``None``), never accepted, never an untyped crash. A device check
            is met on any machine, a GPU or none."""
            if self.twin is None:
                self.twin = kind.make("meta")
            done: set[str] = set()
            for what, _param, _ids, query, _acts, call in tensor_calls(self.twin, chunk):
                if what in done:
                    continue  # NOTE: every tensor is on this device: one call per method
                done.add(what)
                made = partial(call, chunk.idx)
                if answers_none(query, made):
                    continue
                err = raised(made)
                self._domain(f"{what} of a pool on the meta device with ids on {chunk.idx.device}", False, err)

        @rule(chunk=chunks)
        def bad_int(self, chunk: Chunk) -> None:
            """Every public method of the pool that takes an int (found by its signature: ``int_calls``), each of
            its int parameters given each value no int parameter takes in turn (-1, one past int64, a bool, a
            float, ``None``, a string, another object), the other arguments valid: each refused with a typed
            error, nothing changed. A query whose answer is typed ``... | None`` may answer ``None``. The same for
            every parameter annotated ``bytes`` (``bytes_calls``, ``BYTES_EDGES``), where no answer is an excuse."""
            if not chunk.idx.numel():
                return
            for what, param, query, call in int_calls(self.pool, chunk):
                for edge in (-1, D.INT64_END, *SCALAR_EDGES):
                    made = partial(call, edge)
                    if answers_none(query, made):
                        continue
                    self._expect_outside(f"{what} with {param} {edge!r}", made)
            for what, param, call in bytes_calls(self.pool, chunk):  # NOTE: raw ids: every junk value refused
                for edge in BYTES_EDGES:
                    self._expect_outside(f"{what} with {param} {edge!r}", partial(call, edge))

        @rule(where=sampled_from(["below", "above", "edge"]))
        def out_of_range(self, where: str) -> None:
            """Free ids outside the pool: below it, far above it (and past int64, in a uint64 tensor), or the first
            (page) just past its end."""
            from kvledger.spec.errors import OutOfRange

            big = _data(self.pool)
            top = 10_000 if big is None else big.numel() + 10_000
            bad = torch.tensor([-1 if where == "below" else top], dtype=torch.int64)
            if where == "edge":
                ps = int(getattr(self.pool, "page_size", 1))
                end = max(led.base + led.capacity for led in self.model.values()) * ps
                bad = torch.arange(end, end + ps, dtype=torch.int64)
                if isinstance(self.pool, TokenAllocator | PagedAllocator | SWATokenAllocator):
                    # NOTE: a KV write names token slots too, and checks their range on its own
                    one, zero = torch.tensor([end], dtype=torch.int64), torch.zeros(1, dtype=torch.int64)
                    write = self.pool.write_fingerprint
                    self._expect_rejected(lambda: write(one, zero, zero), OutOfRange)
            if isinstance(self.pool, PagedAllocator):
                # NOTE: so does the page-to-token map: a page below the pool (the reserved one) or past its end
                pages, tokens_of = self.pool.pool, self.pool.tokens_of
                page = {"below": pages.base - 1, "above": pages.size + 10_000, "edge": pages.size}[where]
                self._expect_rejected(lambda: tokens_of(torch.tensor([page], dtype=torch.int64)), OutOfRange)
            self._expect_rejected(lambda: _free(self.pool, bad, OWNERS[0]), OutOfRange)
            # NOTE: and with the pool's first valid ids among them: the refusal names the culprits, and only them
            ps = int(getattr(self.pool, "page_size", 1))
            first = min(led.base for led in self.model.values()) * ps
            mixed = torch.cat((torch.arange(first, first + ps, dtype=torch.int64), bad))
            self._expect_rejected(lambda: _free(self.pool, mixed, OWNERS[0]), OutOfRange, set(bad.tolist()))
            if where == "above":
                # NOTE: and an id past int64, which only a uint64 tensor holds: named as it is, not as the negative
                # int64 its bits read as (a conversion that wraps it names an id the caller never gave)
                past = (1 << 63) + top
                wide = torch.tensor([*mixed[:-1].tolist(), past], dtype=torch.uint64)
                self._expect_rejected(lambda: _free(self.pool, wide, OWNERS[0]), OutOfRange, {past})
            if isinstance(self.pool, PagedAllocator) and where == "below":
                # NOTE: and the whole page below the pool, which is whole pages in order and still no page of it
                reserved = torch.arange(0, self.pool.page_size, dtype=torch.int64)
                self._expect_rejected(lambda: _free(self.pool, reserved, OWNERS[0]), OutOfRange)
                # NOTE: and with the pool's first page after it: whole, distinct pages in order, one of them reserved
                both = torch.cat((reserved, torch.arange(first, first + ps, dtype=torch.int64)))
                self._expect_rejected(lambda: _free(self.pool, both, OWNERS[0]), OutOfRange, set(reserved.tolist()))

        @rule(chunk=chunks, give=st.booleans())
        def malformed_indices(self, chunk: Chunk, give: bool = False) -> None:
            """Free (or, with ``give``, transfer) the chunk named by each kind of malformed index tensor in turn
            (a sweep: float, 2-D, empty, a slot twice, every slot twice (whole pages twice), and int64 ids in a
            sparse or a meta tensor, which have the right dtype and shape and no readable values; and the alloc's
            very tensor with a slot written twice in place, through numpy, where torch counts no change): each
            refused, typed, and nothing changed."""
            for bad in ("float", "2d", "empty", "dup", "twice", "sparse", "meta", "in place"):
                self._malformed(chunk, bad, give)

        def _malformed(self, chunk: Chunk, bad: str, give: bool) -> None:
            if bad in TENSOR_EDGES:
                idx = bad_tensor_of(chunk.idx, bad, 0)  # NOTE: float, 2-D, sparse or meta
            elif bad == "empty":
                idx = chunk.idx[:0]
            elif bad == "twice":
                idx = torch.cat((chunk.idx, chunk.idx))  # NOTE: whole pages, each named twice
            elif bad == "in place":
                self._rewritten(chunk, give)
                return
            else:
                idx = torch.cat((chunk.idx, chunk.idx[:1]))
            expected: type[KVLedgerError] | tuple[type[KVLedgerError], ...] = InvalidArgument
            culprits: set[int] | None = None
            if bad in ("dup", "twice"):
                # NOTE: the refusal names the slots named twice, and only them; a paged pool's slots are pages, and
                # a page holding a token named twice is also not whole (either refusal names that page)
                twice = chunk.idx[:1] if bad == "dup" else chunk.idx
                culprits = set(_pages(self.pool, twice).tolist())
                if isinstance(self.pool, PagedAllocator):
                    expected = (PageAlignmentError, InvalidArgument)
            if give:
                other = other_owner(chunk.owner)
                self._expect_rejected(lambda: _transfer(self.pool, idx, chunk.owner, other), expected, culprits)
                return
            self._expect_rejected(lambda: _free(self.pool, idx, chunk.owner), expected, culprits)
            if bad == "dup" and isinstance(self.pool, TokenAllocator | PagedAllocator | SWATokenAllocator):
                # NOTE: a KV write naming a token slot twice (and the least such write: one slot, twice) is refused,
                # naming that slot: the tokens it would write there are two
                write = self.pool.write_fingerprint
                for ids in (chunk.idx[:1].repeat(2), idx):
                    zero, pos = torch.zeros_like(ids), torch.arange(ids.numel())
                    named = {int(ids[0])}
                    self._expect_rejected(partial(write, ids, zero, pos), InvalidArgument, named)

        def _rewritten(self, chunk: Chunk, give: bool) -> None:
            """Free (or transfer) the chunk's own tensor, as the alloc handed it out, after its second slot is
            written over with its first through a numpy view (torch's version counter does not move): a pool
            that remembers its alloc results must see the ids as they are now, a slot named twice, and refuse."""
            idx = chunk.idx
            if idx.numel() < 2 or not idx.is_cpu or idx.layout != torch.strided:
                return
            host = idx.numpy()
            saved = host.copy()
            host[1] = host[0]
            paged = isinstance(self.pool, PagedAllocator)
            expected = (PageAlignmentError, InvalidArgument) if paged else InvalidArgument
            culprits = set(_pages(self.pool, torch.from_numpy(saved[:1])).tolist())  # NOTE: the slot named twice
            try:
                if give:
                    other = other_owner(chunk.owner)
                    self._expect_rejected(lambda: _transfer(self.pool, idx, chunk.owner, other), expected, culprits)
                else:
                    self._expect_rejected(lambda: _free(self.pool, idx, chunk.owner), expected, culprits)
            finally:
                host[:] = saved

        @rule(chunk=chunks, bad_n=sampled_from([-1, -(2**40)]))
        def bad_size(self, chunk: Chunk, bad_n: int) -> None:
            if isinstance(self.pool, ReqToTokenPool):
                return
            self._expect_rejected(lambda: _alloc(self.pool, bad_n, chunk.owner), InvalidArgument)

        @rule(owner=sampled_from(OWNERS))
        def allocate_nothing(self, owner: Owner) -> None:
            """alloc(0) is legal and changes nothing (an engine allocates nothing for a fully cached request)."""
            if isinstance(self.pool, ReqToTokenPool):
                return
            before = abstract(self.pool)
            got = _alloc(self.pool, 0, owner)
            assert got.numel() == 0, f"alloc(0) handed out {got.tolist()}"
            assert abstract(self.pool) == before, "alloc(0) changed the pool"
            for led in self.model.values():
                assert spec.allocate(led, owner, frozenset()) == led, "spec.allocate of no slots changes nothing"

        @rule(
            chunk=chunks,
            start=st.integers(0, 15),
            n=st.integers(1, 6),
            src=sampled_from(ROW_SOURCES),
            shift=sampled_from([-3, -2, -1, 1, 2, 3]),
        )
        def write_row(self, chunk: Chunk, start: int, n: int, src: str, shift: int) -> None:
            """Write ``n`` KV slot ids into the chunk's row at ``start``: new ids, or a view of the table itself
            (columns ``shift`` away in its own row, overlapping the target or not, or of another row), as engines copy
            a prefix. ``row write commits``: the table afterwards is the table before with exactly those columns
            set to what the source held, and ``read`` of those columns answers them; a source naming a slot twice
            is refused, the table unchanged. The drawn source goes first, then the other two (a sweep of the
            sources: a draw meets a view of the table only now and then)."""
            for each in dict.fromkeys((src, *ROW_SOURCES)):
                self._write_row(chunk, start, n, each, shift)

        def _write_row(self, chunk: Chunk, start: int, n: int, src: str, shift: int) -> None:
            pool = self.pool
            if not isinstance(pool, ReqToTokenPool):
                return
            row, width = int(chunk.idx[0]), pool.max_context_len
            at = max(0, start + shift)  # NOTE: a window of the own row that overlaps the target, shifted
            n = min(max(n, abs(shift) + 1), width - start, width - at)
            if n <= 0:
                return
            if src == "ids":
                ids = torch.arange(1 + start, 1 + start + n, dtype=torch.int64, device=pool.device)
            else:
                if src == "own row":  # NOTE: distinct ids first, so the copy of a window of them is no refusal
                    pool.write(row, 0, torch.arange(1, width + 1, dtype=torch.int64, device=pool.device), chunk.owner)
                other = row if src == "own row" else (row + 1) % pool.table.shape[0]
                ids = pool.table[other, at : at + n]  # NOTE: a view of the table, as engines pass a row's prefix
            expected = pool.table.clone()
            expected[row, start : start + n] = ids.clone()
            if len(set(ids.tolist())) < n:
                self._expect_rejected(lambda: pool.write(row, start, ids, chunk.owner), InvalidArgument)
                return
            err = raised(lambda: pool.write(row, start, ids, chunk.owner))
            if err is not None:
                raise AssertionError(
                    f"row write commits: write(row {row}, {start}, {src} [{at}:{at + n}]) raised {err!r}"
                )
            if not torch.equal(pool.table, expected):
                got = pool.table[row].tolist()
                raise AssertionError(
                    f"row write commits: write(row {row}, {start}, {src} [{at}:{at + n}]) left the row {got}, "
                    f"expected {expected[row].tolist()}"
                )
            back, want = pool.read(row, start, start + n), expected[row, start : start + n]
            if not torch.equal(back, want):  # NOTE: and reads back, through the table's own read
                raise AssertionError(
                    f"results equal the spec's: read(row {row}, {start}, {start + n}) after the write answered "
                    f"{back.tolist()}, the row holds {want.tolist()}"
                )

        @rule(n=st.integers(1, 3), which=st.integers(0, 3))
        def free_all_of_owner(self, n: int, which: int) -> None:
            """``free_all_of`` (a teardown path): give ``n`` units of one of the pool's slot pools to an owner that
            holds nothing else, then free everything it holds in one whole-pool scan. The scan must return exactly
            those slots and leave the pool as before (``refinement``; the invariants check the rest)."""
            pools = pools_of(self.pool)
            name = sorted(pools)[which % len(pools)]
            slots, temp = pools[name], request(77)
            if slots.available_size() < n:
                return
            before = abstract(self.pool)
            got = slots.alloc(n, temp)
            freed = slots.free_all_of(temp)
            restored = abstract(self.pool) == before
            if sorted(freed.tolist()) != sorted(got.tolist()) or not restored:
                same = "" if restored else " not"
                raise AssertionError(
                    f"refinement (abstract == spec model): {name} free_all_of({temp}) after alloc "
                    f"{sorted(got.tolist())} returned {sorted(freed.tolist())}; the pool is{same} as before"
                )

        @rule(chunk=chunks)
        def torn_pages(self, chunk: Chunk) -> None:
            """A paged pool's ``free`` and ``transfer`` of token indices of the chunk that are not its whole pages,
            each token once: its first token alone, all but its last, and all with the last replaced by the first
            (as many indices as whole pages cover, one page over and one under: a per-page count alone passes it).
            Each refused with a typed error naming a page (``PageAlignmentError``, or ``InvalidArgument`` for a token
            named twice), nothing changed."""
            pool = self.pool
            if not isinstance(pool, PagedAllocator) or pool.page_size == 1:
                return
            idx = chunk.idx
            other = other_owner(chunk.owner)
            torn = (PageAlignmentError, InvalidArgument)
            for bad in (idx[:1], idx[:-1], torch.cat((idx[:-1], idx[:1]))):
                # NOTE: the refusal names the culprits, and only them: the pages not named whole (each token once),
                # or the pages of the tokens named twice; a page named whole beside them is no culprit
                culprits = _torn_culprits(bad.tolist(), pool.page_size)
                self._expect_rejected(partial(_free, pool, bad, chunk.owner), torn, culprits)
                self._expect_rejected(partial(_transfer, pool, bad, chunk.owner, other), torn, culprits)

        @rule(target=chunks, chunk=consumes(chunks))
        def free_swa(self, chunk: Chunk) -> Chunk:
            pool = self.pool
            if not isinstance(pool, SWATokenAllocator):
                return chunk
            live = pool.translate(chunk.idx)
            if bool((live == 0).any()):
                # NOTE: the refusal names the culprits, and only them: the full slots that have no SWA slot left
                culprits = {int(s) for s, w in zip(chunk.idx.tolist(), live.tolist(), strict=True) if w == 0}
                self._expect_rejected(lambda: pool.free_swa(chunk.idx, chunk.owner), InvalidArgument, culprits)
                return chunk
            swa = frozenset(live.tolist())
            pool.free_swa(chunk.idx, chunk.owner)
            self._apply("free", {"swa": (swa_owner(chunk.owner), swa)})
            return chunk

        @rule(src=chunks, dst=chunks)
        def copy_state(self, src: Chunk, dst: Chunk) -> None:
            if not isinstance(self.pool, MambaPool):
                return
            s, d = int(src.idx[0]), int(dst.idx[-1])
            if s == d:
                return
            pool = self.pool
            for thief in OWNERS:  # NOTE: the same copy by each owner that does not hold the destination: refused
                if thief != dst.owner:
                    self._expect_rejected(lambda thief=thief: pool.copy_state(s, d, thief), NotOwner)  # type: ignore[misc]
            free = pool.pool.free_slots()
            for f in sorted({int(free.min()), int(free.max())}) if free.numel() else ():
                # NOTE: a copy reads its source: from a free state it is a use after free, refused naming it
                self._expect_rejected(lambda f=f: pool.copy_state(f, d, dst.owner), LedgerError, {f})  # type: ignore[misc]
            pool.copy_state(s, d, dst.owner)
            self.pool.verify(d, int(self.pool.data[s]))
            # the destination now holds the source's state: update what it must hold
            slots, fps = self.expect[dst.stamp]
            fps = fps.clone()
            fps[-1] = int(self.pool.data[s])
            self.expect[dst.stamp] = (slots, fps)

        # ---------------------------------------------------------- probes at the domains' edge (spec.domains)

        def _domain(self, call: object, inside: bool, err: BaseException | None) -> None:
            if D.inv_domain_enforced(inside, err):
                return
            what = call if isinstance(call, str) else repr(call)
            if inside:
                raise AssertionError(f"inv_domain_enforced: {what} lies in its domain, was refused: {err!r}")
            got = "was accepted" if err is None else f"raised {type(err).__name__} (not a KVLedgerError): {err}"
            raise AssertionError(f"inv_domain_enforced: {what} lies outside its domain and {got}")

        @rule(call=constructor_calls(kind.name))
        def construct(self, call: Call) -> None:
            """Build one of this pool kind's public types (the pool, a cache over it) with arguments drawn from
            anywhere, one of them junk at most: built inside its domain, refused with a typed error outside."""
            self._domain(call, call.inside, run_call(call))

        @rule(data=st.data())
        def construct_sweep(self, data: st.DataObject) -> None:
            """One argument of one of this pool kind's public types given each value of its catalogue of junk
            (``Constructor.edges``) in turn, the other arguments valid: each built inside its domain (a value that
            is valid with the others drawn), refused with a typed error outside."""
            # NOTE: every (type, argument) in turn, from a start drawn per example: a drawn index favours the
            # first, and one run of the Mamba kind swept conv_shape 20 times and ping_pong_size never
            pairs = [(c, k) for c in CONSTRUCTORS[kind.name] for k in c.args if k in c.edges]
            if not pairs:
                return
            if self.construct_turn == 0:
                self.construct_turn = data.draw(st.integers(0, len(pairs) - 1), label="first sweep")
            c, broken = pairs[self.construct_turn % len(pairs)]
            self.construct_turn += 1
            valid = {k: data.draw(c.valid[k]()) for k in c.args}
            for junk in c.catalogue(broken):
                args = {**valid, broken: junk}
                call = Call(c.what, tuple(args.items()), c.inside(args))
                self._domain(call, call.inside, run_call(call))

        @rule(chunk=chunks, owner=owner_or_junk(), how=sampled_from(["alloc", "free", "give", "take"]))
        def bad_owner(self, chunk: Chunk, owner: object, how: str) -> None:
            """A call naming an owner drawn from anywhere (no Owner, a node without a component, a request with
            one, a bool or negative id): outside ``spec.domains.is_owner`` it is refused, and changes nothing. The
            same call is also the first a fresh pool of this kind ever gets (its slots all free): what a pool
            remembers of the last owner it saw starts from some value, and a junk owner must not pass for it."""
            if D.is_owner(owner):
                return
            fresh = kind.make(device)

            def calls(pool: AnyPool) -> dict[str, Callable[[], object]]:
                return {
                    "alloc": lambda: _alloc(pool, 1, owner),  # type: ignore[arg-type]
                    "free": lambda: _free(pool, chunk.idx, owner),  # type: ignore[arg-type]
                    "give": lambda: _transfer(pool, chunk.idx, chunk.owner, owner),  # type: ignore[arg-type]
                    "take": lambda: _transfer(pool, chunk.idx, owner, chunk.owner),  # type: ignore[arg-type]
                }

            self._expect_outside(f"{how} with owner {owner!r}", calls(self.pool)[how])
            self._expect_outside(f"{how} with owner {owner!r}, a fresh pool's first call", calls(fresh)[how], fresh)

        @rule(chunk=chunks, bad=id_or_junk(16), how=st.integers(0, 3))
        def bad_id(self, chunk: Chunk, bad: object, how: int) -> None:
            """Each method taking one slot, row or state id, given an id drawn from anywhere, and one of them (by
            ``how``) every kind of bad id in turn (a sweep of ``id_edges``): outside the pool
            (``spec.domains.is_id``) each is refused, and changes nothing."""
            size = next(iter(pools_of(self.pool).values())).size
            calls = self._id_calls(chunk)
            if not D.is_id(bad, size):
                for what, call in calls:
                    self._expect_outside(f"{what} of id {bad!r}", lambda call=call: call(bad))  # type: ignore[misc]
            what, call = calls[how % len(calls)]
            for edge in id_edges(size):
                self._expect_outside(f"{what} of id {edge!r}", lambda edge=edge: call(edge))  # type: ignore[misc]

        def _id_calls(self, chunk: Chunk) -> list[tuple[str, Callable[[object], object]]]:
            """The methods of this pool that take one slot, row or state id, as calls of that id."""
            pool, good, owner = self.pool, int(chunk.idx[0]), chunk.owner
            if isinstance(pool, MambaPool):
                return [
                    ("write_fingerprint", lambda x: pool.write_fingerprint(x, 1)),  # type: ignore[arg-type]
                    ("verify", lambda x: pool.verify(x, 1)),  # type: ignore[arg-type]
                    ("copy_state from", lambda x: pool.copy_state(x, good, owner)),  # type: ignore[arg-type]
                    ("copy_state to", lambda x: pool.copy_state(good, x, owner)),  # type: ignore[arg-type]
                ]
            if isinstance(pool, ReqToTokenPool):
                other = other_owner(owner)
                return [
                    ("free", lambda x: pool.free(x, owner)),  # type: ignore[arg-type]
                    ("transfer", lambda x: pool.transfer(x, owner, other)),  # type: ignore[arg-type]
                    ("read", lambda x: pool.read(x, 0, 1)),  # type: ignore[arg-type]
                    ("write", lambda x: pool.write(x, 0, torch.tensor([1]), owner)),  # type: ignore[arg-type]
                ]
            first = next(iter(pools_of(pool).values()))
            return [("owner_of", lambda x: first.owner_of(x))]  # type: ignore[arg-type]

        def _expect_outside(
            self, what: str, call: Callable[[], object], pool: AnyPool | None = None
        ) -> BaseException | None:
            """``call`` (``what``) lies outside its domain: refused with a typed error that is no verdict on stored
            data, naming its culprit, ``pool`` (this machine's unless given) unchanged."""
            pool = self.pool if pool is None else pool
            before = abstract(pool)
            contents = _contents(pool)
            err = raised(call)
            self._domain(what, False, err)
            if not D.inv_malformed_refused(err):
                raise AssertionError(
                    f"inv_domain_enforced: {what} lies outside its domain whatever the data and was refused as "
                    f"{type(err).__name__}, a verdict on stored data: {err}"
                )
            if isinstance(err, KVLedgerError) and not inv_names_culprit(err):
                raise AssertionError(f"inv_names_culprit: {what}: {type(err).__name__} names no slot: {err}")
            if isinstance(err, KVLedgerError):
                holder_named(err, before)
            assert abstract(pool) == before, f"rejected call leaves state unchanged: {what} changed the pool"
            assert _same(_contents(pool), contents), f"rejected call leaves state unchanged: {what} changed data"
            return err

        def _public_calls(self, data: st.DataObject, make: Callable[[str, Draw], Scenario]) -> None:
            # NOTE: built at the first such step and probed for the rest of the example: a refused call and a
            # reading one change nothing (the law checks it), so every later probe meets the state built
            scenario = self.scenarios.get(make.__name__)
            if scenario is None:
                scenario = self.scenarios[make.__name__] = make(kind.name, data.draw)
            for _ in range(data.draw(st.integers(1, 3), label="calls")):
                probe(scenario, data.draw)
            for _ in range(2):  # NOTE: two of its calls (distinct first): the object holds still for the example
                sweep(scenario, data.draw)
            cross(scenario, data.draw)
            audit(scenario, data.draw)

        @precondition(lambda self: cache_scenario in SCENARIOS[kind.name])
        @rule(data=st.data())
        def cache_call(self, data: st.DataObject) -> None:
            """A public call of a radix cache over this kind of pool, with sequences cached, locked and evicted,
            one argument drawn from its junk at most (``calls.probe``): outside its domain refused with a typed
            error and nothing changed; a reading call inside accepted and nothing changed."""
            self._public_calls(data, cache_scenario)

        @precondition(lambda self: manager_scenario in SCENARIOS[kind.name])
        @rule(data=st.data())
        def manager_call(self, data: st.DataObject) -> None:
            """The same for a memory manager on this kind of pool, with requests at every stage of their life and
            an allocation failure pending or not."""
            self._public_calls(data, manager_scenario)

        @rule(
            chunk=chunks,
            parts=st.sets(sampled_from(["data", "conv", "temporal", "swa"]), min_size=1),
            at=st.lists(st.integers(0, 63), min_size=1, max_size=3),
        )
        def corrupt(self, chunk: Chunk, parts: frozenset[str], at: list[int]) -> None:
            """Change an arbitrary part of what ``chunk`` holds (its KV slots, its SWA copies; values of one of a
            Mamba state's tensors at ``at``, its fingerprint) and ask the pool's own ``verify``: it must flag each
            change alone and all of them at once (``spec.prefix.inv_verify_exact``); with the content put back, it
            must pass."""
            pool = self.pool
            if isinstance(pool, ReqToTokenPool) or chunk.stamp not in self.expect:
                return
            check: Callable[[], object]
            if isinstance(pool, MambaPool):
                slot = int(self.expect[chunk.stamp][0][-1])
                value = int(self.expect[chunk.stamp][1][-1])
                check = lambda: pool.verify(slot, value)  # noqa: E731
                tensors = {"data": pool.data, "conv": pool.conv, "temporal": pool.temporal}
                targets = [
                    (f"{p} of slot {slot}", tensors[p][slot].view(-1), at) for p in sorted(parts) if p in tensors
                ]
            else:
                tokens, positions = self.written[chunk.stamp]
                slots = self.expect[chunk.stamp][0]
                check = lambda: pool.verify(slots, tokens, positions)  # noqa: E731
                full = pool.full.data if isinstance(pool, SWATokenAllocator) else pool.data
                # NOTE: every slot of the chunk (a few), not only the drawn ones: a verify that skips one slot is
                # met whenever its chunk is changed
                targets = [("data", full, sorted(set(slots.tolist())))] if "data" in parts else []
                if isinstance(pool, SWATokenAllocator) and "swa" in parts:
                    live = pool.translate(slots)
                    live = live[live != 0]
                    if live.numel():
                        targets.append(("swa data", pool.swa.data, sorted(set(live.tolist()))))
            if not targets:
                return
            # NOTE: each change alone, then all at once: one change the check misses is not hidden by another
            # it sees (a verify that skips one slot or one part still flags the whole set)
            alone = [[(name, t, [i])] for name, t, where in targets for i in where]
            for changes in (*alone, targets) if len(alone) > 1 else alone:
                self._flagged(chunk, changes, check)
            err = raised(check)
            if not P.inv_verify_exact(True, err):
                raise AssertionError(f"inv_verify_exact: chunk {chunk} intact, verify raised {err!r}")

        def _flagged(
            self, chunk: Chunk, changes: list[tuple[str, torch.Tensor, list[int]]], check: Callable[[], object]
        ) -> None:
            """Change ``changes`` (named flat tensors, positions in them), run ``check``, put everything back: the
            check must have raised (``spec.prefix.inv_verify_exact``)."""
            saved = [(t, t.clone()) for _, t, _ in changes]
            for _, t, where in changes:
                for i in where:
                    t[i % t.numel()] += 1 + (i % 5)  # NOTE: a fingerprint never wraps to itself
            try:
                err = raised(check)
                if not P.inv_verify_exact(False, err):
                    named = [f"{name}[{i % t.numel()}]" for name, t, where in changes for i in where]
                    raise AssertionError(
                        f"inv_verify_exact: chunk {chunk} with {', '.join(named)} changed: verify "
                        + ("passed" if err is None else f"raised {type(err).__name__}: {err}")
                    )
            finally:
                for t, old in saved:
                    t.copy_(old)

        # ---------------------------------------------------------- invariants

        def inv_all_laws(self) -> None:
            """Every invariant below (each ``inv_`` method), in the order Hypothesis runs them: what a kept program
            (``kept.KEPT``) checks before and after each of its steps."""
            for name in sorted(n for n in dir(type(self)) if n.startswith("inv_") and n != "inv_all_laws"):
                getattr(self, name)()

        @invariant()
        def inv_refines_spec(self) -> None:
            got = abstract(self.pool)
            assert got == self.model, f"abstraction differs from spec model:\n impl {got}\n spec {self.model}"

        @invariant()
        def inv_ledger_laws(self) -> None:
            for name, led in abstract(self.pool).items():
                if led.capacity:
                    self.pressure = max(self.pressure, 1 - len(led.free) / led.capacity)
                assert spec.inv_slots_conserved(led), f"inv_slots_conserved broken on {name}"
                assert spec.inv_single_owner(led), f"inv_single_owner broken on {name}"

        @invariant()
        def inv_free_stack(self) -> None:
            for name, p in pools_of(self.pool).items():
                assert inv_free_stack_matches_tags(p), f"free stack does not match tags on {name}"

        @invariant()
        def inv_structure_laws(self) -> None:
            broken = broken_structure_laws(self.pool)
            assert not broken, f"{broken[0]} (broken on the {kind.name} pool after this step)"

        @invariant()
        def inv_data_integrity(self) -> None:
            data = _data(self.pool)
            if data is None:
                return
            for stamp, (slots, fps) in self.expect.items():
                bad = data[slots] != fps
                assert not bool(bad.any()), f"data integrity: chunk {stamp} slots {slots[bad].tolist()} lost their data"

        @invariant()
        def inv_verify_passes(self) -> None:
            """The pool's own ``verify`` passes on every chunk it holds as written (``spec.prefix.inv_verify_exact``,
            its other half: ``corrupt`` holds a verify to the changes it must flag). A verify that flags what is
            intact (one that reads a slot it was not given, or the copy of a slot that has none) is as wrong as one
            that misses a change, and it is met here on every step, whatever state the chunks are in."""
            pool, stamps = self.pool, list(self.expect)
            if isinstance(pool, ReqToTokenPool) or not stamps:
                return
            calls: list[tuple[str, Callable[[], object]]]
            if isinstance(pool, MambaPool):  # NOTE: as ``corrupt`` asks it: each chunk's last state
                calls = [
                    (f"chunk {k}", partial(pool.verify, int(s[-1]), int(f[-1]))) for k, (s, f) in self.expect.items()
                ]
            else:  # NOTE: one call for every chunk: they hold distinct slots
                slots = torch.cat([self.expect[k][0] for k in stamps])
                tokens = torch.cat([self.written[k][0] for k in stamps])
                positions = torch.cat([self.written[k][1] for k in stamps])
                what = f"chunk {stamps[0]}" if len(stamps) == 1 else "every chunk"
                calls = [(what, partial(pool.verify, slots, tokens, positions))]
            for what, call in calls:
                err = raised(call)
                if not P.inv_verify_exact(True, err):
                    raise AssertionError(f"inv_verify_exact: {what} intact, verify raised {err!r}")

    PoolConformance.__name__ = f"PoolConformance_{kind.name}"
    PoolConformance.__qualname__ = PoolConformance.__name__
    return PoolConformance
