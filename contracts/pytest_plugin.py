"""The kvledger pytest plugin (entry point ``kvledger``), inactive unless asked.

``pytest --kvledger-contracts=on`` (or ``slow``; or ``KVLEDGER_CONTRACTS`` in
the environment) attaches the contracts to the reference implementation for
the whole run, before any test module is imported. ``--kvledger-profile``
picks a Hypothesis profile (``check``, ``ci``, ``thorough``, ``dev``).

It also gives every suite a ``kvledger_cache`` fixture: a checked reference
radix cache (a :class:`~kvledger.contracts.trace.recorder.Recorder` over
:class:`~kvledger.contracts.adapters.reference.ReferenceAdapter`); the test
drives ``kvledger_cache.adapter`` and at teardown the recorded trace must
replay against the spec and the final snapshot obey every law. Configure it
with ``@pytest.mark.kvledger_cache(model="hybrid", page_size=2, ...)`` or the
ini option ``kvledger_cache_model``. :func:`conformance_test` turns an
adapter factory into a test function running the cache conformance machine
inside the user's suite (``test_mine = conformance_test("pkg.mod:factory")``);
``pytest --kvledger-adapter pkg.mod:factory`` (repeatable) adds such a test to
any run (ini ``kvledger_conformance_examples``: examples per model, default 10).

For scheduler-level tests, the ``kvledger_memory`` fixture gives a checked
reference memory manager: ``kvledger_memory.recorder`` (a
:class:`~kvledger.contracts.trace.system_recorder.SystemRecorder`) takes the calls a
scheduler makes (add, admit, extend, finish, chunk, retract, abort, sessions,
evict); at teardown a leak check runs and the system trace must replay.
Configure it with ``@pytest.mark.kvledger_memory(model="mamba")`` (``full``,
``paged``, ``mamba``).
"""

from __future__ import annotations

import dataclasses
import io
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest

from kvledger.contracts.machines.profiles import PROFILES, profile_from_env
from kvledger.contracts.tiers import LEVELS, Level, level_from_env

if TYPE_CHECKING:  # NOTE: the plugin loads in every pytest run of the venv; it imports torch etc. only when asked
    from kvledger.contracts.adapters.protocol import AdapterFactory, CacheConfig, Snapshot
    from kvledger.contracts.adapters.reference import ReferenceAdapter
    from kvledger.contracts.trace.recorder import Recorder
    from kvledger.contracts.trace.system_recorder import SystemRecorder
    from kvledger.impl.memory import MemoryManager


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kvledger")
    group.addoption(
        "--kvledger-contracts",
        choices=LEVELS,
        default=None,
        help="attach kvledger contracts to the reference implementation (default: $KVLEDGER_CONTRACTS or off)",
    )
    group.addoption(
        "--kvledger-profile",
        choices=PROFILES,
        default=None,
        help=f"kvledger Hypothesis profile: {', '.join(PROFILES)} (default: $KVLEDGER_HYPOTHESIS_PROFILE)",
    )
    group.addoption(
        "--kvledger-adapter",
        action="append",
        default=[],
        metavar="package.module:factory",
        help="add a test running the cache conformance machine on this adapter factory (repeatable)",
    )
    _addini(parser)


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config) -> None:
    """Validate kvledger's environment variables before any conftest reads them: a bad value is a usage error."""
    _env_level()
    _env_profile()


def _env_level() -> Level:
    try:
        return level_from_env()
    except ValueError as err:
        raise pytest.UsageError(str(err)) from None


def _env_profile() -> str | None:
    try:
        return profile_from_env()
    except ValueError as err:
        raise pytest.UsageError(str(err)) from None


def pytest_configure(config: pytest.Config) -> None:
    """Attach the contract tier and load the profile asked for; with neither asked, import nothing heavy."""
    _register_markers(config)
    _check_ini(config)
    level: Level = config.getoption("--kvledger-contracts") or _env_level()
    profile = config.getoption("--kvledger-profile") or _env_profile()
    if level != "off":
        from kvledger.contracts import bindings

        bindings.install(level)
    if profile:
        from hypothesis import settings

        from kvledger.contracts.machines.profiles import register_profiles

        register_profiles()
        settings.load_profile(profile)


def _check_ini(config: pytest.Config) -> None:
    """The kvledger ini options, checked before any test runs: a bad value is a usage error naming the allowed ones."""
    examples = str(config.getini("kvledger_conformance_examples")).strip()
    if not examples.isdigit() or int(examples) < 1:
        raise pytest.UsageError(f"kvledger_conformance_examples = {examples!r}: expected a whole number, at least 1")
    model = str(config.getini("kvledger_cache_model")).strip()
    if model:  # NOTE: only a project that configures the fixture pays for importing the models
        from kvledger.contracts.machines.suites import CACHE_MODELS

        if model not in CACHE_MODELS:
            raise pytest.UsageError(
                f"kvledger_cache_model = {model!r}: unknown model; expected one of {', '.join(CACHE_MODELS)}"
            )


