"""Campaigns: many seeds of many machines, spread over local processes, for as long as a budget allows.

``kvledger check --jobs N`` runs the (suite, model, seed) jobs of a check in
``N`` worker processes and merges their results; ``--seeds K`` gives each
(suite, model) ``K`` seeds; ``--for 30m`` keeps drawing fresh seeds until the
time is up. Each job is an ordinary check run with its own seed: a violation
is shrunk in the worker that found it, and the campaign stops handing out
jobs at the first one. ``--db PATH`` keeps Hypothesis's example database
there, so a failure found tonight is replayed first tomorrow.

A worker is a fresh (spawned) interpreter: it installs the contract tier and
the faults itself, so nothing depends on what the parent process imported.
With ``--adapter`` the jobs check an engine's adapter instead of the reference
suites: the worker loads the same factory by its spec (an alias or
``package.module:factory``), so a campaign runs in the engine's environment
(the workers are that interpreter) and engine imports are paid once per worker.
"""

from __future__ import annotations

import itertools
import random
import re
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, replace
from multiprocessing import get_context
from typing import Any

from kvledger.contracts.machines.runner import CheckResult, Violation

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(s|m|h)?$")


def parse_duration(text: str, option: str = "--for") -> float:
    """Seconds in ``text`` (``90``, ``90s``, ``30m``, ``1.5h``); ``ValueError`` naming ``option`` and the forms
    otherwise."""
    m = _DURATION.match(text.strip())
    if m is None or float(m.group(1)) <= 0:
        raise ValueError(f"{option} {text!r}: expected a positive duration such as 90s, 30m or 1.5h")
    return float(m.group(1)) * {"s": 1, None: 1, "m": 60, "h": 3600}[m.group(2)]


@dataclass(frozen=True)
class Job:
    """One check run: a machine of ``suite`` for ``model``, drawn with ``seed`` (``None``: the profile's own draws,
    derandomised for ``check`` and ``ci``: the run a serial ``kvledger check`` makes)."""

    suite: str
    model: str
    seed: int | None


@dataclass(frozen=True)
class RunSpec:
    """What every job of a campaign shares (sent to the workers, so plain values only)."""

    profile: str = "ci"
    examples: int | None = None
    steps: int | None = None
    contracts: str = "on"
    faults: tuple[str, ...] = ()
    database: str | None = None
    kept: bool = True  # replay the kept programs before each job's search
    adapter: str | None = None
    """An adapter factory's spec (``--adapter``): the jobs check it instead of the reference suites."""
    system: bool = False
    """``adapter`` names a request-level system adapter (``--suite system``), else a cache adapter."""
    set_aside: tuple[str, ...] = ()
    """Capabilities the adapter is checked without (``--set-aside``)."""
    stop_at: float | None = None
    """A ``time.time()`` after which a job starts no new example (``--for``: set by :func:`run_campaign`)."""
    shrink_for: float | None = None
    """Seconds a violation may shrink (``--shrink-for``; ``None``: ``runner.shrink_seconds()``)."""


def check_adapter_model(
    build: Callable[[], Any],
    system: bool,
    model: str,
    run_settings: Any,
    seed: int | None,
    regression: Callable[[str, list[str]], str],
    progress: Any = None,
    database: Any = None,
    stop_at: float | None = None,
    shrink_for: float | None = None,
) -> CheckResult:
    """Run the cache (or system) machine for ``model`` on the adapters ``build`` makes; skipped laws reported.

    Shared by ``kvledger check --adapter`` and the campaign workers: the laws an
    adapter's capabilities cannot express are listed in ``skipped`` and left out of ``rules``.
    """
    from kvledger.contracts.adapters.protocol import skipped_rules
    from kvledger.contracts.adapters.system import skipped_system_rules
    from kvledger.contracts.machines.cache import machine_for_cache
    from kvledger.contracts.machines.runner import run_machine
    from kvledger.contracts.machines.suites import SUITES
    from kvledger.contracts.machines.system import machine_for_system

    suite = "system" if system else "cache"
    caps = build().capabilities
    machine = (machine_for_system if system else machine_for_cache)(build)
    rules = list(SUITES[suite].rules)
    result = run_machine(
        suite,
        model,
        machine,
        rules,
        run_settings,
        seed,
        regression,
        progress,
        database=database,
        stop_at=stop_at,
        shrink_for=shrink_for,
    )
    result.skipped = skipped_system_rules(caps) if system else skipped_rules(caps)
    result.rules = [r for r in result.rules if r not in result.skipped]
    return result


def adapter_builder(spec: RunSpec, model: str) -> Callable[[], Any]:
    """What builds ``spec.adapter``'s adapters for ``model`` in a worker (the parent validated the spec)."""
    from kvledger.contracts.adapters.protocol import load_factory, set_aside
    from kvledger.contracts.adapters.system import load_system_factory
    from kvledger.contracts.machines.suites import CACHE_MODELS, ENGINE_SYSTEM_CONFIGS

    assert spec.adapter is not None
    factory: Callable[[Any], Any] = load_system_factory(spec.adapter) if spec.system else load_factory(spec.adapter)
    config: Any = ENGINE_SYSTEM_CONFIGS[model] if spec.system else CACHE_MODELS[model]

    def build() -> Any:
        made = factory(config)
        return set_aside(made, frozenset(spec.set_aside)) if spec.set_aside else made

    return build


