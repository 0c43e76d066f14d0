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

from kvledger.spec.errors import IntegrityError

_MASK = (1 << 61) - 1
_A = 0x9E3779B1
_B = 0x85EBCA77


def fingerprint(tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """``((t + 1) * A + (p + 1) * B) mod 2**61 - 1``, element-wise, as int64 (never 0)."""
    t = tokens.to(torch.int64) + 1
    p = positions.to(torch.int64) + 1
    return ((t * _A + p * _B) % _MASK) + 1


def fingerprint_one(token: int, position: int) -> int:
    """The scalar fingerprint, equal to :func:`fingerprint` on one element."""
    return (((token + 1) * _A + (position + 1) * _B) % _MASK) + 1


def verify(what: str, stored: torch.Tensor, slots: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor) -> None:
    """Raise ``IntegrityError`` naming the first slot whose fingerprint is not ``(token, position)``'s."""
    expect = fingerprint(tokens, positions)
    got = stored[slots]
    bad = got != expect
    if bool(bad.any()):
        i = int(torch.nonzero(bad)[0])
        raise IntegrityError(
            f"{what}: slot {int(slots[i])} should hold token {int(tokens[i])} at position {int(positions[i])} "
            f"(fingerprint {int(expect[i])}) but holds {int(got[i])}; {int(bad.sum())} of {slots.numel()} slots wrong "
            "(double allocation or use after free?)"
        )
