"""Fingerprints: what a slot's data must be for the data-integrity rule.

The reference implementation keeps, beside every KV/SWA slot and every Mamba
state, an ``int64`` fingerprint of what it holds. Writing the KV of token
``t`` at position ``p`` writes ``fingerprint(t, p)``; a match verifies that the
slots it returns hold exactly the fingerprints of the matched tokens. A double
allocation or a use-after-free shows up as a wrong fingerprint, not only as a
count. The formula is :func:`kvledger.spec.prefix.fingerprint`, vectorised.
"""

from __future__ import annotations

import torch

from kvledger.impl.arguments import MAX_TOKEN, check_ids_tensor, check_int, check_range
from kvledger.spec.errors import IntegrityError, InvalidArgument

_M32 = 0xFFFFFFFF


def fingerprint(tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """:func:`kvledger.spec.prefix.fingerprint`, element-wise: ``tokens`` and ``positions`` 1-D integer tensors of one
    length with values in ``[0, 2**31)`` (the spec's domain), else ``InvalidArgument`` naming ``fingerprint``."""
    return fingerprint_unchecked(*_checked("fingerprint", "kv", tokens, positions))


def _checked(op: str, where: str, tokens: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``tokens`` and ``positions`` checked as :func:`fingerprint` takes them, refused naming ``op``."""
    t = check_ids_tensor(op, where, "tokens", tokens)
    p = check_ids_tensor(op, where, "positions", positions, t.device)
    if t.numel() != p.numel():
        raise InvalidArgument(op, where, (), f"{t.numel()} tokens, {p.numel()} positions")
    check_range(op, where, "token id", t, 0, MAX_TOKEN)
    check_range(op, where, "position", p, 0, MAX_TOKEN)
    return t, p


def fingerprint_unchecked(tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """:func:`fingerprint` of tensors already checked (the allocators' writes check them first): no checks."""
    x = (tokens.to(torch.int64) * 0x2545F491 + positions.to(torch.int64) * 0x4F6CDD1D + 0x6A09E667) & _M32
    x = x ^ (x >> 16)
    x = (x * 0x045D9F3B) & _M32
    x = x ^ (x >> 16)
    return 1 + x % 0xFFFFFF


def fingerprint_one(token: int, position: int) -> int:
    """The scalar fingerprint (equal to ``kvledger.spec.prefix.fingerprint``)."""
    check_int("fingerprint_one", "kv", "token", token, 0, MAX_TOKEN)
    check_int("fingerprint_one", "kv", "position", position, 0, MAX_TOKEN)
    return int(fingerprint_unchecked(torch.tensor([token]), torch.tensor([position]))[0])


def verify(what: str, stored: torch.Tensor, slots: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor) -> None:
    """Raise ``IntegrityError`` naming the first slot whose fingerprint is not ``(token, position)``'s.

    ``slots``: a 1-D integer tensor of indices into ``stored``, as many as ``tokens`` and ``positions``.
    """
    idx = check_ids_tensor("verify", what, "slots", slots, stored.device)
    check_range("verify", what, "slot", idx, 0, stored.numel())
    expect = fingerprint_unchecked(*_checked("verify", what, tokens, positions))  # NOTE: 1-D, one length, in range
    if idx.numel() != tokens.numel():
        raise InvalidArgument("verify", what, (), f"{idx.numel()} slots for {tokens.numel()} tokens")
    slots = idx
    got = stored[slots]
    bad = got != expect
    if bool(bad.any()):
        i = int(torch.nonzero(bad)[0])
        raise IntegrityError(
            f"{what}: slot {int(slots[i])} should hold token {int(tokens[i])} at position {int(positions[i])} "
            f"(fingerprint {int(expect[i])}) but holds {int(got[i])}; {int(bad.sum())} of {slots.numel()} slots wrong "
            "(double allocation or use after free?)"
        )
