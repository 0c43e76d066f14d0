"""The ``kvledger`` command.

``kvledger check`` runs the conformance state machines against the built-in
reference implementation with contracts on and ends with a table of suites x
models: rules, examples, steps, time, verdict. Exit 0 when every law holds,
1 on a violation, 2 on bad arguments (every option is checked before any
work starts).

The module imports only Typer and Rich: the machines, torch and Hypothesis
are imported inside the commands that need them, and ``record``/``replay``
(:mod:`kvledger.contracts.trace.cli`) when they run, so ``kvledger --help``
starts in a fraction of a second.
"""

from __future__ import annotations

import importlib
import json
import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.console import Console
from typer.core import TyperCommand, TyperGroup

from kvledger.contracts.machines.profiles import CHECK_EXAMPLES, PROFILES
from kvledger.contracts.tiers import LEVELS

if TYPE_CHECKING:
    from hypothesis import settings as Settings
    from hypothesis.database import ExampleDatabase

    from kvledger.contracts.machines.runner import CheckResult, Progress

SUITE_NAMES = ("pools", "cache", "system")
"""The keys of ``kvledger.contracts.machines.suites.SUITES``, for ``--help`` (which imports no machine)."""

LAZY_COMMANDS: dict[str, tuple[str, str]] = {
    "record": (
        "kvledger.contracts.trace.cli:record",
        "Record a random workload of the reference implementation as a trace.",
    ),
    "replay": (
        "kvledger.contracts.trace.cli:replay",
        "Replay a trace against the spec alone: exit 0 holds, 1 violation, 2 malformed input.",
    ),
}
"""Subcommands defined elsewhere, imported when they run or show their own help: (``module:function``, short help)."""

NEXT_STEPS = (
    "next: `kvledger check --fault B1` (a law catching a bug; `kvledger faults` lists them), "
    "`--adapter package.module:factory` (your own cache), `--profile thorough`; docs/checking.md"
)


class _LazyCommand(TyperCommand):
    """A subcommand listed in ``--help`` by name and short help; its module is imported when it is used."""

    def __init__(self, name: str, target: str, short_help: str) -> None:
        super().__init__(name, help=short_help, short_help=short_help)
        self.target = target
        self._real: Any = None

    def real(self) -> Any:
        """The Typer command itself (importing its module)."""
        if self._real is None:
            module, _, attr = self.target.partition(":")
            sub = typer.Typer(add_completion=False)
            sub.command(self.name)(getattr(importlib.import_module(module), attr))
            self._real = typer.main.get_command(sub)
        return self._real

    def make_context(self, info_name: str | None, args: list[str], parent: Any = None, **extra: Any) -> Any:
        """The real command's context: Typer parses and runs the real command from here on."""
        return self.real().make_context(info_name, args, parent=parent, **extra)


