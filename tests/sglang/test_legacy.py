"""SGLang 0.5.9 to 0.5.23: ``RadixCache`` conforms; ``MambaRadixCache``'s and ``SWARadixCache``'s ``LRUList`` break
LRU detachment (B1).

Each test runs against the installed release (CI: 0.5.9, 0.5.10, 0.5.11, 0.5.13, 0.5.17, 0.5.21 and 0.5.23):
``RadixCache`` ships in every one (``LEGACY``), ``MambaRadixCache`` and ``SWARadixCache`` up to 0.5.20
(``LEGACY_MAMBA``, ``LEGACY_SWA``). B1 shipped in 0.5.9 to 0.5.12 and was fixed in 0.5.13, whose two caches pass
the same machine (as its ``UnifiedRadixCache`` does, ``test_unified_early.py``), and so do 0.5.14 to 0.5.20's.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import settings

from kvledger.contracts.adapters.protocol import CacheAdapter, CacheConfig
from kvledger.contracts.adapters.sglang.cpu_import import (
    LEGACY,
    LEGACY_MAMBA,
    LEGACY_SWA,
    SGLangVersionError,
    TestedRange,
    base_release,
    installed_release_or_none,
)
from kvledger.contracts.machines.profiles import register_profiles

VERSION = installed_release_or_none()  # NOTE: a post release is judged as the release it patches
pytestmark = pytest.mark.skipif(
    VERSION is None or not LEGACY.contains(VERSION), reason=f"needs {LEGACY.describe()}; have {VERSION}"
)
register_profiles()
CI = settings.get_profile("ci")
B1_SHIPPED = VERSION is not None and TestedRange("B1", "0.5.9", "0.5.12", ()).contains(VERSION)
needs_mamba = pytest.mark.skipif(
    VERSION is None or not LEGACY_MAMBA.contains(VERSION), reason=f"needs {LEGACY_MAMBA.describe()}; have {VERSION}"
)
needs_swa = pytest.mark.skipif(
    VERSION is None or not LEGACY_SWA.contains(VERSION), reason=f"needs {LEGACY_SWA.describe()}; have {VERSION}"
)
SWA = CacheConfig(window=2)


@pytest.mark.parametrize("page_size", [1, 2])
def test_radix_cache_conforms(page_size: int) -> None:
    from kvledger.contracts.adapters.sglang.common import check
    from kvledger.contracts.adapters.sglang.legacy import radix_cache_factory

    run = check(lambda: radix_cache_factory(CacheConfig(page_size=page_size)), CI)
    assert run.result.ok, run.result.violation and run.result.violation.message
    assert run.result.examples >= 50 and run.result.steps > 500
    assert "inv_lru_detached" in run.skipped and "double_dec_lock_ref (rule)" in run.skipped
    assert "inv_lock_ref_counts_handles" not in run.skipped
    assert "insert without a Mamba state (rule)" not in run.skipped


@pytest.mark.parametrize("cache", [pytest.param("mamba", marks=needs_mamba), pytest.param("swa", marks=needs_swa)])
def test_b1_lru_list_is_caught_by_lru_detachment(cache: str) -> None:
    """B1 (SGLang PR #25770), found by the general rule on SGLang's own ``LRUList``: ``MambaRadixCache``'s, and
    ``SWARadixCache``'s (``swa_radix_cache.LRUList``); 0.5.13 passes both."""
    from kvledger.contracts.adapters.sglang.common import check
    from kvledger.contracts.adapters.sglang.legacy import mamba_radix_cache_factory
    from kvledger.contracts.adapters.sglang.legacy_swa import swa_radix_cache_factory

    if cache == "swa":
        run = check(lambda: swa_radix_cache_factory(SWA), CI)
        assert "double_dec_lock_ref (rule)" in run.skipped and "inv_lock_ref_counts_handles" not in run.skipped
    else:
        run = check(lambda: mamba_radix_cache_factory(CacheConfig(mamba=True)), CI)
        assert "insert without a Mamba state (rule)" in run.skipped
    assert "inv_lru_detached" not in run.skipped and "inv_slots_conserved" not in run.skipped
    v = run.result.violation
    if not B1_SHIPPED:
        assert v is None, v.message
        assert run.result.examples >= 50 and run.result.steps > 500
        return
    assert v is not None and v.rule == "inv_lru_detached", v
    assert "nodes outside it keep links" in v.message
    # NOTE: one sequence cached (by the rule, or by the cache machine's first step), then evicted (of the prompt's
    # four tokens, how many the shrunk eviction asks for depends on the draws the shrink starts from)
    cached = (
        "insert(again=False, borrow=False, branch=None, prompt=0, suffix=())",
        "cached_at_start(prompt=0, suffix=())",
    )
    assert v.steps[-2] in cached and re.fullmatch(r"evict\(comp=Component\.FULL, n=[1-4]\)", v.steps[-1]), v.steps


@pytest.mark.parametrize("cache", [pytest.param("mamba", marks=needs_mamba), pytest.param("swa", marks=needs_swa)])
def test_b1_program_replays_on_sglang(cache: str) -> None:
    """The shrunk program, pasted: insert one sequence, evict it; the evicted node still points into the list
    (``MambaRadixCache``'s ``LRUList``, ``SWARadixCache``'s)."""
    from kvledger.contracts.adapters.sglang.legacy import mamba_radix_cache_factory
    from kvledger.contracts.adapters.sglang.legacy_swa import swa_radix_cache_factory
    from kvledger.contracts.machines.cache import machine_for_cache
    from kvledger.spec.types import Component

    if cache == "swa":
        state = machine_for_cache(lambda: swa_radix_cache_factory(SWA))()
    else:
        state = machine_for_cache(lambda: mamba_radix_cache_factory(CacheConfig(mamba=True)))()
    state.inv_all_laws()
    state.insert(borrow=False, prompt=0, suffix=())
    state.inv_all_laws()
    state.evict(comp=Component.FULL, n=1)
    if not B1_SHIPPED:
        state.inv_all_laws()
        return
    with pytest.raises(AssertionError, match=r"inv_lru_detached: full list \(\): nodes outside it keep links"):
        state.inv_all_laws()


@needs_mamba
def test_a_repeated_insert_keeps_every_slot_owned() -> None:
    """The same prompt inserted twice from fresh slots: the second insert's slots are all duplicates.

    From 0.5.10 ``MambaRadixCache.insert`` frees them itself (past ``prev_prefix_len``); an adapter that
    also hands them to the caller to free gives them back twice (``inv_slots_conserved``: 44 of 48).
    """
    from kvledger.contracts.adapters.sglang.legacy import mamba_radix_cache_factory
    from kvledger.contracts.machines.cache import machine_for_cache

    state = machine_for_cache(lambda: mamba_radix_cache_factory(CacheConfig(mamba=True)))()
    state.inv_all_laws()
    for _ in range(3):
        state.insert(borrow=False, prompt=0, suffix=())
        state.inv_all_laws()
    state.insert(borrow=True, prompt=0, suffix=(1, 2))
    state.inv_all_laws()
    state.teardown()


def test_adapters_are_adapters_and_refuse_what_sglang_lacks() -> None:
    from kvledger.contracts.adapters.sglang.common import NotExpressible
    from kvledger.contracts.adapters.sglang.legacy import mamba_radix_cache_factory, radix_cache_factory

    a = radix_cache_factory(CacheConfig())
    assert isinstance(a, CacheAdapter) and base_release(a.version) == VERSION
    with pytest.raises(NotExpressible, match="no SWA component"):
        radix_cache_factory(CacheConfig(window=2))
    with pytest.raises(NotExpressible, match="page size 1 only"):
        mamba_radix_cache_factory(CacheConfig(mamba=True, page_size=2))


@pytest.mark.skipif(
    VERSION is None or LEGACY_MAMBA.contains(VERSION), reason=f"needs a release past {LEGACY_MAMBA.describe()}"
)
def test_a_release_without_mamba_radix_cache_refuses_its_adapter_by_range() -> None:
    """0.5.21 on ship no ``mamba_radix_cache`` module: the Mamba adapter names the range it was tested on."""
    from kvledger.contracts.adapters.sglang.legacy import mamba_radix_cache_factory

    with pytest.raises(SGLangVersionError, match=re.escape(f"tested on ({LEGACY_MAMBA.describe()})")):
        mamba_radix_cache_factory(CacheConfig(mamba=True))


@needs_swa
def test_swa_locks_release_by_receipt_and_tombstones_stay_cached() -> None:
    """A lock past the window stamps its boundary; an SWA eviction tombstones the unlocked rest, full KV kept."""
    from kvledger.contracts.adapters.sglang.legacy_swa import swa_radix_cache_factory
    from kvledger.spec.types import Component

    a = swa_radix_cache_factory(SWA)
    key = (1, 2, 3, 4, 5, 6)
    slots = a.alloc_kv(1, len(key))
    assert slots is not None
    a.write_kv(slots, key, 0)
    assert a.insert(1, key, slots, None).prefix_len == 0
    a.unlock(a.lock(key[:2])[1])  # NOTE: splits the node: (1, 2) above (3, 4, 5, 6)
    m, h = a.lock(key)
    assert m.length == 6
    # NOTE: the lock covers SWA up to the window (the lower node, 4 tokens): the upper node is SWA-unlocked
    assert a.evict(Component.SWA, 2) == 2
    snap = a.snapshot()
    assert snap.sizes[Component.SWA] == (0, 4) and snap.sizes[Component.FULL] == (0, 6)
    assert set(snap.prefix.swa_live) == {key[: i + 1] for i in range(2, 6)}  # NOTE: (1,) and (1, 2) tombstoned
    assert set(snap.locks.handles[a.handle_id(h)]) >= {(key, Component.SWA), (key[:1], Component.FULL)}
    a.unlock(h)
    assert a.snapshot().sizes == {Component.FULL: (6, 0), Component.SWA: (4, 0)}


@needs_swa
def test_swa_adapter_refuses_what_sglang_lacks() -> None:
    from kvledger.contracts.adapters.sglang.common import NotExpressible
    from kvledger.contracts.adapters.sglang.legacy_swa import swa_radix_cache_factory

    a = swa_radix_cache_factory(SWA)
    assert isinstance(a, CacheAdapter) and base_release(a.version) == VERSION and a.name.endswith("/SWARadixCache")
    with pytest.raises(NotExpressible, match="full attention \\+ SWA only"):
        swa_radix_cache_factory(CacheConfig())
    with pytest.raises(NotExpressible, match="page size 1 only"):
        swa_radix_cache_factory(CacheConfig(window=2, page_size=2))


@pytest.mark.skipif(
    VERSION is None or LEGACY_SWA.contains(VERSION), reason=f"needs a release past {LEGACY_SWA.describe()}"
)
def test_a_release_without_swa_radix_cache_refuses_its_adapter_by_range() -> None:
    """0.5.21 on ship no ``swa_radix_cache`` module: the SWA adapter names the range it was tested on."""
    from kvledger.contracts.adapters.sglang.legacy_swa import swa_radix_cache_factory

    with pytest.raises(SGLangVersionError, match=re.escape(f"tested on ({LEGACY_SWA.describe()})")):
        swa_radix_cache_factory(SWA)