def _installed_level() -> str:
    bindings = sys.modules.get("kvledger.contracts.bindings")  # never imported: nothing was installed
    return str(bindings.current_level()) if bindings is not None else "off"


def pytest_report_header(config: pytest.Config) -> str:
    return f"kvledger: contracts {_installed_level()}"


def pytest_unconfigure(config: pytest.Config) -> None:
    bindings = sys.modules.get("kvledger.contracts.bindings")
    if bindings is not None:
        bindings.uninstall()


# ---------------------------------------------------------------- a checked cache, and conformance in the user's suite

MODEL_FIELDS = ("page_size", "window", "mamba", "kv_tokens", "swa_tokens", "mamba_slots")


def _addini(parser: pytest.Parser) -> None:
    parser.addini("kvledger_cache_model", "default model of the kvledger_cache fixture (full, hybrid, ...)", default="")
    parser.addini("kvledger_conformance_examples", "examples per model for --kvledger-adapter tests", default="10")


def _register_markers(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "kvledger_cache(model=None, **CacheConfig fields): configure the kvledger_cache fixture "
        "(page_size, window, mamba, kv_tokens, swa_tokens, mamba_slots)",
    )
    config.addinivalue_line(
        "markers", "kvledger_memory(model='full'): configure the kvledger_memory fixture (full, paged, mamba)"
    )


@dataclass
class CheckedCache:
    """A reference radix cache behind a :class:`Recorder`: every call is traced; teardown checks trace and state.

    ``adapter`` is the recording :class:`CacheAdapter` to drive (the same
    methods as any adapter); ``reference`` the wrapped reference adapter.
    """

    adapter: Recorder
    reference: ReferenceAdapter
    trace: io.StringIO

    @property
    def config(self) -> CacheConfig:
        return self.reference.config

    def violations(self) -> list[str]:
        """Every law broken now: the trace replayed against the spec, then the laws on the state itself."""
        from kvledger.contracts.trace.replay import replay as replay_trace

        out: list[str] = []
        self.trace.seek(0)
        r = replay_trace(io.StringIO(self.trace.getvalue()))
        if r.error is not None:
            out.append(f"trace: {r.error}")
        if r.violation is not None:
            out.append(f"{r.violation.rule} at step {r.violation.step} ({r.violation.op}): {r.violation.message}")
        return out + snapshot_violations(self.reference.snapshot())


def snapshot_violations(snap: Snapshot) -> list[str]:
    """The laws a single snapshot must obey, as messages for those it breaks (empty: all hold)."""
    from kvledger.spec import ledger as L
    from kvledger.spec import locks as K
    from kvledger.spec import lru as U
    from kvledger.spec import prefix as P

    out = [f"ledger laws of pool {n!r}" for n, led in snap.ledgers.items() if not L.inv_ledger(led)]
    if not P.inv_prefix(snap.prefix):
        out.append("inv_prefix")
    out += [f"LRU laws of {c.value}" for c, lst in snap.lru.items() if not U.inv_lru(lst)]
    if not (K.inv_lock_ref_counts_handles(snap.locks) and K.inv_lock_ref_nonnegative(snap.locks)):
        out.append("inv_lock_ref_counts_handles")
    if not P.inv_locked_cached(snap.prefix, snap.locks):
        out.append("inv_locked_cached")
    if snap.content and not P.inv_content(snap.prefix, snap.content):  # type: ignore[arg-type]
        out.append("inv_content")
    return out


def cache_config_of(request: pytest.FixtureRequest) -> CacheConfig:
    """The config the ``kvledger_cache`` marker (or ini ``kvledger_cache_model``) asks for."""
    from kvledger.contracts.machines.suites import CACHE_MODELS

    marker = request.node.get_closest_marker("kvledger_cache")
    kwargs = dict(marker.kwargs) if marker is not None else {}
    model = kwargs.pop("model", None) or request.config.getini("kvledger_cache_model") or "full"
    if model not in CACHE_MODELS:
        raise pytest.UsageError(f"kvledger_cache: unknown model {model!r}; expected one of {', '.join(CACHE_MODELS)}")
    unknown = set(kwargs) - set(MODEL_FIELDS)
    if unknown:
        raise pytest.UsageError(f"kvledger_cache: unknown fields {sorted(unknown)}; expected {', '.join(MODEL_FIELDS)}")
    return dataclasses.replace(CACHE_MODELS[model], **kwargs)


@pytest.fixture
def kvledger_cache(request: pytest.FixtureRequest) -> Iterator[CheckedCache]:
    """A checked reference cache; after the test, its trace must replay and its state obey every law."""
    from kvledger.contracts.adapters.reference import ReferenceAdapter
    from kvledger.contracts.trace.recorder import Recorder

    cfg = cache_config_of(request)
    ref = ReferenceAdapter(cfg)
    buf = io.StringIO()
    checked = CheckedCache(Recorder(ref, buf), ref, buf)
    yield checked
    _fail_if_broken("kvledger_cache", checked.violations())


