"""SGLang 0.5.17 to 0.5.23: ``UnifiedRadixCache`` conforms on both tree cores: full attention (token and paged), +SWA,
+Mamba.

0.5.22 and 0.5.23 are read by ``unified``, 0.5.17 to 0.5.21 (locked through ``inc_lock_ref``) by
``unified_inc_lock``. 0.5.17 and 0.5.18 have no Rust core, and 0.5.19's cannot show its Mamba states: those cases
are refused by the adapter and skipped here.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import settings

from kvledger.contracts.adapters.protocol import ALIASES, CacheAdapter, CacheConfig, load_factory, set_aside
from kvledger.contracts.adapters.sglang.cpu_import import (
    INC_LOCK,
    UNIFIED,
    base_release,
    installed_release_or_none,
    unavailable_reason,
)
from kvledger.contracts.machines.profiles import register_profiles
from kvledger.contracts.machines.suites import CACHE_MODELS

HAVE = installed_release_or_none()  # NOTE: a post release is judged as the release it patches
TESTED = next((r for r in (UNIFIED, INC_LOCK) if HAVE is not None and r.contains(HAVE)), None)
"""The range the installed release is read in (``None``: outside both)."""
pytestmark = pytest.mark.skipif(
    TESTED is None,
    reason=str(unavailable_reason(UNIFIED.highest))
    if HAVE is None
    else f"needs {INC_LOCK.describe()} or {UNIFIED.describe()}; {HAVE} is installed",
)
register_profiles()
CI = settings.get_profile("ci")
MODELS = CACHE_MODELS
NEVER = {"double_dec_lock_ref (rule)"}  # a TreeLock has no identity: a second release is not refused
RUST_BLIND = {"inv_lock_ref_counts_handles", "inv_handles_match", "inv_sizes", "inv_content", "inv_lru_detached"}
RUST_COW_FINDING = frozenset({"mamba_cow"})
"""Set aside on the Rust core: its copy-on-write refuses where it could evict (a finding, kept below)."""


def _factory(core: str) -> Callable[[CacheConfig], CacheAdapter]:
    if TESTED is INC_LOCK:
        from kvledger.contracts.adapters.sglang import unified_inc_lock as older

        return older.inc_lock_python_factory if core == "python" else older.inc_lock_rust_factory
    from kvledger.contracts.adapters.sglang import unified

    return unified.unified_python_factory if core == "python" else unified.unified_rust_factory


def _make(core: str, cfg: CacheConfig) -> CacheAdapter:
    """The adapter on ``core``, or a skip where the installed release's Rust core cannot be read (see the module)."""
    from kvledger.contracts.adapters.sglang.common import NotExpressible

    try:
        return _factory(core)(cfg)
    except NotExpressible as refused:
        if core == "python" or TESTED is not INC_LOCK:
            raise
        pytest.skip(str(refused))


def _expected_skips(core: str, cfg: CacheConfig) -> set[str]:
    want = set(NEVER)
    want.add("insert without a Mamba state (rule)" if cfg.mamba else "mamba_copy_on_write (rule)")
    if core == "rust":
        want |= RUST_BLIND | ({"mamba_copy_on_write (rule)"} if cfg.mamba else set())
    elif cfg.window is None and not cfg.mamba:
        want.add("inv_lru_detached")  # full attention keeps no LRU list in 0.5.23
    return want


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("core", ["python", "rust"])
def test_unified_cache_conforms(core: str, model: str) -> None:
    from kvledger.contracts.adapters.sglang.common import check

    cfg = MODELS[model]
    aside = RUST_COW_FINDING if core == "rust" and cfg.mamba else frozenset()
    run = check(lambda: set_aside(_make(core, cfg), aside), CI)
    assert run.result.ok, run.result.violation and run.result.violation.message
    assert run.result.examples >= 50 and run.result.steps > 500
    assert core in run.adapter and base_release(run.version) == HAVE
    want = _expected_skips(core, cfg)
    assert want <= set(run.skipped), sorted(want - set(run.skipped))
    if core == "python":
        assert "inv_lock_ref_counts_handles" not in run.skipped and "inv_content" not in run.skipped
        assert ("inv_lru_detached" in run.skipped) == (cfg.window is None and not cfg.mamba)


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
    assert got.prefix_len == 2 and got.dup_slots == second[:2] and got.dups_freed == got.dup_slots
    assert a.allocator.available_size() == before + 2  # type: ignore[attr-defined]
    a.free_kv(2, got.dup_slots)  # a driver that frees them again: acknowledged, not freed twice
    assert a.allocator.available_size() == before + 2  # type: ignore[attr-defined]


