"""The contract tiers and the environment variables that choose them: light, importable without torch or icontract.

The pytest plugin and the ``kvledger`` command validate their options against
these names before anything heavy is imported;
:mod:`kvledger.contracts.bindings` attaches the tiers.
"""

from __future__ import annotations

import os
from typing import Literal

Level = Literal["off", "on", "slow"]
LEVELS: tuple[Level, ...] = ("off", "on", "slow")
ENV_VAR = "KVLEDGER_CONTRACTS"


def level_from_env(default: Level = "off") -> Level:
    """The tier named by ``KVLEDGER_CONTRACTS`` (``default`` when unset or empty); ``ValueError`` names the tiers."""
    raw = os.environ.get(ENV_VAR, "").strip().lower() or default
    for level in LEVELS:
        if raw == level:
            return level
    given = os.environ.get(ENV_VAR)
    raise ValueError(f"{ENV_VAR}={given!r}: unknown contract tier; expected one of {', '.join(LEVELS)}")
