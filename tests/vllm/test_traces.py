"""Record and replay of vLLM's own KV cache manager (tests/vllm runs inside a vLLM venv).

``kvledger record --system --adapter vllm`` drives vLLM's real manager and
writes a system trace whose shared pool is vLLM's block pool: each block's
holders (the requests whose block tables name it), ``ref_cnt`` as vLLM keeps
it, and the free queue's members. ``kvledger replay`` checks it against the
spec alone. The verdict must agree with the shared-block laws checked live on
the same run (the trace carries the holder, count, queue and sentinel laws;
keys, index and links stay live-only), whatever the installed release breaks,
so no release is named here. A clean trace, broken by hand, must fail.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kvledger.contracts.adapters.system import SystemSnapshot
from kvledger.contracts.adapters.vllm.cpu_import import installed_version_or_none, unavailable_reason
from kvledger.contracts.cli import app
from kvledger.contracts.machines.shared_laws import check_shared_laws, check_transition
from kvledger.contracts.machines.suites import SYSTEM_CONFIGS
from kvledger.contracts.trace.adapter_recorder import record_adapter_workload
from kvledger.contracts.trace.replay import ReplayResult, replay, replay_path
from kvledger.contracts.trace.system_replay import SHARED_LAWS

HAVE = installed_version_or_none()
pytestmark = pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason()))
ADAPTERS = {"full": "vllm", "hybrid": "vllm-hybrid"}


def _hybrid_ok() -> bool:
    from kvledger.contracts.adapters.vllm.adapter import VLLMAdapter

    try:
        VLLMAdapter(window=8)
    except ValueError:
        return False
    return True


def _adapter(model: str) -> Any:
    from kvledger.contracts.adapters.vllm.adapter import vllm_factory, vllm_hybrid_factory

    if model == "hybrid" and not _hybrid_ok():
        pytest.skip(f"vLLM {HAVE} has no hybrid (full + sliding window) manager")
    return (vllm_hybrid_factory if model == "hybrid" else vllm_factory)(SYSTEM_CONFIGS["full"])


class Watched:
    """An adapter whose every snapshot (the recorder takes one after each call) is also checked live."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.broken: dict[str, str] = {}  # law -> the first detail the live check gave
        self.prev: Any = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def snapshot(self) -> SystemSnapshot:
        snap: SystemSnapshot = self.inner.snapshot()
        assert snap.shared is not None
        found = check_shared_laws(snap.shared)
        if self.prev is not None:
            found += check_transition(self.prev, snap.shared)
        for law, detail in found:
            self.broken.setdefault(law, detail)
        self.prev = snap.shared
        return snap


def _record(model: str, seed: int, ops: int = 250) -> tuple[list[str], Watched]:
    watched = Watched(_adapter(model))
    buf = io.StringIO()
    record_adapter_workload(watched, ops, seed, buf)  # type: ignore[arg-type]
    return buf.getvalue().splitlines(), watched


def _replay(lines: list[str]) -> ReplayResult:
    return replay(io.StringIO("\n".join(lines) + "\n"))


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("model", list(ADAPTERS))
def test_a_recorded_trace_replays_as_the_live_laws_say(model: str, seed: int) -> None:
    lines, watched = _record(model, seed)
    header = json.loads(lines[0])
    assert header["adapter"] == "vllm" and header["version"] == HAVE
    assert set(header["shared"]) == {"kv"} and header["pools"]["kv"][1] == watched.inner.num_blocks
    ops = [json.loads(t)["op"] for t in lines[1:]]
    assert {"join", "leave", "count", "queue"} <= set(ops)
    r = _replay(lines)
    assert r.error is None, r.error
    traceable = {law for law in watched.broken if law in SHARED_LAWS}
    if not traceable:
        assert r.ok, (r.violation, watched.broken)
        assert r.checked["inv_refcount_counts_holders"] > 0 and r.checked["inv_free_iff_unheld"] > 0
    else:
        assert r.violation is not None, f"live: {watched.broken}; the trace replayed clean"
        assert r.violation.rule in traceable, (r.violation, watched.broken)
        assert "kv block" in r.violation.message


def _clean(model: str) -> list[str]:
    for seed in range(4):
        lines, watched = _record(model, seed, 120)
        if not watched.broken and _replay(lines).ok:
            return lines
    pytest.skip(f"vLLM {HAVE} {model}: no clean trace to break by hand (the release breaks a law the trace carries)")


@pytest.mark.parametrize("name", ["a holder dropped", "a counter off by one", "a block freed while held"])
@pytest.mark.parametrize("model", list(ADAPTERS))
def test_a_hand_broken_vllm_trace_fails_naming_block_and_holder(
    model: str, name: str, shared_breaks: dict[str, Any]
) -> None:
    brk = shared_breaks[name]
    broken, block, holder = brk.apply(_clean(model))
    r = _replay(broken)
    assert r.exit_code == 1 and r.violation is not None, (name, r.error)
    assert r.violation.rule in brk.laws, r.violation
    assert f"kv block {block}" in r.violation.message and holder in r.violation.message, r.violation.message


@pytest.mark.parametrize("model", list(ADAPTERS))
def test_record_and_replay_through_the_cli(model: str, tmp_path: Path) -> None:
    out = tmp_path / "vllm.jsonl"
    runner = CliRunner()
    args = ["record", "--system", "--adapter", ADAPTERS[model], "--ops", "150", "-o", str(out)]  # model: full
    rec = runner.invoke(app, args)
    if model == "hybrid" and not _hybrid_ok():
        assert rec.exit_code == 2 and "no hybrid" in rec.output
        return
    assert rec.exit_code == 0, rec.output
    assert "of the full memory manager" in rec.output
    res = runner.invoke(app, ["replay", str(out), "--json"])
    verdict = replay_path(out)
    assert res.exit_code == verdict.exit_code in (0, 1), res.output
    shown = json.loads(res.stdout)
    assert "inv_refcount_counts_holders" in shown["checked"]
    assert "inv_index_names_carriers" in {u["law"] for u in shown["unchecked"]}  # never in a system trace: said so