class _Group(TyperGroup):
    """The ``kvledger`` group: Typer's, plus the lazily imported subcommands."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name, (target, short_help) in LAZY_COMMANDS.items():
            self.add_command(_LazyCommand(name, target, short_help))


app = typer.Typer(
    cls=_Group, add_completion=False, no_args_is_help=True, help="kvledger: check LLM-serving memory managers."
)


def _show_version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            typer.echo(f"kvledger {version('kvledger')}")
        except PackageNotFoundError:  # pragma: no cover - only from a source tree that was never installed
            typer.echo("kvledger (not installed)")
        raise typer.Exit(0)


@app.callback()
def _main(
    version: Annotated[
        bool, typer.Option("--version", is_eager=True, callback=_show_version, help="print the version and exit")
    ] = False,
) -> None:
    """kvledger: check LLM-serving memory managers."""


def _fail_usage(message: str) -> NoReturn:
    """A usage error: one line on stderr, exit 2."""
    Console(stderr=True, highlight=False, soft_wrap=True).print(f"[red]error:[/red] {message}", markup=True)
    raise typer.Exit(2)


def _one_of(option: str, what: str, value: str, allowed: Any) -> None:
    if value not in allowed:
        _fail_usage(f"{option}: unknown {what} {value!r}; expected one of {', '.join(allowed)}")


def _listed(values: list[str] | None) -> list[str] | None:
    """A repeatable option's values, each of which may also list several separated by commas
    (``--model mamba,hybrid`` is ``--model mamba --model hybrid``); ``None`` stays ``None``."""
    if values is None:
        return None
    return [part.strip() for value in values for part in value.split(",")]  # NOTE: an empty name is refused by name


# ---------------------------------------------------------------- check


@app.command()
def check(
    suite: Annotated[
        list[str] | None,
        typer.Option(
            "--suite", help=f"suite(s) to run: {', '.join(SUITE_NAMES)} (default: all; repeatable or comma-separated)"
        ),
    ] = None,
    model: Annotated[
        list[str] | None,
        typer.Option("--model", help="model kind(s) within the suites (repeatable or comma-separated)"),
    ] = None,
    profile: Annotated[
        str,
        typer.Option(
            help=f"Hypothesis profile: {', '.join(PROFILES)} (check: ci's settings at {CHECK_EXAMPLES} examples)"
        ),
    ] = "check",
    examples: Annotated[int | None, typer.Option(min=1, help="examples per model (overrides the profile)")] = None,
    steps: Annotated[int | None, typer.Option(min=1, help="max steps per example (overrides the profile)")] = None,
    seed: Annotated[int | None, typer.Option(help="random seed (default: the profile's derandomised run)")] = None,
    contracts: Annotated[str, typer.Option(help=f"contract tier during the run: {', '.join(LEVELS)}")] = "on",
    fault: Annotated[
        list[str] | None,
        typer.Option("--fault", help="switch a named fault on (B1..B5, repeatable or comma-separated); expect exit 1"),
    ] = None,
    adapter: Annotated[
        str | None,
        typer.Option(
            help="check an engine: a cache adapter (alias: reference, sglang...; or package.module:factory), "
            "or with --suite system a scheduler's system adapter"
        ),
    ] = None,
    set_aside_names: Annotated[
        list[str] | None,
        typer.Option(
            "--set-aside",
            help="with --adapter: check without a capability's laws, named by the capability or by one of its "
            "laws (repeatable or comma-separated; for a finding already filed)",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print a machine-readable result")] = False,
    db: Annotated[
        Path | None, typer.Option("--db", help="Hypothesis example database: failures found before are replayed first")
    ] = None,
    jobs_n: Annotated[
        int | None,
        typer.Option(
            "--jobs",
            min=1,
            help="worker processes the suites' models are spread over (default: one per core, at most one per "
            "model; 1: all in this process)",
        ),
    ] = None,
    seeds: Annotated[int, typer.Option("--seeds", min=1, help="seeds per suite/model, from --seed (default 0) up")] = 1,
    for_: Annotated[
        str | None, typer.Option("--for", help="keep drawing fresh seeds until this time is up (90s, 30m, 1.5h)")
    ] = None,
    kept_first: Annotated[
        bool, typer.Option("--kept/--no-kept", help="replay the kept programs of earlier findings before the search")
    ] = True,
    shrink: Annotated[
        str | None,
        typer.Option(
            "--shrink-for",
            help="how long a violation may shrink before the shortest program so far is reported (default 60s)",
        ),
    ] = None,
) -> None:
    """Run the conformance machines against the reference implementation (or an engine's adapter)."""
    suite, model, fault, set_aside_names = map(_listed, (suite, model, fault, set_aside_names))
    _one_of("--profile", "profile", profile, PROFILES)
    _one_of("--contracts", "contract tier", contracts, LEVELS)
    for name in suite or []:
        _one_of("--suite", "suite", name, SUITE_NAMES)
    if db is not None and db.exists() and not db.is_dir():
        _fail_usage(f"--db {db}: not a directory (a Hypothesis example database is a directory; a new one is made)")
    from hypothesis import settings as Settings

    from kvledger.contracts import bindings
    from kvledger.contracts.machines.kept import kept_for
    from kvledger.contracts.machines.profiles import register_profiles
    from kvledger.contracts.machines.runner import run_machine
    from kvledger.contracts.machines.suites import SUITES, fault_targets
    from kvledger.impl import faults
    from kvledger.impl.faults import FAULTS

    faults_on = list(dict.fromkeys(f.upper() for f in fault or []))
    for f in faults_on:
        _one_of("--fault", "fault", f, sorted(FAULTS))
    probe = None
    if adapter is not None:
        from kvledger.contracts.adapters.protocol import ALIASES
        from kvledger.contracts.adapters.system import SYSTEM_ALIASES

        if suite and suite not in (["cache"], ["system"]):
            _fail_usage("--adapter checks one suite: --suite cache (a radix cache) or --suite system (a scheduler)")
        wants_system = suite == ["system"] or (not suite and adapter in SYSTEM_ALIASES and adapter not in ALIASES)
        suite = ["system" if wants_system else "cache"]
        probe = _Probe(adapter, wants_system)
        probe.set_aside = _capabilities_set_aside(set_aside_names or [], wants_system)
    elif set_aside_names:
        _fail_usage("--set-aside takes laws from an adapter (--adapter ...); the reference implementation has them all")
    suites = suite or (sorted({s for f in faults_on for s in FAULTS[f].suites}) if faults_on else list(SUITES))
    # NOTE: an adapter's models are its suite's configs (a system adapter may also build the window kinds)
    models_of = {s: list(probe.configs()) if probe is not None else list(SUITES[s].models) for s in suites}
    known_models = list(dict.fromkeys(m for s in suites for m in models_of[s]))
    for m in model or []:
        if m not in known_models:
            _fail_usage(
                f"--model: unknown model {m!r} for suite(s) {', '.join(suites)}; "
                f"expected one of {', '.join(known_models)}"
            )
    jobs = [(s, m) for s in suites for m in models_of[s] if not model or m in model]
    notes: list[str] = []
    if faults_on:
        jobs, notes = _where_faults_act(faults_on, jobs, {f: fault_targets(FAULTS[f]) for f in faults_on}, bool(model))
    unsupported: dict[str, str] = {}
    if probe is not None:
        unsupported = probe.validate([m for _, m in jobs])
        if faults_on and not probe.runs_reference:
            _fail_usage(
                f"--fault re-creates bugs in kvledger's reference implementation; adapter {adapter!r} "
                f"({probe.name}) does not run it, so no fault can act there"
            )
    from kvledger.contracts.machines.campaign import parse_duration
    from kvledger.contracts.machines.runner import shrink_seconds

    budget = shrink_for = None
    try:
        budget = None if for_ is None else parse_duration(for_)
        # NOTE: the environment's budget is read here too, so a malformed one is a usage error, not a traceback
        shrink_for = shrink_seconds() if shrink is None else parse_duration(shrink, "--shrink-for")
    except ValueError as err:
        _fail_usage(str(err))
    workers = jobs_n if jobs_n is not None else auto_workers(len(jobs))
    if workers > 1 or seeds > 1 or budget is not None:
        _campaign(
            jobs,
            profile,
            examples,
            steps,
            seed,
            contracts,
            faults_on,
            db,
            workers,
            seeds,
            budget,
            as_json,
            kept_first,
            probe,
            unsupported,
            shrink_for,
        )
    register_profiles()
    overrides: dict[str, object] = {}
    if examples is not None:
        overrides["max_examples"] = examples
    if steps is not None:
        overrides["stateful_step_count"] = steps
    if seed is not None:
        overrides["derandomize"] = False
    run_settings = Settings(Settings.get_profile(profile), **overrides)  # type: ignore[arg-type]
    database = None
    if db is not None:
        from hypothesis.database import DirectoryBasedExampleDatabase

        database = DirectoryBasedExampleDatabase(str(db))
    console = Console(stderr=as_json)
    if probe is not None and probe.set_aside:
        notes.append(f"set aside (not checked): {', '.join(sorted(probe.set_aside))}; the skipped laws are listed")
    for note in notes:
        Console(stderr=True, highlight=False).print(f"[yellow]note:[/yellow] {note}")
    results: list[CheckResult] = []
    bindings.install(contracts)  # type: ignore[arg-type]
    faults.enable(*faults_on)
    try:
        with _CheckDisplay(len(jobs), run_settings.max_examples) as display:
            for s, m in jobs:
                tick = display.start(s, m)
                if probe is not None:
                    result = _adapter_run(
                        probe, m, unsupported.get(m), run_settings, seed, faults_on, tick, database, shrink_for
                    )
                else:

                    def regression(rule: str, lines: list[str], s: str = s, m: str = m) -> str:
                        from kvledger.contracts.machines.regression import render

                        return render(s, m, faults_on, rule, lines)

                    machine = SUITES[s].models[m]()
                    rules = list(SUITES[s].rules)
                    kept = kept_for(s, m) if kept_first else []
                    result = run_machine(
                        s,
                        m,
                        machine,
                        rules,
                        run_settings,
                        seed,
                        regression,
                        tick,
                        database=database,
                        kept=kept,
                        shrink_for=shrink_for,
                    )
                results.append(result)
                display.done(result)
    finally:
        faults.disable()
        bindings.uninstall()
    ok = all(r.ok for r in results)
    if as_json:
        payload = _payload(results, probe, profile, seed, contracts, faults_on)
        typer.echo(json.dumps(payload, indent=2))
    else:
        _print_table(console, results, faults_on, probe.name if probe is not None else None)
        if ok:
            console.print(NEXT_STEPS, markup=False, highlight=False)
    raise typer.Exit(0 if ok else 1)


def auto_workers(jobs: int) -> int:
    """``--jobs``'s default: one worker process per core this process may run on, at most one per job."""
    import os

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(cores, jobs))


