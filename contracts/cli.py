"""The ``kvledger`` command.

``kvledger check`` runs the conformance state machines against the built-in
reference implementation with contracts on and ends with a table of suites x
models: rules, examples, steps, time, verdict. Exit 0 when every law holds,
1 on a violation, 2 on bad arguments.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Annotated, Any

import typer
from hypothesis import settings as Settings
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from kvledger.contracts import bindings
from kvledger.contracts.adapters.protocol import (
    ALIASES,
    AdapterFactory,
    CacheConfig,
    Unsupported,
    load_factory,
    skipped_rules,
)
from kvledger.contracts.adapters.system import (
    SYSTEM_ALIASES,
    SystemAdapterFactory,
    SystemConfig,
    load_system_factory,
    skipped_system_rules,
)
from kvledger.contracts.machines.cache import RULES as CACHE_RULES
from kvledger.contracts.machines.cache import machine_for_cache
from kvledger.contracts.machines.profiles import PROFILES, register_profiles
from kvledger.contracts.machines.regression import render
from kvledger.contracts.machines.runner import CheckResult, run_machine
from kvledger.contracts.machines.suites import CACHE_MODELS, SUITES, SYSTEM_CONFIGS
from kvledger.contracts.machines.system import RULES as SYSTEM_RULES
from kvledger.contracts.machines.system import machine_for_system
from kvledger.impl import faults
from kvledger.impl.faults import FAULTS

app = typer.Typer(add_completion=False, no_args_is_help=True, help="kvledger: check LLM-serving memory managers.")


def _fail_usage(message: str) -> None:
    Console(stderr=True).print(f"[red]error:[/red] {message}")
    raise typer.Exit(2)


@app.command()
def check(
    suite: Annotated[list[str] | None, typer.Option("--suite", help=f"suite(s) to run: {', '.join(SUITES)}")] = None,
    model: Annotated[list[str] | None, typer.Option("--model", help="model kind(s) within the suites")] = None,
    profile: Annotated[str, typer.Option(help=f"Hypothesis profile: {', '.join(PROFILES)}")] = "ci",
    examples: Annotated[int | None, typer.Option(min=1, help="examples per model (overrides the profile)")] = None,
    steps: Annotated[int | None, typer.Option(min=1, help="max steps per example (overrides the profile)")] = None,
    seed: Annotated[int | None, typer.Option(help="random seed (default: the profile's derandomised run)")] = None,
    contracts: Annotated[str, typer.Option(help="contract tier during the run: off, on, slow")] = "on",
    fault: Annotated[
        list[str] | None, typer.Option("--fault", help="switch a named fault on (B1..B5, repeatable); expect exit 1")
    ] = None,
    adapter: Annotated[
        str | None,
        typer.Option(help="check another cache: an alias (reference, sglang...) or package.module:factory"),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print a machine-readable result")] = False,
) -> None:
    """Run the conformance machines against the reference implementation (or an engine's adapter)."""
    register_profiles()
    factory: AdapterFactory | None = None
    system_factory: SystemAdapterFactory | None = None
    adapter_name, adapter_version, engine_class = "kvledger-reference", "0.1.0", "kvledger.impl"
    if adapter is not None:
        wants_system = suite == ["system"] or (suite is None and adapter in SYSTEM_ALIASES and adapter not in ALIASES)
        if suite and suite not in (["cache"], ["system"]):
            _fail_usage("--adapter checks one suite: --suite cache (a radix cache) or --suite system (a scheduler)")
        suite = ["system"] if wants_system else ["cache"]
        configs: dict[str, CacheConfig] | dict[str, SystemConfig] = SYSTEM_CONFIGS if wants_system else CACHE_MODELS
        probe, reasons = None, []
        try:
            if wants_system:
                system_factory = load_system_factory(adapter)
            else:
                factory = load_factory(adapter)
            make: Callable[[Any], Any] = system_factory if wants_system else factory  # type: ignore[assignment]
            # NOTE: probe with the model kinds asked for (else every kind) until one builds: an adapter of a
            # Mamba-only cache is not refused for lacking full attention.
            for m in [m for m in configs if not model or m in model]:
                try:
                    probe = make(configs[m])
                    break
                except Unsupported as err:
                    reasons.append(f"{m}: {err}")
        except Exception as err:  # an adapter that cannot start is a usage error, not a crash
            _fail_usage(
                str(err) if isinstance(err, ValueError) else f"adapter {adapter!r}: {type(err).__name__}: {err}"
            )
        if probe is None:
            _fail_usage(f"adapter {adapter!r} builds none of the model kinds asked for: {'; '.join(reasons)}")
            return
        adapter_name, adapter_version = probe.name, probe.version
        engine_class = getattr(probe, "engine_class", type(probe).__qualname__)
    faults_on = [f.upper() for f in fault or []]
    for f in faults_on:
        if f not in FAULTS:
            _fail_usage(f"unknown fault {f!r}; expected one of {', '.join(sorted(FAULTS))} (see `kvledger faults`)")
    if faults_on and not suite:
        suite = sorted({s for f in faults_on for s in FAULTS[f].suites})
    if profile not in PROFILES:
        _fail_usage(f"unknown profile {profile!r}; expected one of {', '.join(PROFILES)}")
    if contracts not in bindings.LEVELS:
        _fail_usage(f"unknown contract tier {contracts!r}; expected one of {', '.join(bindings.LEVELS)}")
    suites = suite or list(SUITES)
    for name in suites:
        if name not in SUITES:
            _fail_usage(f"unknown suite {name!r}; expected one of {', '.join(SUITES)}")
    known_models = {m for s in suites for m in SUITES[s].models}
    for m in model or []:
        if m not in known_models:
            _fail_usage(
                f"unknown model {m!r} for suites {', '.join(suites)}; expected one of {', '.join(sorted(known_models))}"
            )
    base = Settings.get_profile(profile)
    overrides: dict[str, object] = {}
    if examples is not None:
        overrides["max_examples"] = examples
    if steps is not None:
        overrides["stateful_step_count"] = steps
    if seed is not None:
        overrides["derandomize"] = False
    run_settings = Settings(base, **overrides)  # type: ignore[arg-type]
    bindings.install(contracts)  # type: ignore[arg-type]
    faults.enable(*faults_on)
    jobs = [(s, m) for s in suites for m in SUITES[s].models if not model or m in model]
    results: list[CheckResult] = []
    console = Console(stderr=as_json)
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=console,
        transient=as_json,
        disable=as_json and not sys.stderr.isatty(),
    ) as progress:
        task = progress.add_task("checking", total=len(jobs))
        for s, m in jobs:
            progress.update(task, description=f"{s}/{m}")
            if system_factory is not None:
                results.append(_system_adapter_run(system_factory, m, run_settings, seed))
                progress.advance(task)
                continue
            if factory is not None:
                machine_result = _adapter_run(factory, m, run_settings, seed)
                results.append(machine_result)
                progress.advance(task)
                continue
            machine = SUITES[s].models[m]()

            def regression(rule: str, lines: list[str], s: str = s, m: str = m) -> str:
                return render(s, m, faults_on, rule, lines)

            results.append(run_machine(s, m, machine, list(SUITES[s].rules), run_settings, seed, regression))
            progress.advance(task)
    faults.disable()
    bindings.uninstall()
    ok = all(r.ok for r in results)
    if as_json:
        payload = {
            "ok": ok,
            "adapter": adapter_name,
            "adapter_version": adapter_version,
            "engine_class": engine_class,
            "profile": profile,
            "seed": seed,
            "contracts": contracts,
            "faults": faults_on,
            "rules_checked": sorted({rule for r in results for rule in r.rules}),
            "examples": sum(r.examples for r in results),
            "seconds": round(sum(r.seconds for r in results), 3),
            "violations": [
                {"suite": r.suite, "model": r.model, "rule": r.violation.rule, "length": r.violation.length}
                for r in results
                if r.violation is not None
            ],
            "results": [r.to_json() for r in results],
        }
        typer.echo(json.dumps(payload, indent=2))
    else:
        shown = adapter_name if factory is not None or system_factory is not None else None
        _print_table(console, results, faults_on, shown)
    raise typer.Exit(0 if ok else 1)


