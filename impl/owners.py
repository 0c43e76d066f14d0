"""Owner tags: how the reference implementation writes an owner into a tensor.

Each pool keeps one ``int64`` tag per slot (``FREE_TAG`` when free). A tag
packs an :class:`~kvledger.spec.types.Owner` as ``kind << 60 | component << 56
| ident`` so ownership checks are one vectorised comparison, and the
abstraction function can decode a whole pool in one pass.
"""

from __future__ import annotations

from kvledger.spec.errors import InvalidArgument
from kvledger.spec.types import Component, Owner, OwnerKind

FREE_TAG = 0
RESERVED_TAG = -1
"""Tag of a slot that is never handed out (the padding slot 0 of a token pool)."""

_KIND_CODE = {OwnerKind.REQUEST: 1, OwnerKind.NODE: 2, OwnerKind.SESSION: 3}
_KIND_OF = {v: k for k, v in _KIND_CODE.items()}
_COMP_CODE = {None: 0, Component.FULL: 1, Component.SWA: 2, Component.MAMBA: 3}
_COMP_OF = {v: k for k, v in _COMP_CODE.items()}
_IDENT_BITS = 56
_NODE_KIND = _KIND_CODE[OwnerKind.NODE]
MAX_IDENT = (1 << _IDENT_BITS) - 1


# NOTE: keyed by the members' values: hashing a string costs less than an enum member's Python-level ``__hash__``
_KIND_BY_VALUE = {k._value_: v for k, v in _KIND_CODE.items()}
_COMP_BY_VALUE = {c._value_: v for c, v in _COMP_CODE.items() if c is not None}


def encode(owner: Owner, op: str = "encode", where: str = "owner") -> int:
    """The tag of ``owner`` (always > 0); ``InvalidArgument`` naming ``op`` if it is not an owner a tag can hold.

    An owner is an :class:`Owner` of an ``OwnerKind``, an int id in ``[0, MAX_IDENT]`` and a
    ``Component`` or ``None``: ``None``, another object, a float or bool id, a negative or huge
    id are refused, so no entry point that encodes its owner first can take one.
    """
    try:
        ident = owner.ident
        comp = owner.component
        kind = _KIND_BY_VALUE[owner.kind._value_]
        code = 0 if comp is None else _COMP_BY_VALUE[comp._value_]
    except (AttributeError, KeyError, TypeError):
        raise InvalidArgument(op, where, (), f"owner must be an Owner, got {owner!r}") from None
    if type(owner) is not Owner and not isinstance(owner, Owner):
        raise InvalidArgument(op, where, (), f"owner must be an Owner, got {type(owner).__name__} {owner!r}")
    if (kind == _NODE_KIND) != (code != 0):
        need = (
            "a tree node's owner names its component"
            if kind == _NODE_KIND
            else "only a tree node's owner names a component"
        )
        raise InvalidArgument(op, where, (), f"owner {owner}: {need}")
    if type(ident) is not int or not 0 <= ident <= MAX_IDENT:
        if type(ident) is not int:  # NOTE: a bool or another int subclass too (``spec.domains.is_count``)
            raise InvalidArgument(op, where, (), f"owner {owner!r}: id must be an int, got {type(ident).__name__}")
        raise InvalidArgument(op, where, (), f"owner id {ident} of {owner} outside [0, {MAX_IDENT}]")
    return (kind << 60) | (code << _IDENT_BITS) | ident


_NODE_FULL = (_KIND_CODE[OwnerKind.NODE] << 60) | (_COMP_CODE[Component.FULL] << _IDENT_BITS)


def node_tag(ident: int) -> int:
    """``encode(node(ident, FULL))``, the tag of the full KV slots radix node ``ident`` holds, built directly."""
    if type(ident) is not int or not 0 <= ident <= MAX_IDENT:
        raise InvalidArgument("node_tag", "owner", (), f"node id {ident!r:.40} is not an int in [0, {MAX_IDENT}]")
    return _NODE_FULL | ident


def decode(tag: int) -> Owner | None:
    """The owner a tag stands for; ``None`` for a free or reserved slot; ``InvalidArgument`` for what no
    ``encode`` wrote (not an int64, an unknown kind or component, a component on a request's or a session's
    tag, or none on a tree node's)."""
    if type(tag) is not int or not _MIN_TAG <= tag <= _MAX_TAG:
        raise InvalidArgument("decode", "owner", (), f"tag {tag!r:.40} is not an int64 owner tag")
    if tag <= 0:
        return None
    kind, comp = _KIND_OF.get(tag >> 60), (tag >> _IDENT_BITS) & 0xF
    if kind is None or comp not in _COMP_OF or (kind is OwnerKind.NODE) != (comp != 0):
        # NOTE: only a tree node's tag names a component, and it always does (``encode``)
        raise InvalidArgument("decode", "owner", (), f"tag {tag} names no owner kind and component")
    return Owner(kind, tag & MAX_IDENT, _COMP_OF[comp])


_MIN_TAG, _MAX_TAG = -(1 << 63), (1 << 63) - 1
