"""`kvledger check --db PATH`: failures are kept in Hypothesis' example database and replayed first."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from kvledger.contracts.cli import app


def check(db: Path) -> tuple[int, dict[str, object]]:
    # NOTE: --no-kept: B1's kept program would find it before the search, and keeps nothing in the database;
    # --seed: with a database the run's randomness is not derandomised, so without a seed the search is luck.
    # B1 in cache/full: the search finds it within 3 to 61 examples on seeds 0-2, against a budget of 300 (B4 in
    # 60 examples was found or not depending on how the tree's code drew, which no seed fixes across changes)
    args = ["check", "--fault", "B1", "--model", "full", "--examples", "300", "--json", "--db", str(db), "--no-kept"]
    args += ["--seed", "0"]
    result = CliRunner().invoke(app, args)
    return result.exit_code, json.loads(result.output[result.output.index("{") :])


def test_a_failure_is_kept_and_found_again_from_the_database(tmp_path: Path) -> None:
    db = tmp_path / "examples"
    code, first = check(db)
    assert code == 1 and any(db.rglob("*")), first  # the shrunk failure was saved
    code, again = check(db)
    assert code == 1 and again["violations"] == first["violations"], again
    assert again["examples"] <= first["examples"]  # replayed from the database, not searched for again
