"""The vLLM CPU import helper: clear errors outside the tested releases, stubs only where needed, refusing to run."""

from __future__ import annotations

import importlib.metadata
import sys

import pytest

from kvledger.contracts.adapters.vllm import cpu_import
from kvledger.contracts.adapters.vllm.cpu_import import (
    STUB_VERSION,
    STUBBABLE,
    TESTED,
    StubbedModule,
    VLLMUnavailable,
    VLLMVersionError,
    installed_version_or_none,
    unavailable_reason,
)

HAVE = installed_version_or_none()


def test_tested_releases_span_the_first_v1_manager_to_the_current_release() -> None:
    assert TESTED[0] == "0.6.6.post1" and TESTED[-1] == "0.34.0"


@pytest.mark.skipif(HAVE is not None, reason="checks the error without vLLM installed")
def test_missing_vllm_is_a_clear_error() -> None:
    with pytest.raises(VLLMUnavailable, match="vllm is not installed"):
        cpu_import.import_vllm()
    assert unavailable_reason() == "vLLM is not installed (build an environment with .ci/vllm_env)"


@pytest.mark.skipif(HAVE is None, reason="vLLM is not installed (build one with .ci/vllm_env)")
def test_an_untested_release_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_import, "installed_version", lambda: "0.5.0")
    with pytest.raises(VLLMVersionError, match=r"0\.5\.0 is not a release .* tested on \(0\.6\.6\.post1, "):
        cpu_import.import_vllm()
    monkeypatch.setattr(cpu_import, "installed_version_or_none", lambda: "0.5.0")
    assert unavailable_reason() == f"vLLM 0.5.0 is installed, outside the tested releases ({', '.join(TESTED)})"
    assert unavailable_reason("0.33.0") == "needs vLLM 0.33.0; 0.5.0 is installed"


@pytest.mark.skipif(HAVE not in TESTED, reason="needs a tested vLLM release (build one with .ci/vllm_env)")
def test_the_manager_imports_and_only_stubbable_modules_are_stubbed() -> None:
    cpu_import.import_vllm()
    stubbed = cpu_import.stubbed_modules()
    assert all(any(s == x or s.startswith(x + ".") for x in STUBBABLE) for s in stubbed), stubbed
    for real in ("vllm.v1.core.kv_cache_manager", "vllm.v1.core.kv_cache_utils", "vllm.v1.request", "msgspec"):
        assert not getattr(sys.modules[real], "__kvledger_stub__", False), f"{real} must run for real"
    # vllm/__init__ was skipped (it imports torch._inductor)
    assert not hasattr(sys.modules["vllm"], "LLM")
    assert cpu_import.import_vllm() == HAVE and cpu_import.stubbed_modules() == stubbed  # idempotent


@pytest.mark.skipif(HAVE not in TESTED, reason="needs a tested vLLM release (build one with .ci/vllm_env)")
def test_a_stub_refuses_to_run() -> None:
    cpu_import.import_vllm()
    name = cpu_import.stubbed_modules()[0]
    thing = sys.modules[name].Anything
    with pytest.raises(StubbedModule, match=f"{name}.Anything belongs to a module kvledger stubbed"):
        thing()


@pytest.mark.skipif(HAVE not in TESTED, reason="needs a tested vLLM release (build one with .ci/vllm_env)")
def test_a_stubbed_package_reports_the_stub_version() -> None:
    """0.21.0–0.31.0 read ``version("transformers")`` at import (0.24 on refuse below 5.0.0): a stub answers."""
    cpu_import.import_vllm()
    packages = [name for name in cpu_import.stubbed_modules() if "." not in name]
    assert packages
    assert {importlib.metadata.version(name) for name in packages} == {STUB_VERSION}
