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
    # NOTE: kept=False: the search finds B1 and saves it, not B1's kept program
    # NOTE: a short shrink: the program is asserted to be kept and replayed, not to be the shortest
    spec = RunSpec(faults=("B1",), database=str(tmp_path / "db"), kept=False, shrink_for=3.0)
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


def test_a_timed_campaign_stops_its_running_jobs_when_time_is_up() -> None:
    """``--for`` bounds the campaign, not only the hand-out of jobs: a job running when time is up starts no
    new example (a ``thorough`` job would otherwise run its 1,000 examples to the end)."""
    spec = RunSpec(profile="thorough")
    results = run_campaign(spec, jobs_for([("pools", "token")], fresh_seeds(random.Random(2))), 2, seconds=2.0)
    assert results and all(r.ok and r.cut for _, r in results), [(r.examples, r.cut) for _, r in results]
    assert all(r.examples < 1000 for _, r in results)


def test_a_run_past_its_stop_time_starts_no_example() -> None:
    import time

    from hypothesis import settings

    from kvledger.contracts.machines.profiles import register_profiles
    from kvledger.contracts.machines.runner import run_machine
    from kvledger.contracts.machines.suites import SUITES

    register_profiles()
    suite = SUITES["pools"]
    machine = suite.models["token"]()
    run = run_machine("pools", "token", machine, list(suite.rules), settings.get_profile("ci"), 0, stop_at=time.time())
    assert run.ok and run.cut and run.examples == 0 and run.steps == 0
    whole = run_machine(
        "pools", "token", machine, list(suite.rules), settings(settings.get_profile("ci"), max_examples=3)
    )
    assert whole.ok and not whole.cut and whole.examples == 3


def test_run_job_in_process_reports_its_seed() -> None:
    out = run_job(RunSpec(examples=2, steps=5), Job("pools", "token", 3))
    assert out["seed"] == 3 and out["ok"] and out["examples"] >= 1


def test_campaign_settings_are_read_strictly() -> None:
    from kvledger.contracts.machines.campaign_tests import parse_campaign

    spec, jobs = parse_campaign("suites=pools models=token seeds=3:5 faults=b1 examples=2")
    assert spec.faults == ("B1",) and spec.examples == 2
    assert jobs == [Job("pools", "token", 3), Job("pools", "token", 4)]
    for bad in ("suites=nope", "seeds=5:5", "seeds=x", "color=red", "models=nope"):
        with pytest.raises(ValueError, match="KVLEDGER_CAMPAIGN"):
            parse_campaign(bad)


