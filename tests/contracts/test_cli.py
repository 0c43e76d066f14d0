"""The `kvledger` command: exit codes, JSON, faults, adapters, bad arguments, what it imports, what it prints."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import icontract
import pytest
from typer.testing import CliRunner

from kvledger.contracts.adapters.protocol import RULES_NEEDING, CacheConfig, Unsupported
from kvledger.contracts.adapters.reference import ReferenceAdapter
from kvledger.contracts.adapters.system import SYSTEM_RULES_NEEDING
from kvledger.contracts.cli import LAZY_COMMANDS, SUITE_NAMES, app
from kvledger.contracts.machines.runner import readable
from kvledger.contracts.machines.suites import RULE_FAMILIES, SUITES, family_of, fault_targets
from kvledger.impl.faults import FAULTS

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "hypothesis", "icontract", "numpy")

runner = CliRunner()


def invoke(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.output


def test_check_passes_and_prints_json() -> None:
    code, out = invoke("check", "--suite", "pools", "--model", "token", "--examples", "5", "--json")
    assert code == 0, out
    data = json.loads(out[out.index("{") :])
    assert data["ok"] and data["adapter"] == "kvledger-reference" and data["violations"] == []
    assert data["results"][0]["examples"] >= 5 and "inv_slots_conserved" in data["rules_checked"]


def test_fault_exits_1_with_rule_program_and_regression() -> None:
    code, out = invoke("check", "--fault", "B1", "--model", "full", "--examples", "30")
    assert code == 1, out
    assert (
        "inv_lru_detached" in out
        and "shrunk counterexample" in out
        and "def test_b1_cache_full_fails_with_fault" in out
    )


def test_repeatable_options_also_take_comma_separated_lists() -> None:
    code, out = invoke("check", "--suite", "pools", "--model", "token, paged", "--examples", "2", "--json")
    assert code == 0, out
    data = json.loads(out[out.index("{") :])
    assert sorted(r["model"] for r in data["results"]) == ["paged", "token"]
    code, out = invoke("check", "--suite", "pools,nope")
    assert code == 2 and "unknown suite 'nope'" in out, out
    code, out = invoke("check", "--fault", "B1,B9")
    assert code == 2 and "unknown fault 'B9'" in out, out
    code, out = invoke("check", "--model", "token,", "--suite", "pools")
    assert code == 2 and "unknown model ''" in out, out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("check", "--suite", "nope"), "unknown suite 'nope'"),
        (("check", "--model", "nope"), "unknown model 'nope'"),
        (("check", "--fault", "B9"), "unknown fault 'B9'"),
        (("check", "--profile", "slowest"), "unknown profile 'slowest'"),
        (("check", "--contracts", "loud"), "unknown contract tier 'loud'"),
        (("check", "--adapter", "no_such_module:f"), "cannot import no_such_module"),
        (("check", "--adapter", "nocolon"), "package.module:factory"),
        (("check", "--examples", "0"), ""),
    ],
)
def test_bad_arguments_exit_2(args: tuple[str, ...], message: str) -> None:
    code, out = invoke(*args)
    assert code == 2, out
    assert message in out


def raising_factory(config: CacheConfig) -> ReferenceAdapter:
    raise RuntimeError("engine not built")


class Wrapped:
    """An engine's own cache (here: a reference cache behind a wrapper that is not a ReferenceAdapter)."""

    def __init__(self, config: CacheConfig) -> None:
        self._inner = ReferenceAdapter(config)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