def run_job(spec: RunSpec, job: Job) -> dict[str, Any]:
    """Run one job in this process (a worker); returns the ``CheckResult`` as JSON."""
    from hypothesis import settings as Settings
    from hypothesis.database import DirectoryBasedExampleDatabase

    from kvledger.contracts import bindings
    from kvledger.contracts.machines.kept import kept_for
    from kvledger.contracts.machines.profiles import register_profiles
    from kvledger.contracts.machines.regression import render
    from kvledger.contracts.machines.runner import run_machine
    from kvledger.contracts.machines.suites import SUITES
    from kvledger.impl import faults

    register_profiles()
    overrides: dict[str, Any] = {} if job.seed is None else {"derandomize": False}
    if spec.examples is not None:
        overrides["max_examples"] = spec.examples
    if spec.steps is not None:
        overrides["stateful_step_count"] = spec.steps
    run_settings = Settings(Settings.get_profile(spec.profile), **overrides)
    database = DirectoryBasedExampleDatabase(spec.database) if spec.database else None
    bindings.install(spec.contracts)  # type: ignore[arg-type]
    faults.enable(*spec.faults)
    try:

        def regression(rule: str, lines: list[str]) -> str:
            extra: dict[str, Any] = {}
            if spec.adapter is not None:
                extra = {"adapter": spec.adapter, "set_aside": frozenset(spec.set_aside)}
            return render(job.suite, job.model, list(spec.faults), rule, lines, **extra)

        if spec.adapter is not None:
            build = adapter_builder(spec, job.model)
            result = check_adapter_model(
                build,
                spec.system,
                job.model,
                run_settings,
                job.seed,
                regression,
                database=database,
                stop_at=spec.stop_at,
                shrink_for=spec.shrink_for,
            )
        else:
            suite = SUITES[job.suite]
            result = run_machine(
                job.suite,
                job.model,
                suite.models[job.model](),
                list(suite.rules),
                run_settings,
                job.seed,
                regression,
                database=database,
                kept=kept_for(job.suite, job.model) if spec.kept else (),
                stop_at=spec.stop_at,
                shrink_for=spec.shrink_for,
            )
    finally:
        faults.disable()
        bindings.uninstall()
    out = result.to_json()
    out["seed"] = job.seed
    return out


def from_json(d: dict[str, Any]) -> CheckResult:
    """A ``CheckResult`` back from :func:`run_job`'s JSON."""
    v = d.get("violation")
    violation = None if v is None else Violation(v["rule"], v["message"], list(v["steps"]), v["program"])
    return CheckResult(
        d["suite"],
        d["model"],
        list(d["rules"]),
        d["examples"],
        d["steps"],
        d["seconds"],
        violation,
        list(d["skipped"]),
        cut=bool(d.get("cut", False)),
    )


def jobs_for(pairs: list[tuple[str, str]], seeds: Iterable[int | None]) -> Iterator[Job]:
    """Every (suite, model) pair for each seed in turn (a seed's pairs before the next seed's)."""
    for seed in seeds:
        for suite, model in pairs:
            yield Job(suite, model, seed)


def fresh_seeds(rng: random.Random) -> Iterator[int]:
    """Seeds drawn without end (``--for``)."""
    while True:
        yield rng.randrange(2**32)


@dataclass
class Progress:
    """What a campaign reports after each finished job (for a progress bar)."""

    done: int
    examples: int
    elapsed: float
    seed: int | None
    last: CheckResult | None

    @property
    def rate(self) -> float:
        return self.examples / self.elapsed if self.elapsed > 0 else 0.0


def run_campaign(
    spec: RunSpec,
    jobs: Iterable[Job],
    workers: int,
    *,
    seconds: float | None = None,
    stop_at_first: bool = True,
    on_progress: Callable[[Progress], None] | None = None,
    runner: Callable[[RunSpec, Job], dict[str, Any]] = run_job,
) -> list[tuple[Job, CheckResult]]:
    """Run ``jobs`` over ``workers`` spawned processes; stop handing out jobs when time is up or a law broke.

    Returns every finished job with its result, in the order they finished
    (the first violation found is the first failing entry). With ``seconds``, the jobs running when the
    time is up start no new example (each ends after the one it is running, or after shrinking a violation).
    """
    if seconds is not None:
        spec = replace(spec, stop_at=time.time() + seconds)
    start = time.perf_counter()
    pending = iter(jobs)
    results: list[tuple[Job, CheckResult]] = []
    running: dict[Future[dict[str, Any]], Job] = {}
    examples = 0
    stop = False

    def time_left() -> bool:
        return seconds is None or time.perf_counter() - start < seconds

    with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn")) as pool:
        while True:
            while not stop and len(running) < workers and time_left():
                job = next(pending, None)
                if job is None:
                    break
                running[pool.submit(runner, spec, job)] = job
            if not running:
                break
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for fut in done:
                job = running.pop(fut)
                if fut.cancelled():
                    continue
                result = from_json(fut.result())
                results.append((job, result))
                examples += result.examples
                if not result.ok and stop_at_first:
                    stop = True
                if on_progress is not None:
                    seed = next(iter(running.values())).seed if running else job.seed
                    on_progress(Progress(len(results), examples, time.perf_counter() - start, seed, result))
            if stop:
                for fut in list(running):
                    if fut.cancel():
                        del running[fut]
    return results


def seeds_for(seed: int | None, count: int) -> list[int]:
    """``count`` seeds starting at ``seed`` (0 when none was given)."""
    base = 0 if seed is None else seed
    return list(itertools.islice(itertools.count(base), count))