def _adapter_run(factory: AdapterFactory, model: str, run_settings: Settings, seed: int | None) -> CheckResult:
    """Run the cache suite's machine for ``model`` on an adapter; unsupported models and capabilities are skipped."""
    config = CACHE_MODELS[model]
    try:
        caps = factory(config).capabilities
    except Unsupported as err:
        return CheckResult("cache", model, [], skipped=[f"model not supported by the adapter: {err}"])
    machine = machine_for_cache(lambda: factory(config))
    result = run_machine("cache", model, machine, list(CACHE_RULES), run_settings, seed)
    result.skipped = skipped_rules(caps)
    result.rules = [r for r in result.rules if r not in result.skipped]
    return result


def _system_adapter_run(
    factory: SystemAdapterFactory, model: str, run_settings: Settings, seed: int | None
) -> CheckResult:
    """Run the system suite's machine for ``model`` on a system adapter; what it cannot express is skipped."""
    config = SYSTEM_CONFIGS[model]
    try:
        caps = factory(config).capabilities
    except Unsupported as err:
        return CheckResult("system", model, [], skipped=[f"model not supported by the adapter: {err}"])
    machine = machine_for_system(lambda: factory(config))
    result = run_machine("system", model, machine, list(SYSTEM_RULES), run_settings, seed)
    result.skipped = skipped_system_rules(caps)
    result.rules = [r for r in result.rules if r not in result.skipped]
    return result


