"""Argument checks shared by every public entry point: ints and ids, token ids, index tensors.

Each check raises a typed :class:`~kvledger.spec.errors.KVLedgerError` that
names the call (``op``), the pool or structure (``where``) and the culprit
value, and changes nothing: entry points run them before they mutate
(STYLE.md rule 6). They cost O(arguments): an ``isinstance`` and a compare
for a scalar, one C-level conversion for a token sequence, one
``aminmax`` for an index tensor; no Python loop over token or slot ids.
Owners are checked where they are encoded (:func:`kvledger.impl.owners.encode`).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

import torch

from kvledger.spec.errors import InvalidArgument, OutOfRange


def _what(value: object) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


def check_int(op: str, where: str, name: str, value: object, lo: int = 0, hi: int | None = None) -> int:
    """``value`` as an int in ``[lo, hi)`` (``hi=None``: no upper bound); ``InvalidArgument`` for a non-int (a
    bool, a float, ``None``, an int subclass: ``spec.domains`` counts only ``int`` itself, whose comparisons and
    arithmetic no subclass can change), ``InvalidArgument`` naming ``name`` when it is out of range."""
    if type(value) is not int:
        raise InvalidArgument(op, where, (), f"{name} must be an int, got {_what(value)}")
    if value < lo or (hi is not None and value >= hi):
        bound = f"[{lo}, {hi})" if hi is not None else f">= {lo}"
        raise InvalidArgument(op, where, (), f"{name} {value} outside {bound}")
    return value


def check_id(op: str, where: str, name: str, value: object, lo: int, hi: int) -> int:
    """``check_int`` for the id of a slot, row or state: out of ``[lo, hi)`` raises ``OutOfRange`` naming it."""
    if type(value) is not int:
        value = check_int(op, where, name, value)  # NOTE: raises its type refusal
    if not lo <= value < hi:
        raise OutOfRange(op, where, [value], f"{name} {value} outside [{lo}, {hi})")
    return value


def check_device(op: str, where: str, device: object) -> torch.device:
    """``device`` (a ``torch.device`` or its name) as a ``torch.device``; ``InvalidArgument`` if it names none."""
    if not isinstance(device, str | torch.device):
        raise InvalidArgument(op, where, (), f"device must be a str or torch.device, got {_what(device)}")
    try:
        return torch.device(device)
    except (RuntimeError, ValueError, TypeError) as e:
        raise InvalidArgument(op, where, (), f"device {device!r}: {e}") from None


MAX_TOKEN = 1 << 31
"""Token ids and positions lie below this: the domain of ``spec.prefix.fingerprint`` (31-bit token and position;
past it torch's int64 arithmetic and the spec's would part) and of a trace's ``tokens``."""


def check_tokens(op: str, where: str, tokens: object, *, empty: bool = True, hi: int = MAX_TOKEN) -> tuple[int, ...]:
    """Token ids as a tuple of ints in ``[0, hi)`` (``MAX_TOKEN`` unless told): a sequence of ints (not a string,
    not floats, not bools).

    One C-level conversion (``array("q")``), one ``min`` and one ``max``: no Python loop over the ids.
    ``empty=False`` refuses an empty sequence.
    """
    if isinstance(tokens, str | bytes | bytearray | memoryview) or not isinstance(tokens, Sequence | array):
        raise InvalidArgument(op, where, (), f"token ids must be a sequence of ints, got {_what(tokens)}")
    try:
        ids = tokens if type(tokens) is array and tokens.typecode == "q" else array("q", tokens)
    except (TypeError, OverflowError) as e:
        raise InvalidArgument(op, where, (), f"token ids must be ints in [0, 2**63) ({e})") from None
    if ids is not tokens and has_bool(tokens):
        raise InvalidArgument(op, where, (), "token ids must be ints, not bools (True/False)")
    if not ids:
        if not empty:
            raise InvalidArgument(op, where, (), "needs at least one token")
        return ()
    if min(ids) < 0:
        raise InvalidArgument(op, where, (), f"token id {min(ids)} is negative")
    if max(ids) >= hi:
        raise InvalidArgument(op, where, (), f"token id {max(ids)} outside [0, {hi})")
    return tuple(ids)


def has_bool(seq: object) -> bool:
    """Whether sequence ``seq`` holds a bool (an int to ``array``, not a token id): one C-level pass over the types."""
    return bool in set(map(type, seq))  # type: ignore[call-overload]


def not_ids(t: torch.Tensor) -> str | None:
    """Why tensor ``t`` cannot be read as 1-D int64 ids (a key or slot ids), or ``None`` if it can."""
    if t.layout != torch.strided or t.is_meta or t.is_quantized:
        return f"a {t.layout} tensor" if t.layout != torch.strided else "a meta or quantized tensor"
    dt = t.dtype
    if t.dim() != 1 or dt.is_floating_point or dt.is_complex or dt == torch.bool:
        return f"{dt} of {t.dim()} dimensions"
    if dt == torch.uint64 and t.numel() and int(t.view(torch.int64).min()) < 0:
        return "uint64 values past int64"
    return None


def int_ids(op: str, where: str, t: torch.Tensor) -> torch.Tensor:
    """Dense tensor ``t`` of any integer dtype (the ids domain, as ``not_ids`` states it) as int64 ids; a float,
    complex or bool one raises ``InvalidArgument``, a uint64 one with values past int64 ``OutOfRange`` naming them.

    NOTE: converted before any index: torch reads a uint8 or bool index as a mask, and indexes with no other
    narrow dtype; an int32 tensor is converted too (one dtype below here, whatever the caller keeps).
    """
    dt = t.dtype
    if dt is torch.int64:
        return t
    if dt.is_floating_point or dt.is_complex or dt is torch.bool:
        raise InvalidArgument(op, where, (), f"index dtype {dt}, expected an integer dtype")
    if dt is torch.uint64 and t.numel() and int(t.view(torch.int64).min()) < 0:
        raise OutOfRange(op, where, t[t.view(torch.int64) < 0].tolist(), "ids past int64 in a uint64 tensor")
    return t.to(torch.int64)


def check_ids_tensor(op: str, where: str, name: str, t: object, device: torch.device | None = None) -> torch.Tensor:
    """``t`` as a 1-D int64 tensor (strided, integer, on ``device`` when given); may be empty; values unchecked."""
    if not isinstance(t, torch.Tensor):
        raise InvalidArgument(op, where, (), f"{name} must be a torch.Tensor, got {_what(t)}")
    why = not_ids(t)
    if why is not None:
        raise InvalidArgument(op, where, (), f"{name} must be a 1-D integer tensor, got {why}")
    if device is not None and t.device != device:
        raise InvalidArgument(op, where, (), f"{name} on {t.device}, expected {device}")
    return int_ids(op, where, t)


def check_range(op: str, where: str, name: str, t: torch.Tensor, lo: int, hi: int) -> None:
    """Raise ``OutOfRange`` naming the values of int64 tensor ``t`` outside ``[lo, hi)``."""
    if t.numel():
        a, b = torch.aminmax(t)
        if int(a) < lo or int(b) >= hi:
            raise OutOfRange(op, where, t[(t < lo) | (t >= hi)].tolist(), f"{name} outside [{lo}, {hi})")