M = __name__
SPEC_TYPES = "kvledger.spec.types"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("check", "--adapter", "builtins:str"), "returned 'str', not a cache adapter (missing name"),
        (("check", "--adapter", "builtins:len"), "the factory raised TypeError for model 'full'"),
        (("check", "--adapter", f"{M}:raising_factory"), "raised RuntimeError for model 'full': engine not built"),
        (
            ("check", "--adapter", f"{M}:blind_factory", "--model", "swa"),
            "builds none of the model kinds asked for (swa",
        ),
        (("check", "--adapter", f"{M}:Wrapped", "--fault", "B1"), "no fault can act there"),
        (("check", "--adapter", "reference", "--suite", "pools"), "--adapter checks one suite"),
        (("check", "--adapter", "builtins:str", "--suite", "system"), "not a system adapter (missing name"),
        (("check", "--fault", "B2", "--suite", "pools"), "--fault B2 cannot act in pools/token"),
        (("check", "--fault", "B5", "--model", "full"), "--fault B5 cannot act in cache/full"),
        (("check", "--fault", "B3", "--suite", "system", "--model", "paged"), "acts only in system/mamba"),
        (("check", "--suite", "cache", "--model", "token"), "--model: unknown model 'token' for suite(s) cache"),
        (("spec-check", "--per-condition-timeout", "-1"), "positive number of seconds"),
        (("spec-check", "--per-condition-timeout", "nan"), "positive number of seconds"),
        (("spec-check", "--per-condition-timeout", "0"), "positive number of seconds"),
        (("spec-check", SPEC_TYPES), f"{SPEC_TYPES}: no function with an icontract contract"),
        (("spec-check", "no_such.module"), "cannot import no_such.module"),
        (("record", "--ops", "10000001", "-o", "/dev/null"), "--ops"),
        (("record", "--fault", "B5", "--model", "full", "-o", "/dev/null"), "--fault B5 cannot act in cache/full"),
        (("record", "--fault", "B2", "--model", "full", "-o", "/dev/null"), "--fault B2 cannot act in system/full"),
    ],
)
def test_usage_errors_name_the_option_and_exit_2(args: tuple[str, ...], message: str) -> None:
    code, out = invoke(*args)
    assert code == 2, out
    assert message in out, out
    assert "Traceback" not in out


def test_every_fault_acts_somewhere_and_only_where_it_says() -> None:
    for f in FAULTS.values():
        targets = fault_targets(f)
        assert targets, f"{f.name} acts nowhere"
        assert all(s in f.suites and m in SUITES[s].models for s, m in targets)
        assert not f.models or len(targets) < sum(len(SUITES[s].models) for s in f.suites)


def test_fault_without_model_narrows_to_where_it_acts_with_a_note() -> None:
    code, out = invoke("check", "--fault", "B5", "--suite", "cache", "--examples", "1", "--steps", "1", "--json")
    assert "acts only in cache/hybrid: checking there" in out
    data = json.loads(out[out.index("{") :])
    assert [(r["suite"], r["model"]) for r in data["results"]] == [("cache", "hybrid")]
    assert code in (0, 1)


def test_version() -> None:
    code, out = invoke("--version")
    assert code == 0 and re.fullmatch(r"kvledger \d+\.\d+\.\d+.*\n", out), out


def _modules_after(code: str) -> list[str]:
    """The heavy modules a fresh interpreter holds after running ``code``."""
    probe = f"{code}\nimport sys\nprint(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT)
    return list(json.loads(out.stdout.strip().splitlines()[-1].replace("'", '"')))


def test_help_imports_nothing_heavy() -> None:
    run_help = (
        "from typer.testing import CliRunner\nfrom kvledger.contracts.cli import app\n"
        "assert CliRunner().invoke(app, ['--help']).exit_code == 0"
    )
    assert _modules_after(run_help) == []
    assert _modules_after("from kvledger.contracts.cli import app") == []
    assert _modules_after(run_help.replace("'--help'", "'check', '--help'")) == []


def test_help_of_a_lazy_command_is_its_own() -> None:
    for name, (_, short) in LAZY_COMMANDS.items():
        code, out = invoke(name, "--help")
        assert code == 0 and " ".join(short.split()[:4]) in " ".join(out.split()), out
    code, out = invoke("--help")
    assert all(name in out for name in LAZY_COMMANDS)


def test_help_names_every_suite_and_the_heavy_import_agrees() -> None:
    assert tuple(SUITES) == SUITE_NAMES