def _payload(
    results: list[CheckResult],
    probe: _Probe | None,
    profile: str,
    seed: int | None,
    contracts: str,
    faults_on: list[str],
) -> dict[str, Any]:
    """``--json``'s result, the same for a run in this process and one over worker processes."""
    from kvledger.contracts.machines.suites import RULE_FAMILIES

    checked = sorted({rule for r in results for rule in r.rules})
    return {
        "ok": all(r.ok for r in results),
        "adapter": probe.name if probe is not None else "kvledger-reference",
        "adapter_version": probe.version if probe is not None else "0.1.0",
        "engine_class": probe.engine_class if probe is not None else "kvledger.impl",
        "profile": profile,
        "seed": seed,
        "contracts": contracts,
        "faults": faults_on,
        "rules_checked": checked,
        "rule_families": {family: [law for law in laws if law in checked] for family, laws in RULE_FAMILIES.items()},
        "examples": sum(r.examples for r in results),
        "seconds": round(sum(r.seconds for r in results), 3),
        "violations": [
            {"suite": r.suite, "model": r.model, "rule": r.violation.rule, "length": r.violation.length}
            for r in results
            if r.violation is not None
        ],
        "results": [r.to_json() for r in results],
    }


def _campaign(
    pairs: list[tuple[str, str]],
    profile: str,
    examples: int | None,
    steps: int | None,
    seed: int | None,
    contracts: str,
    faults_on: list[str],
    db: Path | None,
    workers: int,
    seeds: int,
    seconds: float | None,
    as_json: bool,
    kept: bool = True,
    probe: _Probe | None = None,
    unsupported: dict[str, str] | None = None,
    shrink_for: float | None = None,
) -> NoReturn:
    """``--jobs``/``--seeds``/``--for``: every (suite, model) for each seed, over worker processes, merged.

    Stops handing out jobs at the first violation (shrunk in the worker that found it) or when time is up;
    each (suite, model) row adds up its seeds' examples, steps and time and keeps its first violation.
    With ``probe`` (``--adapter``) the jobs check that adapter; the models it declines are reported skipped.
    """
    import random
    from dataclasses import replace

    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from kvledger.contracts.machines import campaign as C
    from kvledger.contracts.machines.runner import CheckResult

    database = None if db is None else str(db)
    spec = C.RunSpec(profile, examples, steps, contracts, tuple(faults_on), database, kept, shrink_for=shrink_for)
    declined = unsupported or {}
    if probe is not None:
        spec = replace(spec, adapter=probe.spec, system=probe.system, set_aside=tuple(sorted(probe.set_aside)))
        pairs = [(s, m) for s, m in pairs if m not in declined]
    drawn: Iterator[int | None]
    if seconds is not None:
        drawn = C.fresh_seeds(random.Random(seed))
    elif seed is None and seeds == 1:
        drawn = iter([None])  # NOTE: the profile's own (derandomised) run, as in one process: only spread out
    else:
        drawn = iter(C.seeds_for(seed, seeds))
    console = Console(stderr=True, highlight=False)
    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    ) as bar:
        task = bar.add_task(f"campaign on {workers} worker(s)")

        def shown(p: C.Progress) -> None:
            seed_in_use = "" if p.seed is None else f", seed {p.seed}"  # NOTE: None: the profile's own draws
            text = f"{p.done} jobs, {p.examples} examples, {p.rate:.1f} examples/s{seed_in_use}"
            bar.update(task, description=text)
            if not console.is_terminal and p.last is not None:
                verdict = "holds" if p.last.ok else f"VIOLATED {p.last.violation.rule if p.last.violation else ''}"
                console.print(f"{p.last.suite}/{p.last.model}: {verdict} ({p.done} jobs, {p.rate:.1f} examples/s)")

        done = C.run_campaign(spec, C.jobs_for(pairs, drawn), workers, seconds=seconds, on_progress=shown)
    merged: dict[tuple[str, str], CheckResult] = {}
    seeds_run: dict[tuple[str, str], list[int | None]] = {}
    for job, r in done:
        key = (job.suite, job.model)
        seeds_run.setdefault(key, []).append(job.seed)
        m = merged.setdefault(key, CheckResult(job.suite, job.model, r.rules, skipped=list(r.skipped)))
        m.examples, m.steps, m.seconds = m.examples + r.examples, m.steps + r.steps, m.seconds + r.seconds
        if m.violation is None and r.violation is not None:
            m.violation = r.violation
        m.cut = m.cut or r.cut
    results = [merged[k] for k in pairs if k in merged]  # NOTE: in the order of the jobs, as in one process
    ok = all(r.ok for r in results)
    if probe is not None:
        for name, why in declined.items():
            results.append(CheckResult(probe.suite, name, [], skipped=[f"model not supported by the adapter: {why}"]))
            seeds_run[(probe.suite, name)] = []
    if as_json:
        payload = _payload(results, probe, profile, seed, contracts, faults_on)
        payload["campaign"] = {"workers": workers, "jobs": len(done), "seconds": seconds}
        payload["results"] = [{**r.to_json(), "seeds": seeds_run[(r.suite, r.model)]} for r in results]
        typer.echo(json.dumps(payload, indent=2))
    else:
        out = Console()
        _print_table(out, results, faults_on, probe.name if probe is not None else None)
        cut = sum(r.cut for _, r in done)
        ended = f"; {cut} stopped when the time was up" if cut else ""
        out.print(f"campaign: {len(done)} jobs on {workers} worker(s){ended}", highlight=False)
        if ok:
            out.print(NEXT_STEPS, markup=False, highlight=False)
    raise typer.Exit(0 if ok else 1)


