"""Held-out trust corpus (issue 17), the command line: bad arguments to every ``kvledger`` subcommand, bad env vars.

Each input is a command line (run in-process through Typer's runner) or a
pytest start with a ``KVLEDGER_*`` variable (a child pytest with the plugin
loaded). A usage error must exit 2 with a message and no traceback; exit 0
(``silent``: garbage accepted, work started) and any other ending
(``traceback``: an exception, or exit 1, which reads as a law violation) are
defects. Inputs that a bug would accept stay cheap anyway: each otherwise
valid command asks for one example or a few operations.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvledger.contracts.cli import app

CHEAP = ["--examples", "1", "--steps", "2", "--suite", "pools"]


@dataclass(frozen=True)
class Line:
    label: str
    args: tuple[str, ...]


def _check(*args: str, cheap: bool = True) -> Line:
    extra = [a for a in CHEAP if a not in args] if cheap else []
    if cheap and "--suite" in args:
        extra = ["--examples", "1", "--steps", "2"]
    return Line(" ".join(("check", *args)), ("check", *args, *extra))


def lines(tmp: Path) -> list[Line]:
    bad_trace = tmp / "no-such-trace.jsonl"
    folder, binary, empty = tmp / "a-folder", tmp / "binary.jsonl", tmp / "empty.jsonl"
    return [
        # check: every option given a value of the wrong type, out of range, unknown, or combined badly
        *(
            _check(*a)
            for a in [
                ("--suite", "pool"),
                ("--suite", ""),
                ("--suite", "POOLS"),
                ("--model", "nonesuch"),
                ("--suite", "pools", "--model", "hybrid"),
                ("--profile", "fast"),
                ("--profile", ""),
                ("--examples", "0"),
                ("--examples", "-3"),
                ("--examples", "1.5"),
                ("--examples", "many"),
                ("--steps", "0"),
                ("--steps", "1e3"),
                ("--seed", "abc"),
                ("--seed", "1.5"),
                ("--seed", "0x10"),
                ("--contracts", "maybe"),
                ("--contracts", "ON "),
                ("--fault", "B0"),
                ("--fault", "B1x"),
                ("--fault", ""),
                ("--fault", "B1", "--suite", "pools"),
                ("--fault", "B2", "--suite", "cache"),
                ("--fault", "B1", "--adapter", "reference", "--suite", "system"),
                ("--adapter", "nonexistent_pkg_xyz:factory"),
                ("--adapter", "os.path:join"),
                ("--adapter", "builtins:int"),
                ("--adapter", "json:loads"),
                ("--adapter", ":"),
                ("--adapter", "kvledger"),
                ("--adapter", "reference", "--suite", "pools"),
                ("--adapter", "reference", "--jobs", "2"),
                ("--jobs", "0"),
                ("--jobs", "-1"),
                ("--seeds", "0"),
                ("--for", "forever"),
                ("--for", "-5m"),
                ("--for", "0s"),
                ("--for", "10x"),
                ("--db", str(binary)),
                ("--bogus-option",),
                ("extra-argument",),
            ]
        ),
        # record
        Line("record --ops 0", ("record", "--ops", "0", "-o", str(tmp / "t0.jsonl"))),
        Line("record --ops -1", ("record", "--ops", "-1", "-o", str(tmp / "t1.jsonl"))),
        Line("record --ops 1e12", ("record", "--ops", "1000000000000", "-o", str(tmp / "t2.jsonl"))),
        Line("record --ops x", ("record", "--ops", "x")),
        Line("record --seed 1.5", ("record", "--ops", "3", "--seed", "1.5", "-o", str(tmp / "t3.jsonl"))),
        Line("record --model nonesuch", ("record", "--ops", "3", "--model", "nonesuch", "-o", str(tmp / "t4.jsonl"))),
        Line(
            "record --system --model hybrid",
            ("record", "--ops", "3", "--system", "--model", "hybrid", "-o", str(tmp / "t5.jsonl")),
        ),
        Line("record --fault B7", ("record", "--ops", "3", "--fault", "B7", "-o", str(tmp / "t6.jsonl"))),
        Line(
            "record --fault B1 B2", ("record", "--ops", "3", "--fault", "B1", "--fault", "B2", "-o", str(tmp / "t.j"))
        ),
        Line(
            "record --fault B1 --system", ("record", "--ops", "3", "--fault", "B1", "--system", "-o", str(tmp / "t.j"))
        ),
        Line("record -o folder", ("record", "--ops", "3", "-o", str(folder))),
        Line("record -o missing dir", ("record", "--ops", "3", "-o", str(tmp / "no" / "such" / "t.jsonl"))),
        Line(
            "record --adapter bogus",
            ("record", "--ops", "3", "--adapter", "nonexistent_pkg_xyz:f", "-o", str(tmp / "a")),
        ),
        Line(
            "record --adapter builtins:str", ("record", "--ops", "3", "--adapter", "builtins:str", "-o", str(tmp / "b"))
        ),
        Line(
            "record --system --adapter builtins:dict",
            ("record", "--ops", "3", "--system", "--adapter", "builtins:dict", "-o", str(tmp / "c")),
        ),
        Line("record extra", ("record", "--ops", "3", "extra", "-o", str(tmp / "d"))),
        # replay: missing, unreadable, not a trace
        Line("replay missing", ("replay", str(bad_trace))),
        Line("replay folder", ("replay", str(folder))),
        Line("replay binary", ("replay", str(binary))),
        Line("replay empty", ("replay", str(empty))),
        Line("replay no argument", ("replay",)),
        Line("replay two files", ("replay", str(empty), str(binary))),
        Line("replay --json missing", ("replay", "--json", str(bad_trace))),
        # spec-check
        Line("spec-check timeout 0", ("spec-check", "--per-condition-timeout", "0")),
        Line("spec-check timeout inf", ("spec-check", "--per-condition-timeout", "inf")),
        Line("spec-check timeout -inf", ("spec-check", "--per-condition-timeout", "-inf")),
        Line("spec-check timeout text", ("spec-check", "--per-condition-timeout", "soon")),
        Line("spec-check jobs -2", ("spec-check", "--jobs", "-2")),
        Line("spec-check unknown module", ("spec-check", "kvledger.spec.nonesuch")),
        Line("spec-check not a module", ("spec-check", "no such module")),
        Line("spec-check a module with no contract", ("spec-check", "json")),
        Line("spec-check an impl module", ("spec-check", "kvledger.impl.owners")),
        # the group
        Line("unknown command", ("chek",)),
        Line("faults extra", ("faults", "B1")),
        Line("--version extra", ("--version", "--bogus")),
    ]


def make_files(tmp: Path) -> None:
    """The files ``lines(tmp)`` names: a folder, a binary file, an empty file."""
    (tmp / "a-folder").mkdir(exist_ok=True)
    (tmp / "binary.jsonl").write_bytes(b"\xff\xfe\x00garbage")
    (tmp / "empty.jsonl").write_text("")


def verdict(args: tuple[str, ...]) -> tuple[str, str]:
    result = CliRunner().invoke(app, list(args))
    out = result.output
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        return "traceback", f"{type(result.exception).__name__}: {result.exception}"
    if "Traceback" in out:
        return "traceback", out[-300:]
    if result.exit_code == 0:
        return "silent", f"exit 0: {out[-200:]}"
    if result.exit_code != 2:
        return "traceback", f"exit {result.exit_code} (reads as a violation): {out[-300:]}"
    if not out.strip():
        return "traceback", "exit 2 with no message"
    return "clean", out.strip().splitlines()[-1]


LINES = lines(Path("/tmp/kvledger-trust-cli-ids"))  # NOTE: for the ids; each test builds its own in tmp_path


@pytest.mark.parametrize("i", range(len(LINES)), ids=[x.label for x in LINES])
def test_corpus_command_line_is_a_usage_error(i: int, tmp_path: Path) -> None:
    make_files(tmp_path)
    line = lines(tmp_path)[i]
    outcome, why = verdict(line.args)
    assert outcome == "clean", f"{outcome}: kvledger {' '.join(line.args)}: {why}"


# ---------------------------------------------------------------- environment variables at pytest start

ENV = [
    ("KVLEDGER_CONTRACTS", "maybe"),
    ("KVLEDGER_CONTRACTS", "o n"),
    ("KVLEDGER_CONTRACTS", "1"),
    ("KVLEDGER_CONTRACTS", "on,slow"),
    ("KVLEDGER_HYPOTHESIS_PROFILE", "fastest"),
    ("KVLEDGER_HYPOTHESIS_PROFILE", "CI"),
    ("KVLEDGER_HYPOTHESIS_PROFILE", "ci,dev"),
]
"""Values no reading can take (case and surrounding blanks are forgiven by design: ``on``/`` ON`` are one tier)."""


@pytest.mark.parametrize(("name", "value"), ENV, ids=[f"{n}={v!r}" for n, v in ENV])
def test_corpus_env_var_is_a_usage_error_at_pytest_start(name: str, value: str, tmp_path: Path) -> None:
    (tmp_path / "test_x.py").write_text("def test_x():\n    pass\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVLEDGER_") and k != "PYTEST_ADDOPTS"}
    env[name] = value
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    out = r.stdout + r.stderr
    assert r.returncode in (2, 4) and "Traceback" not in out and "INTERNALERROR" not in out, out[-800:]
    assert name in out, f"the error does not name {name}: {out[-400:]}"


CAMPAIGNS = [
    "suites=cache models=full,bogus",
    "profile=fastest",
    "examples=-1",
    "examples=ten",
    "steps=0",
    "contracts=maybe",
    "faults=B9",
    "seeds=4:2",
    "suites=pools models=hybrid",
    "seed=1",
]


@pytest.mark.parametrize("text", CAMPAIGNS)
def test_corpus_campaign_variable_is_refused_naming_it(text: str) -> None:
    """``KVLEDGER_CAMPAIGN`` is read when its test module is collected: every bad field is a ``ValueError`` naming
    the variable (pytest reports it as a collection error), never dropped or taken as the default."""
    from kvledger.contracts.machines.campaign_tests import parse_campaign

    try:
        parse_campaign(text)
    except ValueError as err:
        assert "KVLEDGER_CAMPAIGN" in str(err), err
    else:
        pytest.fail(f"silent: KVLEDGER_CAMPAIGN={text!r} accepted")


def test_the_cli_verdict_names_each_defect_class(monkeypatch: pytest.MonkeyPatch) -> None:
    """A command that runs is ``silent`` here (it took no bad input), exit 1 is not a usage error and an exception
    is a ``traceback``, a usage error is ``clean``: each outcome the corpus counts can be produced."""
    import typer

    from kvledger.impl import faults

    assert verdict(("faults",))[0] == "silent"
    assert verdict(("check", "--suite", "nonesuch"))[0] == "clean"
    monkeypatch.setattr(faults, "FAULTS", None)  # NOTE: ``kvledger faults`` now crashes inside
    assert verdict(("faults",))[0] == "traceback"

    def violated() -> None:
        raise typer.Exit(1)

    app.registered_commands.append(typer.models.CommandInfo("violated", callback=violated))
    try:
        assert verdict(("violated",))[0] == "traceback"
    finally:
        app.registered_commands.pop()
