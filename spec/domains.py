"""The domains of the arguments that build pools and caches and name owners, and the law at their edge.

Every entry point takes arguments from a domain: a pool's size is a count, a
cache's page size a positive multiple of its allocator's page, an owner an
:class:`~kvledger.spec.types.Owner` whose kind and component go together. The
law is the same for all of them (:func:`inv_domain_enforced`): a call inside
its domain is accepted, a call outside it is refused with a typed
:class:`~kvledger.spec.errors.KVLedgerError` (never accepted, never an untyped
crash). The predicates here decide which side of the edge a drawn argument
is on, so a machine can draw arguments from anywhere and know what to expect.

>>> is_count(4), is_count(0), is_count(True), is_count(4.0), is_count(0, least=0)
(True, False, False, False, True)
>>> is_shape((2, 3)), is_shape([2, 3]), is_shape((2, 0))
(True, False, False)
>>> is_page_size(4, 2), is_page_size(3, 2), is_window(None, swa=False), is_window(2, swa=False)
(True, False, True, False)
>>> inv_domain_enforced(False, None), inv_domain_enforced(False, ValueError("x")), inv_domain_enforced(True, None)
(False, False, True)
"""

from __future__ import annotations

from kvledger.spec.errors import IntegrityError, KVLedgerError
from kvledger.spec.types import Component, Owner, OwnerKind

INT64_END = 1 << 63
"""Counts and ids are int64 in every tensor that stores them: a value from here on names nothing."""


def is_count(x: object, least: int = 1) -> bool:
    """A count argument (a size, a page size, a number of buffers): an ``int`` (not a ``bool``) from ``least`` on,
    that an int64 can hold."""
    return type(x) is int and least <= x < INT64_END


def is_amount(x: object) -> bool:
    """How much to do, at most (``evict``'s tokens or states): an ``int`` (not a ``bool``) >= 0 of any size; more
    than there is means all of it.

    >>> is_amount(0), is_amount(1 << 70), is_amount(-1), is_amount(2.0)
    (True, True, False, False)
    """
    return type(x) is int and x >= 0


def is_shape(x: object) -> bool:
    """A tensor shape argument: a ``tuple`` of counts >= 1 (the empty tuple is a scalar's shape)."""
    return type(x) is tuple and all(is_count(d) for d in x)


def is_page_size(x: object, grain: int) -> bool:
    """A cache's page size over an allocator whose pages are ``grain`` tokens: a count that ``grain`` divides."""
    return is_count(x) and isinstance(x, int) and x % grain == 0


def is_window(x: object, swa: bool) -> bool:
    """A sliding-window length: ``None`` (no window), or a count >= 1 when the KV allocator keeps SWA slots."""
    return x is None or (swa and is_count(x))


def is_owner(x: object) -> bool:
    """An owner: an :class:`Owner` of an ``OwnerKind`` with an id >= 0 (an int, not a bool) whose component is
    set exactly when it is a tree node's, and then a ``Component``."""
    if not isinstance(x, Owner) or not isinstance(x.kind, OwnerKind) or not is_count(x.ident, least=0):
        return False
    if x.kind is OwnerKind.NODE:
        return isinstance(x.component, Component)
    return x.component is None


def inv_domain_enforced(inside: bool, error: BaseException | None) -> bool:
    """The law at a domain's edge: a call ``inside`` its domain raised nothing; one outside raised a typed
    ``KVLedgerError`` (an accepted call outside, or an untyped exception, breaks it)."""
    if inside:
        return error is None
    return isinstance(error, KVLedgerError)


def inv_malformed_refused(error: BaseException | None) -> bool:
    """The law for an argument outside its domain whatever the state (an id no pool has, an int of the wrong type
    or past int64, a tensor that is no ids): refused with a typed error that is no verdict on stored data. An
    ``IntegrityError`` says the slots hold the wrong contents; given for an argument no contents can match, it
    sends whoever reads it after a corruption that is not there.

    >>> from kvledger.spec.errors import IntegrityError, InvalidArgument
    >>> inv_malformed_refused(InvalidArgument("verify", "mamba", (), "value -1")), inv_malformed_refused(None)
    (True, False)
    >>> inv_malformed_refused(IntegrityError("verify: slot 3 holds 7, not 2**63"))
    False
    """
    return isinstance(error, KVLedgerError) and not isinstance(error, IntegrityError)


IDS_DTYPES = ("int64", "int32", "int16", "int8", "uint64", "uint32", "uint16", "uint8")
"""The dtypes a tensor of ids (slot ids, pages, rows, token ids, positions) may come in: any integer dtype, whose
values are the ids (a uint64 one up to int64's end). ``bool`` is no integer dtype here: a mask names positions."""


def inv_dtype_blind(as_int64: object, as_other: object) -> bool:
    """The law for ids given in another dtype of ``IDS_DTYPES`` that holds their values: the call does what it does
    with the same ids as int64 (``as_int64``, ``as_other``: what each did, as the same kind of record: the error's
    class or the answer, and the state after). A dtype is how a caller keeps ids, never which slots they name: torch
    reads a uint8 index as a mask and takes no int16 one, so a pool that indexes before it converts breaks this.

    >>> inv_dtype_blind(("accepted", (3, 4)), ("accepted", (3, 4))), inv_dtype_blind((None, (3,)), ("NotOwner", (3,)))
    (True, False)
    """
    return as_int64 == as_other


def is_id(x: object, size: int) -> bool:
    """A slot, row or state id of a pool of ``size`` ids: an ``int`` (not a ``bool``) in ``[0, size)``."""
    return is_count(x, least=0) and isinstance(x, int) and x < size


def is_tokens(xs: object) -> bool:
    """Token ids (a key's, a request's): a list or tuple of ``int`` s (not ``bool`` s) >= 0 that an int64 holds.

    >>> is_tokens([1, 2]), is_tokens((0,)), is_tokens([1, -1]), is_tokens([True]), is_tokens([1.0]), is_tokens("ab")
    (True, True, False, False, False, False)
    """
    return type(xs) in (list, tuple) and all(is_count(x, least=0) for x in xs)  # type: ignore[attr-defined]
