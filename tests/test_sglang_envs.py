"""The SGLang adapters' tests, run inside each SGLang venv that ``.ci/sglang_env`` built (``build/sglang-*``).

The main venv has no SGLang, so ``tests/sglang`` skips there; this test runs
that directory with each SGLang venv's interpreter, as a child process, and
asserts it passes. CI builds the venvs first (``.ci/run`` calls
``.ci/sglang_env --build-only``); a checkout without them skips, saying how
to build them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TESTED = ("0.5.9", "0.5.10", "0.5.11", "0.5.12", "0.5.13", "0.5.23")


def _venv(version: str) -> Path:
    return ROOT / os.environ.get("SGLANG_ENV_DIR", "build") / f"sglang-{version}"


@pytest.mark.slow
@pytest.mark.parametrize("version", TESTED)
def test_sglang_adapter_tests_pass_in_their_venv(version: str) -> None:
    python = _venv(version) / "bin" / "python"
    if not python.exists():
        pytest.skip(f"no SGLang {version} venv at {python.parent.parent} (build it: .ci/sglang_env --build-only)")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "KVLEDGER_HYPOTHESIS"))}
    proc = subprocess.run(
        [str(python), "-m", "pytest", "tests/sglang", "-q", "-p", "no:cacheprovider"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"tests/sglang failed under SGLang {version} ({python}):\n{out[-6000:]}"
    summary = out.strip().splitlines()[-1]
    assert " passed" in summary and "failed" not in summary, summary
    sys.stdout.write(f"SGLang {version}: {summary}\n")


@pytest.mark.slow
def test_the_documented_command_runs_in_an_sglang_venv() -> None:
    """docs/own-cache.md's ``build/sglang-<version>/bin/kvledger check --adapter ...`` exists and checks SGLang."""
    version = TESTED[-1]
    command = _venv(version) / "bin" / "kvledger"
    if not (_venv(version) / "bin" / "python").exists():
        pytest.skip(f"no SGLang {version} venv (build it: .ci/sglang_env --build-only)")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "KVLEDGER_"))}
    proc = subprocess.run(
        [str(command), "check", "--adapter", "sglang", "--model", "full", "--examples", "5", "--json"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert '"adapter": "sglang' in proc.stdout