def _fail_if_broken(fixture: str, bad: list[str]) -> None:
    """Fail the test at teardown, listing every law ``fixture``'s checks found broken."""
    if bad:
        pytest.fail(f"{fixture} laws broken:\n  " + "\n  ".join(bad), pytrace=False)


@dataclass
class CheckedMemory:
    """A reference memory manager behind a :class:`SystemRecorder`; teardown checks the trace and the leak checker.

    Drive it through ``recorder`` (its methods are the scheduler's calls);
    ``mm`` is the manager itself, for reading state.
    """

    recorder: SystemRecorder
    mm: MemoryManager
    trace: io.StringIO

    def violations(self) -> list[str]:
        """Every law broken now: a final leak check is recorded, then the whole trace replayed."""
        from kvledger.contracts.trace.replay import replay as replay_trace

        self.recorder.leak_check()
        r = replay_trace(io.StringIO(self.trace.getvalue()))
        if r.error is not None:
            return [f"trace: {r.error}"]
        if r.violation is not None:
            return [f"{r.violation.rule} at step {r.violation.step} ({r.violation.op}): {r.violation.message}"]
        return []


@pytest.fixture
def kvledger_memory(request: pytest.FixtureRequest) -> Iterator[CheckedMemory]:
    """A checked reference memory manager; after the test, its system trace must replay."""
    from kvledger.contracts.machines.suites import SYSTEM_MODELS
    from kvledger.contracts.machines.system import build_manager
    from kvledger.contracts.trace.system_recorder import SystemRecorder

    marker = request.node.get_closest_marker("kvledger_memory")
    model = (marker.kwargs.get("model") if marker is not None else None) or "full"
    if model not in SYSTEM_MODELS:
        raise pytest.UsageError(f"kvledger_memory: unknown model {model!r}; expected one of {', '.join(SYSTEM_MODELS)}")
    mm = build_manager(*SYSTEM_MODELS[model])
    buf = io.StringIO()
    checked = CheckedMemory(SystemRecorder(mm, buf), mm, buf)
    yield checked
    _fail_if_broken("kvledger_memory", checked.violations())


def conformance_test(
    factory: AdapterFactory | str, models: tuple[str, ...] | None = None, max_examples: int = 10, steps: int = 25
) -> Callable[[], None]:
    """A test function running the cache conformance machine on ``factory``'s adapters, one run per model.

    ``factory``: a ``CacheConfig -> CacheAdapter`` callable or ``package.module:factory``. Models the
    adapter raises :class:`Unsupported` for are skipped. Use ``test_my_cache = conformance_test(make)``.
    The machine is scheduled fairly as ``kvledger check`` schedules it (:mod:`kvledger.contracts.machines.fair`):
    each example may hold every rule within a few calls of the least-run one, so no rule is starved.
    """
    from hypothesis import settings
    from hypothesis.stateful import run_state_machine_as_test

    from kvledger.contracts.adapters.protocol import Unsupported, load_factory
    from kvledger.contracts.machines.cache import machine_for_cache
    from kvledger.contracts.machines.fair import fair
    from kvledger.contracts.machines.suites import CACHE_MODELS

    def test_kvledger_conformance() -> None:
        make = load_factory(factory) if isinstance(factory, str) else factory
        ran = 0
        for name in models or tuple(CACHE_MODELS):
            cfg = CACHE_MODELS[name]
            try:
                make(cfg)
            except Unsupported:
                continue
            machine = fair(machine_for_cache(lambda cfg=cfg: make(cfg)))  # type: ignore[misc]
            run_state_machine_as_test(
                machine, settings=settings(max_examples=max_examples, stateful_step_count=steps, deadline=None)
            )
            ran += 1
        if not ran:
            pytest.skip("the adapter supports none of the models")

    return test_kvledger_conformance


class ConformanceItem(pytest.Item):
    """The test ``--kvledger-adapter package.module:factory`` adds: the cache conformance machine on that adapter."""

    def __init__(self, *, target: str, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.target = target

    def runtest(self) -> None:
        conformance_test(self.target, max_examples=int(self.config.getini("kvledger_conformance_examples")))()

    def reportinfo(self) -> tuple[str, int | None, str]:
        return "kvledger", None, f"kvledger conformance of {self.target}"


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    for target in config.getoption("--kvledger-adapter") or []:
        from kvledger.contracts.adapters.protocol import load_factory

        try:
            load_factory(target)
        except ValueError as err:
            raise pytest.UsageError(f"--kvledger-adapter: {err}") from None
        items.append(ConformanceItem.from_parent(session, name=f"kvledger_conformance[{target}]", target=target))
