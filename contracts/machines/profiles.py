"""Hypothesis profiles shared by the test suite, the pytest plugin and ``kvledger check``.

* ``ci`` — quick and derandomised (the same examples every run), no deadline.
* ``thorough`` — many more examples and longer programs, random seeds.
* ``dev`` — Hypothesis' defaults without a deadline.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings

PROFILES = ("ci", "thorough", "dev")


def register_profiles() -> None:
    """Register the kvledger profiles with Hypothesis (idempotent)."""
    base = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    settings.register_profile("ci", base, max_examples=60, stateful_step_count=30, derandomize=True)
    settings.register_profile("thorough", base, max_examples=1000, stateful_step_count=60)
    settings.register_profile("dev", base)
