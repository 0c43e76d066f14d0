"""Suite-wide set-up: kvledger's Hypothesis profiles, ``ci`` by default (derandomised).

Contracts are switched on by ``--kvledger-contracts=on`` in pyproject's
``addopts`` (the plugin attaches them before any test module is imported).
"""

from __future__ import annotations

import os

from hypothesis import settings

from kvledger.contracts.machines.profiles import register_profiles

pytest_plugins = ["pytester"]  # the plugin's own tests (tests/trace) run child suites

register_profiles()
settings.load_profile(os.environ.get("KVLEDGER_HYPOTHESIS_PROFILE", "ci"))
