"""The CPU import helper: tested-range errors, and stubs that refuse to run."""

from __future__ import annotations

import pytest

from kvledger.contracts.adapters.sglang import cpu_import
from kvledger.contracts.adapters.sglang.cpu_import import (
    LEGACY,
    LEGACY_MAMBA,
    LEGACY_SWA,
    UNIFIED,
    SGLangVersionError,
    StubbedGPUModule,
    TestedRange,
    installed_version_or_none,
)


def test_tested_ranges_name_their_versions() -> None:
    assert LEGACY.contains("0.5.9") and LEGACY.contains("0.5.23") and not LEGACY.contains("0.5.24")
    assert not LEGACY.contains("0.5.8")
    assert LEGACY_MAMBA.contains("0.5.9") and LEGACY_MAMBA.contains("0.5.20") and not LEGACY_MAMBA.contains("0.5.21")
    assert LEGACY_SWA.contains("0.5.9") and LEGACY_SWA.contains("0.5.20") and not LEGACY_SWA.contains("0.5.21")
    assert UNIFIED.contains("0.5.22") and UNIFIED.contains("0.5.23") and not UNIFIED.contains("0.5.24")
    assert not UNIFIED.contains("0.5.21")
    assert UNIFIED.describe() == "SGLang 0.5.22 to 0.5.23"
    assert TestedRange("x", "0.5.23", "0.5.23", ()).describe() == "SGLang 0.5.23"
    assert TestedRange("x", "0.5.9", "0.5.23", ()).describe() == "SGLang 0.5.9 to 0.5.23"


@pytest.mark.skipif(installed_version_or_none() is not None, reason="checks the error without SGLang installed")
def test_missing_sglang_is_a_clear_error() -> None:
    with pytest.raises(cpu_import.SGLangUnavailable, match="sglang is not installed"):
        cpu_import.import_sglang(LEGACY)


@pytest.mark.skipif(
    installed_version_or_none() is None, reason="SGLang is not installed (build one with .ci/sglang_env)"
)
def test_version_outside_the_tested_range_is_refused() -> None:
    have = installed_version_or_none()
    other = UNIFIED if have is not None and LEGACY_MAMBA.contains(have) else LEGACY_MAMBA
    with pytest.raises(SGLangVersionError, match=rf"tested on \({other.describe()}\)"):
        cpu_import.import_sglang(other)


@pytest.mark.skipif(installed_version_or_none() not in ("0.5.9", "0.5.23"), reason="needs SGLang 0.5.9 or 0.5.23")
def test_stubs_only_gpu_modules_and_refuse_to_run() -> None:
    tested = LEGACY if installed_version_or_none() == "0.5.9" else UNIFIED
    cpu_import.import_sglang(tested)
    stubbed = cpu_import.stubbed_modules()
    assert "sgl_kernel" in stubbed
    allowed = (*(s.removesuffix(".*") for s in (*tested.stubs, *tested.pre_stubs)), "sglang.srt.configs.")
    assert all(name.startswith(allowed) for name in stubbed), stubbed
    import sgl_kernel  # type: ignore[import-not-found]

    with pytest.raises(StubbedGPUModule, match=r"sgl_kernel\.fused_add_rmsnorm is GPU-only code"):
        sgl_kernel.fused_add_rmsnorm()