@pytest.mark.slow
def test_a_campaign_runs_on_pytest_xdist_workers(tmp_path: Path) -> None:
    """The distributed path, tested on one machine with local workers (``-n 2``)."""
    import os
    import subprocess
    import sys

    pytest.importorskip("xdist")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "KVLEDGER_"))}
    env["KVLEDGER_CAMPAIGN"] = "suites=cache models=full seeds=0:2 faults=B1"
    cmd = [sys.executable, "-m", "pytest", "--pyargs", "kvledger.contracts.machines.campaign_tests"]
    proc = subprocess.run(
        [*cmd, "-n", "2", "-p", "no:cacheprovider", "-q", "--rootdir", str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]  # B1 on: the campaign fails, with the law and the program
    assert "inv_lru_detached" in out and "[gw" in out, out[-3000:]  # run on an xdist worker


def test_check_runs_a_campaign_from_the_command_line() -> None:
    import json

    from typer.testing import CliRunner

    from kvledger.contracts.cli import app

    runner = CliRunner()
    args = ["check", "--suite", "pools", "--model", "token", "--jobs", "2", "--seeds", "3", "--examples", "2", "--json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output[result.output.index("{") :])
    assert payload["campaign"]["jobs"] == 3 and sorted(payload["results"][0]["seeds"]) == [0, 1, 2]
    bad = runner.invoke(app, ["check", "--for", "soon"])
    assert bad.exit_code == 2 and "positive duration" in bad.output


def test_a_campaign_checks_an_adapter_from_the_command_line() -> None:
    """``--adapter`` with ``--jobs``/``--seeds``: each worker loads the adapter by its spec; a law it breaks stops
    the campaign with the adapter's regression program, and the laws its capabilities lack are reported skipped."""
    import json

    from typer.testing import CliRunner

    from kvledger.contracts.cli import app

    runner = CliRunner()
    base = ["check", "--adapter", "reference", "--model", "full", "--jobs", "2", "--seeds", "2", "--json"]
    held = runner.invoke(app, [*base, "--examples", "2", "--set-aside", "lru"])
    assert held.exit_code == 0, held.output
    payload = json.loads(held.output[held.output.index("{") :])
    assert payload["campaign"]["jobs"] == 2
    (row,) = payload["results"]
    assert row["suite"] == "cache" and sorted(row["seeds"]) == [0, 1] and row["examples"] == 4
    assert "inv_lru_detached" in row["skipped"] and "inv_lru_detached" not in row["rules"]
    # NOTE: the law and the program's form are asserted, not its length (a whole shrink through the adapter: 30 s)
    broken = runner.invoke(app, [*base, "--fault", "B1", "--examples", "30", "--shrink-for", "5s"])
    assert broken.exit_code == 1, broken.output
    failed = json.loads(broken.output[broken.output.index("{") :])
    (v,) = failed["violations"]
    assert v["rule"] in FAULTS["B1"].laws, v
    program = failed["results"][0]["violation"]["program"]
    assert "load_factory('reference')" in program, program


def test_campaign_settings_name_an_adapter() -> None:
    from kvledger.contracts.machines.campaign_tests import parse_campaign

    spec, jobs = parse_campaign("adapter=reference set_aside=lru seeds=0:2 models=full")
    assert (spec.adapter, spec.system, spec.set_aside) == ("reference", False, ("lru",))
    assert jobs == [Job("cache", "full", 0), Job("cache", "full", 1)]
    spec, _ = parse_campaign("adapter=reference suites=system seeds=0:1 models=full")
    assert spec.system
    for bad in ("adapter=reference suites=pools", "adapter=reference suites=cache,system", "set_aside=lru"):
        with pytest.raises(ValueError, match="KVLEDGER_CAMPAIGN"):
            parse_campaign(bad)


def test_the_default_check_spreads_the_same_runs_over_worker_processes() -> None:
    """With no ``--seed``, the models run over worker processes are the very runs one process makes (the profile's
    derandomised draws): the same examples and steps per model, and the same JSON fields, with the campaign's
    added. (A worker that drew its own seed would run other programs: a result that depends on the core count.)"""
    import json

    from typer.testing import CliRunner

    from kvledger.contracts.cli import app

    runner = CliRunner()
    base = ["check", "--suite", "system", "--examples", "4", "--json"]
    alone = runner.invoke(app, [*base, "--jobs", "1"])
    spread = runner.invoke(app, [*base, "--jobs", "3"])
    assert alone.exit_code == 0 and spread.exit_code == 0, alone.output + spread.output
    one = json.loads(alone.output[alone.output.index("{") :])
    many = json.loads(spread.output[spread.output.index("{") :])
    assert "campaign" not in one and many["campaign"]["workers"] == 3
    assert set(one) <= set(many), set(one) - set(many)
    runs = {(r["suite"], r["model"]): (r["examples"], r["steps"]) for r in one["results"]}
    assert runs == {(r["suite"], r["model"]): (r["examples"], r["steps"]) for r in many["results"]}
    assert [r["seeds"] for r in many["results"]] == [[None]] * 3
    assert [(r["suite"], r["model"]) for r in many["results"]] == list(runs)  # NOTE: in the jobs' order


def test_the_default_check_runs_the_check_profile_over_one_worker_per_core() -> None:
    """``kvledger check``'s defaults: the ``check`` profile (``CHECK_EXAMPLES`` examples a model, more than
    ``ci``'s) and ``--jobs`` one worker per core, at most one per model (one model: in this process)."""
    import json
    import os

    from hypothesis import settings
    from typer.testing import CliRunner

    from kvledger.contracts.cli import app, auto_workers
    from kvledger.contracts.machines.profiles import CHECK_EXAMPLES, register_profiles

    register_profiles()
    assert settings.get_profile("check").max_examples == CHECK_EXAMPLES > settings.get_profile("ci").max_examples
    cores = len(os.sched_getaffinity(0))
    assert auto_workers(1) == 1 and auto_workers(1000) == cores and auto_workers(2) == min(cores, 2)
    result = CliRunner().invoke(app, ["check", "--suite", "system", "--model", "full", "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output[result.output.index("{") :])
    assert payload["profile"] == "check" and "campaign" not in payload
    assert [r["examples"] for r in payload["results"]] == [CHECK_EXAMPLES]
