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

from kvledger.impl.arguments import check_ids_tensor, check_int, check_range
from kvledger.spec.errors import IntegrityError, InvalidArgument

_M32 = 0xFFFFFFFF


def fingerprint(tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """:func:`kvledger.spec.prefix.fingerprint`, element-wise on integer tensors (every intermediate fits)."""
    for name, t in (("tokens", tokens), ("positions", positions)):
        if not isinstance(t, torch.Tensor) or t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
            raise InvalidArgument("fingerprint", "kv", (), f"{name} must be an integer tensor, got {t!r:.60}")
    x = (tokens.to(torch.int64) * 0x2545F491 + positions.to(torch.int64) * 0x4F6CDD1D + 0x6A09E667) & _M32
    x = x ^ (x >> 16)
    x = (x * 0x045D9F3B) & _M32
    x = x ^ (x >> 16)
    return 1 + x % 0xFFFFFF


def fingerprint_one(token: int, position: int) -> int:
    """The scalar fingerprint (equal to ``kvledger.spec.prefix.fingerprint``)."""
    check_int("fingerprint_one", "kv", "token", token)
    check_int("fingerprint_one", "kv", "position", position)
    return int(fingerprint(torch.tensor([token]), torch.tensor([position]))[0])


def verify(what: str, stored: torch.Tensor, slots: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor) -> None:
    """Raise ``IntegrityError`` naming the first slot whose fingerprint is not ``(token, position)``'s.

    ``slots``: a 1-D integer tensor of indices into ``stored``, as many as ``tokens`` and ``positions``.
    """
    idx = check_ids_tensor("verify", what, "slots", slots, stored.device)
    check_range("verify", what, "slot", idx, 0, stored.numel())
    expect = fingerprint(tokens, positions)
    if not idx.numel() == tokens.numel() == positions.numel():
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
