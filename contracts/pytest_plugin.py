"""The kvledger pytest plugin (entry point ``kvledger``), inactive unless asked.

``pytest --kvledger-contracts=on`` (or ``slow``; or ``KVLEDGER_CONTRACTS`` in
the environment) attaches the contracts to the reference implementation for
the whole run, before any test module is imported. ``--kvledger-profile``
picks a Hypothesis profile (``ci``, ``thorough``, ``dev``).
"""

from __future__ import annotations

import pytest
from hypothesis import settings

from kvledger.contracts import bindings
from kvledger.contracts.profiles import PROFILES, register_profiles


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kvledger")
    group.addoption(
        "--kvledger-contracts",
        choices=bindings.LEVELS,
        default=None,
        help="attach kvledger contracts to the reference implementation (default: $KVLEDGER_CONTRACTS or off)",
    )
    group.addoption(
        "--kvledger-profile",
        choices=PROFILES,
        default=None,
        help="Hypothesis profile registered by kvledger (ci, thorough, dev)",
    )


def pytest_configure(config: pytest.Config) -> None:
    register_profiles()
    level = config.getoption("--kvledger-contracts") or bindings.level_from_env()
    bindings.install(level)
    profile = config.getoption("--kvledger-profile")
    if profile:
        settings.load_profile(profile)


def pytest_report_header(config: pytest.Config) -> str:
    return f"kvledger: contracts {bindings.current_level()}"


def pytest_unconfigure(config: pytest.Config) -> None:
    bindings.uninstall()