def _where_faults_act(
    faults_on: list[str], jobs: list[tuple[str, str]], targets: dict[str, list[tuple[str, str]]], models_named: bool
) -> tuple[list[tuple[str, str]], list[str]]:
    """The jobs to run with ``faults_on`` and notes about the rest; a fault that can act in none is a usage error.

    Without ``--model``, the run narrows to the models where some fault acts;
    with it, every named model runs and those no fault can reach are noted.
    """
    notes = []
    for f in faults_on:
        acting = [j for j in jobs if j in targets[f]]
        if not acting:
            where = ", ".join(f"{s}/{m}" for s, m in targets[f]) or "no suite"
            _fail_usage(f"--fault {f} cannot act in {', '.join(f'{s}/{m}' for s, m in jobs)}: it acts only in {where}")
    reached = [j for j in jobs if any(j in targets[f] for f in faults_on)]
    unreached = [f"{s}/{m}" for s, m in jobs if (s, m) not in reached]
    if unreached and models_named:
        notes.append(f"no fault of {', '.join(faults_on)} can act in {', '.join(unreached)}: checked without one")
        return jobs, notes
    if unreached:
        notes.append(
            f"fault {', '.join(faults_on)} acts only in {', '.join(f'{s}/{m}' for s, m in reached)}: checking there"
        )
    return reached, notes


