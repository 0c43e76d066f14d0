"""The vLLM adapter's tests, run inside each vLLM venv that ``.ci/vllm_env`` built (``build/vllm-*``).

The main venv has no vLLM, so ``tests/vllm`` skips there; this test runs that
directory with each vLLM venv's interpreter, as a child process, and asserts
it passes. CI builds the venvs first (``.ci/vllm_env --build-only``); a
checkout without them skips, saying how to build them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TESTED = ("0.6.6.post1", "0.7.3", "0.10.2", "0.33.0")


def _venv(version: str) -> Path:
    return ROOT / os.environ.get("VLLM_ENV_DIR", "build") / f"vllm-{version}"


@pytest.mark.slow
@pytest.mark.parametrize("version", TESTED)
def test_vllm_adapter_tests_pass_in_their_venv(version: str) -> None:
    python = _venv(version) / "bin" / "python"
    if not python.exists():
        pytest.skip(f"no vLLM {version} venv at {python.parent.parent} (build it: .ci/vllm_env --build-only)")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "KVLEDGER_HYPOTHESIS"))}
    proc = subprocess.run(
        [str(python), "-m", "pytest", "tests/vllm", "-q", "-p", "no:cacheprovider"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"tests/vllm failed under vLLM {version} ({python}):\n{out[-6000:]}"
    summary = out.strip().splitlines()[-1]
    assert " passed" in summary and "failed" not in summary, summary
    sys.stdout.write(f"vLLM {version}: {summary}\n")
