"""SGLang's caches recorded through the adapter and replayed against the spec alone (``kvledger replay``).

0.5.23's unified cache (both tree cores, every model kind) and 0.5.9's
``RadixCache`` replay clean; 0.5.9's ``MambaRadixCache`` fails replay by
``inv_lru_detached``: its ``LRUList`` leaves a removed node's links (B1,
fixed upstream in SGLang PR #25770), seen from the trace alone. The installed
release's scheduler, recorded as a system trace, replays clean in the ``full``
and ``swa`` kinds.
"""

from __future__ import annotations

import io
import json

import pytest

from kvledger.contracts.adapters.protocol import CacheConfig, Unsupported, load_factory
from kvledger.contracts.adapters.sglang.cpu_import import installed_version_or_none, unavailable_reason
from kvledger.contracts.machines.suites import CACHE_MODELS, ENGINE_SYSTEM_CONFIGS
from kvledger.contracts.trace.adapter_recorder import record_adapter_workload
from kvledger.contracts.trace.recorder import record_workload
from kvledger.contracts.trace.replay import replay

MODELS = CACHE_MODELS
NEW = pytest.mark.skipif(unavailable_reason("0.5.23") is not None, reason=str(unavailable_reason("0.5.23")))
OLD = pytest.mark.skipif(unavailable_reason("0.5.9") is not None, reason=str(unavailable_reason("0.5.9")))


def _replayed(alias: str, cfg: CacheConfig, ops: int = 300, seed: int = 0) -> tuple[int, str | None]:
    buf = io.StringIO()
    rec = record_workload(load_factory(alias)(cfg), ops, seed, buf)
    assert rec.stopped_by is None, rec.stopped_by
    buf.seek(0)
    r = replay(buf)
    assert r.error is None, r.error
    return rec.events, None if r.violation is None else f"{r.violation.rule}: {r.violation.message}"


@NEW
@pytest.mark.parametrize("alias", ["sglang", "sglang-rust"])
@pytest.mark.parametrize("model", list(MODELS))
def test_unified_traces_replay_clean(alias: str, model: str) -> None:
    events, violation = _replayed(alias, MODELS[model])
    assert violation is None
    assert events > 300  # every operation wrote at least one event


@OLD
@pytest.mark.parametrize("model", ["full", "full-paged"])
def test_radix_cache_0_5_9_traces_replay_clean(model: str) -> None:
    assert _replayed("sglang-0.5.9", MODELS[model])[1] is None


@OLD
def test_mamba_radix_cache_0_5_9_trace_shows_b1() -> None:
    _, violation = _replayed("sglang-0.5.9-mamba", MODELS["mamba"])
    assert violation is not None and violation.startswith("inv_lru_detached")


# ---------------------------------------------------------------- system traces of SGLang's scheduler

ANY = pytest.mark.skipif(installed_version_or_none() is None, reason="SGLang is not installed")


def _system_trace(model: str, seed: int, ops: int = 300) -> str:
    """A system trace of the installed release's scheduler (``kvledger record --system --adapter sglang-system``),
    sessions left out (their known findings, e.g. a retracted turn aborted keeps its memory, are the machine's
    tests'): every law the trace states must then hold."""
    from kvledger.contracts.adapters.sglang.system_factory import installed_system_factory

    try:
        engine = installed_system_factory(ENGINE_SYSTEM_CONFIGS[model])
    except Unsupported as err:
        pytest.skip(f"{model}: {err}")
    engine.capabilities = frozenset(engine.capabilities) - {"sessions"}
    buf = io.StringIO()
    rec = record_adapter_workload(engine, ops, seed, buf)
    assert rec.stopped_by is None, rec.stopped_by
    return buf.getvalue()


def _replay(text: str) -> str | None:
    r = replay(io.StringIO(text))
    assert r.error is None, r.error
    return None if r.violation is None else f"{r.violation.rule}: {r.violation.message}"


@ANY
@pytest.mark.parametrize("model", ["full", "swa"])
def test_scheduler_traces_replay_clean_and_name_whom_a_retraction_ended(model: str) -> None:
    """SGLang's retraction is a decode step whose policy picks the victims (often none: it keeps one request
    running). The trace names whom each finish, retract or abort ended, so the replay holds on each release; read
    as if the named request had always ended (the ``ended`` fields dropped), the same trace breaks
    ``inv_owners_account`` wherever a retraction left its request running with memory."""
    text = _system_trace(model, seed=1)
    assert _replay(text) is None
    events = [json.loads(line) for line in text.splitlines()[1:]]
    if model == "swa":
        assert json.loads(text.splitlines()[0])["config"]["window"] == 4
    kept = [e for e in events if e.get("name") == "retract" and e["req"] not in e["ended"].get("retract", [])]
    assert kept, "no retraction left its request running: the workload no longer shows the engine's choice"
    naive = "\n".join(
        json.dumps({k: v for k, v in json.loads(line).items() if k != "ended"}) for line in text.splitlines()
    )
    violation = _replay(naive + "\n")
    assert violation is not None and violation.startswith("inv_owners_account") and "after retract" in violation