class _Probe:
    """An ``--adapter`` spec, loaded and checked up front: a spec that cannot give adapters is a usage error.

    ``system``: the spec names a request-level ``SystemAdapter`` factory (``--suite system``), else a
    ``CacheAdapter`` factory.
    """

    def __init__(self, spec: str, system: bool = False) -> None:
        self.spec, self.system = spec, system
        self.suite = "system" if system else "cache"
        try:
            if system:
                from kvledger.contracts.adapters.system import load_system_factory

                self.factory: Callable[[Any], Any] = load_system_factory(spec)
            else:
                from kvledger.contracts.adapters.protocol import load_factory

                self.factory = load_factory(spec)
        except ValueError as err:
            _fail_usage(f"--adapter: {err}")
        self.name, self.version, self.engine_class, self.runs_reference = spec, "?", "?", False
        self.set_aside: frozenset[str] = frozenset()

    def configs(self) -> dict[str, Any]:
        """The config each model kind of this adapter's suite is built with."""
        from kvledger.contracts.machines.suites import CACHE_MODELS, ENGINE_SYSTEM_CONFIGS

        return dict(ENGINE_SYSTEM_CONFIGS) if self.system else dict(CACHE_MODELS)

    def build(self, config: Any, model: str) -> Any:
        """One adapter for ``config``; ``Unsupported`` passes through, anything else is a usage error."""
        from kvledger.contracts.adapters.protocol import Unsupported

        try:
            made = self.factory(config)
        except Unsupported:
            raise
        except Exception as err:
            _fail_usage(
                f"--adapter {self.spec}: the factory raised {type(err).__name__} for model {model!r}: {err}".rstrip(
                    ": "
                )
            )
        missing = missing_members(made, self.system)
        if missing:
            kind = "system adapter" if self.system else "cache adapter"
            doc = "docs/own-scheduler.md" if self.system else "docs/own-cache.md"
            _fail_usage(
                f"--adapter {self.spec}: the factory returned {type(made).__name__!r}, not a {kind} "
                f"(missing {', '.join(missing)}; see {doc})"
            )
        if self.set_aside:
            from kvledger.contracts.adapters.protocol import set_aside

            try:
                made = set_aside(made, self.set_aside)
            except (AttributeError, TypeError) as err:
                _fail_usage(f"--set-aside: adapter {self.spec}'s capabilities cannot be narrowed: {err}")
        return made

    def validate(self, models: list[str]) -> dict[str, str]:
        """Build one adapter per model (name, version, engine class and whether it runs kvledger's impl come from them).

        Returns the models the adapter declines (``Unsupported``), with its reason; declining all is a usage error.
        """
        from kvledger.contracts.adapters.protocol import Unsupported
        from kvledger.contracts.adapters.reference import ReferenceAdapter
        from kvledger.contracts.adapters.reference_system import ReferenceSystemAdapter

        configs = self.configs()
        unsupported: dict[str, str] = {}
        for m in models:
            try:
                made = self.build(configs[m], m)
            except Unsupported as err:
                unsupported[m] = str(err) or "unsupported"
                continue
            self.name, self.version = str(made.name), str(made.version)
            self.engine_class = str(getattr(made, "engine_class", type(made).__qualname__))
            self.runs_reference = isinstance(made, ReferenceAdapter | ReferenceSystemAdapter)
        if models and len(unsupported) == len(models):
            _fail_usage(
                f"--adapter {self.spec}: the adapter builds none of the model kinds asked for "
                f"({'; '.join(f'{m}: {why}' for m, why in unsupported.items())})"
            )
        return unsupported