def test_lazy_command_runs(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    code, out = invoke("record", "--ops", "50", "-o", str(trace))
    assert code == 0 and "recorded 50 operations" in out, out
    code, out = invoke("replay", str(trace))
    assert code == 0 and "holds" in out, out


# ---------------------------------------------------------------- counts, reports, regression files


def test_examples_count_what_the_option_promises() -> None:
    code, out = invoke("check", "--suite", "pools", "--model", "token", "--examples", "7", "--json")
    assert code == 0, out
    result = json.loads(out[out.index("{") :])["results"][0]
    assert result["examples"] == 7 and result["steps"] > 0 and result["shrink_runs"] == 0


def test_green_run_says_what_to_try_next() -> None:
    code, out = invoke("check", "--suite", "pools", "--model", "token", "--examples", "2")
    assert code == 0 and "next:" in out and "--fault" in out and "--adapter" in out, out


def _regression(out: str) -> str:
    return out[out.index("regression test:\n") + len("regression test:\n") :]


@pytest.mark.parametrize("adapter", [None, "reference"])
def test_violation_report_and_regression_file_are_clean(adapter: str | None) -> None:
    extra = ("--adapter", adapter) if adapter else ()
    # NOTE: a shrink cut short is still a clean report and a regression that replays (through an adapter, each replay
    # builds one, and the whole shrink took 45 s)
    code, out = invoke("check", "--fault", "B1", "--model", "full", "--examples", "30", "--shrink-for", "5s", *extra)
    assert code == 1, out
    for noise in ("zz_count_step", "Explanation", "OLD was", "File ", "These lines were"):
        assert noise not in out, noise
    assert "inv_lru_detached" in out and "found after" in out
    source = _regression(out)
    assert (
        "def test_b1_cache_full_fails_with_fault" in source and "def test_b1_cache_full_passes_without_fault" in source
    )
    if adapter:
        assert "load_factory('reference')" in source
    namespace: dict[str, Any] = {}
    exec(compile(source, "regression.py", "exec"), namespace)  # the file as pasted: both tests must pass
    namespace["test_b1_cache_full_fails_with_fault"]()
    namespace["test_b1_cache_full_passes_without_fault"]()


@icontract.snapshot(lambda self: self.n, name="n")
@icontract.ensure(lambda self, result, OLD: result > OLD.n, "inv_demo_grows: the count grows")
def _stuck(self: Any) -> int:
    return int(self.n)


class _Counter:
    n = 3
    bump = _stuck


def test_readable_drops_icontract_internals() -> None:
    with pytest.raises(icontract.ViolationError) as info:
        _Counter().bump()
    rule, message = readable(info.value)
    assert rule == "inv_demo_grows"
    assert message.splitlines()[0] == "inv_demo_grows: the count grows"
    assert "checked: result > OLD.n" in message  # an expression says what was checked; a function name would not
    assert "result = 3" in message
    assert "OLD was" not in message and "File " not in message and "self was" not in message
    rule, message = readable(KeyError(5))
    assert rule == "implementation crashed: KeyError" and "5" in message and "raised at" in message


# ---------------------------------------------------------------- the README's rules as law names


def test_every_law_belongs_to_exactly_one_rule_family() -> None:
    needing = [*RULES_NEEDING.values(), *SYSTEM_RULES_NEEDING.values()]
    laws = {r for s in SUITES.values() for r in s.rules} | {r for rs in needing for r in rs if not r.endswith("(rule)")}
    for law in laws:
        assert sum(law in members for members in RULE_FAMILIES.values()) == 1, law
        assert family_of(law) is not None
    assert family_of("implementation crashed: KeyError") is None


def test_readme_rules_name_the_laws_of_their_family() -> None:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## The rules") : text.index("\n## ", text.index("## The rules") + 5)]
    for family, laws in RULE_FAMILIES.items():
        items = re.split(r"\n\n|\n(?=\d+\. )", section)
        para = next((p for p in items if f"**{family.lower()}" in p.lower()), "")
        assert para, f"README's rules section has no paragraph for {family!r}"
        for law in laws:
            assert f"`{law}`" in para, (family, law)


def test_json_maps_rules_to_laws() -> None:
    code, out = invoke("check", "--suite", "pools", "--model", "token", "--examples", "2", "--json")
    assert code == 0, out
    families = json.loads(out[out.index("{") :])["rule_families"]
    assert "inv_slots_conserved" in families["pool conservation / single ownership"]
    assert set(families) == set(RULE_FAMILIES)


def test_faults_lists_every_fault() -> None:
    code, out = invoke("faults")
    assert code == 0
    for name in ("B1", "B2", "B3", "B4", "B5"):
        assert name in out


class BlindAdapter(ReferenceAdapter):
    """An engine adapter that cannot observe LRU links or lock counters."""

    name = "blind-engine"
    version = "9.9"
    capabilities = frozenset({"ledgers", "content", "sizes"})


def blind_factory(config: CacheConfig) -> BlindAdapter:
    if config.window is not None:
        raise Unsupported("no sliding window")
    return BlindAdapter(config)


def test_adapter_rules_it_cannot_express_are_reported_skipped() -> None:
    code, out = invoke(
        "check",
        "--adapter",
        f"{__name__}:blind_factory",
        "--model",
        "full",
        "--model",
        "swa",
        "--examples",
        "5",
        "--json",
    )
    assert code == 0, out
    data = json.loads(out[out.index("{") :])
    assert data["adapter"] == "blind-engine" and data["adapter_version"] == "9.9"
    full, swa = data["results"]
    assert "inv_lru_detached" in full["skipped"] and "inv_lock_ref_counts_handles" in full["skipped"]
    assert "inv_lru_detached" not in full["rules"]
    assert swa["skipped"] and "not supported" in swa["skipped"][0] and swa["examples"] == 0


def test_an_adapter_that_builds_only_some_model_kinds_is_probed_with_those() -> None:
    """A factory refusing full attention (a Mamba-only cache) is not a usage error: its kinds are checked."""

    def mamba_only(config: CacheConfig) -> ReferenceAdapter:
        if not config.mamba:
            raise Unsupported("needs a Mamba config")
        return ReferenceAdapter(config)

    import sys
    import types

    mod = types.ModuleType("kvledger_test_mamba_only")
    mod.factory = mamba_only  # type: ignore[attr-defined]
    sys.modules[mod.__name__] = mod
    try:
        # NOTE: --jobs 1: the adapter's module exists only in this process, so worker processes could not load it
        args = ["check", "--adapter", f"{mod.__name__}:factory", "--examples", "3", "--json", "--jobs", "1"]
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.output
        payload = json.loads(result.output[result.output.index("{") :])
        checked = {r["model"] for r in payload["results"] if r["rules"]}
        assert checked == {"mamba", "hybrid"}, payload["results"]
        refused = runner.invoke(app, ["check", "--adapter", f"{mod.__name__}:factory", "--model", "full"])
        assert refused.exit_code == 2 and "needs a Mamba config" in refused.output
    finally:
        del sys.modules[mod.__name__]


def test_shrink_for_takes_a_duration_and_refuses_anything_else(monkeypatch: pytest.MonkeyPatch) -> None:
    code, out = invoke("check", "--shrink-for", "soon")
    assert code == 2 and "--shrink-for 'soon'" in out and "positive duration" in out
    monkeypatch.setenv("KVLEDGER_SHRINK_SECONDS", "soon")
    code, out = invoke("check", "--suite", "pools")
    assert code == 2 and "KVLEDGER_SHRINK_SECONDS='soon'" in out, out
    monkeypatch.delenv("KVLEDGER_SHRINK_SECONDS")
    code, out = invoke("check", "--fault", "B1", "--model", "full", "--shrink-for", "20s", "--json")
    assert code == 1, out
    data = json.loads(out[out.index("{") :])
    assert data["violations"], out
