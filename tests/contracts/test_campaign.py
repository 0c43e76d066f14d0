"""Campaigns: jobs spread over worker processes, merged, stopped at the first violation or when time is up."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from kvledger.contracts.machines.campaign import (
    Job,
    Progress,
    RunSpec,
    fresh_seeds,
    jobs_for,
    parse_duration,
    run_campaign,
    run_job,
    seeds_for,
)
from kvledger.impl.faults import FAULTS


@pytest.mark.parametrize(("text", "seconds"), [("90", 90), ("90s", 90), ("30m", 1800), ("1.5h", 5400)])
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "0", "-3m", "10x", "m", "nan"])
def test_bad_durations_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="positive duration"):
        parse_duration(text)


def test_jobs_are_every_pair_for_every_seed() -> None:
    jobs = list(jobs_for([("pools", "token"), ("cache", "full")], seeds_for(5, 2)))
    assert jobs == [
        Job("pools", "token", 5),
        Job("cache", "full", 5),
        Job("pools", "token", 6),
        Job("cache", "full", 6),
    ]


def test_a_campaign_runs_every_job_on_workers_and_merges_the_results() -> None:
    seen: list[Progress] = []
    spec = RunSpec(examples=3, steps=10)
    results = run_campaign(spec, jobs_for([("pools", "token"), ("pools", "paged")], [0, 1]), 2, on_progress=seen.append)
    assert sorted((j.model, j.seed) for j, _ in results) == [("paged", 0), ("paged", 1), ("token", 0), ("token", 1)]
    assert all(r.ok and r.examples >= 1 for _, r in results)
    assert [p.done for p in seen] == [1, 2, 3, 4] and seen[-1].examples == sum(r.examples for _, r in results)


def test_a_campaign_stops_at_the_first_violation_and_keeps_its_counterexample(tmp_path: Path) -> None:
    spec = RunSpec(faults=("B1",), database=str(tmp_path / "db"))
    results = run_campaign(spec, jobs_for([("cache", "full")], range(50)), 2)
    failing = [r for _, r in results if not r.ok]
    assert failing and len(results) < 50, len(results)
    assert failing[0].violation is not None and failing[0].violation.rule in FAULTS["B1"].laws
    assert failing[0].violation.steps  # shrunk, in the worker that found it
    assert any((tmp_path / "db").rglob("*")), "the failing example was not saved to --db"
    again = run_job(spec, Job("cache", "full", 10_000))  # another seed: the saved failure is replayed first
    assert not again["ok"] and again["examples"] <= 3, again["examples"]


def test_a_timed_campaign_draws_fresh_seeds_until_time_is_up() -> None:
    spec = RunSpec(examples=1, steps=2)
    seeds = fresh_seeds(random.Random(1))
    results = run_campaign(spec, jobs_for([("pools", "token")], seeds), 2, seconds=3.0)
    # NOTE: the jobs never run out (fresh seeds without end), so only the clock can have ended the campaign
    assert results and len({j.seed for j, _ in results}) == len(results) and all(r.ok for _, r in results)


def test_run_job_in_process_reports_its_seed() -> None:
    out = run_job(RunSpec(examples=2, steps=5), Job("pools", "token", 3))
    assert out["seed"] == 3 and out["ok"] and out["examples"] >= 1
