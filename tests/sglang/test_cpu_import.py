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
    base_release,
    installed_version_or_none,
    release_tuple,
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


def test_a_post_release_is_its_release_patched() -> None:
    """0.5.12.post1 ships 0.5.12's memory manager (B1 and B5 with it): in 0.5.12's ranges, driven by its names."""
    from kvledger.contracts.adapters.protocol import ALIASES, load_factory, release_alias
    from kvledger.contracts.adapters.system import SYSTEM_ALIASES

    assert release_tuple("0.5.9") < release_tuple("0.5.12") < release_tuple("0.5.12.post1") < release_tuple("0.5.13")
    assert release_tuple("0.5.23+cpu") == (0, 5, 23) and release_tuple("0.5.13rc1") == (0, 5, 13)
    assert base_release("0.5.12.post1") == "0.5.12" and base_release("0.5.10") == "0.5.10"
    b1 = TestedRange("B1", "0.5.9", "0.5.12", ())
    assert b1.contains("0.5.12.post1") and b1.contains("0.5.10.post1") and not b1.contains("0.5.13")
    assert LEGACY.contains("0.5.23.post1") and not LEGACY.contains("0.5.24.post1")
    assert release_alias("sglang-0.5.12.post1-system") == "sglang-0.5.12-system" in SYSTEM_ALIASES
    assert release_alias("sglang-0.5.10.post1-mamba") == "sglang-0.5.10-mamba" in ALIASES
    assert release_alias("sglang-0.5.12.post1") == "sglang-0.5.12" in ALIASES
    assert release_alias("pkg.mod:factory") == "pkg.mod:factory"
    with pytest.raises(ValueError, match="expected an alias"):
        load_factory("sglang-0.5.12.post1x")  # NOTE: not a post release's name: refused as before


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