def _capabilities_set_aside(names: list[str], system: bool) -> frozenset[str]:
    """The capabilities ``--set-aside`` names (a capability or one of its laws each); unknown: a usage error."""
    from kvledger.contracts.adapters.protocol import RULES_NEEDING, capabilities_named
    from kvledger.contracts.adapters.system import SYSTEM_RULES_NEEDING

    needing = SYSTEM_RULES_NEEDING if system else RULES_NEEDING
    out: set[str] = set()
    for name in names:
        caps = capabilities_named(name, needing)
        if not caps:
            _fail_usage(
                f"--set-aside {name!r}: neither a capability nor a law an adapter of the "
                f"{'system' if system else 'cache'} suite may lack; capabilities: {', '.join(needing)}"
            )
        out |= caps
    return frozenset(out)


def missing_members(obj: object, system: bool) -> list[str]:
    """The members of the adapter protocol (``SystemAdapter`` or ``CacheAdapter``) ``obj`` lacks."""
    from kvledger.contracts.adapters.protocol import CacheAdapter
    from kvledger.contracts.adapters.system import SystemAdapter

    proto: type = SystemAdapter if system else CacheAdapter
    names = [*getattr(proto, "__annotations__", {}), *(n for n in vars(proto) if not n.startswith("_"))]
    return [n for n in dict.fromkeys(names) if not hasattr(obj, n)]


