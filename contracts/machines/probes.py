"""Probes at the edge of the domains: calls with one argument drawn from anywhere, checked by ``spec.domains``.

The machines build pools, caches and owners only with valid arguments, so a
check an implementation forgot (a dtype, a window on the wrong allocator, an
owner whose kind and component do not go together, an id one past the end)
changes nothing they see. A probe draws each argument of a call from its
valid values or from a broad junk strategy (non-positive and huge ints,
bools, floats, ``None``, strings, lists for tuples, wrong types), at most one
argument junk per call so that a check later in the call is reached, decides
with the ``spec.domains`` predicates whether the call is inside its domain,
and holds the implementation to :func:`kvledger.spec.domains.inv_domain_enforced`:
accepted inside, refused with a typed ``KVLedgerError`` outside.

:data:`CONSTRUCTORS` names, per pool kind of the pool machine, the public
types built on that kind of pool (the pool itself, and the radix cache over a
KV allocator or a Mamba pool); :func:`constructor_calls` draws calls of them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
from hypothesis import strategies as st

from kvledger.contracts.machines.stable import just, sampled_from
from kvledger.impl.allocators import PagedAllocator, SWATokenAllocator, TokenAllocator
from kvledger.impl.lru import LRUList
from kvledger.impl.mamba import MambaPool
from kvledger.impl.memory import MemoryManager
from kvledger.impl.radix import RadixCache
from kvledger.impl.req_to_token import ReqToTokenPool
from kvledger.spec import domains as D
from kvledger.spec.types import Component, Owner, OwnerKind

__all__ = [
    "CONSTRUCTORS",
    "OWNER_EDGES",
    "SCALAR_EDGES",
    "Call",
    "constructor_calls",
    "count_edges",
    "id_edges",
    "id_or_junk",
    "owner_or_junk",
    "raised",
    "run_call",
]


class _Junk:
    """An object of no type an entry point takes (its repr says so)."""

    def __repr__(self) -> str:
        return "<junk object>"


class _IntSubclass(int):
    """An int of another type (an ``IntEnum``'s member, a library's int type): ``spec.domains`` counts only ``int``
    itself, so a count, an id or an amount of this type lies outside every domain."""

    def __repr__(self) -> str:
        return f"<int subclass {int(self)}>"


JUNK_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(0, 3).map(_IntSubclass),
    st.floats(allow_nan=True, allow_infinity=True) | st.integers(-3, 8).map(float),
    st.text(max_size=2),
    st.builds(_Junk),
)
"""Values of the wrong type for any int argument (a bool is an int to Python, not to a count)."""


SCALAR_EDGES: tuple[object, ...] = (None, True, _IntSubclass(1), 1.0, float("nan"), "1", _Junk())
"""One value of each wrong type an int argument meets (``JUNK_SCALARS``' catalogue, for a sweep)."""


def count_edges(least: int = 1) -> tuple[object, ...]:
    """Every kind of junk ``count_or_junk(least, ...)`` draws, once: just below ``least``, past int64, a scalar of
    each wrong type."""
    return (least - 1, D.INT64_END, *SCALAR_EDGES)


def id_edges(size: int) -> tuple[object, ...]:
    """Every kind of junk ``id_or_junk(size)`` draws, once: negative, the first id past the end, past int64, a
    scalar of each wrong type."""
    return (-1, size, D.INT64_END, *SCALAR_EDGES)


@dataclass(frozen=True)
class LookAlike:
    """An owner's fields (``kind``, ``ident``, ``component``, each valid) on an object that is no :class:`Owner`:
    a duck-typed check that reads the fields takes it for one."""

    kind: OwnerKind
    ident: int
    component: Component | None = None


OWNER_EDGES: tuple[object, ...] = (
    Owner(OwnerKind.REQUEST, -1, None),
    Owner(OwnerKind.REQUEST, True, None),
    Owner(OwnerKind.REQUEST, _IntSubclass(1), None),
    Owner(OwnerKind.REQUEST, D.INT64_END, None),
    Owner(OwnerKind.REQUEST, 1, Component.FULL),
    Owner(OwnerKind.NODE, 1, None),
    Owner("req", 1, None),  # type: ignore[arg-type]
    (OwnerKind.REQUEST, 1),
    LookAlike(OwnerKind.REQUEST, 1),
    *SCALAR_EDGES,
)
"""Every kind of junk ``owner_or_junk`` draws, once (each field wrong in turn, a tuple, a look-alike, a
scalar)."""


def count_or_junk(least: int = 1, most: int = 6) -> st.SearchStrategy[object]:
    """A count in ``[least, most]``, or junk: below ``least``, past int64, or of the wrong type."""
    below = st.integers(least - 3, least - 1)
    return st.one_of(st.integers(least, most), below, st.integers(D.INT64_END, D.INT64_END + 3), JUNK_SCALARS)


def id_or_junk(size: int) -> st.SearchStrategy[object]:
    """An id in ``[0, size)`` or junk: negative, the first ids past the end, past int64, or of the wrong type."""
    return st.one_of(
        st.integers(0, size - 1), st.integers(-3, -1), st.integers(size, size + 2), just(D.INT64_END), JUNK_SCALARS
    )


def shape_or_junk() -> st.SearchStrategy[object]:
    """A tensor shape (a tuple of counts) or junk: a list, a tuple holding a non-count, a scalar."""
    dims = st.lists(st.integers(1, 3), max_size=2)
    bad_dims = st.lists(count_or_junk(1, 3), min_size=1, max_size=2).filter(lambda ds: not D.is_shape(tuple(ds)))
    return st.one_of(dims.map(tuple), dims.map(list), bad_dims.map(tuple), JUNK_SCALARS)


SHAPE_EDGES: tuple[object, ...] = ((0,), (-1,), (True,), (1.5,), (2, D.INT64_END), [2], 2, None, (1,), (1, 1))
"""Every kind of junk ``shape_or_junk`` draws, once: a dimension of 0, negative, a bool, a float, past int64, a
list, a scalar, ``None``; and the least valid shapes, of dimensions 1 (a bound one too tight refuses them)."""

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
OTHER_DTYPES = (torch.int64, torch.int32, torch.int8, torch.bool, torch.complex64)


def dtype_or_junk() -> st.SearchStrategy[object]:
    """A floating torch dtype, or another dtype, or a dtype's name, or junk."""
    return st.one_of(sampled_from(FLOAT_DTYPES), sampled_from(OTHER_DTYPES), just("float32"), JUNK_SCALARS)


def owner_or_junk() -> st.SearchStrategy[object]:
    """An :class:`Owner` whose fields are each drawn from anywhere (a node without a component, a request with
    one, a negative, bool, float or huge id, a kind that is no ``OwnerKind``), or an object that is no owner (a
    tuple, an object with an owner's fields, a scalar)."""
    kinds = sampled_from(OwnerKind) | sampled_from(["req", 1, None])
    comps = st.none() | sampled_from(Component) | sampled_from(["full", 0])
    idents = st.integers(0, 40) | st.integers(-3, -1) | just(D.INT64_END) | JUNK_SCALARS
    owners = st.builds(Owner, kinds, idents, comps)  # NOTE: Owner is a plain dataclass: it checks nothing itself
    alike = st.builds(LookAlike, sampled_from(OwnerKind), st.integers(0, 9))
    return st.one_of(owners, st.tuples(sampled_from(OwnerKind), st.integers(0, 9)), alike, JUNK_SCALARS)


@dataclass(frozen=True)
class Call:
    """One call a probe makes: what it builds, its keyword arguments, and whether they lie in its domain."""

    what: str
    args: tuple[tuple[str, object], ...]
    inside: bool

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={_show(v)}" for k, v in self.args)
        return f"{self.what}({shown})"


def _show(v: object) -> str:
    """A value as a counterexample shows it: a pool by its type (its repr is an address), anything else by repr."""
    built = (TokenAllocator, PagedAllocator, SWATokenAllocator, ReqToTokenPool, MambaPool, RadixCache, MemoryManager)
    if not isinstance(v, built):
        return repr(v)
    over = f" over a {type(v.kv).__name__}" if isinstance(v, RadixCache) else ""
    device = getattr(v, "device", None)
    where = "" if device is None or device.type == "cpu" else f" on {device}"
    driven = ", driven" if getattr(v, "driven", False) else ""  # NOTE: a cache or table a manager drives already
    return f"<a {type(v).__name__}{over}{where}{driven}>"


@dataclass(frozen=True)
class Constructor:
    """A public type: how to build it from keyword arguments, and each argument's valid-or-junk strategy."""

    what: str
    build: Callable[..., object]
    args: Mapping[str, Callable[[], st.SearchStrategy[object]]]
    inside: Callable[[Mapping[str, object]], bool]
    valid: Mapping[str, Callable[[], st.SearchStrategy[object]]]
    edges: Mapping[str, tuple[object, ...] | Callable[[], tuple[object, ...]]] = field(default_factory=dict)
    """Per argument, a finite catalogue with one value of each kind of junk it takes (a sweep meets all of them;
    a draw of ``args`` meets each only now and then); a function making the catalogue where its values are
    objects a build may change (a cache a manager would then drive), so each sweep gets new ones."""

    def catalogue(self, name: str) -> tuple[object, ...]:
        """``edges[name]``'s values, made anew where it is a function."""
        values = self.edges[name]
        return values() if callable(values) else values


def _kv_or_junk() -> st.SearchStrategy[object]:
    kvs = sampled_from(["token", "paged", "swa"]).map(_kv)
    return st.one_of(kvs, sampled_from(["mamba", "rows"]).map(_other_pool), JUNK_SCALARS)


def _kv(kind: str) -> object:
    if kind == "paged":
        return PagedAllocator(4, 2)
    return SWATokenAllocator(8, 4) if kind == "swa" else TokenAllocator(8)


def _other_pool(kind: str) -> object:
    return MambaPool(2, conv_shape=(2,), temporal_shape=(2,)) if kind == "mamba" else ReqToTokenPool(2, 4)


def _radix_inside(a: Mapping[str, object]) -> bool:
    kv, ps, window, mamba = a["kv"], a["page_size"], a["swa_window"], a["mamba"]
    if not isinstance(kv, TokenAllocator | PagedAllocator | SWATokenAllocator):
        return False
    grain = kv.page_size
    return (
        (ps is None or D.is_page_size(ps, grain))
        and D.is_window(window, isinstance(kv, SWATokenAllocator))
        and (mamba is None or (isinstance(mamba, MambaPool) and mamba.device == kv.device))
    )


def _elsewhere_mamba() -> MambaPool:
    """A Mamba pool on another device than every KV allocator here (the meta device: shapes, no memory): a cache
    over pools on two devices is refused, typed, on any machine, a GPU or none."""
    return MambaPool(2, conv_shape=(2,), temporal_shape=(2,), device="meta")


def _st(s: st.SearchStrategy[object]) -> Callable[[], st.SearchStrategy[object]]:
    return lambda: s


RADIX = Constructor(
    "RadixCache",
    lambda kv, page_size, swa_window, mamba: RadixCache(kv, page_size=page_size, swa_window=swa_window, mamba=mamba),
    {
        "kv": _kv_or_junk,
        "page_size": lambda: st.none() | count_or_junk(1, 4),
        "swa_window": lambda: st.none() | count_or_junk(1, 4),
        "mamba": lambda: (
            st.none()
            | sampled_from(["mamba", "token"]).map(lambda k: _other_pool(k) if k == "mamba" else _kv(k))
            | JUNK_SCALARS
        ),
    },
    _radix_inside,
    {
        "kv": lambda: sampled_from(["token", "paged", "swa"]).map(_kv),
        "page_size": _st(st.none()),
        "swa_window": _st(st.none()),
        "mamba": lambda: st.none() | just("mamba").map(_other_pool),
    },
    {"page_size": count_edges(1), "swa_window": count_edges(1), "mamba": (_elsewhere_mamba(),)},
)

_NAME = sampled_from(["kv", "x"])
_BAD_NAME = st.one_of(st.none(), st.integers(0, 2), just(b"kv"), st.builds(_Junk))

BUILT_ON = ("cpu", "meta")
"""The device types every machine here can build a pool on (the meta device: shapes, no memory)."""

DEVICE_EDGES: tuple[object, ...] = (None, 0, 1.0, b"cpu", "", "nonsense", _Junk())
"""One device of each kind that names none: a ``torch.device`` or its name is what the pools take (an int is no
device to them, though torch reads one as a GPU index)."""


def _is_device(x: object) -> bool:
    """A device a pool is built on: a ``torch.device`` or a name torch parses, of a type in ``BUILT_ON``."""
    if not isinstance(x, str | torch.device):
        return False
    try:
        return torch.device(x).type in BUILT_ON
    except (RuntimeError, ValueError, TypeError):
        return False


_DEVICE = sampled_from(["cpu", torch.device("cpu"), "meta", "cpu:0"])


def _with_device(c: Constructor) -> Constructor:
    """``c`` with a ``device`` argument too (drawn from a device or junk, swept with ``DEVICE_EDGES``); a call
    that names none builds on the CPU, as the pools' own default does."""
    inside = c.inside
    return Constructor(
        c.what,
        c.build,
        {**c.args, "device": _st(_DEVICE | sampled_from(DEVICE_EDGES))},
        lambda a: inside(a) and _is_device(a.get("device", "cpu")),
        {**c.valid, "device": _st(_DEVICE)},
        {**c.edges, "device": DEVICE_EDGES},
    )


SLOTS_END = 1 << 40
"""The first slot count a pool refuses (``TokenAllocator`` size, ``PagedAllocator`` pages, either pool of an
``SWATokenAllocator``): the reference's stated maximum, ids and tags of 40 bits."""
ROWS_END = 1 << 24
"""The first row count, row length or Mamba state count the reference refuses (``ReqToTokenPool``, ``MambaPool``)."""
SHAPE_END = 1 << 20
"""The first page size or ping-pong buffer count the reference refuses."""


def _within(x: object, lo: int, end: int) -> bool:
    """A count of at least ``lo``, below ``end`` (the constructor's stated maximum plus one)."""
    return D.is_count(x, lo) and x < end  # type: ignore[operator]


def _bounded_edges(lo: int, end: int) -> tuple[object, ...]:
    """``count_edges(lo)`` and ``end``: a count one past the stated maximum (refused, typed: a check whose bound
    moved takes it)."""
    return (*count_edges(lo), end)


def _pool(
    what: str, build: Callable[..., object], counts: Mapping[str, tuple[int, int]], named: bool = False
) -> Constructor:
    """A pool constructor whose arguments are counts (each with its least value and its end: the first count
    refused), a device, and a name when ``named``."""
    args = {k: _st(count_or_junk(lo)) for k, (lo, _) in counts.items()}
    valid = {k: _st(st.integers(lo, lo + 5)) for k, (lo, _) in counts.items()}
    if named:
        args["name"], valid["name"] = _st(_NAME | _BAD_NAME), _st(_NAME)

    def inside(a: Mapping[str, object]) -> bool:
        return all(_within(a[k], lo, end) for k, (lo, end) in counts.items()) and (
            not named or isinstance(a["name"], str)
        )

    edges: dict[str, tuple[object, ...] | Callable[[], tuple[object, ...]]]
    edges = {k: _bounded_edges(lo, end) for k, (lo, end) in counts.items()}
    if named:
        edges["name"] = (None, 0, b"kv", _Junk())
    return _with_device(Constructor(what, build, args, inside, valid, edges))


MAMBA = _with_device(
    Constructor(
        "MambaPool",
        lambda size, conv_shape, temporal_shape, ping_pong_size, dtype, device="cpu": MambaPool(
            size,
            conv_shape=conv_shape,
            temporal_shape=temporal_shape,
            ping_pong_size=ping_pong_size,
            dtype=dtype,
            device=device,
        ),
        {
            "size": lambda: count_or_junk(1),
            "conv_shape": shape_or_junk,
            "temporal_shape": shape_or_junk,
            "ping_pong_size": lambda: count_or_junk(0),
            "dtype": dtype_or_junk,
        },
        lambda a: (
            _within(a["size"], 1, ROWS_END)
            and D.is_shape(a["conv_shape"])
            and D.is_shape(a["temporal_shape"])
            and _within(a["ping_pong_size"], 0, SHAPE_END)
            and a["dtype"] in FLOAT_DTYPES
        ),
        {
            "size": _st(st.integers(1, 6)),
            "conv_shape": _st(just((2,))),
            "temporal_shape": _st(just((2, 2))),
            "ping_pong_size": _st(st.integers(0, 2)),
            "dtype": _st(sampled_from(FLOAT_DTYPES)),
        },
        {
            "size": _bounded_edges(1, ROWS_END),
            "conv_shape": SHAPE_EDGES,
            "temporal_shape": SHAPE_EDGES,
            "ping_pong_size": _bounded_edges(0, SHAPE_END),
            "dtype": (*OTHER_DTYPES, "float32", *SCALAR_EDGES),
        },
    )
)


def _cache(kind: str) -> RadixCache:
    """A new radix cache over a new allocator of ``kind`` (``token``, ``paged``, ``swa``; ``mamba``: a token
    allocator and a Mamba pool)."""
    if kind == "mamba":
        return RadixCache(TokenAllocator(8), mamba=MambaPool(2, conv_shape=(2,), temporal_shape=(2,)))
    kv = _kv(kind)
    return RadixCache(kv, swa_window=2) if isinstance(kv, SWATokenAllocator) else RadixCache(kv)  # type: ignore[arg-type]


def _rows() -> ReqToTokenPool:
    return ReqToTokenPool(2, 4)


def _driven() -> tuple[RadixCache, ReqToTokenPool]:
    """A cache and a request table another memory manager drives already (a second manager on either would free
    the first's memory)."""
    mm = MemoryManager(_cache("token"), _rows())
    return mm.cache, mm.rows


def _manager_inside(a: Mapping[str, object]) -> bool:
    """``MemoryManager``'s domain: a radix cache over a token or paged allocator (a Mamba pool beside it or not;
    an SWA cache is not one it drives) and a request table on the same device, neither driven by another."""
    cache, rows = a["cache"], a["rows"]
    return (
        isinstance(cache, RadixCache)
        and isinstance(cache.kv, TokenAllocator | PagedAllocator)
        and isinstance(rows, ReqToTokenPool)
        and rows.device == cache.device
        and not cache.driven
        and not rows.driven
    )


def _manager_caches() -> tuple[object, ...]:
    """New values of each kind that is no cache a manager takes: an SWA cache, a driven cache, a pool, a table,
    a Mamba pool, scalars."""
    return (_cache("swa"), _driven()[0], _kv("token"), _rows(), _other_pool("mamba"), None, 0, _Junk())


def _manager_rows() -> tuple[object, ...]:
    """New values of each kind that is no request table a manager takes: one on another device, a driven one,
    pools of other kinds, scalars."""
    return (ReqToTokenPool(2, 4, device="meta"), _driven()[1], _kv("token"), _other_pool("mamba"), None, _Junk())


def _made_anew(catalogue: Callable[[], tuple[object, ...]]) -> st.SearchStrategy[object]:
    """One value of ``catalogue``, made anew for each draw (a build that took one would change it)."""
    return st.builds(catalogue).flatmap(sampled_from)


_CACHES = sampled_from(["token", "paged", "mamba"]).map(_cache)


MANAGER = Constructor(
    "MemoryManager",
    MemoryManager,
    {
        "cache": lambda: st.one_of(_CACHES, _made_anew(_manager_caches), JUNK_SCALARS),
        "rows": lambda: st.one_of(st.builds(_rows), _made_anew(_manager_rows), JUNK_SCALARS),
    },
    _manager_inside,
    {"cache": lambda: _CACHES, "rows": lambda: st.builds(_rows)},
    # NOTE: functions, so each sweep gets new values: a build that took one would change it (a cache it then drives)
    {"cache": _manager_caches, "rows": _manager_rows},
)
"""The memory manager over a cache and a request table: the cache's allocator kind decides whether it is inside
(an SWA cache is not one it drives), and a cache or table another manager drives already is refused."""


_COMPONENTS = sampled_from(list(Component))
COMPONENT_EDGES: tuple[object, ...] = (*(c.value for c in Component), OwnerKind.NODE, 0, *SCALAR_EDGES)
"""One value of each kind that is no component: each component's name as a string, an enum of another type, an
int, a scalar of each wrong type."""

LRU = Constructor(
    "LRUList",
    LRUList,
    {"component": lambda: _COMPONENTS | sampled_from(COMPONENT_EDGES)},
    lambda a: type(a["component"]) is Component,
    {"component": lambda: _COMPONENTS},
    {"component": COMPONENT_EDGES},
)
"""An LRU list of one component (the cache builds one per component it has)."""


CONSTRUCTORS: dict[str, tuple[Constructor, ...]] = {
    "token": (
        _pool(
            "TokenAllocator",
            lambda size, name, device="cpu": TokenAllocator(size, name=name, device=device),
            {"size": (1, SLOTS_END)},
            named=True,
        ),
        RADIX,
        MANAGER,
        LRU,
    ),
    "paged": (
        _pool(
            "PagedAllocator",
            lambda num_pages, page_size, name, device="cpu": PagedAllocator(
                num_pages, page_size, name=name, device=device
            ),
            {"num_pages": (1, SLOTS_END), "page_size": (1, SHAPE_END)},
            named=True,
        ),
        RADIX,
        MANAGER,
    ),
    "swa": (
        _pool("SWATokenAllocator", SWATokenAllocator, {"size": (1, SLOTS_END), "swa_size": (1, SLOTS_END)}),
        RADIX,
        MANAGER,
    ),
    "req_to_token": (
        _pool("ReqToTokenPool", ReqToTokenPool, {"size": (1, ROWS_END), "max_context_len": (1, ROWS_END)}),
        MANAGER,
    ),
    "mamba": (MAMBA, RADIX, MANAGER),
}
"""Per pool kind of the pool machine: the public types built from that kind of pool."""


@st.composite
def _call(draw: st.DrawFn, c: Constructor) -> Call:
    names = list(c.args)
    broken = draw(sampled_from([None, *names]))  # NOTE: one junk argument at most: every check is reachable
    args = {k: draw(c.args[k]() if k == broken else c.valid[k]()) for k in names}
    return Call(c.what, tuple(args.items()), c.inside(args))


def constructor_calls(kind: str) -> st.SearchStrategy[Call]:
    """Calls of the constructors of ``kind`` (:data:`CONSTRUCTORS`), each argument valid or (one) junk."""
    return st.one_of(*(_call(c) for c in CONSTRUCTORS[kind]))


_BY_NAME = {c.what: c for cs in CONSTRUCTORS.values() for c in cs}


def raised(call: Callable[[], object]) -> BaseException | None:
    """Make ``call``; the exception it raised, or ``None`` (any ``Exception``: an untyped one breaks a law as much
    as an accepted call does, so the caller judges it)."""
    try:
        call()
    except Exception as err:
        return err
    return None


def run_call(call: Call) -> BaseException | None:
    """Make ``call``; the exception it raised, or ``None``."""
    return raised(lambda: _BY_NAME[call.what].build(**dict(call.args)))