@app.command("faults")
def list_faults() -> None:
    """List the named faults (the historical bugs re-created in the reference implementation)."""
    table = Table(title="named faults (kvledger check --fault NAME)")
    for col in ("fault", "upstream fix", "what it breaks", "laws expected to catch it"):
        table.add_column(col, overflow="fold")
    for f in FAULTS.values():
        table.add_row(f.name, f.upstream, f.title, " or ".join(f.laws))
    Console().print(table)


def _print_table(
    console: Console, results: list[CheckResult], faults_on: list[str], adapter: str | None = None
) -> None:
    title = f"kvledger check: {adapter or 'reference implementation'}"
    title += f" with fault {', '.join(faults_on)}" if faults_on else ""
    table = Table(title=title)
    for col in ("suite", "model", "rules", "examples", "steps", "time", "verdict"):
        table.add_column(col, justify="right" if col in ("examples", "steps", "time") else "left")
    for r in results:
        verdict = "[green]holds[/green]" if r.ok else f"[red]VIOLATED[/red] {r.violation.rule if r.violation else ''}"
        if r.skipped:
            verdict += f" [yellow]({len(r.skipped)} skipped)[/yellow]"
        table.add_row(r.suite, r.model, str(len(r.rules)), str(r.examples), str(r.steps), f"{r.seconds:.1f}s", verdict)
    console.print(table)
    for r in results:
        if r.skipped:
            console.print(f"{r.suite}/{r.model}: skipped (the adapter cannot express them): {', '.join(r.skipped)}")
    for r in results:
        if r.violation is None:
            continue
        v = r.violation
        console.print(f"\n[red bold]{r.suite}/{r.model}: {v.rule}[/red bold]\n{v.message}")
        console.print(f"shrunk counterexample ({v.length} steps):")
        for i, step in enumerate(v.steps, 1):
            console.print(f"  {i:2d}. {step}", markup=False)
        console.print("\nregression test:\n" + v.program, markup=False, highlight=False, soft_wrap=True)


@app.command("spec-check")
def spec_check(
    per_condition_timeout: Annotated[float, typer.Option(help="seconds CrossHair spends per condition")] = 4.0,
    jobs: Annotated[int, typer.Option(min=0, help="modules checked in parallel (0: one per CPU)")] = 0,
) -> None:
    """Run CrossHair on the spec modules' contracts (exit 1 if it finds a counterexample)."""
    import os
    import tempfile
    from concurrent.futures import ThreadPoolExecutor
    from pathlib import Path

    from kvledger.contracts.crosshair_check import SPEC_MODULES, run_crosshair

    def one(module: str) -> tuple[str, int, str, str]:
        with tempfile.TemporaryDirectory() as tmp:
            r = run_crosshair([module], Path(tmp), per_condition_timeout=per_condition_timeout)
        return module, r.returncode, r.stdout, r.stderr

    with ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 1) as pool:
        results = list(pool.map(one, SPEC_MODULES))
    worst = 0
    for module, code, out, err in results:
        typer.echo(out, nl=False)
        typer.echo(err, nl=False, err=True)
        typer.echo(f"crosshair {module}: {'no counterexample' if code == 0 else f'exit {code}'}")
        worst = max(worst, code)
    raise typer.Exit(worst)


def main() -> None:
    """Console entry point."""
    app()


# ---------------------------------------------------------------- trace commands (record, replay)
from kvledger.contracts.trace import cli as trace_cli  # noqa: E402

app.command("record")(trace_cli.record)
app.command("replay")(trace_cli.replay)