@pytest.mark.parametrize("core", ["python", "rust"])
def test_swa_duplicates_give_back_both_slots(core: str) -> None:
    """An insert of a cached sequence frees the caller's full slots and their SWA peers (none leaks)."""
    a = _make(core, CacheConfig(window=2))
    swa = a.allocator.swa_attn_allocator  # type: ignore[attr-defined]
    first = a.alloc_kv(1, 4)
    assert first is not None
    a.write_kv(first, (1, 2, 3, 4), 0)
    a.insert(1, (1, 2, 3, 4), first, None)
    free_swa = swa.available_size()
    second = a.alloc_kv(2, 4)
    assert second is not None
    a.write_kv(second, (1, 2, 3, 4), 0)
    got = a.insert(2, (1, 2, 3, 4), second, None)
    assert got.dups_freed == second and swa.available_size() == free_swa
    snap = a.snapshot()
    assert len(snap.prefix.swa_live) == 4 and all(
        len(led.free) + sum(map(len, led.held.values())) == led.capacity for led in snap.ledgers.values()
    )


def test_what_sglang_cannot_express_is_refused() -> None:
    from kvledger.contracts.adapters.sglang.common import NotExpressible

    make = _factory("python")
    mamba = make(CacheConfig(mamba=True))
    assert isinstance(mamba, CacheAdapter) and "stateless_insert" not in mamba.capabilities
    assert "mamba_cow" in mamba.capabilities and "lru" in mamba.capabilities
    slots = mamba.alloc_kv(1, 2)
    assert slots is not None
    with pytest.raises(NotExpressible, match="requires a Mamba state"):
        mamba.insert(1, (1, 2), slots, None)
    with pytest.raises(NotExpressible, match="page size 1 only"):
        make(CacheConfig(window=2, page_size=2))
    with pytest.raises(NotExpressible, match="page size 1 only"):
        make(CacheConfig(mamba=True, page_size=2))
    full = make(CacheConfig())
    assert "stateless_insert" in full.capabilities and "lru" not in full.capabilities


@pytest.mark.parametrize("core", ["python", "rust"])
def test_a_copy_on_write_with_the_mamba_pool_full_evicts_an_unlocked_state(core: str) -> None:
    """Finding (2026-11-25, the cache machine's ``alloc evicts before it refuses``): two prompts cached with a Mamba
    state each fill the pool; the first is locked (its FULL path: the spec's lock covers no Mamba state there),
    the second is matched and copied for a new request. The Python core evicts the first prompt's state and makes
    the copy; the Rust core of the same release refuses ("Can not alloc mamba cache"), so a request the Python core
    admits is refused. Fails on the Rust core until it evicts there too."""
    from kvledger.contracts.machines.cache import machine_for_cache
    from kvledger.spec.types import Component

    cfg = MODELS["mamba"]
    _make(core, cfg)
    state = machine_for_cache(lambda: _make(core, cfg))()

    def program() -> None:
        state.evict(comp=Component.FULL, n=1)
        state.inv_all_laws()
        state.insert(borrow=False, prompt=0, suffix=())
        state.inv_all_laws()
        state.inc_lock_ref(prompt=0, suffix=())
        state.inv_all_laws()
        keys_1 = state.insert(borrow=False, prompt=1, suffix=())
        state.inv_all_laws()
        state.inc_lock_ref_cached(cow=True, key=keys_1, more=())
        state.inv_all_laws()
        state.teardown()

    if core == "python":
        program()
    else:
        with pytest.raises(AssertionError, match="alloc evicts before it refuses: mamba_copy_on_write"):
            program()


@pytest.mark.skipif(TESTED is not INC_LOCK, reason="0.5.17 to 0.5.21 only")
def test_the_release_aliases_drive_the_installed_release() -> None:
    """``sglang-0.5.17`` to ``sglang-0.5.21`` (``-rust`` from 0.5.19) name this adapter; the alias of the installed
    release builds it on that release, and a Rust core the release does not ship is refused, naming what it has."""
    from kvledger.contracts.adapters.sglang.common import NotExpressible
    from kvledger.contracts.adapters.sglang.unified_inc_lock import tree_cores

    assert ALIASES[f"sglang-{HAVE}"].endswith("unified_inc_lock:inc_lock_python_factory")
    a = load_factory(f"sglang-{HAVE}")(CacheConfig(window=2, mamba=True))
    assert isinstance(a, CacheAdapter) and base_release(a.version) == HAVE
    assert {"locks", "lru", "mamba_cow", "content"} <= a.capabilities
    if "rust" in tree_cores():
        assert base_release(load_factory(f"sglang-{HAVE}-rust")(CacheConfig(window=2)).version) == HAVE
    else:
        assert f"sglang-{HAVE}-rust" not in ALIASES
        with pytest.raises(NotExpressible, match="registers no rust tree core"):
            _factory("rust")(CacheConfig())