def _adapter_run(
    probe: _Probe,
    model: str,
    unsupported: str | None,
    run_settings: Settings,
    seed: int | None,
    faults_on: list[str],
    progress: Progress,
    database: ExampleDatabase | None = None,
    shrink_for: float | None = None,
) -> CheckResult:
    """Run the suite's machine for ``model`` on an adapter; unsupported models and capabilities are skipped."""
    from kvledger.contracts.machines.campaign import check_adapter_model
    from kvledger.contracts.machines.regression import render
    from kvledger.contracts.machines.runner import CheckResult

    if unsupported is not None:
        return CheckResult(probe.suite, model, [], skipped=[f"model not supported by the adapter: {unsupported}"])
    config = probe.configs()[model]

    def regression(rule: str, lines: list[str]) -> str:
        return render(probe.suite, model, faults_on, rule, lines, adapter=probe.spec, set_aside=probe.set_aside)

    return check_adapter_model(
        lambda: probe.build(config, model),
        probe.system,
        model,
        run_settings,
        seed,
        regression,
        progress,
        database,
        shrink_for=shrink_for,
    )


class _CheckDisplay:
    """Progress of ``kvledger check``: a live bar on a terminal (suite/model, examples, rate, elapsed), else lines.

    On a terminal, stderr shows the running model's examples out of the
    profile's, examples per second and the elapsed time, and the number of
    models done. Elsewhere (CI logs, pipes) each model gets one plain line on
    stderr when it ends, so stdout stays the table or the JSON alone.
    """

    def __init__(self, jobs: int, examples: int) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.console = Console(stderr=True, highlight=False)
        self.jobs, self.examples, self.index = jobs, examples, 0
        self.live = self.console.is_terminal
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("examples  {task.fields[rate]}  {task.fields[steps]} steps"),
            TimeElapsedColumn(),
            console=self.console,
            transient=True,
            disable=not self.live,
        )
        self.task = self.progress.add_task("", total=examples, rate="", steps=0, visible=False)
        self.started = time.perf_counter()

    def __enter__(self) -> _CheckDisplay:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.__exit__(None, None, None)

    def start(self, suite: str, model: str) -> Callable[[int, int, bool], None]:
        """Show ``suite/model`` starting; returns the runner's per-example callback."""
        self.index += 1
        self.started = time.perf_counter()
        label = f"[{self.index}/{self.jobs}] {suite}/{model}"
        self.progress.reset(self.task, total=self.examples, description=label, rate="", steps=0, visible=True)

        def tick(examples: int, steps: int, shrinking: bool) -> None:
            rate = examples / max(time.perf_counter() - self.started, 1e-9)
            desc = f"{label} [red]violation found, shrinking[/red]" if shrinking else label
            self.progress.update(self.task, completed=examples, rate=f"{rate:.1f}/s", steps=steps, description=desc)

        return tick

    def done(self, r: CheckResult) -> None:
        if not self.live:
            verdict = "holds" if r.ok else f"VIOLATED {r.violation.rule if r.violation else ''}"
            self.console.print(
                f"kvledger check [{self.index}/{self.jobs}] {r.suite}/{r.model}: {verdict} "
                f"({r.examples} examples, {r.steps} steps, {r.seconds:.1f}s)",
                markup=False,
                soft_wrap=True,
            )


@app.command("faults")
def list_faults() -> None:
    """List the named faults (the historical bugs re-created in the reference implementation)."""
    from rich.table import Table

    from kvledger.contracts.machines.suites import SUITES, fault_targets
    from kvledger.impl.faults import FAULTS

    table = Table(title="named faults (kvledger check --fault NAME)")
    for col in ("fault", "upstream fix", "what it breaks", "acts in", "laws expected to catch it"):
        table.add_column(col, overflow="fold")
    for f in FAULTS.values():
        targets = fault_targets(f)
        where = ", ".join(
            s
            if all((s, m) in targets for m in SUITES[s].models)
            else ", ".join(f"{s}/{m}" for t, m in targets if t == s)
            for s in dict.fromkeys(s for s, _ in targets)
        )
        table.add_row(f.name, f.upstream, f.title, where, " or ".join(f.laws))
    Console().print(table)


