"""SGLang 0.5.23: ``UnifiedRadixCache`` conforms on both tree cores (full attention, token and paged)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import settings

from kvledger.contracts.adapter import CacheAdapter, CacheConfig
from kvledger.contracts.profiles import register_profiles
from kvledger.contracts.sglang.cpu_import import unavailable_reason

pytestmark = pytest.mark.skipif(unavailable_reason("0.5.23") is not None, reason=str(unavailable_reason("0.5.23")))
register_profiles()
CI = settings.get_profile("ci")


def _factory(core: str) -> Callable[[CacheConfig], CacheAdapter]:
    from kvledger.contracts.sglang import unified

    return unified.unified_python_factory if core == "python" else unified.unified_rust_factory


@pytest.mark.parametrize("page_size", [1, 2])
@pytest.mark.parametrize("core", ["python", "rust"])
def test_unified_cache_conforms(core: str, page_size: int) -> None:
    from kvledger.contracts.sglang.common import check

    make = _factory(core)
    run = check(lambda: make(CacheConfig(page_size=page_size)), CI)
    assert run.result.ok, run.result.violation and run.result.violation.message
    assert run.result.examples >= 50 and run.result.steps > 500
    assert core in run.adapter
    if core == "rust":
        assert "inv_lock_ref_counts_handles" in run.skipped and "inv_content" in run.skipped
    else:
        assert "inv_lock_ref_counts_handles" not in run.skipped and "inv_content" not in run.skipped


def test_insert_frees_duplicates_itself() -> None:
    """0.5.23's insert returns the caller's duplicate slots to the allocator (0.5.9 leaves that to the caller)."""
    a = _factory("python")(CacheConfig())
    first = a.alloc_kv(1, 4)
    second = a.alloc_kv(2, 4)
    assert first is not None and second is not None
    a.write_kv(first, (1, 2, 3, 4), 0)
    a.write_kv(second, (1, 2, 5, 6), 0)
    a.insert(1, (1, 2, 3, 4), first, None)
    before = a.allocator.available_size()  # type: ignore[attr-defined]
    got = a.insert(2, (1, 2, 5, 6), second, None)
    assert got.prefix_len == 2 and got.dup_slots == second[:2]
    assert a.allocator.available_size() == before + 2  # type: ignore[attr-defined]
    a.free_kv(2, got.dup_slots)  # acknowledged, not freed twice
    assert a.allocator.available_size() == before + 2  # type: ignore[attr-defined]
