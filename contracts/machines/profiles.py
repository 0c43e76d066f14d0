"""Hypothesis profiles shared by the test suite, the pytest plugin and ``kvledger check``.

* ``check`` — ``kvledger check``'s default: the ``ci`` profile's settings at ``CHECK_EXAMPLES`` (100)
  examples per model, not 60. The command spreads its suites' models over one worker process per core, so
  on the project's 2-core machine it takes less wall time than ``ci`` in one process (issue 19's thirteenth
  round: 47.9 s against 54.0 s, measured in the same minutes; two workers there run about 1.6 times the
  examples of one, not twice, so 100 and not 120).
* ``ci`` — quick and derandomised (the same examples every run), no deadline, and no targeting phase: at
  60 examples Hypothesis would spend up to half of them hill-climbing on one example's last steps (measured
  in docs/measured.md, issue 19's tenth round: rules that never ran in a run, over three seeds, 31 -> 7 with the
  fair schedule).
* ``thorough`` — many more examples and longer programs, random seeds.
* ``dev`` — Hypothesis' defaults without a deadline.

The names and :func:`profile_from_env` import nothing but the standard
library, so the pytest plugin can validate ``KVLEDGER_HYPOTHESIS_PROFILE``
without importing Hypothesis; :func:`register_profiles` imports it.
"""

from __future__ import annotations

import os

PROFILES = ("check", "ci", "thorough", "dev")
CHECK_EXAMPLES = 100
"""Examples per model of the ``check`` profile (``kvledger check``'s default)."""
ENV_VAR = "KVLEDGER_HYPOTHESIS_PROFILE"


def profile_from_env(default: str | None = None) -> str | None:
    """The profile ``KVLEDGER_HYPOTHESIS_PROFILE`` names (``default`` when unset or empty).

    An unknown name raises ``ValueError`` naming the known profiles: a typo
    never silently falls back to another profile.
    """
    raw = os.environ.get(ENV_VAR, "").strip()
    if not raw:
        return default
    if raw not in PROFILES:
        raise ValueError(f"{ENV_VAR}={raw!r}: unknown Hypothesis profile; expected one of {', '.join(PROFILES)}")
    return raw


def register_profiles() -> None:
    """Register the kvledger profiles with Hypothesis (idempotent)."""
    from hypothesis import HealthCheck, Phase, settings

    base = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    untargeted = [phase for phase in Phase if phase is not Phase.target]
    settings.register_profile("ci", base, max_examples=60, stateful_step_count=30, derandomize=True, phases=untargeted)
    settings.register_profile("check", settings.get_profile("ci"), max_examples=CHECK_EXAMPLES)
    settings.register_profile("thorough", base, max_examples=1000, stateful_step_count=60)
    settings.register_profile("dev", base)