def _print_table(
    console: Console, results: list[CheckResult], faults_on: list[str], adapter: str | None = None
) -> None:
    from rich.table import Table

    title = f"kvledger check: {adapter or 'reference implementation'}"
    title += f" with fault {', '.join(faults_on)}" if faults_on else ""
    table = Table(title=title)
    for col in ("suite", "model", "rules", "examples", "steps", "time", "verdict"):
        table.add_column(col, justify="right" if col in ("examples", "steps", "time") else "left", overflow="fold")
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
        console.print(f"\n[red bold]{r.suite}/{r.model}: {v.rule}[/red bold]")
        console.print(v.message, markup=False, highlight=False, soft_wrap=True)
        console.print(f"shrunk counterexample ({v.length} steps, found after {r.examples} examples):")
        for i, step in enumerate(v.steps, 1):
            console.print(f"  {i:2d}. {step}", markup=False, highlight=False, soft_wrap=True)
        console.print("\nregression test:\n" + v.program, markup=False, highlight=False, soft_wrap=True)


# ---------------------------------------------------------------- spec-check


@app.command("spec-check")
def spec_check(
    modules: Annotated[
        list[str] | None, typer.Argument(help="spec modules to check (default: every module of kvledger.spec)")
    ] = None,
    per_condition_timeout: Annotated[float, typer.Option(help="seconds CrossHair spends per condition (> 0)")] = 4.0,
    jobs: Annotated[int, typer.Option(min=0, help="modules checked in parallel (0: one per CPU)")] = 0,
) -> None:
    """Run CrossHair on the spec modules' contracts (exit 1 on a counterexample, 2 on a module with no contract)."""
    import os
    import tempfile
    from concurrent.futures import ThreadPoolExecutor, as_completed
    from pathlib import Path

    if not math.isfinite(per_condition_timeout) or per_condition_timeout <= 0:
        _fail_usage(f"--per-condition-timeout: expected a positive number of seconds, got {per_condition_timeout}")
    from kvledger.contracts.crosshair_check import SPEC_MODULES, checkable, run_crosshair

    targets = list(dict.fromkeys(modules or SPEC_MODULES))
    counts: dict[str, int] = {}
    for module in targets:
        try:
            counts[module] = len(checkable(module))
        except ImportError as err:
            _fail_usage(f"spec-check: cannot import {module}: {err}")
    empty = [m for m in targets if counts[m] == 0]
    if empty and modules:
        _fail_usage(f"spec-check: {', '.join(empty)}: no function with an icontract contract, nothing to check")
    for module in empty:
        typer.echo(f"crosshair {module}: nothing to check (no function with an icontract contract), skipped")
    targets = [m for m in targets if counts[m]]

    def one(module: str) -> tuple[str, int, str, str, float]:
        start = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp:
            r = run_crosshair([module], Path(tmp), per_condition_timeout=per_condition_timeout)
        return module, r.returncode, r.stdout, r.stderr, time.perf_counter() - start

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    console = Console(stderr=True, highlight=False)
    worst = 0
    with (
        ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 1) as pool,
        Progress(
            SpinnerColumn(),
            TextColumn("crosshair [bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("modules"),
            TimeElapsedColumn(),
            console=console,
            transient=True,
            disable=not console.is_terminal,
        ) as progress,
    ):
        task = progress.add_task(", ".join(m.rsplit(".", 1)[-1] for m in targets), total=len(targets))
        running = list(targets)
        futures = [pool.submit(one, m) for m in targets]
        for fut in as_completed(futures):
            module, code, out, errors, seconds = fut.result()
            running.remove(module)
            progress.update(task, advance=1, description=", ".join(m.rsplit(".", 1)[-1] for m in running) or "done")
            typer.echo(out, nl=False)
            typer.echo(errors, nl=False, err=True)
            verdict = "no counterexample" if code == 0 else f"exit {code}"
            typer.echo(f"crosshair {module}: {verdict} ({counts[module]} functions with contracts, {seconds:.0f}s)")
            worst = max(worst, code)
    raise typer.Exit(worst)


def main() -> None:
    """Console entry point."""
    app()
