"""The engine adapters' tests, run inside each engine venv that ``.ci/sglang_env`` and ``.ci/vllm_env`` built.

The main venv has neither SGLang nor vLLM, so ``tests/sglang`` and
``tests/vllm`` skip there; these tests run those directories with each engine
venv's interpreter (``build/sglang-<release>``, ``build/vllm-<release>``), as
a child process, and assert they pass. CI builds the venvs first (``.ci/run``
calls both scripts with ``--build-only``); a checkout without them skips,
saying how to build them.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SGLANG = ("0.5.9", "0.5.10", "0.5.11", "0.5.12", "0.5.13", *(f"0.5.{n}" for n in range(14, 24)))
VLLM = ("0.6.6.post1", "0.7.3", "0.8.5.post1", "0.9.2", "0.10.2", "0.34.0")
ENGINES = {"sglang": ("SGLang", "SGLANG_ENV_DIR"), "vllm": ("vLLM", "VLLM_ENV_DIR")}


def _venv(engine: str, version: str) -> Path:
    return ROOT / os.environ.get(ENGINES[engine][1], "build") / f"{engine}-{version}"


def _counts(summary: str) -> dict[str, int]:
    """pytest's closing line as counts: ``3 passed, 1 xfailed in 2s`` -> {"passed": 3, "xfailed": 1}."""
    return {word: int(n) for n, word in re.findall(r"(\d+) (\w+)", summary.split(" in ")[0])}


def test_summary_counts_tell_failed_from_xfailed() -> None:
    counts = _counts("32 passed, 17 skipped, 3 xfailed, 1 xpassed, 17 warnings in 492.76s (0:08:12)")
    assert counts == {"passed": 32, "skipped": 17, "xfailed": 3, "xpassed": 1, "warnings": 17}
    assert _counts("1 failed, 8 passed in 5.1s")["failed"] == 1


@pytest.mark.slow
@pytest.mark.parametrize(
    ("engine", "version"), [("sglang", v) for v in SGLANG] + [("vllm", v) for v in VLLM], ids=lambda x: str(x)
)
def test_adapter_tests_pass_in_their_venv(engine: str, version: str) -> None:
    name = ENGINES[engine][0]
    python = _venv(engine, version) / "bin" / "python"
    if not python.exists():
        pytest.skip(f"no {name} {version} venv at {python.parent.parent} (build it: .ci/{engine}_env --build-only)")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "KVLEDGER_HYPOTHESIS"))}
    proc = subprocess.run(
        [str(python), "-m", "pytest", f"tests/{engine}", "-q", "-n", "0", "-p", "no:cacheprovider"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"tests/{engine} failed under {name} {version} ({python}):\n{out[-6000:]}"
    summary = out.strip().splitlines()[-1]
    counts = _counts(summary)
    assert counts.get("passed", 0) > 0 and counts.get("failed", 0) == 0 and counts.get("error", 0) == 0, summary
    sys.stdout.write(f"{name} {version}: {summary}\n")


@pytest.mark.slow
def test_the_documented_command_runs_in_an_sglang_venv() -> None:
    """docs/own-cache.md's ``build/sglang-<version>/bin/kvledger check --adapter ...`` exists and checks SGLang."""
    venv = _venv("sglang", SGLANG[-1])
    if not (venv / "bin" / "python").exists():
        pytest.skip(f"no SGLang {SGLANG[-1]} venv (build it: .ci/sglang_env --build-only)")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "KVLEDGER_"))}
    command = [str(venv / "bin" / "kvledger"), "check", "--adapter", "sglang", "--model", "full", "--examples", "5"]
    proc = subprocess.run(
        [*command, "--json"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert '"adapter": "sglang' in proc.stdout
