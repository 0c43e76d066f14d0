"""SGLang's caches recorded through the adapter and replayed against the spec alone (``kvledger replay``).

0.5.23's unified cache (both tree cores, every model kind) and 0.5.9's
``RadixCache`` replay clean; 0.5.9's ``MambaRadixCache`` fails replay by
``inv_lru_detached``: its ``LRUList`` leaves a removed node's links (B1,
fixed upstream in SGLang PR #25770), seen from the trace alone.
"""

from __future__ import annotations

import io

import pytest

from kvledger.contracts.adapters.protocol import CacheConfig, load_factory
from kvledger.contracts.adapters.sglang.cpu_import import unavailable_reason
from kvledger.contracts.machines.suites import CACHE_MODELS
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
