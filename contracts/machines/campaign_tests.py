"""A campaign as a pytest session: one test per (suite, model, seed) job, for pytest-xdist's workers.

For one machine, ``kvledger check --jobs N`` is enough. For many, run the same
jobs on pytest-xdist's workers, local or remote (``pip install
"kvledger[distributed]"`` on every machine)::

    KVLEDGER_CAMPAIGN="suites=cache,system seeds=0:200 faults=" \\
        pytest --pyargs kvledger.contracts.machines.campaign_tests -p no:cacheprovider \\
        -n 8 --tx 4*ssh=node1//python=/opt/kvl/bin/python --tx 4*ssh=node2//python=/opt/kvl/bin/python

``KVLEDGER_CAMPAIGN`` holds space-separated ``key=value`` fields: ``suites``
and ``models`` (comma-separated; default every one), ``seeds`` (``A:B``, the
half-open range; default ``0:8``), ``profile``, ``examples``, ``steps``,
``contracts``, ``faults`` (comma-separated) and ``db`` (a database path on
each worker); ``adapter`` (an ``--adapter`` spec: the jobs check that engine
adapter in the ``cache`` suite, or in ``system`` with ``suites=system``) and
``set_aside`` (comma-separated capabilities it is checked without). A failing
job fails its test with the law and the shrunk program; ``-x`` stops the
campaign at the first.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import pytest

from kvledger.contracts.machines.campaign import Job, RunSpec, jobs_for, run_job
from kvledger.contracts.machines.profiles import PROFILES
from kvledger.contracts.tiers import LEVELS
from kvledger.impl.faults import FAULTS

KEYS = frozenset(
    {"suites", "models", "seeds", "profile", "examples", "steps", "contracts", "faults", "db", "adapter", "set_aside"}
)


def parse_campaign(text: str) -> tuple[RunSpec, list[Job]]:
    """The run settings and jobs ``KVLEDGER_CAMPAIGN`` names; ``ValueError`` naming the field otherwise."""
    from kvledger.contracts.machines.suites import SUITES

    fields: dict[str, str] = {}
    for part in text.split():
        key, sep, value = part.partition("=")
        if not sep or key not in KEYS:
            raise ValueError(f"KVLEDGER_CAMPAIGN: cannot read {part!r} (expected key=value with a known key)")
        fields[key] = value
    adapter = fields.get("adapter") or None
    suites = [s for s in fields.get("suites", "cache" if adapter else ",".join(SUITES)).split(",") if s]
    for s in suites:
        if s not in SUITES:
            raise ValueError(f"KVLEDGER_CAMPAIGN: unknown suite {s!r}; expected one of {', '.join(SUITES)}")
    if adapter is not None and suites not in (["cache"], ["system"]):
        raise ValueError(f"KVLEDGER_CAMPAIGN: adapter={adapter} checks one suite: suites=cache or suites=system")
    set_aside = tuple(c for c in fields.get("set_aside", "").split(",") if c)
    if set_aside and adapter is None:
        raise ValueError("KVLEDGER_CAMPAIGN: set_aside takes capabilities from an adapter (adapter=...)")
    models = [m for m in fields.get("models", "").split(",") if m]
    lo, sep, hi = fields.get("seeds", "0:8").partition(":")
    if not sep or not lo.isdigit() or not hi.isdigit() or int(hi) <= int(lo):
        raise ValueError(f"KVLEDGER_CAMPAIGN: seeds {fields.get('seeds')!r}: expected A:B with A < B")
    pairs = [(s, m) for s in suites for m in SUITES[s].models if not models or m in models]
    if not pairs:
        raise ValueError(f"KVLEDGER_CAMPAIGN: no model {models} in suites {suites}")
    known = {m for s in suites for m in SUITES[s].models}
    _known("model", models, known)
    _known("profile", [fields.get("profile", "ci")], PROFILES)
    _known("contracts", [fields.get("contracts", "on")], LEVELS)
    faults = tuple(f.upper() for f in fields.get("faults", "").split(",") if f)
    _known("fault", list(faults), FAULTS)
    spec = RunSpec(
        profile=fields.get("profile", "ci"),
        examples=_count(fields, "examples"),
        steps=_count(fields, "steps"),
        contracts=fields.get("contracts", "on"),
        faults=faults,
        database=fields.get("db") or None,
        adapter=adapter,
        system=suites == ["system"],
        set_aside=set_aside,
    )
    return spec, list(jobs_for(pairs, range(int(lo), int(hi))))


def _known(what: str, names: list[str], known: Iterable[str]) -> None:
    """``ValueError`` naming the first of ``names`` that is not one of ``known`` (no unknown name is dropped)."""
    allowed = sorted(known)
    bad = next((n for n in names if n not in allowed), None)
    if bad is not None:
        raise ValueError(f"KVLEDGER_CAMPAIGN: unknown {what} {bad!r}; expected one of {', '.join(allowed)}")


def _count(fields: dict[str, str], key: str) -> int | None:
    """Field ``key`` as an int >= 1 (``None`` when absent); ``ValueError`` naming it otherwise."""
    if key not in fields:
        return None
    text = fields[key]
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"KVLEDGER_CAMPAIGN: {key}={text!r}: expected an integer >= 1")
    return int(text)


SPEC, JOBS = parse_campaign(os.environ.get("KVLEDGER_CAMPAIGN", ""))


@pytest.mark.parametrize("job", JOBS, ids=lambda j: f"{j.suite}-{j.model}-{j.seed}")
def test_job(job: Job) -> None:
    """One job of the campaign: every law holds for this machine and seed."""
    out = run_job(SPEC, job)
    v = out["violation"]
    assert v is None, f"{v['rule']} ({job.suite}/{job.model}, seed {job.seed}):\n{v['message']}\n{v['program']}"
